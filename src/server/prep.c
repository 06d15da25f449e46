/* m3 serve: requests prepared off the event loop (see srv.h).
 *
 * Everything a request costs before the engine sees it runs on preparation threads: parsing
 * the JSON body, the chat template, the tokenizer, image decoding and preprocessing and the
 * images' content hash (m3_oai_parse_generate, m3_engine_images_create), and /tokenize and
 * /detokenize whole. The event loop copies the body, hands the job over and goes on serving
 * others; a worker fills in the result and wakes the loop, which answers (an error, a 429, the
 * tokenize reply) or starts the generation (srv_generate_start), in the order jobs finish.
 * Before, a 30 MB prompt or 32 large images held every other client for tens of seconds
 * (issue 23).
 *
 * Lifetimes: the loop owns a job until it is queued, a worker from then until it is on the
 * done list, the loop again until it is answered and freed. A client that leaves meanwhile
 * is seen at once (http.h: job_gone); its job still runs to the end and is then dropped. Jobs
 * in flight count as requests in flight: shutdown waits for them (and runs them; a 503 once
 * its deadline has passed). */
#include "srv.h"
#include "anthropic.h"
#include "resp_store.h"
#include "responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>

struct prep_job {
    srv *s;
    http_req *req;           /* NULL once its client is gone */
    unsigned long serial;
    double t0;
    int kind;                /* SRV_PREP_* */
    int invoked;             /* came as POST /invocations (kind: the chat or completion it turned out to be) */
    char *body;              /* the request body (owned copy) */
    size_t n;
    /* results */
    int rc;                  /* 0, or the status of the error in e */
    m3_oai_error e;
    json_t *json;            /* the parsed body (g borrows from it) */
    json_t *orig;            /* a translated request's body as sent (what resp borrows) */
    m3_resp_req resp;        /* /v1/responses: what its response object needs */
    m3_oai_params g;
    m3_engine_images *images; /* the prompt's images, made for the engine */
    int n_images;
    size_t px_bytes;         /* their pixels, counted in srv.px_held until a request holds them */
    prep_job *all_prev, *all_next; /* srv.prep_all: every job not answered yet (the loop's list) */
    json_t *reply;           /* tokenize / detokenize: the answer */
    char *reply_text;        /* ... as JSON text, written by the worker (a 2.6M-id answer took the loop 0.8 s) */
    size_t reply_len;
    prep_job *next;
};

static void job_free(prep_job *j) {
    if (j->px_bytes) atomic_fetch_sub(&j->s->px_held, j->px_bytes);
    m3_oai_params_free(&j->g);
    m3_engine_images_release(j->images);
    json_decref(j->json);
    json_decref(j->orig);
    m3_resp_req_free(&j->resp);
    json_decref(j->reply);
    free(j->reply_text);
    free(j->body);
    free(j);
}

/* ------------------------------------------------------------------ work (a worker thread) */

static void do_tokenize(srv *s, prep_job *j) {
    int32_t *ids = NULL;
    size_t n = 0;
    m3_err err;
    json_t *p = json_object_get(j->json, "prompt");
    if (json_is_string(p)) {
        /* encode never adds BOS/EOS; special tokens written in the text are recognised */
        if (m3_tok_encode(s->tok, json_string_value(p), json_string_length(p), 1, &ids, &n, &err)) {
            j->rc = m3_oai_errorf(&j->e, err.oom ? 500 : 400, err.oom ? "server_error" : "invalid_request_error", "prompt",
                                  "cannot tokenize the prompt: %s", err.msg);
            return;
        }
    } else if (json_object_get(j->json, "messages")) {
        if ((j->rc = m3_oai_chat_prompt(&s->ctx, j->json, &ids, &n, NULL, NULL, NULL, &j->e))) return;
    } else {
        j->rc = m3_oai_errorf(&j->e, 400, "invalid_request_error", NULL, "give 'prompt' (a string) or 'messages'");
        return;
    }
    json_t *rts = json_object_get(j->json, "return_token_strs");
    if (rts && !json_is_null(rts) && !json_is_boolean(rts)) {
        free(ids);
        j->rc = m3_oai_errorf(&j->e, 400, "invalid_request_error", "return_token_strs", "'return_token_strs' must be a boolean");
        return;
    }
    json_t *a = json_array(), *strs = json_is_true(rts) ? json_array() : NULL; /* vLLM's: the tokens as the vocabulary spells them */
    int bad = !a || (json_is_true(rts) && !strs);
    for (size_t i = 0; !bad && i < n; i++) {
        bad |= json_array_append_new(a, json_integer(ids[i])) != 0;
        if (strs) {
            const char *t = m3_tok_id_to_token(s->tok, ids[i]);
            bad |= json_array_append_new(strs, t ? json_string(t) : json_null()) != 0;
        }
    }
    free(ids);
    j->reply = bad ? NULL : json_pack("{s:i,s:i,s:o}", "count", (int)n, "max_model_len", m3_engine_max_model_len(s->e), "tokens", a);
    if (bad) json_decref(a);
    if (j->reply && strs && json_object_set_new(j->reply, "token_strs", strs)) { json_decref(j->reply); j->reply = NULL; }
    else if (!j->reply) json_decref(strs);
    if (!j->reply) j->rc = m3_oai_errorf(&j->e, 500, "server_error", NULL, "out of memory");
}

