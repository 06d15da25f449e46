/* Vocabulary trie, per-state token mask cache, and the matcher.
 *
 * A matcher's position is a set of stacks. A stack is a chain of frames (g_node: state q over
 * the frame below), hash-consed in an arena so equal stacks are one node; its top state always
 * has byte edges (the set is "expanded": calls pushed, finished rules popped).
 *
 * The cache (m3_grammar_compile) walks the vocabulary trie once per state q, starting from the
 * stack [q] over an unknown bottom (G_BASE; G_BOTTOM for the document's own rule, which nothing
 * calls). Calls inside a token push frames above it, so they are known. Each token is then:
 *   accepted   some path consumes all its bytes without needing what lies below q's frame
 *              (a path that ends exactly where q's rule ends counts: popping frees a frame, and
 *              every state left is productive);
 *   push(h)    accepted only by paths that stack h more frames: valid when depth + h <= max_depth;
 *   uncertain  some path pops below q's frame with bytes left: checked at run time by walking
 *              the token from the real stack;
 *   rejected   everything else (implicit).
 * A prefix no path survives (and none popped) prunes its whole trie subtree. The fill_mask cost is
 * then one copy (or OR) of the accepted bitmask per stack plus the short lists. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

/* ---- arena of frames ---- */

static uint32_t node_hash(int32_t q, int32_t below) {
    uint64_t x = ((uint64_t)(uint32_t)q << 32) ^ (uint32_t)below;
    x *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32);
}

int ar_init(g_arena *a, const m3_grammar *g) {
    memset(a, 0, sizeof *a);
    a->g = g;
    a->capn = 256;
    a->nd = malloc((size_t)a->capn * sizeof *a->nd);
    a->vis = calloc((size_t)a->capn, sizeof *a->vis);
    a->vis_h = malloc((size_t)a->capn * sizeof *a->vis_h);
    a->tabmask = 1023;
    a->tab = malloc(1024 * sizeof *a->tab);
    if (!a->nd || !a->vis || !a->vis_h || !a->tab) {
        ar_free(a);
        return -1;
    }
    memset(a->tab, 0xff, 1024 * sizeof *a->tab);
    return 0;
}

void ar_free(g_arena *a) {
    free(a->nd);
    free(a->vis);
    free(a->vis_h);
    free(a->tab);
    memset(a, 0, sizeof *a);
}

static int ar_grow(g_arena *a) {
    int32_t cap = a->capn * 2;
    g_node *nd = realloc(a->nd, (size_t)cap * sizeof *nd);
    if (!nd) return -1;
    a->nd = nd;
    uint32_t *vis = realloc(a->vis, (size_t)cap * sizeof *vis);
    if (!vis) return -1;
    memset(vis + a->capn, 0, (size_t)(cap - a->capn) * sizeof *vis);
    a->vis = vis;
    int32_t *vh = realloc(a->vis_h, (size_t)cap * sizeof *vh);
    if (!vh) return -1;
    a->vis_h = vh;
    a->capn = cap;
    uint32_t tsz = (uint32_t)cap * 4;
    int32_t *tab = malloc(tsz * sizeof *tab);
    if (!tab) return -1;
    memset(tab, 0xff, tsz * sizeof *tab);
    for (int32_t i = 0; i < a->nn; i++) { /* in id order, so truncation stays last-in first-out */
        uint32_t h = node_hash(a->nd[i].q, a->nd[i].below) & (tsz - 1);
        while (tab[h] >= 0) h = (h + 1) & (tsz - 1);
        tab[h] = i;
        a->nd[i].slot = (int32_t)h;
    }
    free(a->tab);
    a->tab = tab;
    a->tabmask = tsz - 1;
    return 0;
}

int32_t ar_cons(g_arena *a, int32_t q, int32_t below) {
    uint32_t h = node_hash(q, below) & a->tabmask;
    for (int32_t id; (id = a->tab[h]) >= 0; h = (h + 1) & a->tabmask)
        if (a->nd[id].q == q && a->nd[id].below == below) return id;
    if (a->nn == a->capn) {
        if (ar_grow(a)) {
            a->oom = 1;
            return -1;
        }
        h = node_hash(q, below) & a->tabmask;
        while (a->tab[h] >= 0) h = (h + 1) & a->tabmask;
    }
    int32_t id = a->nn++;
    a->nd[id] = (g_node){q, below, below < 0 ? 1 : a->nd[below].depth + 1, (int32_t)h};
    a->tab[h] = id;
    return id;
}

void ar_truncate(g_arena *a, int32_t n) {
    while (a->nn > n) {
        a->nn--;
        a->tab[a->nd[a->nn].slot] = -1;
    }
}

/* storage for 64 configurations: the vector's v is never NULL, even while empty (a grammar whose
 * output may be empty has states without one; NULL + 0 is undefined) */
