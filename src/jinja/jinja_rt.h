/* Internals of the Jinja runtime, shared by its files (not a public API):
 *   value.c    values: lists, dicts, JSON in, truthiness, equality, ordering, sorting, args
 *   print.c    values as text: Python str() / repr(), json.dumps (the tojson filter)
 *   strings.c  Python's str operations on UTF-8 (strip, case, replace, split, whitespace)
 *   methods.c  string and dict methods, a table (name -> function)
 *   filters.c  the filters, a table (name -> function)
 *   tests.c    the tests (`x is defined`), a table (name -> function)
 *   eval.c     scopes, attribute access, calls, operators, statements, m3_jinja_render
 * Every value lives in the render's arena (R->A); runtime errors longjmp to
 * m3_jinja_render through jx_fail with "NAME: line L, column C: message". */
#ifndef M3_JINJA_RT_H
#define M3_JINJA_RT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/utf8.h"
#include "jinja/jinja_int.h"

typedef struct frame {
    struct frame *parent;
    jdict vars;
} frame;

enum { F_GLOBAL, F_METHOD, F_MACRO, F_CALLER, F_CYCLE };

struct jfunc {
    int kind;
    const char *name;
    jv self;
    const jnode *def;   /* macro / call block */
    frame *closure;
    jv caller;       /* for macros invoked through {% call %} */
};

typedef struct rt {
    jarena A;
    jmp_buf jb;
    m3_err *err;
    const char *name;
    char *out;
    size_t on, ocap;
    size_t max_out, steps, max_steps;
    int depth, max_depth;
    int ctl; /* 1 break, 2 continue */
} rt;

/* the arguments of a call: positional, then keyword (names[i] = kw[i]) */
typedef struct args {
    jv *pos;
    int npos;
    const char **names;
    jv *kw;
    int nkw;
} args;

/* a growing string in the arena */
typedef struct sb { char *p; size_t n, cap; } sb;

/* ---- errors (value.c) */
void jx_fail(rt *R, const jnode *at, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));

/* ---- value constructors */
static inline jv v_undef(const char *name) { jv v = {0}; v.t = JV_UNDEF; v.u.s.p = name; return v; }
static inline jv v_none(void) { jv v = {0}; v.t = JV_NONE; return v; }
static inline jv v_bool(int b) { jv v = {0}; v.t = JV_BOOL; v.u.b = !!b; return v; }
static inline jv v_int(int64_t i) { jv v = {0}; v.t = JV_INT; v.u.i = i; return v; }
static inline jv v_float(double f) { jv v = {0}; v.t = JV_FLOAT; v.u.f = f; return v; }
static inline jv v_strn(const char *p, size_t n) { jv v = {0}; v.t = JV_STR; v.u.s.p = p; v.u.s.n = n; return v; }
static inline jv v_str(const char *p) { return v_strn(p, strlen(p)); }
static inline jv v_strdup(rt *R, const char *p, size_t n) { return v_strn(ja_strndup(&R->A, p, n), n); }
static inline jv v_list(rt *R, size_t cap) {
    jv v = {0};
    v.t = JV_LIST;
    v.u.l = ja_alloc(&R->A, sizeof(jlist));
    if (cap) { v.u.l->v = ja_alloc(&R->A, cap * sizeof(jv)); v.u.l->cap = cap; }
    return v;
}
static inline jv v_dict(rt *R) {
    jv v = {0};
    v.t = JV_DICT;
    v.u.d = ja_alloc(&R->A, sizeof(jdict));
    return v;
}
static inline jv v_func(rt *R, int kind, const char *name) {
    jv v = {0};
    v.t = JV_FUNC;
    v.u.fn = ja_alloc(&R->A, sizeof(jfunc));
    v.u.fn->kind = kind;
    v.u.fn->name = name;
    return v;
}

static inline int str_eq(jv a, const char *s) {
    return a.t == JV_STR && a.u.s.n == strlen(s) && !memcmp(a.u.s.p, s, a.u.s.n);
}
static inline int is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static inline double num(jv v) { return v.t == JV_INT ? (double)v.u.i : v.t == JV_FLOAT ? v.u.f : (double)v.u.b; }
static inline int64_t inum(jv v) { return v.t == JV_INT ? v.u.i : v.t == JV_BOOL ? v.u.b : (int64_t)v.u.f; }

