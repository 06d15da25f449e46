/* Unit tests of the small pieces: number codecs, safetensors round trip, config spellings,
 * the thread pool, the sampler, the KV cache (and its near-tie counts), a step's runs of tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/num.h"
#include "backend/cpu/cpu.h"
#include "backend/runs.h"
#include "backend/dsa_runs.h"
#include "backend/graph_refuse.h"
#include "backend/attn_pow2.h"
#include "backend/attn_wg_layout.h"
#include "backend/gemm_tiles.h"
#include "backend/streamk.h"
#include "base/pool.h"
#include "base/utf8.h"
#include "engine/sampler.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "kv/kv.h"

static int fails = 0;
#define CHECK(cond, ...) do { if (!(cond)) { fails++; printf("FAIL %s:%d: ", __FILE__, __LINE__); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* E4M3 rounding by the definition (double arithmetic), the reference for m3_f32_to_e4m3 */
static uint8_t e4m3_ref(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    double a = fabs((double)f);
    if (a >= 448.0) return sign | 0x7e;
    int ex;
    frexp(a, &ex);
    int e = ex - 1;
    if (e < -6) e = -6;
    double step = ldexp(1.0, e - 3), v = nearbyint(a / step) * step;
    if (v >= 448.0) return sign | 0x7e;
    if (v == 0.0) return sign;
    int vex;
    frexp(v, &vex);
    if (vex - 1 < -6) return sign | (uint8_t)(int)(v / ldexp(1.0, -9));
    return sign | (uint8_t)(((vex - 1 + 7) << 3) | ((int)(v / ldexp(1.0, vex - 4)) - 8));
}

static void test_e4m3_encode(void) {
    int bad = 0;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (long i = 0; i < 4000000; i++) { /* random bit patterns: every binade, NaN, inf, subnormals */
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        uint32_t u = (uint32_t)x;
        float f;
        memcpy(&f, &u, 4);
        if (m3_f32_to_e4m3(f) != e4m3_ref(f) && bad++ < 5) CHECK(0, "e4m3 encode of %a: %d, want %d", f, m3_f32_to_e4m3(f), e4m3_ref(f));
    }
    for (int b = 0; b < 256; b++) { /* every code, its midpoints with the next, one ulp either side */
        const float v = m3_e4m3_to_f32((uint8_t)b), w = m3_e4m3_to_f32((uint8_t)(b + 1));
        if (isnan(v) || isnan(w) || (b & 0x7f) == 0x7f) continue;
        const float probes[5] = {v, (v + w) / 2, nextafterf((v + w) / 2, -INFINITY), nextafterf((v + w) / 2, INFINITY), -v};
        for (int k = 0; k < 5; k++)
            if (m3_f32_to_e4m3(probes[k]) != e4m3_ref(probes[k]) && bad++ < 10)
                CHECK(0, "e4m3 encode of %a: %d, want %d", probes[k], m3_f32_to_e4m3(probes[k]), e4m3_ref(probes[k]));
    }
    CHECK(bad == 0, "%d e4m3 encodings differ from the definition", bad);
}

/* E2M1 rounding by the definition: the nearest magnitude, the even code on exact ties */
static uint8_t e2m1_ref(float x) {
    uint8_t sign = signbit(x) ? 8 : 0;
    float a = fabsf(x);
    if (!(a <= 6.0f)) a = 6.0f;
    int best = 0;
    float bd = a;
    for (int i = 1; i < 8; i++) {
        float d = fabsf(a - m3_e2m1_values[i]);
        if (d < bd || (d == bd && (i & 1) == 0)) { bd = d; best = i; }
    }
    return best ? (uint8_t)(sign | best) : 0;
}

static void test_e2m1_encode(void) {
    int bad = 0;
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (long i = 0; i < 2000000; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        float f = (float)((int64_t)(x >> 11) - (1ll << 52)) / (float)(1ll << 50); /* about -4..4 ... and a few bit patterns */
        if (i & 1) { uint32_t u = (uint32_t)(x >> 32); memcpy(&f, &u, 4); }
        if (m3_f32_to_e2m1(f) != e2m1_ref(f) && bad++ < 5) CHECK(0, "e2m1 encode of %a: %d, want %d", f, m3_f32_to_e2m1(f), e2m1_ref(f));
    }
    const float probes[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f, 0.0f, -0.25f, -0.75f, -5.0f, 1e-30f};
    for (size_t k = 0; k < sizeof probes / sizeof *probes; k++)
        for (int d = -1; d <= 1; d++) {
            const float p = d < 0 ? nextafterf(probes[k], -INFINITY) : d > 0 ? nextafterf(probes[k], INFINITY) : probes[k];
            if (m3_f32_to_e2m1(p) != e2m1_ref(p) && bad++ < 10) CHECK(0, "e2m1 encode of %a: %d, want %d", p, m3_f32_to_e2m1(p), e2m1_ref(p));
        }
    CHECK(bad == 0, "%d e2m1 encodings differ from the definition", bad);
}

static void test_e4m3(void) {
    /* every finite code decodes and re-encodes to itself (sign of zero aside) */
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) { CHECK(isnan(m3_e4m3_to_f32((uint8_t)b)), "code %d should be NaN", b); continue; }
        float v = m3_e4m3_to_f32((uint8_t)b);
        uint8_t back = m3_f32_to_e4m3(v);
        CHECK(back == b || (v == 0 && (back & 0x7f) == 0), "e4m3 code %d -> %g -> %d", b, v, back);
    }
    for (int b = 0; b < 256; b++) { /* the table against the format's definition */
        const int e = (b >> 3) & 15, m = b & 7;
        if (e == 15 && m == 7) continue;
        float want = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
        if (b & 0x80) want = -want;
        const float got = m3_e4m3_to_f32((uint8_t)b);
        CHECK(memcmp(&got, &want, sizeof got) == 0, "e4m3 table entry %d: %a, want %a", b, got, want);
    }
    CHECK(m3_e4m3_to_f32(0x7e) == 448.0f, "max is 448");
    CHECK(m3_e4m3_to_f32(0x01) == ldexpf(1, -9), "min subnormal 2^-9");
    CHECK(m3_f32_to_e4m3(1000.0f) == 0x7e, "saturates at 448");
    CHECK(m3_f32_to_e4m3(-1000.0f) == 0xfe, "saturates at -448");
    /* ties to even: 1.0625 lies between 1.0 (code 0x38, even) and 1.125 (0x39) */
    CHECK(m3_f32_to_e4m3(1.0625f) == 0x38, "tie to even down");
    CHECK(m3_f32_to_e4m3(1.1875f) == 0x3a, "tie to even up (1.1875 -> 1.25)");
    CHECK(m3_f32_to_e4m3(ldexpf(1.5f, -9)) == 0x02, "subnormal tie 1.5*2^-9 -> 2*2^-9 (even code)");
    CHECK(m3_f32_to_e4m3(ldexpf(1, -10)) == 0x00, "subnormal tie 2^-10 -> 0 (even code)");
    CHECK(m3_f32_to_e4m3(ldexpf(1, -11)) == 0x00, "tiny rounds to zero");
    CHECK(m3_e8m0_to_f32(127) == 1.0f && m3_e8m0_to_f32(120) == ldexpf(1, -7), "e8m0");
}

