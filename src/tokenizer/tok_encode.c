/* Encoding: added tokens -> normalizers -> pre-tokenizers -> BPE, as the Rust `tokenizers`
 * crate does it. All state lives in a per-call `enc`, so m3_tok stays read-only. */
#include <string.h>
#include <utf8proc.h>

#include "base/utf8.h"
#include "tokenizer/tok_internal.h"

typedef struct {
    uint32_t off, len;
} span;
typedef struct {
    span *v;
    size_t n, cap;
} spans;

typedef struct {
    uint64_t hash;
    uint32_t woff, wlen, ioff, in; /* word bytes in cache_words, ids in cache_ids */
} cache_slot;

#define CACHE_SLOTS 4096
#define CACHE_MAX_WORD 48

typedef struct {
    const m3_tok *t;
    m3_err *err;
    tok_buf store;         /* normalized text of the current piece, then prepended copies */
    spans cur, next;       /* pre-tokenizer double buffer */
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    int32_t *out;          /* result ids */
    size_t n_out, cap_out;
    /* BPE work arrays */
    int32_t *sym, *prev, *nxt;
    uint64_t *heap;
    size_t cap_sym, cap_heap;
    /* per-call word cache */
    cache_slot *cache;
    tok_buf cache_words;
    int32_t *cache_ids;
    size_t n_cache_ids, cap_cache_ids;
} enc;

static int oom(enc *e) { return m3_errf(e->err, "out of memory"); }

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int emit(enc *e, int32_t id) {
    if (e->n_out == e->cap_out && grow((void **)&e->out, &e->cap_out, e->n_out + 1, 4)) return oom(e);
    e->out[e->n_out++] = id;
    return 0;
}

static int span_push(enc *e, spans *s, uint32_t off, uint32_t len) {
    if (len == 0) return 0;
    if (s->n == s->cap && grow((void **)&s->v, &s->cap, s->n + 1, sizeof(span))) return oom(e);
    s->v[s->n++] = (span){off, len};
    return 0;
}

/* ---------- character classes (Rust char semantics) */

static int is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static int is_word(uint32_t c) { /* regex \w */
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_PC || c == 0x200C || c == 0x200D;
}

/* code point ending at s[end) (valid UTF-8 assumed) */
static uint32_t cp_before(const char *s, size_t end, size_t *start) {
    size_t i = end - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80) i--;
    if (start) *start = i;
    return tok_utf8_cp((const uint8_t *)s + i, (int)(end - i));
}
static uint32_t cp_at(const char *s, size_t n, size_t i, int *len) {
    int l = tok_utf8_step((const uint8_t *)s + i, n - i);
    if (l <= 0) l = 1;
    *len = l;
    return tok_utf8_cp((const uint8_t *)s + i, l);
}

/* ---------- normalizers (0; -1 out of memory; -2 text they refuse) */

static int nf(const char *s, size_t n, int opts, tok_buf *out) {
    size_t i = 0;
    while (i < n && (uint8_t)s[i] < 0x80) i++;
    if (i == n) return tok_buf_put(out, s, n); /* ASCII is in every normal form */
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opts);
    if (r < 0) return r == UTF8PROC_ERROR_NOMEM ? -1 : -2;
    int rc = tok_buf_put(out, dst, (size_t)r);
    free(dst);
    return rc;
}

