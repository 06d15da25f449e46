/* CPU backend: the op table, scratch memory and the failure check; each op lives in the file of
 * its family (embed.c, norm.c, elem.c, rope.c, kv_store.c, indexer.c, attention.c, linear.c,
 * router.c, moe.c, vision.c; the number formats' decoders in formats.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/fault.h"
#include "cpu.h"

/* ------------------------------------------------------------------ memory */

void *m3_cpu_scratch(m3_cpu *c, size_t bytes, const char *op) {
    void *p = m3_fault_malloc(M3_FAULT_BACKEND, bytes ? bytes : 1);
    if (!p && !__atomic_exchange_n(&c->failed, 1, __ATOMIC_ACQ_REL))
        snprintf(c->fail_msg, sizeof c->fail_msg, "CPU backend: out of memory (%zu bytes of scratch in %s)", bytes, op);
    return p;
}

/* the op table's check: an op's failure since the last call (then cleared) */
static int cpu_check(void *ctx, m3_err *err) {
    m3_cpu *c = ctx;
    if (!__atomic_load_n(&c->failed, __ATOMIC_ACQUIRE)) return 0;
    if (err) m3_errf(err, "%s", c->fail_msg);
    __atomic_store_n(&c->failed, 0, __ATOMIC_RELEASE);
    return -1;
}

/* After a failed step (ops.recover): host memory keeps no state to lose, so the backend goes
 * on; for tests the fault module "device" reports the device lost instead (src/base/fault.h). */
static int cpu_recover(void *ctx, m3_err *err) {
    m3_cpu *c = ctx;
    __atomic_store_n(&c->failed, 0, __ATOMIC_RELEASE);
    if (m3_fault_hit(M3_FAULT_DEVICE)) return m3_errf(err, "the device is lost (injected: fault module 'device')");
    return 0;
}

static void *cpu_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p) memset(p, 0, n ? n : 64);
    return p;
}
static void cpu_release(void *ctx, void *p) { (void)ctx; free(p); }
static void cpu_copy(void *ctx, void *dst, const void *src, size_t n) { (void)ctx; memmove(dst, src, n); }

static void cpu_linear_op(void *ctx, const m3_linear *W, const float *x, int T, float *y) {
    m3_cpu_linear(ctx, W, x, T, y);
}

/* ------------------------------------------------------------------ table */

int m3_cpu_ops_init(m3_ops *ops, int threads, m3_err *err) {
    memset(ops, 0, sizeof *ops);
    m3_cpu *c = calloc(1, sizeof *c);
    if (!c) return m3_errf(err, "out of memory");
    c->pool = m3_pool_create(threads);
    if (!c->pool) { free(c); return m3_errf(err, "cannot start worker threads"); }
    c->nthreads = m3_pool_size(c->pool);
    ops->name = "cpu";
    ops->ctx = c;
    ops->alloc = cpu_alloc;
    ops->release = cpu_release;
    ops->host_alloc = cpu_alloc; /* host memory is the backend's: nothing to lock */
    ops->host_free = cpu_release;
    ops->upload = cpu_copy;
    ops->download = cpu_copy;
    ops->embed = m3_cpu_embed;
    ops->embed_dev = m3_cpu_embed; /* host memory is the backend's */
    ops->rmsnorm = m3_cpu_rmsnorm;
    ops->add = m3_cpu_add;
    ops->linear = cpu_linear_op;
    ops->head_norm_rope = m3_cpu_head_norm_rope;
    ops->kv_store = m3_cpu_kv_store;
    ops->index_select = m3_cpu_index_select;
    ops->attention = m3_cpu_attention;
    ops->dspark_attention = m3_cpu_dspark_attention;
    ops->dspark_attention_n = m3_cpu_dspark_attention_n;
    ops->argmax_rows = m3_cpu_argmax_rows;
    ops->argmax_rows_fin = m3_cpu_argmax_rows_fin;
    ops->logprob_rows = m3_cpu_logprob_rows;
    ops->draw_rows = m3_cpu_draw_rows;
    ops->verify_rows = m3_cpu_verify_rows;
    ops->copy = cpu_copy;
    ops->mlp = m3_cpu_mlp;
    ops->moe = m3_cpu_moe;
    ops->check = cpu_check;
    ops->recover = cpu_recover;
    m3_cpu_vision_ops(ops);
    if (m3_ops_complete(ops, err)) { /* the fused ops: their plain compositions (../compose.c) */
        m3_cpu_ops_free(ops);
        return -1;
    }
    return 0;
}

void m3_cpu_ops_free(m3_ops *ops) {
    m3_cpu *c = ops->ctx;
    if (c) { m3_pool_free(c->pool); free(c); }
    memset(ops, 0, sizeof *ops);
}
