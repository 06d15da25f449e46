/* Unit tests of the image path: decoders (files written here with libpng / libjpeg / libwebp
 * themselves) and the PIL convert("RGB") rules, error cases, data: URLs, smart resize,
 * the resize against a float reference, the patch layout, pixel-value files, the vision
 * config spellings, prompt expansion, and the vision tower on a second, synthetic shape
 * (head_dim 80 with pass-through channels, several images of other grids, t = 2) against
 * a naive float64 implementation of spec section 6 written independently below.
 * usage: test_image WORK_DIR            (writes scratch files there)
 *        test_image --write-seeds DIR   (the fuzz seed corpus: tiny valid and broken files) */
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
/* jpeglib.h needs stdio.h first */
#include <jpeglib.h>
#include <png.h>
#include <webp/encode.h>
#include <zlib.h>

#include "backend/cpu/cpu.h"
#include "base/num.h"
#include "image/image.h"
#include "io/safetensors.h"
#include "model/vision.h"

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); printf(__VA_ARGS__); printf("\n"); } } while (0)

typedef struct { uint8_t *p; size_t n, cap; } buf;
static void buf_put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

/* ------------------------------------------------------------------ encoders */

static void png_w(png_structp png, png_bytep d, size_t n) { buf_put(png_get_io_ptr(png), d, n); }
static void png_f(png_structp png) { (void)png; }

/* samples: rows of packed samples as libpng expects them for (color type, depth) */
static buf png_encode(int w, int h, int ct, int bd, int interlace, const uint8_t *samples, size_t row_bytes,
                      const png_color *pal, int npal, const uint8_t *trns, int ntrns) {
    buf b = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) abort();
    png_set_write_fn(png, &b, png_w, png_f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, bd, ct, interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (pal) png_set_PLTE(png, info, pal, npal);
    if (trns) png_set_tRNS(png, info, trns, ntrns, NULL);
    png_write_info(png, info);
    png_bytep *rows = malloc(sizeof(png_bytep) * (size_t)h);
    for (int y = 0; y < h; y++) rows[y] = (png_bytep)samples + (size_t)y * row_bytes;
    png_write_image(png, rows);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    free(rows);
    return b;
}

static buf jpeg_encode(int w, int h, int comps, J_COLOR_SPACE cs, int quality, int progressive, const uint8_t *samples) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    unsigned char *mem = NULL;
    unsigned long size = 0;
    jpeg_mem_dest(&c, &mem, &size);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = comps;
    c.in_color_space = cs;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    if (progressive) jpeg_simple_progression(&c);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW r = (JSAMPROW)samples + (size_t)c.next_scanline * w * comps;
        jpeg_write_scanlines(&c, &r, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    buf b = {0};
    buf_put(&b, mem, size);
    free(mem);
    return b;
}

static buf webp_encode(int w, int h, int alpha, int lossless, const uint8_t *px) {
    uint8_t *out = NULL;
    size_t n;
    if (lossless) n = alpha ? WebPEncodeLosslessRGBA(px, w, h, w * 4, &out) : WebPEncodeLosslessRGB(px, w, h, w * 3, &out);
    else n = alpha ? WebPEncodeRGBA(px, w, h, w * 4, 90, &out) : WebPEncodeRGB(px, w, h, w * 3, 90, &out);
    buf b = {0};
    if (n) buf_put(&b, out, n);
    WebPFree(out);
    return b;
}

/* a test picture: smooth gradients plus a few sharp edges */
static uint8_t *picture(int w, int h, int ch) {
    uint8_t *p = malloc((size_t)w * h * ch);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < ch; c++) {
                int v = c == 0 ? x * 255 / (w > 1 ? w - 1 : 1) : c == 1 ? y * 255 / (h > 1 ? h - 1 : 1) : c == 2 ? ((x + y) * 7) % 256 : 128 + (x % 3);
                if ((x / 5 + y / 7) % 4 == 0 && c < 3) v = 255 - v;
                p[((size_t)y * w + x) * ch + c] = (uint8_t)v;
            }
    return p;
}

/* ------------------------------------------------------------------ decoders */

