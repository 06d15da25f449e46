/* m3_grammar: grammar-constrained decoding (structured outputs, issue 26).
 *
 * Three objects, from the request's schema to the sampler's mask:
 *
 *   m3_grammar            a JSON Schema (or "any JSON object") compiled to a pushdown automaton
 *                         over bytes: a set of rules, each a DFA whose edges consume a byte or
 *                         call another rule (recursion: $ref cycles, nested values of plain JSON).
 *                         Independent of any tokenizer.
 *   m3_grammar_vocab      the token byte strings of one tokenizer (id -> bytes; byte-level BPE, so
 *                         a token may end inside a UTF-8 character) in a trie, and the end ids
 *                         (EOS). Built once per tokenizer.
 *   m3_grammar_compiled   a grammar for a vocabulary: for every DFA state, the tokens whose
 *                         validity does not depend on the stack below are decided once (accepted
 *                         set as a bitmask or a list, rejected implicitly); only the others (a
 *                         token that finishes the current rule and goes on in its caller) are kept
 *                         in a short list checked at run time against the real stack. Shared by
 *                         every request with the same schema and tokenizer.
 *   m3_matcher            one generation's position: a set of stacks (persistent, hash-consed),
 *                         the history for rollback, the mask of the next step.
 *
 * JSON Schema subset (what vLLM / xgrammar accept): type (one or a list), properties, required,
 * additionalProperties (false / true / schema; absent means false when "properties" is given,
 * as in xgrammar's strict mode and OpenAI's structured outputs, else true), enum, const, items,
 * prefixItems, minItems / maxItems, anyOf, oneOf (as anyOf: an output may match several),
 * allOf with one member, minLength / maxLength (code points; escapes count one), minimum /
 * maximum / exclusiveMinimum / exclusiveMaximum (integer and number, decimal-exact), pattern (an
 * ECMAScript regular expression, regex.c's syntax, that the string's value contains a match of,
 * as JSON Schema means it: unanchored unless ^ / $ say so), format for strings (date-time, date,
 * time, duration, email, hostname, ipv4, ipv6, uuid: format.c's subsets of the standards; any other
 * format is refused, on any type), $ref to
 * "#", "#/$defs/..." , "#/definitions/..." or any JSON pointer into the document, recursive refs
 * included, and boolean schemas. Annotations are ignored (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly). Anything else (multipleOf,
 * minProperties, patternProperties, if/then/else, not, ...) is refused with an error naming the
 * keyword and its JSON pointer, e.g.
 *   json schema: unsupported keyword "multipleOf" at /properties/n
 *
 * Output form (what the grammar lets a model write):
 *  - Properties come in the order of "properties" (optional ones may be left out); additional
 *    properties (when allowed) after them, their keys written without escapes and different
 *    from the declared names.
 *  - Whitespace between JSON tokens: at most opts.max_ws bytes of [ \t\n] (default 2), none
 *    before the first or after the last byte of the document: every output comes to an end.
 *  - Numbers: at most 18 integer digits, 18 fraction digits and 2 exponent digits (an output
 *    always ends and always parses as int64 / double); with bounds no exponent.
 *  - Strings: valid UTF-8 (a token may end inside a character; the next must complete it), no
 *    raw control characters, escapes \" \\ \/ \b \f \n \r \t and \uXXXX (surrogates in pairs).
 *    A string with a "pattern" is written as JSON.stringify writes its value (escapes only for
 *    " \\ and control characters, \b \t \n \f \r or \u00xx).
 *  - enum / const values: their compact JSON spelling (jansson's json_dumps, JSON_COMPACT).
 *  - Nesting through calls (recursive refs, plain JSON values) stops at opts.max_depth.
 *
 * Masks are bitmasks of n_vocab bits (word t >> 5, bit t & 31), as the sampler takes them.
 * The end ids (EOS) are allowed exactly when the output is complete (m3_matcher_can_end).
 *
 * Threads: m3_grammar, m3_grammar_vocab and m3_grammar_compiled are immutable once built and
 * may be used from any number of threads at once; a compiled form keeps pointers to its grammar
 * and vocabulary (both must outlive it). A matcher belongs to one thread at a time. */
#ifndef M3_GRAMMAR_H
#define M3_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/pool.h"

typedef struct m3_grammar m3_grammar;
typedef struct m3_grammar_vocab m3_grammar_vocab;
typedef struct m3_grammar_compiled m3_grammar_compiled;
typedef struct m3_matcher m3_matcher;

typedef struct m3_grammar_opts {
    int max_ws;    /* whitespace bytes allowed between two JSON tokens, 0..16 (default 2) */
    int max_depth; /* stack depth of rule calls (nesting of recursive values), 1..1024 (default 32) */
    int max_states; /* automaton states at most, 1..1048576 (default 1048576): a bigger grammar fails
                       while it is being built, "too large (more than N automaton states)", with
                       m3_err.over_limit set */
} m3_grammar_opts;

