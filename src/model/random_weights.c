/* Random tensors for the checkpoint writers: ziggurat normals on per-row splitmix64 streams,
 * rounded to bf16, stored as BF16 / F32 or quantized to MXFP8 / NVFP4 (weights/quantize.h)
 * exactly as the reference checkpoints were. See random_weights.h. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/hash.h"
#include "../base/num.h"
#include "../weights/quantize.h"
#include "random_weights.h"



static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}


/* Normals by Marsaglia and Tsang's ziggurat (128 layers): about 98.8% of draws cost 32
 * random bits, a compare and a multiply. Each draw takes a 7-bit layer index and a separate
 * 25-bit signed value (the original shares bits between the two, a known flaw); 25 bits
 * are plenty for values rounded to bf16. Tables are filled once, before any thread starts,
 * and only read afterwards. */
#define ZIG_M 16777216.0 /* 2^24: |hz| < 2^24 */

void m3_rw_zig_init(rw_zig *z) {
    const double vn = 9.91256303526217e-3;
    double dn = 3.442619855899, tn = dn;
    double q = vn / exp(-0.5 * dn * dn);
    z->kn[0] = (uint32_t)((dn / q) * ZIG_M);
    z->kn[1] = 0;
    z->wn[0] = (float)(q / ZIG_M);
    z->wn[127] = (float)(dn / ZIG_M);
    z->fn[0] = 1.0f;
    z->fn[127] = (float)exp(-0.5 * dn * dn);
    for (int i = 126; i >= 1; i--) {
        dn = sqrt(-2.0 * log(vn / dn + exp(-0.5 * dn * dn)));
        z->kn[i + 1] = (uint32_t)((dn / tn) * ZIG_M);
        tn = dn;
        z->fn[i] = (float)exp(-0.5 * dn * dn);
        z->wn[i] = (float)(dn / ZIG_M);
    }
}

static inline float uni01(uint64_t *s) { /* (0, 1) */
    return ((float)(m3_splitmix64(s) >> 41) + 0.5f) * 0x1p-23f;
}

/* The rare path of a draw (about 1.2%): the wedge test or the tail, then fresh draws. */
static __attribute__((noinline)) float zig_slow(const rw_zig *z, uint32_t w, uint64_t *s) {
    for (;;) {
        int32_t hz = (int32_t)(w << 7) >> 7; /* low 25 bits, sign-extended */
        int iz = (int)(w >> 25);
        uint32_t ahz = hz < 0 ? (uint32_t)-hz : (uint32_t)hz;
        float x = (float)hz * z->wn[iz];
        if (ahz < z->kn[iz]) return x;
        if (iz == 0) { /* the tail beyond r = 3.442620 */
            const float rr = 3.442620f;
            float xt, y;
            do {
                xt = -logf(uni01(s)) * (1.0f / rr);
                y = -logf(uni01(s));
            } while (y + y < xt * xt);
            return hz > 0 ? rr + xt : -rr - xt;
        }
        if (z->fn[iz] + uni01(s) * (z->fn[iz - 1] - z->fn[iz]) < expf(-0.5f * x * x)) return x;
        w = (uint32_t)m3_splitmix64(s);
    }
}

/* One normal from the 32 random bits w (low 25: signed value, high 7: layer); rejections
 * draw more bits from s. */
static inline float zig_normal(const rw_zig *z, uint32_t w, uint64_t *s) {
    int32_t hz = (int32_t)(w << 7) >> 7;
    uint32_t iz = w >> 25;
    uint32_t ahz = hz < 0 ? (uint32_t)-hz : (uint32_t)hz;
    if (__builtin_expect(ahz < z->kn[iz], 1)) return (float)hz * z->wn[iz];
    return zig_slow(z, w, s);
}


