/* m3 generate: prefill token ids, then sample N tokens with the KV cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../backend/cpu/cpu.h"
#include "../base/clock.h"
#include "../engine/engine.h"
#include "../engine/sampler.h"
#include "cli.h"
#include "tp.h"

static int parse_float(const char *opt, const char *v, float lo, float hi, float *out) {
    char *end;
    if (!v) { fprintf(stderr, "m3 generate: %s needs a value\n", opt); return -1; }
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "m3 generate: %s: '%s' is not a number in [%g, %g]\n", opt, v, lo, hi);
        return -1;
    }
    *out = (float)x;
    return 0;
}

/* ---- --speculative-config: the same generation through the engine, with a DSpark draft ---- */

typedef struct { int n, done, reason; double t_first; } spec_gen;

static void spec_on_token(void *arg, uint64_t id, int32_t token, float logprob, int finished, int reason) {
    (void)id; (void)logprob;
    spec_gen *g = arg;
    if (token >= 0) {
        if (!g->n) g->t_first = m3_now();
        printf("%s%d", g->n ? " " : "", token);
        fflush(stdout);
        g->n++;
    }
    if (finished) { g->done = 1; g->reason = reason; }
}

/* sc NULL: no speculation (the engine path for -tp); group: the tensor-parallel ranks. A draft
 * beside the ranks (or a GPU target, with "dspark_draft_backend": "cpu") runs on a CPU op table
 * of its own (threads), reading the target's captured rows from the host; else on the target's. */
static int generate_spec(m3_model *m, const m3_spec_config *sc, const int32_t *ids, int T, int n_gen,
                         const m3_sampling *sp, m3_kv_dtype kdt, int ubatch, int ignore_eos, m3_group *group,
                         int threads) {
    m3_err err;
    m3_ops dops = {0};
    if (sc && (group || !m->ops || (sc->draft_on_cpu && strcmp(m->ops->name, "cpu") != 0)) &&
        m3_cpu_ops_init(&dops, threads, &err)) {
        fprintf(stderr, "m3 generate: draft ops: %s\n", err.msg);
        return 1;
    }
    m3_engine_opts eo;
    m3_engine_opts_default(&eo);
    int page = m3_kv_page_tokens(&m->cfg);
    eo.kv_dtype = eo.index_dtype = kdt;
    eo.kv_pages = (T + n_gen + page - 1) / page + 1;
    eo.max_num_seqs = 1;
    eo.max_num_batched_tokens = sc && ubatch <= sc->num_speculative_tokens ? sc->num_speculative_tokens + 1 : ubatch;
    eo.enable_prefix_caching = 0;
    if (sc) eo.spec = *sc;
    eo.group = group;
    eo.draft_ops = dops.ctx ? &dops : NULL;
    m3_engine *e = m3_engine_create(m, &eo, &err);
    int rc = 1;
    if (!e) { fprintf(stderr, "m3 generate: %s\n", err.msg); goto out; }
    spec_gen g = {0};
    m3_engine_request q = {.prompt = ids, .n_prompt = T, .sampling = *sp, .max_tokens = n_gen,
                           .ignore_eos = ignore_eos, .on_token = spec_on_token, .arg = &g};
    double t0 = m3_now();
    if (n_gen > 0 && !m3_engine_add(e, &q, &err)) { fprintf(stderr, "m3 generate: %s\n", err.msg); goto out; }
    while (n_gen > 0 && !g.done) {
        if (m3_engine_step(e, &err) < 0) { fprintf(stderr, "\nm3 generate: %s\n", err.msg); goto out; }
    }
    printf("\n");
    fflush(stdout);
    double t2 = m3_now(), t1 = g.n ? g.t_first : t2;
    m3_engine_stats st;
    m3_engine_get_stats(e, &st);
    fprintf(stderr, "prompt %d tokens in %.3fs (%.1f tok/s); generated %d tokens in %.3fs (%.2f tok/s)\n", T, t1 - t0,
            T / (t1 - t0), g.n, t2 - t1, g.n > 1 ? (g.n - 1) / (t2 - t1) : 0.0);
    if (!sc) goto done;
    fprintf(stderr, "dspark: k %d (%s drafts), %llu verify steps, %llu drafts, %llu accepted (%.1f%%), MAL %.2f; "
            "acceptance by position:", st.spec_k, sc->draft_sample_method == M3_SPEC_DRAFT_GREEDY ? "greedy" : "probabilistic",
            (unsigned long long)st.spec_verify_steps, (unsigned long long)st.spec_draft_tokens,
            (unsigned long long)st.spec_accepted_tokens,
            st.spec_draft_tokens ? 100.0 * st.spec_accepted_tokens / st.spec_draft_tokens : 0.0,
            st.spec_verify_steps ? (double)st.spec_emitted_tokens / st.spec_verify_steps : 0.0);
    for (int i = 0; i < st.spec_k; i++)
        fprintf(stderr, " %.3f", st.spec_drafted_per_pos[i] ? (double)st.spec_accepted_per_pos[i] / st.spec_drafted_per_pos[i] : 0.0);
    if (sc->confidence_threshold > 0)
        fprintf(stderr, "; confidence >= %g: %llu drafts not verified", sc->confidence_threshold,
                (unsigned long long)st.spec_conf_skipped);
    if (st.spec_off_batch)
        fprintf(stderr, "; %llu decodes without drafts (disable_by_batch_size %d)", (unsigned long long)st.spec_off_batch,
                sc->disable_by_batch_size);
    if (st.spec_verify_backend)
        fprintf(stderr, "; %llu verify steps on the device", (unsigned long long)st.spec_verify_backend);
    fprintf(stderr, "\n");
done:
    rc = g.reason == M3_FINISH_ERROR ? 1 : 0;
out:
    if (e) m3_engine_destroy(e);
    if (dops.ctx) m3_cpu_ops_free(&dops);
    return rc;
}

