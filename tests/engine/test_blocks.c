/* Block manager (src/kv/blocks.h): accounting under random workloads, prefix sharing,
 * extra keys, LRU eviction, exhaustion, and an end-to-end prefix-cache hit on m3-tiny whose
 * logits must equal a from-scratch prefill bitwise.
 * Usage: test_blocks [CHECKPOINT_DIR (default tests/data/m3-tiny)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "kv/blocks.h"
#include "model/m3.h"

#include "../check.h"

/* a pool without a model: only the page geometry matters for the manager */
static int make_kv(m3_kv *kv, int page, int n_pages) {
    m3_config c;
    memset(&c, 0, sizeof c);
    uint8_t sparse[1] = {0};
    c.n_layers = 1;
    c.n_kv_heads = 1;
    c.head_dim = 16;
    c.index_dim = 16;
    c.layer_sparse = sparse;
    m3_err err;
    if (m3_kv_create(kv, &c, M3_KV_F32, M3_KV_F32, page, n_pages, &err)) {
        fprintf(stderr, "kv: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int rnd(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }

/* ---------------- random workload ---------------- */

#define MAXS 12
#define MAXT 400
typedef struct {
    int live;
    m3_blocks_seq s;
    int32_t tok[MAXT];
    uint64_t extra[MAXT];
    uint64_t ident[MAXT]; /* identity of the prefix [0, pos]: what a correct cache entry at pos holds */
    int n;                /* tokens known (prompt + generated) */
    int prompt;
} rseq;

static uint64_t prefix_ident(const rseq *q, int pos, int page) {
    uint64_t h = pos ? q->ident[pos - 1] : 1469598103934665603ull;
    h ^= (uint64_t)(uint32_t)q->tok[pos] * 0x100000001b3ull + q->extra[pos / page] * 31 + 7;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

typedef struct {
    m3_kv kv;
    m3_blocks *bm;
    int page, npages;
    uint64_t *content; /* [npages][page]: shadow of what each slot holds */
    rseq seq[MAXS];
    int32_t tmpl[4][MAXT];
    uint64_t tmpl_extra[4][MAXT];
} world;

/* the step "forward": writes positions [kv.len, upto) of q, checking no shared page is written */
static void write_positions(world *w, rseq *q, int upto) {
    for (int pos = q->s.kv.len; pos < upto; pos++) {
        int p = q->s.kv.pages[pos / w->page];
        CHECK(m3_blocks_refcount(w->bm, p) == 1, "write to page %d with refcount %d (pos %d)", p,
              m3_blocks_refcount(w->bm, p), pos);
        w->content[(size_t)p * w->page + pos % w->page] = q->ident[pos];
    }
    if (upto > q->s.kv.len) q->s.kv.len = upto;
}

static void check_world(world *w, const char *what, int step) {
    m3_err err;
    if (m3_blocks_check(w->bm, &err)) {
        CHECK(0, "%s step %d: %s", what, step, err.msg);
        return;
    }
    int *cnt = calloc((size_t)w->npages, sizeof *cnt);
    for (int i = 0; i < MAXS; i++) {
        if (!w->seq[i].live) continue;
        const m3_blocks_seq *s = &w->seq[i].s;
        for (int b = 0; b < s->kv.n_pages; b++) cnt[s->kv.pages[b]]++;
        CHECK(s->kv.n_pages * w->page >= s->n_tokens && s->kv.len <= s->n_tokens, "seq %d geometry", i);
        for (int pos = 0; pos < s->kv.len; pos++) {
            uint64_t got = w->content[(size_t)s->kv.pages[pos / w->page] * w->page + pos % w->page];
            if (got != w->seq[i].ident[pos]) {
                CHECK(0, "%s step %d: seq %d pos %d holds wrong content", what, step, i, pos);
                break;
            }
        }
    }
    int used = 0;
    for (int p = 0; p < w->npages; p++) {
        if (cnt[p] != m3_blocks_refcount(w->bm, p)) {
            CHECK(0, "%s step %d: page %d refcount %d, page tables hold it %d times", what, step, p,
                  m3_blocks_refcount(w->bm, p), cnt[p]);
            break;
        }
        used += cnt[p] > 0;
    }
    m3_blocks_stats st;
    m3_blocks_get_stats(w->bm, &st);
    CHECK(st.used == used && st.used + st.free + st.cached == st.total, "%s step %d: used %d (%d) free %d cached %d total %d",
          what, step, st.used, used, st.free, st.cached, st.total);
    CHECK(w->kv.n_free == 0, "kv pool handed pages out behind the manager");
    free(cnt);
}

static void preempt_one(world *w, uint64_t *r, int except) {
    int cand[MAXS], nc = 0;
    for (int i = 0; i < MAXS; i++)
        if (w->seq[i].live && i != except) cand[nc++] = i;
    if (!nc) return;
    int v = cand[rnd(r, nc)];
    m3_blocks_free(w->bm, &w->seq[v].s);
    w->seq[v].live = 0;
}

/* hit tokens per seed, to compare runs with full and colliding hashes */
static uint64_t seed_hits[1000];

static int random_workload(uint64_t seed, int ops, int bits) {
    uint64_t r = seed * 7919 + 1;
    world *w = calloc(1, sizeof *w);
    w->page = 1 + rnd(&r, 8);
    w->npages = 8 + rnd(&r, 56);
    if (make_kv(&w->kv, w->page, w->npages)) return -1;
    m3_err err;
    w->bm = m3_blocks_create(&w->kv, &err);
    if (!w->bm) { fprintf(stderr, "%s\n", err.msg); return -1; }
    CHECK(!m3_blocks_debug_hash_bits(w->bm, bits, &err), "%s", err.msg);
    w->content = calloc((size_t)w->npages * w->page, sizeof *w->content);
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < MAXT; i++) {
            w->tmpl[t][i] = rnd(&r, 3) ? t * 10 + (i % 5) : rnd(&r, 50);
            w->tmpl_extra[t][i] = rnd(&r, 6) == 0 ? (uint64_t)rnd(&r, 3) : 0;
        }
    int cap_tokens = w->npages * w->page;
    for (int step = 0; step < ops; step++) {
        int op = rnd(&r, 10), i = rnd(&r, MAXS);
        rseq *q = &w->seq[i];
        if (op < 3 && !q->live) { /* admit a prompt: a template prefix, then maybe random tokens */
            int t = rnd(&r, 4), n = 1 + rnd(&r, cap_tokens < MAXT / 2 ? cap_tokens : MAXT / 2);
            int keep = rnd(&r, n + 1);
            for (int k = 0; k < n; k++) q->tok[k] = k < keep ? w->tmpl[t][k] : rnd(&r, 50);
            for (int b = 0; b < MAXT; b++) q->extra[b] = b * w->page < keep ? w->tmpl_extra[t][b] : (uint64_t)rnd(&r, 2);
            q->n = q->prompt = n;
            for (int k = 0; k < n; k++) q->ident[k] = prefix_ident(q, k, w->page);
            memset(&q->s, 0, sizeof q->s);
            int hit = m3_blocks_admit(w->bm, &q->s, q->tok, n, q->extra, MAXT, &err);
            CHECK(hit >= 0 && hit < n && hit % w->page == 0, "admit returned %d for %d tokens", hit, n);
            q->live = 1;
        } else if (op < 8 && q->live) { /* one scheduler step for q: a prefill chunk or a decode token */
            int chunk;
            if (q->s.kv.len < q->prompt) chunk = 1 + rnd(&r, q->prompt - q->s.kv.len);
            else {
                if (q->n >= MAXT || q->n >= cap_tokens) { m3_blocks_free(w->bm, &q->s); q->live = 0; goto checked; }
                q->tok[q->n] = rnd(&r, 3) ? q->tok[q->n - 1] : rnd(&r, 50);
                q->ident[q->n] = prefix_ident(q, q->n, w->page);
                q->n++;
                chunk = 1;
            }
            int can = m3_blocks_can_allocate(w->bm, &q->s, chunk);
            int rc = m3_blocks_allocate(w->bm, &q->s, chunk, &err);
            CHECK((rc == 0) == (can != 0), "can_allocate %d but allocate %d", can, rc);
            while (rc == M3_BLOCKS_EXHAUSTED) { /* preempt others; if none, preempt q itself */
                int others = 0;
                for (int k = 0; k < MAXS; k++) others += w->seq[k].live && k != i;
                if (!others) break;
                preempt_one(w, &r, i);
                rc = m3_blocks_allocate(w->bm, &q->s, chunk, &err);
            }
            if (rc) { /* only when q is alone: a sequence that fits the pool must always get its blocks */
                CHECK(0, "allocate failed with nobody left to preempt (rc %d): %s", rc, err.msg);
                m3_blocks_free(w->bm, &q->s);
                q->live = 0;
            } else {
                write_positions(w, q, q->s.n_tokens);
                CHECK(!m3_blocks_commit(w->bm, &q->s, q->tok, q->s.kv.len, q->extra, MAXT, &err), "commit: %s", err.msg);
            }
        } else if (op == 8 && q->live) {
            m3_blocks_free(w->bm, &q->s);
            q->live = 0;
        } else if (op == 9 && rnd(&r, 20) == 0) {
            m3_blocks_reset_cache(w->bm);
        }
    checked:
        check_world(w, "random", step);
        if (failures) break;
    }
    for (int i = 0; i < MAXS; i++)
        if (w->seq[i].live) { m3_blocks_free(w->bm, &w->seq[i].s); w->seq[i].live = 0; }
    check_world(w, "drained", ops);
    m3_blocks_stats st;
    m3_blocks_get_stats(w->bm, &st);
    CHECK(st.used == 0 && st.free + st.cached == st.total, "after drain: used %d free %d cached %d", st.used, st.free, st.cached);
    CHECK(st.hashed == st.cached, "hashed %d cached %d", st.hashed, st.cached);
    m3_blocks_reset_cache(w->bm);
    m3_blocks_get_stats(w->bm, &st);
    CHECK(st.free == st.total && st.hashed == 0, "after reset: free %d of %d, hashed %d", st.free, st.total, st.hashed);
    if (bits == 64) seed_hits[seed] = st.hit_tokens;
    else CHECK(seed_hits[seed] == st.hit_tokens, "seed %llu: %d-bit hashes hit %llu tokens, 64-bit %llu",
               (unsigned long long)seed, bits, (unsigned long long)st.hit_tokens, (unsigned long long)seed_hits[seed]);
    if (bits != 64) goto done;
    static uint64_t tot_hit, tot_q, tot_ev;
    tot_hit += st.hit_tokens; tot_q += st.query_tokens; tot_ev += st.evictions;
    if (seed == 0 || seed % 50 == 49)
        printf("  seeds..%llu: prefix hits %llu / %llu prompt tokens, %llu evictions so far\n", (unsigned long long)seed,
               (unsigned long long)tot_hit, (unsigned long long)tot_q, (unsigned long long)tot_ev);
done:
    m3_blocks_destroy(w->bm);
    CHECK(w->kv.n_free == w->kv.n_pages, "destroy gave back %d of %d pages", w->kv.n_free, w->kv.n_pages);
    m3_kv_destroy(&w->kv);
    free(w->content);
    free(w);
    return 0;
}

/* ---------------- targeted tests ---------------- */

/* admit + allocate the rest + "write" + commit */
static int prefill(m3_blocks *bm, m3_blocks_seq *s, const int32_t *tok, int n, const uint64_t *extra, int n_extra) {
    m3_err err;
    int hit = m3_blocks_admit(bm, s, tok, n, extra, n_extra, &err);
    if (hit < 0) { CHECK(0, "admit: %s", err.msg); return -1; }
    int rc = m3_blocks_allocate(bm, s, n - hit, &err);
    if (rc) return rc;
    s->kv.len = n;
    CHECK(!m3_blocks_commit(bm, s, tok, n, extra, n_extra, &err), "commit: %s", err.msg);
    return hit;
}

static void test_sharing(void) {
    const int P = 4;
    m3_kv kv;
    if (make_kv(&kv, P, 32)) { failures++; return; }
    m3_err err;
    m3_blocks *bm = m3_blocks_create(&kv, &err);
    int32_t a[19], b[19];
    for (int i = 0; i < 19; i++) a[i] = b[i] = 100 + i;
    b[13] = 7; /* differs in block 3 (positions 12..15) */
    m3_blocks_seq sa = {0}, sb = {0}, sc = {0}, sd = {0}, se = {0};
    CHECK(prefill(bm, &sa, a, 19, NULL, 0) == 0, "first prompt hits nothing");
    CHECK(sa.kv.n_pages == 5, "19 tokens in 5 pages");
    m3_blocks_stats st;
    m3_blocks_get_stats(bm, &st);
    CHECK(st.hashed == 4 && st.used == 5, "4 full blocks cached, 5 used (hashed %d used %d)", st.hashed, st.used);
    /* b shares blocks 0..2 (12 tokens), not block 3 */
    int hb = prefill(bm, &sb, b, 19, NULL, 0);
    CHECK(hb == 12, "common prefix of 13 tokens shares 3 full blocks = 12 tokens (got %d)", hb);
    for (int i = 0; i < 3; i++) CHECK(sb.kv.pages[i] == sa.kv.pages[i], "block %d shared", i);
    for (int i = 3; i < 5; i++) CHECK(sb.kv.pages[i] != sa.kv.pages[i], "block %d private", i);
    for (int i = 0; i < 3; i++) CHECK(m3_blocks_refcount(bm, sa.kv.pages[i]) == 2, "refcount 2");
    /* same tokens, different extra key in block 1: shares block 0 only */
    uint64_t ex[5] = {0, 42, 0, 0, 0};
    int hc = prefill(bm, &sc, a, 19, ex, 5);
    CHECK(hc == 4, "extra key separates block 1 (hit %d)", hc);
    /* a prompt equal to a's first 16 tokens: whole prompt cached, but only 12 reused (one recomputed) */
    int hd = m3_blocks_admit(bm, &sd, a, 16, NULL, 0, &err);
    CHECK(hd == 12, "never the whole prompt: 16-token prompt reuses 12 (got %d)", hd);
    CHECK(m3_blocks_allocate(bm, &sd, 4, &err) == 0 && sd.kv.n_pages == 4 && sd.kv.pages[3] != sa.kv.pages[3],
          "the recomputed block is private");
    /* 17 tokens: 4 blocks reusable */
    int he = m3_blocks_admit(bm, &se, a, 17, NULL, 0, &err);
    CHECK(he == 16, "17-token prompt reuses 16 (got %d)", he);
    m3_blocks_get_stats(bm, &st);
    CHECK(st.query_tokens == 19 * 3 + 16 + 17 && st.hit_tokens == 12 + 4 + 12 + 16, "hit counters %llu / %llu",
          (unsigned long long)st.hit_tokens, (unsigned long long)st.query_tokens);
    /* a duplicate computed concurrently stays private and goes to the free list */
    m3_blocks_seq sf = {0};
    CHECK(m3_blocks_allocate(bm, &sf, 8, &err) == 0, "allocate without admit");
    sf.kv.len = 8;
    m3_blocks_commit(bm, &sf, a, 8, NULL, 0, &err);
    m3_blocks_stats st2;
    m3_blocks_get_stats(bm, &st2);
    CHECK(st2.hashed == st.hashed, "duplicate blocks are not hashed twice (%d vs %d)", st2.hashed, st.hashed);
    m3_blocks_free(bm, &sf);
    m3_blocks_get_stats(bm, &st2);
    CHECK(st2.free == st.free, "duplicates return to the free list (%d vs %d)", st2.free, st.free);
    m3_blocks_free(bm, &sa);
    m3_blocks_free(bm, &sb);
    m3_blocks_free(bm, &sc);
    m3_blocks_free(bm, &sd);
    m3_blocks_free(bm, &se);
    CHECK(!m3_blocks_check(bm, &err), "%s", err.msg);
    m3_blocks_get_stats(bm, &st);
    CHECK(st.used == 0 && st.cached == st.hashed && st.free + st.cached == 32, "all freed: free %d cached %d", st.free,
          st.cached);
    /* freed blocks keep their contents: a re-admit still hits */
    m3_blocks_seq sg = {0};
    CHECK(m3_blocks_admit(bm, &sg, b, 19, NULL, 0, &err) == 16, "b's 4 cached blocks survive its free");
    m3_blocks_free(bm, &sg);
    m3_blocks_destroy(bm);
    m3_kv_destroy(&kv);
}

static void test_lru_and_exhaustion(void) {
    const int P = 2, N = 6;
    m3_kv kv;
    if (make_kv(&kv, P, N)) { failures++; return; }
    m3_err err;
    m3_blocks *bm = m3_blocks_create(&kv, &err);
    /* three 1-block prompts (3 tokens each: one full block cached + one partial) */
    int32_t p[3][3] = {{1, 2, 9}, {3, 4, 9}, {5, 6, 9}};
    m3_blocks_seq s[3];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 3; i++) CHECK(prefill(bm, &s[i], p[i], 3, NULL, 0) == 0, "cold");
    m3_blocks_seq x = {0};
    CHECK(!m3_blocks_can_allocate(bm, &x, 1), "pool of 6 is full");
    CHECK(m3_blocks_allocate(bm, &x, 1, &err) == M3_BLOCKS_EXHAUSTED, "exhaustion reported");
    CHECK(strstr(err.msg, "exhausted") != NULL, "message: %s", err.msg);
    CHECK(x.kv.n_pages == 0 && x.n_tokens == 0, "failed allocate leaves the sequence unchanged");
    CHECK(m3_blocks_allocate(bm, &x, N * P + 1, &err) == -1, "longer than the whole pool is an error, not exhaustion");
    /* free in order 1, 0, 2: cached LRU order is then 1, 0, 2 (full blocks), partial ones free */
    int order[3] = {1, 0, 2};
    int full_page[3];
    for (int i = 0; i < 3; i++) full_page[i] = s[i].kv.pages[0];
    for (int k = 0; k < 3; k++) m3_blocks_free(bm, &s[order[k]]);
    m3_blocks_stats st;
    m3_blocks_get_stats(bm, &st);
    CHECK(st.free == 3 && st.cached == 3, "free %d cached %d", st.free, st.cached);
    /* a hit on prompt 1 moves its block out of the LRU (and back to the tail when freed) */
    m3_blocks_seq h = {0};
    CHECK(m3_blocks_admit(bm, &h, p[1], 3, NULL, 0, &err) == 2, "prompt 1 still cached");
    m3_blocks_free(bm, &h); /* LRU now: 0, 2, 1 */
    /* take the 3 free pages, then each further page evicts in LRU order 0, 2, 1 */
    m3_blocks_seq y = {0};
    CHECK(m3_blocks_allocate(bm, &y, 3 * P, &err) == 0, "free pages first");
    m3_blocks_get_stats(bm, &st);
    CHECK(st.evictions == 0 && st.cached == 3, "no eviction while free pages remain");
    int want[3] = {full_page[0], full_page[2], full_page[1]};
    for (int k = 0; k < 3; k++) {
        CHECK(m3_blocks_allocate(bm, &y, P, &err) == 0, "evicting allocate");
        CHECK(y.kv.pages[3 + k] == want[k], "eviction %d took page %d, LRU says %d", k, y.kv.pages[3 + k], want[k]);
    }
    m3_blocks_get_stats(bm, &st);
    CHECK(st.evictions == 3 && st.hashed == 0 && st.used == N, "evictions %llu hashed %d used %d",
          (unsigned long long)st.evictions, st.hashed, st.used);
    m3_blocks_seq z = {0};
    CHECK(m3_blocks_admit(bm, &z, p[0], 3, NULL, 0, &err) == 0, "evicted content is not found");
    m3_blocks_free(bm, &z);
    m3_blocks_free(bm, &y);
    CHECK(!m3_blocks_check(bm, &err), "%s", err.msg);
    /* a freed chain is evicted tail first: its head (the most shareable block) survives longest */
    int32_t ch[7] = {11, 12, 13, 14, 15, 16, 17};
    m3_blocks_seq cs = {0};
    CHECK(prefill(bm, &cs, ch, 7, NULL, 0) == 0, "chain cold");
    int head = cs.kv.pages[0], mid = cs.kv.pages[1], tail = cs.kv.pages[2];
    m3_blocks_free(bm, &cs);
    m3_blocks_seq ev = {0};
    CHECK(m3_blocks_allocate(bm, &ev, N * P, &err) == 0, "whole pool");
    CHECK(ev.kv.pages[N - 3] == tail && ev.kv.pages[N - 2] == mid && ev.kv.pages[N - 1] == head,
          "eviction order tail, middle, head (got %d %d %d, want %d %d %d)", ev.kv.pages[N - 3], ev.kv.pages[N - 2],
          ev.kv.pages[N - 1], tail, mid, head);
    m3_blocks_free(bm, &ev);
    /* misuse is reported */
    m3_blocks_seq w = {0};
    CHECK(m3_blocks_admit(bm, &w, p[0], 0, NULL, 0, &err) == -1, "empty prompt rejected");
    CHECK(m3_blocks_admit(bm, &w, p[0], 3, NULL, 0, &err) == 0, "admit");
    CHECK(m3_blocks_admit(bm, &w, p[0], 3, NULL, 0, &err) == -1, "double admit rejected");
    CHECK(m3_blocks_commit(bm, &w, p[0], 3, NULL, 0, &err) == -1, "commit beyond the allocated slots rejected");
    m3_blocks_free(bm, &w);
    m3_kv kv2;
    if (!make_kv(&kv2, 2, 4)) {
        m3_kv_seq q = {0};
        m3_kv_seq_reserve(&kv2, &q, 1, &err);
        CHECK(m3_blocks_create(&kv2, &err) == NULL, "a pool in use is refused");
        m3_kv_seq_release(&kv2, &q);
        m3_kv_destroy(&kv2);
    }
    m3_blocks_destroy(bm);
    m3_kv_destroy(&kv);
}

/* ---------------- end to end on m3-tiny ---------------- */

/* forward over tokens [from, n) of s (already allocated), logits of every one into lg[n - from][V] */
static int run_rows(m3_model *m, m3_kv *kv, m3_blocks_seq *s, const int32_t *ids, int from, int n, float *lg, m3_err *err) {
    int T = n - from;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T), *sq = calloc((size_t)T, sizeof(int32_t));
    int *rows = malloc(sizeof(int) * (size_t)T);
    for (int i = 0; i < T; i++) { pos[i] = from + i; rows[i] = i; }
    m3_kv_seq *seqs[1] = {&s->kv};
    m3_batch b = {T, pos, sq, seqs};
    int rc = m3_forward(m, kv, &b, ids + from, rows, T, lg, NULL, err);
    free(pos);
    free(sq);
    free(rows);
    return rc;
}

static void test_model(const char *dir) {
    m3_err err;
    m3_ops ops;
    m3_model m;
    if (m3_cpu_ops_init(&ops, 2, &err)) { CHECK(0, "cpu ops: %s", err.msg); return; }
    if (m3_model_load(&m, dir, &ops, NULL, NULL, &err)) {
        CHECK(0, "load %s: %s", dir, err.msg);
        m3_cpu_ops_free(&ops);
        return;
    }
    const m3_config *c = &m.cfg;
    const int V = c->vocab, P = m3_kv_page_tokens(c);
    m3_kv kv;
    if (m3_kv_create(&kv, c, M3_KV_F32, M3_KV_F32, P, 64, &err)) { CHECK(0, "%s", err.msg); goto out; }
    m3_blocks *bm = m3_blocks_create(&kv, &err);
    enum { NA = 70, K = 3, NB_EXTRA = 23 };
    const int NB = K * P + NB_EXTRA;
    int32_t A[NA], *B = malloc(sizeof(int32_t) * (size_t)NB);
    uint64_t r = 12345;
    for (int i = 0; i < NA; i++) A[i] = 2 + rnd(&r, V - 2);
    for (int i = 0; i < NB; i++) B[i] = i < K * P ? A[i] : 2 + rnd(&r, V - 2);
    float *lgA = malloc(sizeof(float) * (size_t)NA * V), *lgB = malloc(sizeof(float) * (size_t)NB * V),
          *lgR = malloc(sizeof(float) * (size_t)NB * V);
    /* prompt A, cold: computed in two chunks, committed after each */
    m3_blocks_seq sa = {0}, sb = {0}, sr = {0};
    CHECK(m3_blocks_admit(bm, &sa, A, NA, NULL, 0, &err) == 0, "A is cold");
    int ok = !m3_blocks_allocate(bm, &sa, 40, &err) && !run_rows(&m, &kv, &sa, A, 0, 40, lgA, &err) &&
             !m3_blocks_commit(bm, &sa, A, sa.kv.len, NULL, 0, &err) && !m3_blocks_allocate(bm, &sa, NA - 40, &err) &&
             !run_rows(&m, &kv, &sa, A, 40, NA, lgA + (size_t)40 * V, &err) &&
             !m3_blocks_commit(bm, &sa, A, sa.kv.len, NULL, 0, &err);
    CHECK(ok, "prefill A: %s", err.msg);
    m3_blocks_stats st;
    m3_blocks_get_stats(bm, &st);
    CHECK(st.hashed == NA / P, "A's %d full blocks cached (hashed %d)", NA / P, st.hashed);
    /* prompt B = A's first K blocks + other tokens: reuses K blocks, runs only the rest */
    int hit = m3_blocks_admit(bm, &sb, B, NB, NULL, 0, &err);
    CHECK(hit == K * P, "B reuses %d tokens (got %d)", K * P, hit);
    for (int i = 0; i < K; i++) CHECK(sb.kv.pages[i] == sa.kv.pages[i], "B's block %d is A's page", i);
    ok = hit >= 0 && !m3_blocks_allocate(bm, &sb, NB - hit, &err) &&
         !run_rows(&m, &kv, &sb, B, hit, NB, lgB, &err);
    CHECK(ok, "B from cache: %s", err.msg);
    for (int i = 0; i < K; i++) CHECK(m3_blocks_refcount(bm, sa.kv.pages[i]) == 2, "shared block refcount 2");
    /* reference: B from scratch in its own pages (no admit: no cache lookup) */
    ok = !m3_blocks_allocate(bm, &sr, NB, &err) && !run_rows(&m, &kv, &sr, B, 0, NB, lgR, &err);
    CHECK(ok, "B from scratch: %s", err.msg);
    for (int i = 0; i < K; i++) CHECK(sr.kv.pages[i] != sa.kv.pages[i], "scratch run uses its own pages");
    int T = NB - hit, same = 0;
    if (hit >= 0)
        same = !memcmp(lgB, lgR + (size_t)hit * V, sizeof(float) * (size_t)T * V);
    double maxd = 0;
    for (size_t i = 0; hit >= 0 && i < (size_t)T * V; i++) {
        double d = lgB[i] - lgR[(size_t)hit * V + i];
        if (d < 0) d = -d;
        if (d > maxd) maxd = d;
    }
    CHECK(same, "logits of B's %d uncached tokens differ from a scratch prefill (max |diff| %g)", T, maxd);
    /* the first K blocks' KV entries of the scratch run equal A's, which B read */
    size_t pb = kv.page_bytes[0];
    int kv_same = 1;
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < K; i++)
            kv_same &= !memcmp(kv.base[l] + (size_t)sa.kv.pages[i] * kv.page_bytes[l],
                               kv.base[l] + (size_t)sr.kv.pages[i] * kv.page_bytes[l], kv.page_bytes[l]);
    (void)pb;
    CHECK(kv_same, "cached KV of A's prefix equals B's own");
    printf("  model: A %d tokens, B %d tokens: %d reused from A's cache, %d computed; %d logits rows bitwise %s\n", NA, NB,
           hit, T, T, same ? "equal" : "DIFFERENT");
    /* A done and freed: its blocks stay cached; B's again after B finished: same result */
    m3_blocks_free(bm, &sa);
    m3_blocks_free(bm, &sb);
    m3_blocks_free(bm, &sr);
    m3_blocks_seq sb2 = {0};
    int hit2 = m3_blocks_admit(bm, &sb2, B, NB, NULL, 0, &err);
    float *lgB2 = malloc(sizeof(float) * (size_t)(NB - hit2) * V);
    ok = hit2 == K * P && !m3_blocks_allocate(bm, &sb2, NB - hit2, &err) && !run_rows(&m, &kv, &sb2, B, hit2, NB, lgB2, &err);
    CHECK(ok && !memcmp(lgB2, lgB, sizeof(float) * (size_t)T * V), "B again from cached (freed) blocks: hit %d", hit2);
    m3_blocks_free(bm, &sb2);
    CHECK(!m3_blocks_check(bm, &err), "%s", err.msg);
    m3_blocks_get_stats(bm, &st);
    CHECK(st.used == 0, "all returned (used %d)", st.used);
    printf("  model: prefix-cache hit tokens %llu / %llu queried; blocks used %d / %d after free\n",
           (unsigned long long)st.hit_tokens, (unsigned long long)st.query_tokens, st.used, st.total);
    free(lgB2);
    free(lgA);
    free(lgB);
    free(lgR);
    free(B);
    m3_blocks_destroy(bm);
    m3_kv_destroy(&kv);
out:
    m3_model_free(&m);
    m3_cpu_ops_free(&ops);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/data/m3-tiny";
    printf("sharing\n");
    test_sharing();
    printf("lru + exhaustion\n");
    test_lru_and_exhaustion();
    const int seeds = 200, ops = 3000;
    printf("random workloads: %d seeds x %d ops\n", seeds, ops);
    for (int s = 0; s < seeds && !failures; s++) random_workload((uint64_t)s, ops, 64);
    printf("the same with colliding hashes (0 and 3 bits): identical hits, no wrong content\n");
    for (int s = 0; s < seeds && !failures; s++) random_workload((uint64_t)s, ops, s % 2 ? 0 : 3);
    printf("end to end (%s)\n", dir);
    test_model(dir);
    if (failures) { fprintf(stderr, "test_blocks: %d failure(s)\n", failures); return 1; }
    printf("test_blocks: ok\n");
    return 0;
}
