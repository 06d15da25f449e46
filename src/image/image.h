/* Images in: decoding (PNG, JPEG, WebP) to 8-bit RGB and the MiniMax-M3 vision
 * preprocessing, matching the reference processor (transformers 5.17
 * MiniMaxM3VLImageProcessor, torchvision backend; spec section 6):
 *   RGB as PIL's Image.convert("RGB") gives it (alpha dropped, not composited; palette
 *   looked up; gray replicated; 16-bit gray clipped at 255, other 16-bit samples keep
 *   their high byte), smart_resize to multiples of patch*merge, bicubic antialiased resize
 *   in torch's uint8 arithmetic (int16 weights, horizontal pass then vertical, each
 *   rounded to uint8), rescale + CLIP normalization fused in f32 as torchvision does it,
 *   then block-major patches of (channel, temporal, y, x).
 * EXIF orientation is not applied (PIL's Image.open does not either).
 *
 * Ownership: every output (m3_rgb.px, m3_pixels.data / .grid) is malloc'd by the callee
 * and released with the matching _free. Thread-safety: no global state; every function
 * may run on several threads at once on different objects. Library code: never prints,
 * errors name what failed (format, size, field). */
#ifndef M3_IMAGE_H
#define M3_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

/* An 8-bit RGB image: h rows of w (r, g, b) triples. */
typedef struct m3_rgb {
    int w, h;
    uint8_t *px;
} m3_rgb;

typedef enum { M3_IMG_UNKNOWN = 0, M3_IMG_PNG, M3_IMG_JPEG, M3_IMG_WEBP } m3_img_format;

/* Largest decoded image accepted by default (width x height), against decompression bombs:
 * the header's size is checked before any pixel is decoded. */
#define M3_IMAGE_MAX_PIXELS_DEFAULT 50000000ull
/* Largest encoded input accepted by m3_image_load_file / data URLs. */
#define M3_IMAGE_MAX_BYTES (64u << 20)

/* The format from the first bytes (magic numbers), or M3_IMG_UNKNOWN. */
m3_img_format m3_image_sniff(const void *data, size_t n);
const char *m3_image_format_name(m3_img_format f);

/* Decodes PNG, JPEG or WebP bytes to RGB. max_pixels: 0 = M3_IMAGE_MAX_PIXELS_DEFAULT.
 * Errors: unknown format, undecodable or truncated data, animated WebP, zero-sized or
 * larger-than-max_pixels images. */
int m3_image_decode(const void *data, size_t n, uint64_t max_pixels, m3_rgb *out, m3_err *err);
/* The size an image's header declares (PNG IHDR, the JPEG header, the WebP header): what
 * decoding it would cost, known before decoding it. 0, or -1 + err (not an image, no header). */
int m3_image_dims(const void *data, size_t n, uint64_t *w, uint64_t *h, m3_err *err);
int m3_image_load_file(const char *path, uint64_t max_pixels, m3_rgb *out, m3_err *err);
void m3_rgb_free(m3_rgb *img);

/* `data:[<media type>][;base64],<payload>` -> the decoded bytes (malloc'd into *out, *n).
 * Only base64 payloads are accepted (standard or URL-safe alphabet, padding optional,
 * whitespace ignored); a media type, when given, must be image/<something>. */
int m3_data_url_decode(const char *url, size_t len, uint8_t **out, size_t *n, m3_err *err);

/* ---- preprocessing ---- */

typedef struct m3_image_opts {
    int patch;            /* patch_size (14) */
    int temporal;         /* temporal_patch_size (2): each image is repeated this many times */
    int merge;            /* spatial_merge_size (2) */
    int64_t min_pixels;   /* smart_resize bounds on the resized area (3136, 451584) */
    int64_t max_pixels;
    double max_ratio;     /* larger aspect ratios are refused (200) */
    float mean[3], std[3];/* CLIP normalization */
    uint64_t max_input_pixels; /* decode limit, 0 = M3_IMAGE_MAX_PIXELS_DEFAULT */
} m3_image_opts;

/* The reference processor's defaults (spec section 6). */
void m3_image_opts_default(m3_image_opts *o);
/* Reads dir/preprocessor_config.json when present (patch_size, temporal_patch_size,
 * merge_size, max_pixels, image_mean, image_std) over the current values; missing file:
 * no change. Errors name the file and field. */
int m3_image_opts_load(m3_image_opts *o, const char *dir, m3_err *err);

/* smart_resize(h, w, factor = patch * merge, min_pixels, max_pixels) as the reference
 * computes it (Python round-half-even, floor / ceil on the float quotients). */
int m3_image_smart_resize(int h, int w, const m3_image_opts *o, int *rh, int *rw, m3_err *err);

/* Bicubic (a = -0.5) antialiased resize of in to w x h, in torch's uint8 arithmetic. */
int m3_image_resize(const m3_rgb *in, int w, int h, m3_rgb *out, m3_err *err);

/* Pixel values of one or more images, concatenated in order (the model's pixel_values and
 * image_grid_thw). */
typedef struct m3_pixels {
    int n_patches;        /* rows of data */
    int patch_dim;        /* 3 * temporal * patch * patch (1176) */
    float *data;          /* [n_patches, patch_dim] */
    int n_images;
    int32_t *grid;        /* [n_images][3]: t, grid_h, grid_w (in patches) */
} m3_pixels;

/* Appends one image (resize, normalize, patchify) to px (zeroed before the first call). */
int m3_image_preprocess(const m3_rgb *img, const m3_image_opts *o, m3_pixels *px, m3_err *err);
/* Decode + preprocess: what a server calls per image. bytes: PNG/JPEG/WebP; url: a data:
 * URL (see m3_data_url_decode). Appends to px; errors leave px as it was. */
int m3_image_preprocess_bytes(const void *data, size_t n, const m3_image_opts *o, m3_pixels *px, m3_err *err);
int m3_image_preprocess_url(const char *url, size_t len, const m3_image_opts *o, m3_pixels *px, m3_err *err);
/* Reads pixel_values [N, D] (F32/F64/BF16/F16) and image_grid_thw [n, 3] (I32/I64) from a
 * safetensors file, bypassing preprocessing; checks that the grids add up to N. */
int m3_pixels_load(const char *path, m3_pixels *px, m3_err *err);
void m3_pixels_free(m3_pixels *px);

#endif