static void test_png(void) {
    m3_err err;
    m3_rgb img;
    const int w = 13, h = 9;
    uint8_t *rgb = picture(w, h, 3), *rgba = picture(w, h, 4);
    /* RGB 8, plain and interlaced */
    for (int il = 0; il < 2; il++) {
        buf b = png_encode(w, h, PNG_COLOR_TYPE_RGB, 8, il, rgb, (size_t)w * 3, NULL, 0, NULL, 0);
        CHECK(m3_image_sniff(b.p, b.n) == M3_IMG_PNG, "sniff png");
        int rc = m3_image_decode(b.p, b.n, 0, &img, &err);
        CHECK(rc == 0 && img.w == w && img.h == h && !memcmp(img.px, rgb, (size_t)w * h * 3), "png rgb8 interlace %d: %s", il, rc ? err.msg : "pixels differ");
        m3_rgb_free(&img);
        free(b.p);
    }
    /* RGBA: alpha dropped, not composited (PIL convert("RGB")) */
    {
        buf b = png_encode(w, h, PNG_COLOR_TYPE_RGB_ALPHA, 8, 0, rgba, (size_t)w * 4, NULL, 0, NULL, 0);
        int ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0;
        for (int i = 0; ok && i < w * h; i++) ok = !memcmp(img.px + 3 * i, rgba + 4 * i, 3);
        CHECK(ok, "png rgba: alpha should be dropped");
        m3_rgb_free(&img);
        free(b.p);
    }
    /* gray 8 and gray + alpha: replicated */
    {
        uint8_t g[26], ga[52];
        for (int i = 0; i < 26; i++) { g[i] = (uint8_t)(i * 9); ga[2 * i] = g[i]; ga[2 * i + 1] = (uint8_t)(i * 3); }
        buf b = png_encode(13, 2, PNG_COLOR_TYPE_GRAY, 8, 0, g, 13, NULL, 0, NULL, 0);
        int ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0;
        for (int i = 0; ok && i < 26; i++) ok = img.px[3 * i] == g[i] && img.px[3 * i + 1] == g[i] && img.px[3 * i + 2] == g[i];
        CHECK(ok, "png gray8");
        m3_rgb_free(&img);
        free(b.p);
        b = png_encode(13, 2, PNG_COLOR_TYPE_GRAY_ALPHA, 8, 0, ga, 26, NULL, 0, NULL, 0);
        ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0;
        for (int i = 0; ok && i < 26; i++) ok = img.px[3 * i] == g[i] && img.px[3 * i + 2] == g[i];
        CHECK(ok, "png gray+alpha");
        m3_rgb_free(&img);
        free(b.p);
    }
    /* gray 1 and 2 bits scale to 0..255 */
    {
        uint8_t one[2] = {0xA5, 0x80};     /* 10100101 1 (9 px) */
        buf b = png_encode(9, 1, PNG_COLOR_TYPE_GRAY, 1, 0, one, 2, NULL, 0, NULL, 0);
        const uint8_t want[9] = {255, 0, 255, 0, 0, 255, 0, 255, 255};
        int ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0 && img.w == 9;
        for (int i = 0; ok && i < 9; i++) ok = img.px[3 * i] == want[i] && img.px[3 * i + 1] == want[i];
        CHECK(ok, "png gray1");
        m3_rgb_free(&img);
        free(b.p);
        uint8_t two[1] = {0x1B};           /* 00 01 10 11 */
        b = png_encode(4, 1, PNG_COLOR_TYPE_GRAY, 2, 0, two, 1, NULL, 0, NULL, 0);
        ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0;
        for (int i = 0; ok && i < 4; i++) ok = img.px[3 * i] == 85 * i;
        CHECK(ok, "png gray2: 0, 85, 170, 255");
        m3_rgb_free(&img);
        free(b.p);
    }
    /* palette (4 bits) with transparency: the palette colors, transparency ignored */
    {
        png_color pal[3] = {{10, 20, 30}, {200, 100, 50}, {1, 2, 3}};
        uint8_t trns[3] = {0, 128, 255};
        uint8_t idx[2] = {0x01, 0x20};     /* 0 1 2 0 */
        buf b = png_encode(4, 1, PNG_COLOR_TYPE_PALETTE, 4, 0, idx, 2, pal, 3, trns, 3);
        const int want[4] = {0, 1, 2, 0};
        int ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0;
        for (int i = 0; ok && i < 4; i++)
            ok = img.px[3 * i] == pal[want[i]].red && img.px[3 * i + 1] == pal[want[i]].green && img.px[3 * i + 2] == pal[want[i]].blue;
        CHECK(ok, "png palette + tRNS: %s", ok ? "" : err.msg);
        m3_rgb_free(&img);
        free(b.p);
    }
    /* 16 bits: gray clips at 255 (PIL I;16 -> RGB), RGB and gray+alpha keep the high byte */
    {
        uint8_t g16[8] = {0x00, 0x12, 0x01, 0x00, 0xFF, 0xFF, 0x00, 0xFF};
        buf b = png_encode(4, 1, PNG_COLOR_TYPE_GRAY, 16, 0, g16, 8, NULL, 0, NULL, 0);
        const uint8_t want[4] = {0x12, 255, 255, 0xFF};
        int ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0;
        for (int i = 0; ok && i < 4; i++) ok = img.px[3 * i] == want[i] && img.px[3 * i + 2] == want[i];
        CHECK(ok, "png gray16 clips at 255");
        m3_rgb_free(&img);
        free(b.p);
        uint8_t c16[12] = {0x12, 0x34, 0xAB, 0xCD, 0x00, 0xFF, 0xFF, 0x00, 0x80, 0x80, 0x01, 0x02};
        b = png_encode(2, 1, PNG_COLOR_TYPE_RGB, 16, 0, c16, 12, NULL, 0, NULL, 0);
        ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0;
        ok = ok && img.px[0] == 0x12 && img.px[1] == 0xAB && img.px[2] == 0x00 && img.px[3] == 0xFF && img.px[4] == 0x80 && img.px[5] == 0x01;
        CHECK(ok, "png rgb16 keeps the high byte");
        m3_rgb_free(&img);
        free(b.p);
        uint8_t ga16[4] = {0x7F, 0xFF, 0x00, 0x10};
        b = png_encode(1, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 16, 0, ga16, 4, NULL, 0, NULL, 0);
        ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0 && img.px[0] == 0x7F && img.px[1] == 0x7F;
        CHECK(ok, "png gray+alpha 16 keeps the high byte");
        m3_rgb_free(&img);
        free(b.p);
    }
    /* errors: truncated, bad CRC, too large (refused before decoding), limit */
    {
        buf b = png_encode(w, h, PNG_COLOR_TYPE_RGB, 8, 0, rgb, (size_t)w * 3, NULL, 0, NULL, 0);
        CHECK(m3_image_decode(b.p, b.n / 2, 0, &img, &err) != 0 && strstr(err.msg, "PNG"), "truncated png: %s", err.msg);
        uint8_t *c = malloc(b.n);
        memcpy(c, b.p, b.n);
        c[20] ^= 1; /* inside IHDR: its CRC no longer matches */
        CHECK(m3_image_decode(c, b.n, 0, &img, &err) != 0, "png with a bad IHDR CRC decodes");
        free(c);
        CHECK(m3_image_decode(b.p, b.n, 100, &img, &err) != 0 && strstr(err.msg, "too large"), "pixel limit: %s", err.msg);
        /* IHDR claiming 100000 x 100000: refused from the header */
        uint8_t *big = malloc(b.n);
        memcpy(big, b.p, b.n);
        uint8_t dim[8] = {0, 1, 0x86, 0xA0, 0, 1, 0x86, 0xA0};
        memcpy(big + 16, dim, 8);
        uint32_t crc = (uint32_t)crc32(0, big + 12, 17);
        uint8_t cb[4] = {(uint8_t)(crc >> 24), (uint8_t)(crc >> 16), (uint8_t)(crc >> 8), (uint8_t)crc};
        memcpy(big + 29, cb, 4);
        CHECK(m3_image_decode(big, b.n, 0, &img, &err) != 0 && strstr(err.msg, "too large"), "huge png header: %s", err.msg);
        free(big);
        free(b.p);
    }
    free(rgb);
    free(rgba);
}

static int max_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    int m = 0;
    for (size_t i = 0; i < n; i++) { int d = abs((int)a[i] - b[i]); if (d > m) m = d; }
    return m;
}

static void test_jpeg(void) {
    m3_err err;
    m3_rgb img;
    const int w = 40, h = 24;
    uint8_t *rgb = picture(w, h, 3);
    /* smooth content at quality 100 comes back close */
    uint8_t *smooth = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h; i++) { smooth[3 * i] = (uint8_t)(i % w * 6); smooth[3 * i + 1] = (uint8_t)(i / w * 10); smooth[3 * i + 2] = 90; }
    for (int prog = 0; prog < 2; prog++) {
        buf b = jpeg_encode(w, h, 3, JCS_RGB, 100, prog, smooth);
        CHECK(m3_image_sniff(b.p, b.n) == M3_IMG_JPEG, "sniff jpeg");
        int rc = m3_image_decode(b.p, b.n, 0, &img, &err);
        CHECK(rc == 0 && img.w == w && img.h == h, "jpeg rgb (progressive %d): %s", prog, rc ? err.msg : "size");
        if (!rc) CHECK(max_diff(img.px, smooth, (size_t)w * h * 3) <= 8, "jpeg rgb q100 differs by %d", max_diff(img.px, smooth, (size_t)w * h * 3));
        m3_rgb_free(&img);
        /* truncated: refused, as PIL does */
        CHECK(m3_image_decode(b.p, b.n * 2 / 3, 0, &img, &err) != 0, "truncated jpeg decodes");
        /* truncated with an end marker after the cut (the image data hits a marker): refused too, not
         * decoded as gray (issue 23: a 543-byte file claiming 7000 x 7000 was accepted) */
        uint8_t *cut = malloc(b.n);
        size_t keep = b.n * 2 / 3;
        memcpy(cut, b.p, keep);
        cut[keep] = 0xFF;
        cut[keep + 1] = 0xD9;
        int rcut = m3_image_decode(cut, keep + 2, 0, &img, &err);
        CHECK(rcut != 0 && strstr(err.msg, "truncated"), "jpeg cut short before its end marker (progressive %d): %s", prog,
              rcut ? err.msg : "decoded");
        if (!rcut) m3_rgb_free(&img);
        free(cut);
        free(b.p);
    }
    /* grayscale */
    {
        uint8_t g[40 * 24];
        for (int i = 0; i < w * h; i++) g[i] = (uint8_t)(i % w * 5);
        buf b = jpeg_encode(w, h, 1, JCS_GRAYSCALE, 100, 0, g);
        int ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0, md = 0;
        for (int i = 0; ok && i < w * h; i++) {
            ok = img.px[3 * i] == img.px[3 * i + 1] && img.px[3 * i] == img.px[3 * i + 2];
            int d = abs(img.px[3 * i] - g[i]);
            if (d > md) md = d;
        }
        CHECK(ok && md <= 3, "jpeg gray (max diff %d)", md);
        m3_rgb_free(&img);
        free(b.p);
    }
    /* CMYK with the Adobe marker (libjpeg writes one): inverted samples, PIL's cmyk2rgb */
    {
        uint8_t cmyk[16 * 8 * 4];
        for (int i = 0; i < 16 * 8; i++) {
            int white = i % 16 < 8; /* stored (Adobe inverted) 255,255,255,255 = no ink; 255,255,255,0 = full black */
            cmyk[4 * i] = cmyk[4 * i + 1] = cmyk[4 * i + 2] = 255;
            cmyk[4 * i + 3] = white ? 255 : 0;
        }
        buf b = jpeg_encode(16, 8, 4, JCS_CMYK, 100, 0, cmyk);
        int ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0;
        CHECK(ok && img.px[0] > 245 && img.px[3 * 15] < 10, "jpeg cmyk: %s (first %d, last %d)", ok ? "" : err.msg, ok ? img.px[0] : -1,
              ok ? img.px[45] : -1);
        m3_rgb_free(&img);
        free(b.p);
    }
    free(rgb);
    free(smooth);
}

