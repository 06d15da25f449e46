/* Built instead of the CUDA backend when nvcc is not available (or -DM3_CUDA=OFF). */
#include "cuda.h"

int m3_cuda_built(void) { return 0; }
int m3_cuda_device_count(void) { return 0; }
int m3_cuda_ops_init(m3_ops *ops, int dev, m3_err *err) {
    (void)ops; (void)dev;
    return m3_errf(err, "this m3 was built without the CUDA backend (nvcc not found at build time)");
}
void m3_cuda_ops_free(m3_ops *ops) { (void)ops; }
const char *m3_cuda_device_name(const m3_ops *ops) { (void)ops; return "none"; }
void *m3_cuda_stream(const m3_ops *ops) { (void)ops; return 0; }
void m3_cuda_mem_info(const m3_ops *ops, size_t *f, size_t *t, size_t *p) {
    (void)ops;
    if (f) *f = 0;
    if (t) *t = 0;
    if (p) *p = 0;
}
int m3_cuda_upload_linear(m3_ops *ops, const m3_linear *host, m3_linear *dev, m3_err *err) {
    (void)ops; (void)host; (void)dev;
    return m3_errf(err, "this m3 was built without the CUDA backend");
}
int m3_cuda_random_weights(m3_ops *ops, const m3_config *c, int n, uint64_t seed, m3_weights *w, m3_err *err) {
    (void)ops; (void)c; (void)n; (void)seed; (void)w;
    return m3_errf(err, "this m3 was built without the CUDA backend");
}
int m3_cuda_random_weights_like(m3_ops *ops, const m3_config *c, const m3_weights *shape, uint64_t seed, m3_weights *w,
                                m3_err *err) {
    (void)ops; (void)c; (void)shape; (void)seed; (void)w;
    return m3_errf(err, "this m3 was built without the CUDA backend");
}
double m3_cuda_copy_bandwidth(m3_ops *ops, size_t bytes) { (void)ops; (void)bytes; return 0; }
long m3_cuda_graph_replays(const m3_ops *ops) { (void)ops; return 0; }
int m3_cuda_graphs_refused(const m3_ops *ops, int *on) {
    (void)ops;
    if (on) *on = 0;
    return 0;
}
double m3_cuda_gemm_rate(m3_ops *ops, int n) { (void)ops; (void)n; return 0; }
double m3_cuda_sync_time(m3_ops *ops) { (void)ops; return 0; }
void m3_cuda_count_experts(m3_ops *ops, int on) { (void)ops; (void)on; }
void m3_cuda_set_precision(m3_ops *ops, int bf16) { (void)ops; (void)bf16; }
long m3_cuda_experts_used(m3_ops *ops, int reset) { (void)ops; (void)reset; return 0; }
void m3_cuda_profile(m3_ops *ops, int on) { (void)ops; (void)on; }
void m3_cuda_profile_report(m3_ops *ops, int steps, void *f) { (void)ops; (void)steps; (void)f; }
