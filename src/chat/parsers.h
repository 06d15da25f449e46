/* Output parsers: turn the decoded text a MiniMax-M3 model generates into OpenAI-style
 * deltas (`reasoning_content`, `content`, `tool_calls`), incrementally (spec section 5).
 *
 * The stream is fed decoded text in deltas of any size and boundary: a delta may end in
 * the middle of a tag or of a UTF-8 character. Two stages run in order:
 *
 * Reasoning parser `minimax_m3` (tags `<mm:think>` / `</mm:think>`):
 *   - M3_THINK_ENABLED: a leading `<mm:think>` is dropped (the generation prompt may or
 *     may not have opened it); text up to `</mm:think>` is reasoning, the tag is dropped,
 *     the rest is content. Without a `</mm:think>` everything is reasoning.
 *   - M3_THINK_DISABLED: everything is content, except that a leading bare `</mm:think>`
 *     is dropped.
 *   - M3_THINK_ADAPTIVE: as ENABLED if the output starts with `<mm:think>`, else as
 *     DISABLED (a leading `</mm:think>` is dropped).
 *   "Leading" means at byte 0 of the output. After the reasoning ends, think tags are
 *   ordinary content. Whitespace after `</mm:think>` is kept in the content.
 *
 * Tool-call parser (namespaced; NS = `]<]minimax[>[`), applied to the content:
 *     NS<tool_call> ( NS<invoke name="NAME"> ( NS<ARG>value NS</ARG> )* NS</invoke> )* NS</tool_call>
 *   Whitespace between tags is allowed. A value loses one leading and one trailing "\n",
 *   then is typed by the tool's JSON schema from the request's `tools`: string stays a
 *   string; integer / number / boolean / null parsed (surrounding whitespace ignored);
 *   object / array parsed as JSON (and written as the model wrote it); type lists and
 *   anyOf / oneOf try null, boolean, integer, number, object, array, then string; an unknown
 *   tool or parameter, or a value that fits none of its types, is JSON if it parses, else
 *   a string.
 *   Calls stream as vLLM streams them. TOOL_BEGIN (index, id, name) comes as soon as the
 *   `<invoke name="NAME">` tag is complete; then TOOL_ARGS pieces of the arguments JSON as
 *   they become known: `{"ARG": ` (`, "ARG": ` for the next ones) once the `<ARG>` tag is
 *   complete; a value whose schema admits strings and nothing else streams as JSON-escaped
 *   pieces while its bytes arrive (its quotes with the key and at its end; held back is what
 *   could still be the closing tag, a newline that could be the one stripped, and an
 *   incomplete UTF-8 character); any other value (a number, a boolean, JSON, an unknown tool or
 *   parameter: its type depends on its text) is written whole at its `</ARG>`; `}` (or `{}`)
 *   at `</invoke>`. The pieces of a call concatenate to its arguments object, e.g.
 *   `{"city": "Paris", "days": 3}`, whatever the split of the input: there is no other
 *   rendering of the arguments (a non-streaming caller concatenates the pieces). Calls are
 *   numbered 0, 1, ... over the stream; the id is id_prefix + index ("call_0", ...).
 *   Duplicate arguments: each is written where it occurs, so the object may hold a key twice;
 *   JSON parsers (JSON.parse, Python's json, jansson) keep the last one: the last one wins.
 *   What does not parse is content, byte for byte, except what a begun call took. Before a
 *   call begins (an opener not followed by a well-formed invoke, text or a bad tag between
 *   invokes, a block unterminated at the end of the stream) the text from the opener (or the
 *   end of the last call) up to the failure point becomes content, scanning resumes there,
 *   and calls already complete stay calls. Once a call has begun its name is out and cannot
 *   be taken back: at a failure inside it (bad nesting, text between its tags, the stream
 *   ending inside it) the call is closed there: the value in progress ends at the failure
 *   point (typed as any value, its one leading and trailing newline dropped), `}` closes the
 *   arguments, and the text from the failure point on is content (scanned for a new
 *   opener). The failure point is the namespace token of a tag that is not the expected one,
 *   the first byte of text between tags (whitespace before it is markup), or the end of the
 *   stream (inside a value: the value runs to the end; between tags: a partial tag there is
 *   content). Invariant, checked by the tests and the fuzz target: reasoning bytes + content
 *   bytes + m3_out_markup_bytes() == input bytes, where markup is every byte of dropped think
 *   tags, of complete blocks and of begun calls up to their end or failure point; and the
 *   result (deltas concatenated per kind and call) does not depend on how the input was
 *   split into deltas.
 *
 * Partial tags are never emitted: a suffix that could still become a tag is held back and
 * flushed as text once it cannot (or at m3_out_finish). Reasoning and content deltas also
 * hold back an incomplete UTF-8 sequence at their end, so each delta is complete UTF-8
 * when the input is. Delta text is the model's bytes as they are (never altered);
 * m3_out_delta_json replaces invalid UTF-8 with U+FFFD when rendering.
 *
 * Ownership and threads: an m3_out belongs to one request and one thread at a time;
 * different m3_out objects are independent (no global state). The deltas returned by
 * m3_out_feed / m3_out_finish, and every string they point to, are owned by the m3_out
 * and valid until its next feed / finish / free. m3_out_new copies what it needs from
 * `tools` (the caller keeps ownership of it). */