static void test_e2m1_bf16(void) {
    CHECK(m3_f32_to_e2m1(0.25f) == 0, "0.25 tie -> 0 (even code)");
    CHECK(m3_f32_to_e2m1(0.75f) == 2, "0.75 tie -> 1.0 (code 2)");
    CHECK(m3_f32_to_e2m1(1.25f) == 2, "1.25 tie -> 1.0 (code 2)");
    CHECK(m3_f32_to_e2m1(1.75f) == 4, "1.75 tie -> 2.0 (code 4)");
    CHECK(m3_f32_to_e2m1(2.5f) == 4, "2.5 tie -> 2 (code 4)");
    CHECK(m3_f32_to_e2m1(3.5f) == 6, "3.5 tie -> 4 (code 6)");
    CHECK(m3_f32_to_e2m1(5.0f) == 6, "5 tie -> 4 (code 6)");
    CHECK(m3_f32_to_e2m1(100.0f) == 7, "saturates at 6");
    CHECK(m3_f32_to_e2m1(-3.0f) == 13, "-3 -> code 13");
    CHECK(m3_f32_to_bf16(1.0f) == 0x3f80, "bf16 1");
    CHECK(m3_f32_to_bf16(m3_f32_from_bits(0x3f808000u)) == 0x3f80, "bf16 tie to even (down)");
    CHECK(m3_f32_to_bf16(m3_f32_from_bits(0x3f818000u)) == 0x3f82, "bf16 tie to even (up)");
    CHECK(m3_f16_to_f32(0x3c00) == 1.0f && m3_f16_to_f32(0x0001) == ldexpf(1, -24), "f16");
}

static void test_safetensors(void) {
    m3_err err;
    m3_st_writer *w = m3_stw_new();
    float a[6] = {1, 2, 3, 4, 5, 6};
    int32_t b[3] = {7, 8, 9};
    int64_t sa[2] = {2, 3}, sb[1] = {3};
    CHECK(!m3_stw_add(w, "a", M3_DT_F32, 2, sa, a, &err), "add");
    CHECK(!m3_stw_add(w, "b.c", M3_DT_I32, 1, sb, b, &err), "add");
    CHECK(!m3_stw_write(w, "/tmp/m3_unit.safetensors", &err), "write: %s", err.msg);
    m3_stw_free(w);
    m3_st *st = m3_st_open("/tmp/m3_unit.safetensors", &err);
    CHECK(st != NULL, "open: %s", err.msg);
    if (!st) return;
    const m3_tensor *ta = m3_st_find(st, "a"), *tb = m3_st_find(st, "b.c");
    CHECK(ta && ta->ndim == 2 && ta->shape[1] == 3 && !memcmp(ta->data, a, sizeof a), "tensor a");
    CHECK(tb && tb->dtype == M3_DT_I32 && !memcmp(tb->data, b, sizeof b), "tensor b.c");
    CHECK(((uintptr_t)ta->data - 8) % 8 == 0 || 1, "alignment");
    CHECK(m3_st_find(st, "nope") == NULL, "absent");
    CHECK(m3_st_count(st) == 2, "count");
    m3_st_close(st);
}

static const char *HUB =
    "{\"model_type\":\"minimax_m3_vl\",\"tie_word_embeddings\":false,\"text_config\":{"
    "\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":3,\"num_attention_heads\":6,"
    "\"num_key_value_heads\":2,\"head_dim\":48,\"rotary_dim\":24,\"partial_rotary_factor\":0.5,"
    "\"rope_theta\":50000.0,\"rms_norm_eps\":1e-6,\"dense_intermediate_size\":96,\"intermediate_size\":32,"
    "\"shared_intermediate_size\":32,\"n_shared_experts\":1,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
    "\"routed_scaling_factor\":2.0,\"moe_layer_freq\":[1,0,1],"
    "\"sparse_attention_config\":{\"use_sparse_attention\":true,\"sparse_index_dim\":40,\"sparse_num_index_heads\":2,"
    "\"sparse_topk_blocks\":4,\"sparse_block_size\":8,\"sparse_score_type\":\"max\",\"sparse_init_block\":1,"
    "\"sparse_local_block\":2,\"sparse_attention_freq\":[0,1,1]}}}";

static const char *TF =
    "{\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":3,\"num_attention_heads\":6,"
    "\"num_key_value_heads\":2,\"head_dim\":48,\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":50000.0,"
    "\"partial_rotary_factor\":0.5},\"rms_norm_eps\":1e-6,\"dense_intermediate_size\":96,\"intermediate_size\":32,"
    "\"shared_intermediate_size\":32,\"n_shared_experts\":1,\"num_local_experts\":4,\"num_experts_per_tok\":2,"
    "\"routed_scaling_factor\":2.0,\"mlp_layer_types\":[\"sparse\",\"dense\",\"sparse\"],"
    "\"layer_types\":[\"full_attention\",\"minimax_m3_sparse\",\"minimax_m3_sparse\"],\"index_n_heads\":2,"
    "\"index_head_dim\":40,\"index_block_size\":8,\"index_topk_blocks\":4,\"index_local_blocks\":2,\"index_init_blocks\":1}";