static int cv_reserve(g_cfgvec *v) {
    if (v->v) return 0;
    v->v = malloc(64 * sizeof *v->v);
    v->cap = v->v ? 64 : 0;
    return v->v ? 0 : -1;
}

int cv_push(g_cfgvec *v, int32_t node, int32_t h) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 64;
        g_cfg *nv = realloc(v->v, (size_t)cap * sizeof *nv);
        if (!nv) return -1;
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = (g_cfg){node, h};
    return 0;
}

int ar_expand(g_arena *a, const g_cfg *raw, int nraw, g_cfgvec *out, int *flags) {
    const m3_grammar *g = a->g;
    if (++a->stamp == 0) {
        memset(a->vis, 0, (size_t)a->capn * sizeof *a->vis);
        a->stamp = 1;
    }
    int out0 = out->n;
    /* the work stack lives past the end of out (taken back at the end) */
    g_cfgvec st = {0};
    for (int i = 0; i < nraw; i++)
        if (cv_push(&st, raw[i].node, raw[i].h)) goto oom;
    while (st.n) {
        g_cfg c = st.v[--st.n];
        int32_t n = c.node, h = c.h;
        if (a->vis[n] == a->stamp && a->vis_h[n] <= h) continue;
        int seen = a->vis[n] == a->stamp;
        a->vis[n] = a->stamp;
        a->vis_h[n] = h;
        int32_t q = a->nd[n].q, below = a->nd[n].below, depth = a->nd[n].depth;
        uint8_t f = g->flags[q];
        if (f & G_BYTES) {
            int found = 0;
            if (seen)
                for (int i = out0; i < out->n; i++)
                    if (out->v[i].node == n) {
                        out->v[i].h = h;
                        found = 1;
                        break;
                    }
            if (!found && cv_push(out, n, h)) goto oom;
        }
        if ((f & G_CALLS) && depth + 1 <= g->max_depth)
            for (int k = g->call_off[q]; k < g->call_off[q + 1]; k++) {
                int32_t r = ar_cons(a, g->call_ret[k], below);
                if (r < 0) goto oom;
                int32_t m = ar_cons(a, g->rule_start[g->call_rule[k]], r);
                if (m < 0) goto oom;
                if (cv_push(&st, m, h > depth ? h : depth)) goto oom;
            }
        if (f & G_FINAL) {
            if (below == G_BOTTOM) *flags |= F_CAN_END;
            else if (below == G_BASE) *flags |= F_POPPED;
            else if (cv_push(&st, below, h)) goto oom;
        }
    }
    free(st.v);
    return 0;
oom:
    free(st.v);
    a->oom = 1;
    return -1;
}

int ar_consume(g_arena *a, const g_cfg *in, int nin, uint8_t byte, g_cfgvec *raw) {
    const m3_grammar *g = a->g;
    int c = g->cls[byte];
    for (int i = 0; i < nin; i++) {
        const g_node *nd = &a->nd[in[i].node];
        int32_t t = g->trans[(size_t)nd->q * (size_t)g->ncls + (size_t)c];
        if (t < 0) continue;
        int32_t m = ar_cons(a, t, nd->below);
        if (m < 0 || cv_push(raw, m, in[i].h)) return -1;
    }
    return 0;
}

/* ---- vocabulary ---- */

struct m3_grammar_vocab {
    int32_t n;
    uint8_t *blob;
    size_t *off;
    uint32_t *len;
    int32_t nn; /* trie nodes, preorder; node i: byte tb, depth td, subtree end tskip */
    uint8_t *tb;
    uint16_t *td;
    int32_t *tskip;
    int32_t *ttok; /* nn + 1: tokens ending at node i are toks[ttok[i], ttok[i+1]) */
    int32_t *toks;
    int32_t ntoks;
    int32_t *eos;
    int neos;
    int maxlen;
};

void m3_grammar_vocab_free(m3_grammar_vocab *v) {
    if (!v) return;
    free(v->blob);
    free(v->off);
    free(v->len);
    free(v->tb);
    free(v->td);
    free(v->tskip);
    free(v->ttok);
    free(v->toks);
    free(v->eos);
    free(v);
}

int32_t m3_grammar_vocab_size(const m3_grammar_vocab *v) { return v->n; }
size_t m3_grammar_vocab_trie_nodes(const m3_grammar_vocab *v) { return (size_t)v->nn; }

static const m3_grammar_vocab *sort_v;
static int tokcmp(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    uint32_t la = sort_v->len[a], lb = sort_v->len[b];
    int c = memcmp(sort_v->blob + sort_v->off[a], sort_v->blob + sort_v->off[b], la < lb ? la : lb);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return (a > b) - (a < b);
}