int m3_cmd_generate(int argc, char **argv) {
    const char *dir = NULL, *ids_s = NULL, *kvd = "f32", *spec_json = NULL, *draft_dir = NULL, *backend = NULL;
    const char *moe_split = NULL;
    long n_gen = 16, threads = 0, seed = 0, ubatch = 512, topk = 0, tpn = 1;
    m3_sampling sp = {.temperature = 0, .top_p = 1.0f};
    int ignore_eos = 0;
    m3_err err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { dir = v; i++; }
        else if (!strcmp(a, "--ids")) { ids_s = v; i++; }
        else if (!strcmp(a, "--kv-cache-dtype")) { kvd = v; i++; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) { r = m3_cli_int(a, v, 0, 1 << 24, &n_gen, &err); i++; }
        else if (!strcmp(a, "--threads")) { r = m3_cli_int(a, v, 0, 1024, &threads, &err); i++; }
        else if (!strcmp(a, "--backend")) { backend = v; i++; }
        else if (!strcmp(a, "--precision")) { if (m3_cli_set_precision(v, "generate")) return 2; i++; }
        else if (!strcmp(a, "--moe-act-quant")) { if (m3_cli_set_moe_act_quant(v, "generate")) return 2; i++; }
        else if (!strcmp(a, "--ubatch")) { r = m3_cli_int(a, v, 1, 1 << 20, &ubatch, &err); i++; }
        else if (!strcmp(a, "--seed")) { r = m3_cli_int(a, v, 0, INT64_MAX, &seed, &err); i++; }
        else if (!strcmp(a, "--top-k")) { r = m3_cli_int(a, v, 0, 1 << 30, &topk, &err); i++; }
        else if (!strcmp(a, "--temperature")) { if (parse_float(a, v, 0, 100, &sp.temperature)) return 2; i++; }
        else if (!strcmp(a, "--top-p")) { if (parse_float(a, v, 0, 1, &sp.top_p)) return 2; i++; }
        else if (!strcmp(a, "--min-p")) { if (parse_float(a, v, 0, 1, &sp.min_p)) return 2; i++; }
        else if (!strcmp(a, "--repetition-penalty")) { if (parse_float(a, v, 0.01f, 100, &sp.repetition_penalty)) return 2; i++; }
        else if (!strcmp(a, "--presence-penalty")) { if (parse_float(a, v, -2, 2, &sp.presence_penalty)) return 2; i++; }
        else if (!strcmp(a, "--frequency-penalty")) { if (parse_float(a, v, -2, 2, &sp.frequency_penalty)) return 2; i++; }
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "--speculative-config")) { spec_json = v; i++; }
        else if (!strcmp(a, "--draft")) { draft_dir = v; i++; }
        else if (!strcmp(a, "-tp") || !strcmp(a, "--tensor-parallel-size")) { r = m3_cli_int(a, v, 1, 64, &tpn, &err); i++; }
        else if (!strcmp(a, "--moe-split")) { moe_split = v; i++; }
        else { fprintf(stderr, "m3 generate: unknown option '%s'\n", a); return 2; }
        if (r) { fprintf(stderr, "m3 generate: %s\n", err.msg); return 2; }
        if (i >= argc) { fprintf(stderr, "m3 generate: %s needs a value\n", a); return 2; }
    }
    if (!dir || !ids_s) {
        fprintf(stderr, "m3 generate: usage: m3 generate -m DIR --ids 1,2,3 -n N [--temperature T --top-p P --top-k K --min-p P --seed S] [--backend cpu|cuda|auto]\n"
                        "                   [--precision exact|bf16] [--moe-act-quant none|nvfp4] [--speculative-config '{\"method\":\"dspark\",\"num_speculative_tokens\":7}' [--draft DIR]]\n"
                        "                   [-tp N [--moe-split experts|width]]\n");
        return 2;
    }
    m3_spec_config sc;
    if ((spec_json || draft_dir) && m3_spec_config_parse(&sc, spec_json ? spec_json : "{}", dir, draft_dir, &err)) {
        fprintf(stderr, "m3 generate: %s\n", err.msg);
        return 2;
    }
    sp.top_k = (int)topk;
    sp.seed = (uint64_t)seed;
    m3_kv_dtype kdt;
    if (m3_kv_dtype_parse(kvd, &kdt)) { fprintf(stderr, "m3 generate: --kv-cache-dtype: unknown dtype '%s'\n", kvd); return 2; }
    int32_t *ids;
    int T;
    if (m3_cli_parse_ids(ids_s, &ids, &T, &err)) { fprintf(stderr, "m3 generate: %s\n", err.msg); return 2; }
    if (tpn > 1) { /* through the engine over the ranks; a draft beside them on a CPU op table */
        m3_moe_split split = M3_MOE_EXPERTS;
        if (moe_split && m3_moe_split_parse(moe_split, &split)) {
            fprintf(stderr, "m3 generate: --moe-split: unknown split '%s' (experts or width)\n", moe_split);
            free(ids);
            return 2;
        }
        m3_cli_tp tp;
        m3_model full;
        if (m3_cli_tp_load(&tp, &full, backend, dir, (int)threads, (int)tpn, split, "generate", ids, T)) { free(ids); return 1; }
        int rc = generate_spec(&full, spec_json || draft_dir ? &sc : NULL, ids, T, (int)n_gen, &sp, kdt, (int)ubatch,
                               ignore_eos, tp.g, (int)threads);
        m3_cli_tp_free(&tp);
        m3_model_free(&full);
        free(ids);
        return rc;
    }
    m3_ops ops;
    m3_model m;
    if (m3_cli_load_on(&m, &ops, backend, dir, (int)threads, "generate", ids, T)) { free(ids); return 1; }
    const m3_config *c = &m.cfg;
    const int V = c->vocab;
    int rc = 1;
    if (spec_json || draft_dir) {
        rc = generate_spec(&m, &sc, ids, T, (int)n_gen, &sp, kdt, (int)ubatch, ignore_eos, NULL, (int)threads);
        free(ids);
        m3_model_free(&m);
        m3_cli_ops_free(&ops);
        return rc;
    }
    int page = m3_kv_page_tokens(c);
    m3_kv kv;
    memset(&kv, 0, sizeof kv);
    m3_kv_seq seq = {0};
    float *logits = malloc(sizeof(float) * V);
    m3_sample_ws *ws = NULL;
    m3_sampler *smp = NULL;
    if (!logits) { fprintf(stderr, "m3 generate: out of memory\n"); goto done; }
    if (!(ws = m3_sample_ws_create(V, &err)) || !(smp = m3_sampler_create(&sp, V, ids, T, &err))) {
        fprintf(stderr, "m3 generate: %s\n", err.msg);
        goto done;
    }
    m3_kv_mem mem = m3_model_kv_mem(&m);
    if (m3_kv_create_in(&kv, c, kdt, kdt, page, (int)((T + n_gen + page - 1) / page), &mem, &err)) {
        fprintf(stderr, "m3 generate: %s\n", err.msg);
        goto done;
    }
    double t0 = m3_now();
    if (m3_run_tokens(&m, &kv, &seq, ids, T, 0, (int)ubatch, logits, &err)) {
        fprintf(stderr, "m3 generate: %s\n", err.msg);
        goto done;
    }
    double t1 = m3_now();
    int produced = 0;
    for (int i = 0; i < n_gen; i++) {
        m3_sample_out so;
        if (m3_sampler_sample(smp, logits, ws, &so, &err) || m3_sampler_accept(smp, so.token, &err)) {
            fprintf(stderr, "\nm3 generate: %s\n", err.msg);
            goto done;
        }
        int32_t tok = so.token;
        printf("%s%d", i ? " " : "", tok);
        fflush(stdout);
        produced++;
        if (!ignore_eos && tok == c->eos_id) break;
        if (i + 1 == n_gen) break;
        if (m3_run_tokens(&m, &kv, &seq, &tok, 1, T + i, 1, logits, &err)) {
            fprintf(stderr, "\nm3 generate: %s\n", err.msg);
            goto done;
        }
    }
    printf("\n");
    fflush(stdout);
    double t2 = m3_now();
    fprintf(stderr, "prompt %d tokens in %.3fs (%.1f tok/s); generated %d tokens in %.3fs (%.2f tok/s)\n", T, t1 - t0,
            T / (t1 - t0), produced, t2 - t1, produced > 1 ? (produced - 1) / (t2 - t1) : 0.0);
    rc = 0;
done:
    free(logits);
    m3_sampler_free(smp);
    m3_sample_ws_free(ws);
    m3_kv_seq_release(&kv, &seq);
    m3_kv_destroy(&kv);
    free(ids);
    m3_model_free(&m);
    m3_cli_ops_free(&ops);
    return rc;
}
