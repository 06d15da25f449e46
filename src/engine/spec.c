/* Speculative decoding: config parsing, DSpark drafting, the verify step (see spec.h). */
#include "spec.h"
#include "../backend/ops.h"
#include "../base/rows.h" /* m3_row_pos_sum: vectorized */

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- config ---------------- */

/* an optional integer key (vLLM's: null means unset, 0 here): at least min, at most INT_MAX */
static int opt_int(const json_t *v, const char *key, int min, int *out, m3_err *err) {
    if (json_is_null(v)) {
        *out = 0;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > 0x7fffffff)
        return m3_errf(err, "--speculative-config: %s must be an integer >= %d (or null)", key, min);
    *out = (int)json_integer_value(v);
    return 0;
}

int m3_spec_config_parse(m3_spec_config *c, const char *json, const char *model_dir, const char *draft_dir,
                         m3_err *err) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *root = json_loads(json, 0, &je);
    if (!root) return m3_errf(err, "--speculative-config: bad JSON: %s (column %d)", je.text, je.column);
    int rc = -1;
    const char *model = NULL;
    if (!json_is_object(root)) { m3_errf(err, "--speculative-config: not a JSON object"); goto done; }
    c->num_speculative_tokens = 7; /* the seed's serving setting */
    const char *key;
    json_t *v;
    int have_method = 0;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "method")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "dspark") != 0) {
                m3_errf(err, "--speculative-config: method '%s' is not supported (only \"dspark\")",
                        json_is_string(v) ? json_string_value(v) : "?");
                goto done;
            }
            c->method = M3_SPEC_DSPARK;
            have_method = 1;
        } else if (!strcmp(key, "num_speculative_tokens")) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > M3_SPEC_MAX_TOKENS) {
                m3_errf(err, "--speculative-config: num_speculative_tokens must be an integer in [1, %d]", M3_SPEC_MAX_TOKENS);
                goto done;
            }
            c->num_speculative_tokens = (int)json_integer_value(v);
        } else if (!strcmp(key, "draft_sample_method")) {
            const char *s = json_string_value(v);
            if (s && !strcmp(s, "probabilistic")) c->draft_sample_method = M3_SPEC_DRAFT_PROBABILISTIC;
            else if (s && !strcmp(s, "greedy")) c->draft_sample_method = M3_SPEC_DRAFT_GREEDY;
            else {
                m3_errf(err, "--speculative-config: draft_sample_method '%s' is not \"probabilistic\" or \"greedy\"",
                        s ? s : "?");
                goto done;
            }
        } else if (!strcmp(key, "model")) {
            if (!json_is_string(v) || !*json_string_value(v)) {
                m3_errf(err, "--speculative-config: model must be a directory name");
                goto done;
            }
            model = json_string_value(v);
        } else if (!strcmp(key, "dspark_last_layer_final_norm")) {
            if (!json_is_boolean(v)) { m3_errf(err, "--speculative-config: dspark_last_layer_final_norm must be true or false"); goto done; }
            c->last_layer_final_norm = json_is_true(v);
        } else if (!strcmp(key, "dspark_draft_backend")) {
            const char *s = json_string_value(v);
            if (!s || (strcmp(s, "target") && strcmp(s, "cpu"))) {
                m3_errf(err, "--speculative-config: dspark_draft_backend must be \"target\" or \"cpu\"");
                goto done;
            }
            c->draft_on_cpu = !strcmp(s, "cpu");
        } else if (!strcmp(key, "dspark_confidence_threshold")) {
            if (!json_is_number(v) || !(json_number_value(v) >= 0 && json_number_value(v) <= 1)) {
                m3_errf(err, "--speculative-config: dspark_confidence_threshold must be a number in [0, 1]");
                goto done;
            }
            c->confidence_threshold = json_number_value(v);
        } else if (!strcmp(key, "draft_tensor_parallel_size")) { /* vLLM's key: the DSpark draft is never sharded */
            if (!json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1)) {
                m3_errf(err, "--speculative-config: draft_tensor_parallel_size must be 1 (the DSpark draft runs whole on "
                             "one device: the target's GPU, or the CPU beside a -tp group)");
                goto done;
            }
        } else if (!strcmp(key, "max_model_len")) { /* vLLM's key: no drafts past this length */
            if (opt_int(v, key, 1, &c->max_model_len, err)) goto done;
        } else if (!strcmp(key, "disable_by_batch_size")) { /* vLLM's key: null leaves speculation always on */
            if (opt_int(v, key, 2, &c->disable_by_batch_size, err)) goto done;
        } else {
            m3_errf(err, "--speculative-config: unknown key '%s' (method, num_speculative_tokens, draft_sample_method, "
                         "model, dspark_last_layer_final_norm, dspark_draft_backend, dspark_confidence_threshold, "
                         "disable_by_batch_size, max_model_len, draft_tensor_parallel_size)", key);
            goto done;
        }
    }
    if (!have_method) { m3_errf(err, "--speculative-config: missing \"method\" (\"dspark\")"); goto done; }
    int n;
    if (draft_dir) n = snprintf(c->draft_dir, sizeof c->draft_dir, "%s", draft_dir);
    else if (model) n = snprintf(c->draft_dir, sizeof c->draft_dir, "%s", model);
    else n = snprintf(c->draft_dir, sizeof c->draft_dir, "%s/dspark", model_dir ? model_dir : ".");
    if (n < 0 || (size_t)n >= sizeof c->draft_dir) { m3_errf(err, "--speculative-config: draft path too long"); goto done; }
    rc = 0;