void m3_grammar_opts_default(m3_grammar_opts *o);

/* A JSON Schema (len bytes of JSON text) -> grammar; opts may be NULL (defaults). NULL with a
 * message on a parse error, an unsupported keyword (named with its JSON pointer), a schema that
 * no document satisfies, or one too large (over 1M automaton states). */
m3_grammar *m3_grammar_from_schema(const char *json_schema, size_t len, const m3_grammar_opts *opts, m3_err *err);
/* json_object mode: any JSON object (values of any type, nesting up to opts->max_depth). */
m3_grammar *m3_grammar_json(const m3_grammar_opts *opts, m3_err *err);
/* vLLM's guided_regex: the UTF-8 texts an ECMAScript regular expression (JavaScript's
 * `new RegExp(re, "u")`, no other flag) matches whole; the syntax served is regex.c's. NULL with a
 * message naming the construct and its byte offset when refused (backreferences, lookaround,
 * \b, \p{...}, ...), or when nothing matches or the automaton is too large. */
m3_grammar *m3_grammar_from_regex(const char *re, size_t len, const m3_grammar_opts *opts, m3_err *err);
/* vLLM's guided_grammar / llama.cpp's grammar: a GBNF grammar (ebnf.c: the syntax), its rule
 * "root" the whole output. NULL with a message naming the line and column (or the rule: used but
 * not defined, defined twice, left-recursive), or when nothing matches or it is too large. */
m3_grammar *m3_grammar_from_gbnf(const char *text, size_t len, const m3_grammar_opts *opts, m3_err *err);
/* vLLM's guided_choice: exactly one of the n texts (n >= 1; lens[i] bytes each). */
m3_grammar *m3_grammar_from_choices(const char *const *texts, const size_t *lens, int n, const m3_grammar_opts *opts,
                                    m3_err *err);
void m3_grammar_free(m3_grammar *g);
int m3_grammar_n_states(const m3_grammar *g); /* DFA states over all rules */
int m3_grammar_n_rules(const m3_grammar *g);

/* ---- structured formats beyond one JSON document (tool calls): a small builder ----
 * Nodes are fragments of one automaton, made bottom-up: a literal, a value of a JSON Schema,
 * sequences, choices, optional parts and bounded repetitions of other nodes. Each node is used
 * at most once (a repetition turns its node into a rule it calls). Functions return the new
 * node (>= 0), or -1 when something failed: the builder keeps the first error (err given to
 * m3_grammar_builder_new) and fails every call after it; m3_gb_finish reports it.
 *
 * Raw strings (m3_grammar_raw): a schema value whose top-level strings (not those inside an
 * object or an array) are written as their characters alone, no quotes and no escapes (valid
 * UTF-8, no control character but tab and newline; length bounds in characters), never
 * containing `forbid`, and, unless edge_newlines, neither starting nor ending with a newline.
 * Enum / const strings at the top level are written raw too. What a tool-call parser that
 * takes argument values as raw text reads back as JSON strings. A parser that types a raw value
 * by its text when the schema admits other types too (src/chat/parsers.h: null, a boolean, a
 * number, JSON before a string) would read some raw strings as those types: not_as names them,
 * and the raw strings (enum / const ones included) that, with surrounding space, tab, newline
 * and carriage return removed, are `null` (M3_GRAW_NULL), `true` / `false` in any letter case
 * (BOOL), an optionally signed run of digits (INT), a decimal number as strtod reads one,
 * [+-]? (D+ (.D*)? | .D+) ([eE][+-]?D+)? (NUM), or that start with `{` (OBJ) or `[` (ARR) are
 * left out: the schema's other alternatives write those values as JSON. */
typedef struct m3_grammar_builder m3_grammar_builder;
enum { M3_GRAW_NULL = 1, M3_GRAW_BOOL = 2, M3_GRAW_INT = 4, M3_GRAW_NUM = 8, M3_GRAW_OBJ = 16, M3_GRAW_ARR = 32 };
typedef struct m3_grammar_raw {
    const char *forbid; /* NUL-terminated, at most 64 bytes; NULL or "": no restriction */
    int edge_newlines;
    unsigned not_as;    /* M3_GRAW_* bits: raw strings that read as these types are left out */
} m3_grammar_raw;

m3_grammar_builder *m3_grammar_builder_new(const m3_grammar_opts *opts, m3_err *err);
void m3_grammar_builder_free(m3_grammar_builder *b);
int m3_gb_literal(m3_grammar_builder *b, const char *s, size_t n);
/* The value at `pointer` (a URI-fragment JSON pointer, "#/properties/city"; NULL or "": the whole
 * document) of the JSON Schema document schema[0..len), its $refs resolved in the document; raw:
 * strings at its top level written raw (NULL: JSON). Errors name the keyword and its path. */
