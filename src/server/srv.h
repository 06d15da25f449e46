/* m3 serve internals shared by server.c (HTTP plumbing, routing, shutdown), generate.c
 * (completions and chat completions) and metrics.c. Not a public API: see server.h.
 *
 * Lifetimes. An hreq is one generation request with n choices, each an engine request. It
 * lives on srv.live from submission until (a) the engine has reported the end of every
 * choice (n_open == 0), (b) the response was written or the client is gone, and (c) no
 * function up the stack still uses it (busy == 0); hreq_release checks the three. The
 * HTTP request (hreq.req, http.h) is NULL here once the reply was handed over or the
 * connection closed. */
#ifndef M3_SERVER_SRV_H
#define M3_SERVER_SRV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>
#include <jansson.h>

#include "../base/clock.h"
#include "../base/fault.h"
#include "../base/sbuf.h"
#include "../chat/parsers.h"
#include "http.h"
#include "metrics.h"
#include "openai.h"
#include "server.h"

/* the server's own allocations, counted by the fault-injection hook (src/base/fault.h) */
#define srv_malloc(n) m3_fault_malloc(M3_FAULT_SERVER, n)
#define srv_calloc(k, n) m3_fault_calloc(M3_FAULT_SERVER, k, n)
#define srv_realloc(p, n) m3_fault_realloc(M3_FAULT_SERVER, p, n)

/* a stream with this much output not taken by its client for --timeout seconds is dropped */
#define SRV_STALL_BYTES ((size_t)256 << 10)
/* A stream with nothing to say for this long (queued, or waiting behind long prefills) gets an
 * SSE comment line, ": keep-alive": it keeps proxies from closing the connection. (--timeout
 * bounds a request's arrival and a client not taking its bytes, never the time a request
 * waits for the engine.) Half the --timeout when that is shorter. */
#define SRV_KEEPALIVE_S 15.0
/* the send buffer of accepted sockets (the kernel doubles it): 1 MiB/s at 250 ms RTT */
#define SRV_SNDBUF (128 << 10)


struct m3_resp_req;   /* responses.h */
struct m3_resp_store; /* resp_store.h */

typedef struct srv srv;
typedef struct hreq hreq;
typedef struct prep_job prep_job;

/* what a preparation job does (prep.c) */
enum { SRV_PREP_COMPLETION = 0, SRV_PREP_CHAT = 1, SRV_PREP_TOKENIZE = 2, SRV_PREP_DETOKENIZE = 3,
       SRV_PREP_MESSAGES = 4, SRV_PREP_COUNT_TOKENS = 5, SRV_PREP_RESPONSES = 6, SRV_PREP_INPUT_ITEMS = 7,
       SRV_PREP_INVOCATIONS = 8 /* SageMaker's (vLLM's): a chat completion or a completion, by the body */ };
/* the API a generation request speaks: its output's shapes (generate.c, anthropic.c, responses.c) */
enum { SRV_API_OPENAI = 0, SRV_API_ANTHROPIC = 1, SRV_API_RESPONSES = 2 };
#define SRV_MAX_PREP 16 /* preparation threads at most */

