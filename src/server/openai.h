/* OpenAI request parsing and validation for m3 serve, without HTTP: a request body (JSON text
 * or a parsed object) in; the generation parameters, or an error in OpenAI's shape (HTTP
 * status, type, param, message), out. The server (generate.c, server.c) answers with what
 * it returns; fuzz/fuzz_request.c and tests/reliability/test_request.c drive it directly.
 *
 * What is checked: JSON syntax (object at the top), every field's type and range, the model
 * name, limits (n <= 16 choices, 4096 messages, 16 stop strings, 256 stop ids, 1024
 * logit_bias entries, 512 tools, top_logprobs <= 20), token ids against the vocabulary,
 * prompt + max_tokens against the context, and fields we do not implement (400 rather than
 * ignored). Nothing in a request names a file: the chat template and the tokenizer are the
 * server's; strings from the request are only text.
 *
 * Messages are valid UTF-8 (text quoted from the request is clipped at a character
 * boundary). Ownership: m3_oai_params owns its arrays (m3_oai_params_free) and borrows
 * strings and tools from the body, which must outlive it. Allocations count as the server
 * module's for fault injection (src/base/fault.h). Thread-safe for distinct params (the
 * context is read only). */
#ifndef M3_SERVER_OPENAI_H
#define M3_SERVER_OPENAI_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "../engine/engine.h"
#include "../engine/sampler.h"
#include "../chat/chat.h"
#include "../chat/parsers.h"
#include "../tokenizer/tokenizer.h"
#include "media.h"

#define M3_OAI_MAX_N 16            /* choices per prompt */
#define M3_OAI_MAX_PROMPTS 64      /* prompts in one completions request (a batch) */
#define M3_OAI_MAX_CHOICES 256     /* prompts x n */
#define M3_OAI_MAX_MESSAGES 4096   /* chat messages per request */
#define M3_OAI_MAX_STOP 16         /* stop strings */
#define M3_OAI_MAX_STOP_BYTES (1 << 20) /* their bytes together (matched in linear time whatever their length) */
#define M3_OAI_MAX_STOP_IDS 256
#define M3_OAI_MAX_LOGIT_BIAS 1024
#define M3_OAI_MAX_TOOLS 512
#define M3_OAI_MAX_BAD_WORDS 128     /* bad_words' strings */
#define M3_OAI_MAX_BAD_WORD_TOKENS 128 /* tokens of one of them */

typedef struct m3_oai_error {
    int status;          /* 400, 404 (unknown model), 500 (out of memory) */
    const char *type;    /* "invalid_request_error", "not_found_error", "server_error" */
    char param[64];      /* the field at fault; "" when none */
    char message[1024];  /* valid UTF-8, never empty */
    const char *code;    /* OpenAI's error code string where it has one ("previous_response_not_found",
                          * "context_length_exceeded"), else NULL. Sent by /v1/responses, as OpenAI does; the
                          * chat endpoints send the HTTP status as vLLM does */
} m3_oai_error;

/* The checkpoint's generation_config.json: what a request that leaves a sampling field out gets
 * (vLLM's --generation-config auto); a field not in the file keeps OpenAI's default. */
typedef struct m3_oai_defaults {
    double temperature, top_p, min_p, repetition_penalty;
    long long top_k, max_new_tokens; /* max_new_tokens: max_tokens of requests without one (vLLM's reading) */
    int has_temperature, has_top_p, has_min_p, has_repetition_penalty, has_top_k, has_max_new_tokens;
} m3_oai_defaults;

/* dir/generation_config.json into *d (zeroed first; no file: 0 with nothing set). -1 + err (the file
 * and the field) when the file is not JSON or a field is not a number in its range. */
int m3_oai_defaults_load(m3_oai_defaults *d, const char *dir, m3_err *err);
/* vLLM's --override-generation-config: text, a JSON object of those fields, set over *d (unchanged
 * on error). -1 + err for bad JSON, a field out of range, or a key m3 does not take. */
int m3_oai_defaults_override(m3_oai_defaults *d, const char *text, m3_err *err);

