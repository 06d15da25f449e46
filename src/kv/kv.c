#include "kv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/num.h"

static const char *NAMES[M3_KV_DTYPE_COUNT] = {"f32", "bf16", "fp8", "nvfp4"};
const char *m3_kv_dtype_name(m3_kv_dtype d) { return (unsigned)d < M3_KV_DTYPE_COUNT ? NAMES[d] : "?"; }

int m3_kv_dtype_parse(const char *s, m3_kv_dtype *out) {
    if (strcmp(s, "auto") == 0) { *out = M3_KV_BF16; return 0; } /* the model's activation dtype, as vLLM's auto */
    if (strcmp(s, "fp8_e4m3") == 0) { *out = M3_KV_FP8; return 0; } /* vLLM's name for the same E4M3 cache */
    for (int i = 0; i < M3_KV_DTYPE_COUNT; i++)
        if (strcmp(s, NAMES[i]) == 0) { *out = (m3_kv_dtype)i; return 0; }
    return -1;
}

int m3_kv_page_tokens(const m3_config *c) { return c->n_sparse_layers ? c->block_size : 128; }

/* bytes of one stored row of dim values: f32, bf16, FP8 E4M3 codes, or NVFP4 codes (two
 * per byte, low nibble first) followed by one E4M3 scale per 16 values */
static size_t row_bytes(m3_kv_dtype d, int dim) {
    switch (d) {
    case M3_KV_F32: return 4 * (size_t)dim;
    case M3_KV_BF16: return 2 * (size_t)dim;
    case M3_KV_FP8: return (size_t)dim;
    default: return (size_t)dim / 2 + (size_t)dim / 16;
    }
}

size_t m3_kv_row_bytes(m3_kv_dtype d, int dim) { return row_bytes(d, dim); }

int m3_kv_create(m3_kv *kv, const m3_config *c, m3_kv_dtype dt, m3_kv_dtype idt, int page_tokens, int n_pages, m3_err *err) {
    return m3_kv_create_in(kv, c, dt, idt, page_tokens, n_pages, NULL, err);
}

int m3_kv_create_in(m3_kv *kv, const m3_config *c, m3_kv_dtype dt, m3_kv_dtype idt, int page_tokens, int n_pages,
                    const m3_kv_mem *mem, m3_err *err) {
    memset(kv, 0, sizeof *kv);
    if (mem && mem->alloc) kv->mem = *mem;
    if ((unsigned)dt >= M3_KV_DTYPE_COUNT || (unsigned)idt >= M3_KV_DTYPE_COUNT)
        return m3_errf(err, "kv cache: unknown dtype");
    if (dt == M3_KV_NVFP4 && c->head_dim % 16)
        return m3_errf(err, "kv cache dtype nvfp4 needs head_dim (%d) divisible by 16", c->head_dim);
    if (idt == M3_KV_NVFP4 && c->n_sparse_layers && c->index_dim % 16)
        return m3_errf(err, "index cache dtype nvfp4 needs the indexer head dim (%d) divisible by 16", c->index_dim);
    if (page_tokens < 1 || n_pages < 1) return m3_errf(err, "kv cache: need at least one page of one token");
    kv->n_layers = c->n_layers;
    kv->nkv = c->n_kv_heads;
    kv->D = c->head_dim;
    kv->Di = c->index_dim;
    kv->page = page_tokens;
    kv->dt = dt;
    kv->idt = idt;
    kv->n_pages = n_pages;
    kv->has_index = calloc((size_t)c->n_layers, 1);
    kv->page_bytes = calloc((size_t)c->n_layers, sizeof *kv->page_bytes);
    kv->base = calloc((size_t)c->n_layers, sizeof *kv->base);
    kv->free_pages = malloc((size_t)n_pages * sizeof *kv->free_pages);
    if (!kv->has_index || !kv->page_bytes || !kv->base || !kv->free_pages) goto oom;
    for (int l = 0; l < c->n_layers; l++) {
        kv->has_index[l] = c->layer_sparse[l];
        size_t b = 2 * (size_t)kv->nkv * page_tokens * row_bytes(dt, kv->D);
        if (kv->has_index[l]) b += (size_t)page_tokens * row_bytes(idt, kv->Di);
        b = (b + 63) & ~(size_t)63;
        kv->page_bytes[l] = b;
        kv->base[l] = kv->mem.alloc ? kv->mem.alloc(kv->mem.ctx, b * (size_t)n_pages) : aligned_alloc(64, b * (size_t)n_pages);
        if (!kv->base[l]) goto oom;
    }
    for (int i = 0; i < n_pages; i++) kv->free_pages[i] = n_pages - 1 - i;
    kv->n_free = n_pages;
    return 0;
oom:
    m3_kv_destroy(kv);
    return m3_errf(err, "kv cache: out of memory for %d pages of %d tokens", n_pages, page_tokens);
}

