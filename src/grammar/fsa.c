/* The automaton under a grammar: an NFA built from Thompson fragments (bytes, epsilons, calls
 * to rules), turned into one DFA per rule by the subset construction (calls are symbols of
 * that construction, so a rule is deterministic up to the rules it calls), pruned of the states
 * from which the rule cannot end, renumbered into one table over byte classes. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

/* ---- NFA builder ---- */

static int nfa_fail(g_nfa *n, const char *what) {
    if (!n->failed) {
        m3_errf(n->err, "%s: %s", nfa_what(n), what);
        if (n->err) n->err->oom = m3_err_fmt_oom(what); /* what: this file's words */
    }
    n->failed = 1;
    return -1;
}

int nfa_oom(g_nfa *n) { return nfa_fail(n, "out of memory"); }

int nfa_state(g_nfa *n) {
    if (n->failed) return -1;
    if (n->nst >= n->max_states) return nfa_fail(n, "too large (more than the automaton state limit)");
    if (n->nst == n->capst) {
        int cap = n->capst ? n->capst * 2 : 1024;
        int32_t *f = realloc(n->first, (size_t)cap * sizeof *f);
        if (!f) return nfa_fail(n, "out of memory");
        n->first = f;
        n->capst = cap;
    }
    n->first[n->nst] = -1;
    return n->nst++;
}

void nfa_edge(g_nfa *n, int from, int kind, int lo, int hi, int to, int rule) {
    if (n->failed || from < 0 || to < 0) return;
    if (n->ned == n->caped) {
        int cap = n->caped ? n->caped * 2 : 2048;
        g_edge *e = realloc(n->ed, (size_t)cap * sizeof *e);
        if (!e) { nfa_fail(n, "out of memory"); return; }
        n->ed = e;
        n->caped = cap;
    }
    g_edge *e = &n->ed[n->ned];
    e->kind = (uint8_t)kind;
    e->lo = (uint8_t)lo;
    e->hi = (uint8_t)hi;
    e->to = to;
    e->rule = rule;
    e->next = n->first[from];
    n->first[from] = n->ned++;
}

void nfa_free(g_nfa *n) {
    free(n->ed);
    free(n->first);
    free(n->rstart);
    free(n->rend);
    memset(n, 0, sizeof *n);
}

int nfa_rule_new(g_nfa *n) {
    if (n->failed) return -1;
    if (n->nrules >= G_MAX_RULES) return nfa_fail(n, "too large (more than 4096 rules)");
    if (n->nrules == n->caprules) {
        int cap = n->caprules ? n->caprules * 2 : 16;
        int32_t *s = realloc(n->rstart, (size_t)cap * sizeof *s);
        if (s) n->rstart = s;
        int32_t *e = realloc(n->rend, (size_t)cap * sizeof *e);
        if (e) n->rend = e;
        if (!s || !e) return nfa_fail(n, "out of memory");
        n->caprules = cap;
    }
    n->rstart[n->nrules] = n->rend[n->nrules] = -1;
    return n->nrules++;
}

void nfa_rule_set(g_nfa *n, int r, g_frag f) {
    if (r < 0 || r >= n->nrules) return;
    n->rstart[r] = f.s;
    n->rend[r] = f.e;
}

g_frag f_none(void) { return (g_frag){-1, -1}; }

g_frag f_eps(g_nfa *n) {
    int s = nfa_state(n);
    return (g_frag){s, s};
}

g_frag f_range(g_nfa *n, int lo, int hi) {
    int s = nfa_state(n), e = nfa_state(n);
    if (e < 0) return f_none();
    nfa_edge(n, s, E_BYTE, lo, hi, e, -1);
    return (g_frag){s, e};
}

g_frag f_lit(g_nfa *n, const char *str, size_t len) {
    int s = nfa_state(n), cur = s;
    for (size_t i = 0; i < len && cur >= 0; i++) {
        int nx = nfa_state(n);
        nfa_edge(n, cur, E_BYTE, (uint8_t)str[i], (uint8_t)str[i], nx, -1);
        cur = nx;
    }
    if (cur < 0) return f_none();
    return (g_frag){s, cur};
}

g_frag f_seq(g_nfa *n, g_frag a, g_frag b) {
    if (a.s < 0 || b.s < 0) return f_none();
    nfa_edge(n, a.e, E_EPS, 0, 0, b.s, -1);
    return (g_frag){a.s, b.e};
}

