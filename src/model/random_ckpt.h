/* Random MiniMax-M3 checkpoints (m3 make-tiny): a checkpoint with random weights in the hub
 * layout the engine loads (spec section 1), unquantized or quantized the way the reference
 * checkpoints were (../shared/tools/make_m3_oracle.py: quantize_hub), optionally with the
 * chat tokenizer files and a random DSpark draft.
 *
 * Values follow make_m3_oracle.build(): norm weights N(0, 0.2), embeddings N(0, 1), linears
 * N(0, 1/sqrt(K)) with the gate/up projections of every MLP (dense, routed, shared) x3,
 * routing bias N(0, 0.3); everything is rounded to bf16 first, and the quantized formats are
 * made from those bf16 values, so the same seed gives a bf16 checkpoint and its exact
 * quantized twin. Each row of each tensor has its own random stream (random_weights.h):
 * output is independent of thread count, sharding, layout and quant mode (for a given libm).
 *
 * config.json: the built-in config (the m3-tiny shapes of ../shared/testdata) or the given
 * file's text byte for byte, except that a quantized mode adds the oracle's
 * quantization_config when the config has none, and M3_RQ_NONE drops one (the tensors are
 * BF16 then); a changed config is written the way Python's json.dump(indent=1) writes it.
 * The built-in config and its quantized form are byte-identical to testdata's m3-tiny and
 * m3-tiny-q config.json, and the tensor names, dtypes and shapes to their safetensors.
 *
 * Memory: one shard's tensors at a time (plus one f32 copy of the NVFP4 tensor being made).
 * Without shard_mb the single file holds everything, so it is refused when it would not fit
 * in about 3/4 of physical memory. Weight files of an earlier run in the directory that this
 * one does not overwrite are removed. Files are written atomically (PATH.tmp, renamed). */
#ifndef M3_RANDOM_CKPT_H
#define M3_RANDOM_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

typedef enum {
    M3_RQ_NONE,     /* BF16 */
    M3_RQ_CT,       /* MXFP8 linears, NVFP4 routed experts in the compressed-tensors spelling */
    M3_RQ_MODELOPT, /* the same, experts in the ModelOpt spelling */
} m3_rand_quant;

typedef struct m3_rand_opts {
    const char *out;           /* checkpoint directory (created if missing) */
    const char *config;        /* config.json (or a directory holding one) to copy; NULL: built-in */
    uint64_t seed;
    m3_rand_quant quant;
    int bare;                  /* tensor names without the "language_model." prefix */
    uint64_t shard_mb;         /* files of about this many 10^6 bytes + index; 0: one model.safetensors */
    const char *tokenizer;     /* tokenizer.json to copy with the chat tokens added (tokenizer.h:
                                  m3_tok_files_make), setting vocab_size / bos / eos_token_id; or NULL */
    int with_dspark;           /* also a random DSpark draft in OUT/dspark */
    const char *dspark_config; /* its config.json, copied byte for byte; NULL: built from the target */
} m3_rand_opts;

/* What was written, for the command's summary line. */
typedef struct m3_rand_report {
    size_t n_entries;   /* safetensors entries (a quantized weight is 2 or 3) */
    size_t n_weights;   /* logical weights */
    uint64_t bytes;     /* tensor bytes, all files */
    int n_files;        /* shards; 0: the one model.safetensors */
    int threads;        /* worker threads used */
    int dspark;         /* 1 when a draft was written: */
    size_t dspark_weights;
    uint64_t dspark_bytes;
    int dspark_layers;
    char dspark_targets[256]; /* the target layers feeding it, "0,2,3" */
} m3_rand_report;

/* Writes the checkpoint described by o. 0, or -1 with err set (one line naming the file,
 * tensor or field). rep may be NULL. */
int m3_rand_ckpt_write(const m3_rand_opts *o, m3_rand_report *rep, m3_err *err);

#endif
