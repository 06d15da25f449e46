/* libFuzzer: the image decoders' entry point (PNG / JPEG / WebP sniffing and decoding, then
 * the full preprocessing) and the data: URL parser must never crash, read out of bounds,
 * leak or hang on arbitrary bytes; whatever decodes has the size it claims. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image/image.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    m3_err err;
    m3_rgb img;
    /* a 4-megapixel cap keeps one input's memory and time bounded */
    if (m3_image_decode(data, size, 4u << 20, &img, &err) == 0) {
        if (img.w < 1 || img.h < 1 || (uint64_t)img.w * img.h > (4u << 20) || !img.px) abort();
        volatile uint8_t sink = img.px[0] ^ img.px[(size_t)img.w * img.h * 3 - 1];
        (void)sink;
        m3_image_opts o;
        m3_image_opts_default(&o);
        m3_pixels px = {0};
        if (m3_image_preprocess(&img, &o, &px, &err) == 0) {
            const int32_t *g = px.grid;
            if (px.n_images != 1 || g[0] != 1 || g[1] * g[2] != px.n_patches || px.patch_dim != 1176 ||
                (int64_t)g[1] * g[2] * 196 > o.max_pixels || g[1] % 2 || g[2] % 2)
                abort();
            m3_pixels_free(&px);
        }
        m3_rgb_free(&img);
    }
    /* the same bytes as a data: URL's text */
    uint8_t *bytes;
    size_t n;
    if (m3_data_url_decode((const char *)data, size, &bytes, &n, &err) == 0) {
        if (!n || n > size) abort();
        free(bytes);
    }
    return 0;
}
