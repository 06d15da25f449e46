/* m3_group: one model run as N ranks in lockstep (tensor / expert parallelism, one process).
 *
 * Each rank has its own thread for the group's lifetime, and everything of the rank runs on
 * it: its backend ops (created by the caller's ops_init there, so a CUDA rank binds its
 * thread to its GPU once), its view of the weights (src/parallel/shard.h; a device backend
 * uploads only the rank's slices), its KV cache (its KV heads, and index-K), its workspace.
 * Ranks exchange partial sums through the communicator handles the caller passes (threads
 * on the CPU, NCCL on GPUs: src/parallel/comm.h).
 *
 * A step: m3_group_forward takes the same batch as m3_forward. The sequences' page tables
 * are shared by all ranks: the group reserves pages in rank 0's pool (every rank's pool has
 * the same page count, so a page id is valid in each), then runs every rank's m3_forward in
 * its thread and waits for all; rank 0 writes the (gathered) logits. Sequences are released
 * in rank 0's pool (m3_group_kv(g, 0)); a block manager, when there is one, manages rank 0's.
 * Taps: hidden / capture come from rank 0 (the residual stream is whole on every rank) on
 * rank 0's thread during the step; index selections are merged over the ranks' heads and
 * delivered after the step, layer by layer, on the caller's thread.
 *
 * Errors: a rank that fails aborts the communicator so no rank waits forever; the step
 * returns the first failing rank's message. A thread communicator is reset and the group
 * stays usable; after an NCCL abort the group refuses further steps (create it again).
 *
 * Threads: one caller at a time (the engine thread); not reentrant. */
#ifndef M3_GROUP_H
#define M3_GROUP_H

#include "m3.h"
#include "../parallel/comm.h"
#include "../parallel/shard.h"

typedef struct m3_group m3_group;

typedef struct m3_group_opts {
    int size;                 /* ranks */
    m3_moe_split moe;         /* expert parallel or width split of the routed experts */
    m3_comm **comms;          /* [size] handles of one communicator (borrowed: they outlive the group) */
    /* Creates rank r's ops on rank r's thread (and points comm at the rank's stream where the
     * communicator needs one). ops_free is called on the same thread at the end. */
    int (*ops_init)(void *arg, int rank, m3_ops *ops, m3_comm *comm, m3_err *err);
    void (*ops_free)(void *arg, int rank, m3_ops *ops);
    void *arg;
    /* Optional, device backends: makes rank r's device weights in the shapes of its view
     * (instead of uploading the view's bytes): `m3 bench --random-weights -tp N`, whose full
     * model holds shapes only. Same thread as ops_init. */
    int (*weights_fill)(void *arg, int rank, m3_ops *ops, const m3_weights *view, m3_weights *dw, m3_err *err);
} m3_group_opts;

/* full: a loaded model (m3_model_load, ops NULL is enough: its host weights); it must
 * outlive the group. NULL + err (naming the rank and what failed) on failure. */
m3_group *m3_group_create(const m3_model *full, const m3_group_opts *o, m3_err *err);
void m3_group_free(m3_group *g);

int m3_group_size(const m3_group *g);
m3_model *m3_group_model(m3_group *g, int rank);   /* rank's model (its shard, ops, comm) */

/* (Re)creates every rank's KV pool: n_pages pages of page_tokens tokens, the rank's KV heads. */
int m3_group_kv_create(m3_group *g, m3_kv_dtype dt, m3_kv_dtype idt, int page_tokens, int n_pages, m3_err *err);
m3_kv *m3_group_kv(m3_group *g, int rank);         /* NULL before m3_group_kv_create */

/* One step over every rank, as m3_forward (logits: host [n_out, vocab] or NULL). */
int m3_group_forward(m3_group *g, const m3_batch *b, const int32_t *ids, const int *out_rows, int n_out, float *logits,
                     const m3_taps *taps, m3_err *err);
/* The same with an embedding override (image rows), given to every rank. */
int m3_group_forward_ex(m3_group *g, const m3_batch *b, const int32_t *ids, const m3_embed_override *ov,
                        const int *out_rows, int n_out, float *logits, const m3_taps *taps, m3_err *err);

/* Runs fn(arg, rank, model, kv) on every rank's thread (kv NULL before m3_group_kv_create) and
 * waits; -1 + the first failing rank's message. fn may use m->comm only when every rank's fn
 * makes the same collective calls. */
int m3_group_run(m3_group *g, int (*fn)(void *arg, int rank, m3_model *m, m3_kv *kv, m3_err *err), void *arg,
                 m3_err *err);

#endif
