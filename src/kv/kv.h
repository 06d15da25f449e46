/* Paged KV + index-K cache.
 *
 * Row formats: f32, bf16, FP8 E4M3 (1 byte/value, scale 1), NVFP4 (codes, 2 per byte, then
 * one E4M3 scale per 16 values: for D = 128 a row is 64 + 8 bytes, the seed's layout).
 * A pool holds n_pages pages of `page` tokens. A page id is valid in every layer (one page
 * table per sequence serves all layers, as in vLLM). Layer L stores page p at
 * base[L] + p * page_bytes[L], laid out head-major so a block read is contiguous:
 *     K  [nkv][page][D]   then   V  [nkv][page][D]   then (sparse layers) index-K [page][Di]
 * Values are stored in the cache dtype (rounded on insert); readers dequantize to f32.
 * Attention and the indexer always read back what the cache holds.
 * Not thread-safe for concurrent writers to the same sequence; readers may run in parallel. */
#ifndef M3_KV_H
#define M3_KV_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"
#include "../io/config.h"

typedef enum { M3_KV_F32, M3_KV_BF16, M3_KV_FP8, M3_KV_NVFP4, M3_KV_DTYPE_COUNT } m3_kv_dtype;

const char *m3_kv_dtype_name(m3_kv_dtype d);
/* "f32", "bf16", "fp8" (also "fp8_e4m3"), "nvfp4", or "auto" (= bf16, the model's activation dtype);
 * -1 if unknown */
int m3_kv_dtype_parse(const char *s, m3_kv_dtype *out);

typedef enum { M3_KV_K = 0, M3_KV_V = 1, M3_KV_IK = 2 } m3_kv_part;

/* Where the pages live: NULL functions = host memory (aligned_alloc). A device backend
 * passes its allocator; then only its ops may touch the pages (m3_kv_store / rows / load
 * are host-memory functions). alloc must return zeroed memory or NULL. */
typedef struct m3_kv_mem {
    void *(*alloc)(void *ctx, size_t bytes);
    void (*release)(void *ctx, void *p);
    void *ctx;
} m3_kv_mem;

typedef struct m3_kv {
    int n_layers, nkv, D, Di, page;
    m3_kv_mem mem;
    m3_kv_dtype dt, idt;
    uint8_t *has_index;      /* [n_layers] */
    size_t *page_bytes;      /* [n_layers] */
    uint8_t **base;          /* [n_layers] */
    int n_pages;
    int *free_pages;         /* stack */
    int n_free;
} m3_kv;

typedef struct m3_kv_seq {
    int32_t *pages;
    int n_pages, cap;
    int len;                 /* tokens whose entries are written */
} m3_kv_seq;

/* page size for a model: the sparse block size (so a block read is one page), else 128 */
int m3_kv_page_tokens(const m3_config *c);

int m3_kv_create(m3_kv *kv, const m3_config *c, m3_kv_dtype dt, m3_kv_dtype idt, int page_tokens, int n_pages, m3_err *err);
/* The same with pages from mem (NULL: host memory). */
int m3_kv_create_in(m3_kv *kv, const m3_config *c, m3_kv_dtype dt, m3_kv_dtype idt, int page_tokens, int n_pages,
                    const m3_kv_mem *mem, m3_err *err);
void m3_kv_destroy(m3_kv *kv);
/* bytes of one stored row of dim values in dtype d (NVFP4: codes then scales) */
size_t m3_kv_row_bytes(m3_kv_dtype d, int dim);
/* cache bytes per token over all layers */
size_t m3_kv_bytes_per_token(const m3_kv *kv);

/* Ensures pages for positions [0, n_tokens); -1 (with a message) when the pool is exhausted. */
int m3_kv_seq_reserve(m3_kv *kv, m3_kv_seq *s, int n_tokens, m3_err *err);
void m3_kv_seq_release(m3_kv *kv, m3_kv_seq *s);

/* Writes one token's entry: K or V takes nkv*D values, IK takes Di. Rounds to the dtype. */
void m3_kv_store(m3_kv *kv, const m3_kv_seq *s, int layer, m3_kv_part part, int pos, const float *x);
/* NVFP4 rounding of one row (dim % 16 == 0), exposed for tests */
void m3_kv_round_nvfp4(const float *x, int dim, uint8_t *codes, uint8_t *scales);

/* Zero-copy read: a pointer to the stored row of (part, head, pos), in the cache dtype
 * (kv->dt for K/V, kv->idt for IK), and in *run how many rows from pos on are stored
 * contiguously after it (up to the end of its page). */
const void *m3_kv_rows(const m3_kv *kv, const m3_kv_seq *s, int layer, m3_kv_part part, int head, int pos, int *run);
/* Reads positions [p0, p0+n) of one head (head ignored for IK) into out[n][dim] as f32. */
void m3_kv_load(const m3_kv *kv, const m3_kv_seq *s, int layer, m3_kv_part part, int head, int p0, int n, float *out);

#endif
