/* Output parsers: reasoning (minimax_m3) and namespaced tool calls, incremental.
 * See parsers.h for the formats, the typing rules and the invariants.
 *
 * Data flow inside one m3_out: feed text -> reasoning stage (holds at most a tag's worth
 * of bytes) -> tool stage (holds a possible opener prefix, the raw text of a block between
 * calls, the unsettled tail of a call: a partial tag, a typed value until its end, a string
 * value's held-back bytes) -> output stage (coalesces text deltas and a call's argument
 * pieces, holds an incomplete UTF-8 tail) -> deltas. Every decision is taken only once the bytes that
 * decide it are present, so the result does not depend on how the input was split.
 *
 * Why one file of ~1,080 lines: the parser of tool calls and the grammar that forces them
 * (the last section) read and write the same markup with the same rules (argument names, the
 * typing of values by their schema); kept side by side, one cannot change without the other. */
#include "parsers.h"
#include "../base/sbuf.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/utf8.h"

#define NS "]<]minimax[>["
#define NS_LEN 13
#define OPENER NS "<tool_call>"
#define OPENER_LEN (NS_LEN + 11)
#define THINK_OPEN "<mm:think>"
#define THINK_OPEN_LEN 10
#define THINK_CLOSE "</mm:think>"
#define THINK_CLOSE_LEN 11
#define TAG_MAX 512 /* longest tag (after NS) accepted: `<invoke name="...">`, `<ARG>` */

static const char *find_bytes(const char *h, size_t hn, const char *needle, size_t nn) {
    if (nn > hn) return NULL;
    return memmem(h, hn, needle, nn);
}

/* length of the longest proper suffix of s[0..n) that is a prefix of tag */
static size_t partial_suffix(const char *s, size_t n, const char *tag, size_t tn) {
    size_t k = n < tn - 1 ? n : tn - 1;
    for (; k > 0; k--)
        if (memcmp(s + n - k, tag, k) == 0) return k;
    return 0;
}

/* ---- UTF-8 */

/* length of the valid UTF-8 sequence at s (1..4), 0 if invalid or cut short */
/* length of the complete, valid UTF-8 character at s, else 0 */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    int r = m3_utf8_len(s, n);
    return r > 0 ? (size_t)r : 0;
}

/* bytes at the end of s[0..n) that start a valid UTF-8 sequence not yet complete */
static size_t utf8_incomplete_tail(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned c = s[n - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (need <= k) return 0;
        /* a valid sequence prefix? complete it with the smallest continuation bytes */
        unsigned char tmp[4];
        memcpy(tmp, s + n - k, k);
        for (size_t i = k; i < need; i++) tmp[i] = (i == 1 && (c == 0xE0)) ? 0xA0 : (i == 1 && c == 0xF0) ? 0x90 : 0x80;
        return utf8_seq(tmp, need) == need ? k : 0;
    }
    return 0;
}

/* appends s with invalid UTF-8 replaced by U+FFFD */
static int buf_add_utf8(m3_sbuf *b, const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] < 0x80) j++;
        if (m3_sbuf_add(b, s + i, j - i)) return -1;
        i = j;
        if (i == n) break;
        size_t l = utf8_seq(s + i, n - i);
        if (l) {
            if (m3_sbuf_add(b, s + i, l)) return -1;
            i += l;
        } else {
            if (m3_sbuf_add(b, "\xEF\xBF\xBD", 3)) return -1;
            i++;
        }
    }
    return 0;
}

/* appends the characters of s escaped for the inside of a JSON string literal (jansson's
 * escaping; invalid UTF-8 -> U+FFFD). Each character is escaped alone, so s may be given in
 * pieces cut between characters: the pieces' escapes concatenate to the escape of the whole. */
static int buf_add_json_chars(m3_sbuf *b, const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] >= 0x20 && s[j] < 0x80 && s[j] != '"' && s[j] != '\\') j++;
        if (m3_sbuf_add(b, s + i, j - i)) return -1;
        i = j;
        if (i == n) break;
        unsigned c = s[i];
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c, esc[2] = 0;
        } else if (c < 0x20) {
            switch (c) {
            case '\b': strcpy(esc, "\\b"); break;
            case '\f': strcpy(esc, "\\f"); break;
            case '\n': strcpy(esc, "\\n"); break;
            case '\r': strcpy(esc, "\\r"); break;
            case '\t': strcpy(esc, "\\t"); break;
            default: snprintf(esc, sizeof esc, "\\u%04X", c); break;
            }
        } else {
            size_t l = utf8_seq(s + i, n - i);
            if (l) {
                if (m3_sbuf_add(b, s + i, l)) return -1;
                i += l;
            } else {
                if (m3_sbuf_add(b, "\xEF\xBF\xBD", 3)) return -1;
                i++;
            }
            continue;
        }
        if (m3_sbuf_str(b, esc)) return -1;
        i++;
    }
    return 0;
}

/* appends s as a JSON string literal */
static int buf_add_json_string(m3_sbuf *b, const char *str, size_t n) {
    if (m3_sbuf_add(b, "\"", 1) || buf_add_json_chars(b, str, n)) return -1;
    return m3_sbuf_add(b, "\"", 1);
}

/* ---- argument typing by JSON schema */

enum { TY_NULL = 1, TY_BOOL = 2, TY_INT = 4, TY_NUM = 8, TY_OBJ = 16, TY_ARR = 32, TY_STR = 64 };

static unsigned type_bit(const char *t) {
    if (!strcmp(t, "string")) return TY_STR;
    if (!strcmp(t, "integer")) return TY_INT;
    if (!strcmp(t, "number")) return TY_NUM;
    if (!strcmp(t, "boolean")) return TY_BOOL;
    if (!strcmp(t, "object")) return TY_OBJ;
    if (!strcmp(t, "array")) return TY_ARR;
    if (!strcmp(t, "null")) return TY_NULL;
    return 0;
}

