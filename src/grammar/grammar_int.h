/* Internals of src/grammar: the NFA builder the schema compiler writes into (fsa.c), the
 * finished automaton (m3_grammar), and the persistent stacks the matcher and the mask cache
 * walk with (match.c). */
#ifndef M3_GRAMMAR_INT_H
#define M3_GRAMMAR_INT_H

#include <stdint.h>

#include "grammar/grammar.h"

/* ---- NFA builder (Thompson fragments; calls to rules are edges too) ---- */
enum { E_BYTE, E_EPS, E_CALL };
typedef struct {
    uint8_t kind, lo, hi;
    int32_t to, rule, next;
} g_edge;

typedef struct {
    int s, e; /* start, end state; s < 0: the empty language (nothing matches) */
} g_frag;

typedef struct {
    g_edge *ed;
    int ned, caped;
    int32_t *first; /* per state: its first edge, -1 */
    int nst, capst;
    int32_t *rstart, *rend; /* per rule */
    int nrules, caprules;
    int max_states;
    int failed; /* out of memory or too large; the message is in err */
    m3_err *err;
    const char *what; /* what errors name ("regex", ...); NULL: "json schema" */
} g_nfa;

static inline const char *nfa_what(const g_nfa *n) { return n->what ? n->what : "json schema"; }

int nfa_state(g_nfa *n);
/* an allocation failure outside the NFA's own arrays, reported as n's (failed, err with oom); -1 */
int nfa_oom(g_nfa *n);
void nfa_edge(g_nfa *n, int from, int kind, int lo, int hi, int to, int rule);
void nfa_free(g_nfa *n);
int nfa_rule_new(g_nfa *n);
void nfa_rule_set(g_nfa *n, int r, g_frag f);

g_frag f_none(void);
g_frag f_eps(g_nfa *n);
g_frag f_range(g_nfa *n, int lo, int hi);
g_frag f_lit(g_nfa *n, const char *s, size_t len);
g_frag f_seq(g_nfa *n, g_frag a, g_frag b);
g_frag f_alt(g_nfa *n, g_frag a, g_frag b);
g_frag f_opt(g_nfa *n, g_frag a);
g_frag f_star(g_nfa *n, g_frag a);
g_frag f_call(g_nfa *n, int rule);
/* f{lo,hi} (hi < 0: unbounded; f{0,0}: empty), f being the first copy and more(ctx) making each
 * further one (the parsers read their atom again: fragments cannot be copied). n's failures and
 * more's (f_none()) give f_none(). Shared by regex.c and ebnf.c. */
g_frag f_repeat(g_nfa *n, g_frag f, long lo, long hi, g_frag (*more)(void *ctx), void *ctx);
/* a decimal count at *p (< end), capped at 1000000 and advanced past; -1 when no digit */
static inline long grammar_count(const char **p, const char *end) {
    long v = -1;
    while (*p < end && **p >= '0' && **p <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (*(*p)++ - '0');
        if (v > 1000000) v = 1000000;
    }
    return v;
}
/* 1 when no path leads from f's start to its end (calls count as passable), else 0; 1 also when
 * n failed (out of memory here too: n's failure) */
int f_is_empty(g_nfa *n, g_frag f);
/* Languages without calls: a ∩ b (mode 0) or a \ b (mode 1), as a new fragment. */
g_frag f_product(g_nfa *n, g_frag a, g_frag b, int mode);