typedef struct choice {
    hreq *h;
    int index;
    uint64_t id;            /* engine request id; 0 when not submitted */
    int engine_ended;       /* the engine reported the end */
    int done;               /* the output is complete (finish reported to the client or kept) */
    int finish_reason;      /* M3_FINISH_* */
    int cancel_pending;     /* m3_engine_cancel failed (no memory): srv_peek retries */
    const char *eng_err;    /* why the engine ended it with M3_FINISH_ERROR (eng_err_buf); written on
                             * the engine thread before the final record is queued, read after */
    char eng_err_buf[512];
    atomic_int lost;        /* the engine thread could not queue one of its records (no memory) */
    int n_gen;              /* tokens generated (a stop token included) */
    int n_prompt_toks;      /* its prompt's tokens (a batch of completions: its own prompt's) */
    atomic_int n_cached;    /* prompt tokens found in the prefix cache (the engine thread's on_admit) */
    double t_last;          /* arrival of the last token (inter-token latency) */
    m3_tok_stream *ts;
    m3_out *out;            /* chat: reasoning + tool-call parser */
    m3_stop *stop;
    m3_sbuf text;              /* decoded output (before stop-string truncation) */
    size_t emitted, checked;/* bytes of text passed on / scanned for stop strings */
    m3_sbuf content, reasoning;/* non-stream: accumulated output */
    json_t *tools;          /* non-stream chat: tool calls */
    json_t *lp;             /* logprobs not yet sent (stream) or all of them (non-stream) */
    int stop_hit;           /* a stop string ended the output: text[stop_start, stop_end) */
    size_t stop_start, stop_end;
    /* /v1/messages (anthropic.c): the content block being written */
    int ab_kind;            /* its kind + 1 (M3_OUT_*: REASONING thinking, CONTENT text, TOOL_* tool_use); 0: none */
    int ab_n;               /* blocks opened so far (the stream's block indexes) */
    int ab_call;            /* tool_use: the parser's call index */
    m3_sbuf ab_text;        /* its text not sent yet (stream) or all of it (non-stream) */
    json_t *ab_blocks;      /* non-stream: the blocks closed so far */
    json_t *ab_tool;        /* non-stream: the open tool_use block */
    /* /v1/responses (responses.c): the output item being written is ab_kind / ab_n / ab_call /
     * ab_text (all of its text), the items closed so far ab_blocks (stream too) */
    size_t r_sent;          /* stream: bytes of ab_text sent */
    json_t *r_lp;           /* its message's logprob entries (include message.output_text.logprobs) */
    json_t *r_lp_pend;      /* stream: those not sent yet */
    int r_reason_toks;      /* reasoning tokens, its tags included (usage.output_tokens_details) */
    int r_reason;           /* 1: in the reasoning; 0: adaptive, before the first token; -1: done or off;
                             * 2: enabled without single-token tags (counted by records of reasoning) */
    size_t text_chars;      /* code points so far (completions text_offset) */
    size_t echo_chars;      /* code points of the echoed prompt (0: no echo) */
    /* prompt logprobs (h->prompt_logprobs >= 0): vLLM's list ([null, {"<id>": {logprob, rank,
     * decoded_token}}, ...]), the positions reported so far; with echo + logprobs the prompt
     * tokens' texts (decoded in order, as the echo is) and their code points so far */
    json_t *plp;
    int plp_got;
    json_t *tids;           /* return_token_ids: the ids generated (a stream: those not sent yet) */
    int pids_sent;          /* a stream: its prompt_token_ids went out */
    m3_tok_stream *pts;
    size_t p_chars;
    struct choice *fin_next;/* srv.fin list (a final record that found the queue out of memory) */
    int fin_reason, fin_has_tok;
    m3_sample_out fin_so;
} choice;