static int norm_one(const tok_norm *nm, const char *s, size_t n, tok_buf *out) {
    switch (nm->kind) {
    case NORM_NFC: return nf(s, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE, out);
    case NORM_NFD: return nf(s, n, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, out);
    case NORM_NFKC: return nf(s, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
    case NORM_NFKD: return nf(s, n, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
    case NORM_LOWER:
        for (size_t i = 0; i < n;) {
            int l;
            uint32_t c = cp_at(s, n, i, &l);
            char u[4];
            int k = m3_utf8_put((uint32_t)utf8proc_tolower((utf8proc_int32_t)c), u);
            if (tok_buf_put(out, u, (size_t)k)) return -1;
            i += (size_t)l;
        }
        return 0;
    case NORM_PREPEND:
        if (n && tok_buf_put(out, nm->a, strlen(nm->a))) return -1;
        return tok_buf_put(out, s, n);
    case NORM_REPLACE: {
        size_t fl = strlen(nm->a), tl = strlen(nm->b);
        for (size_t i = 0; i < n;) {
            if (i + fl <= n && !memcmp(s + i, nm->a, fl)) {
                if (tok_buf_put(out, nm->b, tl)) return -1;
                i += fl;
            } else if (tok_buf_put(out, s + i++, 1)) return -1;
        }
        return 0;
    }
    }
    return -2;
}

int tok_normalize(const m3_tok *t, const char *s, size_t n, tok_buf *out, m3_err *err) {
    out->n = 0;
    if (t->n_norms == 0) return tok_buf_put(out, s, n) ? m3_errf(err, "out of memory") : 0;
    tok_buf a = {0};
    if (tok_buf_put(&a, s, n)) return m3_errf(err, "out of memory");
    for (int i = 0; i < t->n_norms; i++) {
        out->n = 0;
        int rc = norm_one(&t->norms[i], a.p, a.n, out);
        if (!rc && i + 1 < t->n_norms && (a.n = 0, tok_buf_put(&a, out->p, out->n))) rc = -1;
        if (rc) { /* memory (the server's) told from text the normalizer refuses (the input's) */
            free(a.p);
            return rc == -2 ? m3_errf(err, "normalizer failed (invalid UTF-8 or too long)") : m3_errf(err, "normalizer: out of memory");
        }
    }
    free(a.p);
    return 0;
}

/* ---------- BPE */

static int64_t merge_of(const m3_tok *t, int32_t a, int32_t b) { /* rank << 32 | id, or -1 */
    const tok_pairmap *m = &t->merges;
    if (!m->keys) return -1;
    uint64_t key = ((uint64_t)a << 32 | (uint32_t)b) + 1;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    for (; m->keys[i]; i = (i + 1) & m->mask)
        if (m->keys[i] == key) return (int64_t)m->vals[i];
    return -1;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = v;
}
static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

static int reserve_syms(enc *e, size_t n) {
    if (n <= e->cap_sym) return 0;
    size_t c = e->cap_sym ? e->cap_sym : 64;
    while (c < n) c *= 2;
    int32_t *a;
    if (!(a = realloc(e->sym, c * 4))) return -1;
    e->sym = a;
    if (!(a = realloc(e->prev, c * 4))) return -1;
    e->prev = a;
    if (!(a = realloc(e->nxt, c * 4))) return -1;
    e->nxt = a;
    e->cap_sym = c;
    return 0;
}

/* Initial symbols of a word: bytes (byte-level) or characters with byte_fallback / unk. */
static int initial_symbols(enc *e, const char *w, size_t n, size_t *nsym) {
    const m3_tok *t = e->t;
    if (reserve_syms(e, n + 1)) return oom(e);
    size_t k = 0;
    int last_unk = 0;
    for (size_t i = 0; i < n;) {
        int l = 1;
        int32_t id;
        if (t->byte_level) id = t->byte_id[(uint8_t)w[i]];
        else {
            l = tok_utf8_step((const uint8_t *)w + i, n - i);
            if (l <= 0) l = 1;
            id = tok_vocab_get(t, w + i, (size_t)l);
            if (id < 0 && t->byte_fallback) {
                int ok = 1;
                for (int j = 0; j < l; j++) ok &= t->byte_id[(uint8_t)w[i + j]] >= 0;
                if (ok) {
                    for (int j = 0; j < l; j++) e->sym[k++] = t->byte_id[(uint8_t)w[i + j]];
                    i += (size_t)l;
                    last_unk = 0;
                    continue;
                }
            }
        }
        i += (size_t)l;
        if (id < 0) {
            if (t->unk_id < 0) continue; /* no unk token: the character is dropped, as HF does */
            if (t->fuse_unk && last_unk) continue;
            id = t->unk_id;
            last_unk = 1;
        } else last_unk = 0;
        e->sym[k++] = id;
    }
    *nsym = k;
    return 0;
}

static int bpe_word(enc *e, const char *w, size_t n) {
    const m3_tok *t = e->t;
    size_t ns = 0;
    if (initial_symbols(e, w, n, &ns)) return -1;
    if (ns == 0) return 0;
    /* each merge removes a symbol and pushes at most two candidates */
    if (grow((void **)&e->heap, &e->cap_heap, 3 * ns + 8, 8)) return oom(e);
    int32_t *sym = e->sym, *prev = e->prev, *nxt = e->nxt;
    uint64_t *heap = e->heap;
    size_t nh = 0;
    for (size_t i = 0; i < ns; i++) {
        prev[i] = (int32_t)i - 1;
        nxt[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
        int64_t m = i + 1 < ns ? merge_of(t, sym[i], sym[i + 1]) : -1;
        if (m >= 0) heap_push(heap, &nh, ((uint64_t)m >> 32) << 32 | i);
    }
    while (nh) {
        uint64_t top = heap_pop(heap, &nh);
        uint32_t rank = (uint32_t)(top >> 32), p = (uint32_t)top;
        int32_t r = nxt[p];
        if (sym[p] < 0 || r < 0) continue;
        int64_t m = merge_of(t, sym[p], sym[r]);
        if (m < 0 || (uint32_t)((uint64_t)m >> 32) != rank) continue; /* stale */
        sym[p] = (int32_t)(uint32_t)m;
        sym[r] = -1;
        nxt[p] = nxt[r];
        if (nxt[r] >= 0) prev[nxt[r]] = (int32_t)p;
        if (prev[p] >= 0 && (m = merge_of(t, sym[prev[p]], sym[p])) >= 0)
            heap_push(heap, &nh, ((uint64_t)m >> 32) << 32 | (uint32_t)prev[p]);
        if (nxt[p] >= 0 && (m = merge_of(t, sym[p], sym[nxt[p]])) >= 0)
            heap_push(heap, &nh, ((uint64_t)m >> 32) << 32 | p);
    }
    for (int32_t i = 0; i >= 0; i = nxt[i])
        if (emit(e, sym[i])) return -1;
    return 0;
}

/* One pre-tokenized word -> ids, through the fast paths and the per-call cache. */
static int encode_word(enc *e, const char *w, size_t n) {
    const m3_tok *t = e->t;
    if (n == 1 && t->byte_level && t->byte_id[(uint8_t)w[0]] >= 0) return emit(e, t->byte_id[(uint8_t)w[0]]);
    if (t->ignore_merges) {
        int32_t id = tok_vocab_get(t, w, n);
        if (id >= 0) return emit(e, id);
    }
    if (n > CACHE_MAX_WORD) return bpe_word(e, w, n);
    uint64_t h = tok_hash(w, n);
    cache_slot *c = &e->cache[h & (CACHE_SLOTS - 1)];
    if (c->hash == h && c->wlen == n && !memcmp(e->cache_words.p + c->woff, w, n)) {
        for (uint32_t i = 0; i < c->in; i++)
            if (emit(e, e->cache_ids[c->ioff + i])) return -1;
        return 0;
    }
    size_t before = e->n_out;
    if (bpe_word(e, w, n)) return -1;
    size_t k = e->n_out - before;
    if (e->cache_words.n > (1u << 24)) return 0; /* cache full: stop adding */
    if (grow((void **)&e->cache_ids, &e->cap_cache_ids, e->n_cache_ids + k, 4)) return oom(e);
    *c = (cache_slot){.hash = h, .woff = (uint32_t)e->cache_words.n, .wlen = (uint32_t)n,
                      .ioff = (uint32_t)e->n_cache_ids, .in = (uint32_t)k};
    if (tok_buf_put(&e->cache_words, w, n)) return oom(e);
    if (k) memcpy(e->cache_ids + e->n_cache_ids, e->out + before, k * 4);
    e->n_cache_ids += k;
    return 0;
}

/* ---------- pre-tokenizers */

typedef struct {
    uint32_t s, e;
    int match;
} piece;

/* Matches of re in sub (n bytes) as a list covering [0, n) (HF Pattern::find_matches). */
static int regex_pieces(enc *e, pcre2_code *re, const char *sub, size_t n, piece **pv, size_t *np, size_t *cap) {
    size_t pos = 0, prev = 0;
    *np = 0;
    while (pos <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)sub, n, pos, PCRE2_NO_UTF_CHECK, e->md, e->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc == PCRE2_ERROR_NOMEMORY) return oom(e);
        if (rc < 0 && rc != 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return m3_errf(e->err, "pre-tokenizer regex failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (grow((void **)pv, cap, *np + 2, sizeof(piece))) return oom(e);
        if (ms > prev) (*pv)[(*np)++] = (piece){(uint32_t)prev, (uint32_t)ms, 0};
        (*pv)[(*np)++] = (piece){(uint32_t)ms, (uint32_t)me, 1};
        prev = me;
        if (me > ms) pos = me;
        else {
            if (me >= n) break;
            int l;
            cp_at(sub, n, me, &l);
            pos = me + (size_t)l;
        }
    }
    if (grow((void **)pv, cap, *np + 1, sizeof(piece))) return oom(e);
    if (prev < n) (*pv)[(*np)++] = (piece){(uint32_t)prev, (uint32_t)n, 0};
    return 0;
}

static int digit_pieces(enc *e, const char *sub, size_t n, piece **pv, size_t *np, size_t *cap) {
    size_t last = 0;
    *np = 0;
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t c = cp_at(sub, n, i, &l);
        if (grow((void **)pv, cap, *np + 2, sizeof(piece))) return oom(e);
        if (is_numeric(c)) {
            if (last < i) (*pv)[(*np)++] = (piece){(uint32_t)last, (uint32_t)i, 0};
            (*pv)[(*np)++] = (piece){(uint32_t)i, (uint32_t)(i + (size_t)l), 1};
            last = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (grow((void **)pv, cap, *np + 1, sizeof(piece))) return oom(e);
    if (last < n) (*pv)[(*np)++] = (piece){(uint32_t)last, (uint32_t)n, 0};
    return 0;
}

/* Applies a split behaviour (HF SplitDelimiterBehavior) to pieces of span base, pushing
 * the resulting spans onto out. */
static int apply_behavior(enc *e, int behavior, int invert, piece *pv, size_t np, uint32_t base, spans *out) {
    for (size_t i = 0; i < np; i++) pv[i].match ^= invert;
    size_t k = 0; /* compacted result in pv[0..k) with match = 0 */
    int prev_match = 0;
    for (size_t i = 0; i < np; i++) {
        piece p = pv[i];
        switch (behavior) {
        case SB_REMOVED:
            if (!p.match) pv[k++] = p;
            break;
        case SB_ISOLATED: pv[k++] = p; break;
        case SB_MERGED_PREV:
            if (p.match && !prev_match && k) pv[k - 1].e = p.e;
            else pv[k++] = p;
            break;
        case SB_CONTIGUOUS:
            if (p.match == prev_match && k) pv[k - 1].e = p.e;
            else pv[k++] = p;
            break;
        case SB_MERGED_NEXT: break;
        }
        prev_match = p.match;
    }
    if (behavior == SB_MERGED_NEXT) { /* right to left: a match joins the piece after it */
        prev_match = 0;
        size_t j = np;
        for (size_t i = np; i-- > 0;) {
            piece p = pv[i];
            if (p.match && !prev_match && j < np) pv[j].s = p.s;
            else pv[--j] = p;
            prev_match = p.match;
        }
        for (size_t i = j; i < np; i++) pv[k++] = pv[i];
    }
    for (size_t i = 0; i < k; i++)
        if (span_push(e, out, base + pv[i].s, pv[i].e - pv[i].s)) return -1;
    return 0;
}

static int run_pretok(enc *e, const tok_pretok *pt, piece **pv, size_t *cap) {
    e->next.n = 0;
    for (size_t i = 0; i < e->cur.n; i++) {
        span s = e->cur.v[i];
        if (pt->kind == PT_BYTELEVEL && pt->add_prefix_space && e->store.p[s.off] != ' ') {
            uint32_t off = (uint32_t)e->store.n;
            if (tok_buf_reserve(&e->store, s.len + 1)) return oom(e); /* the copy reads from store */
            tok_buf_put(&e->store, " ", 1);
            tok_buf_put(&e->store, e->store.p + s.off, s.len);
            s = (span){off, s.len + 1};
        }
        if (pt->kind == PT_BYTELEVEL && !pt->re) {
            if (span_push(e, &e->next, s.off, s.len)) return -1;
            continue;
        }
        size_t np;
        const char *sub = e->store.p + s.off;
        int rc = pt->kind == PT_DIGITS ? digit_pieces(e, sub, s.len, pv, &np, cap)
                                       : regex_pieces(e, pt->re, sub, s.len, pv, &np, cap);
        int behavior = pt->kind == PT_DIGITS ? (pt->individual ? SB_ISOLATED : SB_CONTIGUOUS) : pt->behavior;
        if (rc || apply_behavior(e, behavior, pt->invert, *pv, np, s.off, &e->next)) return -1;
    }
    spans tmp = e->cur;
    e->cur = e->next;
    e->next = tmp;
    return 0;
}

/* normalized text in e->store[off, off+len) -> pre-tokenize -> BPE */
static int encode_plain(enc *e, uint32_t off, uint32_t len) {
    e->cur.n = 0;
    if (span_push(e, &e->cur, off, len)) return -1;
    piece *pv = NULL;
    size_t cap = 0;
    int rc = 0;
    for (int i = 0; i < e->t->n_pretoks && rc == 0; i++) rc = run_pretok(e, &e->t->pretoks[i], &pv, &cap);
    free(pv);
    for (size_t i = 0; i < e->cur.n && rc == 0; i++) rc = encode_word(e, e->store.p + e->cur.v[i].off, e->cur.v[i].len);
    return rc;
}

/* ---------- added tokens (HF AddedVocabulary::find_matches) */

typedef struct {
    size_t s, e;
    int32_t id; /* -1: plain text */
} seg;

static int longest_at(const tok_trie *tr, const char *s, size_t n, size_t i, size_t *end) {
    int cur = 0, best = -1;
    for (size_t j = i; j < n; j++) {
        int c = tr->nodes[cur].child;
        while (c >= 0 && tr->nodes[c].byte != (uint8_t)s[j]) c = tr->nodes[c].sibling;
        if (c < 0) break;
        cur = c;
        if (tr->nodes[cur].added >= 0) { best = tr->nodes[cur].added; *end = j + 1; }
    }
    return best;
}

static int seg_push(seg **v, size_t *n, size_t *cap, seg x) {
    if (grow((void **)v, cap, *n + 1, sizeof(seg))) return -1;
    (*v)[(*n)++] = x;
    return 0;
}

static int find_added(enc *e, const tok_trie *tr, const char *s, size_t n, int allow_special, seg **v, size_t *nv) {
    size_t cap = 0, start_off = 0;
    *v = NULL;
    *nv = 0;
    for (size_t i = 0; tr->n && i < n;) {
        size_t stop = 0;
        int a = tr->first[(uint8_t)s[i]] ? longest_at(tr, s, n, i, &stop) : -1;
        if (a < 0) { i++; continue; }
        const tok_added *ad = &e->t->added[a];
        size_t start = i;
        i = stop;
        if (ad->special && !allow_special) continue;
        if (ad->single_word) {
            int l;
            if ((start > 0 && is_word(cp_before(s, start, NULL))) || (stop < n && is_word(cp_at(s, n, stop, &l)))) continue;
        }
        if (ad->lstrip) {
            size_t k = start, b;
            while (k > 0 && is_ws(cp_before(s, k, &b))) k = b;
            start = k > start_off ? k : start_off;
        }
        if (ad->rstrip) {
            int l;
            while (stop < n && is_ws(cp_at(s, n, stop, &l))) stop += (size_t)l;
            i = stop;
        }
        if (start < start_off) start = start_off; /* an rstrip ate into this match */
        if (start_off < start && seg_push(v, nv, &cap, (seg){start_off, start, -1})) goto fail;
        if (seg_push(v, nv, &cap, (seg){start, stop, ad->id})) goto fail;
        start_off = stop;
    }
    if (start_off < n && seg_push(v, nv, &cap, (seg){start_off, n, -1})) goto fail;
    return 0;
fail: /* (the pieces so far are freed here: a caller gets none) */
    free(*v);
    *v = NULL;
    *nv = 0;
    return oom(e);
}

/* a raw-text piece: normalize, find normalized added tokens, encode the rest */
static int encode_raw_piece(enc *e, const char *s, size_t n, int allow_special) {
    if (tok_normalize(e->t, s, n, &e->store, e->err)) return -1;
    size_t nn = e->store.n;
    seg *v;
    size_t nv;
    if (find_added(e, &e->t->trie_norm, e->store.p, nn, allow_special, &v, &nv)) return -1;
    int rc = 0;
    for (size_t i = 0; i < nv && rc == 0; i++) {
        if (v[i].id >= 0) rc = emit(e, v[i].id);
        else rc = encode_plain(e, (uint32_t)v[i].s, (uint32_t)(v[i].e - v[i].s));
        e->store.n = nn; /* drop prepended copies; the normalized text stays */
    }
    free(v);
    return rc;
}

static void enc_free(enc *e) {
    free(e->store.p);
    free(e->cur.v);
    free(e->next.v);
    if (e->md) pcre2_match_data_free(e->md);
    if (e->mc) pcre2_match_context_free(e->mc);
    if (e->js) pcre2_jit_stack_free(e->js);
    free(e->sym);
    free(e->prev);
    free(e->nxt);
    free(e->heap);
    free(e->cache);
    free(e->cache_words.p);
    free(e->cache_ids);
}

static int check_utf8(const char *s, size_t n, m3_err *err) {
    for (size_t i = 0; i < n;) {
        if ((uint8_t)s[i] < 0x80) { i++; continue; }
        int l = tok_utf8_step((const uint8_t *)s + i, n - i);
        if (l <= 0) return m3_errf(err, "text is not valid UTF-8 (byte offset %zu)", i);
        i += (size_t)l;
    }
    return 0;
}

int m3_tok_encode(const m3_tok *t, const char *text, size_t len, int allow_special, int32_t **ids, size_t *n,
                  m3_err *err) {
    *ids = NULL;
    *n = 0;
    if (len >= UINT32_MAX / 2) return m3_errf(err, "text too long (%zu bytes; the limit is 2 GiB)", len);
    if (check_utf8(text, len, err)) return -1;
    enc e = {.t = t, .err = err};
    e.md = pcre2_match_data_create(4, NULL);
    e.mc = pcre2_match_context_create(NULL);
    e.js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    e.cache = calloc(CACHE_SLOTS, sizeof(cache_slot));
    if (!e.md || !e.mc || !e.js || !e.cache) { enc_free(&e); return m3_errf(err, "out of memory"); }
    pcre2_jit_stack_assign(e.mc, NULL, e.js);
    for (size_t i = 0; i < CACHE_SLOTS; i++) e.cache[i].wlen = UINT32_MAX;
    seg *v;
    size_t nv;
    int rc = find_added(&e, &t->trie_raw, text, len, allow_special, &v, &nv);
    for (size_t i = 0; i < nv && rc == 0; i++) {
        if (v[i].id >= 0) rc = emit(&e, v[i].id);
        else rc = encode_raw_piece(&e, text + v[i].s, v[i].e - v[i].s, allow_special);
    }
    free(v);
    if (rc == 0) { *ids = e.out; *n = e.n_out; e.out = NULL; }
    free(e.out);
    enc_free(&e);
    return rc;
}