m3_grammar_vocab *m3_grammar_vocab_new(int32_t n, const char *const *bytes, const uint32_t *lens, const int32_t *eos_ids,
                                       int n_eos, m3_err *err) {
    if (n <= 0 || n_eos < 0) {
        m3_errf(err, "grammar vocab: %d tokens, %d end ids", n, n_eos);
        return NULL;
    }
    m3_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) goto oom;
    v->n = n;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (lens[i] > 65535) {
            m3_errf(err, "grammar vocab: token %d is %u bytes long (at most 65535)", i, lens[i]);
            m3_grammar_vocab_free(v);
            return NULL;
        }
        total += lens[i];
    }
    v->blob = malloc(total + 1);
    v->off = malloc((size_t)n * sizeof *v->off);
    v->len = malloc((size_t)n * sizeof *v->len);
    v->toks = malloc((size_t)n * sizeof *v->toks);
    v->eos = malloc(((size_t)n_eos + 1) * sizeof *v->eos);
    if (!v->blob || !v->off || !v->len || !v->toks || !v->eos) goto oom;
    size_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = o;
        v->len[i] = lens[i];
        if (lens[i]) memcpy(v->blob + o, bytes[i], lens[i]);
        o += lens[i];
        if (lens[i] > (uint32_t)v->maxlen) v->maxlen = (int)lens[i];
    }
    for (int i = 0; i < n_eos; i++) {
        if (eos_ids[i] < 0 || eos_ids[i] >= n) {
            m3_errf(err, "grammar vocab: end id %d outside [0, %d)", eos_ids[i], n);
            m3_grammar_vocab_free(v);
            return NULL;
        }
        v->eos[v->neos++] = eos_ids[i];
    }
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (v->len[i]) v->toks[m++] = i;
    v->ntoks = m;
    sort_v = v; /* qsort has no context argument in C11; the vocabulary is built once */
    qsort(v->toks, (size_t)m, sizeof *v->toks, tokcmp);
    /* trie nodes: at most the total length */
    size_t capn = total + 1;
    v->tb = malloc(capn);
    v->td = malloc(capn * sizeof *v->td);
    v->tskip = malloc(capn * sizeof *v->tskip);
    v->ttok = malloc((capn + 1) * sizeof *v->ttok);
    int32_t *open = malloc(((size_t)v->maxlen + 2) * sizeof *open);
    if (!v->tb || !v->td || !v->tskip || !v->ttok || !open) {
        free(open);
        goto oom;
    }
    int depth = 0;
    int32_t prev = -1;
    for (int32_t k = 0; k < m; k++) {
        int32_t t = v->toks[k];
        const uint8_t *b = v->blob + v->off[t];
        int L = (int)v->len[t], l = 0;
        if (prev >= 0) {
            const uint8_t *p = v->blob + v->off[prev];
            int pl = (int)v->len[prev];
            while (l < pl && l < L && p[l] == b[l]) l++;
        }
        while (depth > l) v->tskip[open[depth--]] = v->nn;
        for (int d = l; d < L; d++) {
            int32_t id = v->nn++;
            v->tb[id] = b[d];
            v->td[id] = (uint16_t)(d + 1);
            v->ttok[id] = k;
            open[++depth] = id;
        }
        prev = t;
    }
    while (depth > 0) v->tskip[open[depth--]] = v->nn;
    v->ttok[v->nn] = m;
    free(open);
    return v;
oom:
    m3_errf(err, "grammar vocab: out of memory");
    m3_grammar_vocab_free(v);
    return NULL;
}

/* ---- the cache ---- */

typedef struct {
    uint32_t *bits; /* accepted tokens as a bitmask, or NULL and the list below */
    int32_t *acc;
    int32_t nacc;
    int32_t npush, nunc;
    int32_t *push; /* npush tokens, then npush heights (int32 each) */
    int32_t *unc;
} g_cache;

struct m3_grammar_compiled {
    const m3_grammar *g;
    const m3_grammar_vocab *v;
    g_cache *cache;
    int nwords;
    size_t bytes, nunc;
};

/* walk state, one per thread */
typedef struct {
    g_arena ar;
    g_cfgvec all, raw;
    int32_t *lv_off, *lv_n, *lv_simple, *lv_mark;
    uint8_t *lv_flags, *lv_popb;
    uint32_t *bits;
    int32_t *push, *unc, *acc;
    int32_t npush, nunc, nacc, cappush, capunc;
    const int32_t *strans; /* the grammar's transitions for the fast path (m3_grammar_compile) */
    int oom;
} walker;

static void walker_free(walker *w) {
    ar_free(&w->ar);
    free(w->all.v);
    free(w->raw.v);
    free(w->lv_off);
    free(w->lv_n);
    free(w->lv_simple);
    free(w->lv_mark);
    free(w->lv_flags);
    free(w->lv_popb);
    free(w->bits);
    free(w->push);
    free(w->unc);
    free(w->acc);
}