struct hreq {
    srv *s;
    http_req *req;          /* NULL once the response is handed over or the client is gone (http.h) */
    unsigned long serial;
    int chat, stream, include_usage, n, echo;
    int continuous_usage;   /* every chunk carries its choice's usage so far (vLLM's continuous_usage_stats) */
    int api;                /* SRV_API_*: the shapes of its output */
    int include_stop;       /* include_stop_str_in_output */
    int logprobs, top_logprobs; /* report logprobs, with this many alternatives per token */
    int prompt_logprobs;    /* -1: none; else the alternatives of vLLM's list (prompt_logprobs, or with echo logprobs) */
    int echo_lp;            /* completions' echo with logprobs: the prompt's entries lead each choice's logprobs */
    int ids_as_tokens;      /* return_tokens_as_token_ids: logprobs name tokens "token_id:<id>" */
    int return_ids;         /* return_token_ids: the prompt's and the output's ids in the answer */
    int32_t *pids;          /* ... the prompts' ids (owned), prompt p at pid_off[p] */
    size_t pid_off[M3_OAI_MAX_PROMPTS + 1];
    char id_sfx[129];       /* the response's id after cmpl- / chatcmpl-: X-Request-Id, the body's request_id, or rid */
    char role[16];          /* chat: the answer's role (m3_oai_params.role) */
    int one_call;           /* parallel_tool_calls: false with free output: a choice ends at its first tool call */
    int min_tokens;
    int n_prompt;
    long created;
    double t0, t_first;     /* arrival, first token of any choice */
    int closed;             /* the client went away */
    const char *failed;     /* why the response could not be built (no memory): it ends with an error */
    char fail_msg[256];     /* failed's text when it is not a static string (mark_failed_err) */
    double stall_since;     /* stream output pending beyond SRV_STALL_BYTES since then (0: not) */
    double t_write;         /* a stream's last bytes handed over (keep-alive comments follow silence) */
    int replied;            /* the whole response was handed over (http.h) */
    int flushed;            /* ... and written, or the connection is gone */
    int n_open;             /* choices submitted and not ended by the engine */
    int n_done;             /* choices whose output is complete */
    int busy;
    size_t px_bytes;        /* preprocessed pixels it holds, counted in srv.px_held */
    char rid[33];           /* random hex: the response's id (chatcmpl-RID) and its tool calls' */
    /* /v1/responses (responses.c) */
    json_t *r_echo;         /* the response object's request fields (responses.h) */
    json_t *r_turn;         /* this request's input as chat messages, for the store */
    json_t *r_items;        /* its input items as listed (GET .../input_items), for the store */
    char *r_prev;           /* previous_response_id, NULL: none */
    int r_store;            /* store the response when it completes */
    long r_seq;             /* stream: the next event's sequence_number */
    int32_t r_think_open, r_think_end; /* the reasoning's tags as token ids (-1: none) */
    char *echo_text;        /* completions with echo: the prompts' text */
    size_t echo_len;
    int n_per;              /* choices per prompt: choice i answers prompt i / n_per */
    size_t echo_off[M3_OAI_MAX_PROMPTS + 1]; /* echo: prompt p's text in echo_text */
    choice *ch;             /* [n] */
    hreq *prev, *next;      /* srv.live */
};

/* an engine record: a token (has_tok), an end (finished), or a prompt position's logprobs (ppos >= 1) */
typedef struct qitem { choice *c; m3_sample_out so; int has_tok, finished, reason, ppos; } qitem;

