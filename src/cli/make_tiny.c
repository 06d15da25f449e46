/* m3 make-tiny: writes a MiniMax-M3 checkpoint with random weights, in the hub layout the
 * engine loads (spec section 1), unquantized or quantized the way the reference
 * checkpoints were (../shared/tools/make_m3_oracle.py: quantize_hub).
 *
 *   m3 make-tiny --out DIR [--config FILE] [--seed S] [--quant none|mxfp8-nvfp4|mxfp8-nvfp4-modelopt]
 *                [--layout hub|bare] [--shard-mb N] [--tokenizer tokenizer.json] [--with-dspark]
 *
 * Values follow make_m3_oracle.build(): norm weights N(0, 0.2), embeddings N(0, 1), linears
 * N(0, 1/sqrt(K)) with the gate/up projections of every MLP (dense, routed, shared) x3,
 * routing bias N(0, 0.3); everything is rounded to bf16 first (the oracle's model was bf16),
 * and the quantized formats are made from those bf16 values, so the same seed gives a
 * bf16 checkpoint and its exact quantized twin.
 * Randomness: each row of each tensor has its own splitmix64 stream, keyed by the seed, the
 * tensor's name without the layout prefix and the row index, turned into normals by
 * a ziggurat. Output is therefore independent of thread count, sharding, layout and quant
 * mode (for a given libm).
 *
 * config.json: the built-in config (the m3-tiny shapes of ../shared/testdata) or --config
 * FILE's text byte for byte, except that --quant mxfp8-nvfp4* adds the oracle's
 * quantization_config when the config has none, and --quant none drops one (the tensors are
 * BF16 then); a changed config is written the way Python's json.dump(indent=1) writes it.
 * The built-in config and its quantized form are byte-identical to testdata's m3-tiny and
 * m3-tiny-q config.json, and the tensor names, dtypes and shapes to their safetensors.
 *
 * Memory: one shard's tensors at a time (plus one f32 copy of the NVFP4 tensor being made).
 * Without --shard-mb the single file holds everything, so it is refused when it would not
 * fit in about 3/4 of physical memory.
 *
 * Returns 0 on success, 2 on a usage error, 1 on any other failure; every failure is one
 * line "m3 make-tiny: <message>" on stderr. argv[0] is the command name and is skipped. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../base/err.h"
#include "../base/sbuf.h"
#include "../base/hash.h"
#include "../base/clock.h"
#include "../base/num.h"
#include "../base/pool.h"
#include "../io/config.h"
#include "../io/safetensors.h"
#include "../model/dspark.h"
#include "../weights/quantize.h"
#include "cli.h"

static const char USAGE[] =
    "usage: m3 make-tiny --out DIR [--config FILE] [--seed S] [--quant none|mxfp8-nvfp4|mxfp8-nvfp4-modelopt]\n"
    "                    [--layout hub|bare] [--shard-mb N] [--tokenizer FILE] [--with-dspark] [--dspark-config FILE]\n"
    "  --out DIR       checkpoint directory to write (created if missing)\n"
    "  --config FILE   config.json to copy (hub or transformers spelling); default: a built-in tiny\n"
    "                  model (hidden 128, 4 layers: full+dense, 2x sparse+MoE, full+MoE; vocab 1024)\n"
    "  --seed S        random seed (unsigned integer, default 1234)\n"
    "  --quant Q       none (BF16; default), mxfp8-nvfp4 (MXFP8 linears, NVFP4 routed experts in the\n"
    "                  compressed-tensors spelling), mxfp8-nvfp4-modelopt (experts in the ModelOpt spelling)\n"
    "  --layout L      hub (names under 'language_model.'; default) or bare (no prefix)\n"
    "  --shard-mb N    split into files of about N MB (10^6 bytes) with model.safetensors.index.json;\n"
    "                  0 (default): one model.safetensors\n"
    "  --tokenizer FILE copy this tokenizer.json into the checkpoint with the MiniMax-M3 chat tokens added\n"
    "                  after its vocabulary (]~!b[ ]~b] [e~[ <mm:think> </mm:think> ]<]minimax[>[), write a\n"
    "                  tokenizer_config.json, and set vocab_size / bos / eos_token_id in config.json to match\n"
    "  --with-dspark   also write a random DSpark draft in DIR/dspark (config.json + model.safetensors in the\n"
    "                  real layout: BF16 fc / norms / Markov and confidence heads, MXFP8 decoder linears)\n"
    "  --dspark-config FILE  the same with this draft config.json (copied byte for byte; e.g. the real\n"
    "                  shapes in shared/configs/m3.1-flash-dspark-shapes.json); implies --with-dspark\n";

/* The m3-tiny shapes of ../shared/testdata (make_m3_oracle.py hub_config), unquantized. */
static const char BUILTIN_CONFIG[] =
    "{\"architectures\": [\"MiniMaxM3SparseForConditionalGeneration\"], \"model_type\": \"minimax_m3_vl\","
    " \"text_config\": {\"model_type\": \"minimax_m3\", \"architectures\": [\"MiniMaxM3SparseForCausalLM\"],"
    " \"vocab_size\": 1024, \"hidden_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 32, \"intermediate_size\": 64, \"shared_intermediate_size\": 64,"
    " \"n_shared_experts\": 1, \"dense_intermediate_size\": 160, \"num_local_experts\": 8,"
    " \"num_experts_per_tok\": 2, \"scoring_func\": \"sigmoid\", \"use_routing_bias\": true,"
    " \"routed_scaling_factor\": 2.0, \"hidden_act\": \"swigluoai\", \"swiglu_alpha\": 1.702,"
    " \"swiglu_limit\": 7.0, \"rms_norm_eps\": 1e-06, \"use_gemma_norm\": true, \"use_qk_norm\": true,"
    " \"qk_norm_type\": \"per_head\", \"rotary_dim\": 16, \"partial_rotary_factor\": 0.5,"
    " \"rope_theta\": 10000.0, \"max_position_embeddings\": 524288, \"tie_word_embeddings\": false,"
    " \"bos_token_id\": 0, \"eos_token_id\": 1, \"moe_layer_freq\": [0, 1, 1, 1],"
    " \"sparse_attention_config\": {\"use_sparse_attention\": true, \"sparse_index_dim\": 32,"
    " \"sparse_num_index_heads\": 2, \"sparse_topk_blocks\": 3, \"sparse_block_size\": 16,"
    " \"sparse_score_type\": \"max\", \"sparse_init_block\": 0, \"sparse_local_block\": 1,"
    " \"sparse_attention_freq\": [0, 1, 1, 0], \"sparse_disable_index_value\": [0, 1, 1, 0]}},"
    " \"vision_config\": {\"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 1,"
    " \"num_attention_heads\": 2, \"image_size\": 56, \"patch_size\": 14}, \"projector_hidden_size\": 128,"
    " \"image_token_index\": 200025, \"video_token_index\": 200026, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\"}";

/* quantization_config of make_m3_oracle.py main() */
static const char QUANT_CONFIG[] =
    "{\"quant_method\": \"mxfp8\", \"activation_scheme\": \"dynamic\", \"weight_block_size\": [1, 32],"
    " \"moe_quant_algo\": \"NVFP4\", \"moe_quant_format\": \"nvfp4-pack-quantized\", \"moe_group_size\": 16,"
    " \"ignored_layers\": [\"lm_head\", \"model.embed_tokens\", \"block_sparse_moe.gate\", \"index_q_proj\","
    " \"index_k_proj\"]}";

typedef enum { Q_NONE, Q_CT, Q_MODELOPT } quant_mode;
typedef enum { F_BF16, F_F32, F_MXFP8, F_NVFP4 } out_fmt;

