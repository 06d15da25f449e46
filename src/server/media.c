/* Image inputs of chat requests (see media.h). */
#include "media.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../base/fault.h"
#include "openai.h"

#define md_malloc(n) m3_fault_malloc(M3_FAULT_SERVER, n)

static const char BAD[] = "invalid_request_error";
static const char INLINE_HINT[] = "send the image inline as a data URL (data:image/png;base64,...)";

void m3_media_free(m3_media *m) {
    m3_pixels_free(&m->px);
    free(m->rows);
    memset(m, 0, sizeof *m);
}

static int is_image_part(json_t *part) {
    const char *t = json_string_value(json_object_get(part, "type"));
    return t && !strcmp(t, "image_url");
}

/* the host of an http(s) URL (after "://": no user info, no port), lower case, into host */
static void url_host(const char *u, char *host, size_t cap) {
    const char *p = strstr(u, "://");
    p = p ? p + 3 : u;
    size_t end = strcspn(p, "/?#");
    const char *at = NULL;
    for (size_t i = 0; i < end; i++)
        if (p[i] == '@') at = p + i;
    if (at) { end -= (size_t)(at + 1 - p); p = at + 1; }
    size_t hl;
    if (*p == '[') { /* [IPv6]:port */
        const char *rb = memchr(p, ']', end);
        hl = rb ? (size_t)(rb - p) + 1 : end;
    } else {
        const char *colon = memchr(p, ':', end);
        hl = colon ? (size_t)(colon - p) : end;
    }
    if (hl >= cap) hl = cap - 1;
    for (size_t i = 0; i < hl; i++) host[i] = (char)(p[i] >= 'A' && p[i] <= 'Z' ? p[i] + 32 : p[i]);
    host[hl] = 0;
}

static int domain_allowed(const char *list, const char *host) {
    size_t hl = strlen(host);
    for (const char *p = list; p && *p;) {
        while (*p == ',' || *p == ' ') p++;
        size_t n = strcspn(p, ", ");
        if (n && n == hl && !strncasecmp(p, host, n)) return 1;
        p += n;
    }
    return 0;
}

/* One image part -> its bytes (*bytes, malloc'd) and the size its header declares; nothing is
 * decoded. param: "messages[i].content[j].image_url". */
static int image_bytes(const m3_media_ctx *c, json_t *part, const char *param, int index, uint8_t **bytes, size_t *nb,
                       uint64_t *w, uint64_t *h, m3_oai_error *e) {
    json_t *iu = json_object_get(part, "image_url");
    json_t *url = json_is_string(iu) ? iu : json_object_get(iu, "url");
    if (!json_is_string(url))
        return m3_oai_errorf(e, 400, BAD, param, "%s: expected {\"url\": \"data:image/...;base64,...\"} (an object with a 'url' string)",
                             param);
    json_t *detail = json_object_get(iu, "detail"); /* accepted, ignored: images are always used whole */
    if (detail && !json_is_null(detail) && !json_is_string(detail))
        return m3_oai_errorf(e, 400, BAD, param, "%s: 'detail' must be a string (\"auto\", \"low\" or \"high\")", param);
    const char *u = json_string_value(url);
    size_t len = json_string_length(url);
    if (len >= 5 && !strncasecmp(u, "data:", 5)) {
        m3_err err;
        if (!m3_data_url_decode(u, len, bytes, nb, &err) && !m3_image_dims(*bytes, *nb, w, h, &err)) return 0;
        free(*bytes);
        *bytes = NULL;
        if (err.oom) /* by the error's kind: its text may quote the URL (a media type) */
            return m3_oai_errorf(e, 500, "server_error", param, "%s: image %d: %s", param, index, err.msg);
        return m3_oai_errorf(e, 400, BAD, param, "%s: image %d cannot be used: %s", param, index, err.msg);
    }
    if ((len >= 7 && !strncasecmp(u, "http://", 7)) || (len >= 8 && !strncasecmp(u, "https://", 8))) {
        char host[256];
        url_host(u, host, sizeof host);
        if (!c->allowed_domains)
            return m3_oai_errorf(e, 400, BAD, param,
                                 "%s: remote image URLs are not accepted (this server downloads nothing and no "
                                 "--allowed-media-domains were given): %s",
                                 param, INLINE_HINT);
        if (!domain_allowed(c->allowed_domains, host))
            return m3_oai_errorf(e, 400, BAD, param, "%s: the image URL's host '%s' is not in --allowed-media-domains", param,
                                 host);
        return m3_oai_errorf(e, 400, BAD, param,
                             "%s: fetching remote images is not implemented by this server (host '%s' is allowed by "
                             "--allowed-media-domains, but nothing is downloaded): %s",
                             param, host, INLINE_HINT);
    }
    char scheme[24];
    size_t sl = strcspn(u, ":/");
    int has_scheme = sl < len && u[sl] == ':' && sl > 0 && sl < sizeof scheme;
    if (has_scheme) {
        memcpy(scheme, u, sl);
        scheme[sl] = 0;
    }
    return m3_oai_errorf(e, 400, BAD, param, "%s: %s%s%s are not accepted (a request never names a file of the server): %s",
                         param, has_scheme ? "'" : "file paths", has_scheme ? scheme : "", has_scheme ? ":' URLs" : "",
                         INLINE_HINT);
}