/* n normals N(0, std^2), each rounded to bf16, for row `row` of the tensor keyed `key`. */
static void fill_row(const rw_zig *z, uint64_t key, int64_t row, float std, float *out, int64_t n) {
    uint64_t s = m3_mix64(key ^ m3_mix64((uint64_t)row + 0x632be59bd9b4e019ull));
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t r = m3_splitmix64(&s);
        out[i] = m3_bf16_round(std * zig_normal(z, (uint32_t)r, &s));
        out[i + 1] = m3_bf16_round(std * zig_normal(z, (uint32_t)(r >> 32), &s));
    }
    if (i < n) out[i] = m3_bf16_round(std * zig_normal(z, (uint32_t)m3_splitmix64(&s), &s));
}


int m3_rw_add_spec(rw_list *l, const char *name, int ndim, int64_t N, int64_t K, float std, rw_fmt fmt, m3_err *err) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 256;
        rw_spec *ns = realloc(l->s, nc * sizeof *ns);
        if (!ns) return m3_errf(err, "out of memory");
        l->s = ns;
        l->cap = nc;
    }
    rw_spec *s = &l->s[l->n];
    memset(s, 0, sizeof *s);
    if (snprintf(s->name, sizeof s->name, "%s", name) >= (int)sizeof s->name)
        return m3_errf(err, "tensor name too long: %s", name);
    s->ndim = ndim;
    s->N = N;
    s->K = ndim == 1 ? 1 : K;
    s->std = std;
    s->fmt = fmt;
    uint64_t ne = (uint64_t)N * (uint64_t)s->K;
    switch (fmt) {
    case RW_BF16: s->bytes = ne * 2; break;
    case RW_F32: s->bytes = ne * 4; break;
    case RW_MXFP8:
        if (K % 32)
            return m3_errf(err, "cannot quantize '%s' [%lld, %lld] to MXFP8: K must be a multiple of 32", name,
                           (long long)N, (long long)K);
        s->bytes = ne + ne / 32;
        break;
    case RW_NVFP4:
        if (K % 16)
            return m3_errf(err, "cannot quantize '%s' [%lld, %lld] to NVFP4: K must be a multiple of 16", name,
                           (long long)N, (long long)K);
        s->bytes = ne / 2 + ne / 16 + 4;
        break;
    }
    l->n++;
    return 0;
}

/* A linear [N, K]: BF16, or `q` when quantizing. */
int m3_rw_add_linear(rw_list *l, m3_rand_quant qm, rw_fmt q, const char *name, int64_t N, int64_t K, float mult,
                      m3_err *err) {
    return m3_rw_add_spec(l, name, 2, N, K, mult / sqrtf((float)K), qm == M3_RQ_NONE ? RW_BF16 : q, err);
}

int m3_rw_add_mlp(rw_list *l, m3_rand_quant qm, rw_fmt q, const char *base, const char *g, const char *u,
                   const char *d, int64_t H, int64_t F, m3_err *err) {
    char nm[256];
    snprintf(nm, sizeof nm, "%s.%s.weight", base, g);
    if (m3_rw_add_linear(l, qm, q, nm, F, H, 3.0f, err)) return -1;
    snprintf(nm, sizeof nm, "%s.%s.weight", base, u);
    if (m3_rw_add_linear(l, qm, q, nm, F, H, 3.0f, err)) return -1;
    snprintf(nm, sizeof nm, "%s.%s.weight", base, d);
    return m3_rw_add_linear(l, qm, q, nm, H, F, 1.0f, err);
}

/* ------------------------------------------------------------------ generation */

typedef struct {
    const rw_spec *s;
    const rw_zig *zig;
    uint64_t key;
    /* outputs (by format) */
    uint16_t *bf16;
    float *f32;            /* F32 output, or the f32 staging copy for NVFP4 */
    uint8_t *codes, *scales;
    float *row_amax;       /* NVFP4: max |x| per row, phase 1 */
    double gs;             /* NVFP4 global scale, phase 2 */
    float *scratch;        /* [nworkers][K] */
    int64_t scratch_k;
    atomic_int failed;
    m3_err err;
} gen_ctx;