static void do_detokenize(srv *s, prep_job *j) {
    json_t *t = json_object_get(j->json, "tokens");
    if (!json_is_array(t)) {
        j->rc = m3_oai_errorf(&j->e, 400, "invalid_request_error", "tokens", "'tokens' must be an array of token ids");
        return;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int nv = m3_tok_n_vocab(s->tok) > s->vocab ? m3_tok_n_vocab(s->tok) : s->vocab;
    if ((j->rc = m3_oai_ids(t, nv, "tokens", &ids, &n, &j->e))) return;
    m3_err err;
    size_t len;
    char *text = m3_tok_decode(s->tok, ids, n, 0, &len, &err); /* ids no token spells: nothing */
    free(ids);
    if (!text) { j->rc = m3_oai_errorf(&j->e, 500, "server_error", "tokens", "%s", err.msg); return; }
    j->reply = json_pack("{s:s%}", "prompt", text, len);
    free(text);
    if (!j->reply) j->rc = m3_oai_errorf(&j->e, 500, "server_error", NULL, "out of memory");
}

/* POST /v1/messages/count_tokens: the prompt the same request to /v1/messages would have */
static void do_count_tokens(srv *s, prep_job *j) {
    if ((j->rc = m3_oai_parse_generate(&s->ctx, j->json, 1, &j->g, &j->e))) return;
    j->reply = json_pack("{s:i}", "input_tokens", (int)j->g.n_ids);
    if (!j->reply) j->rc = m3_oai_errorf(&j->e, 500, "server_error", NULL, "out of memory");
}

/* POST /v1/responses: the Responses request, with the conversation of its previous response,
 * spelled as the chat request that means the same. The request is checked whole before the
 * stored conversation is read: a bad one costs nothing of it. */
static void responses_to_chat(srv *s, prep_job *j) {
    const char *prev = NULL;
    json_t *history = NULL, *oai = NULL;
    if ((j->rc = m3_resp_previous_id(j->json, &prev, &j->e))) return;
    if (prev && !s->store) {
        j->rc = m3_oai_errorf(&j->e, 400, "invalid_request_error", "previous_response_id",
                              "'previous_response_id' needs stored responses, and this server stores none (--responses-store 0): "
                              "send the whole conversation in 'input'");
        return;
    }
    if ((j->rc = m3_resp_to_oai(j->json, NULL, &oai, &j->resp, &j->e))) return;
    j->orig = j->json; /* resp borrows previous_response_id from it */
    j->json = oai;
    if (!s->store && j->resp.store) { /* asked (or by default) and not possible: the response says store false */
        j->resp.store = 0;
        if (json_object_set_new(j->resp.echo, "store", json_false()))
            j->rc = m3_oai_errorf(&j->e, 500, "server_error", NULL, "out of memory");
    }
    if (j->rc || !prev) return;
    char missing[160];
    int rc = m3_resp_store_history(s->store, prev, &history, missing, sizeof missing);
    /* OpenAI's error for a response it does not have (clients resend the whole conversation on it) */
    int self = rc == 1 && !strncmp(missing, prev, sizeof missing - 1); /* (a long id is cut in missing) */
    if (self)
        j->rc = m3_oai_errorf(&j->e, 400, "invalid_request_error", "previous_response_id",
                              "Previous response with id '%.150s' not found. (Responses live in memory within --responses-store: "
                              "it was never stored, was deleted, made room for newer ones, or is still being generated.)", prev);
    else if (rc == 1)
        j->rc = m3_oai_errorf(&j->e, 400, "invalid_request_error", "previous_response_id",
                              "Previous response with id '%.150s' not found whole: its conversation goes back to response '%s', "
                              "which is no longer stored (deleted, or made room for newer ones).", prev, missing);
    else if (rc == 2)
        j->rc = m3_oai_errorf(&j->e, 400, "invalid_request_error", "previous_response_id",
                              "the conversation of '%.150s' is longer than %d responses", prev, M3_RESP_STORE_MAX_CHAIN);
    else if (rc == 3)
        j->rc = m3_oai_errorf(&j->e, 400, "invalid_request_error", "previous_response_id",
                              "the conversation of '%.150s' holds more than --max-body (%zu bytes) of messages: send a shorter "
                              "conversation in 'input'", prev, s->o->max_body);
    else if (rc) j->rc = m3_oai_errorf(&j->e, 500, "server_error", NULL, "out of memory");
    if (rc == 1) j->e.code = "previous_response_not_found";
    if (!j->rc) j->rc = m3_resp_add_history(j->json, j->orig, history, &j->e);
    json_decref(history);
}

static int over_context(const prep_job *j) { return j->rc == 400 && j->e.code && !strcmp(j->e.code, "context_length_exceeded"); }

/* the chat request without messages [first, first + k) */
static int drop_messages(json_t *req, json_t *all, size_t first, size_t k) {
    json_t *m = json_array();
    for (size_t i = 0; m && i < json_array_size(all); i++)
        if ((i < first || i >= first + k) && json_array_append(m, json_array_get(all, i))) {
            json_decref(m);
            m = NULL;
        }
    return !m || json_object_set_new(req, "messages", m) ? -1 : 0;
}

/* Responses with truncation "auto" whose conversation does not fit the context: the fewest of
 * its earliest messages dropped, found by bisection over the places a cut may go (each try
 * renders and tokenizes the prompt). Kept: the leading system / developer messages (the
 * instructions among them), the last message; a cut never leaves a tool result first (its call
 * gone). A try that fails otherwise than by the context counts as not fitting; out of memory
 * ends the search. Leaves j->rc and j->g as the parse of what is sent. */
static void truncate_to_fit(srv *s, prep_job *j) {
    json_t *all = json_incref(json_object_get(j->json, "messages"));
    size_t n = json_array_size(all), first = 0, nc = 0;
    const char *role;
#define ROLE(i) ((role = json_string_value(json_object_get(json_array_get(all, i), "role"))) ? role : "")
    while (first < n && (!strcmp(ROLE(first), "system") || !strcmp(ROLE(first), "developer"))) first++;
    size_t *cut = n > first + 1 ? m3_fault_malloc(M3_FAULT_SERVER, (n - first) * sizeof *cut) : NULL;
    if (n > first + 1 && !cut) j->rc = m3_oai_errorf(&j->e, 500, "server_error", NULL, "out of memory");
    for (size_t i = first + 1; cut && i < n; i++) /* drop [first, i): message i is kept first */
        if (strcmp(ROLE(i), "tool")) cut[nc++] = i - first;
#undef ROLE
    size_t lo = 0, hi = nc; /* the least cut index that fits lies in [lo, hi) if below nc */
    int last_rc = -1;
    while (lo < hi) {
        size_t c = lo + (hi - lo) / 2;
        m3_oai_params_free(&j->g);
        if (drop_messages(j->json, all, first, cut[c])) { j->rc = m3_oai_errorf(&j->e, 500, "server_error", NULL, "out of memory"); break; }
        j->rc = m3_oai_parse_generate(&s->ctx, j->json, 1, &j->g, &j->e);
        if (j->rc == 500) break;
        if (j->rc) lo = c + 1;
        else hi = c;
        last_rc = c == hi && !j->rc ? (int)c : -1; /* the parse now in j->g answers cut c */
    }
    if (j->rc != 500 && nc && lo < nc && last_rc != (int)lo) { /* the answer's parse */
        m3_oai_params_free(&j->g);
        if (drop_messages(j->json, all, first, cut[lo])) j->rc = m3_oai_errorf(&j->e, 500, "server_error", NULL, "out of memory");
        else j->rc = m3_oai_parse_generate(&s->ctx, j->json, 1, &j->g, &j->e);
    } else if (j->rc != 500 && nc && lo == nc) { /* nothing fits: the error of the shortest conversation a cut leaves */
        m3_oai_params_free(&j->g);
        if (drop_messages(j->json, all, first, cut[nc - 1])) j->rc = m3_oai_errorf(&j->e, 500, "server_error", NULL, "out of memory");
        else j->rc = m3_oai_parse_generate(&s->ctx, j->json, 1, &j->g, &j->e);
    }
    free(cut);
    json_decref(all);
}

static void do_generate(srv *s, prep_job *j) {
    int chat = j->kind == SRV_PREP_CHAT || j->kind == SRV_PREP_MESSAGES || j->kind == SRV_PREP_RESPONSES;
    j->rc = m3_oai_parse_generate(&s->ctx, j->json, chat, &j->g, &j->e);
    if (j->kind == SRV_PREP_RESPONSES && j->resp.truncate && over_context(j)) truncate_to_fit(s, j);
    if (j->rc) return;
    if ((j->rc = srv_structured(s, &j->g, &j->e))) return; /* a grammar: compiled here, or from the cache */
    if (j->g.media.px.n_images) { /* the content hash of the pixels, for the prefix cache */
        /* first their memory: preprocessed pixels stay until the vision tower has run, and all
         * requests together hold at most --max-image-memory of them */
        size_t bytes = (size_t)j->g.media.px.n_patches * (size_t)j->g.media.px.patch_dim * sizeof(float);
        size_t held = atomic_fetch_add(&s->px_held, bytes) + bytes, cap = s->o->max_image_memory;
        j->px_bytes = bytes;
        if (cap && held > cap) {
            j->rc = m3_oai_errorf(&j->e, 429, "rate_limit_error", "messages",
                                  "the server holds %.0f MiB of image pixels for the requests before this one; with this "
                                  "one's %.1f MiB that is over its limit of %.0f MiB: retry later",
                                  (double)(held - bytes) / 1048576.0, (double)bytes / 1048576.0, (double)cap / 1048576.0);
            return;
        }
        m3_err err;
        j->n_images = j->g.media.px.n_images; /* px is the images object's from here on */
        j->images = m3_engine_images_create(s->e, &j->g.media.px, j->g.media.rows, j->g.media.n_rows, &err);
        if (!j->images)
            j->rc = err.oom ? m3_oai_errorf(&j->e, 500, "server_error", NULL, "%s", err.msg)
                            : m3_oai_errorf(&j->e, 400, "invalid_request_error", "messages", "%s", err.msg);
    }
}

static void *worker_main(void *arg) {
    srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->prep_mu);
        while (!s->prep_q && !s->prep_stop) pthread_cond_wait(&s->prep_cv, &s->prep_mu);
        prep_job *j = s->prep_q;
        if (j) {
            s->prep_q = j->next;
            if (!s->prep_q) s->prep_tail = NULL;
        }
        pthread_mutex_unlock(&s->prep_mu);
        if (!j) return NULL; /* stopping, nothing queued */
        if (j->kind == SRV_PREP_INPUT_ITEMS) j->rc = srv_resp_input_items(s, j->body, &j->reply, &j->e); /* body: the target */
        else j->rc = m3_oai_parse_body(j->body, j->n, &j->json, &j->e);
        if (!j->rc && j->kind == SRV_PREP_INVOCATIONS) { /* the body says which: "messages" chat, "prompt" a completion */
            json_t *mv = json_object_get(j->json, "messages"), *pv = json_object_get(j->json, "prompt");
            j->invoked = 1;
            if (mv && !json_is_null(mv)) j->kind = SRV_PREP_CHAT;
            else if (pv && !json_is_null(pv)) j->kind = SRV_PREP_COMPLETION;
            else j->rc = m3_oai_errorf(&j->e, 400, "invalid_request_error", NULL,
                                       "/invocations takes a chat completion ('messages') or a completion ('prompt') request");
        }
        if (!j->rc && (j->kind == SRV_PREP_MESSAGES || j->kind == SRV_PREP_COUNT_TOKENS)) {
            /* Anthropic's request, spelled as the OpenAI chat request that means the same */
            json_t *oai = NULL;
            j->rc = m3_anth_to_oai(j->json, j->kind == SRV_PREP_COUNT_TOKENS, &oai, &j->e);
            json_decref(j->json);
            j->json = oai;
        }
        if (!j->rc && j->kind == SRV_PREP_RESPONSES) responses_to_chat(s, j);
        if (!j->rc && j->kind != SRV_PREP_INPUT_ITEMS) {
            if (j->kind == SRV_PREP_TOKENIZE) do_tokenize(s, j);
            else if (j->kind == SRV_PREP_COUNT_TOKENS) do_count_tokens(s, j);
            else if (j->kind == SRV_PREP_DETOKENIZE) do_detokenize(s, j);
            else do_generate(s, j);
            if (j->rc && j->kind == SRV_PREP_RESPONSES) m3_resp_error_names(&j->e);
        }
        if (!j->rc && j->reply && !(j->reply_text = srv_json_text(j->reply, &j->reply_len)))
            j->rc = m3_oai_errorf(&j->e, 500, "server_error", NULL, "out of memory");
        free(j->body); /* the parsed body is what the answer borrows from */
        j->body = NULL;
        pthread_mutex_lock(&s->prep_mu);
        j->next = s->prep_done;
        s->prep_done = j;
        pthread_mutex_unlock(&s->prep_mu);
        event_active(s->prep_ev, EV_READ, 0);
    }
}

