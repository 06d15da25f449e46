/* MiniMax-M3 image preprocessing: smart resize, bicubic antialiased resize (torch's uint8
 * arithmetic), rescale + CLIP normalization, block-major patches. See image.h. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/num.h"
#include "../io/safetensors.h"
#include "image.h"

void m3_image_opts_default(m3_image_opts *o) {
    memset(o, 0, sizeof *o);
    o->patch = 14;
    o->temporal = 2;
    o->merge = 2;
    o->min_pixels = 4 * 28 * 28; /* the reference's default argument, independent of the factor */
    o->max_pixels = 451584;
    o->max_ratio = 200;
    /* OPENAI_CLIP_MEAN / OPENAI_CLIP_STD, as float32 (torch.tensor of the Python floats) */
    const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f}, std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    memcpy(o->mean, mean, sizeof mean);
    memcpy(o->std, std, sizeof std);
}

int m3_image_opts_load(m3_image_opts *o, const char *dir, m3_err *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) return 0;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return m3_errf(err, "%s: bad JSON: %s (line %d)", path, je.text, je.line);
    int rc = 0;
    if (!json_is_object(root)) { rc = m3_errf(err, "%s: not a JSON object", path); goto done; }
    struct { const char *key; int *dst; int lo, hi; } ints[] = {
        {"patch_size", &o->patch, 1, 1024}, {"temporal_patch_size", &o->temporal, 1, 64}, {"merge_size", &o->merge, 1, 64}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        json_t *v = json_object_get(root, ints[i].key);
        if (!v || json_is_null(v)) continue;
        if (!json_is_integer(v) || json_integer_value(v) < ints[i].lo || json_integer_value(v) > ints[i].hi) {
            rc = m3_errf(err, "%s: '%s' must be an integer in [%d, %d]", path, ints[i].key, ints[i].lo, ints[i].hi);
            goto done;
        }
        *ints[i].dst = (int)json_integer_value(v);
    }
    json_t *mp = json_object_get(root, "max_pixels");
    if (mp && !json_is_null(mp)) {
        if (!json_is_integer(mp) || json_integer_value(mp) < 1 || json_integer_value(mp) > ((json_int_t)1 << 40)) {
            rc = m3_errf(err, "%s: 'max_pixels' must be a positive integer", path);
            goto done;
        }
        o->max_pixels = (int64_t)json_integer_value(mp);
    }
    const char *vk[2] = {"image_mean", "image_std"};
    float *vd[2] = {o->mean, o->std};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(root, vk[k]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_array(v) || json_array_size(v) != 3) { rc = m3_errf(err, "%s: '%s' must be a list of 3 numbers", path, vk[k]); goto done; }
        for (int c = 0; c < 3; c++) {
            json_t *x = json_array_get(v, (size_t)c);
            if (!json_is_number(x) || (k == 1 && !(json_number_value(x) > 0))) {
                rc = m3_errf(err, "%s: '%s'[%d] must be a %snumber", path, vk[k], c, k ? "positive " : "");
                goto done;
            }
            vd[k][c] = (float)json_number_value(x);
        }
    }
done:
    json_decref(root);
    return rc;
}

int m3_image_smart_resize(int h, int w, const m3_image_opts *o, int *rh, int *rw, m3_err *err) {
    const int f = o->patch * o->merge;
    if (h < 1 || w < 1) return m3_errf(err, "image has a zero dimension (%d x %d)", w, h);
    double ratio = (double)(h > w ? h : w) / (double)(h > w ? w : h);
    if (ratio > o->max_ratio)
        return m3_errf(err, "image aspect ratio %.1f (%d x %d) exceeds %.0f", ratio, w, h, o->max_ratio);
    /* Python: round() is half-to-even (nearbyint in the default rounding mode) */
    double hb = fmax(f, nearbyint((double)h / f) * f), wb = fmax(f, nearbyint((double)w / f) * f);
    double hw = (double)h * (double)w;
    if (hb * wb > (double)o->max_pixels) {
        double beta = sqrt(hw / (double)o->max_pixels);
        hb = floor((double)h / beta / f) * f;
        wb = floor((double)w / beta / f) * f;
    } else if (hb * wb < (double)o->min_pixels) {
        double beta = sqrt((double)o->min_pixels / hw);
        hb = ceil((double)h * beta / f) * f;
        wb = ceil((double)w * beta / f) * f;
    }
    if (hb < f || wb < f || hb > 1e6 || wb > 1e6)
        return m3_errf(err, "image of %d x %d resizes to a degenerate %.0f x %.0f", w, h, wb, hb);
    *rh = (int)hb;
    *rw = (int)wb;
    return 0;
}

/* ------------------------------------------------------------------ resize */

/* torch's antialiased bicubic filter (a = -0.5, the PIL-compatible one) */
static double aa_cubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