/* One logical tensor to generate; it is stored as 1 (BF16, F32), 2 (MXFP8) or 3 (NVFP4)
 * safetensors entries, always in the same file. */
typedef struct {
    char name[192];  /* without the layout prefix; linears end in ".weight" */
    int ndim;        /* 1: [N]; 2: [N, K] */
    int64_t N, K;    /* K = 1 for vectors */
    float std;
    out_fmt fmt;
    uint64_t bytes;  /* stored bytes, all entries */
    int shard;
} spec;

typedef struct {
    spec *s;
    size_t n, cap;
} spec_list;

/* ------------------------------------------------------------------ random numbers */


static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Normals by Marsaglia and Tsang's ziggurat (128 layers): about 98.8% of draws cost 32
 * random bits, a compare and a multiply. Each draw takes a 7-bit layer index and a separate
 * 25-bit signed value (the original shares bits between the two, a known flaw); 25 bits
 * are plenty for values rounded to bf16. Tables are filled once, before any thread starts,
 * and only read afterwards. */
typedef struct {
    uint32_t kn[128];
    float wn[128], fn[128];
} zig_tables;

#define ZIG_M 16777216.0 /* 2^24: |hz| < 2^24 */

static void zig_init(zig_tables *z) {
    const double vn = 9.91256303526217e-3;
    double dn = 3.442619855899, tn = dn;
    double q = vn / exp(-0.5 * dn * dn);
    z->kn[0] = (uint32_t)((dn / q) * ZIG_M);
    z->kn[1] = 0;
    z->wn[0] = (float)(q / ZIG_M);
    z->wn[127] = (float)(dn / ZIG_M);
    z->fn[0] = 1.0f;
    z->fn[127] = (float)exp(-0.5 * dn * dn);
    for (int i = 126; i >= 1; i--) {
        dn = sqrt(-2.0 * log(vn / dn + exp(-0.5 * dn * dn)));
        z->kn[i + 1] = (uint32_t)((dn / tn) * ZIG_M);
        tn = dn;
        z->fn[i] = (float)exp(-0.5 * dn * dn);
        z->wn[i] = (float)(dn / ZIG_M);
    }
}

static inline float uni01(uint64_t *s) { /* (0, 1) */
    return ((float)(m3_splitmix64(s) >> 41) + 0.5f) * 0x1p-23f;
}

/* The rare path of a draw (about 1.2%): the wedge test or the tail, then fresh draws. */
static __attribute__((noinline)) float zig_slow(const zig_tables *z, uint32_t w, uint64_t *s) {
    for (;;) {
        int32_t hz = (int32_t)(w << 7) >> 7; /* low 25 bits, sign-extended */
        int iz = (int)(w >> 25);
        uint32_t ahz = hz < 0 ? (uint32_t)-hz : (uint32_t)hz;
        float x = (float)hz * z->wn[iz];
        if (ahz < z->kn[iz]) return x;
        if (iz == 0) { /* the tail beyond r = 3.442620 */
            const float rr = 3.442620f;
            float xt, y;
            do {
                xt = -logf(uni01(s)) * (1.0f / rr);
                y = -logf(uni01(s));
            } while (y + y < xt * xt);
            return hz > 0 ? rr + xt : -rr - xt;
        }
        if (z->fn[iz] + uni01(s) * (z->fn[iz - 1] - z->fn[iz]) < expf(-0.5f * x * x)) return x;
        w = (uint32_t)m3_splitmix64(s);
    }
}

/* One normal from the 32 random bits w (low 25: signed value, high 7: layer); rejections
 * draw more bits from s. */
static inline float zig_normal(const zig_tables *z, uint32_t w, uint64_t *s) {
    int32_t hz = (int32_t)(w << 7) >> 7;
    uint32_t iz = w >> 25;
    uint32_t ahz = hz < 0 ? (uint32_t)-hz : (uint32_t)hz;
    if (__builtin_expect(ahz < z->kn[iz], 1)) return (float)hz * z->wn[iz];
    return zig_slow(z, w, s);
}

static inline float bf16_round(float x) { return m3_bf16_to_f32(m3_f32_to_bf16(x)); }

/* n normals N(0, std^2), each rounded to bf16, for row `row` of the tensor keyed `key`. */
static void fill_row(const zig_tables *z, uint64_t key, int64_t row, float std, float *out, int64_t n) {
    uint64_t s = m3_mix64(key ^ m3_mix64((uint64_t)row + 0x632be59bd9b4e019ull));
    int64_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t r = m3_splitmix64(&s);
        out[i] = bf16_round(std * zig_normal(z, (uint32_t)r, &s));
        out[i + 1] = bf16_round(std * zig_normal(z, (uint32_t)(r >> 32), &s));
    }
    if (i < n) out[i] = bf16_round(std * zig_normal(z, (uint32_t)m3_splitmix64(&s), &s));
}

/* ------------------------------------------------------------------ tensor plan */

static int add_spec(spec_list *l, const char *name, int ndim, int64_t N, int64_t K, float std, out_fmt fmt, m3_err *err) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 256;
        spec *ns = realloc(l->s, nc * sizeof *ns);
        if (!ns) return m3_errf(err, "out of memory");
        l->s = ns;
        l->cap = nc;
    }
    spec *s = &l->s[l->n];
    memset(s, 0, sizeof *s);
    if (snprintf(s->name, sizeof s->name, "%s", name) >= (int)sizeof s->name)
        return m3_errf(err, "tensor name too long: %s", name);
    s->ndim = ndim;
    s->N = N;
    s->K = ndim == 1 ? 1 : K;
    s->std = std;
    s->fmt = fmt;
    uint64_t ne = (uint64_t)N * (uint64_t)s->K;
    switch (fmt) {
    case F_BF16: s->bytes = ne * 2; break;
    case F_F32: s->bytes = ne * 4; break;
    case F_MXFP8:
        if (K % 32)
            return m3_errf(err, "cannot quantize '%s' [%lld, %lld] to MXFP8: K must be a multiple of 32", name,
                           (long long)N, (long long)K);
        s->bytes = ne + ne / 32;
        break;
    case F_NVFP4:
        if (K % 16)
            return m3_errf(err, "cannot quantize '%s' [%lld, %lld] to NVFP4: K must be a multiple of 16", name,
                           (long long)N, (long long)K);
        s->bytes = ne / 2 + ne / 16 + 4;
        break;
    }
    l->n++;
    return 0;
}

/* A linear [N, K]: BF16, or `q` when quantizing. */
static int add_linear(spec_list *l, quant_mode qm, out_fmt q, const char *name, int64_t N, int64_t K, float mult,
                      m3_err *err) {
    return add_spec(l, name, 2, N, K, mult / sqrtf((float)K), qm == Q_NONE ? F_BF16 : q, err);
}

static int add_mlp(spec_list *l, quant_mode qm, out_fmt q, const char *base, const char *g, const char *u,
                   const char *d, int64_t H, int64_t F, m3_err *err) {
    char nm[256];
    snprintf(nm, sizeof nm, "%s.%s.weight", base, g);
    if (add_linear(l, qm, q, nm, F, H, 3.0f, err)) return -1;
    snprintf(nm, sizeof nm, "%s.%s.weight", base, u);
    if (add_linear(l, qm, q, nm, F, H, 3.0f, err)) return -1;
    snprintf(nm, sizeof nm, "%s.%s.weight", base, d);
    return add_linear(l, qm, q, nm, H, F, 1.0f, err);
}