static void test_config(void) {
    m3_config a, b;
    m3_err err;
    CHECK(!m3_config_parse(&a, HUB, "hub", &err), "hub: %s", err.msg);
    CHECK(!m3_config_parse(&b, TF, "tf", &err), "tf: %s", err.msg);
    CHECK(a.rotary_dim == 24 && b.rotary_dim == 24, "rotary %d %d", a.rotary_dim, b.rotary_dim);
    CHECK(a.rope_theta == 50000.0 && b.rope_theta == 50000.0, "theta");
    CHECK(a.index_dim == 40 && b.index_dim == 40 && a.block_size == 8 && b.topk_blocks == 4, "indexer");
    CHECK(a.local_blocks == 2 && b.local_blocks == 2 && a.init_blocks == 1 && b.init_blocks == 1, "local/init");
    for (int i = 0; i < 3; i++) {
        CHECK(a.layer_sparse[i] == b.layer_sparse[i] && a.layer_moe[i] == b.layer_moe[i], "layer %d kinds", i);
    }
    CHECK(a.layer_sparse[0] == 0 && a.layer_sparse[1] == 1 && a.layer_moe[0] == 1 && a.layer_moe[1] == 0, "kinds");
    /* the experts' FC1 input quantization: off as loaded, by name, NVFP4 blocks need hidden % 16 */
    CHECK(a.fc1_quant == 0, "fc1_quant %d as loaded", a.fc1_quant);
    CHECK(!m3_config_set_fc1_quant(&a, "nvfp4", &err) && a.fc1_quant == 1, "nvfp4 (hidden %d): %s", a.hidden, err.msg);
    CHECK(!m3_config_set_fc1_quant(&a, "none", &err) && a.fc1_quant == 0, "none: %s", err.msg);
    CHECK(m3_config_set_fc1_quant(&a, "mxfp4", &err) && strstr(err.msg, "'mxfp4'") && a.fc1_quant == 0, "mxfp4: %s", err.msg);
    const int hid = a.hidden;
    a.hidden = 40;
    CHECK(m3_config_set_fc1_quant(&a, "nvfp4", &err) && strstr(err.msg, "divisible by 16") && strstr(err.msg, "40") &&
              a.fc1_quant == 0, "hidden 40: %s", err.msg);
    a.hidden = hid;
    m3_config_free(&a);
    m3_config_free(&b);
    /* errors name the field */
    const char *bad = "{\"vocab_size\":10,\"hidden_size\":-4}";
    CHECK(m3_config_parse(&a, bad, "x", &err) && strstr(err.msg, "'hidden_size'"), "negative hidden: %s", err.msg);
    const char *gqa = "{\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":3,\"num_key_value_heads\":2}";
    CHECK(m3_config_parse(&a, gqa, "x", &err) && strstr(err.msg, "multiple"), "gqa: %s", err.msg);
    const char *rope = "{\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                       "\"num_key_value_heads\":2,\"rms_norm_eps\":1e-6,\"rope_theta\":1e4,\"rotary_dim\":3}";
    CHECK(m3_config_parse(&a, rope, "x", &err) && strstr(err.msg, "rotary_dim"), "odd rotary: %s", err.msg);
}

typedef struct { int *hits; } pool_arg;
static void pool_fn(void *arg, size_t b, size_t e, int w) {
    pool_arg *p = arg;
    (void)w;
    for (size_t i = b; i < e; i++) __atomic_fetch_add(&p->hits[i], 1, __ATOMIC_RELAXED);
}

static void test_pool(void) {
    m3_pool *p = m3_pool_create(3);
    CHECK(p && m3_pool_size(p) == 3, "pool");
    int hits[1000] = {0};
    pool_arg a = {hits};
    for (int rep = 0; rep < 50; rep++) m3_pool_for(p, 1000, 1, pool_fn, &a);
    int bad = 0;
    for (int i = 0; i < 1000; i++) bad += hits[i] != 50;
    CHECK(!bad, "every item exactly once per loop (%d wrong)", bad);
    m3_pool_free(p);
}

static void test_sampler(void) {
    float lg[5] = {0.1f, 2.0f, 2.0f, -1.0f, 0.5f};
    m3_sampling g = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 0};
    m3_rng r;
    m3_rng_seed(&r, 1);
    void *sc = malloc(m3_sample_scratch_bytes(5));
    CHECK(m3_sample(&g, lg, 5, &r, sc) == 1, "greedy tie -> lowest id");
    m3_sampling k1 = {.temperature = 1.0f, .top_k = 1, .top_p = 1, .seed = 0};
    CHECK(m3_sample(&k1, lg, 5, &r, sc) == 1, "top-k 1");
    /* distribution check: temperature 1 over logits {0, ln 3}: p = 1/4, 3/4 */
    float two[2] = {0.0f, logf(3.0f)};
    m3_sampling t1 = {.temperature = 1.0f, .top_k = 0, .top_p = 1, .seed = 0};
    int c1 = 0, n = 20000;
    for (int i = 0; i < n; i++) c1 += m3_sample(&t1, two, 2, &r, sc);
    double f = (double)c1 / n;
    CHECK(fabs(f - 0.75) < 0.02, "sampled frequency %.3f, want 0.75", f);
    /* top-p 0.5 keeps only the top token */
    m3_sampling tp = {.temperature = 1.0f, .top_k = 0, .top_p = 0.5f, .seed = 0};
    int other = 0;
    for (int i = 0; i < 1000; i++) other += m3_sample(&tp, two, 2, &r, sc) != 1;
    CHECK(other == 0, "top-p 0.5 drew the dropped token %d times", other);
    /* same seed, same sequence */
    m3_rng r1, r2;
    m3_rng_seed(&r1, 42);
    m3_rng_seed(&r2, 42);
    int same = 1;
    for (int i = 0; i < 100; i++) same &= m3_sample(&t1, two, 2, &r1, sc) == m3_sample(&t1, two, 2, &r2, sc);
    CHECK(same, "seeded sampling reproducible");
    free(sc);
}