done:
    json_decref(root);
    if (rc) memset(c, 0, sizeof *c);
    return rc;
}

/* ---------------- draws ---------------- */

/* Draws walk blocks of ids: a block's mass (one vectorized sum), then, in the block holding the
 * point drawn, its ids in order. */
#define DRAW_BLK 256

/* the weight of id i: p - q (q NULL: p), 0 for the id left out */
static double weight(const float *p, const float *q, int skip, int i) {
    return i == skip ? 0.0 : q ? (double)p[i] - q[i] : (double)p[i];
}

/* the positive weights of ids [i0, i1) summed: id by id in the block holding skip */
static double blk_mass(const float *p, const float *q, int skip, int i0, int i1) {
    if (skip < i0 || skip >= i1) return m3_row_pos_sum(p + i0, q ? q + i0 : NULL, i1 - i0);
    double s = 0;
    for (int i = i0; i < i1; i++) {
        const double r = weight(p, q, skip, i);
        if (r > 0) s += r;
    }
    return s;
}

/* An id drawn with probability proportional to its positive weight, u in [0, 1); -1 when no
 * weight is positive. */
static int32_t draw_pos(const float *p, const float *q, int skip, int V, double u) {
    double total = 0;
    for (int i0 = 0; i0 < V; i0 += DRAW_BLK) total += blk_mass(p, q, skip, i0, i0 + DRAW_BLK < V ? i0 + DRAW_BLK : V);
    if (!(total > 0)) return -1;
    const double x = u * total;
    double acc = 0;
    int lastb = -1;
    for (int i0 = 0; i0 < V; i0 += DRAW_BLK) {
        const int i1 = i0 + DRAW_BLK < V ? i0 + DRAW_BLK : V;
        const double s = blk_mass(p, q, skip, i0, i1);
        if (s > 0) lastb = i0;
        if (!(x < acc + s)) { acc += s; continue; }
        int last = -1;
        for (int i = i0; i < i1; i++) {
            const double r = weight(p, q, skip, i);
            if (!(r > 0)) continue;
            acc += r;
            last = i;
            if (x < acc) return i;
        }
        return last; /* the walk's sum came out a little below the block's */
    }
    for (int i = (lastb + DRAW_BLK < V ? lastb + DRAW_BLK : V) - 1; i >= lastb; i--) /* x rounded up to the total */
        if (weight(p, q, skip, i) > 0) return i;
    return -1;
}

int32_t m3_spec_draw(const float *prob, int V, double u) { return draw_pos(prob, NULL, -1, V, u); }