/* a copy of message m whose content array has every image part as {"type": "image"} */
static json_t *render_message(json_t *m) {
    json_t *content = json_object_get(m, "content");
    json_t *r = json_object(), *a = json_array();
    if (!r || !a) goto fail;
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) { /* key by key: json_copy drops keys it finds no memory for */
        if (!strcmp(k, "content")) continue;
        if (json_object_set(r, k, v)) goto fail;
    }
    for (size_t j = 0; j < json_array_size(content); j++) {
        json_t *p = json_array_get(content, j);
        if (is_image_part(p)) {
            if (json_array_append_new(a, json_pack("{s:s}", "type", "image"))) goto fail;
        } else if (json_array_append(a, p)) goto fail;
    }
    if (json_object_set_new(r, "content", a)) { a = NULL; goto fail; }
    return r;
fail:
    json_decref(a);
    json_decref(r);
    return NULL;
}

int m3_media_collect(const m3_media_ctx *c, json_t *msgs, json_t **render, m3_media *out, m3_oai_error *e) {
    *render = NULL;
    int n_img = 0;
    char param[64];
    /* pass 1: part types, the number of images */
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *content = json_object_get(json_array_get(msgs, i), "content");
        for (size_t j = 0; json_is_array(content) && j < json_array_size(content); j++) {
            json_t *p = json_array_get(content, j);
            const char *t = json_string_value(json_object_get(p, "type"));
            if (!t || !strcmp(t, "text") || !strcmp(t, "refusal")) continue;
            snprintf(param, sizeof param, "messages[%zu].content[%zu]", i, j);
            if (strcmp(t, "image_url"))
                return m3_oai_errorf(e, 400, BAD, param, "%s: content parts of type '%.40s' are not supported (text and image_url are)",
                                     param, t);
            if (!c || !c->vc)
                return m3_oai_errorf(e, 400, BAD, param, "%s: %s", param,
                                     c && c->no_vision ? c->no_vision : "this model has no vision tower: image inputs are not supported");
            if (++n_img > (c->has_max_images ? c->max_images : M3_MEDIA_MAX_IMAGES))
                return c->has_max_images ? m3_oai_errorf(e, 400, BAD, param, "%s: at most %d image%s may be provided in one "
                                                         "prompt (--limit-mm-per-prompt)", param, c->max_images,
                                                         c->max_images == 1 ? "" : "s")
                                         : m3_oai_errorf(e, 400, BAD, param, "%s: more than %d images in one request", param,
                                                         M3_MEDIA_MAX_IMAGES);
        }
    }
    if (!n_img) return 0;
    /* pass 2: every image's bytes and declared size, before any is decoded: an image over the
     * limit of one image is refused by the decoder (before decoding, with its own message), the
     * images together may decode M3_MEDIA_MAX_REQUEST_PIXELS */
    struct { uint8_t *bytes; size_t n; char param[64]; } im[M3_MEDIA_MAX_IMAGES];
    const uint64_t one = c->io.max_input_pixels ? c->io.max_input_pixels : M3_IMAGE_MAX_PIXELS_DEFAULT;
    uint64_t pixels = 0;
    int k = 0, rc = 0;
    for (size_t i = 0; !rc && i < json_array_size(msgs); i++) {
        json_t *content = json_object_get(json_array_get(msgs, i), "content");
        for (size_t j = 0; !rc && json_is_array(content) && j < json_array_size(content); j++) {
            json_t *p = json_array_get(content, j);
            if (!is_image_part(p)) continue;
            snprintf(im[k].param, sizeof im[k].param, "messages[%zu].content[%zu].image_url", i, j);
            uint64_t w = 0, h = 0;
            if ((rc = image_bytes(c, p, im[k].param, k, &im[k].bytes, &im[k].n, &w, &h, e))) break;
            k++;
            if (w * h <= one && w * h > M3_MEDIA_MAX_REQUEST_PIXELS - pixels)
                rc = m3_oai_errorf(e, 400, BAD, im[k - 1].param,
                                   "%s: image %d: its %llu x %llu pixels would bring the request's images to %llu pixels; "
                                   "the limit is %llu in all (nothing was decoded)", im[k - 1].param, k - 1,
                                   (unsigned long long)w, (unsigned long long)h, (unsigned long long)(pixels + w * h),
                                   (unsigned long long)M3_MEDIA_MAX_REQUEST_PIXELS);
            else if (w * h <= one) pixels += w * h;
        }
    }
    /* pass 3: decode + preprocess, in prompt order */
    for (int q = 0; !rc && q < k; q++) {
        m3_err err;
        if (m3_image_preprocess_bytes(im[q].bytes, im[q].n, &c->io, &out->px, &err))
            rc = err.oom ? m3_oai_errorf(e, 500, "server_error", im[q].param, "%s: image %d: %s", im[q].param, q, err.msg)
                         : m3_oai_errorf(e, 400, BAD, im[q].param, "%s: image %d cannot be used: %s", im[q].param, q, err.msg);
    }
    for (int q = 0; q < k; q++) free(im[q].bytes);
    if (rc) return rc;
    m3_err err;
    if (m3_vision_check_pixels(c->vc, &out->px, &err) < 0)
        return m3_oai_errorf(e, 400, BAD, "messages", "the images do not fit the vision tower: %s", err.msg);
    /* the template's view: image parts as {"type": "image"} */
    json_t *r = json_array();
    if (!r) return m3_oai_errorf(e, 500, "server_error", NULL, "out of memory");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i), *content = json_object_get(m, "content");
        int has = 0;
        for (size_t j = 0; json_is_array(content) && j < json_array_size(content) && !has; j++) has = is_image_part(json_array_get(content, j));
        if (has ? json_array_append_new(r, render_message(m)) : json_array_append(r, m)) {
            json_decref(r);
            return m3_oai_errorf(e, 500, "server_error", NULL, "out of memory");
        }
    }
    *render = r;
    return 0;
}

