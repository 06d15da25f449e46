/* Paged KV block manager with prefix caching (vLLM-style), over an m3_kv page pool.
 *
 * A block is one m3_kv page: `kv->page` consecutive positions of a sequence. A page id
 * indexes every layer's storage (K, V, index-K), so one page table per sequence serves all
 * layers and one block here stands for the whole model's cache of those positions.
 *
 * Ownership. m3_blocks_create takes every page of the pool (kv->n_free drops to 0), so a
 * forward step can never take pages behind the manager's back: m3_forward's own reserve
 * (m3_kv_seq_reserve) is a no-op when the scheduler allocated first, and fails cleanly
 * ("kv cache exhausted") if it did not. m3_blocks_destroy gives the pages back. Never call
 * m3_kv_seq_release on a managed sequence; use m3_blocks_free.
 *
 * Each page is in exactly one state:
 *   free       refcount 0, no hash; on the free list (contents meaningless)
 *   cached     refcount 0, hashed; on the evictable LRU list, contents kept for reuse
 *   used       refcount > 0 (hashed or not), held by that many sequences' page tables
 * free + cached + used == total always. When the free list is empty, allocation evicts the
 * least recently freed cached page (its hash is dropped) and reuses it.
 *
 * Prefix caching. Only FULL blocks whose entries are all written are hashed, by
 * m3_blocks_commit after the forward that wrote them. A block's hash chains its parent's:
 *     h_i = H(h_{i-1}, tokens of block i, extra_i)      (h_{-1} a fixed seed)
 * extra_i is a caller-supplied 64-bit key for block i (for example a hash of the content of
 * images whose placeholder tokens fall in the block; 0 for text), so equal token ids with
 * different image content never share. The hash only speeds up lookup: a hit also requires
 * equal token ids, equal extra, and the same parent block (page id + generation, bumped each
 * time a page loses its hash), so a 64-bit collision can never hand out wrong entries.
 * m3_blocks_admit finds the longest chain of cached blocks matching a prompt and shares it
 * (refcount++). It never returns the whole prompt as computed: at most
 * floor((n - 1) / page) blocks are reused, so at least one prompt token is always run
 * through the model and the logits for the first generated token exist.
 *
 * No copy-on-write is needed: only full, committed blocks are ever shared, and a sequence
 * writes only at positions >= kv.len, which lie past its shared prefix (admit sets kv.len
 * to the reused prefix, a whole number of blocks). The partially filled last block is
 * always private: it was allocated fresh by m3_blocks_allocate and becomes shareable only
 * once it is full and committed, after which its owner never writes it again. (Forking a
 * sequence mid-block, e.g. parallel sampling n > 1, must therefore not copy page tables;
 * admit each child against the cache instead.)
 *
 * Freeing a sequence drops one reference per block; a block reaching 0 goes to the cached
 * LRU list if it is hashed, else to the free list. Blocks are released last-first, so a
 * chain's tail is evicted before its head (heads are the most shareable).
 *
 * Not thread-safe: one thread (the scheduler's) owns the manager and its sequences. */
#ifndef M3_KV_BLOCKS_H
#define M3_KV_BLOCKS_H

#include <stdint.h>

#include "../base/err.h"
#include "kv.h"

typedef struct m3_blocks m3_blocks;

/* One sequence's view. Zero-initialize ({0}) before first use; m3_blocks_free returns it
 * to that state. kv is what m3_forward takes (b->seqs[...]). */
typedef struct m3_blocks_seq {
    m3_kv_seq kv;          /* page table; kv.len = positions whose entries are written */
    int n_tokens;          /* positions with a slot: kv.len <= n_tokens <= kv.n_pages * page */
    int n_cached;          /* prompt tokens found in the cache by m3_blocks_admit */
    int n_committed;       /* leading full blocks that were committed (or reused) */
    int admitted;          /* m3_blocks_admit was called */
    /* per committed block: its chain hash, and the canonical cached page (+ generation)
     * that children's lookups must name as parent (-1 when the chain is no longer cacheable) */
    uint64_t *hash;
    int32_t *ref_page;
    uint32_t *ref_gen;
    int hcap;
} m3_blocks_seq;