/* ------------------------------------------------------------------ the loop */

/* the client left while its request was prepared (loop) */
static void job_gone(http_req *req, void *arg) {
    (void)req;
    ((prep_job *)arg)->req = NULL;
}

int srv_prep_submit(srv *s, http_req *req, int kind, unsigned long serial, double t0) {
    struct evbuffer *in = kind == SRV_PREP_INPUT_ITEMS ? NULL : http_body(req);
    const char *target = http_target(req); /* the job's text for input_items: the target, query included */
    size_t n = kind == SRV_PREP_INPUT_ITEMS ? strlen(target) : in ? evbuffer_get_length(in) : 0;
    prep_job *j = srv_calloc(1, sizeof *j);
    char *body = j ? srv_malloc(n + 1) : NULL;
    if (!body) {
        free(j);
        return srv_send_error(req, 500, "server_error", "out of memory");
    }
    if (kind == SRV_PREP_INPUT_ITEMS) memcpy(body, target, n);
    else if (n && evbuffer_remove(in, body, n) != (int)n) {
        free(body);
        free(j);
        return srv_send_error(req, 500, "server_error", "cannot read the request body");
    }
    body[n] = 0;
    j->s = s;
    j->req = req;
    j->serial = serial;
    j->t0 = t0;
    j->kind = kind;
    j->body = body;
    j->n = n;
    http_req_on(req, NULL, job_gone, j);
    s->n_prep++;
    j->all_next = s->prep_all;
    if (s->prep_all) s->prep_all->all_prev = j;
    s->prep_all = j;
    pthread_mutex_lock(&s->prep_mu);
    if (s->prep_tail) s->prep_tail->next = j;
    else s->prep_q = j;
    s->prep_tail = j;
    pthread_cond_signal(&s->prep_cv);
    pthread_mutex_unlock(&s->prep_mu);
    return 0;
}