int32_t m3_spec_residual(const float *p, const float *q, int32_t draft, int V, double u) {
    const int32_t t = draw_pos(p, q, q ? -1 : draft, V, u);
    return t >= 0 ? t : m3_spec_draw(p, V, u);
}

/* ---------------- drafting ---------------- */

int m3_spec_draws_on_backend(const m3_ops *op) {
    if (!op || !op->draw_rows) return 0;
    const char *how = getenv("M3_DRAWS"); /* read each call: the bench switches it between runs */
    return how && !strcmp(how, "backend") ? 1 : how && !strcmp(how, "host") ? 0 : op->device_memory != 0;
}

int m3_spec_draft_n(m3_dspark *d, m3_spec_draft_req *rq, int n, m3_sample_ws *ws, int method, int k, float *rows,
                    m3_err *err) {
    const int V = d->cfg.base.vocab;
    if (k < 1 || k > M3_SPEC_MAX_TOKENS) return m3_errf(err, "dspark: %d drafts (1..%d)", k, M3_SPEC_MAX_TOKENS);
    if (n < 1 || n > M3_SPEC_DRAFT_BATCH) return m3_errf(err, "dspark: %d requests in one draft pass (1..%d)", n, M3_SPEC_DRAFT_BATCH);
    const m3_dspark_ctx *cs[M3_SPEC_DRAFT_BATCH];
    int32_t anchor[M3_SPEC_DRAFT_BATCH], prev[M3_SPEC_DRAFT_BATCH];
    int pos[M3_SPEC_DRAFT_BATCH], greedy[M3_SPEC_DRAFT_BATCH];
    for (int j = 0; j < n; j++) {
        cs[j] = rq[j].ctx;
        prev[j] = anchor[j] = rq[j].anchor;
        pos[j] = rq[j].pos;
        greedy[j] = method == M3_SPEC_DRAFT_GREEDY || m3_sampler_is_greedy(rq[j].s);
        rq[j].q_used = !greedy[j];
        rq[j].q_dev_used = 0;
        rq[j].failed = 0;
    }
    /* every request greedy with nothing changing its row (the same text ids): the argmax where
     * the rows are, only the ids come to the host (the same tokens: m3_sampler_plain_greedy). Every
     * slot is drawn in the sampler's state at the anchor (the next draw's answer) */
    int n_text = d->ops->argmax_rows ? m3_sampler_plain_greedy(rq[0].s, NULL, 0) : 0;
    for (int j = 1; j < n && n_text; j++)
        if (m3_sampler_plain_greedy(rq[j].s, NULL, 0) != n_text) n_text = 0;
    if (m3_dspark_block_n(d, n, cs, anchor, pos, k, err)) return -1;
    int want_conf = 0;
    for (int j = 0; j < n; j++) want_conf |= rq[j].conf != NULL;
    if (want_conf && !d->cfg.confidence_head) return m3_errf(err, "dspark: the draft has no confidence head");
    float conf[M3_SPEC_DRAFT_BATCH];
    if (n_text && d->ops->embed_dev) { /* the whole greedy chain on the backend, one download */
        int32_t ids[M3_SPEC_MAX_TOKENS * M3_SPEC_DRAFT_BATCH];
        float cf[M3_SPEC_MAX_TOKENS * M3_SPEC_DRAFT_BATCH];
        if (m3_dspark_greedy_n(d, anchor, k, n_text, ids, want_conf ? cf : NULL, err)) return -1;
        for (int i = 0; i < k; i++)
            for (int j = 0; j < n; j++) {
                rq[j].draft[i] = ids[i * n + j];
                if (rq[j].conf) rq[j].conf[i] = cf[i * n + j];
            }
        return 0;
    }
    /* every request's distribution plain (no penalties, bias, masks: m3_sampler_plain_params)
     * and a backend that draws: the whole chain there (draw_rows), one download of the ids and
     * one per distribution row; the uniforms are those the loop below would take */
    m3_draw_param par[M3_SPEC_DRAFT_BATCH];
    int on_backend = d->ops->embed_dev && m3_spec_draws_on_backend(d->ops);
    for (int j = 0; j < n && on_backend; j++) {
        m3_draw_param *p = &par[j];
        on_backend = m3_sampler_plain_params(rq[j].s, NULL, 0, &p->temperature, &p->top_k, &p->top_p, &p->min_p, &p->n);
        if (greedy[j]) p->temperature = 0; /* the argmax of its distribution: of the row over [0, n) */
        p->u = 0;
    }
    if (on_backend) {
        double u[M3_SPEC_MAX_TOKENS * M3_SPEC_DRAFT_BATCH];
        float *qs[M3_SPEC_DRAFT_BATCH], *qd[M3_SPEC_DRAFT_BATCH], cf[M3_SPEC_MAX_TOKENS * M3_SPEC_DRAFT_BATCH];
        int32_t ids[M3_SPEC_MAX_TOKENS * M3_SPEC_DRAFT_BATCH];
        for (int j = 0; j < n; j++) {
            qd[j] = greedy[j] ? NULL : rq[j].q_dev;
            qs[j] = greedy[j] || qd[j] ? NULL : rq[j].q;
            rq[j].q_dev_used = qd[j] != NULL;
            for (int i = 0; i < k; i++) u[i * n + j] = greedy[j] ? 0 : m3_rng_uniform(rq[j].rng);
        }
        if (m3_dspark_draw_n(d, anchor, k, par, u, ids, qs, qd, want_conf ? cf : NULL, err)) return -1;
        for (int i = 0; i < k; i++)
            for (int j = 0; j < n; j++) {
                rq[j].draft[i] = ids[i * n + j];
                if (rq[j].conf) rq[j].conf[i] = cf[i * n + j];
            }
        return 0;
    }
    for (int i = 0; i < k; i++) {
        /* slot i of every request, Markov-corrected with its draw at slot i - 1 (the anchor at 0) */
        if (m3_dspark_markov_n(d, i, prev, n_text ? NULL : rows, err)) return -1;
        if (want_conf) { /* the head reads the same Markov input (prev) as the correction */
            if (m3_dspark_confidence_n(d, i, conf, err)) return -1;
            for (int j = 0; j < n; j++)
                if (rq[j].conf) rq[j].conf[i] = conf[j];
        }
        if (n_text) {
            if (m3_dspark_argmax_n(d, i, n_text, prev, err)) return -1;
            for (int j = 0; j < n; j++) rq[j].draft[i] = prev[j];
            continue;
        }
        for (int j = 0; j < n; j++) {
            if (rq[j].failed) continue;
            float *row = rows + (size_t)j * V;
            /* q_i: the request's processed distribution of the corrected row (greedy: one-hot at
             * its argmax; the row buffer serves as scratch then, and for q_i kept in q_dev or
             * not kept) */
            float *qi = greedy[j] || !rq[j].q ? row : rq[j].q + (size_t)i * V;
            m3_err e2;
            if (m3_sampler_probs(rq[j].s, row, ws, qi, &e2)) { rq[j].failed = 1; continue; }
            prev[j] = greedy[j] ? m3_argmax(qi, V) : m3_spec_draw(qi, V, m3_rng_uniform(rq[j].rng));
            rq[j].draft[i] = prev[j];
            if (!greedy[j] && !rq[j].q && rq[j].q_dev) { /* where the target verifies it */
                d->ops->upload(d->ops->ctx, rq[j].q_dev + (size_t)i * V, qi, sizeof(float) * (size_t)V);
                rq[j].q_dev_used = 1;
            }
        }
    }
    return 0;
}

