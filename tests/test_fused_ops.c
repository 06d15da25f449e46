/* The model's fused ops (src/backend/ops.h: head_norm_rope_store, moe_add_rmsnorm), which the
 * CUDA backend runs as single launches and the CPU backend as the plain compositions of
 * src/backend/compose.c. Here a CPU op table is given them as compositions written again from
 * their definitions, counting their calls, and every reference checkpoint runs bit for bit as
 * with the CPU's own table: a prompt in chunks (crossing pages and
 * index blocks), then greedy decode steps, every logit compared. Each fused op must be taken
 * where the model may take it: RoPE + insert on every layer of every step, the MoE + norm on
 * every MoE layer but the last (whose residual the model adds before the final norm). A
 * fused op handed the wrong layer's norm weights, the wrong buffers, or a cache insert left
 * out changes the logits; one the model stops calling changes the counts.
 * Usage: test_fused_ops [DATA_DIR (default tests/data)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rows.h"
#include "backend/cpu/cpu.h"
#include "model/m3.h"

#include "check.h"

#define P 40      /* prompt tokens */
#define U 16      /* prefill chunk */
#define STEPS 6   /* greedy decode steps */

static m3_ops base; /* the CPU table the compositions call */
static long n_rope, n_moe;

static void fused_rope_store(const m3_ops *o, int n, const m3_rope_job *jobs, int T, float eps, int rotary_dim,
                             double theta, m3_kv *kv, int layer, const m3_batch *b, const float *v) {
    n_rope++;
    for (int i = 0; i < n; i++)
        base.head_norm_rope(o->ctx, jobs[i].x, T, jobs[i].heads, jobs[i].dim, jobs[i].w, eps, rotary_dim, theta, b->pos);
    base.kv_store(o->ctx, kv, layer, b, jobs[1].x, v, n == 4 ? jobs[3].x : NULL);
}

