/* m3 serve metrics: see metrics.h. */
#include "metrics.h"
#include "../base/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bucket bounds in seconds: vLLM's, with finer steps at the low end, where a small model on
 * a CPU lives. */
static const double TTFT_LE[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double ITL_LE[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                                0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 80.0};
static const double E2E_LE[] = {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

static void hist_init(m3_hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n_le = n < M3_HIST_MAX_BUCKETS ? n : M3_HIST_MAX_BUCKETS;
}

void m3_metrics_init(m3_metrics *m) {
    memset(m, 0, sizeof *m);
    hist_init(&m->ttft, TTFT_LE, (int)(sizeof TTFT_LE / sizeof *TTFT_LE));
    hist_init(&m->itl, ITL_LE, (int)(sizeof ITL_LE / sizeof *ITL_LE));
    hist_init(&m->e2e, E2E_LE, (int)(sizeof E2E_LE / sizeof *E2E_LE));
}

void m3_hist_observe(m3_hist *h, double v) {
    int i = 0;
    while (i < h->n_le && v > h->le[i]) i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

void m3_metrics_http(m3_metrics *m, int code) {
    if (code >= 100 && code < 600) m->http_codes[code]++;
}

/* ------------------------------------------------------------------ text */


static void head(m3_sbuf *b, const char *name, const char *type, const char *help) {
    m3_sbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void gauge(m3_sbuf *b, const char *name, const char *help, double v) {
    head(b, name, "gauge", help);
    m3_sbuf_printf(b, "%s %.17g\n", name, v);
}

static void counter(m3_sbuf *b, const char *name, const char *help, uint64_t v) {
    head(b, name, "counter", help);
    m3_sbuf_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

static void hist(m3_sbuf *b, const char *name, const char *help, const m3_hist *h) {
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_le; i++) {
        cum += h->counts[i];
        m3_sbuf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    m3_sbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)h->count);
    m3_sbuf_printf(b, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

/* the model_name label's value, escaped (label values: \\, \", \n) */
static void label_value(m3_sbuf *b, const char *v) {
    for (const char *p = v ? v : ""; *p; p++) {
        if (*p == '"' || *p == '\\') m3_sbuf_printf(b, "\\%c", *p);
        else if (*p == '\n') m3_sbuf_printf(b, "\\n");
        else m3_sbuf_printf(b, "%c", *p);
    }
}

/* vLLM's metric names (vllm:...), each with its model_name label: what a vLLM dashboard or alert
 * queries. One sample of name, with extra labels `more` ("" or `key="value",`). */
static void vsample(m3_sbuf *b, const char *name, const char *model, const char *more, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void vsample(m3_sbuf *b, const char *name, const char *model, const char *more, const char *fmt, ...) {
    m3_sbuf_printf(b, "%s{%smodel_name=\"", name, more);
    label_value(b, model);
    m3_sbuf_printf(b, "\"} ");
    char v[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    m3_sbuf_printf(b, "%s\n", v);
}

static void vgauge(m3_sbuf *b, const char *name, const char *model, const char *help, double v) {
    head(b, name, "gauge", help);
    vsample(b, name, model, "", "%.17g", v);
}

static void vcounter(m3_sbuf *b, const char *name, const char *model, const char *help, uint64_t v) {
    head(b, name, "counter", help);
    vsample(b, name, model, "", "%llu", (unsigned long long)v);
}

static void vhist(m3_sbuf *b, const char *name, const char *model, const char *help, const m3_hist *h) {
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    char bucket[160], le[48];
    snprintf(bucket, sizeof bucket, "%s_bucket", name);
    for (int i = 0; i < h->n_le; i++) {
        cum += h->counts[i];
        snprintf(le, sizeof le, "le=\"%g\",", h->le[i]);
        vsample(b, bucket, model, le, "%llu", (unsigned long long)cum);
    }
    vsample(b, bucket, model, "le=\"+Inf\",", "%llu", (unsigned long long)h->count);
    snprintf(bucket, sizeof bucket, "%s_sum", name);
    vsample(b, bucket, model, "", "%.9g", h->sum);
    snprintf(bucket, sizeof bucket, "%s_count", name);
    vsample(b, bucket, model, "", "%llu", (unsigned long long)h->count);
}

/* the same numbers under vLLM's names (its V1 engine's set) */
static void vllm_names(m3_sbuf *b, const m3_metrics *m, const m3_engine_stats *st, const m3_metrics_info *info) {
    const char *mn = info->model_name;
    vgauge(b, "vllm:num_requests_running", mn, "Number of requests in model execution batches.", st->running);
    vgauge(b, "vllm:num_requests_waiting", mn, "Number of requests waiting to be processed.", st->waiting);
    double usage = st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0;
    vgauge(b, "vllm:kv_cache_usage_perc", mn, "KV-cache usage. 1 means 100 percent usage.", usage);
    vgauge(b, "vllm:gpu_cache_usage_perc", mn, "KV-cache usage (the older name). 1 means 100 percent usage.", usage);
    vcounter(b, "vllm:prefix_cache_queries_total", mn, "Prefix cache queries: prompt tokens looked up.", st->prefix_query_tokens);
    vcounter(b, "vllm:prefix_cache_hits_total", mn, "Prefix cache hits: prompt tokens found.", st->prefix_hit_tokens);
    vcounter(b, "vllm:num_preemptions_total", mn, "Cumulative number of preemptions.", st->preemptions);
    vcounter(b, "vllm:prompt_tokens_total", mn, "Number of prefill tokens processed.", m->prompt_tokens);
    vcounter(b, "vllm:generation_tokens_total", mn, "Number of generation tokens processed.", m->generation_tokens);
    head(b, "vllm:request_success_total", "counter", "Count of successfully processed requests, by finish reason.");
    static const struct { int r; const char *name; } FR[] = {{M3_FINISH_STOP, "stop"}, {M3_FINISH_LENGTH, "length"},
                                                             {M3_FINISH_CANCELLED, "abort"}, {M3_FINISH_ERROR, "error"}};
    for (size_t i = 0; i < sizeof FR / sizeof *FR; i++) {
        char more[48];
        snprintf(more, sizeof more, "finished_reason=\"%s\",", FR[i].name);
        vsample(b, "vllm:request_success_total", mn, more, "%llu", (unsigned long long)m->finished[FR[i].r]);
    }
    vhist(b, "vllm:time_to_first_token_seconds", mn, "Histogram of time to first token in seconds.", &m->ttft);
    vhist(b, "vllm:inter_token_latency_seconds", mn, "Histogram of inter-token latency in seconds.", &m->itl);
    vhist(b, "vllm:time_per_output_token_seconds", mn, "Histogram of time per output token in seconds (the older name).", &m->itl);
    vhist(b, "vllm:e2e_request_latency_seconds", mn, "Histogram of end-to-end request latency in seconds.", &m->e2e);
    if (st->spec_k > 0) {
        vcounter(b, "vllm:spec_decode_num_drafts_total", mn, "Number of spec decoding drafts.", st->spec_verify_steps);
        vcounter(b, "vllm:spec_decode_num_draft_tokens_total", mn, "Number of draft tokens.", st->spec_draft_tokens);
        vcounter(b, "vllm:spec_decode_num_accepted_tokens_total", mn, "Number of accepted tokens.", st->spec_accepted_tokens);
        head(b, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
        const int k = st->spec_k < M3_SPEC_MAX_TOKENS ? st->spec_k : M3_SPEC_MAX_TOKENS;
        for (int i = 0; i < k; i++) {
            char more[32];
            snprintf(more, sizeof more, "position=\"%d\",", i);
            vsample(b, "vllm:spec_decode_num_accepted_tokens_per_pos_total", mn, more, "%llu", (unsigned long long)st->spec_accepted_per_pos[i]);
        }
    }
}

char *m3_metrics_render(const m3_metrics *m, const m3_engine_stats *st, const m3_metrics_info *info, size_t *len) {
    m3_sbuf b = {0};
    head(&b, "m3_model_info", "gauge", "The model served (always 1).");
    m3_sbuf_printf(&b, "m3_model_info{model_name=\"");
    label_value(&b, info->model_name);
    m3_sbuf_printf(&b, "\"} 1\n");

    head(&b, "m3_requests_finished_total", "counter",
         "Generated choices finished, by finish reason (a request with n choices counts n).");
    for (int r = M3_FINISH_STOP; r <= M3_FINISH_ERROR; r++)
        m3_sbuf_printf(&b, "m3_requests_finished_total{finish_reason=\"%s\"} %llu\n", m3_engine_finish_name(r),
            (unsigned long long)m->finished[r]);
    head(&b, "m3_http_responses_total", "counter", "HTTP responses by status code (every endpoint).");
    for (int c = 100; c < 600; c++)
        if (m->http_codes[c]) m3_sbuf_printf(&b, "m3_http_responses_total{code=\"%d\"} %llu\n", c, (unsigned long long)m->http_codes[c]);
    counter(&b, "m3_requests_rejected_overload_total", "Generation requests answered 429 (waiting queue full).",
            m->requests_rejected_overload);
    counter(&b, "m3_slow_clients_dropped_total",
            "Streams closed (request cancelled) because the client took no output for --timeout seconds.",
            m->slow_clients_dropped + (uint64_t)info->http_write_timeouts);
    counter(&b, "m3_slow_requests_cut_total",
            "Connections shut because their request took longer than --timeout to arrive (a slow-loris client).",
            (uint64_t)info->http_slow_requests);
    counter(&b, "m3_stream_keepalives_total",
            "SSE keep-alive comments sent to streams with no output for a while (queued or waiting requests).",
            m->keepalives);
    counter(&b, "m3_prompt_tokens_total", "Prompt tokens of accepted generation requests.", m->prompt_tokens);
    counter(&b, "m3_generation_tokens_total", "Tokens generated (every choice).", m->generation_tokens);
    counter(&b, "m3_image_inputs_total", "Images in accepted generation requests.", m->images);

    hist(&b, "m3_time_to_first_token_seconds", "Request arrival to the first token of each choice, seconds.", &m->ttft);
    hist(&b, "m3_inter_token_latency_seconds", "Time between consecutive tokens of a choice, seconds.", &m->itl);
    hist(&b, "m3_e2e_request_latency_seconds", "Request arrival to its last byte of response, seconds.", &m->e2e);

    gauge(&b, "m3_num_requests_running", "Sequences the engine holds KV blocks for.", st->running);
    gauge(&b, "m3_num_requests_waiting", "Sequences queued in the engine (inbox included).", st->waiting);
    gauge(&b, "m3_http_requests_in_flight", "Generation requests received and not yet answered.", info->http_in_flight);
    gauge(&b, "m3_http_connections", "Client connections open.", info->http_connections);
    gauge(&b, "m3_requests_preparing", "Requests being prepared off the event loop (chat template, tokenizer, images).",
          info->preparing);
    counter(&b, "m3_requests_prepared_total", "Requests the preparation threads finished with (answered or admitted).",
            (uint64_t)info->prepared);
    counter(&b, "m3_http_requests_refused_total",
            "Requests refused before routing: malformed (RFC 9112), over a size limit, or not arriving within --timeout.",
            (uint64_t)info->http_refused);
    counter(&b, "m3_http_connections_turned_away_total",
            "Connections closed as soon as accepted: no memory for their state (the client sees the connection closed).",
            (uint64_t)info->http_turned_away);
    counter(&b, "m3_http_accept_pauses_total", "Times accept() failed for want of file descriptors and the listener paused for 100 ms.",
            (uint64_t)info->http_accept_pauses);
    counter(&b, "m3_http_accept_resumes_total", "Those pauses ended (the listener accepts again unless at --max-connections).",
            (uint64_t)info->http_accept_resumes);
    gauge(&b, "m3_max_waiting", "Waiting sequences at which new generation requests get 429.", info->max_waiting);
    gauge(&b, "m3_draining", "1 while shutting down (SIGTERM / SIGINT received).", info->draining);
    gauge(&b, "m3_kv_blocks_used", "KV cache blocks (pages) held by sequences.", st->kv_blocks_used);
    gauge(&b, "m3_kv_blocks_cached", "KV cache blocks free but holding reusable prefix-cache entries.", st->kv_blocks_cached);
    gauge(&b, "m3_kv_blocks_total", "KV cache blocks in the pool.", st->kv_blocks_total);
    gauge(&b, "m3_kv_block_tokens", "Tokens per KV cache block.", st->page_tokens);
    gauge(&b, "m3_kv_cache_usage_ratio", "Fraction of KV blocks in use.",
          st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0);
    gauge(&b, "m3_kv_capacity_tokens", "KV cache capacity in tokens (blocks x block tokens).", info->capacity_tokens);
    if (info->kv_bytes_per_token)
        gauge(&b, "m3_kv_bytes_per_token", "KV + index-K cache bytes per token, all layers.", (double)info->kv_bytes_per_token);
    gauge(&b, "m3_max_model_len", "Longest prompt + completion per request, tokens.", info->max_model_len);
    counter(&b, "m3_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.", st->prefix_hit_tokens);
    counter(&b, "m3_preemptions_total", "Sequences preempted (KV blocks freed, recomputed later).", st->preemptions);
    counter(&b, "m3_engine_steps_total", "Engine steps run (one forward each).", st->steps);
    counter(&b, "m3_engine_prefill_tokens_total", "Tokens run through the model that were not decodes.", st->tokens_prefilled);
    counter(&b, "m3_vision_encoder_runs_total", "Vision tower runs (the images of one request, when not all cached).",
            st->vision_runs);
    counter(&b, "m3_vision_encoder_images_total", "Images run through the vision tower.", st->vision_images);
    counter(&b, "m3_structured_requests_total", "Sequences added with a grammar (response_format, guided_json / _regex / _choice, forced tool calls).",
            st->grammar_requests);
    counter(&b, "m3_grammar_masks_total", "Token masks computed for grammar-constrained rows.", st->grammar_masks);
    counter(&b, "m3_grammar_masks_ahead_total", "Of those, computed by the mask thread while the forward ran.",
            st->grammar_masks_ahead);
    gauge(&b, "m3_grammar_mask_wait_seconds_total", "Seconds the engine waited for the mask thread after forwards.",
          st->grammar_wait_s);
    gauge(&b, "m3_grammar_mask_inline_seconds_total", "Seconds spent on masks computed as their rows were sampled.",
          st->grammar_inline_s);
    if (st->spec_k > 0) { /* speculative decoding (vLLM's spec_decode counters, and the ratios they give) */
        counter(&b, "m3_spec_decode_num_drafts_total", "Speculative steps: one request verified against its drafts in one step.",
                st->spec_verify_steps);
        counter(&b, "m3_spec_decode_num_draft_tokens_total", "Draft tokens verified.", st->spec_draft_tokens);
        counter(&b, "m3_spec_decode_num_accepted_tokens_total", "Draft tokens accepted.", st->spec_accepted_tokens);
        counter(&b, "m3_spec_decode_num_draft_tokens_skipped_total",
                "Draft tokens left unverified: the draft's confidence head was below dspark_confidence_threshold.",
                st->spec_conf_skipped);
        counter(&b, "m3_spec_decode_num_decodes_without_drafts_total",
                "Decodes run without drafts because the step had more running requests than disable_by_batch_size.",
                st->spec_off_batch);
        counter(&b, "m3_spec_decode_num_drafts_verified_on_device_total",
                "Speculative steps of sampled requests verified where the logits are (only token ids came back).",
                st->spec_verify_backend);
        counter(&b, "m3_spec_decode_num_emitted_tokens_total",
                "Tokens emitted by speculative steps (accepted drafts + the target's own token, less when a stop cut it).",
                st->spec_emitted_tokens);
        gauge(&b, "m3_spec_decode_mean_accepted_length", "MAL: tokens emitted per speculative step (emitted / drafts).",
              st->spec_verify_steps ? (double)st->spec_emitted_tokens / st->spec_verify_steps : 0.0);
        const int k = st->spec_k < M3_SPEC_MAX_TOKENS ? st->spec_k : M3_SPEC_MAX_TOKENS;
        head(&b, "m3_spec_decode_num_drafts_per_pos_total", "counter", "Speculative steps that verified a draft at position (0-based).");
        for (int i = 0; i < k; i++)
            m3_sbuf_printf(&b, "m3_spec_decode_num_drafts_per_pos_total{position=\"%d\"} %llu\n", i,
                           (unsigned long long)st->spec_drafted_per_pos[i]);
        head(&b, "m3_spec_decode_num_accepted_tokens_per_pos_total", "counter", "Of those, steps that accepted it.");
        for (int i = 0; i < k; i++)
            m3_sbuf_printf(&b, "m3_spec_decode_num_accepted_tokens_per_pos_total{position=\"%d\"} %llu\n", i,
                           (unsigned long long)st->spec_accepted_per_pos[i]);
        head(&b, "m3_spec_decode_acceptance_rate", "gauge", "Acceptance at position (0-based): accepted / verified there.");
        for (int i = 0; i < k; i++)
            m3_sbuf_printf(&b, "m3_spec_decode_acceptance_rate{position=\"%d\"} %.6g\n", i,
                           st->spec_drafted_per_pos[i] ? (double)st->spec_accepted_per_pos[i] / st->spec_drafted_per_pos[i] : 0.0);
    }
    if (info->responses_store) {
        gauge(&b, "m3_responses_stored", "Responses kept for previous_response_id and GET /v1/responses/{id}.",
              (double)info->responses_stored);
        gauge(&b, "m3_responses_store_bytes", "Bytes they hold.", (double)info->responses_bytes);
        gauge(&b, "m3_responses_store_capacity_bytes", "--responses-store.", (double)info->responses_cap);
        counter(&b, "m3_responses_evicted_total", "Stored responses dropped to make room for newer ones.", info->responses_evicted);
    }
    counter(&b, "m3_requests_nonfinite_logits_total",
            "Sequences ended with an error because their logits held a NaN or an Inf.", st->nonfinite_logits);
    if (info->fault_armed) {
        head(&b, "m3_fault_injected_total", "counter", "Allocation failures injected (tests only), by module.");
        for (int i = 0; i < M3_FAULT_NMOD; i++)
            m3_sbuf_printf(&b, "m3_fault_injected_total{module=\"%s\"} %ld\n", m3_fault_module_name((m3_fault_module)i),
                info->fault_injected[i]);
        head(&b, "m3_fault_allocations_total", "counter", "Allocations counted by fault injection (tests only), by module.");
        for (int i = 0; i < M3_FAULT_NMOD; i++)
            m3_sbuf_printf(&b, "m3_fault_allocations_total{module=\"%s\"} %ld\n", m3_fault_module_name((m3_fault_module)i),
                info->fault_seen[i]);
    }
    vllm_names(&b, m, st, info);
    if (b.oom) { free(b.p); return NULL; }
    *len = b.n;
    return b.p;
}