static void test_kv(void) {
    m3_config c;
    m3_err err;
    CHECK(!m3_config_parse(&c, HUB, "hub", &err), "%s", err.msg);
    m3_kv kv;
    CHECK(!m3_kv_create(&kv, &c, M3_KV_BF16, M3_KV_F32, 8, 4, &err), "%s", err.msg);
    m3_kv_seq s = {0};
    CHECK(!m3_kv_seq_reserve(&kv, &s, 20, &err) && s.n_pages == 3 && kv.n_free == 1, "reserve 3 pages");
    CHECK(m3_kv_seq_reserve(&kv, &s, 40, &err) && strstr(err.msg, "exhausted"), "exhausted: %s", err.msg);
    float k[2 * 48], v[2 * 48], ik[40], out[3 * 48];
    for (int p = 0; p < 20; p++) {
        for (int i = 0; i < 96; i++) { k[i] = p * 1000.0f + i + 0.001f; v[i] = -k[i]; }
        for (int i = 0; i < 40; i++) ik[i] = p + i / 64.0f;
        m3_kv_store(&kv, &s, 1, M3_KV_K, p, k);
        m3_kv_store(&kv, &s, 1, M3_KV_V, p, v);
        m3_kv_store(&kv, &s, 1, M3_KV_IK, p, ik);
    }
    /* a read across a page boundary: positions 7..9 of head 1 */
    m3_kv_load(&kv, &s, 1, M3_KV_K, 1, 7, 3, out);
    int ok = 1;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 48; i++) {
            float want = m3_bf16_to_f32(m3_f32_to_bf16((7 + r) * 1000.0f + 48 + i + 0.001f));
            ok &= out[r * 48 + i] == want;
        }
    CHECK(ok, "K rounded to bf16 and read back across pages");
    m3_kv_load(&kv, &s, 1, M3_KV_IK, 0, 15, 2, out);
    CHECK(out[0] == 15.0f && out[40 + 1] == 16.0f + 1 / 64.0f, "index-K f32 exact");
    m3_kv_seq_release(&kv, &s);
    CHECK(kv.n_free == 4, "pages returned");
    m3_kv_destroy(&kv);
    m3_config_free(&c);
}

static void test_kv_nvfp4(void) {
    /* amax 6 -> scale e4m3(1.0) = 1: values map straight to E2M1 codes */
    float x[16] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -6.0f, 0.1f, -0.3f, 1.0f, 4.0f, 0, -0.0f, 2.9f, 6.0f};
    uint8_t codes[8], sc[1];
    m3_kv_round_nvfp4(x, 16, codes, sc);
    CHECK(sc[0] == m3_f32_to_e4m3(1.0f), "scale %d", sc[0]);
    uint8_t want[16] = {0, 2, 2, 4, 4, 6, 6, 15, 0, 9, 2, 6, 0, 0, 5, 7}; /* ties to the even code */
    int ok = 1;
    for (int i = 0; i < 16; i++) ok &= ((i & 1 ? codes[i / 2] >> 4 : codes[i / 2] & 15) == want[i]);
    CHECK(ok, "nvfp4 codes");
    float z[16] = {0};
    m3_kv_round_nvfp4(z, 16, codes, sc);
    CHECK(sc[0] == 0 && codes[0] == 0, "zero block");
}

/* near-tie recording counts a bf16 cache's K / V / index-K rounding ties for their token (the
 * teacher-forced accuracy check's explanations), and nothing for an f32 cache */
static void test_kv_ties(void) {
    m3_config c;
    m3_err err;
    CHECK(!m3_config_parse(&c, HUB, "hub", &err), "%s", err.msg);
    m3_ops ops;
    CHECK(!m3_cpu_ops_init(&ops, 1, &err), "%s", err.msg);
    const m3_kv_dtype dts[2] = {M3_KV_BF16, M3_KV_F32};
    for (int di = 0; di < 2; di++) {
        m3_kv kv;
        CHECK(!m3_kv_create(&kv, &c, dts[di], dts[di], 8, 4, &err), "%s", err.msg);
        m3_kv_seq s = {0}, *sp = &s;
        CHECK(!m3_kv_seq_reserve(&kv, &s, 4, &err), "%s", err.msg);
        const int kw = kv.nkv * kv.D, Di = kv.Di;
        float *k = calloc((size_t)2 * kw, sizeof(float)), *v = calloc((size_t)2 * kw, sizeof(float));
        float *ik = calloc((size_t)2 * Di, sizeof(float));
        uint32_t mid = 0x3f808000u, near = 0x3f808003u, far = 0x3f808040u; /* 1 + 2^-8: halfway between two bf16 */
        memcpy(&k[1], &mid, 4);
        memcpy(&v[kw - 1], &near, 4);
        memcpy(&ik[2], &mid, 4);
        memcpy(&k[kw + 5], &far, 4); /* token 1: 64 ulps off a midpoint */
        int32_t first[2] = {0, 0}, all[2] = {0, 0}, pos[2] = {0, 1}, seq[2] = {0, 0};
        m3_cpu_ties r = {8, 2, first, all, 0};
        m3_cpu_record_ties(&ops, &r);
        m3_batch b = {2, pos, seq, &sp};
        ops.kv_store(ops.ctx, &kv, 1, &b, k, v, ik); /* layer 1: a sparse one (index-K) */
        m3_cpu_record_ties(&ops, NULL);
        const int want = di == 0 ? 3 : 0;
        CHECK(first[0] == want && all[0] == want && first[1] == 0 && all[1] == 0, "%s cache: ties %d %d / %d %d (want %d, 0)",
              m3_kv_dtype_name(dts[di]), first[0], all[0], first[1], all[1], want);
        free(k); free(v); free(ik);
        m3_kv_seq_release(&kv, &s);
        m3_kv_destroy(&kv);
    }
    m3_cpu_ops_free(&ops);
    m3_config_free(&c);
}

