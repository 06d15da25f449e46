#include "pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/* Workers spin briefly between loops before sleeping: a decode step runs hundreds of small
 * loops back to back, and a futex wake per loop would cost more than the work. */
#define SPIN_ROUNDS 20000

struct m3_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done_cv;
    atomic_ulong gen;    /* bumped for every loop (wakes the workers) */
    atomic_int stop;
    /* current loop: published before `ticket` */
    /* relaxed atomics: a worker may read them while the caller publishes the next loop (it
     * then fails its claim on `ticket` and uses nothing it read) */
    _Atomic(m3_pool_fn) fn;
    _Atomic(void *) ctx;
    atomic_size_t n_items, chunk;
    /* (loop number << 32) | next item: a chunk is claimed by a CAS that also checks the loop,
     * so a worker that wakes late can never take (or wait for) another loop's items */
    _Atomic uint64_t ticket;
    atomic_size_t done;  /* items finished in the current loop; the caller waits for n_items */
    int caller_sleeping; /* under mu */
};

typedef struct { m3_pool *p; int id; } worker_arg;

/* Claims and runs chunks of loop `loop` until none is left. Only items actually claimed are
 * waited for: the caller does not depend on workers that are slow to wake (an oversubscribed
 * machine), it runs their share itself. */
static void run_chunks(m3_pool *p, uint32_t loop, int id) {
    for (;;) {
        uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        if ((uint32_t)(t >> 32) != loop) return;
        size_t b = (size_t)(t & 0xffffffffu), n = atomic_load_explicit(&p->n_items, memory_order_relaxed),
               c = atomic_load_explicit(&p->chunk, memory_order_relaxed);
        if (b >= n) return;
        size_t e = b + c < n ? b + c : n;
        /* the last chunk marks the loop exhausted (index 0xffffffff, beyond any n): a worker that
         * reads this loop's ticket late, after the caller has moved on and rewritten n_items,
         * must not find items left in it */
        uint64_t nt = ((uint64_t)loop << 32) | (e == n ? 0xffffffffu : (uint32_t)e);
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, nt, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        atomic_load_explicit(&p->fn, memory_order_relaxed)(atomic_load_explicit(&p->ctx, memory_order_relaxed), b, e, id);
        size_t d = atomic_fetch_add_explicit(&p->done, e - b, memory_order_acq_rel) + (e - b);
        if (d == n && id != 0) {
            pthread_mutex_lock(&p->mu);
            if (p->caller_sleeping) pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
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
        run_chunks(p, (uint32_t)seen, id);
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
    pthread_cond_init(&p->done_cv, NULL);
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
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p);
}

int m3_pool_size(const m3_pool *p) { return p ? p->n : 1; }

void m3_pool_for(m3_pool *p, size_t n, size_t grain, m3_pool_fn fn, void *ctx) {
    if (n == 0) return;
    if (grain == 0) grain = 1;
    if (!p || p->n == 1 || n <= grain || n > 0xffffffffu) { fn(ctx, 0, n, 0); return; } /* tickets hold 32-bit indices */
    /* about 4 chunks per worker for balance, never below grain */
    size_t chunk = (n + (size_t)p->n * 4 - 1) / ((size_t)p->n * 4);
    if (chunk < grain) chunk = grain;
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->n_items, n, memory_order_relaxed);
    atomic_store_explicit(&p->chunk, chunk, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    unsigned long g = atomic_load(&p->gen) + 1;
    atomic_store_explicit(&p->ticket, (uint64_t)(uint32_t)g << 32, memory_order_release); /* opens the loop */
    atomic_store(&p->gen, g);     /* wakes spinning workers */
    pthread_mutex_lock(&p->mu);   /* and sleeping ones */
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p, (uint32_t)g, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < n && spins++ < SPIN_ROUNDS) _mm_pause();
    if (atomic_load_explicit(&p->done, memory_order_acquire) < n) {
        pthread_mutex_lock(&p->mu);
        p->caller_sleeping = 1;
        while (atomic_load_explicit(&p->done, memory_order_acquire) < n) pthread_cond_wait(&p->done_cv, &p->mu);
        p->caller_sleeping = 0;
        pthread_mutex_unlock(&p->mu);
    }
}
