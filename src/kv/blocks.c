#include "blocks.h"
#include "../base/hash.h"

#include <stdlib.h>
#include <string.h>

struct m3_blocks {
    m3_kv *kv;
    int n, page;
    int32_t *ref;          /* [n] refcount */
    uint8_t *hashed;       /* [n] 1 when in the hash map */
    uint32_t *gen;         /* [n] bumped each time the page loses its hash */
    /* identity of a hashed page's content */
    uint64_t *hash;        /* [n] chain hash */
    int32_t *parent;       /* [n] parent page (-1: first block of a sequence) */
    uint32_t *parent_gen;  /* [n] parent's generation when this page was hashed */
    uint64_t *extra;       /* [n] extra key */
    int32_t *tokens;       /* [n][page] token ids */
    /* evictable LRU list of cached pages (refcount 0, hashed): head = least recent */
    int32_t *lprev, *lnext;
    int lhead, ltail, n_cached;
    /* free pages (refcount 0, no hash), a stack */
    int32_t *free_stack;
    int n_free;
    /* hash map: chained buckets over page ids */
    int32_t *bucket, *hnext;
    uint64_t nbucket;      /* power of two */
    int n_hashed;
    uint64_t hash_mask;    /* ~0; tests narrow it to force collisions */
    uint64_t query_tokens, hit_tokens, evictions;
};

static const uint64_t SEED = 0x6d33626c6f636b73ull; /* "m3blocks" */


static uint64_t hash_block(uint64_t parent, const int32_t *tok, int page, uint64_t extra) {
    uint64_t h = m3_mix64(parent ^ 0x9e3779b97f4a7c15ull);
    h = m3_mix64(h ^ extra);
    for (int i = 0; i < page; i++) h = m3_mix64(h + (uint32_t)tok[i] + 0x9e3779b97f4a7c15ull);
    return h;
}

static uint64_t block_hash(const m3_blocks *bm, uint64_t parent, const int32_t *tok, uint64_t extra) {
    return hash_block(parent, tok, bm->page, extra) & bm->hash_mask;
}

static uint64_t extra_of(const uint64_t *extra, int n_extra, int i) { return extra && i < n_extra ? extra[i] : 0; }

/* ---- lists and map ---- */

static void lru_remove(m3_blocks *bm, int p) {
    int a = bm->lprev[p], b = bm->lnext[p];
    if (a >= 0) bm->lnext[a] = b; else bm->lhead = b;
    if (b >= 0) bm->lprev[b] = a; else bm->ltail = a;
    bm->lprev[p] = bm->lnext[p] = -1;
    bm->n_cached--;
}

static void lru_push(m3_blocks *bm, int p) {
    bm->lprev[p] = bm->ltail;
    bm->lnext[p] = -1;
    if (bm->ltail >= 0) bm->lnext[bm->ltail] = p; else bm->lhead = p;
    bm->ltail = p;
    bm->n_cached++;
}

static void map_insert(m3_blocks *bm, int p) {
    uint64_t b = bm->hash[p] & (bm->nbucket - 1);
    bm->hnext[p] = bm->bucket[b];
    bm->bucket[b] = p;
    bm->hashed[p] = 1;
    bm->n_hashed++;
}

/* removes p from the map; its cached identity ends (children naming it stop matching) */
static void unhash(m3_blocks *bm, int p) {
    int32_t *link = &bm->bucket[bm->hash[p] & (bm->nbucket - 1)];
    while (*link != p) link = &bm->hnext[*link];
    *link = bm->hnext[p];
    bm->hnext[p] = -1;
    bm->hashed[p] = 0;
    bm->gen[p]++;
    bm->n_hashed--;
}

/* the cached page holding exactly this block (same parent instance, tokens, extra), or -1 */
static int map_find(const m3_blocks *bm, uint64_t h, int parent, uint32_t pgen, const int32_t *tok, uint64_t extra) {
    for (int p = bm->bucket[h & (bm->nbucket - 1)]; p >= 0; p = bm->hnext[p])
        if (bm->hash[p] == h && bm->parent[p] == parent && (parent < 0 || bm->parent_gen[p] == pgen) &&
            bm->extra[p] == extra && !memcmp(bm->tokens + (size_t)p * bm->page, tok, sizeof(int32_t) * (size_t)bm->page))
            return p;
    return -1;
}

