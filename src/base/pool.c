#include "pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* Workers spin briefly between loops before sleeping: a decode step runs hundreds of small
 * loops back to back, and a futex wake per loop would cost more than the work. */
#define SPIN_ROUNDS 20000

struct m3_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    atomic_ulong gen;    /* bumped for every loop */
    atomic_int stop;
    atomic_int busy;     /* workers still inside the current loop */
    /* current loop */
    m3_pool_fn fn;
    void *ctx;
    size_t n_items, chunk;
    atomic_size_t next;
};

typedef struct { m3_pool *p; int id; } worker_arg;

static void run_chunks(m3_pool *p, int id) {
    for (;;) {
        size_t b = atomic_fetch_add(&p->next, p->chunk);
        if (b >= p->n_items) break;
        size_t e = b + p->chunk < p->n_items ? b + p->chunk : p->n_items;
        p->fn(p->ctx, b, e, id);
    }
}

static void *worker_main(void *a) {
    worker_arg *wa = a;
    m3_pool *p = wa->p;
    int id = wa->id;
    free(wa);
    unsigned long seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop) && spins++ < SPIN_ROUNDS) _mm_pause();
        if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->go, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = atomic_load(&p->gen);
        run_chunks(p, id);
        if (atomic_fetch_sub(&p->busy, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

m3_pool *m3_pool_create(int nthreads) {
    if (nthreads <= 0) {
        const char *env = getenv("M3_THREADS");
        nthreads = env ? atoi(env) : 0;
        if (nthreads <= 0) nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (nthreads <= 0) nthreads = 1;
    }
    m3_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)nthreads, sizeof *p->threads);
    if (!p->threads) { free(p); return NULL; }
    for (int i = 1; i < nthreads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->n = i; m3_pool_free(p); return NULL; }
        wa->p = p; wa->id = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa); p->n = i; m3_pool_free(p); return NULL;
        }
    }
    return p;
}

void m3_pool_free(m3_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int m3_pool_size(const m3_pool *p) { return p ? p->n : 1; }

void m3_pool_for(m3_pool *p, size_t n, size_t grain, m3_pool_fn fn, void *ctx) {
    if (n == 0) return;
    if (grain == 0) grain = 1;
    if (!p || p->n == 1 || n <= grain) { fn(ctx, 0, n, 0); return; }
    /* about 4 chunks per worker for balance, never below grain */
    size_t chunk = (n + (size_t)p->n * 4 - 1) / ((size_t)p->n * 4);
    if (chunk < grain) chunk = grain;
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->n - 1);
    atomic_fetch_add(&p->gen, 1); /* publishes the loop to spinning workers */
    pthread_mutex_lock(&p->mu);   /* and wakes sleeping ones */
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, 0);
    int spins = 0;
    while (atomic_load(&p->busy) > 0 && spins++ < SPIN_ROUNDS) _mm_pause();
    if (atomic_load(&p->busy) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->busy) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