g_frag f_alt(g_nfa *n, g_frag a, g_frag b) {
    if (a.s < 0) return b;
    if (b.s < 0) return a;
    int s = nfa_state(n), e = nfa_state(n);
    if (e < 0) return f_none();
    nfa_edge(n, s, E_EPS, 0, 0, a.s, -1);
    nfa_edge(n, s, E_EPS, 0, 0, b.s, -1);
    nfa_edge(n, a.e, E_EPS, 0, 0, e, -1);
    nfa_edge(n, b.e, E_EPS, 0, 0, e, -1);
    return (g_frag){s, e};
}

g_frag f_opt(g_nfa *n, g_frag a) {
    if (a.s < 0) return f_eps(n);
    int s = nfa_state(n), e = nfa_state(n);
    if (e < 0) return f_none();
    nfa_edge(n, s, E_EPS, 0, 0, a.s, -1);
    nfa_edge(n, s, E_EPS, 0, 0, e, -1);
    nfa_edge(n, a.e, E_EPS, 0, 0, e, -1);
    return (g_frag){s, e};
}

g_frag f_star(g_nfa *n, g_frag a) {
    if (a.s < 0) return f_eps(n);
    int s = nfa_state(n), e = nfa_state(n);
    if (e < 0) return f_none();
    nfa_edge(n, s, E_EPS, 0, 0, a.s, -1);
    nfa_edge(n, a.e, E_EPS, 0, 0, s, -1);
    nfa_edge(n, s, E_EPS, 0, 0, e, -1);
    return (g_frag){s, e};
}

g_frag f_call(g_nfa *n, int rule) {
    if (rule < 0) return f_none();
    int s = nfa_state(n), e = nfa_state(n);
    if (e < 0) return f_none();
    nfa_edge(n, s, E_CALL, 0, 0, e, rule);
    return (g_frag){s, e};
}

g_frag f_repeat(g_nfa *n, g_frag f, long lo, long hi, g_frag (*more)(void *ctx), void *ctx) {
    int used = 0; /* f taken by a copy */
    g_frag out = f_eps(n);
    for (long i = 0; i < lo && out.s >= 0; i++, used = 1) out = f_seq(n, out, used ? more(ctx) : f);
    if (hi < 0) return out.s < 0 ? out : f_seq(n, out, f_star(n, used ? more(ctx) : f));
    g_frag t = f_eps(n);
    for (long i = lo; i < hi && t.s >= 0; i++, used = 1) {
        g_frag c = used ? more(ctx) : f;
        if (c.s < 0) return c;
        t = f_opt(n, f_seq(n, c, t));
    }
    return f_seq(n, out, t);
}

int f_is_empty(g_nfa *n, g_frag f) {
    if (f.s < 0 || n->failed) return 1;
    uint8_t *seen = calloc((size_t)n->nst, 1);
    int32_t *stk = malloc((size_t)n->nst * sizeof *stk);
    int sp = 0, found = 0;
    if (!seen || !stk) { /* the NFA's failure (empty, as a failed NFA's fragments are) */
        free(seen);
        free(stk);
        nfa_oom(n);
        return 1;
    }
    seen[f.s] = 1;
    stk[sp++] = f.s;
    while (sp && !found) {
        int s = stk[--sp];
        if (s == f.e) found = 1;
        for (int e = n->first[s]; e >= 0 && !found; e = n->ed[e].next)
            if (!seen[n->ed[e].to]) {
                seen[n->ed[e].to] = 1;
                stk[sp++] = n->ed[e].to;
            }
    }
    free(seen);
    free(stk);
    return !found;
}

/* ---- subset construction ---- */

typedef struct {
    int n, cap, ncls;
    int32_t *trans;
    uint8_t *final;
    int32_t *set_off, *set_len;
    int32_t *sets;
    size_t nsets, capsets;
    int32_t *map; /* hash -> dfa id */
    uint32_t mapmask;
    int32_t *coff; /* calls per state, n + 1 */
    int32_t *crule, *cto;
    int nc, capc;
    /* scratch */
    uint32_t *mark;
    uint32_t stamp;
    int32_t *stk, *tmp;
    int capstk;
} dfa_t;

static void dfa_free(dfa_t *d) {
    free(d->trans);
    free(d->final);
    free(d->set_off);
    free(d->set_len);
    free(d->sets);
    free(d->map);
    free(d->coff);
    free(d->crule);
    free(d->cto);
    free(d->mark);
    free(d->stk);
    free(d->tmp);
    memset(d, 0, sizeof *d);
}

static int icmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint32_t set_hash(const int32_t *s, int n) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 16777619u;
    return h ^ (uint32_t)n;
}