static unsigned value_bit(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_STRING: return TY_STR;
    case JSON_INTEGER: return TY_INT;
    case JSON_REAL: return TY_NUM;
    case JSON_TRUE: case JSON_FALSE: return TY_BOOL;
    case JSON_NULL: return TY_NULL;
    case JSON_OBJECT: return TY_OBJ;
    case JSON_ARRAY: return TY_ARR;
    }
    return 0;
}

/* the set of types a schema admits; 0 = unknown */
static unsigned schema_types(const json_t *s, int depth) {
    if (!json_is_object(s) || depth > 16) return 0;
    unsigned m = 0;
    const json_t *t = json_object_get(s, "type");
    if (json_is_string(t)) m |= type_bit(json_string_value(t));
    else if (json_is_array(t)) {
        size_t i;
        const json_t *e;
        json_array_foreach(t, i, e) if (json_is_string(e)) m |= type_bit(json_string_value(e));
    }
    static const char *const alts[] = {"anyOf", "oneOf", "allOf"};
    for (int a = 0; a < 3; a++) {
        const json_t *arr = json_object_get(s, alts[a]);
        size_t i;
        const json_t *e;
        if (json_is_array(arr)) json_array_foreach(arr, i, e) m |= schema_types(e, depth + 1);
    }
    if (!m) {
        const json_t *en = json_object_get(s, "enum"), *c = json_object_get(s, "const");
        size_t i;
        const json_t *e;
        if (json_is_array(en)) json_array_foreach(en, i, e) m |= value_bit(e);
        if (c) m |= value_bit(c);
    }
    return m;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int parse_int(const char *s, size_t n, long long *out) {
    if (n == 0 || n > 40) return 0;
    char tmp[48];
    memcpy(tmp, s, n);
    tmp[n] = 0;
    size_t i = (tmp[0] == '-' || tmp[0] == '+') ? 1 : 0;
    if (i == n) return 0;
    for (size_t j = i; j < n; j++)
        if (tmp[j] < '0' || tmp[j] > '9') return 0;
    errno = 0;
    char *end;
    long long v = strtoll(tmp, &end, 10);
    if (errno || *end) return 0;
    *out = v;
    return 1;
}

/* RFC 8259 number grammar */
static int json_number_literal(const char *s, size_t n) {
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    if (i == n) return 0;
    if (s[i] == '0') i++;
    else if (s[i] >= '1' && s[i] <= '9') while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    else return 0;
    if (i < n && s[i] == '.') {
        i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == d) return 0;
    }
    return i == n;
}

/* a decimal number (no hex, inf, nan): appends it as JSON (as written when it already is) */
static int try_number(m3_sbuf *b, const char *s, size_t n, int *ok) {
    *ok = 0;
    if (n == 0 || n > 400) return 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789+-.eE", s[i])) return 0;
    char tmp[408];
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *end;
    double v = strtod(tmp, &end);
    if (*end || end == tmp || !isfinite(v)) return 0;
    *ok = 1;
    if (json_number_literal(s, n)) return m3_sbuf_add(b, s, n);
    char out[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, sizeof out, "%.*g", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    if (!json_number_literal(out, strlen(out))) { /* e.g. "1e+20" is fine; guard anyway */
        *ok = 0;
        return 0;
    }
    return m3_sbuf_str(b, out);
}

/* parses s as JSON; returns its type bit, 0 when it is not JSON */
static unsigned json_kind(const char *s, size_t n) {
    if (n == 0) return 0;
    json_error_t jerr;
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    if (!v) return 0;
    unsigned k = value_bit(v);
    json_decref(v);
    return k;
}

static int ci_eq(const char *s, size_t n, const char *lit) {
    if (strlen(lit) != n) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if (c != lit[i]) return 0;
    }
    return 1;
}

/* appends the JSON for one argument value, typed by `types` (0 = unknown) */
static int render_value(m3_sbuf *b, const char *v, size_t n, unsigned types) {
    if (types == TY_STR) return buf_add_json_string(b, v, n);
    const char *t = v;
    size_t tn = n;
    while (tn && is_ws(*t)) t++, tn--;
    while (tn && is_ws(t[tn - 1])) tn--;
    if (types) {
        if ((types & TY_NULL) && tn == 4 && !memcmp(t, "null", 4)) return m3_sbuf_str(b, "null");
        if (types & TY_BOOL) {
            if (ci_eq(t, tn, "true")) return m3_sbuf_str(b, "true");
            if (ci_eq(t, tn, "false")) return m3_sbuf_str(b, "false");
        }
        long long iv;
        if ((types & TY_INT) && parse_int(t, tn, &iv)) {
            char out[32];
            snprintf(out, sizeof out, "%lld", iv);
            return m3_sbuf_str(b, out);
        }
        if (types & TY_NUM) {
            int ok;
            if (try_number(b, t, tn, &ok)) return -1;
            if (ok) return 0;
        }
        if (types & (TY_OBJ | TY_ARR)) {
            unsigned k = json_kind(t, tn);
            if (k & types & (TY_OBJ | TY_ARR)) return m3_sbuf_add(b, t, tn);
        }
        if (types & TY_STR) return buf_add_json_string(b, v, n);
    }
    if (json_kind(t, tn)) return m3_sbuf_add(b, t, tn); /* valid JSON as written */
    return buf_add_json_string(b, v, n);
}

/* ---- the stream */

typedef struct tool_ent {
    char *name;
    json_t *props; /* parameters.properties (a deep copy), or NULL */
} tool_ent;

typedef struct pend_delta {
    m3_out_kind kind;
    int index;
    size_t off, len;       /* text in work */
    size_t id_off, name_off;
} pend_delta;

enum { R_START, R_THINK, R_PASS };
enum { T_TEXT, T_BLOCK };
enum { B_OPEN, B_INVOKE, B_VALUE };
enum { V_STREAM, V_WHOLE }; /* a value streamed as a JSON string, or typed and written at its end */