/* ---- lists and dicts (value.c) */
void jx_push(rt *R, jlist *l, jv x);
jv *jx_find(jdict *d, jv key);
jv *jx_finds(jdict *d, const char *key, size_t n);
void jx_set(rt *R, jdict *d, jv key, jv val);
void jx_sets(rt *R, jdict *d, const char *key, jv val);
jv jx_from_json(rt *R, const json_t *j, int depth);
jv jx_as_list(rt *R, const jnode *at, jv v); /* what a for loop iterates */
jv jx_pair(rt *R, jv a, jv b);
jv jx_dict_items(rt *R, jdict *d);

/* ---- string building (value.c) */
void jx_put(rt *R, sb *b, const char *s, size_t n);
void jx_puts(rt *R, sb *b, const char *s);
static inline jv sb_val(sb *b) { return b->p ? v_strn(b->p, b->n) : v_strn("", 0); }

/* ---- truthiness, equality, ordering (value.c) */
int jx_truthy(jv v);
int jx_eq(jv a, jv b);
int jx_cmp_keys(jv a, jv b); /* strings by bytes; 0 for anything else */
const char *jx_tname(jv v);
int jx_cmp(rt *R, const jnode *at, jv a, jv b); /* Python ordering; errors on incomparable types */
/* stable merge sort of an index array */
void jx_sort_idx(rt *R, size_t *idx, size_t n, int (*cmp)(rt *, void *, size_t, size_t), void *ctx);
size_t jx_u8_len(const char *p, size_t n);                          /* code points */
size_t *jx_u8_offsets(rt *R, const char *p, size_t n, size_t *count); /* their byte offsets, plus n */

/* ---- arguments (value.c) */
jv jx_arg(args *A, int i, const char *name, jv def); /* positional i, else keyword name, else def */
int jx_has_arg(args *A, int i, const char *name);
jv jx_need_str(rt *R, const jnode *at, jv v, const char *what);

/* ---- values as text (print.c) */
void jx_to_str_sb(rt *R, sb *b, jv v, int depth); /* str(v) as Python prints it */
jv jx_to_str(rt *R, jv v);
/* json.dumps(v, ensure_ascii=False, indent=indent, separators=(isep, ksep), sort_keys) */
void jx_to_json(rt *R, sb *b, jv v, int indent, const char *isep, const char *ksep, int sort_keys, int depth,
                const jnode *at);
sb jx_ascii_escape(rt *R, sb in); /* ensure_ascii=True */

/* ---- Python str operations (strings.c) */
static inline int py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }
size_t jx_u8_dec(const char *p, size_t n, int32_t *cp);  /* bytes of the code point at p (1 if invalid) */
size_t jx_u8_back(const char *p, size_t n, int32_t *cp); /* bytes of the code point ending at p[n-1] */
jv jx_strip(rt *R, jv s, jv chars, int left, int right);
/* 0 upper, 1 lower, 2 str.title, 3 first code point to title case, 4 jinja2's title filter */
jv jx_case(rt *R, jv s, int mode);
jv jx_replace(rt *R, jv s, jv old, jv nw, int64_t count);
const char *jx_memfind(const char *h, size_t hn, const char *nd, size_t nn);
jv jx_split(rt *R, const jnode *at, jv s, jv sep, int64_t maxsplit);

/* ---- methods (methods.c) */
int jx_has_str_method(const char *name);
int jx_has_dict_method(const char *name);
jv jx_call_method(rt *R, const jnode *at, jv self, const char *name, args *A);

/* ---- filters (filters.c) and tests (tests.c) */
jv jx_filter(rt *R, const jnode *at, const char *name, jv v, args *A);
int jx_test(rt *R, const jnode *at, const char *name, jv v, args *A);

/* ---- attribute and item access (eval.c) */
jv jx_get_attr(rt *R, jv obj, const char *name);
jv jx_get_item(rt *R, const jnode *at, jv obj, jv key);

#endif