static int plan(const m3_config *c, quant_mode qm, spec_list *l, m3_err *err) {
    const int64_t H = c->hidden, D = c->head_dim, V = c->vocab;
    char nm[256], p[64];
    if (add_spec(l, "model.embed_tokens.weight", 2, V, H, 1.0f, F_BF16, err)) return -1;
    for (int i = 0; i < c->n_layers; i++) {
        snprintf(p, sizeof p, "model.layers.%d", i);
#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
        if (add_spec(l, NM("%s.input_layernorm.weight", p), 1, H, 1, 0.2f, F_BF16, err)) return -1;
        if (add_linear(l, qm, F_MXFP8, NM("%s.self_attn.q_proj.weight", p), c->n_heads * D, H, 1.0f, err)) return -1;
        if (add_linear(l, qm, F_MXFP8, NM("%s.self_attn.k_proj.weight", p), c->n_kv_heads * D, H, 1.0f, err)) return -1;
        if (add_linear(l, qm, F_MXFP8, NM("%s.self_attn.v_proj.weight", p), c->n_kv_heads * D, H, 1.0f, err)) return -1;
        if (add_linear(l, qm, F_MXFP8, NM("%s.self_attn.o_proj.weight", p), H, c->n_heads * D, 1.0f, err)) return -1;
        if (add_spec(l, NM("%s.self_attn.q_norm.weight", p), 1, D, 1, 0.2f, F_BF16, err)) return -1;
        if (add_spec(l, NM("%s.self_attn.k_norm.weight", p), 1, D, 1, 0.2f, F_BF16, err)) return -1;
        if (c->layer_sparse[i]) {
            const int64_t Di = c->index_dim;
            if (add_linear(l, Q_NONE, F_BF16, NM("%s.self_attn.index_q_proj.weight", p), c->index_heads * Di, H, 1.0f, err)) return -1;
            if (add_linear(l, Q_NONE, F_BF16, NM("%s.self_attn.index_k_proj.weight", p), Di, H, 1.0f, err)) return -1;
            if (add_spec(l, NM("%s.self_attn.index_q_norm.weight", p), 1, Di, 1, 0.2f, F_BF16, err)) return -1;
            if (add_spec(l, NM("%s.self_attn.index_k_norm.weight", p), 1, Di, 1, 0.2f, F_BF16, err)) return -1;
        }
        if (add_spec(l, NM("%s.post_attention_layernorm.weight", p), 1, H, 1, 0.2f, F_BF16, err)) return -1;
        if (!c->layer_moe[i]) {
            if (add_mlp(l, qm, F_MXFP8, NM("%s.mlp", p), "gate_proj", "up_proj", "down_proj", H, c->dense_inter, err))
                return -1;
            continue;
        }
        if (add_linear(l, Q_NONE, F_BF16, NM("%s.block_sparse_moe.gate.weight", p), c->n_experts, H, 1.0f, err)) return -1;
        if (c->use_routing_bias &&
            add_spec(l, NM("%s.block_sparse_moe.e_score_correction_bias", p), 1, c->n_experts, 1, 0.3f, F_F32, err))
            return -1;
        for (int e = 0; e < c->n_experts; e++) {
            char base[128];
            snprintf(base, sizeof base, "%s.block_sparse_moe.experts.%d", p, e);
            if (add_mlp(l, qm, F_NVFP4, base, "w1", "w3", "w2", H, c->moe_inter, err)) return -1;
        }
        if (c->n_shared > 0 && add_mlp(l, qm, F_MXFP8, NM("%s.block_sparse_moe.shared_experts", p), "gate_proj",
                                       "up_proj", "down_proj", H, c->shared_inter, err))
            return -1;
#undef NM
    }
    if (add_spec(l, "model.norm.weight", 1, H, 1, 0.2f, F_BF16, err)) return -1;
    if (!c->tie_embeddings && add_linear(l, Q_NONE, F_BF16, "lm_head.weight", V, H, 1.0f, err)) return -1;
    return 0;
}

/* ------------------------------------------------------------------ generation */

typedef struct {
    const spec *s;
    const zig_tables *zig;
    uint64_t key;
    /* outputs (by format) */
    uint16_t *bf16;
    float *f32;            /* F32 output, or the f32 staging copy for NVFP4 */
    uint8_t *codes, *scales;
    float *row_amax;       /* NVFP4: max |x| per row, phase 1 */
    double gs;             /* NVFP4 global scale, phase 2 */
    float *scratch;        /* [nworkers][K] */
    int64_t scratch_k;
    atomic_int failed;
    m3_err err;
} gen_ctx;

static void gen_rows(void *arg, size_t b, size_t e, int worker) {
    gen_ctx *g = arg;
    const spec *s = g->s;
    const int64_t K = s->K;
    float *row = g->scratch + (size_t)worker * (size_t)g->scratch_k;
    for (size_t r = b; r < e; r++) {
        switch (s->fmt) {
        case F_BF16:
            fill_row(g->zig, g->key, (int64_t)r, s->std, row, K);
            for (int64_t k = 0; k < K; k++) g->bf16[r * (size_t)K + (size_t)k] = m3_f32_to_bf16(row[k]);
            break;
        case F_F32: fill_row(g->zig, g->key, (int64_t)r, s->std, g->f32 + r * (size_t)K, K); break;
        case F_NVFP4: {
            float *x = g->f32 + r * (size_t)K, amax = 0.0f;
            fill_row(g->zig, g->key, (int64_t)r, s->std, x, K);
            float m4[4] = {0, 0, 0, 0}; /* independent chains: K is a multiple of 16 here */
            for (int64_t k = 0; k < K; k += 4)
                for (int j = 0; j < 4; j++) {
                    float a = fabsf(x[k + j]);
                    m4[j] = a > m4[j] ? a : m4[j];
                }
            for (int j = 0; j < 4; j++) amax = m4[j] > amax ? m4[j] : amax;
            g->row_amax[r] = amax;
            break;
        }
        case F_MXFP8: {
            m3_err e2;
            fill_row(g->zig, g->key, (int64_t)r, s->std, row, K);
            if (m3_quant_mxfp8(row, 1, K, g->codes + r * (size_t)K, g->scales + r * (size_t)(K / 32), &e2) &&
                atomic_exchange(&g->failed, 1) == 0)
                g->err = e2;
            break;
        }
        }
    }
}

static void quant_nvfp4_rows(void *arg, size_t b, size_t e, int worker) {
    (void)worker;
    gen_ctx *g = arg;
    const int64_t K = g->s->K;
    m3_err e2;
    if (m3_quant_nvfp4_rows(g->f32 + b * (size_t)K, (int64_t)(e - b), K, g->gs, g->codes + b * (size_t)(K / 2),
                            g->scales + b * (size_t)(K / 16), &e2) &&
        atomic_exchange(&g->failed, 1) == 0)
        g->err = e2;
}

/* Buffers of one generated spec, owned until its shard is written. */
typedef struct {
    void *a, *b;   /* main data, scales */
    float gscalar; /* NVFP4 global scale (CT) or its reciprocal (ModelOpt) */
} gen_out;