static void gen_rows(void *arg, size_t b, size_t e, int worker) {
    gen_ctx *g = arg;
    const rw_spec *s = g->s;
    const int64_t K = s->K;
    float *row = g->scratch + (size_t)worker * (size_t)g->scratch_k;
    for (size_t r = b; r < e; r++) {
        switch (s->fmt) {
        case RW_BF16:
            fill_row(g->zig, g->key, (int64_t)r, s->std, row, K);
            for (int64_t k = 0; k < K; k++) g->bf16[r * (size_t)K + (size_t)k] = m3_f32_to_bf16(row[k]);
            break;
        case RW_F32: fill_row(g->zig, g->key, (int64_t)r, s->std, g->f32 + r * (size_t)K, K); break;
        case RW_NVFP4: {
            float *x = g->f32 + r * (size_t)K, amax = 0.0f;
            fill_row(g->zig, g->key, (int64_t)r, s->std, x, K);
            float m4[4] = {0, 0, 0, 0}; /* independent chains: K is a multiple of 16 here */
            for (int64_t k = 0; k < K; k += 4)
                for (int j = 0; j < 4; j++) {
                    float a = fabsf(x[k + j]);
                    m4[j] = a > m4[j] ? a : m4[j];
                }
            for (int j = 0; j < 4; j++) amax = m4[j] > amax ? m4[j] : amax;
            g->row_amax[r] = amax;
            break;
        }
        case RW_MXFP8: {
            m3_err e2;
            fill_row(g->zig, g->key, (int64_t)r, s->std, row, K);
            if (m3_quant_mxfp8(row, 1, K, g->codes + r * (size_t)K, g->scales + r * (size_t)(K / 32), &e2) &&
                atomic_exchange(&g->failed, 1) == 0)
                g->err = e2;
            break;
        }
        }
    }
}

static void quant_nvfp4_rows(void *arg, size_t b, size_t e, int worker) {
    (void)worker;
    gen_ctx *g = arg;
    const int64_t K = g->s->K;
    m3_err e2;
    if (m3_quant_nvfp4_rows(g->f32 + b * (size_t)K, (int64_t)(e - b), K, g->gs, g->codes + b * (size_t)(K / 2),
                            g->scales + b * (size_t)(K / 16), &e2) &&
        atomic_exchange(&g->failed, 1) == 0)
        g->err = e2;
}

/* Buffers of one generated spec, owned until its shard is written. */

int m3_rw_generate(const rw_spec *s, const rw_zig *zig, uint64_t seed, m3_rand_quant qm, m3_pool *pool, float *scratch,
                    int64_t scratch_k, rw_out *o, m3_err *err) {
    gen_ctx g;
    memset(&g, 0, sizeof g);
    atomic_init(&g.failed, 0);
    g.s = s;
    g.zig = zig;
    g.key = m3_mix64(seed ^ 0x5851f42d4c957f2dull) ^ hash_name(s->name);
    g.scratch = scratch;
    g.scratch_k = scratch_k;
    const size_t ne = (size_t)s->N * (size_t)s->K;
    memset(o, 0, sizeof *o);
    size_t grain = (size_t)(65536 / s->K) + 1;
    switch (s->fmt) {
    case RW_BF16:
        if (!(o->a = g.bf16 = malloc(ne * 2))) goto oom;
        break;
    case RW_F32:
        if (!(o->a = g.f32 = malloc(ne * 4))) goto oom;
        break;
    case RW_MXFP8:
        if (!(o->a = g.codes = malloc(ne)) || !(o->b = g.scales = malloc(ne / 32))) goto oom;
        break;
    case RW_NVFP4:
        if (!(o->a = g.codes = malloc(ne / 2)) || !(o->b = g.scales = malloc(ne / 16)) || !(g.f32 = malloc(ne * 4)) ||
            !(g.row_amax = malloc((size_t)s->N * sizeof(float))))
            goto oom;
        break;
    }
    m3_pool_for(pool, (size_t)s->N, grain, gen_rows, &g);
    if (s->fmt == RW_NVFP4 && !atomic_load(&g.failed)) {
        float amax = 0.0f;
        for (int64_t r = 0; r < s->N; r++) amax = g.row_amax[r] > amax ? g.row_amax[r] : amax;
        g.gs = m3_quant_nvfp4_gs(amax);
        m3_pool_for(pool, (size_t)s->N, grain, quant_nvfp4_rows, &g);
        /* ModelOpt stores the multiplier; 1.0f / (float)gs is exactly what the loader derives
         * from the compressed-tensors divisor, so both spellings give identical weights */
        o->gscalar = qm == M3_RQ_MODELOPT ? 1.0f / (float)g.gs : (float)g.gs;
    }
    if (s->fmt == RW_NVFP4) { free(g.f32); free(g.row_amax); }
    if (atomic_load(&g.failed)) {
        free(o->a);
        free(o->b);
        memset(o, 0, sizeof *o);
        return m3_errf(err, "tensor '%s': %s", s->name, g.err.msg);
    }
    return 0;
oom:
    free(o->a);
    free(o->b);
    if (s->fmt == RW_NVFP4) { free(g.f32); free(g.row_amax); }
    memset(o, 0, sizeof *o);
    return m3_errf(err, "out of memory generating '%s' [%lld, %lld]", s->name, (long long)s->N, (long long)s->K);
}

