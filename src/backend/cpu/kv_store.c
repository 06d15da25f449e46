/* KV / index-K insert on the CPU: each token's K, V (and index-K) rows into its cache slot, in
 * the cache dtype with the spec's rounding (m3_kv_store, src/kv/kv.c); with near-tie recording
 * (m3_cpu_ties) a bf16 cache's rounding ties are counted for their token (an f32 cache's too at
 * precision bf16, whose attention rounds K and V). */
#include "cpu.h"

void m3_cpu_kv_store(void *ctx, m3_kv *kv, int layer, const m3_batch *b, const float *k, const float *v,
                      const float *ik) {
    m3_cpu_ties *r = ((m3_cpu *)ctx)->ties;
    size_t kw = (size_t)kv->nkv * kv->D;
    for (int t = 0; t < b->T; t++) {
        const m3_kv_seq *s = b->seqs[b->seq[t]];
        if (r && t < r->T) {
            int n = 0;
            /* precision bf16 rounds an f32 cache's K and V as the attention reads them (attention.c) */
            if (kv->dt == M3_KV_BF16 || (kv->dt == M3_KV_F32 && ((m3_cpu *)ctx)->gemm_bf16)) n += m3_cpu_bf16_ties(k + t * kw, (int)kw, r->ulps) + m3_cpu_bf16_ties(v + t * kw, (int)kw, r->ulps);
            if (ik && kv->idt == M3_KV_BF16) n += m3_cpu_bf16_ties(ik + (size_t)t * kv->Di, kv->Di, r->ulps);
            r->first[t] += n;
            r->all[t] += n;
        }
        m3_kv_store(kv, s, layer, M3_KV_K, b->pos[t], k + t * kw);
        m3_kv_store(kv, s, layer, M3_KV_V, b->pos[t], v + t * kw);
        if (ik) m3_kv_store(kv, s, layer, M3_KV_IK, b->pos[t], ik + (size_t)t * kv->Di);
    }
}