/* epsilon closure of seeds[0..ns) (duplicates allowed) into d->tmp, sorted; returns its size */
static int closure(const g_nfa *nfa, dfa_t *d, const int32_t *seeds, int ns) {
    if (++d->stamp == 0) {
        memset(d->mark, 0, (size_t)nfa->nst * sizeof *d->mark);
        d->stamp = 1;
    }
    int sp = 0, k = 0;
    for (int i = 0; i < ns; i++)
        if (d->mark[seeds[i]] != d->stamp) {
            d->mark[seeds[i]] = d->stamp;
            d->stk[sp++] = seeds[i];
        }
    while (sp) {
        int s = d->stk[--sp];
        d->tmp[k++] = s;
        for (int e = nfa->first[s]; e >= 0; e = nfa->ed[e].next)
            if (nfa->ed[e].kind == E_EPS && d->mark[nfa->ed[e].to] != d->stamp) {
                d->mark[nfa->ed[e].to] = d->stamp;
                d->stk[sp++] = nfa->ed[e].to;
            }
    }
    qsort(d->tmp, (size_t)k, sizeof *d->tmp, icmp);
    return k;
}

/* the DFA id of the set in d->tmp[0..k), added when new; -1 on failure */
static int set_id(dfa_t *d, int k, int max_states) {
    uint32_t h = set_hash(d->tmp, k);
    for (uint32_t i = h & d->mapmask;; i = (i + 1) & d->mapmask) {
        int32_t id = d->map[i];
        if (id < 0) break;
        if (d->set_len[id] == k && !memcmp(d->sets + d->set_off[id], d->tmp, (size_t)k * sizeof *d->tmp)) return id;
    }
    if (d->n >= max_states) return -2; /* over the limit (-1: out of memory) */
    if (d->n == d->cap) {
        int cap = d->cap * 2;
        int32_t *tr = realloc(d->trans, (size_t)cap * (size_t)d->ncls * sizeof *tr);
        if (tr) d->trans = tr;
        uint8_t *fi = realloc(d->final, (size_t)cap);
        if (fi) d->final = fi;
        int32_t *so = realloc(d->set_off, (size_t)cap * sizeof *so);
        if (so) d->set_off = so;
        int32_t *sl = realloc(d->set_len, (size_t)cap * sizeof *sl);
        if (sl) d->set_len = sl;
        int32_t *co = realloc(d->coff, (size_t)(cap + 1) * sizeof *co);
        if (co) d->coff = co;
        if (!tr || !fi || !so || !sl || !co) return -1;
        d->cap = cap;
    }
    if ((uint32_t)d->n * 2 >= d->mapmask) { /* grow the map */
        uint32_t nm = (d->mapmask + 1) * 2;
        int32_t *m = malloc(nm * sizeof *m);
        if (!m) return -1;
        memset(m, 0xff, nm * sizeof *m);
        for (int id = 0; id < d->n; id++) {
            uint32_t hh = set_hash(d->sets + d->set_off[id], d->set_len[id]);
            uint32_t j = hh & (nm - 1);
            while (m[j] >= 0) j = (j + 1) & (nm - 1);
            m[j] = id;
        }
        free(d->map);
        d->map = m;
        d->mapmask = nm - 1;
    }
    if (d->nsets + (size_t)k > d->capsets) {
        size_t cap = (d->capsets + (size_t)k) * 2;
        int32_t *s = realloc(d->sets, cap * sizeof *s);
        if (!s) return -1;
        d->sets = s;
        d->capsets = cap;
    }
    int id = d->n++;
    memcpy(d->sets + d->nsets, d->tmp, (size_t)k * sizeof *d->tmp);
    d->set_off[id] = (int32_t)d->nsets;
    d->set_len[id] = k;
    d->nsets += (size_t)k;
    for (int c = 0; c < d->ncls; c++) d->trans[(size_t)id * (size_t)d->ncls + (size_t)c] = -1;
    d->final[id] = 0;
    uint32_t i = h & d->mapmask;
    while (d->map[i] >= 0) i = (i + 1) & d->mapmask;
    d->map[i] = id;
    return id;
}

typedef struct {
    int32_t key, to;
} kv_t;

static int kvcmp(const void *a, const void *b) {
    const kv_t *x = a, *y = b;
    if (x->key != y->key) return (x->key > y->key) - (x->key < y->key);
    return (x->to > y->to) - (x->to < y->to);
}

/* The DFA of the NFA part reachable from start (end: its accepting state), over the byte classes
 * cls (ncls of them, each an interval of bytes). 0, -1 out of memory, -2 over max_states. */
