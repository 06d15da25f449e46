/* Image decoding: PNG (libpng), JPEG (libjpeg-turbo), WebP (libwebp) to 8-bit RGB with the
 * conversions PIL's Image.open(...).convert("RGB") applies (see image.h); data: URLs. */
#include <ctype.h>
#include <errno.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
/* jpeglib.h needs size_t and FILE declared first */
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>
#include <webp/decode.h>

#include "image.h"

m3_img_format m3_image_sniff(const void *data, size_t n) {
    const uint8_t *p = data;
    if (n >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8)) return M3_IMG_PNG;
    if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return M3_IMG_JPEG;
    if (n >= 12 && !memcmp(p, "RIFF", 4) && !memcmp(p + 8, "WEBP", 4)) return M3_IMG_WEBP;
    return M3_IMG_UNKNOWN;
}

const char *m3_image_format_name(m3_img_format f) {
    switch (f) {
    case M3_IMG_PNG: return "PNG";
    case M3_IMG_JPEG: return "JPEG";
    case M3_IMG_WEBP: return "WebP";
    default: return "unknown";
    }
}

void m3_rgb_free(m3_rgb *img) {
    if (!img) return;
    free(img->px);
    memset(img, 0, sizeof *img);
}

/* Size checks shared by the decoders, before any pixel buffer exists. */
static int check_size(const char *fmt, uint64_t w, uint64_t h, uint64_t max_pixels, m3_err *err) {
    if (w == 0 || h == 0) return m3_errf(err, "%s image has a zero dimension (%llu x %llu)", fmt, (unsigned long long)w, (unsigned long long)h);
    if (w > (1u << 30) || h > (1u << 30) || w * h > max_pixels)
        return m3_errf(err, "%s image is too large: %llu x %llu = %llu pixels (limit %llu)", fmt, (unsigned long long)w,
                       (unsigned long long)h, (unsigned long long)(w * h), (unsigned long long)max_pixels);
    return 0;
}

/* ------------------------------------------------------------------ PNG */

typedef struct {
    const uint8_t *p;
    size_t n, off;
    char msg[200];
    int oom; /* libpng's error was an allocation's */
} png_src;

static void png_read_cb(png_structp png, png_bytep out, size_t len) {
    png_src *s = png_get_io_ptr(png);
    if (len > s->n - s->off) png_error(png, "truncated PNG data");
    memcpy(out, s->p + s->off, len);
    s->off += len;
}

static void png_error_cb(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    /* libpng's words ("Out of memory", "...: insufficient memory to read chunk"); the image adds
     * at most a 4-byte chunk name before them */
    s->oom = strcasestr(msg, "out of memory") || strcasestr(msg, "insufficient memory");
    png_longjmp(png, 1);
}

static void png_warn_cb(png_structp png, png_const_charp msg) { (void)png; (void)msg; }