static int walker_init(walker *w, const m3_grammar *g, const m3_grammar_vocab *v) {
    memset(w, 0, sizeof *w);
    size_t L = (size_t)v->maxlen + 2;
    if (ar_init(&w->ar, g)) return -1;
    w->lv_off = malloc(L * sizeof *w->lv_off);
    w->lv_n = malloc(L * sizeof *w->lv_n);
    w->lv_simple = malloc(L * sizeof *w->lv_simple);
    w->lv_mark = malloc(L * sizeof *w->lv_mark);
    w->lv_flags = malloc(L);
    w->lv_popb = malloc(L);
    w->bits = malloc(((size_t)v->n + 31) / 32 * sizeof *w->bits);
    if (!w->lv_off || !w->lv_n || !w->lv_simple || !w->lv_mark || !w->lv_flags || !w->lv_popb || !w->bits) return -1;
    if (cv_reserve(&w->all) || cv_reserve(&w->raw)) return -1;
    return 0;
}

static void add_list(walker *w, int32_t **l, int32_t *n, int32_t *cap, int32_t t, int32_t h, int with_h) {
    if (*n + 1 > *cap) {
        int32_t nc = *cap ? *cap * 2 : 256;
        int32_t *nl = realloc(*l, (size_t)nc * (with_h ? 2 : 1) * sizeof *nl);
        if (!nl) {
            w->oom = 1;
            return;
        }
        if (with_h) memmove(nl + nc, nl + *cap, (size_t)*n * sizeof *nl);
        *l = nl;
        *cap = nc;
    }
    if (with_h) (*l)[*cap + *n] = h;
    (*l)[(*n)++] = t;
}

/* level d from level d - 1 by byte b; returns whether any consuming configuration is left */
static int level_step(walker *w, const m3_grammar *g, int d, uint8_t b, int32_t below0) {
    int p = d - 1;
    ar_truncate(&w->ar, w->lv_mark[p]);
    w->all.n = w->lv_off[p] + w->lv_n[p];
    w->lv_off[d] = w->all.n;
    w->lv_n[d] = 0;
    w->lv_flags[d] = 0;
    w->lv_simple[d] = -1;
    w->lv_popb[d] = (uint8_t)(w->lv_popb[p] | ((w->lv_flags[p] & F_POPPED) ? 1 : 0));
    int nonempty = 0;
    w->raw.n = 0;
    if (w->lv_simple[p] >= 0) {
        int32_t t = g->trans[(size_t)w->lv_simple[p] * (size_t)g->ncls + g->cls[b]];
        if (t >= 0) {
            if (g->flags[t] == G_BYTES) {
                w->lv_simple[d] = t;
                nonempty = 1;
            } else {
                int32_t nd = ar_cons(&w->ar, t, below0);
                if (nd < 0 || cv_push(&w->raw, nd, 0)) w->oom = 1;
            }
        }
    } else if (ar_consume(&w->ar, w->all.v + w->lv_off[p], w->lv_n[p], b, &w->raw))
        w->oom = 1;
    if (w->raw.n) {
        int fl = 0;
        if (ar_expand(&w->ar, w->raw.v, w->raw.n, &w->all, &fl)) w->oom = 1;
        w->lv_n[d] = w->all.n - w->lv_off[d];
        w->lv_flags[d] = (uint8_t)fl;
        nonempty = w->lv_n[d] > 0;
    }
    w->lv_mark[d] = w->ar.nn;
    return nonempty;
}