int m3_spec_draft(m3_dspark *d, const m3_dspark_ctx *ctx, m3_sampler *s, m3_sample_ws *ws, m3_rng *rng, int method,
                  int32_t anchor, int pos, int k, float *rows, int32_t *draft, float *q, int *q_used, m3_err *err) {
    m3_spec_draft_req r = {ctx, s, rng, anchor, pos, draft, q, NULL, 0, 0, NULL, 0};
    int rc = m3_spec_draft_n(d, &r, 1, ws, method, k, rows, err);
    *q_used = r.q_used;
    if (!rc && r.failed) rc = m3_errf(err, "dspark: the draft's draws failed (out of memory)");
    return rc;
}

/* ---------------- verify ---------------- */

static int is_stop(const int32_t *stop, int n, int32_t t) {
    for (int i = 0; i < n; i++)
        if (stop[i] == t) return 1;
    return 0;
}

/* records an emitted token; 1 when emission must end here */
static int emit(m3_sampler *s, const m3_sample_out *o, const int32_t *stop, int n_stop, int max_emit,
                m3_spec_result *res, m3_err *err) {
    if (m3_sampler_accept(s, o->token, err)) return -1;
    res->out[res->n_emit++] = *o;
    if (is_stop(stop, n_stop, o->token) || res->n_emit >= max_emit) { res->stopped = 1; return 1; }
    return 0;
}

