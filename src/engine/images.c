/* Image inputs inside the engine (images.h): shared image objects, their prefix-cache keys,
 * and one vision tower run per object.
 *
 * Why a keyed hash: the prefix cache shares KV blocks between requests whose block keys are
 * equal, so a key collision between two different images would hand one user's image
 * context to another. SipHash-2-4 under a per-engine random key makes collisions impossible
 * to craft (the key never leaves the process) and accidental ones negligible (2^-64). */
#include "images.h"
#include "../base/hash.h"

#include <stdlib.h>
#include <string.h>

#include "../base/fault.h"

#define i_malloc(n) m3_fault_malloc(M3_FAULT_ENGINE, n)

/* ------------------------------------------------------------------ SipHash-2-4 */

static inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

#define SIPROUND                                                                                          \
    do {                                                                                                  \
        v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32);                                         \
        v2 += v3; v3 = rotl(v3, 16); v3 ^= v2;                                                            \
        v0 += v3; v3 = rotl(v3, 21); v3 ^= v0;                                                            \
        v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32);                                         \
    } while (0)

static inline uint64_t load_le64(const uint8_t *p) {
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | p[i];
    return x;
}

uint64_t m3_siphash(const uint64_t key[2], const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t v0 = 0x736f6d6570736575ull ^ key[0], v1 = 0x646f72616e646f6dull ^ key[1];
    uint64_t v2 = 0x6c7967656e657261ull ^ key[0], v3 = 0x7465646279746573ull ^ key[1];
    size_t full = n & ~(size_t)7;
    for (size_t i = 0; i < full; i += 8) {
        uint64_t m = load_le64(p + i);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)n << 56;
    for (size_t i = full; i < n; i++) b |= (uint64_t)p[i] << (8 * (i - full));
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ------------------------------------------------------------------ object */

static void images_free(m3_engine_images *im) {
    m3_pixels_free(&im->px);
    free(im->count);
    free(im->hash);
    free(im->rows);
    free(im->emb);
    free(im);
}

m3_engine_images *m3_images_new(const m3_vision *v, int hidden, const uint64_t key[2], m3_pixels *px,
                                const int32_t *rows, int n_rows, m3_err *err) {
    m3_engine_images *im = NULL;
    if (!v || !v->present) {
        m3_errf(err, "images: the model has no vision tower");
        goto fail;
    }
    int ntok = m3_vision_check_pixels(&v->cfg, px, err);
    if (ntok < 0) { m3_err_prefix(err, "images"); goto fail; }
    if (ntok != n_rows || !rows) {
        m3_errf(err, "images: %d image token positions given, the images make %d tokens", n_rows, ntok);
        goto fail;
    }
    for (int i = 0; i < n_rows; i++)
        if (rows[i] < 0 || (i && rows[i] <= rows[i - 1])) {
            m3_errf(err, "images: image token position %d (index %d) is negative or not ascending", rows[i], i);
            goto fail;
        }
    im = calloc(1, sizeof *im);
    if (!im) { m3_errf(err, "images: out of memory"); goto fail; }
    atomic_init(&im->refs, 1);
    im->px = *px;
    memset(px, 0, sizeof *px);
    im->n_images = im->px.n_images;
    im->n_rows = n_rows;
    im->hidden = hidden;
    im->count = i_malloc(sizeof(int) * (size_t)im->n_images);
    im->hash = i_malloc(sizeof(uint64_t) * (size_t)im->n_images);
    im->rows = i_malloc(sizeof(int32_t) * (size_t)n_rows);
    if (!im->count || !im->hash || !im->rows) {
        m3_errf(err, "images: out of memory");
        images_free(im);
        return NULL;
    }
    memcpy(im->rows, rows, sizeof(int32_t) * (size_t)n_rows);
    size_t row0 = 0, D = (size_t)im->px.patch_dim;
    for (int i = 0; i < im->n_images; i++) {
        const int32_t *g = im->px.grid + 3 * i;
        size_t np = (size_t)g[0] * (size_t)g[1] * (size_t)g[2];
        im->count[i] = m3_vision_image_tokens(&v->cfg, g);
        uint64_t h[4] = {m3_siphash(key, im->px.data + row0 * D, sizeof(float) * np * D), (uint64_t)g[0], (uint64_t)g[1],
                         (uint64_t)g[2]};
        im->hash[i] = m3_siphash(key, h, sizeof h);
        row0 += np;
    }
    return im;
fail:
    m3_pixels_free(px);
    return NULL;
}

void m3_images_retain(m3_engine_images *im) {
    if (im) atomic_fetch_add(&im->refs, 1);
}

void m3_engine_images_release(m3_engine_images *im) {
    if (im && atomic_fetch_sub(&im->refs, 1) == 1) images_free(im);
}

int m3_images_block_keys(const m3_engine_images *im, int page, uint64_t **extra, int *n, m3_err *err) {
    *extra = NULL;
    *n = 0;
    if (!im->n_rows) return 0;
    int nb = im->rows[im->n_rows - 1] / page + 1;
    uint64_t *x = i_malloc(sizeof(uint64_t) * (size_t)nb);
    if (!x) return m3_errf(err, "images: out of memory");
    memset(x, 0, sizeof(uint64_t) * (size_t)nb);
    /* every image token mixes (its image's hash, its index in the image) into its block's key:
     * equal keys mean the same images at the same positions (ids and parents are compared too) */
    int img = 0, j = 0;
    for (int r = 0; r < im->n_rows; r++) {
        while (j >= im->count[img]) { img++; j = 0; }
        uint64_t *k = &x[im->rows[r] / page];
        *k = m3_mix64(*k ^ im->hash[img] ^ ((uint64_t)j * 0x9e3779b97f4a7c15ull)) | 1; /* never 0 (0: text) */
        j++;
    }
    *extra = x;
    *n = nb;
    return 0;
}

int m3_images_encode(m3_engine_images *im, const m3_vision *v, m3_ops *ops, m3_err *err) {
    if (im->emb) return 0;
    float *emb = malloc(sizeof(float) * (size_t)im->n_rows * (size_t)im->hidden);
    if (!emb) return m3_errf(err, "vision tower: out of memory for %d image embeddings", im->n_rows);
    if (m3_vision_encode(v, ops, &im->px, emb, NULL, err)) {
        free(emb);
        return m3_err_prefix(err, "vision tower");
    }
    im->emb = emb;
    m3_pixels_free(&im->px); /* not needed again: preemption reuses the embeddings */
    return 0;
}

int m3_images_first_row(const m3_engine_images *im, int pos) {
    int lo = 0, hi = im->n_rows;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (im->rows[mid] < pos) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
