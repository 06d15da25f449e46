/* Anthropic Messages requests (POST /v1/messages, /v1/messages/count_tokens) for m3 serve,
 * without HTTP: a request body in, the OpenAI chat request that means the same out, which
 * then goes through the chat pipeline as /v1/chat/completions does (openai.h: template,
 * tokenizer, images, sampling, stop strings, forced tool calls). One pipeline, two spellings.
 *
 * The translation, field by field:
 *   model, max_tokens (required), stream, temperature, top_p, top_k: as they are;
 *   stop_sequences -> stop; metadata: accepted (checked to be an object);
 *   system (a string or text blocks) -> a first "system" message;
 *   messages: user content blocks text, image (source base64 -> a data: URL, source url ->
 *     that URL: the media rules of media.h apply), tool_result (tool_use_id, content as a
 *     string or text / image blocks, is_error) -> a "tool" message each, in place; assistant
 *     blocks text, thinking (-> reasoning_content, where the template writes reasoning),
 *     redacted_thinking (dropped: it is another model's encrypted reasoning, nothing this
 *     template can write), tool_use (id, name, input object) -> tool_calls. cache_control and
 *     citations on blocks are accepted and have no effect (the prefix cache is automatic);
 *   consecutive user or assistant messages are one turn, as Anthropic combines them: their
 *     translations merged (content parts in order, an assistant's reasoning and tool calls
 *     appended);
 *   a final assistant turn (a prefill) -> continue_final_message, add_generation_prompt
 *     false: the answer continues its text (its last message with content, its last text
 *     block), in a text block. Refused as Anthropic refuses them: text ending in whitespace;
 *     and a tool_use block in the turn or no text to continue. Empty messages in it ("" or no
 *     blocks) add nothing; with nothing else it is no prefill: the answer is a new turn;
 *   tools {name, description, input_schema, strict} -> function tools (type absent or "custom";
 *     the server tools Anthropic runs itself, web search & co, are refused); strict: true makes
 *     every call valid under tool_choice auto too (openai.h: M3_OAI_C_TOOLS_AUTO);
 *   output_config {format: {type: json_schema, schema}, effort} (or the beta's top-level
 *     output_format) -> response_format json_schema; effort is checked, without effect;
 *   tool_choice {type: auto | any | tool (name) | none, disable_parallel_tool_use} -> "auto",
 *     "required", a named function, "none"; parallel_tool_calls false;
 *   thinking {type: enabled, budget_tokens} | {type: disabled} | {type: adaptive} -> the
 *     template's thinking_mode (absent: the template's default, as on the OpenAI side);
 *     budget_tokens (an integer >= 1) -> thinking_token_budget: the reasoning closes after
 *     that many tokens (max_tokens still bounds the whole output, reasoning included).
 * Other fields are ignored, as the OpenAI endpoint ignores fields it does not know; content
 * block types the template cannot write (document, search_result, server tool blocks, ...)
 * are refused with a 400 naming them.
 *
 * Errors are m3_oai_error (status, type, param, message): the server renders them in
 * Anthropic's shape for these endpoints. Ownership: the result may borrow strings from body
 * (references taken), so it can outlive body. Allocations count as the server module's for
 * fault injection (src/base/fault.h). Thread-safe. */
#ifndef M3_SERVER_ANTHROPIC_H
#define M3_SERVER_ANTHROPIC_H

#include <stddef.h>

#include <jansson.h>

#include "openai.h"

/* body: an Anthropic request (a JSON object). count_only: /v1/messages/count_tokens (no
 * max_tokens needed, no stream). *out: a new OpenAI chat request body. 0, or the status of
 * the error in e. */
int m3_anth_to_oai(json_t *body, int count_only, json_t **out, m3_oai_error *e);

/* Anthropic's error body {"type":"error","error":{"type","message"}} for an HTTP status
 * (the error type follows from it: 400 invalid_request_error, 401 authentication_error, 404
 * not_found_error, 413 request_too_large, 429 rate_limit_error, 503 / 529
 * overloaded_error, 5xx api_error, ...), escaped into buf without allocating. Returns its
 * length (truncated to cap - 1). */
size_t m3_anth_error_json(char *buf, size_t cap, int status, const char *msg);

#endif
