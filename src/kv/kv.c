#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "../base/num.h"

static const char *NAMES[M3_KV_DTYPE_COUNT] = {"f32", "bf16", "fp8", "nvfp4"};
const char *m3_kv_dtype_name(m3_kv_dtype d) { return (unsigned)d < M3_KV_DTYPE_COUNT ? NAMES[d] : "?"; }

int m3_kv_dtype_parse(const char *s, m3_kv_dtype *out) {
    if (strcmp(s, "auto") == 0) { *out = M3_KV_F32; return 0; }
    for (int i = 0; i < M3_KV_DTYPE_COUNT; i++)
        if (strcmp(s, NAMES[i]) == 0) { *out = (m3_kv_dtype)i; return 0; }
    return -1;
}

int m3_kv_page_tokens(const m3_config *c) { return c->n_sparse_layers ? c->block_size : 128; }

static size_t elem_bytes(m3_kv_dtype d) { return d == M3_KV_F32 ? 4 : 2; }

int m3_kv_create(m3_kv *kv, const m3_config *c, m3_kv_dtype dt, m3_kv_dtype idt, int page_tokens, int n_pages, m3_err *err) {
    memset(kv, 0, sizeof *kv);
    if (dt != M3_KV_F32 && dt != M3_KV_BF16)
        return m3_errf(err, "kv cache dtype '%s' is not supported yet (f32, bf16)", m3_kv_dtype_name(dt));
    if (idt != M3_KV_F32 && idt != M3_KV_BF16)
        return m3_errf(err, "index cache dtype '%s' is not supported yet (f32, bf16)", m3_kv_dtype_name(idt));
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
        size_t b = 2 * (size_t)kv->nkv * page_tokens * kv->D * elem_bytes(dt);
        if (kv->has_index[l]) b += (size_t)page_tokens * kv->Di * elem_bytes(idt);
        b = (b + 63) & ~(size_t)63;
        kv->page_bytes[l] = b;
        kv->base[l] = aligned_alloc(64, b * (size_t)n_pages);
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
        for (int l = 0; l < kv->n_layers; l++) free(kv->base[l]);
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
    size_t eb = elem_bytes(kv->dt);
    size_t kvpart = (size_t)kv->nkv * kv->page * kv->D * eb;
    if (part == M3_KV_IK) {
        *dt = kv->idt;
        *dim = kv->Di;
        return pg + 2 * kvpart + (size_t)slot * kv->Di * elem_bytes(kv->idt);
    }
    *dt = kv->dt;
    *dim = kv->D;
    return pg + (size_t)part * kvpart + ((size_t)head * kv->page + slot) * kv->D * eb;
}

void m3_kv_store(m3_kv *kv, const m3_kv_seq *s, int layer, m3_kv_part part, int pos, const float *x) {
    int nh = part == M3_KV_IK ? 1 : kv->nkv;
    for (int h = 0; h < nh; h++) {
        m3_kv_dtype dt;
        int dim;
        uint8_t *dst = row_ptr(kv, s, layer, part, h, pos, &dt, &dim);
        const float *src = x + (size_t)h * dim;
        if (dt == M3_KV_F32) memcpy(dst, src, (size_t)dim * 4);
        else {
            uint16_t *d = (uint16_t *)dst;
            for (int i = 0; i < dim; i++) d[i] = m3_f32_to_bf16(src[i]);
        }
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
        if (dt == M3_KV_F32) memcpy(out, src, (size_t)run * dim * 4);
        else {
            const uint16_t *h = (const uint16_t *)src;
            for (int i = 0; i < run * dim; i++) out[i] = m3_bf16_to_f32(h[i]);
        }
        out += (size_t)run * dim;
        p0 += run;
        n -= run;
    }
}