struct m3_out {
    m3_out_opts opts;
    char id_prefix[64];
    tool_ent *tools;
    int n_tools;
    int finished, broken;
    size_t markup;
    int n_calls;
    /* reasoning stage */
    int rstate;
    m3_sbuf rhold;
    /* tool stage; tb holds: T_TEXT, text that may still begin an opener; B_OPEN, the raw text
     * since the opener or the last `</invoke>` (content if the block goes wrong); B_INVOKE, what
     * follows the last tag; B_VALUE, the value's bytes not yet written out */
    int tstate, bsub;
    m3_sbuf tb;
    size_t cur;            /* parse position in tb (B_OPEN, B_INVOKE) */
    size_t vscan;          /* B_VALUE: where to look for the next NS */
    int vmode, vlead;      /* B_VALUE: V_*; V_STREAM: the leading newline was settled */
    unsigned vtypes;       /* B_VALUE, V_WHOLE: the types the value's schema admits */
    m3_sbuf argname;       /* current argument name */
    const json_t *props;   /* current function's parameter schemas, or NULL */
    int call_open, nargs;  /* a call begun whose `}` is not written; its arguments so far */
    int n_done;            /* calls completed */
    /* output stage */
    m3_sbuf work;
    pend_delta *pd;
    size_t npd, cappd;
    m3_sbuf final;
    m3_out_delta *outd;
    size_t capoutd;
    char carry[4];
    size_t carry_n;
    m3_out_kind carry_kind;
};

/* room for one more pending delta */
static int pd_reserve(m3_out *o) {
    if (o->npd < o->cappd) return 0;
    size_t cap = o->cappd ? o->cappd * 2 : 16;
    pend_delta *p = realloc(o->pd, cap * sizeof *p);
    if (!p) return -1;
    o->pd = p;
    o->cappd = cap;
    return 0;
}

static int out_raw(m3_out *o, m3_out_kind k, const char *s, size_t n) {
    if (n == 0) return 0;
    if (o->npd) {
        pend_delta *l = &o->pd[o->npd - 1];
        if (l->kind == k && l->off + l->len == o->work.n) {
            if (m3_sbuf_add(&o->work, s, n)) return -1;
            l->len += n;
            return 0;
        }
    }
    if (pd_reserve(o)) return -1;
    pend_delta *d = &o->pd[o->npd];
    d->kind = k;
    d->index = -1;
    d->off = o->work.n;
    d->len = n;
    d->id_off = d->name_off = 0;
    if (m3_sbuf_add(&o->work, s, n)) return -1;
    o->npd++;
    return 0;
}

static int out_flush_carry(m3_out *o) {
    if (!o->carry_n) return 0;
    size_t n = o->carry_n;
    o->carry_n = 0;
    return out_raw(o, o->carry_kind, o->carry, n);
}

/* text delta of kind k (reasoning or content), holding back an incomplete UTF-8 tail */
static int out_text(m3_out *o, m3_out_kind k, const char *s, size_t n) {
    if (n == 0) return 0;
    if (out_flush_carry(o) || out_raw(o, k, s, n)) return -1;
    pend_delta *l = &o->pd[o->npd - 1];
    size_t t = utf8_incomplete_tail(o->work.p + l->off, l->len);
    if (t) {
        memcpy(o->carry, o->work.p + l->off + l->len - t, t);
        o->carry_n = t;
        o->carry_kind = k;
        l->len -= t;
        o->work.n -= t;
        o->work.p[o->work.n] = 0;
        if (l->len == 0) o->npd--;
    }
    return 0;
}

/* TOOL_BEGIN of a new call: id and name as NUL-terminated strings in work */
static int out_begin(m3_out *o, const char *name, size_t nlen) {
    if (out_flush_carry(o)) return -1;
    int index = o->n_calls;
    char id[96];
    snprintf(id, sizeof id, "%s%d", o->id_prefix, index);
    if (pd_reserve(o)) return -1;
    pend_delta *d = &o->pd[o->npd];
    d->kind = M3_OUT_TOOL_BEGIN;
    d->index = index;
    d->off = o->work.n;
    d->len = 0;
    d->id_off = o->work.n;
    if (m3_sbuf_add(&o->work, id, strlen(id) + 1)) return -1;
    d->name_off = o->work.n;
    if (m3_sbuf_add(&o->work, name, nlen) || m3_sbuf_add(&o->work, "", 1)) return -1;
    o->npd++;
    o->n_calls++;
    return 0;
}

/* a piece of the open call's arguments: s[0..n), or when esc the JSON escape of s (a string
 * value's characters) */
static int out_args(m3_out *o, const char *s, size_t n, int esc) {
    if (n == 0) return 0;
    int index = o->n_calls - 1;
    pend_delta *l = o->npd ? &o->pd[o->npd - 1] : NULL;
    if (!l || l->kind != M3_OUT_TOOL_ARGS || l->index != index || l->off + l->len != o->work.n) {
        if (pd_reserve(o)) return -1;
        l = &o->pd[o->npd++];
        *l = (pend_delta){M3_OUT_TOOL_ARGS, index, o->work.n, 0, 0, 0};
    }
    size_t before = o->work.n;
    if (esc ? buf_add_json_chars(&o->work, s, n) : m3_sbuf_add(&o->work, s, n)) return -1;
    l->len += o->work.n - before;
    return 0;
}