typedef struct m3_blocks_stats {
    int total;             /* pages in the pool */
    int used;              /* refcount > 0 */
    int cached;            /* refcount 0, hashed (evictable) */
    int free;              /* refcount 0, no hash */
    int hashed;            /* pages with a hash (used or cached) */
    uint64_t query_tokens; /* prompt tokens looked up by m3_blocks_admit */
    uint64_t hit_tokens;   /* of those, reused from the cache */
    uint64_t evictions;    /* cached pages whose hash was dropped for reuse */
} m3_blocks_stats;

/* Manages all pages of kv (which must have every page free). NULL on failure (err set). */
m3_blocks *m3_blocks_create(m3_kv *kv, m3_err *err);
/* Gives every page back to kv (sequences still holding pages must not be used after). */
void m3_blocks_destroy(m3_blocks *bm);

/* Looks up the longest cached prefix of tokens[0, n) (n >= 1) in whole blocks, at most
 * floor((n - 1) / page) of them, and shares it with s (empty, never admitted). extra[i]
 * is block i's extra key for i < n_extra (0 beyond; extra may be NULL). Sets s->kv.len =
 * s->n_tokens = s->n_cached = the reused token count and returns it; -1 on error.
 * Takes no free pages, so it cannot run out of blocks. */
int m3_blocks_admit(m3_blocks *bm, m3_blocks_seq *s, const int32_t *tokens, int n, const uint64_t *extra,
                    int n_extra, m3_err *err);

/* Blocks needed to give s slots for n_new more positions, and whether the pool (free plus
 * evictable pages) can supply them now. */
int m3_blocks_needed(const m3_blocks *bm, const m3_blocks_seq *s, int n_new);
int m3_blocks_can_allocate(const m3_blocks *bm, const m3_blocks_seq *s, int n_new);

#define M3_BLOCKS_EXHAUSTED 1
/* Gives s slots for positions [n_tokens, n_tokens + n_new), appending pages (free list
 * first, then evicting the least recently used cached page). All or nothing: returns
 * M3_BLOCKS_EXHAUSTED (err set, s and the pool unchanged) when the pool cannot supply them,
 * so the scheduler can preempt someone (m3_blocks_free, recompute later) and retry; -1 on
 * out of memory, bad arguments, or a length the whole pool could never hold; 0 on success. */
int m3_blocks_allocate(m3_blocks *bm, m3_blocks_seq *s, int n_new, m3_err *err);

/* After a forward wrote positions [0, n_written) of s (normally s->kv.len): hashes and
 * caches every newly full block. tokens holds the sequence's ids [0, n_written) (prompt
 * then generated), extra as in m3_blocks_admit. A block whose content is already cached
 * under another page stays private (freed, not cached, when s lets go). -1 on bad args. */
int m3_blocks_commit(m3_blocks *bm, m3_blocks_seq *s, const int32_t *tokens, int n_written, const uint64_t *extra,
                     int n_extra, m3_err *err);

/* Releases all of s's blocks (see above) and resets s to {0}. Safe on an empty s. */
void m3_blocks_free(m3_blocks *bm, m3_blocks_seq *s);

/* Drops the hash of every cached (refcount 0) page, moving it to the free list; hashes of
 * pages in use are kept. Returns how many pages were dropped. */
int m3_blocks_reset_cache(m3_blocks *bm);

void m3_blocks_get_stats(const m3_blocks *bm, m3_blocks_stats *st);
/* pool geometry */
int m3_blocks_page_tokens(const m3_blocks *bm);
int m3_blocks_total(const m3_blocks *bm);
/* refcount of one page (tests, debugging); -1 if out of range */
int m3_blocks_refcount(const m3_blocks *bm, int page);
/* Checks the internal invariants (list membership and counts, hash map = hashed pages,
 * states consistent with refcounts). 0 if all hold, else -1 with the first violation. */
int m3_blocks_check(const m3_blocks *bm, m3_err *err);
/* Tests only: keeps `bits` bits of every block hash (0: all blocks collide), to exercise
 * the exact-match path that makes collisions harmless. Only while no page is hashed. */
int m3_blocks_debug_hash_bits(m3_blocks *bm, int bits, m3_err *err);

#endif
