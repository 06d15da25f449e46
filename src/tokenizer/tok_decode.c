/* Decoding: per-id pieces (computed at load by the per-token decoders) are concatenated,
 * Strip / Metaspace trim the start and end, and invalid UTF-8 becomes U+FFFD the way Rust's
 * String::from_utf8_lossy does it. The stream decoder holds back incomplete characters. */
#include <string.h>

#include "tokenizer/tok_internal.h"

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Appends the valid prefix of s to out with invalid subparts replaced; returns how many
 * trailing bytes were held back (an incomplete character, only when hold is set). */
static int lossy(const char *s, size_t n, int hold, tok_buf *out, size_t *held) {
    size_t i = 0, run = 0;
    *held = 0;
    while (i < n) {
        int l = tok_utf8_step((const uint8_t *)s + i, n - i);
        if (l > 0) { i += (size_t)l; run += (size_t)l; continue; }
        if (tok_buf_put(out, s + i - run, run)) return -1;
        run = 0;
        if (l == 0 && hold) { *held = n - i; return 0; }
        if (tok_buf_put(out, REPL, 3)) return -1;
        i += l == 0 ? n - i : (size_t)-l;
    }
    return tok_buf_put(out, s + i - run, run);
}

static int check_id(const m3_tok *t, int32_t id, m3_err *err) {
    if (id < 0) return m3_errf(err, "token id %d is negative", id);
    return 0;
}

/* An id no token spells (past the tokenizer's vocabulary, as in checkpoints whose vocab_size
 * is padded, or a hole in it) decodes to nothing, as the Rust tokenizers library does. */
static int skip(const m3_tok *t, int32_t id, int skip_special) {
    return id >= t->n_ids || !t->spelling[id] || (skip_special && t->is_special[id]);
}

/* strips up to k leading copies of t->strip_char */
static size_t strip_lead(const m3_tok *t, const char *s, size_t n, int k) {
    size_t i = 0, cl = (size_t)t->strip_char_len;
    while (k-- > 0 && i + cl <= n && !memcmp(s + i, t->strip_char, cl)) i += cl;
    return i;
}

char *m3_tok_decode(const m3_tok *t, const int32_t *ids, size_t n, int skip_special, size_t *len, m3_err *err) {
    tok_buf raw = {0}, out = {0};
    for (size_t i = 0; i < n; i++) {
        if (check_id(t, ids[i], err)) { free(raw.p); return NULL; }
        if (skip(t, ids[i], skip_special)) continue;
        if (tok_buf_put(&raw, t->dstrs.p + t->doff[ids[i]], t->dlen[ids[i]])) goto oom;
    }
    size_t a = strip_lead(t, raw.p, raw.n, t->strip_start), b = raw.n, cl = (size_t)t->strip_char_len;
    for (int k = t->strip_end; k > 0 && b >= a + cl && !memcmp(raw.p + b - cl, t->strip_char, cl); k--) b -= cl;
    size_t held;
    if (lossy(raw.p ? raw.p + a : "", b - a, 0, &out, &held) || tok_buf_put(&out, "", 0)) goto oom;
    free(raw.p);
    if (len) *len = out.n;
    return out.p;
oom:
    free(raw.p);
    free(out.p);
    m3_errf(err, "out of memory");
    return NULL;
}

struct m3_tok_stream {
    const m3_tok *t;
    int skip_special;
    int started;     /* some text was seen (Strip / Metaspace act on the start only) */
    char held[8];    /* an incomplete character */
    size_t n_held;
    tok_buf in, out;
};

m3_tok_stream *m3_tok_stream_new(const m3_tok *t, int skip_special, m3_err *err) {
    m3_tok_stream *s = calloc(1, sizeof *s);
    if (!s) { m3_errf(err, "out of memory"); return NULL; }
    s->t = t;
    s->skip_special = skip_special;
    return s;
}

int m3_tok_stream_push(m3_tok_stream *s, int32_t id, const char **text, size_t *len, m3_err *err) {
    const m3_tok *t = s->t;
    *text = "";
    *len = 0;
    if (check_id(t, id, err)) return -1;
    if (skip(t, id, s->skip_special)) return 0;
    const char *p = t->dstrs.p + t->doff[id];
    size_t n = t->dlen[id];
    if (!s->started && n) { /* leading strip, once (a piece of only strip chars keeps stripping) */
        size_t k = strip_lead(t, p, n, t->strip_start);
        p += k;
        n -= k;
        s->started = n > 0 || t->strip_start == 0;
    }
    s->in.n = s->out.n = 0;
    if (tok_buf_put(&s->in, s->held, s->n_held) || tok_buf_put(&s->in, p, n)) return m3_errf(err, "out of memory");
    size_t held;
    if (lossy(s->in.p, s->in.n, 1, &s->out, &held)) return m3_errf(err, "out of memory");
    memcpy(s->held, s->in.p + s->in.n - held, held);
    s->n_held = held;
    *text = s->out.p ? s->out.p : "";
    *len = s->out.n;
    return 0;
}

void m3_tok_stream_finish(m3_tok_stream *s, const char **text, size_t *len) {
    s->out.n = 0;
    size_t held;
    if (s->n_held == 0 || lossy(s->held, s->n_held, 0, &s->out, &held)) s->out.n = 0;
    s->n_held = 0;
    s->started = 0;
    *text = s->out.p ? s->out.p : "";
    *len = s->out.n;
}

void m3_tok_stream_free(m3_tok_stream *s) {
    if (!s) return;
    free(s->in.p);
    free(s->out.p);
    free(s);
}

const char *m3_tok_id_bytes(const m3_tok *t, int32_t id, size_t *len) {
    *len = 0;
    if (id < 0 || skip(t, id, 0)) return NULL;
    *len = t->dlen[id];
    return t->dstrs.p + t->doff[id];
}