/* Weights of one axis, as aten's _compute_index_ranges_int16_weights builds them: per output
 * index a window [xmin, xmin + xsize) of f64 weights normalized to sum 1, then all scaled by
 * 2^prec (prec: the largest with 2 * max weight * 2^prec < 2^15) and rounded half away from 0. */
typedef struct {
    int ksize, prec;
    int *xmin, *xsize;
    int16_t *w;  /* [out][ksize] */
} aa_axis;

static void aa_free(aa_axis *a) {
    free(a->xmin);
    free(a->w);
    memset(a, 0, sizeof *a); /* a failed aa_weights frees, then m3_image_resize's cleanup again */
}

static int aa_weights(int in, int out, aa_axis *a) {
    memset(a, 0, sizeof *a);
    double scale = (double)in / (double)out;
    double support = scale >= 1.0 ? 2.0 * scale : 2.0;
    int ks = (int)ceil(support) * 2 + 1;
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    double *wd = malloc(sizeof(double) * (size_t)out * ks);
    a->xmin = malloc(sizeof(int) * 2 * (size_t)out);
    a->w = malloc(sizeof(int16_t) * (size_t)out * ks);
    if (!wd || !a->xmin || !a->w) { free(wd); aa_free(a); return -1; }
    a->xsize = a->xmin + out;
    a->ksize = ks;
    double wt_max = 0.0;
    for (int i = 0; i < out; i++) {
        double center = scale * (i + 0.5);
        long xmin = (long)(center - support + 0.5), xe = (long)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xe > in) xe = in;
        long xs = xe - xmin;
        if (xs < 0) xs = 0;
        if (xs > ks) xs = ks;
        double *k = wd + (size_t)i * ks, total = 0.0;
        int j = 0;
        for (; j < xs; j++) {
            k[j] = aa_cubic((j + xmin - center + 0.5) * invscale);
            total += k[j];
        }
        if (total != 0.0)
            for (j = 0; j < xs; j++) {
                k[j] /= total;
                if (k[j] > wt_max) wt_max = k[j];
            }
        for (j = (int)xs; j < ks; j++) k[j] = 0.0;
        a->xmin[i] = (int)xmin;
        a->xsize[i] = (int)xs;
    }
    int prec = 0;
    for (prec = 0; prec < 22; prec++) {
        int next = (int)(0.5 + wt_max * (double)(1 << (prec + 1)));
        if (next >= (1 << 15)) break;
    }
    a->prec = prec;
    for (size_t i = 0; i < (size_t)out * ks; i++) {
        double v = wd[i] * (double)(1 << prec);
        a->w[i] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    free(wd);
    return 0;
}

static inline uint8_t aa_round(int32_t s, int prec) {
    if (s < 0) return 0;
    s >>= prec;
    return (uint8_t)(s > 255 ? 255 : s);
}

int m3_image_resize(const m3_rgb *in, int w, int h, m3_rgb *out, m3_err *err) {
    memset(out, 0, sizeof *out);
    if (w < 1 || h < 1 || in->w < 1 || in->h < 1) return m3_errf(err, "resize: bad size %d x %d -> %d x %d", in->w, in->h, w, h);
    const int iw = in->w, ih = in->h;
    uint8_t *tmp = NULL, *dst = malloc((size_t)w * h * 3);
    aa_axis ax = {0}, ay = {0};
    int rc = 0;
    if (!dst) return m3_errf(err, "resize to %d x %d: out of memory", w, h);
    /* horizontal pass (only when the width changes) over every input row, rounded to uint8 */
    const uint8_t *src = in->px;
    if (w != iw) {
        tmp = malloc((size_t)w * ih * 3);
        if (!tmp || aa_weights(iw, w, &ax)) { rc = m3_errf(err, "resize: out of memory"); goto done; }
        const int32_t half = 1 << (ax.prec - 1);
        for (int y = 0; y < ih; y++) {
            const uint8_t *r = in->px + (size_t)y * iw * 3;
            uint8_t *o = tmp + (size_t)y * w * 3;
            for (int x = 0; x < w; x++) {
                const int16_t *k = ax.w + (size_t)x * ax.ksize;
                const uint8_t *p = r + (size_t)ax.xmin[x] * 3;
                int32_t s0 = half, s1 = half, s2 = half;
                for (int j = 0; j < ax.xsize[x]; j++) {
                    s0 += p[3 * j] * k[j];
                    s1 += p[3 * j + 1] * k[j];
                    s2 += p[3 * j + 2] * k[j];
                }
                o[3 * x] = aa_round(s0, ax.prec);
                o[3 * x + 1] = aa_round(s1, ax.prec);
                o[3 * x + 2] = aa_round(s2, ax.prec);
            }
        }
        src = tmp;
    }
    /* vertical pass (only when the height changes) */
    if (h != ih) {
        if (aa_weights(ih, h, &ay)) { rc = m3_errf(err, "resize: out of memory"); goto done; }
        const int32_t half = 1 << (ay.prec - 1);
        const size_t row = (size_t)w * 3;
        for (int y = 0; y < h; y++) {
            const int16_t *k = ay.w + (size_t)y * ay.ksize;
            const uint8_t *p = src + (size_t)ay.xmin[y] * row;
            uint8_t *o = dst + (size_t)y * row;
            for (size_t x = 0; x < row; x++) {
                int32_t s = half;
                for (int j = 0; j < ay.xsize[y]; j++) s += p[(size_t)j * row + x] * k[j];
                o[x] = aa_round(s, ay.prec);
            }
        }
    } else {
        memcpy(dst, src, (size_t)w * h * 3);
    }
    out->w = w;
    out->h = h;
    out->px = dst;
    dst = NULL;
done:
    aa_free(&ax);
    aa_free(&ay);
    free(tmp);
    free(dst);
    return rc;
}