/* builds the m3_out_delta array (strings NUL-terminated in `final`) */
static int out_finalize(m3_out *o, const m3_out_delta **deltas, size_t *n) {
    o->final.n = 0;
    if (o->npd > o->capoutd) {
        m3_out_delta *p = realloc(o->outd, o->npd * sizeof *p);
        if (!p) return -1;
        o->outd = p;
        o->capoutd = o->npd;
    }
    /* pass 1: copy texts and record offsets in the out array (as integers in len/idx) */
    for (size_t i = 0; i < o->npd; i++) {
        pend_delta *d = &o->pd[i];
        m3_out_delta *e = &o->outd[i];
        e->kind = d->kind;
        e->index = d->index;
        e->len = d->len;
        size_t toff = o->final.n;
        if (m3_sbuf_add(&o->final, o->work.p + d->off, d->len) || m3_sbuf_add(&o->final, "", 1)) return -1;
        e->text = (const char *)(uintptr_t)toff;
        e->id = e->name = NULL;
        if (d->kind == M3_OUT_TOOL_BEGIN) {
            size_t ioff = o->final.n;
            const char *id = o->work.p + d->id_off, *nm = o->work.p + d->name_off;
            if (m3_sbuf_add(&o->final, id, strlen(id) + 1)) return -1;
            size_t noff = o->final.n;
            if (m3_sbuf_add(&o->final, nm, strlen(nm) + 1)) return -1;
            e->id = (const char *)(uintptr_t)ioff;
            e->name = (const char *)(uintptr_t)noff;
        }
    }
    for (size_t i = 0; i < o->npd; i++) {
        m3_out_delta *e = &o->outd[i];
        e->text = o->final.p + (uintptr_t)e->text;
        if (e->kind == M3_OUT_TOOL_BEGIN) {
            e->id = o->final.p + (uintptr_t)e->id;
            e->name = o->final.p + (uintptr_t)e->name;
        }
    }
    *deltas = o->outd;
    *n = o->npd;
    o->npd = 0;
    o->work.n = 0;
    return 0;
}

/* ---- tool stage */

static const tool_ent *find_tool(const m3_out *o, const char *name, size_t n) {
    for (int i = 0; i < o->n_tools; i++)
        if (strlen(o->tools[i].name) == n && !memcmp(o->tools[i].name, name, n)) return &o->tools[i];
    return NULL;
}

static int valid_arg_name(const char *s, size_t n) {
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == '/' || c == '"' || c == '=' || c == '\'' || c == 0x7f) return 0;
    }
    return 1;
}

/* the first k bytes of tb are markup: counted and dropped */
static void consume(m3_out *o, size_t k) {
    o->markup += k;
    m3_sbuf_drop_front(&o->tb, k);
    o->vscan = o->vscan > k ? o->vscan - k : 0;
}

static int call_begin(m3_out *o, const char *name, size_t n) {
    const tool_ent *t = find_tool(o, name, n);
    o->props = t ? t->props : NULL;
    o->call_open = 1;
    o->nargs = 0;
    return out_begin(o, name, n);
}

static int call_end(m3_out *o) {
    o->call_open = 0;
    o->n_done++;
    return o->nargs ? out_args(o, "}", 1, 0) : out_args(o, "{}", 2, 0);
}

/* `{` or `, `, then the argument's `"name": `. A value that its schema types as a string and
 * nothing else is streamed (V_STREAM): its opening quote goes now. Any other value's type
 * depends on its text (a number, a boolean, JSON or a string), so it is written whole at its end. */
static int arg_begin(m3_out *o) {
    unsigned types = o->props ? schema_types(json_object_get(o->props, o->argname.p), 0) : 0;
    o->vmode = types == TY_STR ? V_STREAM : V_WHOLE;
    o->vtypes = types;
    o->vlead = 0;
    o->vscan = 0;
    int first = o->nargs++ == 0;
    if (out_args(o, first ? "{\"" : ", \"", first ? 2 : 3, 0) || out_args(o, o->argname.p, o->argname.n, 1)) return -1;
    return o->vmode == V_STREAM ? out_args(o, "\": \"", 4, 0) : out_args(o, "\": ", 3, 0);
}

/* V_STREAM: writes what is settled of the value's bytes tb[0..end): a leading newline is
 * dropped once the first byte is known; a last newline is held back (dropped if the value ends
 * right after it), and so is an incomplete UTF-8 character. final: the value ends at end (its
 * one trailing newline dropped, the closing quote written). */
static int value_stream(m3_out *o, size_t end, int final) {
    const char *p = o->tb.p;
    size_t from = 0, to = end;
    if (!o->vlead && end > 0) {
        o->vlead = 1;
        from = p[0] == '\n';
    }
    if (to > from && p[to - 1] == '\n') to--;
    if (!final) to -= utf8_incomplete_tail(p + from, to - from);
    if (out_args(o, p + from, to - from, 1)) return -1;
    if (final) {
        to = end;
        if (out_args(o, "\"", 1, 0)) return -1;
    }
    consume(o, to);
    return 0;
}

/* V_WHOLE: the value tb[0..end), typed by its schema (parsers.h) */
static int value_whole(m3_out *o, size_t end) {
    const char *v = o->tb.p;
    size_t n = end;
    if (n && v[0] == '\n') v++, n--;
    if (n && v[n - 1] == '\n') n--;
    m3_sbuf val = {0};
    int rc = render_value(&val, v, n, o->vtypes) || out_args(o, val.p ? val.p : "", val.n, 0);
    free(val.p);
    consume(o, end);
    return rc ? -1 : 0;
}

static int value_end(m3_out *o, size_t end) {
    return o->vmode == V_STREAM ? value_stream(o, end, 1) : value_whole(o, end);
}

/* The block went wrong at tb offset at. With a call open (its name is out, it cannot be taken
 * back): the value in progress ends there, the arguments are closed, and text scanning resumes
 * at `at`. Without: the block's raw text before `at` is content and scanning resumes there. */
static int block_fail(m3_out *o, size_t at) {
    o->tstate = T_TEXT;
    if (o->call_open) {
        if (o->bsub == B_VALUE) {
            if (value_end(o, at)) return -1;
        } else consume(o, at);
        return call_end(o);
    }
    if (out_text(o, M3_OUT_CONTENT, o->tb.p, at)) return -1;
    m3_sbuf_drop_front(&o->tb, at);
    return 0;
}

