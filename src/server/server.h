/* m3 serve: an OpenAI-compatible HTTP server over m3_engine (HTTP/1.1 of its own on libevent
 * bufferevents: http.h).
 *
 * Threads: the HTTP side (connections, JSON replies, output parsers, metrics) runs on the
 * thread that calls m3_server_run; request preparation (JSON parsing, chat template,
 * tokenizer, images) on a few worker threads (prep.c); one engine thread runs m3_engine_step. Engine
 * callbacks only push (choice, sampler output, finish) records onto a mutex-protected queue
 * and wake the HTTP thread with event_active; everything else happens on the HTTP thread.
 * A client whose connection closes before its request finished has it cancelled
 * (m3_engine_cancel); its state is freed when the engine reports the end.
 *
 * Endpoints: GET /health, GET /metrics (Prometheus text), GET /v1/models, POST /tokenize,
 * POST /detokenize, POST /v1/completions, POST /v1/chat/completions (stream and
 * non-stream; n choices, logprobs, logit_bias, stop strings / ids, min_tokens, seeds; images
 * as OpenAI image_url content parts with data: URLs, see media.h); POST /v1/messages and
 * /v1/messages/count_tokens (Anthropic's Messages API, run as the chat completion that means
 * the same: anthropic.h; its errors in Anthropic's shape).
 * /health and /metrics need no API key (as vLLM); the others do when one is set, given as
 * "Authorization: Bearer KEY" or "x-api-key: KEY".
 *
 * Limits: malformed requests get 400 (and the other refusals of RFC 9112: http_parse.h),
 * bodies over max_body 413, a request line + headers over max_header_bytes 414 / 431, all in
 * OpenAI's error shape, before anything reads the body; a request must arrive whole within
 * timeout seconds (408), an idle keep-alive closes after them, and a client that does not
 * take its bytes for that long is closed and its request cancelled; at most max_connections
 * at once; prompts that leave no room in the context,
 * bad types and ranges get 400 (src/server/openai.h lists the limits on n, messages, stop,
 * logit_bias, tools); while the engine's waiting queue holds max_waiting sequences, new
 * generation requests get 429; while shutting down, 503. The default host is 127.0.0.1
 * (loopback only); the API key is compared in constant time.
 *
 * Failures: a request the engine ends with an error (out of memory, NaN / Inf logits) gets a
 * 500 (non-stream) or an error event in its stream (data: {"error": {...}}), then [DONE];
 * so does one whose response cannot be built for lack of memory. Nothing is dropped
 * silently.
 *
 * Shutdown (SIGINT / SIGTERM): the listener closes and new requests on open connections get
 * 503; requests in flight may finish for shutdown_timeout seconds, then the rest are
 * cancelled (streams end with finish_reason "abort" and [DONE], non-stream requests get a
 * 503 error); m3_server_run returns 0 once every response was written. A second signal
 * cancels at once.
 *
 * Logging: one line per request on stderr: serial, method and path, status, prompt and
 * completion tokens, time to first token, total time. */
#ifndef M3_SERVER_H
#define M3_SERVER_H

#include <stddef.h>

#include "../engine/engine.h"
#include "media.h"
#include "../chat/chat.h"
#include "../tokenizer/tokenizer.h"

/* The messages of the 503s a shutdown gives: to a request that arrives (not run), and to one in flight
 * cancelled at shutdown_timeout (m3 run-batch tells them apart by these) */
#define M3_SERVER_SHUTTING_DOWN "the server is shutting down"
#define M3_SERVER_CANCELLED "the request was cancelled: " M3_SERVER_SHUTTING_DOWN

/* what GET /version reports (vLLM answers {"version": ...} there too); session 12 = 0.12 */
#define M3_VERSION "0.12.0"

struct srv; /* a running server (m3_server_run's; opaque) */

