/* src/jinja: the Jinja interpreter module (lexer, parser, runtime with filters, tests and
 * methods as tables). It includes base/ only.
 *
 * m3_jinja: a Jinja2 interpreter for chat templates.
 *
 * Covers what real Hugging Face chat templates use: {{ }}, {% %}, {# #}, whitespace
 * control, trim_blocks + lstrip_blocks (both on, as transformers sets them), if / for
 * (loop, else, unpacking, filters) / set (and block set) / namespace / macro / call /
 * filter blocks / break / continue / raw / generation, the usual filters, tests, operators,
 * string / dict methods, slicing, raise_exception and strftime_now. Values come from a
 * JSON context (jansson). Semantics follow Python jinja2 as transformers configures it
 * (ImmutableSandboxedEnvironment, tojson = json.dumps(ensure_ascii=False)); where the JS
 * port @huggingface/jinja differs (True/None printing, dict/list printing, float
 * formatting) we follow Python. One lenient departure, shared with the JS port: an
 * attribute or item of an undefined value is undefined (jinja2 raises there).
 *
 * Errors (syntax, unknown filter / test, raise_exception, type errors, limits) are one
 * line: "NAME: line L, column C: message".
 *
 * Ownership: m3_jinja_parse returns a template the caller frees with m3_jinja_free;
 * m3_jinja_render returns a malloc'd NUL-terminated string the caller frees. The context
 * is only read. Thread-safety: a parsed template is immutable; several threads may
 * render it at once. No global state.
 */
#ifndef M3_JINJA_H
#define M3_JINJA_H

#include <stddef.h>

#include <jansson.h>

#include "base/err.h"

typedef struct m3_jinja m3_jinja;

/* Bounds that keep hostile templates finite. Zero fields take the defaults. */
typedef struct m3_jinja_limits {
    size_t max_output;  /* bytes of rendered text (default 64 MiB) */
    size_t max_memory;  /* bytes of values alive during one render (default 1 GiB) */
    size_t max_steps;   /* evaluation steps: statements, expressions, loop iterations (default 50M) */
    int max_depth;      /* nesting of macro calls and of expressions (default 200) */
} m3_jinja_limits;

/* Parses a template. name (e.g. the file name) prefixes error messages. NULL on error. */
m3_jinja *m3_jinja_parse(const char *src, size_t len, const char *name, m3_err *err);

/* Renders with the variables of ctx (a JSON object, may be NULL). Provides the globals
 * range, namespace, dict, raise_exception and strftime_now. limits may be NULL.
 * Returns a malloc'd string (length in *out_len if non-NULL), NULL on error. */
char *m3_jinja_render(const m3_jinja *t, const json_t *ctx, const m3_jinja_limits *limits,
                      size_t *out_len, m3_err *err);

void m3_jinja_free(m3_jinja *t);

#endif
