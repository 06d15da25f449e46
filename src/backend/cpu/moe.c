/* The SwiGLU-OAI MLP and the MoE on the CPU: the router (router.c), then each expert on the
 * tokens routed to it in ascending expert order (each token adds its experts' outputs in that
 * order; their input quantized first under M3_FC1_NVFP4, act_quant.c), then the shared expert. */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

static void mlp_run(m3_cpu *c, const m3_mlp_w *m, const float *x, int T, float alpha, float limit, float *out) {
    int F = m->gate.N;
    float *g = m3_cpu_scratch(c, sizeof(float) * (size_t)T * F * 2, "mlp");
    if (!g) { memset(out, 0, sizeof(float) * (size_t)T * m->down.N); return; }
    float *u = g + (size_t)T * F;
    m3_cpu_linear(c, &m->gate, x, T, g);
    m3_cpu_linear(c, &m->up, x, T, u);
    m3_cpu_swiglu_oai(g, u, (size_t)T * F, alpha, limit, g);
    m3_cpu_linear(c, &m->down, g, T, out);
    free(g);
}

void m3_cpu_mlp(void *ctx, const m3_mlp_w *m, const float *x, int T, float alpha, float limit, float *out) {
    mlp_run(ctx, m, x, T, alpha, limit, out);
}

void m3_cpu_moe(void *ctx, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out) {
    m3_cpu *c = ctx;
    const int H = L->router.K, E = p->n_experts, K = p->top_k;
    const float alpha = p->alpha, limit = p->limit;
    float *logits = m3_cpu_scratch(c, sizeof(float) * (size_t)T * E, "moe");
    int *pick = m3_cpu_scratch(c, sizeof(int) * (size_t)T * K, "moe");
    float *wt = m3_cpu_scratch(c, sizeof(float) * (size_t)T * K, "moe");
    int *rows = m3_cpu_scratch(c, sizeof(int) * (size_t)T, "moe");
    float *rw = m3_cpu_scratch(c, sizeof(float) * (size_t)T, "moe");
    float *xe = m3_cpu_scratch(c, sizeof(float) * (size_t)T * H * 2, "moe");
    float *s = m3_cpu_scratch(c, sizeof(float) * (size_t)E * 2, "moe");
    /* the routed experts' input: x, or x quantized per token (p->fc1_quant) */
    float *xq = p->fc1_quant == M3_FC1_NVFP4 ? m3_cpu_scratch(c, sizeof(float) * (size_t)T * H, "moe") : NULL;
    memset(out, 0, sizeof(float) * (size_t)T * H);
    if (!logits || !pick || !wt || !rows || !rw || !xe || !s || (p->fc1_quant == M3_FC1_NVFP4 && !xq)) goto done;
    float *ye = xe + (size_t)T * H;
    const float *xr = x;
    if (xq) {
        m3_cpu_act_quant_nvfp4_pool(c, x, T, H, xq);
        xr = xq;
    }
    m3_cpu_linear(c, &L->router, x, T, logits);
    m3_cpu_route(logits, L->route_bias, T, E, K, p->routed_scale, s, pick, wt);
    /* experts in ascending order; each token adds its experts' outputs in that order */
    for (int e = 0; e < E; e++) {
        if (!L->experts[e].gate.w) continue; /* expert parallel: held by another rank */
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (pick[t * K + k] == e) { rows[n] = t; rw[n] = wt[t * K + k]; n++; }
        if (!n) continue;
        for (int i = 0; i < n; i++) memcpy(xe + (size_t)i * H, xr + (size_t)rows[i] * H, sizeof(float) * H);
        c->tie_rows = rows; /* near-tie recording: the rows are these tokens' */
        mlp_run(c, &L->experts[e], xe, n, alpha, limit, ye);
        c->tie_rows = NULL;
        for (int i = 0; i < n; i++) m3_cpu_axpy(out + (size_t)rows[i] * H, rw[i], ye + (size_t)i * H, H);
    }
    if (L->has_shared) {
        mlp_run(c, &L->shared, x, T, alpha, limit, xe);
        for (size_t i = 0; i < (size_t)T * H; i++) out[i] += xe[i];
    }
done:
    free(logits); free(pick); free(wt); free(rows); free(rw); free(xe); free(s); free(xq);
}