/* ---- lifetime ---- */

m3_blocks *m3_blocks_create(m3_kv *kv, m3_err *err) {
    if (!kv || kv->n_pages < 1 || kv->page < 1) {
        m3_errf(err, "block manager: kv cache has no pages");
        return NULL;
    }
    if (kv->n_free != kv->n_pages) {
        m3_errf(err, "block manager: kv cache must be unused (%d of %d pages free)", kv->n_free, kv->n_pages);
        return NULL;
    }
    m3_blocks *bm = calloc(1, sizeof *bm);
    if (!bm) goto oom;
    int n = kv->n_pages;
    bm->kv = kv;
    bm->n = n;
    bm->page = kv->page;
    bm->hash_mask = ~0ull;
    bm->nbucket = 16;
    while (bm->nbucket < (uint64_t)n) bm->nbucket <<= 1;
    size_t N = (size_t)n;
    bm->ref = calloc(N, sizeof *bm->ref);
    bm->hashed = calloc(N, 1);
    bm->gen = calloc(N, sizeof *bm->gen);
    bm->hash = calloc(N, sizeof *bm->hash);
    bm->parent = calloc(N, sizeof *bm->parent);
    bm->parent_gen = calloc(N, sizeof *bm->parent_gen);
    bm->extra = calloc(N, sizeof *bm->extra);
    bm->tokens = calloc(N * (size_t)bm->page, sizeof *bm->tokens);
    bm->lprev = malloc(N * sizeof *bm->lprev);
    bm->lnext = malloc(N * sizeof *bm->lnext);
    bm->free_stack = malloc(N * sizeof *bm->free_stack);
    bm->hnext = malloc(N * sizeof *bm->hnext);
    bm->bucket = malloc(bm->nbucket * sizeof *bm->bucket);
    if (!bm->ref || !bm->hashed || !bm->gen || !bm->hash || !bm->parent || !bm->parent_gen || !bm->extra ||
        !bm->tokens || !bm->lprev || !bm->lnext || !bm->free_stack || !bm->hnext || !bm->bucket)
        goto oom;
    for (int i = 0; i < n; i++) {
        bm->lprev[i] = bm->lnext[i] = bm->hnext[i] = -1;
        bm->free_stack[i] = n - 1 - i; /* page 0 handed out first */
    }
    for (uint64_t b = 0; b < bm->nbucket; b++) bm->bucket[b] = -1;
    bm->lhead = bm->ltail = -1;
    bm->n_free = n;
    kv->n_free = 0; /* the manager owns every page now */
    return bm;
oom:
    m3_blocks_destroy(bm);
    m3_errf(err, "block manager: out of memory for %d pages", kv->n_pages);
    return NULL;
}

void m3_blocks_destroy(m3_blocks *bm) {
    if (!bm) return;
    if (bm->kv && bm->kv->n_free == 0 && bm->free_stack) { /* give the pool back */
        for (int i = 0; i < bm->kv->n_pages; i++) bm->kv->free_pages[i] = bm->kv->n_pages - 1 - i;
        bm->kv->n_free = bm->kv->n_pages;
    }
    free(bm->ref);
    free(bm->hashed);
    free(bm->gen);
    free(bm->hash);
    free(bm->parent);
    free(bm->parent_gen);
    free(bm->extra);
    free(bm->tokens);
    free(bm->lprev);
    free(bm->lnext);
    free(bm->free_stack);
    free(bm->hnext);
    free(bm->bucket);
    free(bm);
}

/* ---- sequences ---- */