static int generate(const spec *s, const zig_tables *zig, uint64_t seed, quant_mode qm, m3_pool *pool, float *scratch,
                    int64_t scratch_k, gen_out *o, m3_err *err) {
    gen_ctx g;
    memset(&g, 0, sizeof g);
    atomic_init(&g.failed, 0);
    g.s = s;
    g.zig = zig;
    g.key = m3_mix64(seed ^ 0x5851f42d4c957f2dull) ^ hash_name(s->name);
    g.scratch = scratch;
    g.scratch_k = scratch_k;
    const size_t ne = (size_t)s->N * (size_t)s->K;
    memset(o, 0, sizeof *o);
    size_t grain = (size_t)(65536 / s->K) + 1;
    switch (s->fmt) {
    case F_BF16:
        if (!(o->a = g.bf16 = malloc(ne * 2))) goto oom;
        break;
    case F_F32:
        if (!(o->a = g.f32 = malloc(ne * 4))) goto oom;
        break;
    case F_MXFP8:
        if (!(o->a = g.codes = malloc(ne)) || !(o->b = g.scales = malloc(ne / 32))) goto oom;
        break;
    case F_NVFP4:
        if (!(o->a = g.codes = malloc(ne / 2)) || !(o->b = g.scales = malloc(ne / 16)) || !(g.f32 = malloc(ne * 4)) ||
            !(g.row_amax = malloc((size_t)s->N * sizeof(float))))
            goto oom;
        break;
    }
    m3_pool_for(pool, (size_t)s->N, grain, gen_rows, &g);
    if (s->fmt == F_NVFP4 && !atomic_load(&g.failed)) {
        float amax = 0.0f;
        for (int64_t r = 0; r < s->N; r++) amax = g.row_amax[r] > amax ? g.row_amax[r] : amax;
        g.gs = m3_quant_nvfp4_gs(amax);
        m3_pool_for(pool, (size_t)s->N, grain, quant_nvfp4_rows, &g);
        /* ModelOpt stores the multiplier; 1.0f / (float)gs is exactly what the loader derives
         * from the compressed-tensors divisor, so both spellings give identical weights */
        o->gscalar = qm == Q_MODELOPT ? 1.0f / (float)g.gs : (float)g.gs;
    }
    if (s->fmt == F_NVFP4) { free(g.f32); free(g.row_amax); }
    if (atomic_load(&g.failed)) {
        free(o->a);
        free(o->b);
        memset(o, 0, sizeof *o);
        return m3_errf(err, "tensor '%s': %s", s->name, g.err.msg);
    }
    return 0;
oom:
    free(o->a);
    free(o->b);
    if (s->fmt == F_NVFP4) { free(g.f32); free(g.row_amax); }
    memset(o, 0, sizeof *o);
    return m3_errf(err, "out of memory generating '%s' [%lld, %lld]", s->name, (long long)s->N, (long long)s->K);
}

/* Adds the stored entries of one spec to the writer; names into `names` (kept alive). */
static int add_entries(m3_st_writer *w, const spec *s, const gen_out *o, const char *prefix, quant_mode qm,
                       json_t *weight_map, const char *file, m3_err *err) {
    char full[320], base[320];
    snprintf(full, sizeof full, "%s%s", prefix, s->name);
    snprintf(base, sizeof base, "%s", full);
    size_t bl = strlen(base);
    if (bl > 7 && strcmp(base + bl - 7, ".weight") == 0) base[bl - 7] = 0;
    int64_t sh[2] = {s->N, s->K}, one[1] = {1};
    const char *names[3];
    char n1[340], n2[340], n3[340];
    int cnt = 0;
    switch (s->fmt) {
    case F_BF16:
        if (m3_stw_add(w, full, M3_DT_BF16, s->ndim, sh, o->a, err)) return -1;
        names[cnt++] = full;
        break;
    case F_F32:
        if (m3_stw_add(w, full, M3_DT_F32, s->ndim, sh, o->a, err)) return -1;
        names[cnt++] = full;
        break;
    case F_MXFP8: {
        int64_t ss[2] = {s->N, s->K / 32};
        snprintf(n1, sizeof n1, "%s.weight", base);
        snprintf(n2, sizeof n2, "%s.weight_scale_inv", base);
        if (m3_stw_add(w, n1, M3_DT_F8_E4M3, 2, sh, o->a, err) || m3_stw_add(w, n2, M3_DT_U8, 2, ss, o->b, err))
            return -1;
        names[cnt++] = n1;
        names[cnt++] = n2;
        break;
    }
    case F_NVFP4: {
        int64_t ps[2] = {s->N, s->K / 2}, ss[2] = {s->N, s->K / 16};
        snprintf(n1, sizeof n1, "%s.%s", base, qm == Q_MODELOPT ? "weight" : "weight_packed");
        snprintf(n2, sizeof n2, "%s.weight_scale", base);
        snprintf(n3, sizeof n3, "%s.%s", base, qm == Q_MODELOPT ? "weight_scale_2" : "weight_global_scale");
        if (m3_stw_add(w, n1, M3_DT_U8, 2, ps, o->a, err) || m3_stw_add(w, n2, M3_DT_F8_E4M3, 2, ss, o->b, err) ||
            m3_stw_add(w, n3, M3_DT_F32, 1, one, &o->gscalar, err))
            return -1;
        names[cnt++] = n1;
        names[cnt++] = n2;
        names[cnt++] = n3;
        break;
    }
    }
    if (weight_map)
        for (int i = 0; i < cnt; i++)
            if (json_object_set_new(weight_map, names[i], json_string(file)))
                return m3_errf(err, "out of memory");
    return 0;
}

/* ------------------------------------------------------------------ JSON output like Python's json.dump(indent=1) */

/* Python repr() of a float: shortest round-trip digits, fixed notation for 1e-4 <= |v| < 1e16
 * (with ".0" when integral), else d.ddde[+-]XX. */
static void fmt_real(double v, char *out, size_t n) {
    if (!isfinite(v)) { snprintf(out, n, "%s", isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity"); return; }
    if (v == 0) { snprintf(out, n, "%s", signbit(v) ? "-0.0" : "0.0"); return; }
    char e[64];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    /* e = [-]d.ddde[+-]XX with p significant digits */
    char digits[32];
    int nd = 0, neg = e[0] == '-';
    const char *q = e + neg;
    for (; *q && *q != 'e'; q++)
        if (isdigit((unsigned char)*q)) digits[nd++] = *q;
    digits[nd] = 0;
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    int exp10 = atoi(q + 1);
    char *o = out;
    size_t left = n;
#define PUT(...) do { int w_ = snprintf(o, left, __VA_ARGS__); if (w_ < 0 || (size_t)w_ >= left) return; o += w_; left -= (size_t)w_; } while (0)
    if (neg) PUT("-");
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            PUT("0.");
            for (int i = 0; i < -exp10 - 1; i++) PUT("0");
            PUT("%s", digits);
        } else if (nd <= exp10 + 1) {
            PUT("%s", digits);
            for (int i = nd; i < exp10 + 1; i++) PUT("0");
            PUT(".0");
        } else {
            PUT("%.*s.%s", exp10 + 1, digits, digits + exp10 + 1);
        }
    } else {
        PUT("%c", digits[0]);
        if (nd > 1) PUT(".%s", digits + 1);
        PUT("e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
#undef PUT
}

static void dump_value(m3_sbuf *b, json_t *v, int depth) {
    char tmp[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        if (json_object_size(v) == 0) { m3_sbuf_str(b, "{}"); return; }
        m3_sbuf_str(b, "{");
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach(v, k, x) {
            m3_sbuf_str(b, first ? "\n" : ",\n");
            first = 0;
            for (int i = 0; i <= depth; i++) m3_sbuf_str(b, " ");
            json_t *ks = json_string(k);
            char *ke = ks ? json_dumps(ks, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
            json_decref(ks);
            if (!ke) { b->oom = 1; return; }
            m3_sbuf_str(b, ke);
            free(ke);
            m3_sbuf_str(b, ": ");
            dump_value(b, x, depth + 1);
        }
        m3_sbuf_str(b, "\n");
        for (int i = 0; i < depth; i++) m3_sbuf_str(b, " ");
        m3_sbuf_str(b, "}");
        return;
    }
    case JSON_ARRAY: {
        if (json_array_size(v) == 0) { m3_sbuf_str(b, "[]"); return; }
        m3_sbuf_str(b, "[");
        for (size_t j = 0; j < json_array_size(v); j++) {
            m3_sbuf_str(b, j ? ",\n" : "\n");
            for (int i = 0; i <= depth; i++) m3_sbuf_str(b, " ");
            dump_value(b, json_array_get(v, j), depth + 1);
        }
        m3_sbuf_str(b, "\n");
        for (int i = 0; i < depth; i++) m3_sbuf_str(b, " ");
        m3_sbuf_str(b, "]");
        return;
    }
    case JSON_REAL: fmt_real(json_real_value(v), tmp, sizeof tmp); m3_sbuf_str(b, tmp); return;
    case JSON_INTEGER: snprintf(tmp, sizeof tmp, "%lld", (long long)json_integer_value(v)); m3_sbuf_str(b, tmp); return;
    default: {
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
        if (!s) { b->oom = 1; return; }
        m3_sbuf_str(b, s);
        free(s);
        return;
    }
    }
}

/* ------------------------------------------------------------------ files */

static int mkdir_p(const char *path, m3_err *err) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return m3_errf(err, "%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return m3_errf(err, "%s: cannot create: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return m3_errf(err, "%s: cannot create: %s", buf, strerror(errno));
    struct stat sb;
    if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode)) return m3_errf(err, "%s: not a directory", buf);
    return 0;
}