static void test_webp(void) {
    m3_err err;
    m3_rgb img;
    const int w = 17, h = 11;
    uint8_t *rgb = picture(w, h, 3), *rgba = picture(w, h, 4);
    buf b = webp_encode(w, h, 0, 1, rgb);
    CHECK(b.n && m3_image_sniff(b.p, b.n) == M3_IMG_WEBP, "sniff webp");
    int rc = m3_image_decode(b.p, b.n, 0, &img, &err);
    CHECK(rc == 0 && img.w == w && !memcmp(img.px, rgb, (size_t)w * h * 3), "webp lossless rgb: %s", rc ? err.msg : "pixels differ");
    m3_rgb_free(&img);
    CHECK(m3_image_decode(b.p, b.n - 5, 0, &img, &err) != 0, "truncated webp decodes");
    free(b.p);
    /* lossless with alpha (alpha > 0 everywhere, so the encoder keeps the colors): alpha dropped */
    b = webp_encode(w, h, 1, 1, rgba);
    int ok = m3_image_decode(b.p, b.n, 0, &img, &err) == 0;
    for (int i = 0; ok && i < w * h; i++) ok = !memcmp(img.px + 3 * i, rgba + 4 * i, 3);
    CHECK(ok, "webp lossless rgba: alpha should be dropped");
    m3_rgb_free(&img);
    free(b.p);
    /* lossy decodes, near */
    b = webp_encode(w, h, 0, 0, rgb);
    CHECK(m3_image_decode(b.p, b.n, 0, &img, &err) == 0 && img.w == w && img.h == h, "webp lossy: %s", err.msg);
    m3_rgb_free(&img);
    free(b.p);
    /* animated: refused with a clear message (VP8X with the animation flag) */
    uint8_t anim[30] = {'R', 'I', 'F', 'F', 22, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'X', 10, 0, 0, 0, 0x02, 0, 0, 0, 9, 0, 0, 9, 0, 0};
    rc = m3_image_decode(anim, sizeof anim, 0, &img, &err);
    CHECK(rc != 0, "animated webp header decodes");
    free(rgb);
    free(rgba);
}

static void test_errors(void) {
    m3_err err;
    m3_rgb img;
    CHECK(m3_image_decode("", 0, 0, &img, &err) != 0 && strstr(err.msg, "empty"), "empty: %s", err.msg);
    CHECK(m3_image_decode("GIF89a......", 12, 0, &img, &err) != 0 && strstr(err.msg, "unknown image format"), "gif: %s", err.msg);
    uint8_t junk[64];
    memcpy(junk, "\x89PNG\r\n\x1a\n", 8);
    memset(junk + 8, 0xAB, 56);
    CHECK(m3_image_decode(junk, sizeof junk, 0, &img, &err) != 0 && strstr(err.msg, "undecodable PNG"), "junk png: %s", err.msg);
    uint8_t jj[64] = {0xFF, 0xD8, 0xFF, 0xE0};
    CHECK(m3_image_decode(jj, sizeof jj, 0, &img, &err) != 0 && strstr(err.msg, "JPEG"), "junk jpeg: %s", err.msg);
    uint8_t ww[40] = {'R', 'I', 'F', 'F', 32, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', ' '};
    CHECK(m3_image_decode(ww, sizeof ww, 0, &img, &err) != 0 && strstr(err.msg, "WebP"), "junk webp: %s", err.msg);
    CHECK(m3_image_load_file("/nonexistent/x.png", 0, &img, &err) != 0 && strstr(err.msg, "/nonexistent/x.png"), "missing file: %s", err.msg);
}

/* ------------------------------------------------------------------ data: URLs */

static char *b64(const uint8_t *d, size_t n, int urlsafe) {
    const char *a = urlsafe ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                            : "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *s = malloc(n / 3 * 4 + 8);
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        s[o++] = a[v >> 18 & 63];
        s[o++] = a[v >> 12 & 63];
        s[o++] = i + 1 < n ? a[v >> 6 & 63] : '=';
        s[o++] = i + 2 < n ? a[v & 63] : '=';
    }
    s[o] = 0;
    return s;
}