static inline int hexv(int c) { /* a hex digit's value, -1 */
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* ---- regex.c: ECMAScript regular expressions (grammar.h: m3_grammar_from_regex) ----
 * The texts pattern re[0..len) matches, as a call-free fragment of n: RX_TEXT their UTF-8
 * bytes, RX_JSON the inside of a JSON string holding them, spelled as JSON.stringify spells it.
 * search 0: the whole text matches (guided_regex); 1: JSON Schema's "pattern", a text that
 * contains a match (^ and $ anchor it). f_none() with a message in emsg (emsg_cap bytes, naming
 * the problem and its byte offset) when the pattern is refused; NFA failures (too large, out of
 * memory) are n's. */
enum { RX_TEXT = 0, RX_JSON = 1 };
g_frag regex_fragment(g_nfa *n, const char *re, size_t len, int spell, int search, char *emsg, size_t emsg_cap);
/* One UTF-8 character of the code-point ranges lohi[2i]..lohi[2i+1] (i < nranges; negate: of
 * every code point outside them), surrogates left out, as a fragment of n (ebnf.c's classes). */
g_frag cp_ranges_fragment(g_nfa *n, const int32_t *lohi, int nranges, int negate);
/* Paths s -> e spelling the code points lo..hi (surrogates left out) in UTF-8; the paths made with
 * one tail[4] (all -1 at first) share their last continuation bytes (schema.c's characters). */
void utf8_range_paths(g_nfa *n, int s, int e, uint32_t lo, uint32_t hi, int tail[4]);

/* ---- format.c: JSON Schema "format" values for strings, as regex.c patterns matched whole ----
 * NULL for a format not served; the names served, for messages. */
const char *schema_format_regex(const char *name);
const char *schema_format_names(void);

/* ---- schema.c, for the builder (build.c) ---- */
#define G_MAX_NFA_STATES (1 << 21)
#define G_MAX_DFA_STATES (1 << 20)
#define G_MAX_RULES 4096 /* rules of one grammar (grammar_build's checks are quadratic in them) */
typedef struct json_t json_t;
/* options checked (defaults when opts is NULL) into *o; 0 or -1 + err */
int grammar_opts_check(const m3_grammar_opts *opts, m3_grammar_opts *o, m3_err *err);
/* the value `value` of the JSON Schema document `doc` ($refs resolved in doc) as a fragment of
 * n, raw strings per raw (NULL: JSON); json_object_mode: any JSON object (doc, value unused).
 * f_none() + err on failure. */
g_frag schema_fragment(g_nfa *n, json_t *doc, json_t *value, const m3_grammar_opts *o, const m3_grammar_raw *raw,
                       int json_object_mode, m3_err *err);
/* the value at a URI-fragment JSON pointer ("#/properties/a"; NULL or "": doc), NULL if none */
json_t *schema_pointer(json_t *doc, const char *ptr);
/* len bytes of JSON Schema text parsed (any JSON value); NULL with "json schema: ..." in err (a
 * failed allocation: "out of memory", oom set) */
json_t *schema_parse(const char *text, size_t len, m3_err *err);

/* ---- the finished automaton ---- */
enum { G_FINAL = 1, G_BYTES = 2, G_CALLS = 4 };
#define G_INF (INT32_MAX / 4)

struct m3_grammar {
    int n, ncls;
    uint8_t cls[256];
    int32_t *trans; /* n * ncls, -1 dead */
    uint8_t *flags;
    int32_t *call_off, *call_rule, *call_ret; /* calls of state q: [call_off[q], call_off[q+1]) */
    int nrules;
    int32_t *rule_start, *rule_of;
    uint8_t *rule_called;
    int32_t *dist; /* fewest bytes from a state to its rule's end */
    int max_depth;
};

/* rules' NFAs -> DFAs (pruned of states that cannot reach an end), checks (left recursion,
 * empty language); frees nothing of n. root: the document's rule. */
m3_grammar *grammar_build(g_nfa *n, int root, int max_depth, int max_states, m3_err *err);

/* ---- persistent stacks: a node is a frame (state q) over the frame below ---- */
#define G_BOTTOM (-1) /* below the document's rule: popping to it ends the output */
#define G_BASE (-2)   /* below the frame a cache walk starts from: unknown */

typedef struct {
    int32_t q, below, depth, slot;
} g_node;

typedef struct {
    const m3_grammar *g;
    g_node *nd;
    int32_t nn, capn;
    int32_t *tab; /* open addressing on (q, below) -> node, -1 empty */
    uint32_t tabmask;
    uint32_t *vis;   /* expansion stamps per node */
    int32_t *vis_h;  /* the lowest height an expansion reached a node with */
    uint32_t stamp;
    int oom;
} g_arena;

typedef struct {
    int32_t node, h;
} g_cfg;

typedef struct {
    g_cfg *v;
    int n, cap;
} g_cfgvec;

enum { F_CAN_END = 1, F_POPPED = 2 };

int ar_init(g_arena *a, const m3_grammar *g);
void ar_free(g_arena *a);
int32_t ar_cons(g_arena *a, int32_t q, int32_t below);
void ar_truncate(g_arena *a, int32_t n);
int cv_push(g_cfgvec *v, int32_t node, int32_t h);
/* Expands the raw configurations raw[0..nraw) (states just reached) into out: consuming ones
 * (a state with byte edges), calls pushed (up to max_depth frames), ends popped; *flags gets
 * F_CAN_END (popped to G_BOTTOM) and F_POPPED (popped to G_BASE). */
int ar_expand(g_arena *a, const g_cfg *raw, int nraw, g_cfgvec *out, int *flags);
/* Consumes one byte from the consuming configurations in[0..nin) into raw configurations. */
int ar_consume(g_arena *a, const g_cfg *in, int nin, uint8_t byte, g_cfgvec *raw);

#endif