void m3_kv_destroy(m3_kv *kv) {
    if (kv->base)
        for (int l = 0; l < kv->n_layers; l++) {
            if (!kv->base[l]) continue;
            if (kv->mem.release) kv->mem.release(kv->mem.ctx, kv->base[l]);
            else free(kv->base[l]);
        }
    free(kv->base);
    free(kv->page_bytes);
    free(kv->has_index);
    free(kv->free_pages);
    memset(kv, 0, sizeof *kv);
}

size_t m3_kv_bytes_per_token(const m3_kv *kv) {
    size_t t = 0;
    for (int l = 0; l < kv->n_layers; l++) t += kv->page_bytes[l];
    return t / (size_t)kv->page;
}

int m3_kv_seq_reserve(m3_kv *kv, m3_kv_seq *s, int n_tokens, m3_err *err) {
    int need = (n_tokens + kv->page - 1) / kv->page;
    if (need <= s->n_pages) return 0;
    if (need - s->n_pages > kv->n_free)
        return m3_errf(err, "kv cache exhausted: %d tokens need %d pages, %d free of %d", n_tokens, need - s->n_pages,
                       kv->n_free, kv->n_pages);
    if (need > s->cap) {
        int nc = s->cap ? s->cap : 8;
        while (nc < need) nc *= 2;
        int32_t *np = realloc(s->pages, (size_t)nc * sizeof *np);
        if (!np) return m3_errf(err, "out of memory");
        s->pages = np;
        s->cap = nc;
    }
    while (s->n_pages < need) s->pages[s->n_pages++] = kv->free_pages[--kv->n_free];
    return 0;
}

void m3_kv_seq_release(m3_kv *kv, m3_kv_seq *s) {
    for (int i = s->n_pages - 1; i >= 0; i--) kv->free_pages[kv->n_free++] = s->pages[i];
    free(s->pages);
    memset(s, 0, sizeof *s);
}

/* where the row for (part, head, pos) lives, and its element dtype / width */
static uint8_t *row_ptr(const m3_kv *kv, const m3_kv_seq *s, int layer, m3_kv_part part, int head, int pos,
                        m3_kv_dtype *dt, int *dim) {
    int page = s->pages[pos / kv->page], slot = pos % kv->page;
    uint8_t *pg = kv->base[layer] + (size_t)page * kv->page_bytes[layer];
    size_t rb = row_bytes(kv->dt, kv->D);
    size_t kvpart = (size_t)kv->nkv * kv->page * rb;
    if (part == M3_KV_IK) {
        *dt = kv->idt;
        *dim = kv->Di;
        return pg + 2 * kvpart + (size_t)slot * row_bytes(kv->idt, kv->Di);
    }
    *dt = kv->dt;
    *dim = kv->D;
    return pg + (size_t)part * kvpart + ((size_t)head * kv->page + slot) * rb;
}

/* Rounding on insert (spec section 3): bf16 RNE; FP8 E4M3 RNE saturating, scale 1;
 * NVFP4 per 16 values s = e4m3(amax / 6) (f32 divide), codes = nearest E2M1 of x / s
 * (saturated at 6, exact ties to the even code), s == 0 -> a zero block. */
