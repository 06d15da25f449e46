/* m3 serve: an OpenAI-compatible HTTP server over m3_engine (libevent evhttp).
 *
 * Threads: the HTTP side (evhttp, JSON, tokenizer, chat template, output parsers) runs on
 * the thread that calls m3_server_run; one engine thread runs m3_engine_step. Engine
 * callbacks only push (request, token, finish) records onto a mutex-protected queue and
 * wake the HTTP thread with event_active; everything else happens on the HTTP thread.
 * A client whose connection closes before its request finished has it cancelled
 * (m3_engine_cancel); its state is freed when the engine reports the end.
 *
 * Endpoints: GET /health, GET /v1/models, POST /tokenize, POST /detokenize,
 * POST /v1/completions, POST /v1/chat/completions (stream and non-stream). */
#ifndef M3_SERVER_H
#define M3_SERVER_H

#include "../engine/engine.h"
#include "../text/chat.h"
#include "../text/tokenizer.h"

typedef struct m3_server_opts {
    const char *host;      /* default "127.0.0.1" */
    int port;              /* default 8000; 0: any free port (printed) */
    const char *api_key;   /* NULL: no auth */
    const char *model_name;/* id reported by /v1/models and accepted as "model" */
    size_t max_body;       /* bytes; 0: 32 MiB */
} m3_server_opts;

/* Serves until SIGINT / SIGTERM. The engine, tokenizer and chat template are borrowed.
 * chat may be NULL (chat completions then answer 400). Returns 0, or -1 + err when the
 * server could not start. */
int m3_server_run(m3_engine *e, const m3_tok *tok, const m3_chat *chat, int vocab, const m3_server_opts *o,
                  m3_err *err);

#endif