static int write_text(const char *path, const char *text, size_t n, m3_err *err) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return m3_errf(err, "%s: cannot create: %s", tmp, strerror(errno));
    int ok = fwrite(text, 1, n, f) == n;
    if (fclose(f) != 0) ok = 0;
    if (!ok) { unlink(tmp); return m3_errf(err, "%s: write failed: %s", path, strerror(errno)); }
    if (rename(tmp, path) != 0) { unlink(tmp); return m3_errf(err, "%s: rename failed: %s", path, strerror(errno)); }
    return 0;
}

static int is_shard_name(const char *s) {
    /* model-NNNNN-of-NNNNN.safetensors */
    if (strlen(s) != strlen("model-00001-of-00001.safetensors") || strncmp(s, "model-", 6) != 0) return 0;
    for (int i = 6; i < 11; i++) if (!isdigit((unsigned char)s[i])) return 0;
    if (strncmp(s + 11, "-of-", 4) != 0) return 0;
    for (int i = 15; i < 20; i++) if (!isdigit((unsigned char)s[i])) return 0;
    return strcmp(s + 20, ".safetensors") == 0;
}

/* Removes weight files of an earlier run that the new checkpoint does not overwrite, so a
 * reader never mixes the two (a stale index would win over a fresh model.safetensors). */
static void remove_stale(const char *dir, int nfiles) {
    char p[4200];
    if (nfiles == 0) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        unlink(p);
    } else {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        unlink(p);
    }
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!is_shard_name(de->d_name)) continue;
        if (nfiles > 0 && atoi(de->d_name + 15) == nfiles && atoi(de->d_name + 6) >= 1 && atoi(de->d_name + 6) <= nfiles)
            continue; /* will be overwritten */
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
}

/* ------------------------------------------------------------------ config */

/* Loads the config JSON (validated by m3_config_load first), adjusts quantization_config for
 * the quant mode, and returns the config.json text to write (malloc'd), with *cfg parsed from
 * exactly that text. */
static char *make_config(const char *path, quant_mode qm, m3_config *cfg, size_t *len, m3_err *err) {
    json_t *root;
    char *orig = NULL;
    size_t orig_n = 0;
    if (path) {
        if (m3_config_load(cfg, path, err)) return NULL;
        m3_config_free(cfg);
        char file[4200];
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(file, sizeof file, "%s/config.json", path);
        else snprintf(file, sizeof file, "%s", path);
        FILE *f = fopen(file, "rb");
        if (!f) { m3_errf(err, "%s: cannot open: %s", file, strerror(errno)); return NULL; }
        m3_sbuf b = {0};
        char chunk[65536];
        size_t got;
        while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) m3_sbuf_add(&b, chunk, got);
        int rerr = ferror(f);
        fclose(f);
        if (b.oom || rerr || !b.p) { free(b.p); m3_errf(err, "%s: cannot read", file); return NULL; }
        orig = b.p;
        orig_n = b.n;
        json_error_t je;
        root = json_loadb(orig, orig_n, 0, &je);
        if (!root) { free(orig); m3_errf(err, "%s: bad JSON: %s (line %d)", file, je.text, je.line); return NULL; }
    } else {
        json_error_t je;
        root = json_loads(BUILTIN_CONFIG, 0, &je);
        if (!root) { m3_errf(err, "built-in config: bad JSON: %s", je.text); return NULL; }
    }
    json_t *tc = json_object_get(root, "text_config");
    if (!json_is_object(tc)) tc = NULL;
    int has_q = json_object_get(root, "quantization_config") != NULL ||
                (tc && json_object_get(tc, "quantization_config") != NULL);
    int changed = !path;
    if (qm == Q_NONE && has_q) {
        /* the tensors will be BF16: a quantization_config would send other loaders wrong */
        json_object_del(root, "quantization_config");
        if (tc) json_object_del(tc, "quantization_config");
        changed = 1;
    } else if (qm != Q_NONE && !has_q) {
        json_error_t je;
        json_t *q = json_loads(QUANT_CONFIG, 0, &je);
        if (!q || json_object_set_new(root, "quantization_config", q)) {
            json_decref(root);
            free(orig);
            m3_errf(err, "out of memory");
            return NULL;
        }
        changed = 1;
    }
    char *text;
    size_t n;
    if (changed) {
        m3_sbuf b = {0};
        dump_value(&b, root, 0);
        if (b.oom || !b.p) { json_decref(root); free(b.p); free(orig); m3_errf(err, "out of memory"); return NULL; }
        text = b.p;
        n = b.n;
        free(orig);
    } else {
        text = orig; /* copied byte for byte */
        n = orig_n;
    }
    json_decref(root);
    if (m3_config_parse(cfg, text, path ? path : "built-in config", err)) { free(text); return NULL; }
    *len = n;
    return text;
}

/* ------------------------------------------------------------------ --tokenizer */

/* The special tokens of the MiniMax-M3 chat format (spec section 5). Turn markers and the
 * end-of-turn (stop) token are special, so a decoder that skips special tokens drops them;
 * the think tags and the tool-call namespace are plain added tokens, so decoded text keeps
 * them for the reasoning and tool-call parsers (as in MiniMax's own tokenizer.json). */
static const struct { const char *text; int special; } M3_ADDED_TOKENS[] = {
    {"]~!b[", 1}, {"]~b]", 1}, {"[e~[", 1}, {"<mm:think>", 0}, {"</mm:think>", 0}, {"]<]minimax[>[", 0},
};