/* Advances the block parser over tb: 1 when it needs more input, 0 when its state changed,
 * -1 when out of memory. eos: nothing more comes (every open question is a failure). */
static int block_step(m3_out *o, int eos) {
    const char *p = o->tb.p;
    size_t n = o->tb.n;
    if (o->bsub == B_VALUE) {
        const char *f = o->vscan < n ? find_bytes(p + o->vscan, n - o->vscan, NS, NS_LEN) : NULL;
        if (!f) {
            if (eos) return block_fail(o, n); /* the value ends with the stream */
            o->vscan = n - partial_suffix(p + o->vscan, n - o->vscan, NS, NS_LEN);
            if (o->vmode == V_STREAM && value_stream(o, o->vscan, 0)) return -1;
            return 1;
        }
        size_t k = (size_t)(f - p);
        o->vscan = k;
        /* expect `</ARG>` right after the namespace token */
        size_t need = o->argname.n + 3, m = n - (k + NS_LEN), c = m < need ? m : need;
        char close[TAG_MAX + 8];
        close[0] = '<', close[1] = '/';
        memcpy(close + 2, o->argname.p, o->argname.n);
        close[need - 1] = '>';
        if (memcmp(p + k + NS_LEN, close, c) || (m < need && eos)) return block_fail(o, k);
        if (m < need) {
            if (o->vmode == V_STREAM && value_stream(o, k, 0)) return -1;
            return 1;
        }
        if (value_end(o, k)) return -1;
        consume(o, NS_LEN + need);
        o->bsub = B_INVOKE;
        o->cur = 0;
        return 0;
    }
    while (o->cur < n && is_ws(p[o->cur])) o->cur++;
    size_t s = o->cur;
    if (s == n) return eos ? block_fail(o, s) : 1;
    size_t m = n - s;
    if (memcmp(p + s, NS, m < NS_LEN ? m : NS_LEN)) return block_fail(o, s);
    if (m < NS_LEN) return eos ? block_fail(o, s) : 1;
    size_t q = s + NS_LEN;
    if (q == n) return eos ? block_fail(o, s) : 1;
    if (p[q] != '<') return block_fail(o, s);
    size_t e = q + 1, lim = q + TAG_MAX;
    while (e < n && e < lim && p[e] != '>' && p[e] != '<') e++;
    if (e == lim || (e < n && p[e] == '<')) return block_fail(o, s);
    if (e == n) return eos ? block_fail(o, s) : 1;
    const char *tag = p + q;
    size_t tl = e + 1 - q;
    if (o->bsub == B_OPEN) {
        if (tl == 12 && !memcmp(tag, "</tool_call>", 12)) {
            consume(o, e + 1);
            o->tstate = T_TEXT;
            return 0;
        }
        static const char pre[] = "<invoke name=\"";
        const size_t pl = sizeof pre - 1;
        if (tl > pl + 2 && !memcmp(tag, pre, pl) && tag[tl - 2] == '"' && !memchr(tag + pl, '"', tl - pl - 2) &&
            !memchr(tag + pl, 0, tl - pl - 2)) {
            if (call_begin(o, tag + pl, tl - pl - 2)) return -1; /* copies the name before tb drops it */
            consume(o, e + 1);
            o->bsub = B_INVOKE;
            o->cur = 0;
            return 0;
        }
    } else {
        if (tl == 9 && !memcmp(tag, "</invoke>", 9)) {
            consume(o, e + 1);
            o->bsub = B_OPEN;
            o->cur = 0;
            return call_end(o);
        }
        if (valid_arg_name(tag + 1, tl - 2)) {
            o->argname.n = 0;
            if (m3_sbuf_add(&o->argname, tag + 1, tl - 2)) return -1;
            consume(o, e + 1);
            o->bsub = B_VALUE;
            return arg_begin(o);
        }
    }
    return block_fail(o, s);
}

static int tool_run(m3_out *o, int eos) {
    for (;;) {
        if (o->tstate == T_TEXT) {
            const char *f = find_bytes(o->tb.p, o->tb.n, OPENER, OPENER_LEN);
            if (f) {
                size_t i = (size_t)(f - o->tb.p);
                if (out_text(o, M3_OUT_CONTENT, o->tb.p, i)) return -1;
                m3_sbuf_drop_front(&o->tb, i);
                o->tstate = T_BLOCK;
                o->bsub = B_OPEN;
                o->cur = OPENER_LEN;
                continue;
            }
            size_t h = eos ? 0 : partial_suffix(o->tb.p, o->tb.n, OPENER, OPENER_LEN);
            if (out_text(o, M3_OUT_CONTENT, o->tb.p, o->tb.n - h)) return -1;
            m3_sbuf_drop_front(&o->tb, o->tb.n - h);
            return 0;
        }
        int r = block_step(o, eos);
        if (r < 0) return -1;
        if (r > 0) return 0;
    }
}

static int tool_feed(m3_out *o, const char *s, size_t n) {
    if (n == 0) return 0;
    if (!o->opts.tools) return out_text(o, M3_OUT_CONTENT, s, n);
    if (m3_sbuf_add(&o->tb, s, n)) return -1;
    return tool_run(o, 0);
}

/* ---- reasoning stage */

static int starts_with(const char *s, size_t n, const char *tag, size_t tn) {
    return n >= tn && !memcmp(s, tag, tn);
}

static int is_prefix_of(const char *s, size_t n, const char *tag, size_t tn) {
    return n < tn && !memcmp(s, tag, n);
}

