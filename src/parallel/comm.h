/* m3_comm: the collectives tensor parallelism needs, over N ranks.
 *
 * A communicator is one rank's handle: rank r of size N. The model runner of rank r (one
 * thread per rank) calls the collectives in the same order on every rank; each call returns
 * when this rank's part is done (thread implementation) or is queued on the rank's stream
 * (NCCL: the buffers are device memory and the result is ready in stream order).
 *
 *   all_reduce_sum(buf, n)       buf[i] = sum over ranks of buf[i], in place, on every rank
 *   all_gather(send, n, recv)    recv[r * n + i] = send of rank r [i] (rank-major), every rank
 *
 * Implementations:
 *   threads  N ranks as N threads of this process sharing memory (host buffers; the CPU
 *            backend). Every element is summed in rank order 0, 1, ..., N-1 by exactly one
 *            thread and the result copied to every rank, so results are deterministic and
 *            bitwise identical on all ranks.
 *   nccl     one process driving N GPUs (ncclCommInitAll over devices devs[0..N)); each
 *            rank's collectives go on the CUDA stream set with m3_comm_set_stream (the
 *            rank's backend stream). Built only with the CUDA backend and NCCL; NCCL's
 *            environment defaults are left alone (NVLink multicast stays off unless the
 *            machine's environment turns it on).
 *
 * Errors: a collective returns -1 + err when it failed or the communicator was aborted.
 * When a rank fails a step before or between collectives, whoever drives the ranks calls
 * m3_comm_abort on its handle so the other ranks' pending collectives return -1 instead of
 * waiting forever. A thread communicator can be made usable again with m3_comm_reset once
 * every rank is out of its collectives; an aborted NCCL communicator cannot.
 *
 * Thread-safety: each handle is used by its own rank's thread; m3_comm_abort may be
 * called from any thread. */
#ifndef M3_COMM_H
#define M3_COMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" { /* the NCCL implementation is a .cu file */
#endif

#include "../base/err.h"

typedef struct m3_comm m3_comm;

struct m3_comm {
    int rank, size;
    const char *kind;   /* "threads" or "nccl" */
    int capturable;     /* collectives may be recorded into a CUDA graph with the rank's other work */
    int (*all_reduce_sum)(m3_comm *c, float *buf, size_t n, m3_err *err);
    int (*all_gather)(m3_comm *c, const float *send, size_t n, float *recv, m3_err *err);
    void (*abort)(m3_comm *c);
    int (*reset)(m3_comm *c, m3_err *err);
    int (*set_stream)(m3_comm *c, void *stream, m3_err *err);
    void (*destroy)(m3_comm *c); /* frees this handle; the shared state goes with the last one */
    void *impl;
};

static inline int m3_comm_all_reduce_sum(m3_comm *c, float *buf, size_t n, m3_err *err) {
    return c->all_reduce_sum(c, buf, n, err);
}
static inline int m3_comm_all_gather(m3_comm *c, const float *send, size_t n, float *recv, m3_err *err) {
    return c->all_gather(c, send, n, recv, err);
}
static inline void m3_comm_abort(m3_comm *c) { c->abort(c); }
/* Clears an abort (thread communicators; every rank idle). -1 + err where not possible. */
static inline int m3_comm_reset(m3_comm *c, m3_err *err) { return c->reset(c, err); }
/* NCCL: the CUDA stream (cudaStream_t) this rank's collectives are queued on. The thread
 * communicator ignores it. */
static inline int m3_comm_set_stream(m3_comm *c, void *stream, m3_err *err) { return c->set_stream(c, stream, err); }

/* N thread ranks: comms[0..n) (one handle per rank). */
int m3_comm_threads_create(int n, m3_comm **comms, m3_err *err);
/* Thread communicators: how many ranks wait in the current barrier now (tests: a rank is blocked). */
int m3_comm_threads_waiting(m3_comm *c);

/* 1 when this build has the NCCL communicator. */
int m3_comm_nccl_built(void);
/* N GPU ranks in one process: rank r on CUDA device devs[r]. Call from any one thread
 * before the ranks start; then each rank sets its stream. -1 + err (NCCL's message). */
int m3_comm_nccl_create(int n, const int *devs, m3_comm **comms, m3_err *err);

/* Destroys the n handles of one communicator (any order; NULL entries skipped). */
void m3_comm_destroy_all(m3_comm **comms, int n);

#ifdef __cplusplus
}
#endif

#endif