static void test_data_url(void) {
    m3_err err;
    const int w = 30, h = 20;
    uint8_t *rgb = picture(w, h, 3);
    buf png = png_encode(w, h, PNG_COLOR_TYPE_RGB, 8, 0, rgb, (size_t)w * 3, NULL, 0, NULL, 0);
    for (int urlsafe = 0; urlsafe < 2; urlsafe++) {
        char *p64 = b64(png.p, png.n, urlsafe);
        size_t len = strlen(p64) + 64;
        char *url = malloc(len);
        snprintf(url, len, "data:image/png;base64,%s", p64);
        uint8_t *bytes;
        size_t n;
        int rc = m3_data_url_decode(url, strlen(url), &bytes, &n, &err);
        CHECK(rc == 0 && n == png.n && !memcmp(bytes, png.p, n), "data url round trip (urlsafe %d): %s", urlsafe, rc ? err.msg : "bytes differ");
        if (!rc) free(bytes);
        /* through preprocessing: same as preprocessing the decoded image */
        m3_image_opts o;
        m3_image_opts_default(&o);
        m3_pixels a = {0}, b = {0};
        m3_rgb img = {w, h, rgb};
        rc = m3_image_preprocess_url(url, strlen(url), &o, &a, &err);
        CHECK(rc == 0, "preprocess_url: %s", err.msg);
        CHECK(m3_image_preprocess(&img, &o, &b, &err) == 0, "preprocess: %s", err.msg);
        CHECK(!rc && a.n_patches == b.n_patches && !memcmp(a.data, b.data, sizeof(float) * (size_t)a.n_patches * a.patch_dim),
              "data url pixels differ from the image's");
        m3_pixels_free(&a);
        m3_pixels_free(&b);
        free(url);
        free(p64);
    }
    struct { const char *url, *needle; } bad[] = {
        {"http://example.com/a.png", "not a data: URL"},
        {"data:image/png;base64", "no ','"},
        {"data:text/plain;base64,AAAA", "not an image"},
        {"data:image/png,rawbytes", "not base64"},
        {"data:image/png;base64,AA*A", "invalid base64 character '*'"},
        {"data:image/png;base64,A", "truncated"},
        {"data:image/png;base64,", "empty"},
        {"data:image/png;base64,AA==AA", "invalid base64"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t *bytes = NULL;
        size_t n;
        int rc = m3_data_url_decode(bad[i].url, strlen(bad[i].url), &bytes, &n, &err);
        CHECK(rc != 0 && strstr(err.msg, bad[i].needle), "bad url '%s': rc %d, '%s'", bad[i].url, rc, rc ? err.msg : "");
        if (!rc) free(bytes);
    }
    /* whitespace and missing padding are accepted; a media type may be absent */
    uint8_t *bytes;
    size_t n;
    const char *u = "data:;base64,SGVs\nbG8";
    CHECK(m3_data_url_decode(u, strlen(u), &bytes, &n, &err) == 0 && n == 5 && !memcmp(bytes, "Hello", 5), "lenient base64: %s", err.msg);
    free(bytes);
    /* a non-image payload in an image data URL */
    u = "data:image/png;base64,SGVsbG8=";
    m3_image_opts o;
    m3_image_opts_default(&o);
    m3_pixels px = {0};
    CHECK(m3_image_preprocess_url(u, strlen(u), &o, &px, &err) != 0 && strstr(err.msg, "unknown image format"), "hello.png: %s", err.msg);
    CHECK(px.n_images == 0 && !px.data, "failed preprocess leaves px empty");
    free(png.p);
    free(rgb);
}

/* ------------------------------------------------------------------ preprocessing */

static void test_smart_resize(void) {
    m3_image_opts o;
    m3_image_opts_default(&o);
    m3_err err;
    /* (h, w) -> (h, w), from the reference's formula in Python */
    const int cases[][4] = {{100, 150, 112, 140}, {1, 1, 56, 56}, {42, 70, 56, 56}, {70, 98, 56, 112}, {98, 42, 112, 56},
                            {28000, 28000, 672, 672}, {700, 900, 588, 756}, {3000, 4000, 560, 756}, {10, 2000, 28, 1988},
                            {1080, 1920, 504, 896}, {20, 30, 56, 84}, {57, 300, 56, 308}, {5, 1000, 28, 1008},
                            {640, 480, 644, 476}, {97, 333, 84, 336}, {1, 200, 28, 196}, {4032, 3024, 756, 560}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rh = 0, rw = 0, rc = m3_image_smart_resize(cases[i][0], cases[i][1], &o, &rh, &rw, &err);
        CHECK(rc == 0 && rh == cases[i][2] && rw == cases[i][3], "smart_resize(%d, %d) = (%d, %d), want (%d, %d)", cases[i][0],
              cases[i][1], rh, rw, cases[i][2], cases[i][3]);
    }
    int rh, rw;
    CHECK(m3_image_smart_resize(1, 201, &o, &rh, &rw, &err) != 0 && strstr(err.msg, "aspect ratio"), "ratio 201: %s", err.msg);
    CHECK(m3_image_smart_resize(0, 5, &o, &rh, &rw, &err) != 0, "zero height");
}

/* float reference of the resize: PIL weights in double, horizontal pass rounded to uint8 */
static void ref_axis(int in, int out, int i, int *xmin, int *xs, double *k) {
    double scale = (double)in / out, fs = scale < 1 ? 1 : scale, support = 2 * fs, center = (i + 0.5) * scale, ww = 0;
    int a = (int)(center - support + 0.5), b = (int)(center + support + 0.5);
    if (a < 0) a = 0;
    if (b > in) b = in;
    for (int x = a; x < b; x++) {
        double t = fabs((x - center + 0.5) / fs), v = t < 1 ? (1.5 * t - 2.5) * t * t + 1 : t < 2 ? ((-0.5 * t + 2.5) * t - 4) * t + 2 : 0;
        k[x - a] = v;
        ww += v;
    }
    for (int x = a; x < b; x++) k[x - a] /= ww;
    *xmin = a;
    *xs = b - a;
}

static void test_resize(void) {
    m3_err err;
    const int sizes[][4] = {{150, 100, 140, 112}, {37, 53, 300, 20}, {300, 200, 56, 56}, {64, 64, 64, 31}, {5, 3, 28, 56}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int iw = sizes[s][0], ih = sizes[s][1], ow = sizes[s][2], oh = sizes[s][3];
        uint8_t *p = picture(iw, ih, 3);
        m3_rgb in = {iw, ih, p}, out;
        int rc = m3_image_resize(&in, ow, oh, &out, &err);
        CHECK(rc == 0 && out.w == ow && out.h == oh, "resize: %s", err.msg);
        if (rc) { free(p); continue; }
        uint8_t *tmp = malloc((size_t)ow * ih * 3);
        double k[4096];
        for (int y = 0; y < ih; y++)
            for (int x = 0; x < ow; x++) {
                int a, n;
                if (ow == iw) { memcpy(tmp + ((size_t)y * ow + x) * 3, p + ((size_t)y * iw + x) * 3, 3); continue; }
                ref_axis(iw, ow, x, &a, &n, k);
                for (int c = 0; c < 3; c++) {
                    double v = 0;
                    for (int j = 0; j < n; j++) v += k[j] * p[((size_t)y * iw + a + j) * 3 + c];
                    v = floor(v + 0.5);
                    tmp[((size_t)y * ow + x) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
                }
            }
        int md = 0;
        double mean = 0;
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++)
                for (int c = 0; c < 3; c++) {
                    double v;
                    if (oh == ih) v = tmp[((size_t)y * ow + x) * 3 + c];
                    else {
                        int a, n;
                        ref_axis(ih, oh, y, &a, &n, k);
                        v = 0;
                        for (int j = 0; j < n; j++) v += k[j] * tmp[((size_t)(a + j) * ow + x) * 3 + c];
                        v = floor(v + 0.5);
                        v = v < 0 ? 0 : v > 255 ? 255 : v;
                    }
                    int d = abs((int)v - out.px[((size_t)y * ow + x) * 3 + c]);
                    if (d > md) md = d;
                    mean += d;
                }
        mean /= (double)ow * oh * 3;
        /* int16 weights: at most one level off the float reference, rarely */
        CHECK(md <= 1 && mean < 0.05, "resize %dx%d -> %dx%d: max diff %d, mean %.3f from the float reference", iw, ih, ow, oh, md, mean);
        m3_rgb_free(&out);
        free(tmp);
        free(p);
    }
    /* same size: unchanged */
    uint8_t *p = picture(28, 56, 3);
    m3_rgb in = {28, 56, p}, out;
    CHECK(m3_image_resize(&in, 28, 56, &out, &err) == 0 && !memcmp(out.px, p, 28 * 56 * 3), "identity resize");
    m3_rgb_free(&out);
    free(p);
}

/* block-major patches of (channel, temporal, y, x), on an image that needs no resize */
static void test_patch_layout(void) {
    m3_err err;
    m3_image_opts o;
    m3_image_opts_default(&o);
    const int w = 84, h = 56, P = 14;
    uint8_t *p = malloc((size_t)w * h * 3);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) { p[(y * w + x) * 3] = (uint8_t)x; p[(y * w + x) * 3 + 1] = (uint8_t)y; p[(y * w + x) * 3 + 2] = (uint8_t)(x + y); }
    m3_rgb img = {w, h, p};
    m3_pixels px = {0};
    CHECK(m3_image_preprocess(&img, &o, &px, &err) == 0, "preprocess: %s", err.msg);
    CHECK(px.n_images == 1 && px.grid[0] == 1 && px.grid[1] == 4 && px.grid[2] == 6 && px.n_patches == 24 && px.patch_dim == 1176,
          "grid (%d, %d, %d), %d patches of %d", px.grid[0], px.grid[1], px.grid[2], px.n_patches, px.patch_dim);
    int bad = 0;
    for (int pt = 0; pt < px.n_patches && !bad; pt++) {
        int blk = pt / 4, in = pt % 4, row = (blk / 3) * 2 + in / 2, col = (blk % 3) * 2 + in % 2;
        for (int c = 0; c < 3; c++)
            for (int t = 0; t < 2; t++)
                for (int y = 0; y < P; y++)
                    for (int x = 0; x < P; x++) {
                        int X = col * P + x, Y = row * P + y, want = c == 0 ? X : c == 1 ? Y : X + Y;
                        float v = px.data[(size_t)pt * 1176 + ((c * 2 + t) * P + y) * P + x];
                        float u = v * (o.std[c] * 255.0f) + o.mean[c] * 255.0f;
                        if (fabsf(u - (float)want) > 1e-3f) bad++;
                    }
    }
    CHECK(!bad, "%d values out of place in the block-major layout", bad);
    /* a second image appends */
    img.w = 56;
    CHECK(m3_image_preprocess(&img, &o, &px, &err) == 0 && px.n_images == 2 && px.n_patches == 24 + 16 && px.grid[5] == 4, "append");
    m3_pixels_free(&px);
    free(p);
}