/* room for nb blocks in s's page table and per-block arrays */
static int seq_grow(m3_blocks_seq *s, int nb, m3_err *err) {
    if (nb > s->kv.cap) {
        int nc = s->kv.cap ? s->kv.cap : 8;
        while (nc < nb) nc *= 2;
        int32_t *np = realloc(s->kv.pages, (size_t)nc * sizeof *np);
        if (!np) return m3_errf(err, "block manager: out of memory for a page table of %d blocks", nb);
        s->kv.pages = np;
        s->kv.cap = nc;
    }
    if (nb > s->hcap) {
        int nc = s->hcap ? s->hcap : 8;
        while (nc < nb) nc *= 2;
        uint64_t *h = realloc(s->hash, (size_t)nc * sizeof *h);
        if (h) s->hash = h;
        int32_t *rp = h ? realloc(s->ref_page, (size_t)nc * sizeof *rp) : NULL;
        if (rp) s->ref_page = rp;
        uint32_t *rg = rp ? realloc(s->ref_gen, (size_t)nc * sizeof *rg) : NULL;
        if (!rg) return m3_errf(err, "block manager: out of memory for a page table of %d blocks", nb);
        s->ref_gen = rg;
        s->hcap = nc;
    }
    return 0;
}

int m3_blocks_admit(m3_blocks *bm, m3_blocks_seq *s, const int32_t *tokens, int n, const uint64_t *extra,
                    int n_extra, m3_err *err) {
    if (s->admitted || s->kv.n_pages || s->n_tokens)
        return m3_errf(err, "block manager: admit needs an empty sequence (it holds %d blocks)", s->kv.n_pages);
    if (n < 1 || !tokens) return m3_errf(err, "block manager: admit needs at least one prompt token (got %d)", n);
    const int P = bm->page, maxb = (n - 1) / P; /* at least one token is always recomputed */
    if (seq_grow(s, maxb > 1 ? maxb : 1, err)) return -1;
    uint64_t ph = SEED;
    int pp = -1;
    uint32_t pg = 0;
    int i = 0;
    for (; i < maxb; i++) {
        const int32_t *tok = tokens + (size_t)i * P;
        uint64_t ex = extra_of(extra, n_extra, i), h = block_hash(bm, ph, tok, ex);
        int c = map_find(bm, h, pp, pg, tok, ex);
        if (c < 0) break;
        if (bm->ref[c] == 0) lru_remove(bm, c);
        bm->ref[c]++;
        s->kv.pages[i] = c;
        s->hash[i] = h;
        s->ref_page[i] = c;
        s->ref_gen[i] = bm->gen[c];
        ph = h;
        pp = c;
        pg = bm->gen[c];
    }
    int k = i * P;
    s->kv.n_pages = i;
    s->kv.len = k;
    s->n_tokens = k;
    s->n_cached = k;
    s->n_committed = i;
    s->admitted = 1;
    bm->query_tokens += (uint64_t)n;
    bm->hit_tokens += (uint64_t)k;
    return k;
}

int m3_blocks_needed(const m3_blocks *bm, const m3_blocks_seq *s, int n_new) {
    if (n_new <= 0) return 0;
    long long want = ((long long)s->n_tokens + n_new + bm->page - 1) / bm->page - s->kv.n_pages;
    return want > 0 ? (want > bm->n + 1 ? bm->n + 1 : (int)want) : 0;
}

int m3_blocks_can_allocate(const m3_blocks *bm, const m3_blocks_seq *s, int n_new) {
    return m3_blocks_needed(bm, s, n_new) <= bm->n_free + bm->n_cached;
}