int m3_spec_verify_ids(m3_sampler *s, const int32_t *ids, const int32_t *draft, int k, const int32_t *stop, int n_stop,
                       int max_emit, m3_spec_result *res, m3_err *err) {
    memset(res, 0, sizeof *res);
    if (k < 0 || k > M3_SPEC_MAX_TOKENS) return m3_errf(err, "spec verify: %d drafts (0..%d)", k, M3_SPEC_MAX_TOKENS);
    if (max_emit < 1) return m3_errf(err, "spec verify: max_emit %d", max_emit);
    for (int i = 0; i <= k; i++) { /* m3_spec_verify's greedy branch, each row's draw given */
        m3_sample_out o;
        memset(&o, 0, sizeof o);
        o.token = ids[i];
        const int rc = emit(s, &o, stop, n_stop, max_emit, res, err);
        if (rc) {
            if (rc > 0 && i < k && o.token == draft[i]) res->n_accepted++;
            return rc < 0 ? -1 : 0;
        }
        if (i == k || o.token != draft[i]) return 0;
        res->n_accepted++;
    }
    return 0;
}

int m3_spec_verify(m3_sampler *s, m3_sample_ws *ws, float *p, const float *logits, const int32_t *draft,
                   const float *q, int k, const int32_t *stop, int n_stop, int max_emit, m3_spec_result *res,
                   m3_err *err) {
    memset(res, 0, sizeof *res);
    if (k < 0 || k > M3_SPEC_MAX_TOKENS) return m3_errf(err, "spec verify: %d drafts (0..%d)", k, M3_SPEC_MAX_TOKENS);
    if (max_emit < 1) return m3_errf(err, "spec verify: max_emit %d", max_emit);
    const size_t V = (size_t)m3_sampler_vocab(s);
    m3_sample_out o;
    int rc;
    if (m3_sampler_is_greedy(s)) {
        for (int i = 0; i <= k; i++) {
            if (m3_sampler_sample(s, logits + i * V, ws, &o, err)) return -1;
            if ((rc = emit(s, &o, stop, n_stop, max_emit, res, err))) {
                if (rc > 0 && i < k && o.token == draft[i]) res->n_accepted++;
                return rc < 0 ? -1 : 0;
            }
            if (i == k || o.token != draft[i]) return 0;
            res->n_accepted++;
        }
        return 0;
    }
    for (int i = 0; i < k; i++) {
        const float *row = logits + i * V;
        if (m3_sampler_probs(s, row, ws, p, err)) return -1;
        const int32_t dt = draft[i];
        double qd = q ? q[i * V + (size_t)dt] : 1.0;
        int32_t t;
        int accepted = m3_spec_accept(p[dt], qd, m3_sampler_uniform(s));
        t = accepted ? dt : m3_spec_residual(p, q ? q + i * V : NULL, dt, (int)V, m3_sampler_uniform(s));
        if (m3_sampler_describe(s, row, ws, t, &o, err)) return -1;
        res->n_accepted += accepted;
        if ((rc = emit(s, &o, stop, n_stop, max_emit, res, err))) return rc < 0 ? -1 : 0;
        if (!accepted) return 0;
    }
    if (m3_sampler_sample(s, logits + (size_t)k * V, ws, &o, err)) return -1; /* the bonus token */
    return emit(s, &o, stop, n_stop, max_emit, res, err) < 0 ? -1 : 0;
}
