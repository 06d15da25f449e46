/* The NCCL communicator (see comm.h): one process, N GPUs, one rank per GPU.
 *
 * ncclCommInitAll creates the N communicators at once (single-process bootstrap: no unique
 * id to pass around; the multi-node form, ncclCommInitRank with an id from rank 0, is in
 * docs/MULTINODE.md). Each rank's collectives are queued on the stream its backend uses, so
 * they order with the rank's kernels and can be recorded into the rank's CUDA graphs. NCCL's
 * environment (NCCL_NVLS_ENABLE and friends) is left as the machine sets it. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

typedef struct {
    ncclComm_t comm;
    cudaStream_t st;
    int dev;
    int aborted;
} nccl_rank;

static int nccl_fail(m3_comm *c, ncclResult_t r, const char *what, m3_err *err) {
    nccl_rank *p = (nccl_rank *)c->impl;
    const char *last = p->comm ? ncclGetLastError(p->comm) : NULL;
    return m3_errf(err, "NCCL %s on rank %d of %d (CUDA device %d): %s%s%s", what, c->rank, c->size, p->dev,
                   ncclGetErrorString(r), last && *last ? ": " : "", last && *last ? last : "");
}

static int n_all_reduce(m3_comm *c, float *buf, size_t n, m3_err *err) {
    nccl_rank *p = (nccl_rank *)c->impl;
    if (p->aborted) return m3_errf(err, "NCCL all_reduce on rank %d: the communicator was aborted after an error", c->rank);
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, p->comm, p->st);
    return r == ncclSuccess ? 0 : nccl_fail(c, r, "all_reduce", err);
}

static int n_all_gather(m3_comm *c, const float *send, size_t n, float *recv, m3_err *err) {
    nccl_rank *p = (nccl_rank *)c->impl;
    if (p->aborted) return m3_errf(err, "NCCL all_gather on rank %d: the communicator was aborted after an error", c->rank);
    ncclResult_t r = ncclAllGather(send, recv, n, ncclFloat32, p->comm, p->st);
    return r == ncclSuccess ? 0 : nccl_fail(c, r, "all_gather", err);
}

/* Unblocks this rank's pending collectives; the communicator is unusable afterwards. */
static void n_abort(m3_comm *c) {
    nccl_rank *p = (nccl_rank *)c->impl;
    if (p->aborted) return;
    p->aborted = 1;
    ncclCommAbort(p->comm);
}

static int n_reset(m3_comm *c, m3_err *err) {
    nccl_rank *p = (nccl_rank *)c->impl;
    if (!p->aborted) return 0;
    return m3_errf(err, "NCCL rank %d: an aborted communicator cannot be reused (create the group again)", c->rank);
}

static int n_set_stream(m3_comm *c, void *stream, m3_err *err) {
    (void)err;
    ((nccl_rank *)c->impl)->st = (cudaStream_t)stream;
    return 0;
}

static void n_destroy(m3_comm *c) {
    nccl_rank *p = (nccl_rank *)c->impl;
    if (p && !p->aborted && p->comm) ncclCommDestroy(p->comm);
    free(p);
    free(c);
}

extern "C" int m3_comm_nccl_built(void) { return 1; }

extern "C" int m3_comm_nccl_create(int n, const int *devs, m3_comm **comms, m3_err *err) {
    if (n < 1) return m3_errf(err, "NCCL communicator: %d ranks (need at least 1)", n);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) { cudaGetLastError(); ndev = 0; }
    for (int r = 0; r < n; r++)
        if (devs[r] < 0 || devs[r] >= ndev)
            return m3_errf(err, "NCCL communicator: rank %d wants CUDA device %d, but %d device(s) are visible", r, devs[r], ndev);
    ncclComm_t *nc = (ncclComm_t *)calloc((size_t)n, sizeof *nc);
    if (!nc) return m3_errf(err, "out of memory");
    int cur = 0;
    cudaGetDevice(&cur); /* ncclCommInitAll may leave another device current on this thread */
    ncclResult_t r = ncclCommInitAll(nc, n, devs);
    cudaSetDevice(cur);
    if (r != ncclSuccess) {
        free(nc);
        return m3_errf(err, "NCCL: ncclCommInitAll over %d device(s) failed: %s", n, ncclGetErrorString(r));
    }
    for (int i = 0; i < n; i++) comms[i] = NULL;
    for (int i = 0; i < n; i++) {
        m3_comm *c = (m3_comm *)calloc(1, sizeof *c);
        nccl_rank *p = (nccl_rank *)calloc(1, sizeof *p);
        if (!c || !p) {
            free(c);
            free(p);
            m3_comm_destroy_all(comms, i);
            for (int j = i; j < n; j++) ncclCommDestroy(nc[j]);
            free(nc);
            return m3_errf(err, "out of memory");
        }
        p->comm = nc[i];
        p->dev = devs[i];
        p->st = 0; /* the legacy default stream until the rank sets its own */
        c->rank = i;
        c->size = n;
        c->kind = "nccl";
        c->capturable = 1;
        c->all_reduce_sum = n_all_reduce;
        c->all_gather = n_all_gather;
        c->abort = n_abort;
        c->reset = n_reset;
        c->set_stream = n_set_stream;
        c->destroy = n_destroy;
        c->impl = p;
        comms[i] = c;
    }
    free(nc);
    return 0;
}