/* What the parser needs to know about the server. */
typedef struct m3_oai_ctx {
    const m3_tok *tok;
    const m3_chat *chat;         /* NULL: chat requests get 400 */
    int vocab;                   /* the model's vocabulary: ids must be below it */
    const char *model_name;      /* "model" must equal it when given; NULL: any */
    const char *const *model_names; /* or one of these (NULL-terminated; NULL: model_name only) */
    int max_model_len;           /* prompt + completion tokens per request */
    int reasoning_parser;        /* the template marks reasoning (<mm:think>) */
    int tool_parser;             /* the template writes MiniMax tool calls */
    const m3_media_ctx *media;   /* image inputs (media.h); NULL: image parts get 400 */
    const m3_oai_defaults *defaults; /* sampling defaults (generation_config.json); NULL: OpenAI's */
    int priority_policy;         /* --scheduling-policy priority: "priority" orders the queue */
    int32_t eos_id;              /* the model config's EOS (-1: none): it ends a request like the tokenizer's */
    int has_think_budget;        /* --reasoning-budget: the thinking_token_budget of chat requests that give none */
    int think_budget;
    int force_usage;             /* vLLM's --enable-force-include-usage: streams end with usage, asked or not */
    int ids_as_tokens;           /* vLLM's --return-tokens-as-token-ids: the default of return_tokens_as_token_ids */
    int trust_templates;         /* vLLM's --trust-request-chat-template: a request's chat_template renders its prompt */
} m3_oai_ctx;

typedef struct m3_oai_params {
    int32_t *ids;                /* the prompt, encoded; a batch's prompts one after the other */
    size_t n_ids;
    int n_prompts;               /* 1, or the prompts of a completions batch ("prompt": [...]) */
    size_t prompt_off[M3_OAI_MAX_PROMPTS + 1]; /* prompt p: ids[prompt_off[p] .. prompt_off[p + 1]) */
    size_t echo_off[M3_OAI_MAX_PROMPTS + 1];   /* echo: prompt p's text in echo_text, likewise */
    double temperature, top_p, min_p, pp, fp, rp; /* pp, fp, rp: presence, frequency, repetition penalty */
    long long top_k, seed, max_tokens, n, min_tokens, top_logprobs;
    int has_seed, stream, include_usage, echo, ignore_eos, logprobs;
    /* prompt logprobs: -1 none; else the alternatives a prompt position gets (vLLM's prompt_logprobs,
     * or completions' echo with logprobs, whose prompt entries then lead choices[].logprobs) */
    int prompt_logprobs;
    int continuous_usage;   /* vLLM's stream_options.continuous_usage_stats (with include_usage): usage in every chunk */
    int include_stop;            /* include_stop_str_in_output: a matched stop string ends the text (vLLM) */
    const char *stop_strs[M3_OAI_MAX_STOP]; /* borrowed from the body */
    int n_stop_strs;
    int32_t *stop_ids;           /* stop_token_ids + the tokenizer's EOS unless ignore_eos */
    size_t n_stop_ids;
    m3_logit_bias *bias;
    int n_bias;
    m3_out_opts oo;              /* chat: reasoning / tool-call parsing */
    json_t *tools;               /* chat: borrowed from the body; NULL when none */
    char *echo_text;             /* completions with echo: the prompts' text */
    size_t echo_len;
    m3_media media;              /* chat: the prompt's images (ids holds their tokens, expanded) */
    /* structured output: response_format json_object / json_schema, vLLM's guided_json /
     * guided_regex / guided_choice / structured_outputs, forced tool calls (tool_choice
     * "required" or a named function) */
    int constraint;              /* M3_OAI_C_* */
    char *constraint_text;       /* owned: JSON_SCHEMA the schema as compact JSON, REGEX the pattern,
                                    CHOICE the choices as a compact JSON array of strings, GRAMMAR the GBNF */
    const char *constraint_param;/* the field that asked for it (for errors) */
    const char *tool_name;       /* TOOLS: the named function (borrowed), NULL: any of tools */
    int parallel_tool_calls;     /* 0: at most one tool call (parallel_tool_calls: false) */
    int32_t g_start, g_open;     /* the constraint starts after this token (-1: at once); adaptive opener */
    struct m3_engine_grammar *grammar; /* compiled for the request (a reference; srv fills it in) */
    /* vLLM's extra sampling parameters */
    int32_t *allowed;            /* allowed_token_ids (owned; n_allowed > 0: only these ids come out) */
    size_t n_allowed;
    int32_t *bad_ids, *bad_off;  /* bad_words as token sequences (owned; m3_sampling's bad_words / bad_word_off) */
    int n_bad;
    int ids_as_tokens;           /* return_tokens_as_token_ids: logprobs' tokens are "token_id:<id>" */
    int keep_special;            /* skip_special_tokens false: special tokens' text stays in the output */
    long long truncate;          /* truncate_prompt_tokens: each prompt's last this many tokens (0: whole) */
    int trunc_right;             /* truncation_side "right": its first this many instead */
    int return_ids;              /* return_token_ids: prompt_token_ids and token_ids in the answer */
    int priority;                /* vLLM's priority (--scheduling-policy priority): smaller first */
    int think_on;                /* thinking_token_budget given: the reasoning closes after think_budget tokens */
    long long think_budget;
    int32_t think_open, think_close; /* ... its tags' ids (<mm:think>, </mm:think>) */
    int think_from;              /* ... counted from this prompt index on (chat: its final turn; 0: all) */
    char role[16];               /* chat: the answer's role ("assistant"; without a generation prompt the last message's) */
    char request_id[65];         /* request_id: the response's id is cmpl- / chatcmpl-<it> ("": a random one) */
    const char *cache_salt;      /* borrowed from the body: the prefix cache is shared only within a salt */
    size_t cache_salt_len;
} m3_oai_params;