int m3_gb_schema(m3_grammar_builder *b, const char *schema, size_t len, const char *pointer, const m3_grammar_raw *raw);
int m3_gb_json_object(m3_grammar_builder *b); /* any JSON object (json_object mode) */
int m3_gb_seq(m3_grammar_builder *b, const int *parts, int n);    /* n >= 1 */
int m3_gb_choice(m3_grammar_builder *b, const int *alts, int n);  /* n >= 1 */
int m3_gb_optional(m3_grammar_builder *b, int x);
/* x min..max times (max < 0: unbounded; 0 <= min, max <= 64 when bounded) */
int m3_gb_repeat(m3_grammar_builder *b, int x, int min, int max);
/* The grammar of node root (the builder stays to be freed); NULL + err on the builder's first
 * error or a grammar that matches nothing. */
m3_grammar *m3_gb_finish(m3_grammar_builder *b, int root, m3_err *err);

/* Token byte strings: bytes[i] / lens[i] for ids 0..n-1 (copied). A token of length 0 (special
 * and added tokens: pass them as empty) is never allowed by the grammar; eos_ids (n_eos of
 * them, may be 0) are allowed exactly when the output may end. n is the mask's width (the
 * model's vocabulary size, which may exceed the tokenizer's). */
m3_grammar_vocab *m3_grammar_vocab_new(int32_t n, const char *const *bytes, const uint32_t *lens,
                                       const int32_t *eos_ids, int n_eos, m3_err *err);
void m3_grammar_vocab_free(m3_grammar_vocab *v);
int32_t m3_grammar_vocab_size(const m3_grammar_vocab *v);
size_t m3_grammar_vocab_trie_nodes(const m3_grammar_vocab *v);

/* Precomputes the token masks of every state (the costly step: one walk of the vocabulary trie
 * per state; pool, may be NULL, spreads the states over its threads). */
m3_grammar_compiled *m3_grammar_compile(const m3_grammar *g, const m3_grammar_vocab *v, m3_pool *pool, m3_err *err);
void m3_grammar_compiled_free(m3_grammar_compiled *c);
int32_t m3_grammar_compiled_vocab_size(const m3_grammar_compiled *c); /* its vocabulary's (the masks' width) */
/* Cache statistics: bytes held, and the context-dependent tokens summed over states. */
size_t m3_grammar_compiled_bytes(const m3_grammar_compiled *c);
size_t m3_grammar_compiled_uncertain(const m3_grammar_compiled *c);

m3_matcher *m3_matcher_new(const m3_grammar_compiled *c, m3_err *err);
void m3_matcher_free(m3_matcher *m);
void m3_matcher_reset(m3_matcher *m); /* back to the start (history cleared) */

/* Writes the mask of the tokens that keep the output a valid prefix ((n + 31) / 32 words; the
 * end ids set when the output may end). After an end id was accepted the mask is empty.
 * Returns 0, or -1 when out of memory (the mask is then all ones: the caller should stop). */
int m3_matcher_fill_mask(m3_matcher *m, uint32_t *mask);
/* The same mask computed without the per-state cache: every token's bytes walked through the
 * current stacks (pruned by the trie). Slow; the reference for tests. */
int m3_matcher_fill_mask_slow(m3_matcher *m, uint32_t *mask);

/* Advances over a token: 0 when accepted, -1 when the token is not allowed (or out of memory;
 * the matcher is then unchanged). An end id is accepted when the output may end; it ends the
 * matcher (m3_matcher_is_ended). Each accept is one step of history. */
int m3_matcher_accept(m3_matcher *m, int32_t token);
/* The same for raw bytes (one step of history for the whole string, all or nothing). */
int m3_matcher_accept_bytes(m3_matcher *m, const void *bytes, size_t n);
/* Undoes the last n accepted steps (speculative decoding: the rejected draft tokens);
 * -1 when fewer than n are in the history. */
int m3_matcher_rollback(m3_matcher *m, int n);
int m3_matcher_history(const m3_matcher *m); /* steps that can be rolled back */

int m3_matcher_can_end(const m3_matcher *m);  /* the output is a complete document: EOS allowed */
int m3_matcher_must_end(const m3_matcher *m); /* complete and no byte may follow: only EOS */
int m3_matcher_is_ended(const m3_matcher *m); /* an end id was accepted */
/* The fewest bytes that complete the output (0 when it may end; a large number when stuck). */
int64_t m3_matcher_min_bytes_to_end(const m3_matcher *m);

#endif