static void test_pixels_load(const char *work) {
    m3_err err;
    char path[512];
    snprintf(path, sizeof path, "%s/test_image_pv.safetensors", work);
    uint16_t pv[6 * 4];
    for (int i = 0; i < 24; i++) pv[i] = m3_f32_to_bf16((float)i * 0.5f);
    int64_t g[6] = {1, 2, 2, 1, 1, 2};
    int64_t sp[2] = {6, 4}, sg[2] = {2, 3};
    m3_st_writer *w = m3_stw_new();
    m3_stw_add(w, "pixel_values", M3_DT_BF16, 2, sp, pv, &err);
    m3_stw_add(w, "image_grid_thw", M3_DT_I64, 2, sg, g, &err);
    CHECK(m3_stw_write(w, path, &err) == 0, "write: %s", err.msg);
    m3_stw_free(w);
    m3_pixels px;
    CHECK(m3_pixels_load(path, &px, &err) == 0 && px.n_patches == 6 && px.patch_dim == 4 && px.n_images == 2 && px.grid[5] == 2 &&
              px.data[23] == 11.5f, "pixels_load: %s", err.msg);
    m3_pixels_free(&px);
    g[5] = 3; /* grids add up to 7 rows */
    w = m3_stw_new();
    m3_stw_add(w, "pixel_values", M3_DT_BF16, 2, sp, pv, &err);
    m3_stw_add(w, "image_grid_thw", M3_DT_I64, 2, sg, g, &err);
    m3_stw_write(w, path, &err);
    m3_stw_free(w);
    CHECK(m3_pixels_load(path, &px, &err) != 0 && strstr(err.msg, "adds up to 7"), "grid mismatch: %s", err.msg);
    remove(path);
}

/* ------------------------------------------------------------------ config, prompt */

static void test_config(void) {
    m3_err err;
    m3_vision_config vc;
    const char *hub = "{\"text_config\":{\"hidden_size\":6144},\"projector_hidden_size\":6144,\"image_token_index\":200025,"
                      "\"video_token_index\":200026,\"vision_config\":{\"hidden_size\":1280,\"intermediate_size\":5120,"
                      "\"num_hidden_layers\":32,\"num_attention_heads\":16,\"patch_size\":14,\"rope_theta\":10000.0,"
                      "\"hidden_act\":\"gelu\",\"layer_norm_eps\":1e-5,\"img_token_compression_config\":{"
                      "\"image_token_compression_method\":\"patch_merge\",\"spatial_merge_size\":2,\"temporal_patch_size\":2}}}";
    CHECK(m3_vision_config_parse(&vc, hub, "hub", &err) == 0 && vc.hidden == 1280 && vc.head_dim == 80 && vc.merge == 2 &&
              vc.temporal == 2 && vc.text_hidden == 6144 && vc.image_token == 200025 && vc.video_token == 200026 && vc.rope_theta == 1e4,
          "hub spelling: %s", err.msg);
    const char *tf = "{\"text_config\":{\"hidden_size\":128},\"projector_hidden_size\":96,\"image_token_index\":1000,"
                     "\"vision_config\":{\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                     "\"spatial_merge_size\":3,\"temporal_patch_size\":1,\"rope_parameters\":{\"rope_theta\":500.0}}}";
    CHECK(m3_vision_config_parse(&vc, tf, "tf", &err) == 0 && vc.merge == 3 && vc.temporal == 1 && vc.rope_theta == 500 &&
              vc.video_token == -1 && vc.patch == 14 && vc.ln_eps == 1e-5, "transformers spelling: %s", err.msg);
    CHECK(m3_vision_config_parse(&vc, "{\"text_config\":{}}", "t", &err) == 1, "no vision_config: text-only");
    const char *badact = "{\"text_config\":{\"hidden_size\":8},\"projector_hidden_size\":8,\"image_token_index\":1,"
                         "\"vision_config\":{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"hidden_act\":\"quick_gelu\"}}";
    CHECK(m3_vision_config_parse(&vc, badact, "x", &err) == -1 && strstr(err.msg, "quick_gelu"), "bad act: %s", err.msg);
    const char *badh = "{\"text_config\":{\"hidden_size\":8},\"projector_hidden_size\":8,\"image_token_index\":1,"
                       "\"vision_config\":{\"hidden_size\":10,\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":4}}";
    CHECK(m3_vision_config_parse(&vc, badh, "x", &err) == -1 && strstr(err.msg, "multiple"), "bad heads: %s", err.msg);
    const char *mode2d = "{\"text_config\":{\"hidden_size\":8},\"projector_hidden_size\":8,\"image_token_index\":1,"
                         "\"vision_config\":{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                         "\"position_embedding_type\":\"rope\",\"rope_mode\":\"2d\"}}";
    CHECK(m3_vision_config_parse(&vc, mode2d, "x", &err) == -1 && strstr(err.msg, "'2d'"), "rope_mode 2d: %s", err.msg);
    const char *noproj = "{\"text_config\":{\"hidden_size\":8},\"image_token_index\":1,"
                         "\"vision_config\":{\"hidden_size\":8,\"intermediate_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2}}";
    CHECK(m3_vision_config_parse(&vc, noproj, "x", &err) == -1 && strstr(err.msg, "projector_hidden_size"), "no projector: %s", err.msg);
}