static int decode_png(const uint8_t *data, size_t n, uint64_t max_pixels, m3_rgb *out, m3_err *err) {
    png_src src = {data, n, 0, "unknown error", 0};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_error_cb, png_warn_cb);
    if (!png) return m3_errf(err, "PNG: out of memory");
    png_infop info = png_create_info_struct(png);
    if (!info) { png_destroy_read_struct(&png, NULL, NULL); return m3_errf(err, "PNG: out of memory"); }
    /* locals changed after setjmp are volatile */
    uint8_t *volatile buf = NULL;
    png_bytep *volatile rows = NULL;
    uint8_t *volatile rgb = NULL;
    volatile int rc = -1;
    if (setjmp(png_jmpbuf(png))) {
        if (src.oom) m3_errf(err, "PNG: %s: out of memory", src.msg);
        else m3_errf(err, "undecodable PNG: %s", src.msg);
        goto done;
    }
    png_set_read_fn(png, &src, png_read_cb);
    png_read_info(png, info);
    uint32_t w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if (check_size("PNG", w, h, max_pixels, err)) goto done;
    int ct = png_get_color_type(png, info), bd = png_get_bit_depth(png, info);
    /* PIL opens 16-bit gray as I;16 and its RGB conversion clips at 255; every other 16-bit
     * layout keeps the high byte of each sample (RGB;16B, LA;16B, RGBA;16B rawmodes) */
    int gray16 = ct == PNG_COLOR_TYPE_GRAY && bd == 16;
    if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png); /* may add alpha (tRNS): dropped below */
    if (ct == PNG_COLOR_TYPE_GRAY && bd < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (bd == 16 && !gray16) png_set_strip_16(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int ch = png_get_channels(png, info), obd = png_get_bit_depth(png, info);
    size_t rb = png_get_rowbytes(png, info);
    if (ch < 1 || ch > 4 || obd != (gray16 ? 16 : 8) || rb != (size_t)w * ch * (obd / 8)) {
        m3_errf(err, "undecodable PNG: unexpected layout after expansion (%d channels of %d bits)", ch, obd);
        goto done;
    }
    buf = malloc(rb * h);
    rows = malloc(sizeof(png_bytep) * h);
    rgb = malloc((size_t)w * h * 3);
    if (!buf || !rows || !rgb) { m3_errf(err, "PNG: %u x %u pixels: out of memory", w, h); goto done; }
    for (uint32_t y = 0; y < h; y++) rows[y] = buf + rb * y;
    png_read_image(png, rows);
    /* the trailing chunks are not read: PIL ignores a missing IEND too */
    for (size_t i = 0, np = (size_t)w * h; i < np; i++) {
        const uint8_t *s = buf + i * ch * (obd / 8);
        uint8_t *d = rgb + i * 3;
        if (gray16) {
            unsigned v = (unsigned)s[0] << 8 | s[1];
            d[0] = d[1] = d[2] = (uint8_t)(v > 255 ? 255 : v);
        } else if (ch <= 2) {
            d[0] = d[1] = d[2] = s[0];
        } else {
            d[0] = s[0]; d[1] = s[1]; d[2] = s[2];
        }
    }
    out->w = (int)w;
    out->h = (int)h;
    out->px = rgb;
    rgb = NULL;
    rc = 0;
done:
    png_destroy_read_struct(&png, &info, NULL);
    free(buf);
    free(rows);
    free(rgb);
    return rc;
}

/* ------------------------------------------------------------------ JPEG */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
    int oom; /* libjpeg's error was an allocation's */
} jpg_err;

static void jpg_error_exit(j_common_ptr c) {
    jpg_err *e = (jpg_err *)c->err;
    c->err->format_message(c, e->msg);
    e->oom = c->err->msg_code == JERR_OUT_OF_MEMORY;
    longjmp(e->jb, 1);
}

/* Warnings are ignored (as PIL does), except the image data ending early: PIL refuses
 * truncated files ("image file is truncated"), and data that runs into a marker (an end
 * marker right after a cut) is the same truncation: libjpeg would fill the rest gray. */
static void jpg_emit(j_common_ptr c, int level) {
    if (level == -1 && (c->err->msg_code == JWRN_JPEG_EOF || c->err->msg_code == JWRN_HIT_MARKER)) {
        jpg_err *e = (jpg_err *)c->err;
        snprintf(e->msg, sizeof e->msg, "data is truncated");
        longjmp(e->jb, 1);
    }
}

static void jpg_output(j_common_ptr c) { (void)c; }

/* Progressive files with absurd scan counts cost CPU for nothing (a decoding-time bomb). */
static void jpg_progress(j_common_ptr c) {
    if (c->is_decompressor && ((j_decompress_ptr)c)->input_scan_number > 1000) {
        jpg_err *e = (jpg_err *)c->err;
        snprintf(e->msg, sizeof e->msg, "more than 1000 scans");
        longjmp(e->jb, 1);
    }
}