static const char *route_name(int kind) {
    switch (kind) {
    case SRV_PREP_TOKENIZE: return "POST /tokenize";
    case SRV_PREP_DETOKENIZE: return "POST /detokenize";
    case SRV_PREP_CHAT: return "POST /v1/chat/completions";
    case SRV_PREP_MESSAGES: return "POST /v1/messages";
    case SRV_PREP_COUNT_TOKENS: return "POST /v1/messages/count_tokens";
    case SRV_PREP_RESPONSES: return "POST /v1/responses";
    case SRV_PREP_INPUT_ITEMS: return "GET /v1/responses/{id}/input_items";
    case SRV_PREP_INVOCATIONS: return "POST /invocations";
    default: return "POST /v1/completions";
    }
}

/* a finished job: its answer, or the generation started */
static void finish_job(srv *s, prep_job *j) {
    http_req *req = j->req;
    int rc;
    if (req) http_req_on(req, NULL, NULL, NULL); /* the job goes: whoever answers sets its own */
    if (!req) { /* the client left while it was prepared: nothing to answer */
        rc = 499;
    } else if (s->cancelling) { /* the shutdown's deadline passed while it was prepared (before: in flight, it runs) */
        http_close_after(req);
        rc = srv_send_error(req, 503, "service_unavailable_error", M3_SERVER_SHUTTING_DOWN);
    } else if (j->rc) {
        if (j->kind != SRV_PREP_RESPONSES) j->e.code = NULL; /* the chat endpoints answer as vLLM: the status as code */
        rc = srv_send_oai(req, &j->e);
    } else if (j->kind == SRV_PREP_TOKENIZE || j->kind == SRV_PREP_DETOKENIZE || j->kind == SRV_PREP_COUNT_TOKENS ||
               j->kind == SRV_PREP_INPUT_ITEMS) {
        rc = srv_send_text(req, 200, j->reply_text, j->reply_len);
        j->reply_text = NULL;
    } else {
        int api = j->kind == SRV_PREP_MESSAGES ? SRV_API_ANTHROPIC : j->kind == SRV_PREP_RESPONSES ? SRV_API_RESPONSES : SRV_API_OPENAI;
        rc = srv_generate_start(s, req, j->kind == SRV_PREP_CHAT || api != SRV_API_OPENAI, api, &j->g, j->images, j->n_images,
                                &j->px_bytes, j->serial, j->t0, api == SRV_API_RESPONSES ? &j->resp : NULL);
    }
    if (rc) { /* answered here; an accepted generation logs itself when it ends */
        m3_metrics_http(&s->m, rc);
        srv_log(s, j->serial, j->invoked ? "POST /invocations" : route_name(j->kind), rc, -1, -1, -1, m3_now() - j->t0);
    }
    job_free(j);
}