static void test_expand(void) {
    m3_err err;
    int32_t *out, *rows;
    int n;
    const int32_t ids[] = {5, 9, 6, 9, 7};
    const int counts[] = {3, 2};
    CHECK(m3_vision_expand_prompt(ids, 5, 9, 100, 101, counts, 2, &out, &n, &rows, &err) == 0, "expand: %s", err.msg);
    const int32_t want[] = {5, 100, 9, 9, 9, 101, 6, 100, 9, 9, 101, 7};
    const int32_t wrows[] = {2, 3, 4, 8, 9};
    CHECK(n == 12 && !memcmp(out, want, sizeof want) && !memcmp(rows, wrows, sizeof wrows), "expanded ids / rows");
    free(out); free(rows);
    /* already expanded, and a placeholder already bracketed: kept */
    const int32_t ids2[] = {100, 9, 9, 9, 101, 100, 9, 101};
    CHECK(m3_vision_expand_prompt(ids2, 8, 9, 100, 101, counts, 2, &out, &n, &rows, &err) == 0, "expand2: %s", err.msg);
    const int32_t want2[] = {100, 9, 9, 9, 101, 100, 9, 9, 101};
    CHECK(n == 9 && !memcmp(out, want2, sizeof want2) && rows[3] == 6, "pre-expanded / bracketed");
    free(out); free(rows);
    /* no start / end ids */
    CHECK(m3_vision_expand_prompt(ids, 5, 9, -1, -1, counts, 2, &out, &n, &rows, &err) == 0 && n == 8 && out[1] == 9 && out[4] == 6,
          "without markers");
    free(out); free(rows);
    /* adjacent placeholders: one image each */
    const int32_t ids4[] = {9, 9};
    CHECK(m3_vision_expand_prompt(ids4, 2, 9, 100, 101, counts, 2, &out, &n, &rows, &err) == 0, "adjacent: %s", err.msg);
    const int32_t want4[] = {100, 9, 9, 9, 101, 100, 9, 9, 101};
    CHECK(n == 9 && !memcmp(out, want4, sizeof want4) && rows[3] == 6 && rows[4] == 7, "adjacent placeholders");
    free(out); free(rows);
    const int32_t ids3[] = {9, 9, 5};
    CHECK(m3_vision_expand_prompt(ids3, 3, 9, 1, 2, counts, 1, &out, &n, &rows, &err) != 0 && strstr(err.msg, "run of 2"), "bad run: %s", err.msg);
    CHECK(m3_vision_expand_prompt(ids, 5, 9, 1, 2, counts, 1, &out, &n, &rows, &err) != 0 && strstr(err.msg, "more image placeholders"), "too many: %s", err.msg);
    const int c3[] = {1, 1, 1};
    CHECK(m3_vision_expand_prompt(ids, 5, 9, 1, 2, c3, 3, &out, &n, &rows, &err) != 0 && strstr(err.msg, "2 image placeholders"), "too few: %s", err.msg);
}

/* ------------------------------------------------------------------ the tower on a second shape */

typedef struct { uint64_t s; } rng;
static double urand(rng *r) { r->s = r->s * 6364136223846793005ull + 1442695040888963407ull; return ((r->s >> 11) * (1.0 / 9007199254740992.0)) * 2 - 1; }

/* bf16-exact random weights so the f64 reference and the engine use the same values */
static uint16_t *rand_bf16(rng *r, size_t n, double scale, double mean) {
    uint16_t *v = malloc(n * 2);
    for (size_t i = 0; i < n; i++) v[i] = m3_f32_to_bf16((float)(mean + scale * urand(r)));
    return v;
}

typedef struct { const char *name; int ndim; int64_t shape[5]; uint16_t *d; } wt;

static double *f64(const wt *w) {
    size_t n = 1;
    for (int i = 0; i < w->ndim; i++) n *= (size_t)w->shape[i];
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = m3_bf16_to_f32(w->d[i]);
    return d;
}

static void lin64(const double *W, const double *b, const double *x, int T, int N, int K, double *y) {
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double s = b ? b[n] : 0;
            for (int k = 0; k < K; k++) s += W[(size_t)n * K + k] * x[(size_t)t * K + k];
            y[(size_t)t * N + n] = s;
        }
}
static void ln64(const double *x, const double *w, const double *b, int T, int n, double eps, double *y) {
    for (int t = 0; t < T; t++) {
        double m = 0, v = 0;
        for (int i = 0; i < n; i++) m += x[t * n + i];
        m /= n;
        for (int i = 0; i < n; i++) v += (x[t * n + i] - m) * (x[t * n + i] - m);
        v /= n;
        for (int i = 0; i < n; i++) y[t * n + i] = (x[t * n + i] - m) / sqrt(v + eps) * w[i] + b[i];
    }
}
static void gelu64(double *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0))); }

static double rel(const float *a, const double *r, size_t n) {
    double x = 0, y = 0;
    for (size_t i = 0; i < n; i++) { x += (a[i] - r[i]) * (a[i] - r[i]); y += r[i] * r[i]; }
    return sqrt(x / y);
}

static void test_tower(const char *work) {
    /* head_dim 80 (26 channels per axis, 2 passed through), 2 heads, merge 2, 3 images */
    const int Hv = 160, heads = 2, hd = 80, I = 96, L = 2, C = 3, Tp = 2, P = 4, M = 2, PR = 48, H = 32, D = C * Tp * P * P;
    const double theta = 1000.0, eps = 1e-5;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/vision_tower_test", work);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"model_type\":\"minimax_m3_vl\",\"text_config\":{\"hidden_size\":%d},\"projector_hidden_size\":%d,"
               "\"image_token_index\":7,\"vision_config\":{\"hidden_size\":%d,\"intermediate_size\":%d,\"num_hidden_layers\":%d,"
               "\"num_attention_heads\":%d,\"patch_size\":%d,\"rope_parameters\":{\"rope_theta\":%g},"
               "\"img_token_compression_config\":{\"spatial_merge_size\":%d,\"temporal_patch_size\":%d}}}",
            H, PR, Hv, I, L, heads, P, theta, M, Tp);
    fclose(f);
    rng r = {12345};
    wt ws[64];
    int nw = 0;
#define ADD(nm, nd, s0, s1, sc, mu) do { ws[nw].name = strdup(nm); ws[nw].ndim = nd; ws[nw].shape[0] = s0; ws[nw].shape[1] = s1; \
        ws[nw].d = rand_bf16(&r, (size_t)(s0) * ((nd) > 1 ? (s1) : 1), sc, mu); nw++; } while (0)
    ws[nw].name = strdup("vision_tower.vision_model.embeddings.patch_embedding.weight");
    ws[nw].ndim = 5;
    int64_t ps[5] = {Hv, C, Tp, P, P};
    memcpy(ws[nw].shape, ps, sizeof ps);
    ws[nw].d = rand_bf16(&r, (size_t)Hv * D, 1.0 / sqrt(D), 0);
    nw++;
    ADD("vision_tower.vision_model.pre_layrnorm.weight", 1, Hv, 0, 0.1, 1);
    ADD("vision_tower.vision_model.pre_layrnorm.bias", 1, Hv, 0, 0.1, 0);
    for (int l = 0; l < L; l++) {
        char nm[160];
        const char *lin[6] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "mlp.fc1", "mlp.fc2"};
        int NN[6] = {Hv, Hv, Hv, Hv, I, Hv}, KK[6] = {Hv, Hv, Hv, Hv, Hv, I};
        for (int j = 0; j < 2; j++) {
            snprintf(nm, sizeof nm, "vision_tower.vision_model.encoder.layers.%d.layer_norm%d.weight", l, j + 1);
            ADD(nm, 1, Hv, 0, 0.1, 1);
            snprintf(nm, sizeof nm, "vision_tower.vision_model.encoder.layers.%d.layer_norm%d.bias", l, j + 1);
            ADD(nm, 1, Hv, 0, 0.1, 0);
        }
        for (int j = 0; j < 6; j++) {
            snprintf(nm, sizeof nm, "vision_tower.vision_model.encoder.layers.%d.%s.weight", l, lin[j]);
            ADD(nm, 2, NN[j], KK[j], (j < 2 ? 3.0 : 1.0) / sqrt(KK[j]), 0);
            snprintf(nm, sizeof nm, "vision_tower.vision_model.encoder.layers.%d.%s.bias", l, lin[j]);
            ADD(nm, 1, NN[j], 0, 0.05, 0);
        }
    }
    ADD("multi_modal_projector.linear_1.weight", 2, PR, Hv, 1 / sqrt(Hv), 0);
    ADD("multi_modal_projector.linear_1.bias", 1, PR, 0, 0.05, 0);
    ADD("multi_modal_projector.linear_2.weight", 2, H, PR, 1 / sqrt(PR), 0);
    ADD("multi_modal_projector.linear_2.bias", 1, H, 0, 0.05, 0);
    ADD("patch_merge_mlp.linear_1.weight", 2, PR, M * M * H, 1 / sqrt(M * M * H), 0);
    ADD("patch_merge_mlp.linear_1.bias", 1, PR, 0, 0.05, 0);
    ADD("patch_merge_mlp.linear_2.weight", 2, H, PR, 1 / sqrt(PR), 0);
    ADD("patch_merge_mlp.linear_2.bias", 1, H, 0, 0.05, 0);