/* cinfo with the error manager above (errors and truncation longjmp to je->jb) */
static void jpg_init(struct jpeg_decompress_struct *cinfo, jpg_err *je) {
    memset(cinfo, 0, sizeof *cinfo);
    cinfo->err = jpeg_std_error(&je->pub);
    je->pub.error_exit = jpg_error_exit;
    je->pub.emit_message = jpg_emit;
    je->pub.output_message = jpg_output;
    je->oom = 0;
}

static int decode_jpeg(const uint8_t *data, size_t n, uint64_t max_pixels, m3_rgb *out, m3_err *err) {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_progress_mgr prog;
    jpg_err je;
    jpg_init(&cinfo, &je);
    uint8_t *volatile buf = NULL;
    uint8_t *volatile rgb = NULL;
    volatile int rc = -1, created = 0;
    if (setjmp(je.jb)) {
        if (je.oom) m3_errf(err, "JPEG: %s: out of memory", je.msg);
        else m3_errf(err, "undecodable JPEG: %s", je.msg);
        goto done;
    }
    jpeg_create_decompress(&cinfo);
    created = 1;
    prog.progress_monitor = jpg_progress;
    cinfo.progress = &prog;
    jpeg_mem_src(&cinfo, data, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    if (check_size("JPEG", cinfo.image_width, cinfo.image_height, max_pixels, err)) goto done;
    int cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    cinfo.out_color_space = cmyk ? JCS_CMYK : cinfo.jpeg_color_space == JCS_GRAYSCALE ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    int w = (int)cinfo.output_width, h = (int)cinfo.output_height, ch = cinfo.output_components;
    if (ch != (cmyk ? 4 : cinfo.out_color_space == JCS_GRAYSCALE ? 1 : 3)) {
        m3_errf(err, "undecodable JPEG: %d output components", ch);
        goto done;
    }
    buf = malloc((size_t)w * ch);
    rgb = malloc((size_t)w * h * 3);
    if (!buf || !rgb) { m3_errf(err, "JPEG: %d x %d pixels: out of memory", w, h); goto done; }
    /* PIL reads Adobe CMYK as inverted (rawmode CMYK;I) and converts CMYK to RGB with
     * r = 255 - k - c*(255-k)/255 (its cmyk2rgb, MULDIV255 rounding) */
    int inv = cmyk && cinfo.saw_Adobe_marker;
    while ((int)cinfo.output_scanline < h) {
        int y = (int)cinfo.output_scanline;
        JSAMPROW row = buf;
        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) { m3_errf(err, "undecodable JPEG: no scanline %d", y); goto done; }
        uint8_t *d = rgb + (size_t)y * w * 3;
        for (int x = 0; x < w; x++) {
            const uint8_t *s = buf + (size_t)x * ch;
            if (ch == 1) {
                d[3 * x] = d[3 * x + 1] = d[3 * x + 2] = s[0];
            } else if (ch == 3) {
                d[3 * x] = s[0]; d[3 * x + 1] = s[1]; d[3 * x + 2] = s[2];
            } else {
                int k = inv ? 255 - s[3] : s[3], nk = 255 - k;
                for (int c = 0; c < 3; c++) {
                    int v = inv ? 255 - s[c] : s[c];
                    int t = v * nk + 128, m = ((t >> 8) + t) >> 8, r = nk - m;
                    d[3 * x + c] = (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
                }
            }
        }
    }
    jpeg_finish_decompress(&cinfo);
    out->w = w;
    out->h = h;
    out->px = rgb;
    rgb = NULL;
    rc = 0;
done:
    if (created) jpeg_destroy_decompress(&cinfo);
    free(buf);
    free(rgb);
    return rc;
}

/* ------------------------------------------------------------------ WebP */

static int decode_webp(const uint8_t *data, size_t n, uint64_t max_pixels, m3_rgb *out, m3_err *err) {
    WebPBitstreamFeatures f;
    VP8StatusCode st = WebPGetFeatures(data, n, &f);
    if (st == VP8_STATUS_OUT_OF_MEMORY) return m3_errf(err, "WebP: out of memory"); /* (a server error, not the image's) */
    if (st != VP8_STATUS_OK) return m3_errf(err, "undecodable WebP: bad header (libwebp status %d)", (int)st);
    if (f.has_animation) return m3_errf(err, "animated WebP is not supported");
    if (check_size("WebP", (uint64_t)(f.width > 0 ? f.width : 0), (uint64_t)(f.height > 0 ? f.height : 0), max_pixels, err)) return -1;
    size_t sz = (size_t)f.width * f.height * 3;
    uint8_t *rgb = malloc(sz);
    if (!rgb) return m3_errf(err, "WebP: %d x %d pixels: out of memory", f.width, f.height);
    /* MODE_RGB: alpha, when present, is dropped (colors are not premultiplied); WebPDecode rather
     * than WebPDecodeRGBInto for its status, which tells memory from the data */
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg)) { free(rgb); return m3_errf(err, "undecodable WebP: libwebp version mismatch"); }
    cfg.output.colorspace = MODE_RGB;
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = rgb;
    cfg.output.u.RGBA.stride = f.width * 3;
    cfg.output.u.RGBA.size = sz;
    st = WebPDecode(data, n, &cfg);
    WebPFreeDecBuffer(&cfg.output); /* external memory: frees nothing of rgb */
    if (st != VP8_STATUS_OK) {
        free(rgb);
        if (st == VP8_STATUS_OUT_OF_MEMORY) return m3_errf(err, "WebP: out of memory");
        return m3_errf(err, "undecodable WebP: corrupt or truncated data");
    }
    out->w = f.width;
    out->h = f.height;
    out->px = rgb;
    return 0;
}