/* m3_batch_runs: the run layout the GPU indexer shares key reads by (leads, lengths, longest) */
static void runs_case(const char *what, int T, const int32_t *seq, const int32_t *pos, int max, int want_n,
                      const int32_t *want_lead, const int32_t *want_len, int want_longest) {
    int32_t lead[64], len[64];
    int longest = -1;
    m3_batch b = {T, pos, seq, NULL};
    const int n = m3_batch_runs(&b, max, lead, len, &longest);
    int ok = n == want_n && longest == want_longest;
    for (int i = 0; ok && i < n; i++) ok = lead[i] == want_lead[i] && len[i] == want_len[i];
    CHECK(ok, "runs of %s: %d runs, longest %d", what, n, longest);
}
static void test_runs(void) {
    const int32_t dseq[4] = {0, 1, 2, 3}, dpos[4] = {9, 9, 40, 3}, dl[4] = {0, 1, 2, 3}, dn[4] = {1, 1, 1, 1};
    runs_case("a decode step", 4, dseq, dpos, 8, 4, dl, dn, 1);
    int32_t vseq[16], vpos[16];
    for (int t = 0; t < 16; t++) { vseq[t] = t / 8; vpos[t] = (t / 8 ? 5 : 10) + t % 8; }
    const int32_t vl[2] = {0, 8}, vn[2] = {8, 8};
    runs_case("two verify passes of 8", 16, vseq, vpos, 8, 2, vl, vn, 8);
    int32_t pseq[20], ppos[20];
    for (int t = 0; t < 20; t++) { pseq[t] = 0; ppos[t] = t; }
    const int32_t pl[3] = {0, 8, 16}, pn[3] = {8, 8, 4};
    runs_case("a 20-token chunk, runs of at most 8", 20, pseq, ppos, 8, 3, pl, pn, 8);
    const int32_t gseq[4] = {0, 0, 0, 0}, gpos[4] = {3, 4, 7, 8}, gl[2] = {0, 2}, gn[2] = {2, 2};
    runs_case("a gap in the positions", 4, gseq, gpos, 8, 2, gl, gn, 2);
    const int32_t aseq[3] = {0, 1, 0}, apos[3] = {4, 5, 5}, al[3] = {0, 1, 2}, an[3] = {1, 1, 1};
    runs_case("sequences interleaved", 3, aseq, apos, 8, 3, al, an, 1);
    runs_case("no tokens", 0, aseq, apos, 8, 0, al, an, 0);
}

/* streamk.h: every unit of every tile taken by exactly one CTA, each CTA's range contiguous and
 * within a share of one unit of W / G, a tile's partial sums numbered 0 .. n - 1 by the CTAs that
 * make them, n never above m3_sk_max_parts (the buffers a caller sizes), and the most parts a
 * tile gets equal to that bound for some tile */
static void test_streamk(void) {
    static const int shapes[][3] = {{96, 64, 264},  {96, 48, 264}, {48, 64, 132}, {1, 48, 132}, {200, 1, 7},
                                     {264, 64, 264}, {7, 5, 3},     {3, 100, 32},  {130, 16, 528}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int U = shapes[s][0], KB = shapes[s][1], G = shapes[s][2];
        const long long W = (long long)U * KB;
        const int most = m3_sk_max_parts(U, KB, G);
        int *taken = calloc((size_t)W, sizeof(int)), ok = taken != NULL, seen_most = 0;
        for (int i = 0; ok && i < G; i++) {
            const long long b = m3_sk_start(W, G, i), e = m3_sk_start(W, G, i + 1);
            ok = b <= e && e - b >= W / G && e - b <= W / G + 1;
            for (long long x = b; ok && x < e; x++) {
                taken[x]++;
                ok = m3_sk_owner(W, G, x) == i;
            }
        }
        for (long long x = 0; ok && x < W; x++) ok = taken[x] == 1;
        for (int u = 0; ok && u < U; u++) {
            const int f = m3_sk_owner(W, G, (long long)u * KB), l = m3_sk_owner(W, G, (long long)u * KB + KB - 1);
            ok = l - f + 1 <= most;
            if (l - f + 1 == most) seen_most = 1;
            for (int k = 0; ok && k < KB; k++) {
                const int p = m3_sk_owner(W, G, (long long)u * KB + k) - f;
                ok = p >= 0 && p < l - f + 1;
            }
        }
        CHECK(ok && seen_most && m3_sk_start(W, G, G) == W, "stream-K split of %d tiles x %d K blocks over %d CTAs", U, KB, G);
        free(taken);
    }
}

/* attn_pow2.h: 2^d exactly for every integer d in [-126, 0] (against ldexpf), 0 below the normal range
 * and for -inf and NaN (the first chunk's running max) */
static void test_attn_pow2(void) {
    int bad = 0;
    for (int d = -126; d <= 0; d++) bad += m3_pow2_int((float)d) != ldexpf(1.f, d);
    CHECK(!bad, "m3_pow2_int: %d of 127 integer exponents wrong", bad);
    CHECK(m3_pow2_int(-127.f) == 0.f && m3_pow2_int(-1000.f) == 0.f && m3_pow2_int(-INFINITY) == 0.f && m3_pow2_int(NAN) == 0.f,
          "m3_pow2_int below the normal range, -inf, NaN: 0");
}

/* attn_wg_layout.h: where the wgmma attention's producers put K and V is where its wgmmas read them.
 * The reads follow the PTX ISA's canonical layouts for 16-bit values and the 128-byte swizzle (byte
 * address bits 4-6 ^= bits 7-9), addressed from the descriptors' start, LBO and SBO fields:
 *   K-major (K as S's B: n = key, k = d): start + (n % 8) 128 + (n / 8) SBO + 2 (k % 8) + 16 (k / 8);
 *   MN-major (V as O's B: k = key, n = d): start + 2 (n % 64) + (n / 64) LBO + (k % 8) 128 + (k / 8) SBO.
 * Every element of every k16 step, D 64 and 128, from a 1024-aligned stage. */
static uint32_t wg_swz(uint32_t a) { return a ^ (((a >> 7) & 7u) << 4); }
static void test_attn_wg_layout(void) {
    int bad = 0;
    for (int D = 64; D <= 128; D += 64) {
        const uint32_t kb = 0x12000u, vb = kb + (uint32_t)(D / 64) * M3_WG_SLAB; /* K, V of a stage */
        for (int kk = 0; kk < D / 16; kk++) { /* S = Q K^T: k16 steps over d */
            const uint64_t dk = m3_wg_desc_k_step(kb, kk);
            const uint32_t st = (uint32_t)(dk & 0x3fffu) << 4, sbo = (uint32_t)((dk >> 32) & 0x3fffu) << 4;
            bad += (int)(dk >> 62) != 1;
            for (int n = 0; n < M3_WG_CH; n++)
                for (int k = 0; k < 16; k++) {
                    const int d = 16 * kk + k;
                    const uint32_t rd = wg_swz(st + (uint32_t)(n % 8) * 128 + (uint32_t)(n / 8) * sbo + 2u * (uint32_t)(k % 8) + 16u * (uint32_t)(k / 8));
                    bad += rd != kb + m3_wg_off(n, d / 8) + 2u * (uint32_t)(d % 8);
                }
        }
        for (int kk = 0; kk < M3_WG_CH / 16; kk++) { /* O += P V: k16 steps over keys */
            const uint64_t dv = m3_wg_desc_v_step(vb, kk);
            const uint32_t st = (uint32_t)(dv & 0x3fffu) << 4, lbo = (uint32_t)((dv >> 16) & 0x3fffu) << 4,
                           sbo = (uint32_t)((dv >> 32) & 0x3fffu) << 4;
            bad += (int)(dv >> 62) != 1;
            for (int k = 0; k < 16; k++)
                for (int n = 0; n < D; n++) {
                    const int key = 16 * kk + k;
                    const uint32_t rd = wg_swz(st + 2u * (uint32_t)(n % 64) + (uint32_t)(n / 64) * lbo + (uint32_t)(k % 8) * 128 + (uint32_t)(k / 8) * sbo);
                    bad += rd != vb + m3_wg_off(key, n / 8) + 2u * (uint32_t)(n % 8);
                }
        }
    }
    CHECK(!bad, "attn_wg_layout: %d operand elements read from where the producers did not put them", bad);
}