#undef ADD
    m3_err err;
    m3_st_writer *sw = m3_stw_new();
    for (int i = 0; i < nw; i++) m3_stw_add(sw, ws[i].name, M3_DT_BF16, ws[i].ndim, ws[i].shape, ws[i].d, &err);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(m3_stw_write(sw, path, &err) == 0, "write tower: %s", err.msg);
    m3_stw_free(sw);

    /* three images: a 4 x 6 grid, a 2 x 2 grid and a two-frame 2 x 4 grid */
    const int32_t grids[3][3] = {{1, 4, 6}, {1, 2, 2}, {2, 2, 4}};
    m3_pixels px = {0};
    px.n_images = 3;
    px.patch_dim = D;
    px.grid = malloc(sizeof grids);
    memcpy(px.grid, grids, sizeof grids);
    px.n_patches = 24 + 4 + 16;
    px.data = malloc(sizeof(float) * (size_t)px.n_patches * D);
    for (size_t i = 0; i < (size_t)px.n_patches * D; i++) px.data[i] = (float)(1.5 * urand(&r));

    m3_st *st = m3_st_open(dir, &err);
    m3_vision v;
    int rc = !st ? -1 : m3_vision_load(&v, dir, st, &err);
    CHECK(rc == 0 && v.present, "load tower: %s", err.msg);
    if (rc) goto out;
    m3_ops ops;
    m3_cpu_ops_init(&ops, 2, &err);
    int ntok = m3_vision_check_pixels(&v.cfg, &px, &err);
    CHECK(ntok == 6 + 1 + 4, "tokens %d: %s", ntok, err.msg);
    float *emb = malloc(sizeof(float) * (size_t)ntok * H), *to = malloc(sizeof(float) * (size_t)px.n_patches * Hv);
    CHECK(m3_vision_encode(&v, &ops, &px, emb, to, &err) == 0, "encode: %s", err.msg);

    /* the naive float64 reference, one image at a time */
    double *W[64];
    for (int i = 0; i < nw; i++) W[i] = f64(&ws[i]);
    int d3 = 2 * ((hd / 3) / 2), half = 3 * d3 / 2;
    size_t row0 = 0, tok0 = 0;
    double worst_t = 0, worst_e = 0;
    for (int im = 0; im < 3; im++) {
        int t = grids[im][0], gh = grids[im][1], gw = grids[im][2], n = t * gh * gw;
        /* positions, listed frame by frame, merge block by merge block */
        int (*pos)[3] = malloc(sizeof(int[3]) * (size_t)n), k = 0;
        for (int ft = 0; ft < t; ft++)
            for (int br = 0; br < gh / M; br++)
                for (int bc = 0; bc < gw / M; bc++)
                    for (int ir = 0; ir < M; ir++)
                        for (int ic = 0; ic < M; ic++, k++) { pos[k][0] = ft; pos[k][1] = br * M + ir; pos[k][2] = bc * M + ic; }
        double *x = malloc(sizeof(double) * (size_t)n * 512), *a = malloc(sizeof(double) * (size_t)n * 512);
        double *q = malloc(sizeof(double) * (size_t)n * Hv), *kk = malloc(sizeof(double) * (size_t)n * Hv), *vv = malloc(sizeof(double) * (size_t)n * Hv);
        double *pix = malloc(sizeof(double) * (size_t)n * D), *tmp = malloc(sizeof(double) * (size_t)n * 512);
        for (size_t i = 0; i < (size_t)n * D; i++) pix[i] = px.data[row0 * D + i];
        lin64(W[0], NULL, pix, n, Hv, D, a);
        ln64(a, W[1], W[2], n, Hv, eps, x);
        int wi = 3;
        for (int l = 0; l < L; l++, wi += 16) {
            double **lw = W + wi; /* ln1 w, b, ln2 w, b, then (weight, bias) x 6 */
            ln64(x, lw[0], lw[1], n, Hv, eps, a);
            lin64(lw[4], lw[5], a, n, Hv, Hv, q);
            lin64(lw[6], lw[7], a, n, Hv, Hv, kk);
            lin64(lw[8], lw[9], a, n, Hv, Hv, vv);
            for (int p = 0; p < n; p++)
                for (int h = 0; h < heads; h++)
                    for (int i = 0; i < half; i++) {
                        int axis = i / (d3 / 2), j = i % (d3 / 2);
                        double ang = pos[p][axis] * pow(theta, -2.0 * j / d3), c = cos(ang), s = sin(ang);
                        double *qv = q + (size_t)p * Hv + h * hd, *kv = kk + (size_t)p * Hv + h * hd;
                        double q0 = qv[i], q1 = qv[i + half], k0 = kv[i], k1 = kv[i + half];
                        qv[i] = q0 * c - q1 * s; qv[i + half] = q1 * c + q0 * s;
                        kv[i] = k0 * c - k1 * s; kv[i + half] = k1 * c + k0 * s;
                    }
            double *sc = malloc(sizeof(double) * (size_t)n);
            for (int h = 0; h < heads; h++)
                for (int i = 0; i < n; i++) {
                    double mx = -1e300, sum = 0;
                    for (int j = 0; j < n; j++) {
                        double s = 0;
                        for (int d = 0; d < hd; d++) s += q[(size_t)i * Hv + h * hd + d] * kk[(size_t)j * Hv + h * hd + d];
                        sc[j] = s / sqrt((double)hd);
                        if (sc[j] > mx) mx = sc[j];
                    }
                    for (int j = 0; j < n; j++) { sc[j] = exp(sc[j] - mx); sum += sc[j]; }
                    for (int d = 0; d < hd; d++) {
                        double o = 0;
                        for (int j = 0; j < n; j++) o += sc[j] / sum * vv[(size_t)j * Hv + h * hd + d];
                        a[(size_t)i * Hv + h * hd + d] = o;
                    }
                }
            free(sc);
            lin64(lw[10], lw[11], a, n, Hv, Hv, tmp);
            for (size_t i = 0; i < (size_t)n * Hv; i++) x[i] += tmp[i];
            ln64(x, lw[2], lw[3], n, Hv, eps, a);
            lin64(lw[12], lw[13], a, n, I, Hv, tmp);
            gelu64(tmp, (size_t)n * I);
            lin64(lw[14], lw[15], tmp, n, Hv, I, a);
            for (size_t i = 0; i < (size_t)n * Hv; i++) x[i] += a[i];
        }
        double et = rel(to + row0 * Hv, x, (size_t)n * Hv);
        lin64(W[wi], W[wi + 1], x, n, PR, Hv, tmp);
        gelu64(tmp, (size_t)n * PR);
        lin64(W[wi + 2], W[wi + 3], tmp, n, H, PR, a);          /* [n, H] = [n/4, 4H] */
        lin64(W[wi + 4], W[wi + 5], a, n / (M * M), PR, M * M * H, tmp);
        gelu64(tmp, (size_t)n / (M * M) * PR);
        lin64(W[wi + 6], W[wi + 7], tmp, n / (M * M), H, PR, a);
        double ee = rel(emb + tok0 * H, a, (size_t)n / (M * M) * H);
        printf("tower shape check, image %d grid (%d, %d, %d): vision_tower_out rel L2 %.3g, image_embeds rel L2 %.3g\n", im, t, gh, gw, et, ee);
        if (et > worst_t) worst_t = et;
        if (ee > worst_e) worst_e = ee;
        row0 += (size_t)n;
        tok0 += (size_t)n / (M * M);
        free(pos); free(x); free(a); free(q); free(kk); free(vv); free(pix); free(tmp);
    }
    CHECK(worst_t < 1e-5 && worst_e < 1e-5, "synthetic tower vs float64 reference: %.3g / %.3g", worst_t, worst_e);
    /* one image alone gives the same rows as inside the batch (attention stays within an image) */
    m3_pixels one = {px.n_patches - 28, D, px.data + (size_t)28 * D, 1, px.grid + 6};
    float *emb1 = malloc(sizeof(float) * 4 * H);
    CHECK(m3_vision_encode(&v, &ops, &one, emb1, NULL, &err) == 0 && !memcmp(emb1, emb + 7 * H, sizeof(float) * 4 * H),
          "image 2 alone differs from image 2 in the batch");
    free(emb1);
    /* a device backend: refused with host weights; with a copy made by m3_vision_upload (here a
     * "device" that is the CPU op table marked device-memory, so the copies are host memory the
     * CPU ops read) the same embeddings, bitwise */
    m3_ops dev = ops;
    dev.device_memory = 1;
    dev.name = "cuda";
    CHECK(m3_vision_encode(&v, &dev, &px, emb, NULL, &err) != 0 && strstr(err.msg, "m3_vision_upload"), "device ops: %s", err.msg);
    {
        m3_vision dv;
        float *embd = malloc(sizeof(float) * (size_t)ntok * H);
        CHECK(m3_vision_upload(&v, &dev, &dv, &err) == 0 && dv.on_device, "upload: %s", err.msg);
        CHECK(embd && m3_vision_encode(&dv, &dev, &px, embd, NULL, &err) == 0 &&
                  !memcmp(embd, emb, sizeof(float) * (size_t)ntok * H),
              "the uploaded tower's embeddings differ (%s)", err.msg);
        CHECK(m3_vision_encode(&dv, &ops, &px, embd, NULL, &err) != 0 && strstr(err.msg, "device"),
              "device weights on host ops: %s", err.msg);
        m3_vision_release(&dv, &dev);
        free(embd);
    }
    /* pixel values of the wrong patch size */
    px.patch_dim = D - 1;
    CHECK(m3_vision_check_pixels(&v.cfg, &px, &err) < 0 && strstr(err.msg, "values per patch"), "patch size: %s", err.msg);
    px.patch_dim = D;
    /* an image too large for the n x n attention scores */
    int32_t big[3] = {1, 128, 130};
    m3_pixels pb = {128 * 130, D, NULL, 1, big};
    CHECK(m3_vision_check_pixels(&v.cfg, &pb, &err) < 0 && strstr(err.msg, "at most 16384"), "patch cap: %s", err.msg);
    for (int i = 0; i < nw; i++) free(W[i]);
    free(emb);
    free(to);
    m3_cpu_ops_free(&ops);
    m3_vision_free(&v);