int m3_media_expand(const m3_media_ctx *c, m3_media *m, int32_t **ids, size_t *n, m3_oai_error *e) {
    const int ni = m->px.n_images;
    const int32_t img = c->vc->image_token, s = c->start_id, en = c->end_id;
    const int32_t *in = *ids;
    const size_t N = *n;
    size_t P = 0;
    for (size_t i = 0; i < N; i++) P += in[i] == img;
    if (P != (size_t)ni)
        return m3_oai_errorf(e, 400, BAD, "messages",
                             "the chat template wrote %zu image placeholder%s (token %d) for %d image%s%s", P, P == 1 ? "" : "s",
                             img, ni, ni == 1 ? "" : "s",
                             P > (size_t)ni ? " (does a message's text spell the image token?)"
                                            : " (does this checkpoint's chat template write image parts?)");
    /* sizes first */
    size_t total = 0, ntok = 0;
    int k = 0;
    for (size_t i = 0; i < N; i++) {
        if (in[i] != img) { total++; continue; }
        int cnt = m3_vision_image_tokens(c->vc, m->px.grid + 3 * k++);
        int bracketed = i > 0 && in[i - 1] == s && i + 1 < N && in[i + 1] == en;
        int wrap = s >= 0 && en >= 0 && !bracketed;
        total += (size_t)cnt + (wrap ? 2 : 0);
        ntok += (size_t)cnt;
    }
    if (total > ((size_t)1 << 28))
        return m3_oai_errorf(e, 400, BAD, "messages", "the prompt with its images expanded is too long (%zu tokens)", total);
    int32_t *o = md_malloc(sizeof(int32_t) * total), *r = md_malloc(sizeof(int32_t) * (ntok ? ntok : 1));
    if (!o || !r) {
        free(o);
        free(r);
        return m3_oai_errorf(e, 500, "server_error", NULL, "out of memory");
    }
    size_t w = 0, nr = 0;
    k = 0;
    for (size_t i = 0; i < N; i++) {
        if (in[i] != img) { o[w++] = in[i]; continue; }
        int cnt = m3_vision_image_tokens(c->vc, m->px.grid + 3 * k++);
        int bracketed = i > 0 && in[i - 1] == s && i + 1 < N && in[i + 1] == en;
        int wrap = s >= 0 && en >= 0 && !bracketed;
        if (wrap) o[w++] = s;
        for (int t = 0; t < cnt; t++) { r[nr++] = (int32_t)w; o[w++] = img; }
        if (wrap) o[w++] = en;
    }
    free(*ids);
    *ids = o;
    *n = total;
    free(m->rows);
    m->rows = r;
    m->n_rows = (int)ntok;
    return 0;
}

int m3_media_limit_parse(m3_media_ctx *c, const char *text, m3_err *err) {
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return j ? m3_errf(err, "a JSON object of counts by modality is expected ('{\"image\": 2}')")
                 : m3_errf(err, "not JSON: %s", je.text);
    }
    const char *k;
    json_t *v;
    int rc = 0;
    json_object_foreach(j, k, v) {
        if (strcmp(k, "image") && strcmp(k, "video") && strcmp(k, "audio")) {
            rc = m3_errf(err, "'%s': the modalities are image, video and audio", k);
            break;
        }
        json_t *n = json_is_object(v) ? json_object_get(v, "count") : v; /* {"count": N, "width": ...}: the count */
        if (!json_is_integer(n) || json_integer_value(n) < 0 || json_integer_value(n) > INT32_MAX) {
            rc = m3_errf(err, "'%s': a count (an integer, 0 or more) is expected", k);
            break;
        }
        if (!strcmp(k, "image")) {
            const long long want = json_integer_value(n);
            c->images_asked = (int)want;
            c->max_images = want < M3_MEDIA_MAX_IMAGES ? (int)want : M3_MEDIA_MAX_IMAGES;
            c->has_max_images = 1;
        } /* (video and audio inputs are refused whatever their limit) */
    }
    json_decref(j);
    return rc;
}