struct srv {
    m3_engine *e;
    m3_oai_ctx ctx;         /* what request parsing needs (openai.h) */
    const m3_tok *tok;
    const m3_chat *chat;
    int vocab;
    int n_text;             /* ids below it are text (min of the tokenizer's and the model's vocabulary) */
    int32_t *holes;         /* ids below n_text that no token spells: masked like those above it */
    int n_holes;
    int reasoning_parser, tool_parser;
    const m3_server_opts *o;
    struct event_base *base;
    http_server *http;      /* connections, requests, responses (http.h) */
    struct event *notify, *sigint, *sigterm, *peek, *deadline, *hard_stop, *dead_ev, *stop_ev;
    pthread_mutex_t mu;     /* guards q and fin (filled by the engine thread) */
    qitem *q;
    size_t qn, qcap;
    choice *fin;
    atomic_int stop_engine;
    atomic_int engine_dead;  /* the engine's device failed: the server drains and exits with an error */
    unsigned long serial;
    uint64_t seed_ctr;
    hreq *live;
    int n_live;
    int draining, cancelling;
    struct event *exit_wait;   /* draining: fires srv_maybe_exit at a deadline (SRV_FIRST_WAIT, SRV_SEND_WAIT), or at
                                * once (exit_recheck) when a connected client's first request comes or the client
                                * goes (http_opts.first_done), or a reply has been written (http_opts.sent_done) */
    double drain_t0;           /* when draining began (m3_now) */
    double send_dl;            /* draining: until when the exit waits for replies being written (0: not yet set) */
    m3_metrics m;
    /* requests prepared off the loop (prep.c): a queue for the workers, a list of finished jobs
     * for the loop (prep_ev), both under prep_mu */
    pthread_mutex_t prep_mu;
    pthread_cond_t prep_cv;
    prep_job *prep_q, *prep_tail, *prep_done;
    prep_job *prep_all;     /* every job not answered yet (loop only; srv_prep_fds) */
    int prep_stop, prep_init, n_prep_th;
    int n_prep;             /* jobs submitted and not answered yet (loop only): in flight, as n_live */
    unsigned long n_prepared; /* jobs finished (loop only): /metrics' m3_requests_prepared_total */
    atomic_size_t px_held;  /* bytes of preprocessed pixels held by requests (jobs and hreqs), against
                             * o->max_image_memory */
    pthread_t prep_th[SRV_MAX_PREP];
    struct event *prep_ev;
    struct srv_grammars *gram; /* structured outputs: the grammar vocabulary and compiled grammars (structured.c) */
    struct m3_resp_store *store; /* stored responses (resp_store.h); NULL: --responses-store 0 */
};

/* server.c */
void srv_random_hex(char *out, size_t cap); /* cap - 1 random hex digits, NUL-terminated */
/* the request's X-Request-Id when it is one the server takes (printable ASCII without spaces, up
 * to 128 bytes: it is echoed, and names the response), else NULL */