static int dfa_subset(const g_nfa *nfa, int start, int end, const uint8_t *cls, int ncls, int max_states, dfa_t *d) {
    int why = -1;
    memset(d, 0, sizeof *d);
    d->ncls = ncls;
    d->cap = 64;
    d->trans = malloc((size_t)d->cap * (size_t)ncls * sizeof *d->trans);
    d->final = malloc((size_t)d->cap);
    d->set_off = malloc((size_t)d->cap * sizeof *d->set_off);
    d->set_len = malloc((size_t)d->cap * sizeof *d->set_len);
    d->coff = malloc((size_t)(d->cap + 1) * sizeof *d->coff);
    d->mapmask = 255;
    d->map = malloc(256 * sizeof *d->map);
    d->mark = calloc((size_t)nfa->nst + 1, sizeof *d->mark);
    d->stk = malloc(((size_t)nfa->nst + 1) * sizeof *d->stk);
    d->tmp = malloc(((size_t)nfa->nst + 1) * sizeof *d->tmp);
    size_t capkv = 256, nkv;
    kv_t *kv = malloc(capkv * sizeof *kv);
    int32_t *seeds = malloc(((size_t)nfa->nst + 1) * sizeof *seeds);
    if (!d->trans || !d->final || !d->set_off || !d->set_len || !d->coff || !d->map || !d->mark || !d->stk || !d->tmp ||
        !kv || !seeds)
        goto fail;
    memset(d->map, 0xff, 256 * sizeof *d->map);
    int32_t s0 = start;
    int id0 = set_id(d, closure(nfa, d, &s0, 1), max_states);
    if (id0 < 0) { /* (why stays -1 for the allocations below: a failed one is never a DFA of 0 states) */
        why = id0;
        goto fail;
    }
    for (int id = 0; id < d->n; id++) {
        d->coff[id] = d->nc;
        /* byte edges: (class, target) pairs; calls: (rule, target) pairs */
        for (int pass = 0; pass < 2; pass++) {
            nkv = 0;
            int32_t off = d->set_off[id], len = d->set_len[id];
            for (int i = 0; i < len; i++) {
                int s = d->sets[off + i];
                if (s == end) d->final[id] = 1;
                for (int e = nfa->first[s]; e >= 0; e = nfa->ed[e].next) {
                    const g_edge *ed = &nfa->ed[e];
                    if (pass == 0 && ed->kind == E_BYTE) {
                        for (int c = cls[ed->lo]; c <= cls[ed->hi]; c++) {
                            if (nkv == capkv) {
                                kv_t *k2 = realloc(kv, (capkv *= 2) * sizeof *kv);
                                if (!k2) goto fail;
                                kv = k2;
                            }
                            kv[nkv++] = (kv_t){c, ed->to};
                        }
                    } else if (pass == 1 && ed->kind == E_CALL) {
                        if (nkv == capkv) {
                            kv_t *k2 = realloc(kv, (capkv *= 2) * sizeof *kv);
                            if (!k2) goto fail;
                            kv = k2;
                        }
                        kv[nkv++] = (kv_t){ed->rule, ed->to};
                    }
                }
            }
            qsort(kv, nkv, sizeof *kv, kvcmp);
            for (size_t i = 0; i < nkv;) {
                size_t j = i;
                int ns = 0;
                while (j < nkv && kv[j].key == kv[i].key) seeds[ns++] = kv[j++].to;
                int k = closure(nfa, d, seeds, ns);
                int t = set_id(d, k, max_states);
                if (t < 0) {
                    why = t;
                    goto fail;
                }
                if (pass == 0) d->trans[(size_t)id * (size_t)ncls + (size_t)kv[i].key] = t;
                else {
                    if (d->nc == d->capc) {
                        int cap = d->capc ? d->capc * 2 : 64;
                        int32_t *r = realloc(d->crule, (size_t)cap * sizeof *r);
                        if (r) d->crule = r;
                        int32_t *tt = realloc(d->cto, (size_t)cap * sizeof *tt);
                        if (tt) d->cto = tt;
                        if (!r || !tt) goto fail;
                        d->capc = cap;
                    }
                    d->crule[d->nc] = kv[i].key;
                    d->cto[d->nc++] = t;
                }
                i = j;
            }
        }
    }
    d->coff[d->n] = d->nc;
    free(kv);
    free(seeds);
    /* the construction's scratch (sized by the whole NFA) goes now: grammar_build keeps one DFA
     * a rule, and rules x NFA states would add up */
    free(d->mark);
    free(d->stk);
    free(d->tmp);
    free(d->sets);
    free(d->map);
    d->mark = NULL;
    d->stk = d->tmp = d->sets = d->map = NULL;
    return 0;
fail:
    free(kv);
    free(seeds);
    dfa_free(d);
    return why;
}

/* ---- products of call-free fragments (number bounds, keys other than the declared ones) ---- */

#define PAIRS_MAX (1 << 20)