static int cache_state(walker *w, const m3_grammar *g, const m3_grammar_vocab *v, int32_t q0, g_cache *out) {
    int32_t below0 = g->rule_called[g->rule_of[q0]] ? G_BASE : G_BOTTOM;
    int nwords = (v->n + 31) / 32;
    memset(w->bits, 0, (size_t)nwords * sizeof *w->bits);
    w->npush = w->nunc = w->nacc = 0;
    ar_truncate(&w->ar, 0);
    w->all.n = 0;
    w->lv_off[0] = 0;
    w->lv_n[0] = 0;
    w->lv_simple[0] = q0;
    w->lv_mark[0] = 0;
    w->lv_flags[0] = 0;
    w->lv_popb[0] = 0;
    int32_t nacc = 0;
    const int32_t *strans = w->strans;
    const uint8_t *cls = g->cls;
    const size_t ncls = (size_t)g->ncls;
    for (int32_t i = 0; i < v->nn && !w->oom;) {
        int d = v->td[i];
        /* The fast path: a chain of plain DFA states from q0 (levels whose only configuration is
         * a state with byte edges alone, nothing pushed or popped) moves by one table lookup; most
         * nodes of a walk are there (string contents, numbers, literals). Such a level is all
         * zeros but lv_simple (level_step's result for it would be the same). */
        int32_t ps = w->lv_simple[d - 1];
        if (ps >= 0) {
            int32_t t = strans[(size_t)ps * ncls + cls[v->tb[i]]];
            if (t == -1) { /* nothing below: no token of the subtree, none popped */
                i = v->tskip[i];
                continue;
            }
            if (t >= 0) {
                w->lv_simple[d] = t;
                w->lv_off[d] = w->lv_n[d] = w->lv_mark[d] = 0;
                w->lv_flags[d] = w->lv_popb[d] = 0;
                for (int32_t k = v->ttok[i]; k < v->ttok[i + 1]; k++) {
                    int32_t tk = v->toks[k];
                    w->bits[tk >> 5] |= 1u << (tk & 31);
                    nacc++;
                }
                i++;
                continue;
            }
        }
        int ne = level_step(w, g, d, v->tb[i], below0);
        int fl = w->lv_flags[d], popb = w->lv_popb[d];
        int32_t hmin = 0;
        if (ne && w->lv_simple[d] < 0) {
            hmin = INT32_MAX;
            for (int k = 0; k < w->lv_n[d]; k++) {
                int32_t h = w->all.v[w->lv_off[d] + k].h;
                if (h < hmin) hmin = h;
            }
        }
        for (int32_t k = v->ttok[i]; k < v->ttok[i + 1]; k++) {
            int32_t t = v->toks[k];
            if ((ne && hmin == 0) || (fl & (F_CAN_END | F_POPPED))) {
                w->bits[t >> 5] |= 1u << (t & 31);
                nacc++;
            } else if (ne && !popb)
                add_list(w, &w->push, &w->npush, &w->cappush, t, hmin, 1);
            else if (ne || popb)
                add_list(w, &w->unc, &w->nunc, &w->capunc, t, 0, 0);
        }
        if (!ne) {
            if (popb || (fl & F_POPPED)) /* every longer token in the subtree went below q's frame */
                for (int32_t k = v->ttok[i + 1]; k < v->ttok[v->tskip[i]]; k++)
                    add_list(w, &w->unc, &w->nunc, &w->capunc, v->toks[k], 0, 0);
            i = v->tskip[i];
        } else
            i++;
    }
    if (w->oom) return -1;
    memset(out, 0, sizeof *out);
    out->nacc = nacc;
    if ((size_t)nacc * 32 >= (size_t)v->n) {
        out->bits = malloc((size_t)nwords * sizeof *out->bits);
        if (!out->bits) return -1;
        memcpy(out->bits, w->bits, (size_t)nwords * sizeof *out->bits);
    } else {
        out->acc = malloc(((size_t)nacc + 1) * sizeof *out->acc);
        if (!out->acc) return -1;
        int32_t k = 0;
        for (int wd = 0; wd < nwords; wd++)
            for (uint32_t x = w->bits[wd]; x; x &= x - 1) out->acc[k++] = wd * 32 + __builtin_ctz(x);
    }
    out->npush = w->npush;
    out->nunc = w->nunc;
    if (w->npush) {
        out->push = malloc((size_t)w->npush * 2 * sizeof *out->push);
        if (!out->push) return -1;
        memcpy(out->push, w->push, (size_t)w->npush * sizeof *out->push);
        memcpy(out->push + w->npush, w->push + w->cappush, (size_t)w->npush * sizeof *out->push);
    }
    if (w->nunc) {
        out->unc = malloc((size_t)w->nunc * sizeof *out->unc);
        if (!out->unc) return -1;
        memcpy(out->unc, w->unc, (size_t)w->nunc * sizeof *out->unc);
    }
    return 0;
}

typedef struct {
    m3_grammar_compiled *c;
    walker *w;
    int failed;
} compile_job;

static void compile_range(void *ctx, size_t begin, size_t end, int worker) {
    compile_job *j = ctx;
    const m3_grammar *g = j->c->g;
    for (size_t q = begin; q < end; q++)
        if ((g->flags[q] & G_BYTES) && cache_state(&j->w[worker], g, j->c->v, (int32_t)q, &j->c->cache[q]))
            __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); /* workers may fail at once; read after the loop */
}

int32_t m3_grammar_compiled_vocab_size(const m3_grammar_compiled *c) { return c->v->n; }

void m3_grammar_compiled_free(m3_grammar_compiled *c) {
    if (!c) return;
    if (c->cache)
        for (int q = 0; q < c->g->n; q++) {
            free(c->cache[q].bits);
            free(c->cache[q].acc);
            free(c->cache[q].push);
            free(c->cache[q].unc);
        }
    free(c->cache);
    free(c);
}

