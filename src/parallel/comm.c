/* The thread communicator (see comm.h): N ranks as N threads of one process.
 *
 * A collective is two barriers around shared-memory work. Each rank publishes its buffer;
 * after the first barrier rank r reduces elements [n r / N, n (r+1) / N) of every rank's
 * buffer, summing in rank order 0..N-1, and writes the sum back into every rank's buffer;
 * the second barrier keeps any rank from reading its buffer (or publishing the next one)
 * before all slices are written. Every element is summed by exactly one thread in a fixed
 * order: results do not depend on timing, and all ranks hold the same bits. */
#include "comm.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned long gen;
    int aborted;
    int live;            /* handles not yet destroyed */
    void **buf;          /* [n] buffers published for the current collective */
    size_t *cnt;         /* [n] their element counts */
} tshared;

/* 0 when every rank arrived; -1 when the communicator is (or gets) aborted */
static int barrier(tshared *s) {
    pthread_mutex_lock(&s->mu);
    if (s->aborted) { pthread_mutex_unlock(&s->mu); return -1; }
    unsigned long g = s->gen;
    if (++s->arrived == s->n) {
        s->arrived = 0;
        s->gen++;
        pthread_cond_broadcast(&s->cv);
    } else {
        while (s->gen == g && !s->aborted) pthread_cond_wait(&s->cv, &s->mu);
    }
    int ok = s->gen != g;
    pthread_mutex_unlock(&s->mu);
    return ok ? 0 : -1;
}

static int aborted_err(m3_comm *c, const char *what, m3_err *err) {
    return m3_errf(err, "%s on rank %d of %d: the communicator was aborted (another rank failed)", what, c->rank, c->size);
}

/* after the first barrier: every rank passed the same count (else all ranks see the mismatch) */
static int check_counts(m3_comm *c, const char *what, m3_err *err) {
    tshared *s = c->impl;
    for (int r = 1; r < s->n; r++)
        if (s->cnt[r] != s->cnt[0])
            return m3_errf(err, "%s: rank 0 passed %zu elements but rank %d passed %zu", what, s->cnt[0], r, s->cnt[r]);
    return 0;
}

#define RED_CHUNK 1024

static int t_all_reduce(m3_comm *c, float *buf, size_t n, m3_err *err) {
    tshared *s = c->impl;
    if (s->n == 1) return 0;
    s->buf[c->rank] = buf;
    s->cnt[c->rank] = n;
    if (barrier(s)) return aborted_err(c, "all_reduce_sum", err);
    if (check_counts(c, "all_reduce_sum", err)) return -1;
    size_t i0 = n * (size_t)c->rank / (size_t)s->n, i1 = n * (size_t)(c->rank + 1) / (size_t)s->n;
    float acc[RED_CHUNK];
    for (size_t a = i0; a < i1; a += RED_CHUNK) {
        size_t len = i1 - a < RED_CHUNK ? i1 - a : RED_CHUNK;
        memcpy(acc, (const float *)s->buf[0] + a, len * sizeof(float));
        for (int r = 1; r < s->n; r++) {
            const float *x = (const float *)s->buf[r] + a;
            for (size_t i = 0; i < len; i++) acc[i] += x[i];
        }
        for (int r = 0; r < s->n; r++) memcpy((float *)s->buf[r] + a, acc, len * sizeof(float));
    }
    if (barrier(s)) return aborted_err(c, "all_reduce_sum", err);
    return 0;
}

static int t_all_gather(m3_comm *c, const float *send, size_t n, float *recv, m3_err *err) {
    tshared *s = c->impl;
    s->buf[c->rank] = (void *)send;
    s->cnt[c->rank] = n;
    if (s->n == 1) { memmove(recv, send, n * sizeof(float)); return 0; }
    if (barrier(s)) return aborted_err(c, "all_gather", err);
    if (check_counts(c, "all_gather", err)) return -1;
    for (int r = 0; r < s->n; r++) memcpy(recv + (size_t)r * n, s->buf[r], n * sizeof(float));
    if (barrier(s)) return aborted_err(c, "all_gather", err);
    return 0;
}

static void t_abort(m3_comm *c) {
    tshared *s = c->impl;
    pthread_mutex_lock(&s->mu);
    s->aborted = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static int t_reset(m3_comm *c, m3_err *err) {
    (void)err;
    tshared *s = c->impl;
    pthread_mutex_lock(&s->mu);
    s->aborted = 0;
    s->arrived = 0;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static int t_set_stream(m3_comm *c, void *stream, m3_err *err) {
    (void)c; (void)stream; (void)err;
    return 0;
}

static void t_destroy(m3_comm *c) {
    tshared *s = c->impl;
    pthread_mutex_lock(&s->mu);
    int last = --s->live == 0;
    pthread_mutex_unlock(&s->mu);
    if (last) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s->buf);
        free(s->cnt);
        free(s);
    }
    free(c);
}

int m3_comm_threads_waiting(m3_comm *c) {
    tshared *s = c->impl;
    pthread_mutex_lock(&s->mu);
    const int n = s->arrived;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int m3_comm_threads_create(int n, m3_comm **comms, m3_err *err) {
    if (n < 1) return m3_errf(err, "thread communicator: %d ranks (need at least 1)", n);
    tshared *s = calloc(1, sizeof *s);
    if (!s) return m3_errf(err, "out of memory");
    s->n = n;
    s->buf = calloc((size_t)n, sizeof *s->buf);
    s->cnt = calloc((size_t)n, sizeof *s->cnt);
    if (!s->buf || !s->cnt) { free(s->buf); free(s->cnt); free(s); return m3_errf(err, "out of memory"); }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (int r = 0; r < n; r++) comms[r] = NULL;
    for (int r = 0; r < n; r++) {
        m3_comm *c = calloc(1, sizeof *c);
        if (!c) {
            for (int q = 0; q < r; q++) free(comms[q]);
            pthread_mutex_destroy(&s->mu);
            pthread_cond_destroy(&s->cv);
            free(s->buf); free(s->cnt); free(s);
            for (int q = 0; q < n; q++) comms[q] = NULL;
            return m3_errf(err, "out of memory");
        }
        c->rank = r;
        c->size = n;
        c->kind = "threads";
        c->capturable = 0;
        c->all_reduce_sum = t_all_reduce;
        c->all_gather = t_all_gather;
        c->abort = t_abort;
        c->reset = t_reset;
        c->set_stream = t_set_stream;
        c->destroy = t_destroy;
        c->impl = s;
        comms[r] = c;
    }
    s->live = n;
    return 0;
}

void m3_comm_destroy_all(m3_comm **comms, int n) {
    for (int r = 0; r < n; r++)
        if (comms[r]) { comms[r]->destroy(comms[r]); comms[r] = NULL; }
}

#ifndef M3_HAVE_NCCL
/* built without NCCL (no CUDA backend, or nccl.h / libnccl not found at build time) */
int m3_comm_nccl_built(void) { return 0; }
int m3_comm_nccl_create(int n, const int *devs, m3_comm **comms, m3_err *err) {
    (void)n; (void)devs; (void)comms;
    return m3_errf(err, "this m3 was built without NCCL (it needs the CUDA backend and nccl.h + libnccl at build time)");
}
#endif
