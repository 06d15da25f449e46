/* Jinja tests (`x is defined`, `n is divisibleby 3`), as jinja2 defines them: a table,
 * name -> function. A test that takes an argument gets it as x (checked present first);
 * the others get an undefined x. See jinja_rt.h. */
#include <string.h>

#include "jinja/jinja_rt.h"

typedef int test_fn(rt *R, const jnode *at, jv v, jv x);
typedef struct {
    const char *name;
    test_fn *fn;
    int takes_arg;
} test;

/* ---- tests of the value alone */
static int t_defined(rt *R, const jnode *at, jv v, jv x) { return v.t != JV_UNDEF; }
static int t_undefined(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_UNDEF; }
static int t_none(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_NONE; }
static int t_string(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_STR; }
static int t_number(rt *R, const jnode *at, jv v, jv x) { return is_num(v); }
static int t_integer(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_INT; }
static int t_float(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_FLOAT; }
static int t_boolean(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_BOOL; }
static int t_true(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_BOOL && v.u.b; }
static int t_false(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_BOOL && !v.u.b; }
static int t_mapping(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_DICT && !v.u.d->ns; }
static int t_iterable(rt *R, const jnode *at, jv v, jv x) {
    return v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR || v.t == JV_UNDEF;
}
static int t_callable(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_FUNC; }
static int t_escaped(rt *R, const jnode *at, jv v, jv x) { return 0; }
static int t_lower(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_STR && jx_eq(jx_case(R, v, 1), v); }
static int t_upper(rt *R, const jnode *at, jv v, jv x) { return v.t == JV_STR && jx_eq(jx_case(R, v, 0), v); }

static int parity(rt *R, const jnode *at, jv v, const char *name, int odd) {
    if (v.t != JV_INT && v.t != JV_BOOL) jx_fail(R, at, "test '%s' needs an integer", name);
    return odd == ((inum(v) % 2) != 0);
}
static int t_odd(rt *R, const jnode *at, jv v, jv x) { return parity(R, at, v, "odd", 1); }
static int t_even(rt *R, const jnode *at, jv v, jv x) { return parity(R, at, v, "even", 0); }

/* ---- tests with an argument */
static int t_eq(rt *R, const jnode *at, jv v, jv x) { return jx_eq(v, x); }
static int t_ne(rt *R, const jnode *at, jv v, jv x) { return !jx_eq(v, x); }
static int t_sameas(rt *R, const jnode *at, jv v, jv x) {
    if (v.t != x.t) return 0;
    if (v.t == JV_NONE || v.t == JV_UNDEF) return 1;
    if (v.t == JV_BOOL) return v.u.b == x.u.b;
    return jx_eq(v, x) && (v.t == JV_INT || v.t == JV_FLOAT || (v.t == JV_STR && v.u.s.p == x.u.s.p) ||
                           (v.t == JV_LIST && v.u.l == x.u.l) || (v.t == JV_DICT && v.u.d == x.u.d));
}
static int t_divisibleby(rt *R, const jnode *at, jv v, jv x) {
    if (inum(x) == 0) jx_fail(R, at, "divisibleby: division by zero");
    return inum(v) % inum(x) == 0;
}
static int t_gt(rt *R, const jnode *at, jv v, jv x) { return jx_cmp(R, at, v, x) > 0; }
static int t_lt(rt *R, const jnode *at, jv v, jv x) { return jx_cmp(R, at, v, x) < 0; }
static int t_ge(rt *R, const jnode *at, jv v, jv x) { return jx_cmp(R, at, v, x) >= 0; }
static int t_le(rt *R, const jnode *at, jv v, jv x) { return jx_cmp(R, at, v, x) <= 0; }
static int t_in(rt *R, const jnode *at, jv v, jv x) {
    if (x.t == JV_STR && v.t == JV_STR) return jx_memfind(x.u.s.p, x.u.s.n, v.u.s.p, v.u.s.n) != NULL;
    if (x.t == JV_DICT) return jx_find(x.u.d, v) != NULL;
    jv l = jx_as_list(R, at, x);
    for (size_t i = 0; i < l.u.l->n; i++)
        if (jx_eq(l.u.l->v[i], v)) return 1;
    return 0;
}

static const test TESTS[] = {
    {"defined", t_defined, 0}, {"undefined", t_undefined, 0}, {"none", t_none, 0}, {"string", t_string, 0},
    {"number", t_number, 0}, {"integer", t_integer, 0}, {"float", t_float, 0}, {"mapping", t_mapping, 0},
    {"iterable", t_iterable, 0}, {"sequence", t_iterable, 0}, {"boolean", t_boolean, 0}, {"true", t_true, 0},
    {"false", t_false, 0}, {"equalto", t_eq, 1}, {"eq", t_eq, 1}, {"sameas", t_sameas, 1}, {"ne", t_ne, 1},
    {"in", t_in, 1}, {"callable", t_callable, 0}, {"odd", t_odd, 0}, {"even", t_even, 0},
    {"divisibleby", t_divisibleby, 1}, {"lower", t_lower, 0}, {"upper", t_upper, 0}, {"gt", t_gt, 1},
    {"lt", t_lt, 1}, {"ge", t_ge, 1}, {"le", t_le, 1}, {"greaterthan", t_gt, 1}, {"lessthan", t_lt, 1},
    {"escaped", t_escaped, 0},
};

static const test *find_test(const char *name) {
    for (size_t i = 0; i < sizeof TESTS / sizeof *TESTS; i++)
        if (!strcmp(TESTS[i].name, name)) return &TESTS[i];
    return NULL;
}

int jx_known_test(const char *name) { return find_test(name) != NULL; }

int jx_test(rt *R, const jnode *at, const char *name, jv v, args *A) {
    const test *t = find_test(name);
    if (!t) jx_fail(R, at, "unknown test '%s'", name);
    jv x = v_undef(NULL);
    if (t->takes_arg) {
        x = jx_arg(A, 0, NULL, v_undef(NULL));
        if (!jx_has_arg(A, 0, NULL)) jx_fail(R, at, "test '%s' needs an argument", name);
    }
    return t->fn(R, at, v, x);
}