static int reason_run(m3_out *o) {
    m3_sbuf *h = &o->rhold;
    for (;;) {
        if (o->rstate == R_START) {
            int think_ok = o->opts.thinking != M3_THINK_DISABLED;
            if (think_ok && starts_with(h->p, h->n, THINK_OPEN, THINK_OPEN_LEN)) {
                o->markup += THINK_OPEN_LEN;
                m3_sbuf_drop_front(h, THINK_OPEN_LEN);
                o->rstate = R_THINK;
                continue;
            }
            if (starts_with(h->p, h->n, THINK_CLOSE, THINK_CLOSE_LEN)) {
                o->markup += THINK_CLOSE_LEN;
                m3_sbuf_drop_front(h, THINK_CLOSE_LEN);
                o->rstate = R_PASS;
                continue;
            }
            if ((think_ok && is_prefix_of(h->p, h->n, THINK_OPEN, THINK_OPEN_LEN)) ||
                is_prefix_of(h->p, h->n, THINK_CLOSE, THINK_CLOSE_LEN))
                return 0; /* could still become a tag */
            o->rstate = o->opts.thinking == M3_THINK_ENABLED ? R_THINK : R_PASS;
            continue;
        }
        if (o->rstate == R_THINK) {
            const char *f = find_bytes(h->p, h->n, THINK_CLOSE, THINK_CLOSE_LEN);
            if (f) {
                size_t i = (size_t)(f - h->p);
                if (out_text(o, M3_OUT_REASONING, h->p, i)) return -1;
                o->markup += THINK_CLOSE_LEN;
                m3_sbuf_drop_front(h, i + THINK_CLOSE_LEN);
                o->rstate = R_PASS;
                continue;
            }
            size_t k = partial_suffix(h->p, h->n, THINK_CLOSE, THINK_CLOSE_LEN);
            if (out_text(o, M3_OUT_REASONING, h->p, h->n - k)) return -1;
            m3_sbuf_drop_front(h, h->n - k);
            return 0;
        }
        /* R_PASS */
        int rc = tool_feed(o, h->p, h->n);
        h->n = 0;
        return rc;
    }
}

static int reason_feed(m3_out *o, const char *s, size_t n) {
    if (o->rstate == R_PASS) return tool_feed(o, s, n);
    if (m3_sbuf_add(&o->rhold, s, n)) return -1;
    return reason_run(o);
}

/* ---- public API */

m3_out *m3_out_new(const m3_out_opts *opts, const json_t *tools, m3_err *err) {
    if (tools && !json_is_array(tools)) {
        m3_errf(err, "tools: expected an array, found %s",
                json_is_object(tools) ? "an object" : "another JSON type");
        return NULL;
    }
    m3_out *o = calloc(1, sizeof *o);
    if (!o) goto oom;
    if (opts) o->opts = *opts;
    else o->opts = (m3_out_opts){.reasoning = 1, .thinking = M3_THINK_ENABLED, .tools = 1};
    snprintf(o->id_prefix, sizeof o->id_prefix, "%s", o->opts.id_prefix ? o->opts.id_prefix : "call_");
    o->opts.id_prefix = o->id_prefix;
    o->rstate = o->opts.reasoning ? R_START : R_PASS;
    if (tools && json_array_size(tools)) {
        o->tools = calloc(json_array_size(tools), sizeof *o->tools);
        if (!o->tools) goto oom;
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t) {
            const json_t *fn = json_object_get(t, "function");
            if (!json_is_object(fn)) fn = t;
            const json_t *name = json_object_get(fn, "name");
            if (!json_is_string(name)) continue; /* not a function tool: nothing to type */
            tool_ent *e = &o->tools[o->n_tools];
            e->name = strdup(json_string_value(name));
            if (!e->name) goto oom;
            o->n_tools++;
            const json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
            if (json_is_object(props) && !(e->props = json_deep_copy(props))) goto oom;
        }
    }
    return o;
oom:
    m3_out_free(o);
    m3_errf(err, "output parser: out of memory");
    return NULL;
}

void m3_out_free(m3_out *o) {
    if (!o) return;
    for (int i = 0; i < o->n_tools; i++) {
        free(o->tools[i].name);
        json_decref(o->tools[i].props);
    }
    free(o->tools);
    free(o->rhold.p);
    free(o->tb.p);
    free(o->argname.p);
    free(o->work.p);
    free(o->pd);
    free(o->final.p);
    free(o->outd);
    free(o);
}

int m3_out_feed(m3_out *o, const char *text, size_t len, const m3_out_delta **deltas, size_t *n,
                m3_err *err) {
    *deltas = NULL;
    *n = 0;
    if (o->finished || o->broken)
        return m3_errf(err, "output parser: feed after %s", o->broken ? "an error" : "finish");
    if (reason_feed(o, text, len) || out_finalize(o, deltas, n)) {
        o->broken = 1;
        return m3_errf(err, "output parser: out of memory");
    }
    return 0;
}

int m3_out_finish(m3_out *o, const m3_out_delta **deltas, size_t *n, m3_err *err) {
    *deltas = NULL;
    *n = 0;
    if (o->finished || o->broken)
        return m3_errf(err, "output parser: finish after %s", o->broken ? "an error" : "finish");
    o->finished = 1;
    int rc = 0;
    if (o->rstate == R_START && o->opts.thinking == M3_THINK_ENABLED) o->rstate = R_THINK;
    if (o->rstate == R_THINK) rc = out_text(o, M3_OUT_REASONING, o->rhold.p, o->rhold.n);
    else if (o->rhold.n) rc = tool_feed(o, o->rhold.p, o->rhold.n);
    o->rhold.n = 0;
    if (!rc && o->opts.tools) rc = tool_run(o, 1);
    if (!rc) rc = out_flush_carry(o);
    if (rc || out_finalize(o, deltas, n)) {
        o->broken = 1;
        return m3_errf(err, "output parser: out of memory");
    }
    return 0;
}

size_t m3_out_markup_bytes(const m3_out *o) { return o->markup; }

int m3_out_tool_calls(const m3_out *o) { return o->n_calls; }

int m3_out_tool_calls_done(const m3_out *o) { return o->n_done; }

/* ---- OpenAI rendering */

static json_t *string_utf8(const char *s, size_t n) {
    m3_sbuf b = {0};
    if (buf_add_utf8(&b, s, n) || m3_sbuf_add(&b, "", 0)) {
        free(b.p);
        return NULL;
    }
    json_t *j = json_stringn(b.p, b.n);
    free(b.p);
    return j;
}