#ifndef M3_TEXT_PARSERS_H
#define M3_TEXT_PARSERS_H

#include <stddef.h>

#include <jansson.h>

#include "../base/err.h"
#include "../grammar/grammar.h"

typedef enum m3_reason_mode {
    M3_THINK_ENABLED = 0,
    M3_THINK_DISABLED,
    M3_THINK_ADAPTIVE,
} m3_reason_mode;

typedef struct m3_out_opts {
    int reasoning;          /* 1: run the minimax_m3 reasoning parser; 0: think tags are content */
    m3_reason_mode thinking;
    int tools;              /* 1: run the tool-call parser; 0: tool-call tags are content */
    const char *id_prefix;  /* tool call ids are id_prefix + index; "call_" when NULL */
} m3_out_opts;

typedef enum m3_out_kind {
    M3_OUT_REASONING = 0,   /* text: a piece of reasoning_content */
    M3_OUT_CONTENT,         /* text: a piece of content */
    M3_OUT_TOOL_BEGIN,      /* a new tool call: index, id, name */
    M3_OUT_TOOL_ARGS,       /* text: a piece of the arguments JSON of call `index` */
} m3_out_kind;

typedef struct m3_out_delta {
    m3_out_kind kind;
    int index;              /* tool call index (TOOL_*), -1 for text */
    const char *text;       /* REASONING / CONTENT / TOOL_ARGS: len bytes, NUL-terminated ("" for BEGIN) */
    size_t len;
    const char *id;         /* TOOL_BEGIN: "call_<index>"; NULL otherwise */
    const char *name;       /* TOOL_BEGIN: the function name; NULL otherwise */
} m3_out_delta;

typedef struct m3_out m3_out;

/* opts NULL: reasoning parser on (ENABLED), tool parser on, "call_" ids.
 * tools: the request's `tools` array (OpenAI format: {"type":"function","function":
 * {"name","parameters"}}; bare {"name","parameters"} entries are accepted too), or NULL.
 * Returns NULL on error (tools not an array, out of memory). */
m3_out *m3_out_new(const m3_out_opts *opts, const json_t *tools, m3_err *err);
void m3_out_free(m3_out *o);

/* Feeds len bytes of decoded text; *deltas / *n receive what can be emitted now (maybe
 * nothing). Returns 0, or -1 on out of memory (the stream is then unusable). */
int m3_out_feed(m3_out *o, const char *text, size_t len, const m3_out_delta **deltas, size_t *n,
                m3_err *err);
/* End of stream: flushes everything held back (a block unterminated before its first call
 * becomes content; a call begun is closed, as above).
 * Further feeds are errors. */
int m3_out_finish(m3_out *o, const m3_out_delta **deltas, size_t *n, m3_err *err);

/* Input bytes consumed as markup so far (dropped think tags, tool-call blocks and begun calls). */
size_t m3_out_markup_bytes(const m3_out *o);
/* Tool calls begun so far (TOOL_BEGIN emitted). */
int m3_out_tool_calls(const m3_out *o);
/* Tool calls complete so far (the last piece of their arguments emitted). */
int m3_out_tool_calls_done(const m3_out *o);

/* Renders deltas as the `delta` object of an OpenAI chat.completion.chunk:
 * {"reasoning_content": "...", "content": "...", "tool_calls": [{"index": 0, "id": "call_0",
 * "type": "function", "function": {"name": "f", "arguments": "{...}"}}]}; fields absent
 * when empty, {} for no deltas. TOOL_ARGS pieces are appended to their call's entry.
 * Invalid UTF-8 becomes U+FFFD. Returns a new reference, NULL on out of memory. */
json_t *m3_out_delta_json(const m3_out_delta *d, size_t n);

/* The grammar of what the tool-call parser above reads as tool calls, for forced tool calls
 * (tool_choice "required" or a named function): the whole output is one block
 *     NS<tool_call>\n ( NS<invoke name="NAME">\n ( NS<ARG>VALUE NS</ARG>\n )* NS</invoke>\n ){1,max}
 *     NS</tool_call>
 * as the chat template writes calls, where NAME is `name` (NULL: any function of `tools`), the
 * arguments are the function's parameters.properties in their order (the required ones always,
 * the others optional; required names without a property schema take any JSON), and each VALUE
 * is constrained by its property's schema as the parser types it: raw text for a schema that
 * admits strings (never containing NS's "]<", no newline at either end, as the parser strips
 * one), JSON otherwise. max_calls: invokes at most (0: any number, >= 1). opts: the JSON
 * parts' options (NULL: defaults). NULL + err naming the tool and the problem (no such tool, a
 * name the markup cannot hold, a schema the grammar module refuses). */
m3_grammar *m3_tool_call_grammar(const json_t *tools, const char *name, int max_calls, const m3_grammar_opts *opts,
                                 m3_err *err);
/* tool_choice "auto" with strict tools (every one OpenAI function.strict / Anthropic strict): free
 * text (valid UTF-8, no control character but tab and newline, never the NS<tool_call> opener),
 * then either the end or one block as above (any function of tools, at most max_calls invokes):
 * whatever the model writes, every call it makes is a valid call. */
m3_grammar *m3_tool_call_grammar_auto(const json_t *tools, int max_calls, const m3_grammar_opts *opts, m3_err *err);

#endif