int m3_blocks_allocate(m3_blocks *bm, m3_blocks_seq *s, int n_new, m3_err *err) {
    if (n_new < 0) return m3_errf(err, "block manager: allocate of %d tokens", n_new);
    if ((long long)s->n_tokens + n_new > (long long)bm->n * bm->page)
        return m3_errf(err, "block manager: %d + %d tokens exceed the whole pool (%d blocks of %d)", s->n_tokens, n_new,
                       bm->n, bm->page);
    int need = m3_blocks_needed(bm, s, n_new);
    if (need > bm->n_free + bm->n_cached)
        return m3_errf(err, "kv cache exhausted: %d more blocks needed, %d free + %d cached of %d", need, bm->n_free,
                       bm->n_cached, bm->n),
               M3_BLOCKS_EXHAUSTED;
    if (seq_grow(s, s->kv.n_pages + need, err)) return -1;
    for (int j = 0; j < need; j++) {
        int p;
        if (bm->n_free) p = bm->free_stack[--bm->n_free];
        else { /* evict the least recently used cached page */
            p = bm->lhead;
            lru_remove(bm, p);
            unhash(bm, p);
            bm->evictions++;
        }
        bm->ref[p] = 1;
        s->kv.pages[s->kv.n_pages++] = p;
    }
    s->n_tokens += n_new;
    return 0;
}

int m3_blocks_commit(m3_blocks *bm, m3_blocks_seq *s, const int32_t *tokens, int n_written, const uint64_t *extra,
                     int n_extra, m3_err *err) {
    if (n_written < 0 || n_written > s->n_tokens)
        return m3_errf(err, "block manager: commit of %d tokens, sequence has slots for %d", n_written, s->n_tokens);
    const int P = bm->page, full = n_written / P;
    if (full > s->n_committed && !tokens) return m3_errf(err, "block manager: commit needs the token ids");
    for (int i = s->n_committed; i < full; i++) {
        uint64_t ph = i ? s->hash[i - 1] : SEED;
        int pp = i ? s->ref_page[i - 1] : -1;
        uint32_t pg = i ? s->ref_gen[i - 1] : 0;
        s->hash[i] = 0;
        s->ref_page[i] = -1;
        s->ref_gen[i] = 0;
        /* the chain is cacheable only while its parent's cached instance lives */
        if (i && (pp < 0 || !bm->hashed[pp] || bm->gen[pp] != pg)) continue;
        const int32_t *tok = tokens + (size_t)i * P;
        uint64_t ex = extra_of(extra, n_extra, i), h = block_hash(bm, ph, tok, ex);
        int c = map_find(bm, h, pp, pg, tok, ex), p = s->kv.pages[i];
        s->hash[i] = h;
        if (c < 0) { /* new content: cache this page */
            c = p;
            bm->hash[p] = h;
            bm->parent[p] = pp;
            bm->parent_gen[p] = pg;
            bm->extra[p] = ex;
            memcpy(bm->tokens + (size_t)p * P, tok, sizeof(int32_t) * (size_t)P);
            map_insert(bm, p);
        } /* else: already cached elsewhere; this page stays private */
        s->ref_page[i] = c;
        s->ref_gen[i] = bm->gen[c];
    }
    if (full > s->n_committed) s->n_committed = full;
    return 0;
}

void m3_blocks_free(m3_blocks *bm, m3_blocks_seq *s) {
    for (int i = s->kv.n_pages - 1; i >= 0; i--) { /* last block first: tails are evicted before heads */
        int p = s->kv.pages[i];
        if (--bm->ref[p] > 0) continue;
        if (bm->hashed[p]) lru_push(bm, p);
        else bm->free_stack[bm->n_free++] = p;
    }
    free(s->kv.pages);
    free(s->hash);
    free(s->ref_page);
    free(s->ref_gen);
    memset(s, 0, sizeof *s);
}

int m3_blocks_reset_cache(m3_blocks *bm) {
    int k = 0;
    while (bm->lhead >= 0) {
        int p = bm->lhead;
        lru_remove(bm, p);
        unhash(bm, p);
        bm->free_stack[bm->n_free++] = p;
        k++;
    }
    return k;
}

/* ---- introspection ---- */

void m3_blocks_get_stats(const m3_blocks *bm, m3_blocks_stats *st) {
    st->total = bm->n;
    st->free = bm->n_free;
    st->cached = bm->n_cached;
    st->used = bm->n - bm->n_free - bm->n_cached;
    st->hashed = bm->n_hashed;
    st->query_tokens = bm->query_tokens;
    st->hit_tokens = bm->hit_tokens;
    st->evictions = bm->evictions;
}