/* id of token text in tokenizer.json (added tokens, then the model vocabulary); -1 if absent */
static json_int_t tok_json_id(json_t *added, json_t *vocab, const char *text) {
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        const char *t = json_string_value(json_object_get(a, "content"));
        if (t && !strcmp(t, text)) return json_integer_value(json_object_get(a, "id"));
    }
    json_t *v = json_object_get(vocab, text);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* --tokenizer FILE: reads a tokenizer.json, adds the tokens above that it lacks as added
 * tokens with ids after its largest id, and returns the new tokenizer.json text and a
 * tokenizer_config.json naming ]~!b[ as BOS and [e~[ as EOS (both malloc'd). The config
 * text and *cfg are rewritten so vocab_size covers every id and bos / eos_token_id are
 * those two tokens (a model whose EOS is [e~[ stops at the end of its turn). */
static int add_tokenizer(const char *path, char **cfg_text, size_t *cfg_len, m3_config *cfg, char **tok_text,
                         char **tcfg_text, m3_err *err) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je), *croot = NULL;
    json_int_t max_id = -1, bos = -1, eos = -1;
    m3_sbuf b = {0};
    int rc = -1;
    if (!root && je.line < 1) return m3_errf(err, "--tokenizer %s: %s", path, je.text); /* could not read it */
    if (!root) return m3_errf(err, "%s: bad JSON: %s (line %d)", path, je.text, je.line);
    json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab)) { m3_errf(err, "%s: no model.vocab object", path); goto out; }
    if (!added) { added = json_array(); json_object_set_new(root, "added_tokens", added); }
    if (!json_is_array(added)) { m3_errf(err, "%s: added_tokens is not an array", path); goto out; }
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (id > max_id) max_id = id;
    }
    for (size_t t = 0; t < sizeof M3_ADDED_TOKENS / sizeof *M3_ADDED_TOKENS; t++) {
        json_int_t id = tok_json_id(added, vocab, M3_ADDED_TOKENS[t].text);
        if (id < 0) {
            id = ++max_id;
            json_t *a = json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", M3_ADDED_TOKENS[t].text,
                                  "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special",
                                  M3_ADDED_TOKENS[t].special);
            if (!a || json_array_append_new(added, a)) { m3_errf(err, "out of memory"); goto out; }
        }
        if (t == 0) bos = id;
        if (t == 2) eos = id;
    }
    *tok_text = json_dumps(root, JSON_COMPACT);
    json_t *tcfg = json_pack("{s:s,s:s}", "bos_token", M3_ADDED_TOKENS[0].text, "eos_token", M3_ADDED_TOKENS[2].text);
    *tcfg_text = tcfg ? json_dumps(tcfg, JSON_INDENT(2)) : NULL;
    json_decref(tcfg);
    if (!*tok_text || !*tcfg_text) { m3_errf(err, "out of memory"); goto out; }

    croot = json_loadb(*cfg_text, *cfg_len, 0, &je);
    json_t *tc = json_object_get(croot, "text_config");
    if (!json_is_object(tc)) tc = croot;
    if (!tc) { m3_errf(err, "config: bad JSON: %s", je.text); goto out; }
    json_int_t nv = json_integer_value(json_object_get(tc, "vocab_size"));
    if (nv < max_id + 1) nv = max_id + 1;
    if (json_object_set_new(tc, "vocab_size", json_integer(nv)) || json_object_set_new(tc, "bos_token_id", json_integer(bos)) ||
        json_object_set_new(tc, "eos_token_id", json_integer(eos))) { m3_errf(err, "out of memory"); goto out; }
    dump_value(&b, croot, 0);
    if (b.oom || !b.p) { m3_errf(err, "out of memory"); goto out; }
    m3_config_free(cfg);
    if (m3_config_parse(cfg, b.p, "config with --tokenizer", err)) goto out;
    free(*cfg_text);
    *cfg_text = b.p;
    *cfg_len = b.n;
    b.p = NULL;
    rc = 0;
out:
    free(b.p);
    json_decref(croot);
    json_decref(root);
    return rc;
}

/* ------------------------------------------------------------------ --with-dspark */

/* The built-in draft config for target c: the real draft's keys (spec section 4) with the
 * target's shapes (hidden, heads, head_dim, rotary, eps, vocab, dense width rounded up to 32);
 * 2 layers fed from up to 3 target layers (first, middle, last), block size 7, noise id V - 6,
 * Markov rank 32, sliding window 64 (small, so that tests cross it; the real one is 4096). */
static json_t *dspark_builtin_config(const m3_config *c) {
    const int64_t H = c->hidden, D = c->head_dim, V = c->vocab;
    int64_t F = c->dense_inter > 0 ? c->dense_inter : 2 * H;
    F = (F + 31) / 32 * 32;
    int nt = c->n_layers < 3 ? c->n_layers : 3;
    json_t *tl = json_array(), *lt = json_array(), *mf = json_array();
    if (!tl || !lt || !mf) { json_decref(tl); json_decref(lt); json_decref(mf); return NULL; }
    for (int i = 0; i < nt; i++)
        json_array_append_new(tl, json_integer(nt == 1 ? c->n_layers - 1 : (i * (c->n_layers - 1) + (nt - 1) / 2) / (nt - 1)));
    for (int l = 0; l < 2; l++) { json_array_append_new(lt, json_string("sliding_attention")); json_array_append_new(mf, json_integer(0)); }
    return json_pack("{s:[s],s:s,s:{s:s,s:i,s:I,s:I,s:i,s:i,s:I,s:i,s:f,s:f,s:f,s:I,s:f,s:f,s:s,s:b,s:i,s:o,s:o,s:n,"
                     "s:o,s:i,s:I,s:i,s:s,s:b},s:{s:s,s:[i,i]}}",
                     "architectures", "DSparkMiniMaxDraftModel", "model_type", "minimax_m3_vl", "text_config",
                     "model_type", "minimax_m3", "num_hidden_layers", 2, "hidden_size", (json_int_t)H,
                     "vocab_size", (json_int_t)V, "num_attention_heads", c->n_heads, "num_key_value_heads", c->n_kv_heads,
                     "head_dim", (json_int_t)D, "rotary_dim", c->rotary_dim,
                     "partial_rotary_factor", (double)c->rotary_dim / (double)D, "rope_theta", c->rope_theta,
                     "rms_norm_eps", c->rms_eps, "dense_intermediate_size", (json_int_t)F, "swiglu_alpha",
                     c->swiglu_alpha, "swiglu_limit", c->swiglu_limit, "hidden_act", "swigluoai", "use_gemma_norm", 1,
                     "sliding_window", 64, "layer_types", lt, "moe_layer_freq", mf, "sparse_attention_config",
                     "dspark_target_layer_ids", tl, "dspark_block_size", 7, "dspark_noise_token_id",
                     (json_int_t)(V > 6 ? V - 6 : V - 1), "dspark_markov_rank", 32, "dspark_markov_head_type", "vanilla",
                     "enable_confidence_head", 1, "quantization_config", "quant_method", "mxfp8", "weight_block_size", 1, 32);
}

/* A random DSpark draft for target c in OUT/dspark, in the real layout (spec section 4;
 * tensors "model.dspark.*" under the target's layout prefix): BF16 fc, hidden_norm,
 * final_norm, markov_head.markov_w{1,2}, confidence_head.proj.{weight,bias} (when
 * enable_confidence_head), and per layer an M3 dense decoder layer (BF16 norms, MXFP8
 * q/k/v/o and MLP linears). The config is dcfg_path's text byte for byte (for example
 * shared/configs/m3.1-flash-dspark-shapes.json), checked against the target, or the built-in
 * one above. Values: norms N(0, 0.2), linears N(0, 1/sqrt(K)) (MLP gate/up x3), markov_w1
 * N(0, 1); same seed, same files. Everything is held in memory until the one file is written. */
