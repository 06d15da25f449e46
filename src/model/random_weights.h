/* Internals of the random checkpoint writers (random_ckpt.c, random_dspark.c), not a public
 * API: the list of tensors to make, their generation and their safetensors entries.
 *
 * Values follow make_m3_oracle.build(): each tensor has a std (norm weights 0.2, embeddings 1,
 * linears 1/sqrt(K), x3 for MLP gate/up, ...); everything is rounded to bf16 first (the
 * oracle's model was bf16), and the quantized formats are made from those bf16 values, so
 * the same seed gives a bf16 checkpoint and its exact quantized twin.
 * Randomness: each row of each tensor has its own splitmix64 stream (base/hash.h), keyed by
 * the seed, the tensor's name without the layout prefix and the row index, turned into
 * normals by a ziggurat. Output is therefore independent of thread count, sharding, layout
 * and quant mode (for a given libm). */
#ifndef M3_RANDOM_WEIGHTS_H
#define M3_RANDOM_WEIGHTS_H

#include <jansson.h>
#include <stdint.h>

#include "../base/err.h"
#include "../base/pool.h"
#include "../io/config.h"
#include "../io/safetensors.h"
#include "random_ckpt.h"

typedef enum { RW_BF16, RW_F32, RW_MXFP8, RW_NVFP4 } rw_fmt;

/* One logical tensor to generate; it is stored as 1 (BF16, F32), 2 (MXFP8) or 3 (NVFP4)
 * safetensors entries, always in the same file. */
typedef struct {
    char name[192];  /* without the layout prefix; linears end in ".weight" */
    int ndim;        /* 1: [N]; 2: [N, K] */
    int64_t N, K;    /* K = 1 for vectors */
    float std;
    rw_fmt fmt;
    uint64_t bytes;  /* stored bytes, all entries */
    int shard;
} rw_spec;

typedef struct {
    rw_spec *s;
    size_t n, cap;
} rw_list;

/* Ziggurat tables for normals (128 layers); filled once by m3_rw_zig_init, then only read. */
typedef struct {
    uint32_t kn[128];
    float wn[128], fn[128];
} rw_zig;

void m3_rw_zig_init(rw_zig *z);

/* Appends a tensor of N(0, std^2) values to l. Refuses K that the format cannot block. */
int m3_rw_add_spec(rw_list *l, const char *name, int ndim, int64_t N, int64_t K, float std, rw_fmt fmt, m3_err *err);
/* A linear [N, K], std mult / sqrt(K): BF16, or q when quantizing (qm != M3_RQ_NONE). */
int m3_rw_add_linear(rw_list *l, m3_rand_quant qm, rw_fmt q, const char *name, int64_t N, int64_t K, float mult,
                     m3_err *err);
/* An MLP under base: gate g and up u [F, H] (x3), down d [H, F]. */
int m3_rw_add_mlp(rw_list *l, m3_rand_quant qm, rw_fmt q, const char *base, const char *g, const char *u,
                  const char *d, int64_t H, int64_t F, m3_err *err);

/* Buffers of one generated spec, owned until its shard is written. */
typedef struct {
    void *a, *b;   /* main data, scales */
    float gscalar; /* NVFP4 global scale (CT) or its reciprocal (ModelOpt) */
} rw_out;

/* Generates s's stored data into o (rows spread over pool; scratch: [pool size][scratch_k]
 * floats). o's buffers are malloc'd; on failure none are left. */
int m3_rw_generate(const rw_spec *s, const rw_zig *zig, uint64_t seed, m3_rand_quant qm, m3_pool *pool, float *scratch,
                   int64_t scratch_k, rw_out *o, m3_err *err);
/* Adds the stored entries of s to w, named prefix + name (+ the format's suffixes); with
 * weight_map, also maps each entry name to file. */
int m3_rw_add_entries(m3_st_writer *w, const rw_spec *s, const rw_out *o, const char *prefix, m3_rand_quant qm,
                      json_t *weight_map, const char *file, m3_err *err);

/* The DSpark draft of target c in OUT/dspark (random_dspark.c); fills rep's dspark fields. */
int m3_rw_write_dspark(const char *out, const m3_config *c, const char *dcfg_path, uint64_t seed, int bare,
                       const rw_zig *zig, m3_pool *pool, m3_rand_report *rep, m3_err *err);

#endif