const char *srv_request_id(http_req *req);
/* compact JSON text of j (malloc'd, NUL-terminated; *len its length if len), NULL when out of memory */
char *srv_json_text(const json_t *j, size_t *len);
int srv_send_json(http_req *req, int code, json_t *j); /* takes j; returns code */
/* JSON text (malloc'd: taken, whatever happens); returns code */
int srv_send_text(http_req *req, int code, char *text, size_t len);
int srv_send_error(http_req *req, int code, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define SRV_BAD(req, ...) srv_send_error(req, 400, "invalid_request_error", __VA_ARGS__)
int srv_send_oai(http_req *req, const m3_oai_error *e); /* returns e->status */
/* An OpenAI error object as JSON text (no allocation: escaped into buf), for bodies and
 * stream events. Returns its length (truncated to cap - 1). */
size_t srv_error_json(char *buf, size_t cap, int code, const char *type, const char *param, const char *msg);
/* the same with OpenAI's code string (scode; NULL: the status) */
size_t srv_error_json_code(char *buf, size_t cap, int code, const char *scode, const char *type, const char *param,
                           const char *msg);
int srv_check_auth(srv *s, http_req *req);       /* 0, or the status of the 401 sent */
void srv_log(srv *s, unsigned long serial, const char *what, int status, int prompt, int completion, double ttft,
             double total);
void srv_push(srv *s, const qitem *it); /* engine thread */
#define SRV_FIRST_WAIT 1.0            /* s a stopping server waits for connected clients' first requests */
#define SRV_SEND_WAIT 2.0             /* s it then waits for the replies still being written (503s, /metrics) */
void srv_maybe_exit(srv *s);            /* draining and nothing left: leave the loop */

/* prep.c: request preparation on worker threads */
int srv_prep_start(srv *s, int threads); /* threads 0: one per CPU, 2 to 4 */
void srv_prep_stop(srv *s);              /* after the loop: joins the workers, drops what is left */
/* Hands req's body to a worker (kind: SRV_PREP_*); the loop answers when it is done. 0, or
 * the status of the error sent (no memory). */
int srv_prep_submit(srv *s, http_req *req, int kind, unsigned long serial, double t0);

/* structured.c: structured outputs compiled for the engine (any thread; prep workers) */
int srv_grammars_init(srv *s);
void srv_grammars_free(srv *s); /* once the engine thread has stopped */
/* g->constraint -> g->grammar (a reference): the cached grammar, or compiled now. 0, or the
 * status of the error in e (400 naming the schema's problem, 500 out of memory). */
int srv_structured(srv *s, m3_oai_params *g, m3_oai_error *e);
void srv_grammar_stats(srv *s, uint64_t *compiled, uint64_t *hits);

/* generate.c */
/* POST /v1/completions (chat 0) and /v1/chat/completions (chat 1), once prepared: g parsed and
 * checked, images (NULL: none; n_images of them) made for the engine (a reference is taken);
 * *px_bytes of srv.px_held move to the request when it starts (*px_bytes is 0 then); resp
 * (api SRV_API_RESPONSES, else NULL): what the response object needs, moved to the request
 * (responses.h; previous_id copied). Returns the HTTP
 * status sent (429 while the engine's queue is full), or 0 when the request was accepted (it
 * logs itself when it ends). */
int srv_generate_start(srv *s, http_req *req, int chat, int api, m3_oai_params *g, m3_engine_images *images,
                       int n_images, size_t *px_bytes, unsigned long serial, double t0, struct m3_resp_req *resp);
void srv_handle_item(srv *s, qitem *it);
void srv_peek(srv *s);       /* cancels requests whose client went away; retries failed cancels */
void srv_cancel_all(srv *s); /* shutdown deadline */
void srv_free_all(srv *s);   /* after the loop: whatever is left */

/* anthropic.c: POST /v1/messages output in Anthropic's shapes (the request is translated by
 * anthropic_req.c and generated as a chat completion; stop strings and the output parsers run
 * in generate.c as for OpenAI requests) */
int srv_path_anthropic(const char *target); /* 1: an Anthropic endpoint's path (errors in its shape) */
int srv_api_anthropic(const http_req *req); /* srv_path_anthropic of the request's target */
void srv_anth_start(hreq *h);               /* stream: message_start */
/* parsed deltas of choice c -> content blocks: stream events, or kept for the response */
void srv_anth_deltas(choice *c, const m3_out_delta *d, size_t n);
void srv_anth_stream_end(choice *c);        /* the open block closed, message_delta, message_stop */
void srv_anth_sse_error(hreq *h, int code, const char *msg); /* event: error */
int srv_anth_final(hreq *h);                /* non-stream: the message; returns the status sent */

/* responses.c: POST /v1/responses output in the Responses API's shapes (the request is
 * translated by responses_req.c and generated as a chat completion, as Anthropic's), and the
 * stored responses' endpoints */
void srv_resp_start(hreq *h);               /* stream: response.created, response.in_progress */
/* parsed deltas of choice c -> output items: stream events, or kept for the response */
void srv_resp_deltas(choice *c, const m3_out_delta *d, size_t n);
void srv_resp_stream_end(choice *c);        /* the open item closed, response.completed / .incomplete */
void srv_resp_sse_failed(hreq *h, const char *msg); /* response.failed */
int srv_resp_final(hreq *h);                /* non-stream: the response; returns the status sent */
void srv_resp_free(hreq *h);                /* what hreq holds for it */
/* a generated token (reasoning tokens counted): 1 when it is none of the message's text (a
 * reasoning token, its tags; its logprob is not the message's) */
int srv_resp_token(choice *c, int32_t token);
/* GET and DELETE /v1/responses/{id}: returns the status sent */
int srv_resp_stored(srv *s, http_req *req, const char *id, int del);
int srv_resp_in_flight(srv *s, const char *id); /* 1: response id is being generated, to be stored (loop) */
/* GET /v1/responses/{id}/input_items (target: the request's, query included), on a preparation
 * thread: *page, or the status of the error in e */
int srv_resp_input_items(srv *s, const char *target, json_t **page, m3_oai_error *e);

#endif