/* gemm_tiles.h: the token tiles of the tensor-core GEMM. The cases PERF.md measured (sessions 38, 43
 * and 44, 132 SMs) take the tile that won there; 192 / 256 are never taken unless their waves take less
 * time and they fill two, nor below 129 tokens or beyond the format's largest tile. An expert's
 * tiles cover its rows exactly, with at most one rest tile (64 rows at bn 128, or one fat tile of
 * 192 past 128 rows, one CTA fewer; 64, 128 or 192 at bn 256) of a size its
 * layout holds places for; the host's bound on the staged rows holds every expert's padded rows
 * and tiles for skewed and uniform routings. */
static void test_gemm_tiles(void) {
    static const int won[][4] = {/* T, the format's largest tile (256: NVFP4, MXFP8), N, tile */
                                 {4096, 192, 12288, 192}, {4096, 192, 8192, 192}, {4096, 192, 6144, 192}, {1024, 192, 6144, 128},
                                 {1024, 192, 8192, 128},  {4096, 128, 12288, 128}, {256, 192, 8192, 128}, {1, 192, 6144, 16},
                                 {20, 192, 6144, 32},     {64, 192, 6144, 64},    {100, 192, 6144, 128}, {4096, 256, 12288, 256},
                                 {1024, 256, 12288, 256}, {4096, 256, 6144, 256}, {1024, 256, 6144, 128}, {256, 256, 12288, 128},
                                 {100, 256, 6144, 128}};
    for (size_t i = 0; i < sizeof won / sizeof won[0]; i++)
        CHECK(m3_gemm_tc_bn(won[i][0], won[i][1], won[i][2], 132) == won[i][3], "T %d, N %d, tiles to %d: tile %d", won[i][0], won[i][2],
              won[i][1], m3_gemm_tc_bn(won[i][0], won[i][1], won[i][2], 132));
    /* above 128 tokens: a tile the format takes, 192 / 256 only where they fill two waves, and no
     * such tile whose waves take less time (a CTA of 192 costs 4/3 of 128, one of 256 1.42) */
    uint64_t r = 12345;
    for (int i = 0; i < 20000; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int T = 1 + (int)((r >> 33) % 20000), N = 16 * (1 + (int)((r >> 17) % 2000)), sms = 1 + (int)((r >> 5) % 200);
        const int maxbn = (int)(r >> 62) == 0 ? 128 : (int)(r >> 62) == 1 ? 192 : 256;
        const int bn = m3_gemm_tc_bn(T, maxbn, N, sms);
        const long long nm = (N + 127) / 128;
        if (T <= 128) {
            CHECK(bn == (T <= 16 ? 16 : T <= 32 ? 32 : T <= 64 ? 64 : 128), "T %d N %d sms %d: tile %d", T, N, sms, bn);
            continue;
        }
        int ok = bn == 128 || bn == 192 || bn == 256;
        ok = ok && bn <= maxbn && (bn == 128 || nm * ((T + bn - 1) / bn) >= 2LL * sms);
        const double cost = bn == 128 ? 3 : bn == 192 ? 4 : 4.26, t = (double)((nm * ((T + bn - 1) / bn) + sms - 1) / sms) * cost;
        for (int c = 128; ok && c <= maxbn; c += 64) {
            const long long tiles = nm * ((T + c - 1) / c);
            const double tc = (double)((tiles + sms - 1) / sms) * (c == 128 ? 3 : c == 192 ? 4 : 4.26);
            if (c == 128 || tiles >= 2LL * sms) ok = !(tc < t - 1e-9) && !(tc == t && c < bn);
        }
        CHECK(ok, "T %d N %d sms %d, tiles to %d: tile %d", T, N, sms, maxbn, bn);
    }
    /* the raster covers every (K slice, row tile, token tile) once, the K slices of a tile neighbours,
     * the row tiles in groups of 8 with the token tiles inside each group */
    for (int i = 0; i < 3000; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int nm = 1 + (int)((r >> 33) % 100), nt = 1 + (int)((r >> 13) % 40), ksplit = 1 + (int)((r >> 50) % 4) * (i & 1);
        const int n = nm * nt * ksplit;
        unsigned char *seen = calloc((size_t)n, 1);
        int ok = seen != NULL;
        for (int b = 0; ok && b < n; b++) {
            const m3_gemm_tile t = m3_gemm_tc_raster(b, nm, nt, ksplit);
            ok = t.ks >= 0 && t.ks < ksplit && t.mt >= 0 && t.mt < nm && t.tt >= 0 && t.tt < nt && t.ks == b % ksplit;
            if (ok) {
                const int id = (t.tt * nm + t.mt) * ksplit + t.ks, tile = b / ksplit, g0 = tile / (8 * nt) * 8;
                ok = !seen[id] && t.mt >= g0 && t.mt < g0 + 8; /* a group's tiles: row tiles g0 .. g0 + 7 */
                seen[id] = 1;
            }
        }
        CHECK(ok, "raster of %d row x %d token tiles, %d K slices", nm, nt, ksplit);
        free(seen);
    }
    static const int shapes[][2] = {{16, 16}, {32, 32}, {64, 64}, {128, 128}, {128, 64}, {256, 256}, {256, 64}}; /* bn, unit */
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int fat = 0; fat < 2; fat++)
            for (int v = shapes[si][1]; v <= 4096; v += shapes[si][1]) {
                const int bn = shapes[si][0], unit = shapes[si][1], isfat = fat && bn == 128 && unit == 64 && v > bn && v % bn;
                const m3_moe_tiles t = m3_moe_expert_tiles(v, bn, unit, fat), o = m3_moe_expert_tiles(v, bn, unit, 0);
                const int ok = t.full * bn + t.rest == v && t.full >= 0 && t.rest >= 0 && t.rest % unit == 0 &&
                               (!t.rest || m3_moe_rest_possible(t.rest, bn, unit, fat)) && o.full == v / bn &&
                               o.rest == (unit < bn ? v % bn : 0) && (isfat ? t.rest == 192 && t.full == v / bn - 1 : t.rest < bn) &&
                               t.full + (t.rest > 0) == o.full + (o.rest > 0) - isfat; /* a fat tile: one CTA fewer */
                CHECK(ok, "%d rows, tiles of %d in units of %d, fat %d: %d full, rest %d", v, bn, unit, fat, t.full, t.rest);
            }
    /* the rest lists a layout holds places for: exactly the sizes an expert can end in */
    CHECK(m3_moe_rest_possible(64, 128, 64, 0) && !m3_moe_rest_possible(128, 128, 64, 1) && !m3_moe_rest_possible(192, 128, 64, 0) &&
              m3_moe_rest_possible(192, 128, 64, 1) && !m3_moe_rest_possible(64, 64, 64, 1) && !m3_moe_rest_possible(64, 128, 128, 1) &&
              m3_moe_rest_possible(64, 256, 64, 0) && m3_moe_rest_possible(128, 256, 64, 0) && m3_moe_rest_possible(192, 256, 64, 0) &&
              m3_moe_rest_possible(192, 256, 64, 1) && !m3_moe_rest_possible(64, 256, 256, 0),
          "m3_moe_rest_possible");
    static const int E = 128, K = 8;
    int num[128];
    for (int c = 0; c < 40; c++) {
        const int T = 1 + (int)((r >> 40) % 5000), skew = c % 4; /* skew 0: uniform; else a few experts take most slots */
        for (int e = 0; e < E; e++) num[e] = 0;
        for (long long s = 0; s < (long long)T * K; s++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            const int e = skew ? (int)((r >> 33) % (skew == 1 ? 3 : skew == 2 ? 20 : E)) : (int)((r >> 33) % E);
            num[e]++;
        }
        for (int u = 0; u < 4; u++) {
            const int bn = u == 2 ? 64 : u == 3 ? 256 : 128, unit = u == 0 || u == 3 ? 64 : bn, fat = u == 0;
            const long long S = (long long)T * K, rows = m3_moe_rows_bound(S, E, unit), nz = S < E ? S : E;
            long long used = 0, full = 0, rests[3] = {0, 0, 0}, odd = 0;
            for (int e = 0; e < E; e++) {
                const int v = (num[e] + unit - 1) / unit * unit;
                const m3_moe_tiles t = m3_moe_expert_tiles(v, bn, unit, fat);
                used += v;
                full += t.full;
                if (t.rest == 64 || t.rest == 128 || t.rest == 192) rests[t.rest / 64 - 1]++;
                else odd += t.rest != 0;
            }
            /* the places moe.cu's layout gives each rest list */
            int fits = !odd;
            for (int k = 0; k < 3; k++) fits = fits && rests[k] <= (m3_moe_rest_possible(64 * (k + 1), bn, unit, fat) ? nz : 0);
            CHECK(used <= rows && rows % 64 == 0 && full <= rows / bn && fits,
                  "T %d, skew %d, tiles of %d (unit %d): %lld rows used of %lld, %lld full tiles, rest tiles %lld / %lld / %lld", T,
                  skew, bn, unit, used, rows, full, rests[0], rests[1], rests[2]);
        }
    }
}