/* ------------------------------------------------------------------ pixel values */

void m3_pixels_free(m3_pixels *px) {
    if (!px) return;
    free(px->data);
    free(px->grid);
    memset(px, 0, sizeof *px);
}

/* Grows px by one image of n patches; returns the first new row or NULL. */
static float *pixels_grow(m3_pixels *px, int n, int D, const int32_t thw[3], m3_err *err) {
    if (px->n_patches && px->patch_dim != D) {
        m3_errf(err, "pixel values: patch size %d differs from the earlier images' %d", D, px->patch_dim);
        return NULL;
    }
    if ((int64_t)px->n_patches + n > (1 << 26)) { m3_errf(err, "pixel values: too many patches"); return NULL; }
    float *nd = realloc(px->data, sizeof(float) * ((size_t)px->n_patches + n) * D);
    if (!nd) { m3_errf(err, "pixel values of %d patches: out of memory", px->n_patches + n); return NULL; }
    px->data = nd;
    int32_t *ng = realloc(px->grid, sizeof(int32_t) * 3 * ((size_t)px->n_images + 1));
    if (!ng) { m3_errf(err, "pixel values: out of memory"); return NULL; }
    px->grid = ng;
    memcpy(px->grid + 3 * (size_t)px->n_images, thw, 3 * sizeof(int32_t));
    float *row = px->data + (size_t)px->n_patches * D;
    px->patch_dim = D;
    px->n_images++;
    px->n_patches += n;
    return row;
}

int m3_image_preprocess(const m3_rgb *img, const m3_image_opts *o, m3_pixels *px, m3_err *err) {
    int rh, rw;
    if (o->patch < 1 || o->merge < 1 || o->temporal < 1) return m3_errf(err, "image options: bad patch/merge/temporal size");
    if (m3_image_smart_resize(img->h, img->w, o, &rh, &rw, err)) return -1;
    m3_rgb r;
    const m3_rgb *use = img;
    if (rw != img->w || rh != img->h) {
        if (m3_image_resize(img, rw, rh, &r, err)) return -1;
        use = &r;
    }
    const int P = o->patch, M = o->merge, T = o->temporal, gh = rh / P, gw = rw / P;
    const int D = 3 * T * P * P, n = gh * gw;
    int32_t thw[3] = {1, gh, gw};
    float *rows = pixels_grow(px, n, D, thw, err);
    if (rows) {
        /* fused rescale + normalize as torchvision computes it: (x - mean*255) / (std*255) in f32 */
        float m255[3], s255[3];
        for (int c = 0; c < 3; c++) { m255[c] = o->mean[c] * 255.0f; s255[c] = o->std[c] * 255.0f; }
        /* block-major: merge block (br, bc), then its M x M patches row-major; each patch is
         * (channel, temporal, y, x) with the frame repeated T times */
        int p = 0;
        for (int br = 0; br < gh / M; br++)
            for (int bc = 0; bc < gw / M; bc++)
                for (int ir = 0; ir < M; ir++)
                    for (int ic = 0; ic < M; ic++, p++) {
                        float *d = rows + (size_t)p * D;
                        int y0 = (br * M + ir) * P, x0 = (bc * M + ic) * P;
                        for (int c = 0; c < 3; c++) {
                            float *dc = d + (size_t)c * T * P * P;
                            for (int y = 0; y < P; y++) {
                                const uint8_t *s = use->px + ((size_t)(y0 + y) * rw + x0) * 3 + c;
                                for (int x = 0; x < P; x++) dc[y * P + x] = ((float)s[3 * x] - m255[c]) / s255[c];
                            }
                            for (int t = 1; t < T; t++) memcpy(dc + (size_t)t * P * P, dc, sizeof(float) * P * P);
                        }
                    }
    }
    if (use == &r) m3_rgb_free(&r);
    return rows ? 0 : -1;
}

