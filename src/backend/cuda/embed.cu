/* Embedding rows on the GPU: out[t] = the decoded row ids[t] of E, in any weight format.
 * CPU reference: src/backend/cpu/embed.c (m3_cpu_embed; m3_cpu_decode_rows in formats.c). */
#include "common.cuh"

/* out[t] = decode(E row ids[t]): blocks (column range, token), a value per thread (one block per
 * token walking the row took 11 us for 6144 values: a memory round trip per 256) */
__global__ void k_embed(m3_linear E, const int32_t *ids, float *out) {
    pdl_trigger(); /* the next kernel (a GEMV) may start fetching its weights */
    int t = blockIdx.y;
    const uint8_t *row = E.w + (size_t)ids[t] * E.row_bytes;
    float *o = out + (size_t)t * E.K;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < E.K; k += gridDim.x * blockDim.x) {
        float v;
        switch (E.fmt) {
        case M3_WF_F32: v = ((const float *)row)[k]; break;
        case M3_WF_BF16: v = bf16_f32(((const uint16_t *)row)[k]); break;
        case M3_WF_F16: v = f16_f32(((const uint16_t *)row)[k]); break;
        case M3_WF_MXFP8: v = e4m3_f32(row[k]) * e8m0_f32(E.scale[(size_t)ids[t] * E.scale_row + k / 32]); break;
        default: v = e2m1_f32(e2m1_at(row, k)) * (e4m3_f32(E.scale[(size_t)ids[t] * E.scale_row + k / 16]) * E.gmul);
        }
        o[k] = v;
    }
}

void m3_cu_embed(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    m3_cu_prof_begin(c, OP_EMBED);
    (void)ids; /* copied to the device with the step's metadata (begin_step) */
    const int32_t *d = c->d_ids;
    if (T != c->T) { m3_cu_failf(c, "CUDA backend: embed outside its step"); m3_cu_prof_end(c, OP_EMBED); return; }
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)T * E->K);
    k_embed<<<dim3(cdiv(E->K, 256), T), 256, 0, c->st>>>(*E, d, out);
    CK_LAUNCH(c, "embed");
    m3_cu_prof_end(c, OP_EMBED);
}

/* the same with ids in device memory (ops.h embed_dev), outside any step's metadata */
void m3_cu_embed_dev(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out) {
    m3_cuda *c = (m3_cuda *)ctx;
    if (T <= 0 || c->failed) return;
    m3_cu_prof_begin(c, OP_EMBED);
    m3_cu_xsplit_touch(c, out, sizeof(float) * (size_t)T * E->K);
    k_embed<<<dim3(cdiv(E->K, 256), T), 256, 0, c->st>>>(*E, ids, out);
    CK_LAUNCH(c, "embed");
    m3_cu_prof_end(c, OP_EMBED);
}