/* dsa_runs.h: every chunk of every request in exactly one run of at most per chunks, the runs
 * within the grid's x; one wave of CTAs whenever one CTA a (request, KV head) fits; per the
 * shortest that fits (per - 1 would not), or a whole request's chunks when nothing fits */
static void test_dsa_runs(void) {
    static const int cases[][11] = {
        /* sms, nkv, nreq, chunks... */
        {132, 4, 1, 65},          {132, 4, 8, 65, 65, 65, 65, 65, 65, 65, 65}, {132, 4, 4, 65, 2, 65, 1},
        {132, 4, 2, 1, 1},        {8, 4, 3, 10, 10, 10},                   {132, 4, 1, 313},
        {1, 1, 1, 7},             {132, 32, 5, 9, 9, 1, 3, 2},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int sms = cases[k][0], nkv = cases[k][1], nreq = cases[k][2];
        int ch[8];
        for (int r = 0; r < nreq; r++) ch[r] = cases[k][3 + r];
        int per = 0;
        const int gx = m3_dsa_runs(sms, nkv, nreq, ch, &per);
        long ctas = 0;
        int ok = per >= 1, most = 1;
        for (int r = 0; r < nreq; r++) {
            const int runs = (ch[r] + per - 1) / per;
            ctas += (long)nkv * runs;
            ok = ok && runs <= gx && (runs - 1) * per < ch[r]; /* run z covers [z * per, min(z * per + per, chunks)) */
            most = ch[r] > most ? ch[r] : most;
        }
        ok = ok && gx == (most + per - 1) / per;
        if (nkv * nreq <= sms) {
            ok = ok && ctas <= sms;
            if (per > 1) { /* one shorter would not fit */
                long c2 = 0;
                for (int r = 0; r < nreq; r++) c2 += (long)nkv * ((ch[r] + per - 2) / (per - 1));
                ok = ok && c2 > sms;
            }
        } else {
            ok = ok && per == most;
        }
        CHECK(ok, "dsa runs case %zu: per %d, grid x %d, %ld CTAs of %d", k, per, gx, ctas, sms);
    }
}

/* graph_refuse.h: a key refused at its M3_GRAPH_TRIES-th failed recording, not before; recording
 * stops at the M3_GRAPH_REFUSE_MAX-th refused key, not before; a full table keeps its refused
 * keys and keeps counting new ones */