m3_grammar_compiled *m3_grammar_compile(const m3_grammar *g, const m3_grammar_vocab *v, m3_pool *pool, m3_err *err) {
    int32_t *strans = NULL;
    m3_grammar_compiled *c = calloc(1, sizeof *c);
    int nw = pool ? m3_pool_size(pool) : 1;
    walker *w = calloc((size_t)nw, sizeof *w);
    if (!c || !w) goto oom;
    c->g = g;
    c->v = v;
    c->nwords = (v->n + 31) / 32;
    c->cache = calloc((size_t)g->n, sizeof *c->cache);
    if (!c->cache) goto oom;
    int ok = 1;
    for (int i = 0; i < nw; i++) ok &= walker_init(&w[i], g, v) == 0;
    if (!ok) goto oom;
    /* trans, folded with the flags for cache_state's fast path: the next state when it has byte
     * edges alone, -1 when there is none, -2 when the generic walk must take it (an end, a call).
     * An end of a rule nobody calls (the document's, a regex's many) counts as byte edges alone:
     * ending there pops to the bottom, which only the end id follows, and a token that stops
     * there is allowed by the byte edges already. */
    size_t nt = (size_t)g->n * (size_t)g->ncls;
    strans = malloc(nt * sizeof *strans);
    if (!strans) goto oom;
    for (size_t k = 0; k < nt; k++) {
        int32_t t = g->trans[k];
        int plain = t >= 0 && (g->flags[t] == G_BYTES || (g->flags[t] == (G_BYTES | G_FINAL) && !g->rule_called[g->rule_of[t]]));
        strans[k] = t < 0 ? -1 : plain ? t : -2;
    }
    for (int i = 0; i < nw; i++) w[i].strans = strans;
    compile_job j = {c, w, 0};
    m3_pool_for(pool, (size_t)g->n, 1, compile_range, &j);
    if (j.failed) goto oom;
    for (int q = 0; q < g->n; q++) {
        g_cache *k = &c->cache[q];
        c->bytes += (k->bits ? (size_t)c->nwords * 4 : (size_t)k->nacc * 4) + (size_t)k->npush * 8 + (size_t)k->nunc * 4;
        c->nunc += (size_t)k->nunc;
    }
    for (int i = 0; i < nw; i++) walker_free(&w[i]);
    free(w);
    free(strans);
    return c;
oom:
    m3_errf(err, "grammar compile: out of memory");
    if (w)
        for (int i = 0; i < nw; i++) walker_free(&w[i]);
    free(w);
    free(strans);
    m3_grammar_compiled_free(c);
    return NULL;
}

size_t m3_grammar_compiled_bytes(const m3_grammar_compiled *c) { return c->bytes; }
size_t m3_grammar_compiled_uncertain(const m3_grammar_compiled *c) { return c->nunc; }

/* ---- the matcher ---- */

typedef struct {
    int32_t off, n, mark;
    uint8_t can_end, ended;
} hist_t;

struct m3_matcher {
    const m3_grammar_compiled *c;
    const m3_grammar *g;
    const m3_grammar_vocab *v;
    g_arena ar;
    g_cfg *hn; /* the stacks of every state in the history, one after the other */
    size_t nhn, caphn;
    hist_t *h;
    int nh, caph;
    g_cfgvec raw, s1, s2;
    walker slow; /* for m3_matcher_fill_mask_slow, made on first use */
    int slow_ok;
};

static int push_state(m3_matcher *m, const g_cfg *cfg, int n, int can_end, int ended) {
    if (m->nh == m->caph) {
        int cap = m->caph ? m->caph * 2 : 64;
        hist_t *h = realloc(m->h, (size_t)cap * sizeof *h);
        if (!h) return -1;
        m->h = h;
        m->caph = cap;
    }
    if (m->nhn + (size_t)n > m->caphn) {
        size_t cap = (m->caphn + (size_t)n) * 2;
        int alias = m->hn && cfg >= m->hn && cfg < m->hn + m->caphn; /* the end id repeats the last state */
        size_t at = alias ? (size_t)(cfg - m->hn) : 0;
        g_cfg *hn = realloc(m->hn, cap * sizeof *hn);
        if (!hn) return -1;
        m->hn = hn;
        m->caphn = cap;
        if (alias) cfg = m->hn + at;
    }
    for (int i = 0; i < n; i++) m->hn[m->nhn + (size_t)i] = (g_cfg){cfg[i].node, 0};
    m->h[m->nh++] = (hist_t){(int32_t)m->nhn, n, m->ar.nn, (uint8_t)can_end, (uint8_t)ended};
    m->nhn += (size_t)n;
    return 0;
}

void m3_matcher_reset(m3_matcher *m) {
    m->nh = 0;
    m->nhn = 0;
    ar_truncate(&m->ar, 0);
    int32_t n0 = ar_cons(&m->ar, m->g->rule_start[0], G_BOTTOM);
    g_cfg raw = {n0, 0};
    m->s1.n = 0;
    int fl = 0;
    if (n0 < 0 || ar_expand(&m->ar, &raw, 1, &m->s1, &fl) || push_state(m, m->s1.v, m->s1.n, fl & F_CAN_END, 0))
        m->ar.oom = 1;
}