out:
    if (st) m3_st_close(st);
    m3_pixels_free(&px);
    for (int i = 0; i < nw; i++) { free((void *)ws[i].name); free(ws[i].d); }
}

/* ------------------------------------------------------------------ fuzz seeds */

static void put(const char *dir, const char *name, const void *d, size_t n) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) { perror(p); exit(1); }
    fwrite(d, 1, n, f);
    fclose(f);
}

static int write_seeds(const char *dir) {
    mkdir(dir, 0755);
    uint8_t *rgb = picture(6, 5, 3), *rgba = picture(6, 5, 4);
    buf b = png_encode(6, 5, PNG_COLOR_TYPE_RGB, 8, 0, rgb, 18, NULL, 0, NULL, 0);
    put(dir, "rgb.png", b.p, b.n);
    put(dir, "truncated.png", b.p, b.n / 2);
    free(b.p);
    b = png_encode(6, 5, PNG_COLOR_TYPE_RGB_ALPHA, 8, 1, rgba, 24, NULL, 0, NULL, 0);
    put(dir, "rgba_interlaced.png", b.p, b.n);
    free(b.p);
    png_color pal[2] = {{1, 2, 3}, {250, 128, 0}};
    uint8_t tr[1] = {0}, idx[5] = {0x20, 0x40, 0x00, 0x80, 0x10};
    b = png_encode(6, 5, PNG_COLOR_TYPE_PALETTE, 1, 0, idx, 1, pal, 2, tr, 1);
    put(dir, "palette1.png", b.p, b.n);
    free(b.p);
    uint8_t g16[4 * 2 * 2];
    for (int i = 0; i < 16; i++) g16[i] = (uint8_t)(i * 37);
    b = png_encode(4, 2, PNG_COLOR_TYPE_GRAY, 16, 0, g16, 8, NULL, 0, NULL, 0);
    put(dir, "gray16.png", b.p, b.n);
    free(b.p);
    b = jpeg_encode(6, 5, 3, JCS_RGB, 80, 0, rgb);
    put(dir, "rgb.jpg", b.p, b.n);
    put(dir, "truncated.jpg", b.p, b.n * 2 / 3);
    free(b.p);
    b = jpeg_encode(6, 5, 3, JCS_RGB, 50, 1, rgb);
    put(dir, "progressive.jpg", b.p, b.n);
    free(b.p);
    uint8_t g[30];
    for (int i = 0; i < 30; i++) g[i] = (uint8_t)(i * 8);
    b = jpeg_encode(6, 5, 1, JCS_GRAYSCALE, 90, 0, g);
    put(dir, "gray.jpg", b.p, b.n);
    free(b.p);
    uint8_t cmyk[6 * 5 * 4];
    for (int i = 0; i < 120; i++) cmyk[i] = (uint8_t)(i * 2);
    b = jpeg_encode(6, 5, 4, JCS_CMYK, 90, 0, cmyk);
    put(dir, "cmyk.jpg", b.p, b.n);
    free(b.p);
    b = webp_encode(6, 5, 0, 1, rgb);
    put(dir, "lossless.webp", b.p, b.n);
    put(dir, "truncated.webp", b.p, b.n - 4);
    free(b.p);
    b = webp_encode(6, 5, 1, 0, rgba);
    put(dir, "lossy_alpha.webp", b.p, b.n);
    free(b.p);
    uint8_t anim[30] = {'R', 'I', 'F', 'F', 22, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8', 'X', 10, 0, 0, 0, 0x02, 0, 0, 0, 9, 0, 0, 9, 0, 0};
    put(dir, "animated_header.webp", anim, sizeof anim);
    put(dir, "not_an_image.txt", "GIF89a not supported", 20);
    free(rgb);
    free(rgba);
    printf("seeds written to %s\n", dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-seeds")) return write_seeds(argv[2]);
    const char *work = argc > 1 ? argv[1] : "/tmp";
    test_png();
    test_jpeg();
    test_webp();
    test_errors();
    test_data_url();
    test_smart_resize();
    test_resize();
    test_patch_layout();
    test_pixels_load(work);
    test_config();
    test_expand();
    test_tower(work);
    printf("%s (%d failures)\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}