static int write_dspark(const char *out, const m3_config *c, const char *dcfg_path, uint64_t seed, int bare,
                        const zig_tables *zig, m3_pool *pool, m3_err *err) {
    char dir[4200], path[4300], nm[256];
    snprintf(dir, sizeof dir, "%s/dspark", out);
    spec_list L = {0};
    gen_out *outs = NULL;
    float *scratch = NULL;
    m3_st_writer *w = NULL;
    m3_sbuf b = {0};
    m3_dspark_config dc;
    memset(&dc, 0, sizeof dc);
    int rc = -1, have_dc = 0;
    if (dcfg_path) {
        FILE *f = fopen(dcfg_path, "rb");
        if (!f) return m3_errf(err, "%s: cannot open: %s", dcfg_path, strerror(errno));
        char chunk[65536];
        size_t got;
        while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) m3_sbuf_add(&b, chunk, got);
        fclose(f);
    } else {
        json_t *root = dspark_builtin_config(c);
        if (root) dump_value(&b, root, 0);
        json_decref(root);
        if (!root) b.oom = 1;
    }
    if (b.oom || !b.p) { m3_errf(err, "out of memory"); goto out; }
    if (m3_dspark_config_parse(&dc, b.p, dcfg_path ? dcfg_path : "built-in draft config", c, err)) goto out;
    have_dc = 1;
    if (mkdir_p(dir, err)) goto out;
    const m3_config *d = &dc.base;
    const int64_t H = d->hidden, D = d->head_dim, V = d->vocab, R = dc.markov_rank;
#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
#define ADD(x) do { if (x) goto out; } while (0)
    ADD(add_linear(&L, Q_NONE, F_BF16, "model.dspark.fc.weight", H, (int64_t)dc.n_target * H, 1.0f, err));
    ADD(add_spec(&L, "model.dspark.hidden_norm.weight", 1, H, 1, 0.2f, F_BF16, err));
    ADD(add_spec(&L, "model.dspark.final_norm.weight", 1, H, 1, 0.2f, F_BF16, err));
    ADD(add_spec(&L, "model.dspark.markov_head.markov_w1.weight", 2, V, R, 1.0f, F_BF16, err));
    ADD(add_linear(&L, Q_NONE, F_BF16, "model.dspark.markov_head.markov_w2.weight", V, R, 1.0f, err));
    if (dc.confidence_head) {
        ADD(add_linear(&L, Q_NONE, F_BF16, "model.dspark.confidence_head.proj.weight", 1, H + R, 1.0f, err));
        ADD(add_spec(&L, "model.dspark.confidence_head.proj.bias", 1, 1, 1, 0.2f, F_BF16, err));
    }
    for (int l = 0; l < d->n_layers; l++) {
        char p[96];
        snprintf(p, sizeof p, "model.dspark.layers.%d.decoder_layer", l);
        ADD(add_spec(&L, NM("%s.input_layernorm.weight", p), 1, H, 1, 0.2f, F_BF16, err));
        ADD(add_linear(&L, Q_CT, F_MXFP8, NM("%s.self_attn.q_proj.weight", p), (int64_t)d->n_heads * D, H, 1.0f, err));
        ADD(add_linear(&L, Q_CT, F_MXFP8, NM("%s.self_attn.k_proj.weight", p), (int64_t)d->n_kv_heads * D, H, 1.0f, err));
        ADD(add_linear(&L, Q_CT, F_MXFP8, NM("%s.self_attn.v_proj.weight", p), (int64_t)d->n_kv_heads * D, H, 1.0f, err));
        ADD(add_linear(&L, Q_CT, F_MXFP8, NM("%s.self_attn.o_proj.weight", p), H, (int64_t)d->n_heads * D, 1.0f, err));
        ADD(add_spec(&L, NM("%s.self_attn.q_norm.weight", p), 1, D, 1, 0.2f, F_BF16, err));
        ADD(add_spec(&L, NM("%s.self_attn.k_norm.weight", p), 1, D, 1, 0.2f, F_BF16, err));
        ADD(add_spec(&L, NM("%s.post_attention_layernorm.weight", p), 1, H, 1, 0.2f, F_BF16, err));
        ADD(add_mlp(&L, Q_CT, F_MXFP8, NM("%s.mlp", p), "gate_proj", "up_proj", "down_proj", H, d->dense_inter, err));
    }
    int64_t max_k = 1;
    uint64_t total = 0;
    for (size_t i = 0; i < L.n; i++) {
        if (L.s[i].K > max_k) max_k = L.s[i].K;
        total += L.s[i].bytes;
    }
    outs = calloc(L.n, sizeof *outs);
    scratch = malloc((size_t)m3_pool_size(pool) * (size_t)max_k * sizeof *scratch);
    w = m3_stw_new();
    if (!outs || !scratch || !w) { m3_errf(err, "out of memory"); goto out; }
    for (size_t i = 0; i < L.n; i++)
        ADD(generate(&L.s[i], zig, seed, Q_CT, pool, scratch, max_k, &outs[i], err) ||
            add_entries(w, &L.s[i], &outs[i], bare ? "" : "language_model.", Q_CT, NULL, NULL, err));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ADD(m3_stw_write(w, path, err));
    snprintf(path, sizeof path, "%s/config.json", dir);
    ADD(write_text(path, b.p, b.n, err));
    fprintf(stderr, "m3 make-tiny: wrote a DSpark draft (%zu weights, %.1f MB; %d layers fed from target layers", L.n,
            (double)total / 1e6, d->n_layers);
    for (int i = 0; i < dc.n_target; i++) fprintf(stderr, "%s%d", i ? "," : " ", dc.target_layers[i]);
    fprintf(stderr, ") to %s\n", dir);
    rc = 0;
#undef ADD
#undef NM
out:
    if (outs)
        for (size_t i = 0; i < L.n; i++) { free(outs[i].a); free(outs[i].b); }
    free(outs);
    free(scratch);
    m3_stw_free(w);
    free(b.p);
    free(L.s);
    if (have_dc) m3_dspark_config_free(&dc);
    return rc;
}

/* ------------------------------------------------------------------ command */

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "m3 make-tiny: %s (m3 make-tiny --help for usage)\n", msg);
    return 2;
}

static int parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-' || *s == '+' || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static const char *quant_name(quant_mode q) {
    return q == Q_NONE ? "none" : q == Q_CT ? "mxfp8-nvfp4" : "mxfp8-nvfp4-modelopt";
}