static void done_cb(evutil_socket_t fd, short what, void *arg) {
    (void)fd; (void)what;
    srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->prep_mu);
        prep_job *list = s->prep_done;
        s->prep_done = NULL;
        pthread_mutex_unlock(&s->prep_mu);
        if (!list) break;
        prep_job *order = NULL; /* pushed newest first: answer oldest first */
        while (list) {
            prep_job *nx = list->next;
            list->next = order;
            order = list;
            list = nx;
        }
        while (order) {
            prep_job *nx = order->next;
            s->n_prep--;
            s->n_prepared++;
            if (order->all_prev) order->all_prev->all_next = order->all_next;
            else s->prep_all = order->all_next;
            if (order->all_next) order->all_next->all_prev = order->all_prev;
            finish_job(s, order);
            order = nx;
        }
    }
    srv_maybe_exit(s);
}

int srv_prep_start(srv *s, int threads) {
    pthread_mutex_init(&s->prep_mu, NULL);
    pthread_cond_init(&s->prep_cv, NULL);
    s->prep_init = 1;
    s->prep_ev = event_new(s->base, -1, EV_PERSIST | EV_READ, done_cb, s);
    if (!s->prep_ev || event_add(s->prep_ev, NULL)) return -1;
    if (threads < 1) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc < 2 ? 2 : nc > 4 ? 4 : (int)nc;
    }
    if (threads > SRV_MAX_PREP) threads = SRV_MAX_PREP;
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&s->prep_th[i], NULL, worker_main, s)) return -1;
        s->n_prep_th = i + 1;
    }
    return 0;
}

void srv_prep_stop(srv *s) {
    if (!s->prep_init) return;
    pthread_mutex_lock(&s->prep_mu);
    s->prep_stop = 1;
    pthread_cond_broadcast(&s->prep_cv);
    pthread_mutex_unlock(&s->prep_mu);
    for (int i = 0; i < s->n_prep_th; i++) pthread_join(s->prep_th[i], NULL);
    s->n_prep_th = 0;
    /* what was never answered (the loop ended first): its requests go with the connections,
     * which must not call back into the jobs */
    for (prep_job *l = s->prep_all; l; l = l->all_next)
        if (l->req) http_req_on(l->req, NULL, NULL, NULL);
    for (prep_job *l = s->prep_q; l;) { prep_job *nx = l->next; job_free(l); l = nx; }
    for (prep_job *l = s->prep_done; l;) { prep_job *nx = l->next; job_free(l); l = nx; }
    s->prep_q = s->prep_tail = s->prep_done = s->prep_all = NULL;
    if (s->prep_ev) event_free(s->prep_ev);
    s->prep_ev = NULL;
    pthread_cond_destroy(&s->prep_cv);
    pthread_mutex_destroy(&s->prep_mu);
    s->prep_init = 0;
}