/* pairs (x, y) of states of two DFAs (y -1: past b's end), numbered as first reached */
typedef struct {
    int32_t *qa, *qb; /* pair i */
    int32_t *tab;     /* open addressing -> pair, -1 empty */
    uint32_t mask;
    int n, cap;
} pairs;

static uint32_t pair_hash(int32_t x, int32_t y) { return ((uint32_t)x * 2654435761u) ^ ((uint32_t)(y + 1) * 40503u + 0x9e3779b9u); }

static int pair_find(const pairs *p, int32_t x, int32_t y) {
    for (uint32_t i = pair_hash(x, y) & p->mask;; i = (i + 1) & p->mask) {
        int32_t k = p->tab[i];
        if (k < 0) return -1;
        if (p->qa[k] == x && p->qb[k] == y) return k;
    }
}

/* the number of (x, y), added when new; -1 out of memory, -2 over PAIRS_MAX */
static int pair_id(pairs *p, int32_t x, int32_t y) {
    if (p->tab) {
        int k = pair_find(p, x, y);
        if (k >= 0) return k;
    }
    if (p->n >= PAIRS_MAX) return -2;
    if (!p->tab || (uint32_t)p->n * 2 >= p->mask) { /* grow the table (and rehash) */
        uint32_t size = p->tab ? (p->mask + 1) * 2 : 1024;
        int32_t *t = malloc(size * sizeof *t);
        if (!t) return -1;
        memset(t, 0xff, size * sizeof *t);
        for (int k = 0; k < p->n; k++) {
            uint32_t i = pair_hash(p->qa[k], p->qb[k]) & (size - 1);
            while (t[i] >= 0) i = (i + 1) & (size - 1);
            t[i] = k;
        }
        free(p->tab);
        p->tab = t;
        p->mask = size - 1;
    }
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 512;
        int32_t *a = realloc(p->qa, (size_t)cap * sizeof *a);
        if (a) p->qa = a;
        int32_t *b = realloc(p->qb, (size_t)cap * sizeof *b);
        if (b) p->qb = b;
        if (!a || !b) return -1;
        p->cap = cap;
    }
    uint32_t i = pair_hash(x, y) & p->mask;
    while (p->tab[i] >= 0) i = (i + 1) & p->mask;
    p->tab[i] = p->n;
    p->qa[p->n] = x;
    p->qb[p->n] = y;
    return p->n++;
}

g_frag f_product(g_nfa *n, g_frag a, g_frag b, int mode) {
    if (n->failed) return f_none();
    if (a.s < 0) return f_none();
    if (b.s < 0) {
        if (mode == 1) return a;
        return f_none();
    }
    uint8_t cls[256];
    for (int i = 0; i < 256; i++) cls[i] = (uint8_t)i;
    dfa_t da, db;
    int why = dfa_subset(n, a.s, a.e, cls, 256, 1 << 16, &da);
    if (!why && (why = dfa_subset(n, b.s, b.e, cls, 256, 1 << 16, &db))) dfa_free(&da);
    if (why) {
        nfa_fail(n, why == -2 ? "too large (a part of over 65536 automaton states intersected with another: a length bound, a pattern, a "
                                "format)"
                              : "out of memory");
        return f_none();
    }
    g_frag out = f_none();
    /* the pairs reached, numbered in a hash table (a table of every pair would be da.n x db.n) */
    pairs pt = {0};
    int32_t *st = NULL;
    if (pair_id(&pt, 0, 0) < 0) { nfa_fail(n, "out of memory"); goto done; }
    int any_final = 0;
    for (int i = 0; i < pt.n; i++) {
        int x = pt.qa[i], y = pt.qb[i];
        for (int c = 0; c < 256; c++) {
            int x2 = da.trans[(size_t)x * 256 + (size_t)c];
            if (x2 < 0) continue;
            int y2 = y < 0 ? -1 : db.trans[(size_t)y * 256 + (size_t)c];
            if (mode == 0 && y2 < 0) continue;
            int r = pair_id(&pt, x2, y2);
            if (r < 0) {
                nfa_fail(n, r == -2 ? "too large (an intersection of over 1048576 states: a length bound, a pattern, a format)"
                                    : "out of memory");
                goto done;
            }
        }
    }
    int np2 = pt.n;
    int32_t *qa = pt.qa, *qb = pt.qb;
    st = malloc((size_t)np2 * sizeof *st);
    if (!st) { nfa_fail(n, "out of memory"); goto done; }
    for (int i = 0; i < np2; i++) {
        int acc = da.final[qa[i]] && (mode == 0 ? (qb[i] >= 0 && db.final[qb[i]]) : !(qb[i] >= 0 && db.final[qb[i]]));
        any_final |= acc;
    }
    if (!any_final) goto done;
    for (int i = 0; i < np2; i++) st[i] = nfa_state(n);
    int e = nfa_state(n);
    if (e < 0) goto done;
    for (int i = 0; i < np2; i++) {
        int x = qa[i], y = qb[i];
        int run_to = -1, run_lo = 0;
        for (int c = 0; c <= 256; c++) {
            int to = -1;
            if (c < 256) {
                int x2 = da.trans[(size_t)x * 256 + (size_t)c];
                if (x2 >= 0) {
                    int y2 = y < 0 ? -1 : db.trans[(size_t)y * 256 + (size_t)c];
                    if (!(mode == 0 && y2 < 0)) to = pair_find(&pt, x2, y2);
                }
            }
            if (to != run_to) {
                if (run_to >= 0) nfa_edge(n, st[i], E_BYTE, run_lo, c - 1, st[run_to], -1);
                run_to = to;
                run_lo = c;
            }
        }
        int acc = da.final[x] && (mode == 0 ? (y >= 0 && db.final[y]) : !(y >= 0 && db.final[y]));
        if (acc) nfa_edge(n, st[i], E_EPS, 0, 0, e, -1);
    }
    out = (g_frag){st[0], e};
done:
    free(pt.qa);
    free(pt.qb);
    free(pt.tab);
    free(st);
    dfa_free(&da);
    dfa_free(&db);
    return out;
}