int m3_cmd_make_tiny(int argc, char **argv) {
    const char *out = NULL, *config = NULL, *tokenizer = NULL;
    uint64_t seed = 1234, shard_mb = 0;
    quant_mode qm = Q_NONE;
    int bare = 0, with_dspark = 0;
    const char *dspark_config = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!a) continue;
        if (strcmp(a, "--with-dspark") == 0) { with_dspark = 1; continue; }
        if (strcmp(a, "--dspark-config") == 0) {
            if (i + 1 >= argc || !argv[i + 1] || !*argv[i + 1]) return usage_error("%s", "--dspark-config needs a file name");
            dspark_config = argv[++i];
            with_dspark = 1;
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        }
        static const char *const flags[] = {"--out", "--config", "--seed", "--quant", "--layout", "--shard-mb", "--tokenizer"};
        const char *val = NULL;
        int which = -1;
        for (int f = 0; f < (int)(sizeof flags / sizeof *flags); f++) {
            size_t fl = strlen(flags[f]);
            if (strcmp(a, flags[f]) == 0) {
                if (i + 1 >= argc || !argv[i + 1]) return usage_error("%s needs a value", flags[f]);
                val = argv[++i];
                which = f;
                break;
            }
            if (strncmp(a, flags[f], fl) == 0 && a[fl] == '=') {
                val = a + fl + 1;
                which = f;
                break;
            }
        }
        switch (which) {
        case 0: out = val; break;
        case 1: config = val; break;
        case 2:
            if (parse_u64(val, &seed)) return usage_error("--seed: '%s' is not an unsigned integer", val);
            break;
        case 3:
            if (strcmp(val, "none") == 0) qm = Q_NONE;
            else if (strcmp(val, "mxfp8-nvfp4") == 0) qm = Q_CT;
            else if (strcmp(val, "mxfp8-nvfp4-modelopt") == 0) qm = Q_MODELOPT;
            else return usage_error("--quant: '%s' is not one of none, mxfp8-nvfp4, mxfp8-nvfp4-modelopt", val);
            break;
        case 4:
            if (strcmp(val, "hub") == 0) bare = 0;
            else if (strcmp(val, "bare") == 0) bare = 1;
            else return usage_error("--layout: '%s' is not hub or bare", val);
            break;
        case 5:
            if (parse_u64(val, &shard_mb) || shard_mb > (1ull << 40))
                return usage_error("--shard-mb: '%s' is not a non-negative integer", val);
            break;
        case 6: tokenizer = val; break;
        default: return usage_error("unknown argument '%s'", a);
        }
    }
    if (!out || !*out) return usage_error("%s", "--out DIR is required");
    if (config && !*config) return usage_error("%s", "--config needs a file name");
    if (strlen(out) > 3800) return usage_error("%s", "--out: path too long");

    const double t0 = m3_now();
    m3_err err = {{0}};
    m3_config cfg;
    memset(&cfg, 0, sizeof cfg);
    spec_list L = {0};
    m3_pool *pool = NULL;
    float *scratch = NULL;
    gen_out *outs = NULL;
    json_t *index = NULL, *wmap = NULL;
    zig_tables zig;
    size_t cfg_len = 0;
    int rc = 1, nfiles = 0;
    uint64_t total = 0;
    size_t n_entries = 0;
    char *cfg_text = make_config(config, qm, &cfg, &cfg_len, &err), *tok_text = NULL, *tcfg_text = NULL;
    if (!cfg_text) goto fail;
    if (tokenizer && add_tokenizer(tokenizer, &cfg_text, &cfg_len, &cfg, &tok_text, &tcfg_text, &err)) goto fail;
    if (plan(&cfg, qm, &L, &err)) goto fail;

    /* shards: consecutive specs up to about shard_mb * 10^6 bytes each */
    const uint64_t limit = shard_mb * 1000000ull;
    uint64_t cur = 0, biggest = 0, shard_bytes = 0;
    int64_t max_k = 1;
    for (size_t i = 0; i < L.n; i++) {
        spec *s = &L.s[i];
        if (shard_mb && cur > 0 && cur + s->bytes > limit) { nfiles++; cur = 0; }
        s->shard = nfiles;
        cur += s->bytes;
        total += s->bytes;
        if (s->K > max_k) max_k = s->K;
        n_entries += s->fmt == F_MXFP8 ? 2 : s->fmt == F_NVFP4 ? 3 : 1;
    }
    nfiles = shard_mb ? nfiles + 1 : 0; /* 0: single model.safetensors */
    for (int f = 0, k = 0; f < (nfiles ? nfiles : 1); f++) {
        shard_bytes = 0;
        for (; k < (int)L.n && (nfiles == 0 || L.s[k].shard == f); k++) shard_bytes += L.s[k].bytes;
        if (shard_bytes > biggest) biggest = shard_bytes;
    }
    {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
        double phys = pages > 0 && psz > 0 ? (double)pages * (double)psz : 0;
        if (phys > 0 && (double)biggest > 0.75 * phys) {
            m3_errf(&err, "%s %.2f GB would have to be held in memory at once (%.1f GB of RAM); %s",
                    nfiles ? "a shard of" : "the single-file checkpoint of", (double)biggest / 1e9, phys / 1e9,
                    nfiles ? "use a smaller --shard-mb" : "use --shard-mb N");
            goto fail;
        }
    }

    if (mkdir_p(out, &err)) goto fail;
    zig_init(&zig);
    pool = m3_pool_create(0);
    if (!pool) { m3_errf(&err, "cannot start worker threads"); goto fail; }
    scratch = malloc((size_t)m3_pool_size(pool) * (size_t)max_k * sizeof *scratch);
    outs = calloc(L.n, sizeof *outs);
    if (!scratch || !outs) { m3_errf(&err, "out of memory"); goto fail; }
    if (nfiles) {
        index = json_object();
        wmap = json_object();
        json_t *meta = json_object();
        if (!index || !wmap || !meta || json_object_set_new(meta, "total_size", json_integer((json_int_t)total)) ||
            json_object_set_new(index, "metadata", meta) || json_object_set(index, "weight_map", wmap)) {
            m3_errf(&err, "out of memory");
            goto fail;
        }
    }
    remove_stale(out, nfiles);

    const char *prefix = bare ? "" : "language_model.";
    size_t k = 0;
    for (int f = 0; f < (nfiles ? nfiles : 1); f++) {
        char fname[64], path[4200];
        if (nfiles) snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", f + 1, nfiles);
        else snprintf(fname, sizeof fname, "model.safetensors");
        snprintf(path, sizeof path, "%s/%s", out, fname);
        m3_st_writer *w = m3_stw_new();
        if (!w) { m3_errf(&err, "out of memory"); goto fail; }
        size_t first = k;
        int bad = 0;
        for (; k < L.n && (nfiles == 0 || L.s[k].shard == f); k++) {
            if (generate(&L.s[k], &zig, seed, qm, pool, scratch, max_k, &outs[k], &err) ||
                add_entries(w, &L.s[k], &outs[k], prefix, qm, wmap, fname, &err)) {
                k++;
                bad = 1;
                break;
            }
        }
        if (!bad && m3_stw_write(w, path, &err)) bad = 1;
        m3_stw_free(w);
        for (size_t j = first; j < k; j++) {
            free(outs[j].a);
            free(outs[j].b);
            memset(&outs[j], 0, sizeof outs[j]);
        }
        if (bad) goto fail;
    }
    if (nfiles) {
        char *txt = json_dumps(index, JSON_INDENT(2) | JSON_SORT_KEYS);
        char path[4200];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
        if (!txt) { m3_errf(&err, "out of memory"); goto fail; }
        int w = write_text(path, txt, strlen(txt), &err);
        free(txt);
        if (w) goto fail;
    }
    {
        char path[4200];
        snprintf(path, sizeof path, "%s/config.json", out);
        if (write_text(path, cfg_text, cfg_len, &err)) goto fail;
        snprintf(path, sizeof path, "%s/tokenizer.json", out);
        if (tok_text && write_text(path, tok_text, strlen(tok_text), &err)) goto fail;
        snprintf(path, sizeof path, "%s/tokenizer_config.json", out);
        if (tcfg_text && write_text(path, tcfg_text, strlen(tcfg_text), &err)) goto fail;
    }
    if (with_dspark && write_dspark(out, &cfg, dspark_config, seed, bare, &zig, pool, &err)) goto fail;
    fprintf(stderr,
            "m3 make-tiny: wrote %zu tensors (%zu weights), %llu bytes (%.1f MB) in %d file%s to %s in %.2f s "
            "(quant %s, layout %s, seed %llu, %d threads)\n",
            n_entries, L.n, (unsigned long long)total, (double)total / 1e6, nfiles ? nfiles : 1,
            nfiles > 1 ? "s" : "", out, m3_now() - t0, quant_name(qm), bare ? "bare" : "hub",
            (unsigned long long)seed, m3_pool_size(pool));
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "m3 make-tiny: %s\n", err.msg[0] ? err.msg : "failed");
    rc = 1;
done:
    if (outs)
        for (size_t j = 0; j < L.n; j++) { free(outs[j].a); free(outs[j].b); }
    free(outs);
    free(scratch);
    if (pool) m3_pool_free(pool);
    json_decref(wmap);
    json_decref(index);
    free(L.s);
    free(cfg_text);
    free(tok_text);
    free(tcfg_text);
    m3_config_free(&cfg);
    return rc;
}