typedef struct m3_server_opts {
    const char *host;          /* default "127.0.0.1" */
    int port;                  /* default 8000; 0: any free port (printed) */
    const char *api_key;       /* NULL: no auth */
    const char *model_name;    /* id reported by /v1/models and accepted as "model"; responses carry it */
    const char *const *model_names; /* NULL-terminated: every name listed and accepted (model_name first); NULL: only it */
    size_t max_body;           /* request body limit in bytes (default 32 MiB) */
    int max_waiting;           /* 429 while the engine has this many waiting sequences (default 1024) */
    double shutdown_timeout;   /* seconds in-flight requests get after a signal (default 30) */
    int eos_id;                /* the model config's EOS id (-1: none): min_tokens holds it back too */
    size_t kv_bytes_per_token; /* for /metrics; 0: not reported */
    int log_requests;          /* one stderr line per request (default 1) */
    size_t max_header_bytes;   /* request line + headers limit (default 64 KiB) */
    double timeout;            /* seconds a connection may stay silent (default 60; 0: none); also the most a
                                * request may take to arrive, however it trickles in */
    int max_connections;       /* connections at once; the listener pauses at it (default 1024; 0: no cap) */
    const struct m3_oai_defaults *gen_defaults; /* sampling defaults (generation_config.json); NULL: OpenAI's */
    uint64_t seed;             /* with has_seed: requests without a seed draw from seeds derived from it and
                                * their arrival order (vLLM's --seed), instead of the clock */
    int has_seed;
    const char *fault_spec;    /* tests only: allocation failures armed once listening (src/base/fault.h) */
    const m3_media_ctx *media; /* image inputs of chat requests (media.h; the engine needs a vision tower);
                                * NULL: image parts get 400 */
    const char *const *allowed_origins; /* CORS: origins browsers may call from ("*": any), NULL-terminated;
                                * NULL: CORS off (no Access-Control-* headers, OPTIONS gets 405) */
    size_t max_image_memory;   /* bytes of preprocessed pixels all requests together may hold until the
                                * vision tower has run (default 2 GiB); beyond it a request with images gets 429 */
    int scheduling_priority;   /* --scheduling-policy priority (the engine's too): requests' "priority" is served */
    int reasoning_budget;      /* --reasoning-budget: the thinking_token_budget of chat requests that give none
                                * (-1, the default: none; the tokenizer must have the reasoning tags) */
    int prompt_tokens_details; /* usage of completions / chat completions has prompt_tokens_details.cached_tokens
                                * (vLLM's --enable-prompt-tokens-details) */
    size_t responses_store;    /* bytes of stored responses (POST /v1/responses with store, previous_response_id,
                                * GET / DELETE /v1/responses/{id}; default 256 MiB; past it the oldest go); 0: none */
    int force_include_usage;   /* vLLM's --enable-force-include-usage: every stream ends with usage */
    int ids_as_tokens;         /* vLLM's --return-tokens-as-token-ids: return_tokens_as_token_ids by default */
    int trust_templates;       /* vLLM's --trust-request-chat-template: a request's chat_template is rendered */
    const char *uds;           /* listen on this Unix socket instead of host:port (vLLM's --uds); NULL: TCP */
    /* called on the serving thread when the server listens, before it serves, and again with srv
     * NULL when it has stopped serving, before srv is freed: m3_server_shutdown(srv) may be called
     * between the two (the caller keeps them apart); NULL: none */
    void (*ready)(void *arg, struct srv *srv);
    void *ready_arg;
} m3_server_opts;

void m3_server_opts_default(m3_server_opts *o);

/* From any thread: shut down as SIGTERM does (the listener closes, requests in flight finish),
 * silently; nothing if shutting down already. */
void m3_server_shutdown(struct srv *srv);

/* Serves until SIGINT / SIGTERM or m3_server_shutdown (see above). The engine, tokenizer and chat template are
 * borrowed. chat may be NULL (chat completions then answer 400). vocab: the model's
 * vocabulary size (prompt and logit_bias ids are checked against it). Returns 0, or -1 + err
 * when the server could not start. */
int m3_server_run(m3_engine *e, const m3_tok *tok, const m3_chat *chat, int vocab, const m3_server_opts *o,
                  m3_err *err);

#endif