/* Adds the stored entries of one spec to the writer; names into `names` (kept alive). */
int m3_rw_add_entries(m3_st_writer *w, const rw_spec *s, const rw_out *o, const char *prefix, m3_rand_quant qm,
                       json_t *weight_map, const char *file, m3_err *err) {
    char full[320], base[320];
    snprintf(full, sizeof full, "%s%s", prefix, s->name);
    snprintf(base, sizeof base, "%s", full);
    size_t bl = strlen(base);
    if (bl > 7 && strcmp(base + bl - 7, ".weight") == 0) base[bl - 7] = 0;
    int64_t sh[2] = {s->N, s->K}, one[1] = {1};
    const char *names[3];
    char n1[340], n2[340], n3[340];
    int cnt = 0;
    switch (s->fmt) {
    case RW_BF16:
        if (m3_stw_add(w, full, M3_DT_BF16, s->ndim, sh, o->a, err)) return -1;
        names[cnt++] = full;
        break;
    case RW_F32:
        if (m3_stw_add(w, full, M3_DT_F32, s->ndim, sh, o->a, err)) return -1;
        names[cnt++] = full;
        break;
    case RW_MXFP8: {
        int64_t ss[2] = {s->N, s->K / 32};
        snprintf(n1, sizeof n1, "%s.weight", base);
        snprintf(n2, sizeof n2, "%s.weight_scale_inv", base);
        if (m3_stw_add(w, n1, M3_DT_F8_E4M3, 2, sh, o->a, err) || m3_stw_add(w, n2, M3_DT_U8, 2, ss, o->b, err))
            return -1;
        names[cnt++] = n1;
        names[cnt++] = n2;
        break;
    }
    case RW_NVFP4: {
        int64_t ps[2] = {s->N, s->K / 2}, ss[2] = {s->N, s->K / 16};
        snprintf(n1, sizeof n1, "%s.%s", base, qm == M3_RQ_MODELOPT ? "weight" : "weight_packed");
        snprintf(n2, sizeof n2, "%s.weight_scale", base);
        snprintf(n3, sizeof n3, "%s.%s", base, qm == M3_RQ_MODELOPT ? "weight_scale_2" : "weight_global_scale");
        if (m3_stw_add(w, n1, M3_DT_U8, 2, ps, o->a, err) || m3_stw_add(w, n2, M3_DT_F8_E4M3, 2, ss, o->b, err) ||
            m3_stw_add(w, n3, M3_DT_F32, 1, one, &o->gscalar, err))
            return -1;
        names[cnt++] = n1;
        names[cnt++] = n2;
        names[cnt++] = n3;
        break;
    }
    }
    if (weight_map)
        for (int i = 0; i < cnt; i++)
            if (json_object_set_new(weight_map, names[i], json_string(file)))
                return m3_errf(err, "out of memory");
    return 0;
}