int m3_image_preprocess_bytes(const void *data, size_t n, const m3_image_opts *o, m3_pixels *px, m3_err *err) {
    m3_rgb img;
    if (m3_image_decode(data, n, o->max_input_pixels, &img, err)) return -1;
    int rc = m3_image_preprocess(&img, o, px, err);
    m3_rgb_free(&img);
    return rc;
}

int m3_image_preprocess_url(const char *url, size_t len, const m3_image_opts *o, m3_pixels *px, m3_err *err) {
    uint8_t *bytes;
    size_t n;
    if (m3_data_url_decode(url, len, &bytes, &n, err)) return -1;
    int rc = m3_image_preprocess_bytes(bytes, n, o, px, err);
    free(bytes);
    return rc;
}

int m3_pixels_load(const char *path, m3_pixels *px, m3_err *err) {
    memset(px, 0, sizeof *px);
    m3_st *st = m3_st_open(path, err);
    if (!st) return -1;
    int rc = 0;
    const m3_tensor *pv = m3_st_find(st, "pixel_values"), *g = m3_st_find(st, "image_grid_thw");
    if (!pv || !g) { rc = m3_errf(err, "%s: missing tensor '%s'", path, pv ? "image_grid_thw" : "pixel_values"); goto done; }
    if (pv->ndim != 2 || pv->shape[0] < 1 || pv->shape[1] < 1 || pv->shape[0] > (1 << 26) || pv->shape[1] > (1 << 20)) {
        char s[128];
        m3_shape_str(pv->shape, pv->ndim, s, sizeof s);
        rc = m3_errf(err, "%s: tensor 'pixel_values': expected shape [patches, patch_dim], found %s", path, s);
        goto done;
    }
    if (g->ndim != 2 || g->shape[1] != 3 || g->shape[0] < 1 || g->shape[0] > 65536 || (g->dtype != M3_DT_I32 && g->dtype != M3_DT_I64)) {
        char s[128];
        m3_shape_str(g->shape, g->ndim, s, sizeof s);
        rc = m3_errf(err, "%s: tensor 'image_grid_thw': expected I32 or I64 [images, 3], found %s %s", path, m3_dtype_name(g->dtype), s);
        goto done;
    }
    int N = (int)pv->shape[0], D = (int)pv->shape[1], ni = (int)g->shape[0];
    int64_t total = 0;
    px->grid = malloc(sizeof(int32_t) * 3 * (size_t)ni);
    px->data = malloc(sizeof(float) * (size_t)N * D);
    if (!px->grid || !px->data) { rc = m3_errf(err, "%s: out of memory", path); goto done; }
    for (int i = 0; i < ni; i++) {
        for (int k = 0; k < 3; k++) {
            int64_t v;
            if (g->dtype == M3_DT_I32) { int32_t x; memcpy(&x, (const char *)g->data + 4 * (3 * (size_t)i + k), 4); v = x; }
            else memcpy(&v, (const char *)g->data + 8 * (3 * (size_t)i + k), 8);
            if (v < 1 || v > (1 << 16)) { rc = m3_errf(err, "%s: image_grid_thw[%d][%d] = %lld is out of range", path, i, k, (long long)v); goto done; }
            px->grid[3 * i + k] = (int32_t)v;
        }
        total += (int64_t)px->grid[3 * i] * px->grid[3 * i + 1] * px->grid[3 * i + 2];
    }
    if (total != N) { rc = m3_errf(err, "%s: image_grid_thw adds up to %lld patches, pixel_values has %d", path, (long long)total, N); goto done; }
    for (size_t i = 0; i < (size_t)N * D; i++) {
        const char *s = pv->data;
        switch (pv->dtype) {
        case M3_DT_F32: memcpy(&px->data[i], s + 4 * i, 4); break;
        case M3_DT_F64: { double d; memcpy(&d, s + 8 * i, 8); px->data[i] = (float)d; break; }
        case M3_DT_BF16: { uint16_t h; memcpy(&h, s + 2 * i, 2); px->data[i] = m3_bf16_to_f32(h); break; }
        case M3_DT_F16: { uint16_t h; memcpy(&h, s + 2 * i, 2); px->data[i] = m3_f16_to_f32(h); break; }
        default: rc = m3_errf(err, "%s: tensor 'pixel_values': dtype %s not supported (F32, F64, BF16, F16)", path, m3_dtype_name(pv->dtype)); goto done;
        }
    }
    px->n_patches = N;
    px->patch_dim = D;
    px->n_images = ni;
done:
    m3_st_close(st);
    if (rc) m3_pixels_free(px);
    return rc;
}
