/* src/chat: chat templates applied to messages (chat.h) and the model-output parsers
 * (parsers.h). It sits on jinja/ and base/.
 *
 * m3_chat: a checkpoint's chat template, ready to turn OpenAI-style messages into a prompt.
 *
 * Where the template comes from (m3_chat_load, in this order):
 *   1. DIR/chat_template.jinja;
 *   2. DIR/tokenizer_config.json "chat_template": a string, or a list of {name, template}
 *      ("default" is used, "tool_use" instead when a request has tools);
 *   3. for a MiniMax-M3 checkpoint (config.json model_type, or text_config.model_type,
 *      starting with "minimax_m3") without one: the built-in MiniMax-M3 template (spec
 *      section 5; chat_template_kwargs.thinking_mode = enabled | disabled | adaptive).
 * Special tokens of tokenizer_config.json (bos_token, eos_token, unk_token, pad_token, as
 * strings or {content: ...}) are template variables, as transformers passes them.
 *
 * Rendering context (as transformers' apply_chat_template): messages, tools (null when
 * absent), add_generation_prompt, the special tokens, then every key of kwargs. A kwarg may
 * add a variable but never replace one of the others (render fails naming it, as vLLM refuses
 * them): a request's validated messages cannot be swapped through chat_template_kwargs.
 *
 * Ownership: m3_chat_* constructors return an object freed with m3_chat_free; render
 * returns a malloc'd string. Thread-safety: a loaded m3_chat is immutable; concurrent
 * renders are safe.
 */
#ifndef M3_CHAT_H
#define M3_CHAT_H

#include <stddef.h>

#include <jansson.h>

#include "base/err.h"
#include "jinja/jinja.h"

typedef struct m3_chat m3_chat;

/* Loads the template of checkpoint directory dir (see above). NULL with a message naming
 * the file when there is none or it does not parse. */
m3_chat *m3_chat_load(const char *dir, m3_err *err);
/* The same with the template given instead (vLLM's --chat-template): the path of a file, or
 * the template itself when no file has that name; the special tokens still come from dir's
 * tokenizer_config.json. override NULL: m3_chat_load. */
m3_chat *m3_chat_load_with(const char *dir, const char *override, m3_err *err);
/* The special tokens (bos_token, eos_token, ...) of dir's tokenizer_config.json instead of c's
 * (none when there is no such file): a template from one directory, a tokenizer from another
 * (vLLM's --tokenizer). -1 + err when the file does not parse. */
int m3_chat_tokens_from(m3_chat *c, const char *dir, m3_err *err);

/* A template from text (name labels errors). No special tokens are set. */
m3_chat *m3_chat_from_source(const char *src, size_t len, const char *name, m3_err *err);

/* A template from text with base's special tokens (base NULL: none), e.g. a request's own
 * chat_template (vLLM's --trust-request-chat-template). */
m3_chat *m3_chat_derive(const m3_chat *base, const char *src, size_t len, const char *name, m3_err *err);

/* The built-in MiniMax-M3 template. */
m3_chat *m3_chat_builtin_minimax(m3_err *err);
const char *m3_chat_builtin_minimax_source(void);

/* 1 when the rendering context defines name itself (messages, tools, add_generation_prompt, a
 * special token of the tokenizer's config): chat_template_kwargs cannot set it. */
int m3_chat_defines(const m3_chat *c, const char *name);
/* Renders. messages: JSON array; tools: JSON array or NULL; kwargs: JSON object or NULL
 * (chat_template_kwargs, e.g. {"thinking_mode": "disabled"}). limits may be NULL. */
char *m3_chat_render(const m3_chat *c, const json_t *messages, const json_t *tools, int add_generation_prompt,
                     const json_t *kwargs, const m3_jinja_limits *limits, size_t *out_len, m3_err *err);

/* Where the template came from: a path, "tokenizer_config.json", or "builtin:minimax-m3"
 * (the path naming the template file in the other cases). */
const char *m3_chat_origin(const m3_chat *c);

/* Text of the (default) template. */
const char *m3_chat_source(const m3_chat *c);

void m3_chat_free(m3_chat *c);

#endif