/* ---- the grammar: every rule's DFA in one table ---- */

void m3_grammar_free(m3_grammar *g) {
    if (!g) return;
    free(g->trans);
    free(g->flags);
    free(g->call_off);
    free(g->call_rule);
    free(g->call_ret);
    free(g->rule_start);
    free(g->rule_of);
    free(g->rule_called);
    free(g->dist);
    free(g);
}

int m3_grammar_n_states(const m3_grammar *g) { return g->n; }
int m3_grammar_n_rules(const m3_grammar *g) { return g->nrules; }

/* the automaton outgrew the caller's max_states (m3_err.over_limit: a served limit, not a fault of the text) */
static void too_large(m3_err *err, const g_nfa *nfa, int max_states) {
    m3_errf(err, "%s: too large (more than %d automaton states)", nfa_what(nfa), max_states);
    if (err) err->over_limit = 1;
}

m3_grammar *grammar_build(g_nfa *nfa, int root, int max_depth, int max_states, m3_err *err) {
    if (nfa->failed) return NULL;
    /* byte classes: the intervals between all edge boundaries */
    uint8_t cut[257] = {0};
    for (int i = 0; i < nfa->ned; i++)
        if (nfa->ed[i].kind == E_BYTE) {
            cut[nfa->ed[i].lo] = 1;
            cut[nfa->ed[i].hi + 1] = 1;
        }
    uint8_t cls[256];
    int ncls = 0;
    for (int b = 0; b < 256; b++) {
        if (b > 0 && cut[b]) ncls++;
        cls[b] = (uint8_t)ncls;
    }
    ncls++;
    int nr = nfa->nrules;
    dfa_t *d = calloc((size_t)nr, sizeof *d);
    int32_t *base = calloc((size_t)nr + 1, sizeof *base);
    m3_grammar *g = NULL;
    int32_t *trans = NULL, *coff = NULL, *crule = NULL, *cret = NULL, *dist = NULL, *ruleof = NULL, *newid = NULL, *queue = NULL;
    uint8_t *fin = NULL;
    if (!d || !base) { m3_errf(err, "%s: out of memory", nfa_what(nfa)); goto fail; }
    int total = 0;
    for (int r = 0; r < nr; r++) {
        base[r] = total;
        if (nfa->rstart[r] < 0) continue;
        int why = dfa_subset(nfa, nfa->rstart[r], nfa->rend[r], cls, ncls, max_states - total, &d[r]);
        if (why) {
            if (why == -2) too_large(err, nfa, max_states);
            else m3_errf(err, "%s: out of memory", nfa_what(nfa));
            goto fail;
        }
        total += d[r].n;
        if (total > max_states) { too_large(err, nfa, max_states); goto fail; }
    }
    base[nr] = total;
    int ncall = 0;
    for (int r = 0; r < nr; r++) ncall += d[r].nc;
    trans = malloc((size_t)total * (size_t)ncls * sizeof *trans);
    fin = calloc((size_t)total, 1);
    coff = malloc(((size_t)total + 1) * sizeof *coff);
    crule = malloc(((size_t)ncall + 1) * sizeof *crule);
    cret = malloc(((size_t)ncall + 1) * sizeof *cret);
    dist = malloc(((size_t)total + 1) * sizeof *dist);
    ruleof = malloc(((size_t)total + 1) * sizeof *ruleof);
    newid = malloc(((size_t)total + 1) * sizeof *newid);
    queue = malloc(((size_t)total + 1) * sizeof *queue);
    if (!trans || !fin || !coff || !crule || !cret || !dist || !ruleof || !newid || !queue) {
        m3_errf(err, "%s: out of memory", nfa_what(nfa));
        goto fail;
    }
    int nc = 0;
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < d[r].n; i++) {
            int q = base[r] + i;
            ruleof[q] = r;
            fin[q] = d[r].final[i];
            for (int c = 0; c < ncls; c++) {
                int t = d[r].trans[(size_t)i * (size_t)ncls + (size_t)c];
                trans[(size_t)q * (size_t)ncls + (size_t)c] = t < 0 ? -1 : base[r] + t;
            }
            coff[q] = nc;
            for (int k = d[r].coff[i]; k < d[r].coff[i + 1]; k++) {
                crule[nc] = d[r].crule[k];
                cret[nc++] = base[r] + d[r].cto[k];
            }
        }
    coff[total] = nc;
    /* fewest bytes to each rule's end (calls cost their rule's fewest): sweeps until stable */
    for (int q = 0; q < total; q++) dist[q] = fin[q] ? 0 : G_INF;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int q = total - 1; q >= 0; q--) {
            int32_t best = dist[q];
            for (int c = 0; c < ncls; c++) {
                int t = trans[(size_t)q * (size_t)ncls + (size_t)c];
                if (t >= 0 && dist[t] + 1 < best) best = dist[t] + 1;
            }
            for (int k = coff[q]; k < coff[q + 1]; k++) {
                int R = crule[k];
                if (d[R].n == 0) continue;
                int32_t v = dist[base[R]] + dist[cret[k]];
                if (v < best) best = v;
            }
            if (best < dist[q]) {
                dist[q] = best;
                changed = 1;
            }
        }
    }
    if (d[root].n == 0 || dist[base[root]] >= G_INF) {
        m3_errf(err, "%s: %s", nfa_what(nfa), nfa->what ? "no output can match it" : "no document satisfies the schema");
        goto fail;
    }
    /* keep the states reachable from the root's start through productive states */
    for (int q = 0; q < total; q++) newid[q] = -1;
    int nq = 0, head = 0;
    newid[base[root]] = 0;
    queue[nq++] = base[root];
    while (head < nq) {
        int q = queue[head++];
        for (int c = 0; c < ncls; c++) {
            int t = trans[(size_t)q * (size_t)ncls + (size_t)c];
            if (t >= 0 && dist[t] < G_INF && newid[t] < 0) {
                newid[t] = nq;
                queue[nq++] = t;
            }
        }
        for (int k = coff[q]; k < coff[q + 1]; k++) {
            int R = crule[k];
            if (d[R].n == 0 || dist[base[R]] >= G_INF || dist[cret[k]] >= G_INF) continue;
            int ts[2] = {base[R], cret[k]};
            for (int j = 0; j < 2; j++)
                if (newid[ts[j]] < 0) {
                    newid[ts[j]] = nq;
                    queue[nq++] = ts[j];
                }
        }
    }
    g = calloc(1, sizeof *g);
    if (!g) { m3_errf(err, "%s: out of memory", nfa_what(nfa)); goto fail; }
    g->n = nq;
    g->ncls = ncls;
    memcpy(g->cls, cls, 256);
    g->nrules = nr;
    g->max_depth = max_depth;
    g->trans = malloc((size_t)nq * (size_t)ncls * sizeof *g->trans);
    g->flags = calloc((size_t)nq, 1);
    g->call_off = malloc(((size_t)nq + 1) * sizeof *g->call_off);
    g->call_rule = malloc(((size_t)ncall + 1) * sizeof *g->call_rule);
    g->call_ret = malloc(((size_t)ncall + 1) * sizeof *g->call_ret);
    g->rule_start = malloc((size_t)nr * sizeof *g->rule_start);
    g->rule_of = malloc((size_t)nq * sizeof *g->rule_of);
    g->rule_called = calloc((size_t)nr, 1);
    g->dist = malloc((size_t)nq * sizeof *g->dist);
    if (!g->trans || !g->flags || !g->call_off || !g->call_rule || !g->call_ret || !g->rule_start || !g->rule_of ||
        !g->rule_called || !g->dist) {
        m3_errf(err, "%s: out of memory", nfa_what(nfa));
        goto fail;
    }
    for (int r = 0; r < nr; r++) g->rule_start[r] = d[r].n ? newid[base[r]] : -1;
    int gc = 0;
    for (int i = 0; i < nq; i++) {
        int q = queue[i];
        uint8_t fl = fin[q] ? G_FINAL : 0;
        for (int c = 0; c < ncls; c++) {
            int t = trans[(size_t)q * (size_t)ncls + (size_t)c];
            int nt = t >= 0 && dist[t] < G_INF ? newid[t] : -1;
            g->trans[(size_t)i * (size_t)ncls + (size_t)c] = nt;
            if (nt >= 0) fl |= G_BYTES;
        }
        g->call_off[i] = gc;
        for (int k = coff[q]; k < coff[q + 1]; k++) {
            int R = crule[k];
            if (d[R].n == 0 || dist[base[R]] >= G_INF || dist[cret[k]] >= G_INF) continue;
            g->call_rule[gc] = R;
            g->call_ret[gc++] = newid[cret[k]];
            g->rule_called[R] = 1;
            fl |= G_CALLS;
        }
        g->flags[i] = fl;
        g->rule_of[i] = ruleof[q];
        g->dist[i] = dist[q];
    }
    g->call_off[nq] = gc;
    /* left recursion: a rule that reaches a call of itself without consuming a byte would stack
     * frames without end; refuse it (a $ref cycle through nullable parts) */
    {
        uint8_t *color = calloc((size_t)nr, 1);
        int32_t *rs = malloc(((size_t)nr + 1) * sizeof *rs), *rit = malloc(((size_t)nr + 1) * sizeof *rit);
        uint32_t *seen = calloc((size_t)nq, sizeof *seen);
        int32_t *st = malloc(((size_t)nq + 1) * sizeof *st);
        int32_t *firsts = malloc(((size_t)nr * (size_t)nr + 1) * sizeof *firsts);
        int *nf = calloc((size_t)nr, sizeof *nf);
        int bad = -1;
        if (!color || !rs || !rit || !seen || !st || !firsts || !nf) {
            m3_errf(err, "%s: out of memory", nfa_what(nfa));
            bad = -2;
        }
        for (int r = 0; bad == -1 && r < nr; r++) { /* the rules r can call before any byte */
            if (g->rule_start[r] < 0) continue;
            int sp = 0;
            st[sp++] = g->rule_start[r];
            seen[g->rule_start[r]] = (uint32_t)r + 1;
            while (sp) {
                int q = st[--sp];
                for (int k = g->call_off[q]; k < g->call_off[q + 1]; k++) {
                    int R = g->call_rule[k], dup = 0;
                    for (int j = 0; j < nf[r]; j++) dup |= firsts[(size_t)r * (size_t)nr + (size_t)j] == R;
                    if (!dup) firsts[(size_t)r * (size_t)nr + (size_t)nf[r]++] = R;
                    if (g->dist[g->rule_start[R]] == 0 && seen[g->call_ret[k]] != (uint32_t)r + 1) {
                        seen[g->call_ret[k]] = (uint32_t)r + 1;
                        st[sp++] = g->call_ret[k];
                    }
                }
            }
        }
        for (int r0 = 0; bad == -1 && r0 < nr; r0++) { /* a cycle in that graph (iterative DFS) */
            if (color[r0]) continue;
            int sp = 0;
            rs[sp] = r0;
            rit[sp++] = 0;
            color[r0] = 1;
            while (sp && bad == -1) {
                int r = rs[sp - 1];
                if (rit[sp - 1] < nf[r]) {
                    int R = firsts[(size_t)r * (size_t)nr + (size_t)rit[sp - 1]++];
                    if (color[R] == 1) bad = R;
                    else if (!color[R]) {
                        color[R] = 1;
                        rs[sp] = R;
                        rit[sp++] = 0;
                    }
                } else {
                    color[r] = 2;
                    sp--;
                }
            }
        }
        free(color);
        free(rs);
        free(rit);
        free(seen);
        free(st);
        free(firsts);
        free(nf);
        if (bad >= 0)
            m3_errf(err, "%s: left-recursive %s (it reaches itself before any byte)", nfa_what(nfa), nfa->what ? "rule" : "$ref");
        if (bad != -1) goto fail;
    }
    for (int r = 0; r < nr; r++) dfa_free(&d[r]);
    free(d);
    free(base);
    free(trans);
    free(fin);
    free(coff);
    free(crule);
    free(cret);
    free(dist);
    free(ruleof);
    free(newid);
    free(queue);
    return g;
fail:
    if (d)
        for (int r = 0; r < nr; r++) dfa_free(&d[r]);
    free(d);
    free(base);
    free(trans);
    free(fin);
    free(coff);
    free(crule);
    free(cret);
    free(dist);
    free(ruleof);
    free(newid);
    free(queue);
    m3_grammar_free(g);
    return NULL;
}