static void fused_moe_norm(const m3_ops *o, const m3_layer_w *L, const m3_moe_p *p, const float *x, int T, float *out,
                           float *h, const float *w, float eps, float *normed) {
    n_moe++;
    base.moe(o->ctx, L, p, x, T, out);
    const int H = L->router.K;
    base.add(o->ctx, h, out, (size_t)T * H);
    base.rmsnorm(o->ctx, h, w, T, H, eps, normed);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* prompt logits [P][V], then STEPS greedy rows [STEPS][V] into lg */
static int run(m3_model *m, const int32_t *ids, float *lg, m3_err *err) {
    const m3_config *c = &m->cfg;
    const int V = c->vocab, page = m3_kv_page_tokens(c), pages = (P + STEPS + page - 1) / page + 1;
    m3_kv kv;
    if (m3_kv_create(&kv, c, M3_KV_F32, M3_KV_F32, page, pages, err)) return -1;
    m3_kv_seq seq = {0};
    m3_kv_seq *seqs[1] = {&seq};
    int32_t pos[P], sq[P] = {0};
    int rows[P], rc = 0;
    for (int t0 = 0; t0 < P && !rc; t0 += U) {
        const int n = P - t0 < U ? P - t0 : U;
        for (int i = 0; i < n; i++) { pos[i] = t0 + i; rows[i] = i; }
        m3_batch b = {n, pos, sq, seqs};
        rc = m3_forward(m, &kv, &b, ids + t0, rows, n, lg + (size_t)t0 * V, NULL, err);
    }
    for (int i = 0; i < STEPS && !rc; i++) {
        int32_t tok = argmax(lg + (size_t)(P + i - 1) * V, V), p = P + i, s0 = 0;
        int r0 = 0;
        m3_batch b = {1, &p, &s0, seqs};
        rc = m3_forward(m, &kv, &b, &tok, &r0, 1, lg + (size_t)(P + i) * V, NULL, err);
    }
    m3_kv_seq_release(&kv, &seq);
    m3_kv_destroy(&kv);
    return rc;
}

/* m3_taps.greedy_n: the first chunk's U rows again, rows of runs of the three kinds (whole, argmax
 * over all V, argmax over the first 7 ids): the ids are the argmaxes of the whole rows (lg, the
 * first chunk of run()), the flags say finite, the whole rows are bitwise those, the others unwritten */
static void greedy_rows(m3_model *m, const int32_t *ids, const float *lg, const char *name) {
    const m3_config *c = &m->cfg;
    const int V = c->vocab, page = m3_kv_page_tokens(c);
    m3_err err;
    m3_kv kv;
    if (m3_kv_create(&kv, c, M3_KV_F32, M3_KV_F32, page, U / page + 2, &err)) { CHECK(0, "%s", err.msg); return; }
    m3_kv_seq seq = {0};
    m3_kv_seq *seqs[1] = {&seq};
    int32_t pos[U], sq[U] = {0}, gn[U], gid[U], gfin[U];
    int rows[U], done = 0;
    for (int i = 0; i < U; i++) {
        pos[i] = i;
        rows[i] = i;
        gn[i] = i % 6 < 2 ? 0 : i % 6 < 4 ? V : 7;
        gid[i] = gfin[i] = -1;
    }
    float *out = malloc(sizeof(float) * (size_t)U * V);
    if (!out) { CHECK(0, "out of memory"); goto done; }
    for (size_t i = 0; i < (size_t)U * V; i++) out[i] = 12345.0f;
    m3_taps t = {0};
    t.greedy_n = gn;
    t.greedy_ids = gid;
    t.greedy_fin = gfin;
    t.greedy_done = &done;
    m3_batch b = {U, pos, sq, seqs};
    if (m3_forward(m, &kv, &b, ids, rows, U, out, &t, &err)) { CHECK(0, "%s greedy rows: %s", name, err.msg); goto done; }
    int bad = 0;
    for (int i = 0; i < U; i++) {
        const float *o = out + (size_t)i * V, *w = lg + (size_t)i * V;
        if (!gn[i]) bad += memcmp(o, w, sizeof(float) * (size_t)V) != 0;
        else bad += gid[i] != m3_row_argmax(w, gn[i]) || gfin[i] != 1 || o[0] != 12345.0f || o[V - 1] != 12345.0f;
    }
    CHECK(done && !bad, "%s: greedy rows done %d, %d of %d rows wrong", name, done, bad, U);
done:
    free(out);
    m3_kv_seq_release(&kv, &seq);
    m3_kv_destroy(&kv);
}

static void test_model(const char *data, const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", data, name);
    m3_err err;
    m3_ops fused;
    m3_model plain_m, fused_m;
    float *a = NULL, *b = NULL;
    if (m3_cpu_ops_init(&base, 1, &err)) { CHECK(0, "%s", err.msg); return; }
    fused = base;
    fused.head_norm_rope_store = fused_rope_store;
    fused.moe_add_rmsnorm = fused_moe_norm;
    if (m3_model_load(&plain_m, dir, &base, NULL, NULL, &err)) { CHECK(0, "load %s: %s", dir, err.msg); goto out0; }
    if (m3_model_load(&fused_m, dir, &fused, NULL, NULL, &err)) { CHECK(0, "load %s: %s", dir, err.msg); goto out1; }
    const m3_config *c = &plain_m.cfg;
    const size_t n = (size_t)(P + STEPS) * c->vocab;
    a = malloc(sizeof(float) * n);
    b = malloc(sizeof(float) * n);
    int32_t ids[P];
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < P; i++) { s = s * 6364136223846793005ull + 1442695040888963407ull; ids[i] = (int32_t)((s >> 33) % (uint64_t)c->vocab); }
    CHECK(a && b, "out of memory");
    if (!a || !b) goto out2;
    if (run(&plain_m, ids, a, &err)) { CHECK(0, "%s plain: %s", name, err.msg); goto out2; }
    n_rope = n_moe = 0;
    if (run(&fused_m, ids, b, &err)) { CHECK(0, "%s fused: %s", name, err.msg); goto out2; }
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) { bad++; if (first == n) first = i; }
    CHECK(!bad, "%s: %zu of %zu logits differ with the fused ops (first: row %zu)", name, bad, n, first / c->vocab);
    int moe_layers = 0;
    for (int l = 0; l + 1 < c->n_layers; l++) moe_layers += c->layer_moe[l] != 0;
    const long steps = (P + U - 1) / U + STEPS;
    CHECK(n_rope == steps * c->n_layers, "%s: norm + RoPE + insert taken %ld times, want %ld", name, n_rope,
          steps * c->n_layers);
    CHECK(n_moe == steps * moe_layers, "%s: MoE + norm taken %ld times, want %ld", name, n_moe, steps * moe_layers);
    printf("%-10s %zu logits equal; fused RoPE + insert %ld calls, MoE + norm %ld calls\n", name, n - bad, n_rope, n_moe);
    greedy_rows(&plain_m, ids, a, name);
out2:
    free(a);
    free(b);
    m3_model_free(&fused_m);
out1:
    m3_model_free(&plain_m);
out0:
    m3_cpu_ops_free(&base);
}

int main(int argc, char **argv) {
    const char *data = argc > 1 ? argv[1] : "tests/data";
    const char *models[] = {"m3-tiny", "m3-tiny-q", "m3-wide-q", "m3-gqa3-q", "m3-mqa-q"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) test_model(data, models[i]);
    if (failures) fprintf(stderr, "%d failures\n", failures);
    else printf("fused ops: ok\n");
    return failures != 0;
}