/* ------------------------------------------------------------------ entry points */

/* the JPEG header alone: its size */
static int dims_jpeg(const uint8_t *data, size_t n, uint64_t *w, uint64_t *h, m3_err *err) {
    struct jpeg_decompress_struct cinfo;
    jpg_err je;
    jpg_init(&cinfo, &je);
    volatile int created = 0, rc = -1;
    if (setjmp(je.jb)) {
        if (je.oom) m3_errf(err, "JPEG: %s: out of memory", je.msg);
        else m3_errf(err, "undecodable JPEG: %s", je.msg);
        goto done;
    }
    jpeg_create_decompress(&cinfo);
    created = 1;
    jpeg_mem_src(&cinfo, data, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    *w = cinfo.image_width;
    *h = cinfo.image_height;
    rc = 0;
done:
    if (created) jpeg_destroy_decompress(&cinfo);
    return rc;
}

int m3_image_dims(const void *data, size_t n, uint64_t *w, uint64_t *h, m3_err *err) {
    const uint8_t *p = data;
    *w = *h = 0;
    if (!data || n == 0) return m3_errf(err, "empty image data");
    switch (m3_image_sniff(data, n)) {
    case M3_IMG_PNG: /* the signature, then the IHDR chunk: length, "IHDR", width, height (big-endian) */
        if (n < 24 || memcmp(p + 12, "IHDR", 4)) return m3_errf(err, "undecodable PNG: no IHDR chunk first");
        *w = (uint64_t)p[16] << 24 | (uint64_t)p[17] << 16 | (uint64_t)p[18] << 8 | p[19];
        *h = (uint64_t)p[20] << 24 | (uint64_t)p[21] << 16 | (uint64_t)p[22] << 8 | p[23];
        return 0;
    case M3_IMG_JPEG: return dims_jpeg(p, n, w, h, err);
    case M3_IMG_WEBP: {
        int ww = 0, hh = 0;
        if (!WebPGetInfo(p, n, &ww, &hh)) return m3_errf(err, "undecodable WebP: bad header");
        *w = (uint64_t)ww;
        *h = (uint64_t)hh;
        return 0;
    }
    default: return m3_errf(err, "unknown image format (not PNG, JPEG or WebP; %zu bytes)", n);
    }
}

int m3_image_decode(const void *data, size_t n, uint64_t max_pixels, m3_rgb *out, m3_err *err) {
    memset(out, 0, sizeof *out);
    if (!max_pixels) max_pixels = M3_IMAGE_MAX_PIXELS_DEFAULT;
    if (!data || n == 0) return m3_errf(err, "empty image data");
    switch (m3_image_sniff(data, n)) {
    case M3_IMG_PNG: return decode_png(data, n, max_pixels, out, err);
    case M3_IMG_JPEG: return decode_jpeg(data, n, max_pixels, out, err);
    case M3_IMG_WEBP: return decode_webp(data, n, max_pixels, out, err);
    default: return m3_errf(err, "unknown image format (not PNG, JPEG or WebP; %zu bytes)", n);
    }
}

int m3_image_load_file(const char *path, uint64_t max_pixels, m3_rgb *out, m3_err *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return m3_errf(err, "%s: cannot open: %s", path, strerror(errno));
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= M3_IMAGE_MAX_BYTES) { rc = m3_errf(err, "%s: larger than %u bytes", path, M3_IMAGE_MAX_BYTES); break; }
            size_t nc = cap ? cap * 2 : 65536;
            uint8_t *nb = realloc(buf, nc);
            if (!nb) { rc = m3_errf(err, "%s: out of memory", path); break; }
            buf = nb;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) rc = m3_errf(err, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (!rc && m3_image_decode(buf, n, max_pixels, out, err)) rc = m3_err_prefix(err, "%s", path);
    free(buf);
    return rc;
}