void m3_kv_round_nvfp4(const float *x, int dim, uint8_t *codes, uint8_t *scales) {
    for (int b = 0; b < dim / 16; b++) {
        const float *v = x + 16 * b;
        float amax = 0;
        for (int i = 0; i < 16; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        uint8_t sc = m3_f32_to_e4m3(amax / 6.0f);
        float s = m3_e4m3_to_f32(sc);
        scales[b] = sc;
        for (int i = 0; i < 16; i += 2) {
            uint8_t lo = s == 0 ? 0 : m3_f32_to_e2m1(v[i] / s), hi = s == 0 ? 0 : m3_f32_to_e2m1(v[i + 1] / s);
            codes[(16 * b + i) / 2] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void write_row(m3_kv_dtype dt, const float *src, int dim, uint8_t *dst) {
    switch (dt) {
    case M3_KV_F32: memcpy(dst, src, (size_t)dim * 4); break;
    case M3_KV_BF16:
        for (int i = 0; i < dim; i++) {
            uint16_t h = m3_f32_to_bf16(src[i]);
            memcpy(dst + 2 * (size_t)i, &h, 2);
        }
        break;
    case M3_KV_FP8:
        for (int i = 0; i < dim; i++) dst[i] = m3_f32_to_e4m3(src[i]);
        break;
    default: m3_kv_round_nvfp4(src, dim, dst, dst + dim / 2); break;
    }
}

static void read_row(m3_kv_dtype dt, const uint8_t *src, int dim, float *out) {
    switch (dt) {
    case M3_KV_F32: memcpy(out, src, (size_t)dim * 4); break;
    case M3_KV_BF16:
        for (int i = 0; i < dim; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * (size_t)i, 2);
            out[i] = m3_bf16_to_f32(h);
        }
        break;
    case M3_KV_FP8:
        for (int i = 0; i < dim; i++) out[i] = m3_e4m3_to_f32(src[i]);
        break;
    default: {
        const uint8_t *sc = src + dim / 2;
        for (int i = 0; i < dim; i++) {
            uint8_t code = (i & 1) ? (src[i / 2] >> 4) : (src[i / 2] & 15);
            out[i] = m3_e2m1_values[code] * m3_e4m3_to_f32(sc[i / 16]);
        }
    }
    }
}

void m3_kv_store(m3_kv *kv, const m3_kv_seq *s, int layer, m3_kv_part part, int pos, const float *x) {
    int nh = part == M3_KV_IK ? 1 : kv->nkv;
    for (int h = 0; h < nh; h++) {
        m3_kv_dtype dt;
        int dim;
        uint8_t *dst = row_ptr(kv, s, layer, part, h, pos, &dt, &dim);
        const float *src = x + (size_t)h * dim;
        write_row(dt, src, dim, dst);
    }
}

const void *m3_kv_rows(const m3_kv *kv, const m3_kv_seq *s, int layer, m3_kv_part part, int head, int pos, int *run) {
    m3_kv_dtype dt;
    int dim;
    *run = kv->page - pos % kv->page;
    return row_ptr(kv, s, layer, part, head, pos, &dt, &dim);
}

void m3_kv_load(const m3_kv *kv, const m3_kv_seq *s, int layer, m3_kv_part part, int head, int p0, int n, float *out) {
    while (n > 0) {
        m3_kv_dtype dt;
        int dim;
        const uint8_t *src = row_ptr(kv, s, layer, part, head, p0, &dt, &dim);
        int run = kv->page - p0 % kv->page; /* rows left in this page, contiguous */
        if (run > n) run = n;
        for (int r = 0; r < run; r++) read_row(dt, src + (size_t)r * row_bytes(dt, dim), dim, out + (size_t)r * dim);
        out += (size_t)run * dim;
        p0 += run;
        n -= run;
    }
}
