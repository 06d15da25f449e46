/* Engine-internal side of image inputs (m3_engine_images, engine.h): the shared object,
 * its prefix-cache keys and the vision tower run. Not a public API: engine.c uses it.
 *
 * Lifetime: created by m3_engine_images_create (any thread) with one reference; every
 * request holding it takes another (m3_engine_add), dropped when the request is freed. The
 * refcount is atomic; everything else is written only on the engine thread after creation
 * (the pixels are freed and the embeddings written by m3_images_encode). */
#ifndef M3_ENGINE_IMAGES_H
#define M3_ENGINE_IMAGES_H

#include <stdatomic.h>
#include <stdint.h>

#include "../base/err.h"
#include "../image/image.h"
#include "../model/vision.h"
#include "engine.h"

struct m3_engine_images {
    atomic_int refs;
    m3_pixels px;          /* the images, preprocessed; freed once encoded */
    int n_images;
    int *count;            /* [n_images] image tokens of each image */
    uint64_t *hash;        /* [n_images] keyed content hash of each image (pixels + grid) */
    int32_t *rows;         /* [n_rows] prompt positions of the image tokens, ascending */
    int n_rows;
    int hidden;            /* the text model's hidden size (row width of emb) */
    float *emb;            /* [n_rows][hidden] image embeddings, NULL until encoded */
};

/* Builds the object (see m3_engine_images_create); key: the engine's secret hash key. */
m3_engine_images *m3_images_new(const m3_vision *v, int hidden, const uint64_t key[2], m3_pixels *px,
                                const int32_t *rows, int n_rows, m3_err *err);
void m3_images_retain(m3_engine_images *im);

/* Per-block prefix-cache keys of a prompt with these images, for blocks of `page`
 * positions: (*extra)[b] mixes the content hash and in-image index of every image token in
 * block b (0 for blocks without any); *n = blocks up to the last image token. malloc'd. */
int m3_images_block_keys(const m3_engine_images *im, int page, uint64_t **extra, int *n, m3_err *err);

/* Runs the vision tower once (engine thread): fills im->emb and frees the pixels. A no-op
 * when already done. */
int m3_images_encode(m3_engine_images *im, const m3_vision *v, m3_ops *ops, m3_err *err);

/* Index of the first image row >= pos (n_rows when none). */
int m3_images_first_row(const m3_engine_images *im, int pos);

/* SipHash-2-4 of n bytes under a 128-bit key (exposed for tests). */
uint64_t m3_siphash(const uint64_t key[2], const void *data, size_t n);

#endif