json_t *m3_out_delta_json(const m3_out_delta *d, size_t n) {
    json_t *obj = json_object(), *calls = NULL;
    m3_sbuf reason = {0}, content = {0};
    int rc = obj ? 0 : -1;
    for (size_t i = 0; i < n && !rc; i++) {
        const m3_out_delta *e = &d[i];
        if (e->kind == M3_OUT_REASONING) {
            rc = m3_sbuf_add(&reason, e->text, e->len);
        } else if (e->kind == M3_OUT_CONTENT) {
            rc = m3_sbuf_add(&content, e->text, e->len);
        } else {
            if (!calls && !(calls = json_array())) {
                rc = -1;
                break;
            }
            json_t *entry = NULL;
            if (e->kind == M3_OUT_TOOL_ARGS) { /* this call's entry, when in the same list */
                size_t k;
                json_t *c;
                json_array_foreach(calls, k, c) if (json_integer_value(json_object_get(c, "index")) == e->index) entry = c;
            }
            if (!entry) {
                entry = json_object();
                json_t *fn = json_object();
                if (!entry || !fn || json_array_append_new(calls, entry) ||
                    json_object_set_new(entry, "index", json_integer(e->index)) ||
                    json_object_set_new(entry, "function", fn)) {
                    json_decref(fn);
                    rc = -1;
                    break;
                }
                if (e->kind == M3_OUT_TOOL_BEGIN) {
                    rc |= json_object_set_new(entry, "id", string_utf8(e->id, strlen(e->id)));
                    rc |= json_object_set_new(entry, "type", json_string("function"));
                    rc |= json_object_set_new(fn, "name", string_utf8(e->name, strlen(e->name)));
                    rc |= json_object_set_new(fn, "arguments", json_string(""));
                    continue;
                }
            }
            json_t *fn = json_object_get(entry, "function");
            const char *prev = json_string_value(json_object_get(fn, "arguments"));
            m3_sbuf a = {0};
            rc |= m3_sbuf_add(&a, prev ? prev : "", prev ? strlen(prev) : 0);
            rc |= buf_add_utf8(&a, e->text, e->len);
            if (!rc) rc |= json_object_set_new(fn, "arguments", json_stringn(a.p, a.n));
            free(a.p);
        }
    }
    /* vLLM's current field, reasoning, and the one older clients read, reasoning_content */
    if (!rc && reason.n) rc = json_object_set_new(obj, "reasoning", string_utf8(reason.p, reason.n));
    if (!rc && reason.n) rc = json_object_set_new(obj, "reasoning_content", string_utf8(reason.p, reason.n));
    if (!rc && content.n) rc = json_object_set_new(obj, "content", string_utf8(content.p, content.n));
    if (!rc && calls) {
        rc = json_object_set_new(obj, "tool_calls", calls);
        calls = NULL;
    }
    free(reason.p);
    free(content.p);
    json_decref(calls);
    if (rc) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

/* ---- forced tool calls: the grammar of a block (parsers.h) */

/* "#/properties/<name>" with the JSON pointer escapes */
static int prop_pointer(m3_sbuf *p, const char *name) {
    if (m3_sbuf_str(p, "#/properties/")) return -1;
    for (const char *c = name; *c; c++) {
        const char *esc = *c == '~' ? "~0" : *c == '/' ? "~1" : NULL;
        if (esc ? m3_sbuf_str(p, esc) : m3_sbuf_add(p, c, 1)) return -1;
    }
    return m3_sbuf_add(p, "", 0);
}

/* an invoke of tool fn: its name, then its arguments */
static int invoke_node(m3_grammar_builder *b, const char *fname, const json_t *params, m3_err *err) {
    m3_grammar_raw raw = {"]<", 0, 0};
    if (!*fname || strchr(fname, '"') || strchr(fname, '<') || strchr(fname, '>') || strlen(fname) > TAG_MAX - 20) {
        m3_errf(err, "tool \"%.64s\": the function name cannot be written in the tool-call markup", fname);
        return -1;
    }
    m3_sbuf t = {0};
    /* nomem: an allocation of this function failed (no message written yet); named: the message
     * names the tool already */
    int parts[2 * 512 + 4], np = 0, rc = 0, nomem = 0, named = 0;
    rc |= m3_sbuf_str(&t, NS "<invoke name=\"") | m3_sbuf_str(&t, fname) | m3_sbuf_str(&t, "\">\n");
    if (!rc) parts[np++] = m3_gb_literal(b, t.p, t.n);
    const json_t *props = json_object_get(params, "properties"), *req = json_object_get(params, "required");
    char *doc = json_is_object(params) ? json_dumps(params, JSON_COMPACT) : NULL;
    if (json_is_object(params) && !doc) rc = -1; /* not "any JSON": the schema's grammar or a failure */
    nomem = rc != 0;
    size_t doclen = doc ? strlen(doc) : 0;
    /* declared properties in order, then required names that have no property schema */
    size_t nprop = json_is_object(props) ? json_object_size(props) : 0, nreq = json_is_array(req) ? json_array_size(req) : 0;
    void *it = json_is_object(props) ? json_object_iter((json_t *)props) : NULL;
    for (size_t k = 0; !rc && k < nprop + nreq && np < 2 * 512; k++) {
        const char *arg;
        const json_t *ps = NULL;
        if (k < nprop) {
            arg = json_object_iter_key(it);
            ps = json_object_iter_value(it);
            it = json_object_iter_next((json_t *)props, it);
        } else {
            arg = json_string_value(json_array_get(req, k - nprop));
            if (!arg || json_object_get(props, arg)) continue;
        }
        int required = 0;
        for (size_t i = 0; i < nreq; i++) required |= json_is_string(json_array_get(req, i)) && !strcmp(json_string_value(json_array_get(req, i)), arg);
        if (!valid_arg_name(arg, strlen(arg)) || strlen(arg) > TAG_MAX - 4 || strstr(arg, "]<")) {
            if (!required) continue; /* an optional argument the markup cannot name: left out */
            m3_errf(err, "tool \"%.64s\": the argument name \"%.64s\" cannot be written in the tool-call markup", fname, arg);
            rc = -1;
            named = 1;
            break;
        }
        int a[3] = {-1, -1, -1};
        t.n = 0;
        rc |= m3_sbuf_str(&t, NS "<") | m3_sbuf_str(&t, arg) | m3_sbuf_str(&t, ">");
        nomem |= rc != 0;
        a[0] = rc ? -1 : m3_gb_literal(b, t.p, t.n);
        if (ps && doc) {
            m3_sbuf ptr = {0};
            unsigned types = schema_types(ps, 0);
            /* strings raw, as the parser reads them; with other types admitted, never a raw
             * string the parser would read as one of those (render_value's order) */
            raw.not_as = (types & TY_NULL ? M3_GRAW_NULL : 0) | (types & TY_BOOL ? M3_GRAW_BOOL : 0) |
                         (types & TY_INT ? M3_GRAW_INT : 0) | (types & TY_NUM ? M3_GRAW_NUM : 0) |
                         (types & TY_OBJ ? M3_GRAW_OBJ : 0) | (types & TY_ARR ? M3_GRAW_ARR : 0);
            if (prop_pointer(&ptr, arg)) rc = nomem = -1;
            else a[1] = m3_gb_schema(b, doc, doclen, ptr.p, (types & TY_STR) ? &raw : NULL);
            free(ptr.p);
        } else {
            a[1] = m3_gb_schema(b, "true", 4, NULL, NULL); /* no schema: any JSON */
        }
        t.n = 0;
        rc |= m3_sbuf_str(&t, NS "</") | m3_sbuf_str(&t, arg) | m3_sbuf_str(&t, ">\n");
        nomem |= rc != 0;
        a[2] = rc ? -1 : m3_gb_literal(b, t.p, t.n);
        int one = m3_gb_seq(b, a, 3);
        parts[np++] = required ? one : m3_gb_optional(b, one);
        if (parts[np - 1] < 0) rc = -1;
    }
    free(doc);
    if (!rc) parts[np++] = m3_gb_literal(b, NS "</invoke>\n", NS_LEN + 10);
    free(t.p);
    if (rc || parts[np - 1] < 0) {
        /* a failed allocation here wrote no message (the builder's, if any, came after it and
         * is not the cause): written now, as memory's (oom set), whatever err held before */
        if (nomem) m3_errf(err, "out of memory");
        if (!named) m3_err_prefix(err, "tool \"%.64s\"", fname);
        return -1;
    }
    return m3_gb_seq(b, parts, np);
}

static m3_grammar *tool_grammar(const json_t *tools, const char *name, int max_calls, int text_first, const m3_grammar_opts *opts,
                                m3_err *err) {
    if (!json_is_array(tools) || !json_array_size(tools)) {
        m3_errf(err, "%s need 'tools'", text_first ? "strict tools" : "forced tool calls");
        return NULL;
    }
    m3_grammar_builder *b = m3_grammar_builder_new(opts, err);
    if (!b) return NULL;
    int *alts = malloc(sizeof *alts * (json_array_size(tools) + 1)), na = 0, found = 0;
    size_t i;
    const json_t *t;
    int rc = alts ? 0 : m3_errf(err, "out of memory");
    json_array_foreach(tools, i, t) {
        if (rc) break;
        const json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn)) fn = t;
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (!fname || (name && strcmp(fname, name))) continue;
        int dup = 0; /* a name listed twice: the first one's schema (as the parser types it) */
        for (size_t k = 0; k < i; k++) {
            const json_t *f2 = json_object_get(json_array_get(tools, k), "function");
            if (!json_is_object(f2)) f2 = json_array_get(tools, k);
            const char *n2 = json_string_value(json_object_get(f2, "name"));
            dup |= n2 && !strcmp(n2, fname);
        }
        if (dup) continue;
        found = 1;
        int x = invoke_node(b, fname, json_object_get(fn, "parameters"), err);
        if (x < 0) rc = -1;
        else alts[na++] = x;
    }
    if (!rc && !found) rc = m3_errf(err, name ? "no function named \"%.64s\" in 'tools'" : "no function in 'tools'%s", name ? name : "");
    m3_grammar *g = NULL;
    if (!rc) {
        int parts[3];
        parts[0] = m3_gb_literal(b, OPENER "\n", OPENER_LEN + 1);
        int any = m3_gb_choice(b, alts, na);
        parts[1] = m3_gb_repeat(b, any, 1, max_calls > 0 ? max_calls : -1);
        parts[2] = m3_gb_literal(b, NS "</tool_call>", NS_LEN + 12);
        int root = m3_gb_seq(b, parts, 3);
        if (text_first) { /* text the parser keeps as content (never the opener), then the block or nothing */
            static const char str[] = "{\"type\":\"string\"}";
            m3_grammar_raw text = {OPENER, 1, 0};
            int two[2] = {m3_gb_schema(b, str, sizeof str - 1, NULL, &text), m3_gb_optional(b, root)};
            root = m3_gb_seq(b, two, 2);
        }
        g = m3_gb_finish(b, root, err);
    }
    free(alts);
    m3_grammar_builder_free(b);
    return g;
}

m3_grammar *m3_tool_call_grammar(const json_t *tools, const char *name, int max_calls, const m3_grammar_opts *opts,
                                 m3_err *err) {
    return tool_grammar(tools, name, max_calls, 0, opts, err);
}

m3_grammar *m3_tool_call_grammar_auto(const json_t *tools, int max_calls, const m3_grammar_opts *opts, m3_err *err) {
    return tool_grammar(tools, NULL, max_calls, 1, opts, err);
}
