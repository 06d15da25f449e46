/* The vision tower's ops on the CPU (ops.h: layer_norm, bias_act, rope_table, attention_full),
 * the reference arithmetic of src/model/vision.c: LayerNorm and GELU in double, the attention's
 * two products through the backend's linear, softmax rows on the pool. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

static void cpu_layer_norm(void *ctx, const float *x, const float *w, const float *b, int rows, int dim, double eps,
                           float *out) {
    (void)ctx;
    for (int t = 0; t < rows; t++) {
        const float *r = x + (size_t)t * dim;
        double mean = 0, var = 0;
        for (int i = 0; i < dim; i++) mean += r[i];
        mean /= dim;
        for (int i = 0; i < dim; i++) { double d = r[i] - mean; var += d * d; }
        var /= dim;
        double inv = 1.0 / sqrt(var + eps);
        float *o = out + (size_t)t * dim;
        for (int i = 0; i < dim; i++) o[i] = (float)((r[i] - mean) * inv) * w[i] + b[i];
    }
}

static void cpu_bias_act(void *ctx, float *y, const float *b, int rows, int n, int gelu) {
    (void)ctx;
    for (int t = 0; t < rows; t++) {
        float *r = y + (size_t)t * n;
        if (b)
            for (int j = 0; j < n; j++) r[j] += b[j];
        if (gelu)
            for (int j = 0; j < n; j++) r[j] = (float)(0.5 * r[j] * (1.0 + erf(r[j] * 0.70710678118654752440)));
    }
}

static void cpu_rope_table(void *ctx, float *x, int n, int heads, int hd, int half, const float *cs, const float *sn) {
    (void)ctx;
    for (int p = 0; p < n; p++)
        for (int h = 0; h < heads; h++) {
            float *v = x + ((size_t)p * heads + h) * hd;
            const float *c = cs + (size_t)p * half, *s = sn + (size_t)p * half;
            for (int i = 0; i < half; i++) {
                float a = v[i], bb = v[i + half];
                v[i] = a * c[i] - bb * s[i];
                v[i + half] = bb * c[i] + a * s[i];
            }
        }
}

typedef struct {
    float *s; /* [n][n] scores -> probabilities */
    int n;
    float scale;
} softmax_job;

static void softmax_rows(void *arg, size_t r0, size_t r1, int worker) {
    (void)worker;
    softmax_job *j = arg;
    for (size_t r = r0; r < r1; r++) {
        float *s = j->s + r * j->n, mx = -INFINITY;
        for (int i = 0; i < j->n; i++) { s[i] *= j->scale; if (s[i] > mx) mx = s[i]; }
        double sum = 0;
        for (int i = 0; i < j->n; i++) { s[i] = expf(s[i] - mx); sum += s[i]; }
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < j->n; i++) s[i] *= inv;
    }
}

/* head by head, the backend's linear doing both products: scores[q][k] = Q_h[q] . K_h[k] (K_h
 * read in place as an f32 [n, hd] matrix with a row stride), then with P as the matrix and
 * V_h^T [hd, n] as the tokens, out_h^T[d][q] = sum_k P[q][k] V_h[k][d] */
static void cpu_attention_full(void *ctx, const float *q, const float *k, const float *v, int n, int heads, int hd,
                               float *out) {
    m3_cpu *c = ctx;
    const int Hv = heads * hd;
    float *qh = m3_cpu_scratch(c, sizeof(float) * (size_t)n * hd, "attention_full");
    float *vt = m3_cpu_scratch(c, sizeof(float) * (size_t)n * hd, "attention_full");
    float *oh = m3_cpu_scratch(c, sizeof(float) * (size_t)n * hd, "attention_full");
    float *sc = m3_cpu_scratch(c, sizeof(float) * (size_t)n * n, "attention_full");
    if (!qh || !vt || !oh || !sc) { /* recorded (the op table's check reports it); the output is NaN too */
        for (size_t i = 0; i < (size_t)n * Hv; i++) out[i] = NAN;
        free(qh); free(vt); free(oh); free(sc);
        return;
    }
    for (int h = 0; h < heads; h++) {
        for (int p = 0; p < n; p++) memcpy(qh + (size_t)p * hd, q + (size_t)p * Hv + (size_t)h * hd, sizeof(float) * hd);
        for (int p = 0; p < n; p++)
            for (int d = 0; d < hd; d++) vt[(size_t)d * n + p] = v[(size_t)p * Hv + (size_t)h * hd + d];
        m3_linear K = {.fmt = M3_WF_F32, .N = n, .K = hd, .w = (const uint8_t *)(k + (size_t)h * hd), .row_bytes = (size_t)Hv * 4};
        m3_cpu_linear(c, &K, qh, n, sc); /* sc[query][key] */
        softmax_job sj = {sc, n, 1.0f / sqrtf((float)hd)};
        m3_pool_for(c->pool, (size_t)n, 16, softmax_rows, &sj);
        m3_linear Pm = {.fmt = M3_WF_F32, .N = n, .K = n, .w = (const uint8_t *)sc, .row_bytes = (size_t)n * 4};
        m3_cpu_linear(c, &Pm, vt, hd, oh); /* oh[d][query] = sum_key P[query][key] V[key][d] */
        for (int p = 0; p < n; p++)
            for (int d = 0; d < hd; d++) out[(size_t)p * Hv + (size_t)h * hd + d] = oh[(size_t)d * n + p];
    }
    free(qh); free(vt); free(oh); free(sc);
}

void m3_cpu_vision_ops(m3_ops *ops) {
    ops->layer_norm = cpu_layer_norm;
    ops->bias_act = cpu_bias_act;
    ops->rope_table = cpu_rope_table;
    ops->attention_full = cpu_attention_full;
}
