/* Image inputs of chat requests (m3 serve): OpenAI content parts
 *     {"type": "image_url", "image_url": {"url": "data:image/png;base64,...", "detail": "auto"}}
 * in any message's content array, in order (messages, then parts). What is accepted:
 *   - data: URLs with a base64 payload (image/png, image/jpeg, image/webp; the format is
 *     taken from the bytes), decoded and preprocessed as `m3 logits --image` does (src/image);
 *     "detail" is accepted and ignored; at most M3_MEDIA_MAX_IMAGES images per request;
 *   - nothing else: http(s) URLs are refused (nothing is ever fetched; with
 *     --allowed-media-domains the message says whether the host was allowed), file: URLs,
 *     paths and other schemes too (a request never names a file of the server).
 * Other content part types than "text" and "image_url" are refused (rather than dropped).
 *
 * The chat template sees each image part as {"type": "image"} (the Hugging Face convention)
 * and writes a placeholder for it (the built-in MiniMax-M3 template writes
 * ]<]start of image[>[ ]<]image[>[ ]<]end of image[>[); after tokenizing, each image
 * placeholder token (the config's image_token_index) becomes the image's
 * grid_h * grid_w / merge^2 image tokens, wrapped in the start / end tokens unless the
 * template already bracketed it, as m3_vision_expand_prompt does for `m3 logits --image`
 * (here every placeholder token is one image: the template never writes expanded runs).
 *
 * Errors are OpenAI-shaped (m3_oai_error): 400 naming the part
 * ("messages[0].content[1].image_url") and the problem (bad base64, undecodable or truncated
 * image, too many pixels, degenerate aspect ratio, remote URL, no vision tower, placeholders
 * not matching the images), 500 when out of memory.
 *
 * Ownership: m3_media owns its pixels and rows (m3_media_free). Thread-safe for distinct
 * m3_media (the context is read only). */
#ifndef M3_SERVER_MEDIA_H
#define M3_SERVER_MEDIA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "../image/image.h"
#include "../model/vision.h"

#define M3_MEDIA_MAX_IMAGES 32 /* images per request */
/* pixels decoded per request, all its images together, as their headers declare them before
 * any is decoded (32 images of 7000 x 7000 would be 1.6 G pixels: 4.7 GB to decode) */
#define M3_MEDIA_MAX_REQUEST_PIXELS 100000000ull

struct m3_oai_error;

/* What the server knows about images. */
typedef struct m3_media_ctx {
    const m3_vision_config *vc;   /* the vision tower's config; NULL: no vision tower (images get 400) */
    const char *no_vision;        /* why there is none, for the 400 (NULL: a default message) */
    m3_image_opts io;             /* preprocessing (the checkpoint's preprocessor_config.json) */
    int32_t start_id, end_id;     /* ]<]start of image[>[ / ]<]end of image[>[ ids (-1: none) */
    const char *allowed_domains;  /* --allowed-media-domains "a.com,b.org" (NULL: none) */
    int max_images;               /* vLLM's --limit-mm-per-prompt '{"image": N}': images per request (-1 or 0 with
                                   * has_max_images 0: M3_MEDIA_MAX_IMAGES) */
    int has_max_images;
    int images_asked;             /* the count --limit-mm-per-prompt asked (max_images is at most M3_MEDIA_MAX_IMAGES) */
} m3_media_ctx;

/* vLLM's --limit-mm-per-prompt value ('{"image": 2}', or '{"image": {"count": 2}}'; "video" and
 * "audio" taken too: m3 takes neither kind) into c->max_images, at most M3_MEDIA_MAX_IMAGES
 * (images_asked: the count asked). -1 + err on bad JSON, an unknown modality or a count that is not
 * a non-negative integer. */
int m3_media_limit_parse(m3_media_ctx *c, const char *text, m3_err *err);

/* The images of one request. */
typedef struct m3_media {
    m3_pixels px;                 /* preprocessed, in prompt order */
    int32_t *rows;                /* positions of their image tokens in the expanded prompt, ascending */
    int n_rows;
} m3_media;

/* Scans messages for image parts. None: 0 with *render = NULL (render messages as they are).
 * Else every image is checked, decoded and preprocessed into out->px (c NULL or without a
 * vision tower: 400), and *render is a new array for the chat template in which every image
 * part is {"type": "image"}. 0, or the status of the error in e. */
int m3_media_collect(const m3_media_ctx *c, json_t *messages, json_t **render, m3_media *out, struct m3_oai_error *e);

/* Expands the image placeholders of the encoded prompt *ids / *n (replaced) for the images of
 * m, and sets m->rows. 0, or the status of the error in e. */
int m3_media_expand(const m3_media_ctx *c, m3_media *m, int32_t **ids, size_t *n, struct m3_oai_error *e);

void m3_media_free(m3_media *m);

#endif