/* TOOLS: a forced call; TOOLS_AUTO: tool_choice auto with strict tools (text, then valid calls or none) */
enum { M3_OAI_C_NONE = 0, M3_OAI_C_JSON_OBJECT, M3_OAI_C_JSON_SCHEMA, M3_OAI_C_TOOLS, M3_OAI_C_REGEX, M3_OAI_C_CHOICE, M3_OAI_C_TOOLS_AUTO,
       M3_OAI_C_GRAMMAR };

/* Fills e; returns e->status. The message is printf-formatted, then made valid UTF-8. */
int m3_oai_errorf(m3_oai_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int m3_oai_verrorf(m3_oai_error *e, int status, const char *type, const char *param, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));

/* A request body: JSON text -> *body (a JSON object, the caller's reference). 0, or the
 * status of the error in e (400 bad JSON / not an object, 500 out of memory). */
int m3_oai_parse_body(const char *text, size_t len, json_t **body, m3_oai_error *e);

/* POST /v1/completions (chat 0) and /v1/chat/completions (chat 1): validates body and fills
 * *g (zeroed first; free it with m3_oai_params_free whatever the result). 0, or the status
 * of the error in e. */
int m3_oai_parse_generate(const m3_oai_ctx *c, json_t *body, int chat, m3_oai_params *g, m3_oai_error *e);
void m3_oai_params_free(m3_oai_params *g);

/* "messages" (+ "tools", "add_generation_prompt", "continue_final_message",
 * "chat_template_kwargs") rendered by the chat template and encoded: *ids (malloc'd) / *n,
 * image placeholders expanded to the images' tokens (media.h). media: receives the images (the
 * caller frees it, whatever the result); NULL: they are decoded (to count their tokens) and
 * dropped. cont (may be NULL): -1, or with continue_final_message 1 when the prompt ends inside
 * the reasoning (an open <mm:think>), 0 when not (the output is then the message's content).
 * agp (may be NULL): 1 when the prompt ends with the generation prompt (the answer is then the
 * assistant's), else 0 (it answers as the last message's role). 0, or the status of the error in e. */
int m3_oai_chat_prompt(const m3_oai_ctx *c, json_t *body, int32_t **ids, size_t *n, m3_media *media, int *cont, int *agp,
                       m3_oai_error *e);

/* A JSON array of token ids in [0, vocab) -> *ids (malloc'd) / *n. 0, or the error status. */
int m3_oai_ids(json_t *a, int vocab, const char *param, int32_t **ids, size_t *n, m3_oai_error *e);

#endif