int m3_blocks_debug_hash_bits(m3_blocks *bm, int bits, m3_err *err) {
    if (bm->n_hashed) return m3_errf(err, "block manager: hash width changed while %d pages are hashed", bm->n_hashed);
    if (bits < 0 || bits > 64) return m3_errf(err, "block manager: hash width %d bits", bits);
    bm->hash_mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
    return 0;
}

int m3_blocks_page_tokens(const m3_blocks *bm) { return bm->page; }
int m3_blocks_total(const m3_blocks *bm) { return bm->n; }
int m3_blocks_refcount(const m3_blocks *bm, int page) { return page >= 0 && page < bm->n ? bm->ref[page] : -1; }

int m3_blocks_check(const m3_blocks *bm, m3_err *err) {
    uint8_t *seen = calloc((size_t)bm->n, 1);
    if (!seen) return m3_errf(err, "block manager check: out of memory");
    int rc = 0;
#define FAIL(...) do { rc = m3_errf(err, __VA_ARGS__); goto out; } while (0)
    if (bm->n_free < 0 || bm->n_free > bm->n) FAIL("free count %d of %d", bm->n_free, bm->n);
    for (int i = 0; i < bm->n_free; i++) {
        int p = bm->free_stack[i];
        if (p < 0 || p >= bm->n) FAIL("free list holds page %d", p);
        if (seen[p]) FAIL("page %d twice on the free list", p);
        seen[p] = 1;
        if (bm->ref[p] != 0 || bm->hashed[p]) FAIL("free page %d has refcount %d, hashed %d", p, bm->ref[p], bm->hashed[p]);
    }
    int cnt = 0, prev = -1;
    for (int p = bm->lhead; p >= 0; prev = p, p = bm->lnext[p]) {
        if (p >= bm->n) FAIL("cached list holds page %d", p);
        if (seen[p]) FAIL("page %d on two lists (or a cycle)", p);
        seen[p] = 2;
        if (bm->lprev[p] != prev) FAIL("cached list: page %d prev %d, expected %d", p, bm->lprev[p], prev);
        if (bm->ref[p] != 0 || !bm->hashed[p]) FAIL("cached page %d has refcount %d, hashed %d", p, bm->ref[p], bm->hashed[p]);
        cnt++;
    }
    if (prev != bm->ltail) FAIL("cached list tail %d, walked to %d", bm->ltail, prev);
    if (cnt != bm->n_cached) FAIL("cached count %d, list holds %d", bm->n_cached, cnt);
    int used = 0, hashed = 0;
    for (int p = 0; p < bm->n; p++) {
        if (bm->ref[p] < 0) FAIL("page %d refcount %d", p, bm->ref[p]);
        if (!seen[p] && bm->ref[p] == 0) FAIL("page %d has refcount 0 but is on no list", p);
        if (bm->ref[p] > 0) used++;
        if (bm->hashed[p]) hashed++;
    }
    if (used + bm->n_free + bm->n_cached != bm->n)
        FAIL("used %d + free %d + cached %d != total %d", used, bm->n_free, bm->n_cached, bm->n);
    if (hashed != bm->n_hashed) FAIL("hashed count %d, flags say %d", bm->n_hashed, hashed);
    int inmap = 0;
    memset(seen, 0, (size_t)bm->n);
    for (uint64_t b = 0; b < bm->nbucket; b++)
        for (int p = bm->bucket[b]; p >= 0; p = bm->hnext[p]) {
            if (p >= bm->n || seen[p]) FAIL("hash map: page %d out of range or twice", p);
            seen[p] = 1;
            if (!bm->hashed[p]) FAIL("hash map holds unhashed page %d", p);
            if ((bm->hash[p] & (bm->nbucket - 1)) != b) FAIL("hash map: page %d in the wrong bucket", p);
            inmap++;
        }
    if (inmap != bm->n_hashed) FAIL("hash map holds %d pages, %d hashed", inmap, bm->n_hashed);
#undef FAIL
out:
    free(seen);
    return rc;
}
