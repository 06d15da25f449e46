/* The fused ops of the op table (ops.h) as plain compositions of its other ops: the
 * definition of what each computes. m3_ops_complete installs them where a backend has none
 * (the CPU backend runs all six this way); a backend overrides one with a kernel that
 * computes the same in fewer passes (the CUDA backend, unless M3_CUDA_FUSE=0).
 * tests/test_fused_ops.c checks the model calls each where the spec's steps meet. */
#include "ops.h"

static void linear_n(const m3_ops *o, int n, const m3_linear *const *W, const float *x, int T, float *const *y) {
    for (int i = 0; i < n; i++) o->linear(o->ctx, W[i], x, T, y[i]);
}

static void add_rmsnorm(const m3_ops *o, float *h, const float *x, const float *w, int rows, int dim, float eps, float *out) {
    o->add(o->ctx, h, x, (size_t)rows * (size_t)dim);
    o->rmsnorm(o->ctx, h, w, rows, dim, eps, out);
}

static void head_norm_rope_n(const m3_ops *o, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim, double theta,
                             const int32_t *pos) {
    for (int i = 0; i < n; i++)
        o->head_norm_rope(o->ctx, jobs[i].x, T, jobs[i].heads, jobs[i].dim, jobs[i].w, eps, rotary_dim, theta, pos);
}

static void head_norm_rope_store(const m3_ops *o, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim,
                                 double theta, m3_kv *kv, int layer, const m3_batch *b, const float *v) {
    o->head_norm_rope_n(o, n, jobs, T, eps, rotary_dim, theta, b->pos);
    o->kv_store(o->ctx, kv, layer, b, jobs[1].x, v, n == 4 ? jobs[3].x : NULL);
}

static void moe_add_rmsnorm(const m3_ops *o, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out,
                            float *h, const float *w, float eps, float *normed) {
    o->moe(o->ctx, L, p, x, T, out);
    o->add_rmsnorm(o, h, out, w, T, L->router.K, eps, normed);
}

static void copy_rows(const m3_ops *o, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows) {
    for (size_t r = 0; r < rows; r++) o->copy(o->ctx, (char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

static void copy_n(const m3_ops *o, int n, void *const *dst, const void *const *src, const size_t *bytes) {
    for (int i = 0; i < n; i++) o->copy(o->ctx, dst[i], src[i], bytes[i]);
}

int m3_ops_complete(m3_ops *o, m3_err *err) {
    if (!o->copy_rows) o->copy_rows = copy_rows;
    if (!o->copy_n) o->copy_n = copy_n;
    if (!o->linear_n) o->linear_n = linear_n;
    if (!o->add_rmsnorm) o->add_rmsnorm = add_rmsnorm;
    if (!o->head_norm_rope_n) o->head_norm_rope_n = head_norm_rope_n;
    if (!o->head_norm_rope_store) o->head_norm_rope_store = head_norm_rope_store;
    if (!o->moe_add_rmsnorm) o->moe_add_rmsnorm = moe_add_rmsnorm;
    const struct { const char *name; int set; } need[] = {
        {"alloc", !!o->alloc}, {"release", !!o->release}, {"upload", !!o->upload}, {"download", !!o->download},
        {"embed", !!o->embed}, {"rmsnorm", !!o->rmsnorm}, {"add", !!o->add}, {"linear", !!o->linear},
        {"head_norm_rope", !!o->head_norm_rope}, {"kv_store", !!o->kv_store}, {"index_select", !!o->index_select},
        {"attention", !!o->attention}, {"copy", !!o->copy}, {"mlp", !!o->mlp}, {"moe", !!o->moe},
    };
    for (size_t i = 0; i < sizeof need / sizeof *need; i++)
        if (!need[i].set) return m3_errf(err, "the %s backend has no '%s' op", o->name ? o->name : "(unnamed)", need[i].name);
    return 0;
}