/* ------------------------------------------------------------------ data: URLs */

static int b64_val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

int m3_data_url_decode(const char *url, size_t len, uint8_t **out, size_t *n, m3_err *err) {
    *out = NULL;
    *n = 0;
    if (len < 5 || strncasecmp(url, "data:", 5)) return m3_errf(err, "image URL is not a data: URL (only data: URLs are accepted)");
    const char *comma = memchr(url, ',', len);
    if (!comma) return m3_errf(err, "data URL has no ',' before its payload");
    /* media type and parameters: [type/subtype][;param]*[;base64] */
    const char *meta = url + 5, *mend = comma;
    const char *semi = memchr(meta, ';', (size_t)(mend - meta));
    size_t tlen = (size_t)((semi ? semi : mend) - meta);
    if (tlen && (tlen < 6 || strncasecmp(meta, "image/", 6)))
        return m3_errf(err, "data URL media type '%.*s' is not an image", (int)(tlen > 64 ? 64 : tlen), meta);
    if (mend - meta < 7 || strncasecmp(mend - 7, ";base64", 7)) return m3_errf(err, "data URL payload is not base64 (';base64' missing)");
    const char *p = comma + 1, *e = url + len;
    if (e - p > (ptrdiff_t)(M3_IMAGE_MAX_BYTES / 3 * 4 + 16))
        return m3_errf(err, "data URL payload is larger than %u bytes", M3_IMAGE_MAX_BYTES);
    uint8_t *buf = malloc((size_t)(e - p) / 4 * 3 + 3);
    if (!buf) return m3_errf(err, "a data URL of %zu bytes: out of memory", len);
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0, pad = 0;
    for (const char *q = p; q < e; q++) {
        int c = (unsigned char)*q;
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        if (c == '=') { pad++; continue; }
        int v = b64_val(c);
        if (v < 0 || pad) {
            free(buf);
            return m3_errf(err, "data URL: invalid base64 character '%c' at offset %zu", isprint(c) ? c : '?', (size_t)(q - url));
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            buf[o++] = (uint8_t)(acc >> bits);
        }
    }
    if (bits >= 6 || pad > 2) { free(buf); return m3_errf(err, "data URL: truncated base64 payload"); }
    if (!o) { free(buf); return m3_errf(err, "data URL has an empty payload"); }
    *out = buf;
    *n = o;
    return 0;
}