m3_matcher *m3_matcher_new(const m3_grammar_compiled *c, m3_err *err) {
    m3_matcher *m = calloc(1, sizeof *m);
    if (!m || ar_init(&m->ar, c->g)) {
        free(m);
        m3_errf(err, "grammar matcher: out of memory");
        return NULL;
    }
    m->c = c;
    m->g = c->g;
    m->v = c->v;
    m->hn = malloc(64 * sizeof *m->hn); /* never NULL (cv_reserve) */
    m->caphn = m->hn ? 64 : 0;
    if (!m->hn || cv_reserve(&m->raw) || cv_reserve(&m->s1) || cv_reserve(&m->s2)) m->ar.oom = 1;
    else m3_matcher_reset(m);
    if (m->ar.oom) {
        m3_matcher_free(m);
        m3_errf(err, "grammar matcher: out of memory");
        return NULL;
    }
    return m;
}

void m3_matcher_free(m3_matcher *m) {
    if (!m) return;
    ar_free(&m->ar);
    free(m->hn);
    free(m->h);
    free(m->raw.v);
    free(m->s1.v);
    free(m->s2.v);
    if (m->slow_ok) walker_free(&m->slow);
    free(m);
}

/* walks bytes from the stacks in[0..nin) into m->s1; 1 when valid (stacks left or the end), 0 not,
 * -1 out of memory; *can_end gets whether the output may end there */
static int walk_bytes(m3_matcher *m, const g_cfg *in, int nin, const uint8_t *b, size_t n, int *can_end) {
    const g_cfg *cur = in;
    int ncur = nin, fl = 0;
    for (size_t i = 0; i < n; i++) {
        m->raw.n = 0;
        if (ar_consume(&m->ar, cur, ncur, b[i], &m->raw)) return -1;
        if (!m->raw.n) return 0;
        g_cfgvec *out = (i & 1) ? &m->s2 : &m->s1;
        out->n = 0;
        fl = 0;
        if (ar_expand(&m->ar, m->raw.v, m->raw.n, out, &fl)) return -1;
        cur = out->v;
        ncur = out->n;
        if (!ncur && !(fl & F_CAN_END)) return 0;
        if (!ncur && i + 1 < n) return 0;
    }
    if (n && ((n - 1) & 1)) { /* the result is in s2: move it to s1 */
        g_cfgvec t = m->s1;
        m->s1 = m->s2;
        m->s2 = t;
    }
    *can_end = (fl & F_CAN_END) != 0;
    return 1;
}

static int is_eos(const m3_grammar_vocab *v, int32_t t) {
    for (int i = 0; i < v->neos; i++)
        if (v->eos[i] == t) return 1;
    return 0;
}

int m3_matcher_accept_bytes(m3_matcher *m, const void *bytes, size_t n) {
    if (!m->nh || !n) return -1;
    hist_t top = m->h[m->nh - 1];
    if (top.ended) return -1;
    int32_t mark = m->ar.nn;
    int can_end = 0;
    int r = walk_bytes(m, m->hn + top.off, top.n, bytes, n, &can_end);
    if (r == 1 && push_state(m, m->s1.v, m->s1.n, can_end, 0) == 0) return 0;
    ar_truncate(&m->ar, mark);
    return -1;
}

int m3_matcher_accept(m3_matcher *m, int32_t t) {
    if (!m->nh || t < 0 || t >= m->v->n) return -1;
    hist_t top = m->h[m->nh - 1];
    if (top.ended) return -1;
    if (is_eos(m->v, t)) {
        if (!top.can_end) return -1;
        return push_state(m, m->hn + top.off, top.n, 1, 1);
    }
    if (!m->v->len[t]) return -1;
    return m3_matcher_accept_bytes(m, m->v->blob + m->v->off[t], m->v->len[t]);
}

int m3_matcher_rollback(m3_matcher *m, int n) {
    if (n < 0 || n > m->nh - 1) return -1;
    m->nh -= n;
    hist_t top = m->h[m->nh - 1];
    m->nhn = (size_t)top.off + (size_t)top.n;
    ar_truncate(&m->ar, top.mark);
    return 0;
}

int m3_matcher_history(const m3_matcher *m) { return m->nh - 1; }
int m3_matcher_can_end(const m3_matcher *m) { return m->nh && m->h[m->nh - 1].can_end && !m->h[m->nh - 1].ended; }
int m3_matcher_must_end(const m3_matcher *m) { return m3_matcher_can_end(m) && m->h[m->nh - 1].n == 0; }
int m3_matcher_is_ended(const m3_matcher *m) { return m->nh && m->h[m->nh - 1].ended; }

