/* m3_pool: a fixed set of worker threads running parallel-for loops.
 * One loop at a time per pool (calls from several threads are serialized by the caller:
 * the engine owns one pool per model runner). The calling thread takes part as worker 0. */
#ifndef M3_POOL_H
#define M3_POOL_H

#include <stddef.h>

typedef struct m3_pool m3_pool;

/* fn(ctx, begin, end, worker): handle items [begin, end); worker is in [0, nthreads). */
typedef void (*m3_pool_fn)(void *ctx, size_t begin, size_t end, int worker);

/* nthreads <= 0: one per online CPU (or $M3_THREADS). Returns NULL on failure. */
m3_pool *m3_pool_create(int nthreads);
void m3_pool_free(m3_pool *p);
int m3_pool_size(const m3_pool *p);

/* Runs fn over [0, n) in chunks of at least `grain` items, spread over all workers, and
 * returns when every item is done. A NULL pool runs everything on the caller. */
void m3_pool_for(m3_pool *p, size_t n, size_t grain, m3_pool_fn fn, void *ctx);

#endif