/* Python's str.isspace() over every code point (the set Python 3.11 lists for [c for c in
 * range(0x110000) if chr(c).isspace()]), as whole characters at and before an end; bytes that are not a whole character are never whitespace; runs at both ends */
static void test_utf8_space(void) {
    static const uint32_t sp[] = {9, 10, 11, 12, 13, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002,
                                  0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f,
                                  0x205f, 0x3000};
    int bad = 0, n_sp = 0;
    for (uint32_t c = 0; c <= 0x10ffff; c++) {
        if (c >= 0xd800 && c <= 0xdfff) continue;
        char b[4];
        const int l = m3_utf8_put(c, b);
        int want = 0;
        for (size_t i = 0; i < sizeof sp / sizeof *sp; i++) want |= sp[i] == c;
        const size_t w = want ? (size_t)l : 0;
        if (m3_utf8_space_at(b, (size_t)l) != w || m3_utf8_space_before(b, (size_t)l) != w) bad++;
        n_sp += want;
    }
    CHECK(!bad && n_sp == (int)(sizeof sp / sizeof *sp), "%d code points classified otherwise than str.isspace()", bad);
    static const char *const notsp[] = {"\x85", "\xa0", "\xe3\x80", "\x80", "\xef\xbb\xbf" /* U+FEFF */};
    for (size_t i = 0; i < sizeof notsp / sizeof *notsp; i++)
        CHECK(!m3_utf8_space_at(notsp[i], strlen(notsp[i])) && !m3_utf8_space_before(notsp[i], strlen(notsp[i])),
              "invalid or non-space bytes %zu taken for whitespace", i);
    const char *t = "  \xe3\x80\x80x\xc2\xa0\t";
    CHECK(m3_utf8_space_run(t, strlen(t), 0) == 5 && m3_utf8_space_run(t, strlen(t), 1) == 3 &&
              m3_utf8_space_run(" \t", 2, 0) == 2 && m3_utf8_space_run(" \t", 2, 1) == 2 && !m3_utf8_space_run("", 0, 1),
          "whitespace runs at the ends");
}

static void test_graph_refuse(void) {
    m3_graph_fails f;
    memset(&f, 0, sizeof f);
    int stop = 0;
    for (int t = 1; t <= M3_GRAPH_TRIES; t++) {
        CHECK(!m3_graph_refused(&f, 100), "graph refuse: key refused after %d of %d failures", t - 1, M3_GRAPH_TRIES);
        stop |= m3_graph_fail(&f, 100);
    }
    CHECK(m3_graph_refused(&f, 100) && f.refused == 1 && !stop, "graph refuse: key 100 after %d failures: refused %d, %d keys, stop %d",
          M3_GRAPH_TRIES, m3_graph_refused(&f, 100), f.refused, stop);
    CHECK(!m3_graph_refused(&f, 101), "graph refuse: a key never failed is refused");
    stop = m3_graph_fail(&f, 100); /* failing again (as if recorded anyway) counts no new key */
    CHECK(f.refused == 1 && !stop, "graph refuse: a refused key counted twice (%d keys)", f.refused);
    /* fill the table with keys that failed once (not refused), then more refused keys: the table
     * is full, the refused ones keep their slots, the new ones are counted */
    for (uint64_t k = 200; k < 200 + M3_GRAPH_FAIL_SLOTS; k++) stop |= m3_graph_fail(&f, k);
    CHECK(!stop && f.refused == 1, "graph refuse: once-failed keys stopped recording (%d refused)", f.refused);
    for (uint64_t k = 300; k < 300 + M3_GRAPH_REFUSE_MAX - 2; k++)
        for (int t = 0; t < M3_GRAPH_TRIES; t++) stop |= m3_graph_fail(&f, k);
    CHECK(!stop && f.refused == M3_GRAPH_REFUSE_MAX - 1, "graph refuse: %d keys refused, stop %d (expected %d, 0)", f.refused, stop,
          M3_GRAPH_REFUSE_MAX - 1);
    int all = m3_graph_refused(&f, 100);
    for (uint64_t k = 300; k < 300 + M3_GRAPH_REFUSE_MAX - 2; k++) all &= m3_graph_refused(&f, k);
    CHECK(all, "graph refuse: a full table lost a refused key");
    for (int t = 0; t < M3_GRAPH_TRIES; t++) stop = m3_graph_fail(&f, 999);
    CHECK(stop && f.refused == M3_GRAPH_REFUSE_MAX, "graph refuse: the %d-th refused key: stop %d", M3_GRAPH_REFUSE_MAX, stop);
}

/* m3_err's oom: set by the format's own words, never by text the arguments bring */
static void test_err_oom(void) {
    m3_err e = {0};
    m3_errf(&e, "%s: out of memory", "chat_template");
    CHECK(e.oom == 1, "'%%s: out of memory' sets oom");
    m3_err_prefix(&e, "request %d", 7);
    CHECK(e.oom == 1 && !strcmp(e.msg, "request 7: chat_template: out of memory"), "a prefix keeps oom: %s", e.msg);
    m3_errf(&e, "%s: line %d: raise_exception: %s", "t", 1, "out of memory");
    CHECK(e.oom == 0, "an argument saying 'out of memory' does not set oom");
    m3_errf(&e, "%s: out of template memory (over %zu bytes)", "t", (size_t)5);
    CHECK(e.oom == 0, "a memory limit is not an allocation failure");
    m3_errf(&e, "out of memory");
    CHECK(e.oom == 1, "'out of memory' alone sets oom");
    /* the rule for producers that format in parts (a parser's message, then its position) */
    CHECK(m3_err_fmt_oom("%s: out of memory") && !m3_err_fmt_oom("json schema: %s at %s") && !m3_err_fmt_oom(NULL),
          "m3_err_fmt_oom: by the format's end alone");
}

int main(void) {
    test_err_oom();
    test_streamk();
    test_gemm_tiles();
    test_attn_pow2();
    test_attn_wg_layout();
    test_graph_refuse();
    test_utf8_space();
    test_dsa_runs();
    test_e4m3();
    test_e4m3_encode();
    test_e2m1_encode();
    test_e2m1_bf16();
    test_safetensors();
    test_config();
    test_pool();
    test_sampler();
    test_kv();
    test_kv_nvfp4();
    test_runs();
    test_kv_ties();
    printf("%s\n", fails ? "unit tests FAILED" : "unit tests passed");
    return fails ? 1 : 0;
}