int64_t m3_matcher_min_bytes_to_end(const m3_matcher *m) {
    if (!m->nh) return G_INF;
    hist_t top = m->h[m->nh - 1];
    if (top.can_end || top.ended) return 0;
    int64_t best = G_INF;
    for (int i = 0; i < top.n; i++) {
        int64_t s = 0;
        for (int32_t n = m->hn[top.off + i].node; n >= 0; n = m->ar.nd[n].below) s += m->g->dist[m->ar.nd[n].q];
        if (s < best) best = s;
    }
    return best;
}

static void set_eos(const m3_matcher *m, uint32_t *mask) {
    for (int i = 0; i < m->v->neos; i++) mask[m->v->eos[i] >> 5] |= 1u << (m->v->eos[i] & 31);
}

int m3_matcher_fill_mask(m3_matcher *m, uint32_t *mask) {
    int nw = m->c->nwords;
    if (!m->nh || m->ar.oom) {
        memset(mask, 0xff, (size_t)nw * sizeof *mask);
        return -1;
    }
    hist_t top = m->h[m->nh - 1];
    if (top.ended) {
        memset(mask, 0, (size_t)nw * sizeof *mask);
        return 0;
    }
    const g_cfg *cfg = m->hn + top.off;
    int copied = 0;
    if (top.n >= 1 && m->c->cache[m->ar.nd[cfg[0].node].q].bits) {
        memcpy(mask, m->c->cache[m->ar.nd[cfg[0].node].q].bits, (size_t)nw * sizeof *mask);
        copied = 1;
    } else
        memset(mask, 0, (size_t)nw * sizeof *mask);
    for (int i = 0; i < top.n; i++) {
        const g_node *nd = &m->ar.nd[cfg[i].node];
        const g_cache *k = &m->c->cache[nd->q];
        if (k->bits) {
            if (!(i == 0 && copied))
                for (int w = 0; w < nw; w++) mask[w] |= k->bits[w];
        } else
            for (int32_t j = 0; j < k->nacc; j++) mask[k->acc[j] >> 5] |= 1u << (k->acc[j] & 31);
        for (int32_t j = 0; j < k->npush; j++)
            if (nd->depth + k->push[k->npush + j] <= m->g->max_depth) mask[k->push[j] >> 5] |= 1u << (k->push[j] & 31);
        for (int32_t j = 0; j < k->nunc; j++) {
            int32_t t = k->unc[j];
            if (mask[t >> 5] >> (t & 31) & 1) continue;
            int32_t mark = m->ar.nn;
            int ce = 0;
            int r = walk_bytes(m, &cfg[i], 1, m->v->blob + m->v->off[t], m->v->len[t], &ce);
            ar_truncate(&m->ar, mark);
            if (r < 0) {
                memset(mask, 0xff, (size_t)nw * sizeof *mask);
                return -1;
            }
            if (r == 1) mask[t >> 5] |= 1u << (t & 31);
        }
    }
    if (top.can_end) set_eos(m, mask);
    return 0;
}

int m3_matcher_fill_mask_slow(m3_matcher *m, uint32_t *mask) {
    int nw = m->c->nwords;
    memset(mask, 0, (size_t)nw * sizeof *mask);
    if (!m->nh) return -1;
    hist_t top = m->h[m->nh - 1];
    if (top.ended) return 0;
    if (!m->slow_ok) {
        if (walker_init(&m->slow, m->g, m->v)) {
            walker_free(&m->slow);
            return -1;
        }
        m->slow_ok = 1;
    }
    /* the walker's levels, over this matcher's own arena (real stacks below) */
    walker *w = &m->slow;
    g_arena saved = w->ar;
    w->ar = m->ar;
    int32_t mark = m->ar.nn;
    w->all.n = 0;
    for (int i = 0; i < top.n; i++) cv_push(&w->all, m->hn[top.off + i].node, 0);
    w->lv_off[0] = 0;
    w->lv_n[0] = top.n;
    w->lv_simple[0] = -1;
    w->lv_mark[0] = mark;
    w->lv_flags[0] = 0;
    w->lv_popb[0] = 0;
    w->oom = 0;
    const m3_grammar_vocab *v = m->v;
    for (int32_t i = 0; i < v->nn && !w->oom;) {
        int d = v->td[i];
        int ne = level_step(w, m->g, d, v->tb[i], G_BOTTOM);
        if (ne || (w->lv_flags[d] & F_CAN_END))
            for (int32_t k = v->ttok[i]; k < v->ttok[i + 1]; k++) mask[v->toks[k] >> 5] |= 1u << (v->toks[k] & 31);
        i = ne ? i + 1 : v->tskip[i];
    }
    ar_truncate(&w->ar, mark);
    m->ar = w->ar;
    w->ar = saved;
    if (top.can_end) set_eos(m, mask);
    return w->oom ? -1 : 0;
}
