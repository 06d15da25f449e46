/* OpenAI Responses requests (POST /v1/responses) for m3 serve, without HTTP: a request body
 * in, the chat request that means the same out, which then goes through the chat pipeline as
 * /v1/chat/completions does (openai.h). One pipeline, three spellings (anthropic.h is the
 * second). The output's shapes are responses.c's (srv.h).
 *
 * The translation, field by field:
 *   model, stream, temperature, top_p, parallel_tool_calls: as they are; max_output_tokens ->
 *     max_tokens; top_logprobs with include "message.output_text.logprobs" -> logprobs;
 *     vLLM's extra sampling fields (top_k, min_p, repetition_penalty, presence_penalty,
 *     frequency_penalty, seed, stop, ignore_eos, min_tokens, logit_bias) as on the chat
 *     endpoint;
 *   instructions -> a first "system" message (not carried to the next response of a chain, as
 *     OpenAI does it);
 *   input: a string (one user message) or items, in order:
 *     message {role user | system | developer | assistant, content: a string or parts
 *       input_text / output_text / refusal -> text, input_image {image_url} -> image_url
 *       (the media rules of media.h apply)};
 *     reasoning {content reasoning_text | summary summary_text} -> the next assistant
 *       message's reasoning_content; function_call {call_id, name, arguments} -> that
 *       message's tool_calls (an assistant's items in a row are one message: reasoning, text,
 *       calls); function_call_output {call_id, output: a string or input_text / input_image
 *       parts} -> a "tool" message;
 *   previous_response_id: the stored conversation of that response (resp_store.h) goes first;
 * The chat endpoint's spellings (messages, max_tokens, max_completion_tokens, response_format,
 * logprobs) and n other than 1 are refused naming this API's field, never silently ignored.
 *   tools [{type: function, name, description, parameters, strict}] -> function tools;
 *   tool_choice "auto" | "none" | "required" | {type: function, name} | {type: allowed_tools,
 *     mode, tools} (the tools list cut to those) -> the chat request's;
 *   text.format {type: text | json_object | json_schema (name, schema, strict)} ->
 *     response_format; text.verbosity checked, without effect;
 *   reasoning.effort: "none" -> thinking disabled, any other effort -> enabled (absent: the
 *     template's default); reasoning.summary checked: the reasoning is given whole
 *     (reasoning_text), never summarized;
 *   truncation "auto": a conversation over the context (prompt + max_output_tokens) drops its
 *     earliest messages, as few as fit: the leading system / developer messages (the
 *     instructions) and the last message kept, never a tool result left without its call
 *     (prep.c); "disabled" (the default): a 400 with code context_length_exceeded;
 *   store, metadata (<= 16 string pairs), user, service_tier, prompt_cache_key,
 *     safety_identifier: checked, kept for the response object.
 * What m3 cannot do is refused with a 400 naming it: background responses, conversations,
 * stored prompts, item references, tools other than functions (web search, file search,
 * code interpreter, MCP, ...), input files, other item types, include entries other than
 * logprobs and reasoning.encrypted_content (accepted: m3's reasoning is returned in the
 * clear). Other fields are ignored, as the chat endpoint ignores fields it does not know.
 *
 * Ownership: the results may borrow strings from body (references taken), so they can outlive
 * body. Allocations count as the server module's for fault injection (src/base/fault.h).
 * Thread-safe. */
#ifndef M3_SERVER_RESPONSES_H
#define M3_SERVER_RESPONSES_H

#include <stddef.h>

#include <jansson.h>

#include "openai.h"

#define M3_RESP_MAX_METADATA 16 /* metadata pairs (OpenAI's limit: keys <= 64 bytes, values <= 512) */

/* The parts of a Responses request the server keeps besides the chat request. */
typedef struct m3_resp_req {
    json_t *echo;     /* the response object's request fields: instructions, tools, tool_choice,
                       * text, reasoning, temperature, top_p, max_output_tokens, metadata, ... */
    json_t *turn;     /* this request's input as chat messages (instructions left out): what a
                       * stored response adds to its conversation */
    json_t *items;    /* its input as the API lists it (GET /v1/responses/{id}/input_items): the
                       * items as given, a string input or string content spelled as parts,
                       * messages typed; ids are the server's to add */
    const char *previous_id; /* previous_response_id (borrowed from the body), NULL: none */
    int store;        /* the response is to be stored (store absent: true, as OpenAI's default) */
    int logprobs;     /* include has "message.output_text.logprobs" */
    int truncate;     /* truncation "auto": a conversation over the context loses its first messages */
} m3_resp_req;

/* Just previous_response_id: the caller looks its conversation up before translating.
 * 0 (id NULL: none), or the status of the error in e (not a string). */
int m3_resp_previous_id(json_t *body, const char **id, m3_oai_error *e);

/* body: a Responses request (a JSON object). history: previous_response_id's conversation
 * (a JSON array of chat messages; NULL: none), read only. *out: a new chat request body;
 * r: what the response needs (free with m3_resp_req_free). 0, or the status of the error in
 * e. */
int m3_resp_to_oai(json_t *body, json_t *history, json_t **out, m3_resp_req *r, m3_oai_error *e);
void m3_resp_req_free(m3_resp_req *r);

/* previous_response_id's conversation (a JSON array of chat messages, read only) put into out,
 * a chat request m3_resp_to_oai made of body without it: after the instructions, before the
 * input. 0, or the status of the error in e (too many messages, out of memory). */
int m3_resp_add_history(json_t *out, json_t *body, json_t *history, m3_oai_error *e);

/* An error the chat parser found in a translated request, named as this API names it:
 * max_tokens -> max_output_tokens, messages[...] -> input (the message says which chat
 * message). */
void m3_resp_error_names(m3_oai_error *e);

#endif
