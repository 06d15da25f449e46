/* Jinja evaluation: scopes, attribute / item access and slicing, calls (globals, macros,
 * {% call %} callers, methods), operators, statements, and m3_jinja_render. Every value of
 * a render lives in one arena (freed at the end); runtime errors longjmp to m3_jinja_render
 * with "NAME: line L, column C: message". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja/jinja_rt.h"

static void step(rt *R, const jnode *at) {
    if (++R->steps > R->max_steps) jx_fail(R, at, "template ran more than %zu steps", R->max_steps);
}

static void emit(rt *R, const char *s, size_t n) {
    sb b = {R->out, R->on, R->ocap};
    jx_put(R, &b, s, n);
    R->out = b.p;
    R->on = b.n;
    R->ocap = b.cap;
}

/* ---- scopes */
static jv *lookup(frame *f, const char *name) {
    size_t n = strlen(name);
    for (; f; f = f->parent) {
        jv *v = jx_finds(&f->vars, name, n);
        if (v) return v;
    }
    return NULL;
}
static frame *new_frame(rt *R, frame *parent) {
    frame *f = ja_alloc(&R->A, sizeof(frame));
    f->parent = parent;
    return f;
}

static jv eval(rt *R, frame *f, const jnode *n);
static void exec_body(rt *R, frame *f, const jnode *b);

/* ---- attribute / item access */
static int in_set(const char *const *set, const char *s) {
    for (; *set; set++)
        if (!strcmp(*set, s)) return 1;
    return 0;
}
static jv method(rt *R, jv self, const char *name) {
    jv m = v_func(R, F_METHOD, name);
    m.u.fn->self = self;
    return m;
}

jv jx_get_attr(rt *R, jv obj, const char *name) {
    if (obj.t == JV_DICT) {
        if (!obj.u.d->ns && jx_has_dict_method(name)) return method(R, obj, name);
        jv *v = jx_finds(obj.u.d, name, strlen(name));
        return v ? *v : v_undef(name);
    }
    if (obj.t == JV_STR && jx_has_str_method(name)) return method(R, obj, name);
    return v_undef(name);
}

jv jx_get_item(rt *R, const jnode *at, jv obj, jv key) {
    if (obj.t == JV_DICT) {
        jv *v = jx_find(obj.u.d, key);
        if (v) return *v;
        if (key.t == JV_STR && !obj.u.d->ns && jx_has_dict_method(key.u.s.p) && strlen(key.u.s.p) == key.u.s.n) return method(R, obj, key.u.s.p);
        return v_undef(NULL);
    }
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t i = inum(key);
        if (obj.t == JV_LIST) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0) i += n;
            return i >= 0 && i < n ? obj.u.l->v[i] : v_undef(NULL);
        }
        size_t cnt;
        size_t *o = jx_u8_offsets(R, obj.u.s.p, obj.u.s.n, &cnt);
        if (i < 0) i += (int64_t)cnt;
        if (i < 0 || i >= (int64_t)cnt) return v_undef(NULL);
        return v_strn(obj.u.s.p + o[i], o[i + 1] - o[i]);
    }
    if (key.t == JV_STR && obj.t == JV_STR) {
        char nm[32];
        if (key.u.s.n < sizeof nm) {
            memcpy(nm, key.u.s.p, key.u.s.n);
            nm[key.u.s.n] = 0;
            return jx_get_attr(R, obj, ja_strndup(&R->A, nm, key.u.s.n));
        }
    }
    (void)at;
    return v_undef(NULL);
}

static int64_t slice_norm(int64_t i, int64_t n, int step_neg, int is_start, int has) {
    if (!has) return is_start ? (step_neg ? n - 1 : 0) : (step_neg ? -1 : n);
    if (i < 0) { i += n; if (i < 0) i = step_neg ? -1 : 0; }
    else if (i >= n) i = step_neg ? n - 1 : n;
    return i;
}
static jv do_slice(rt *R, const jnode *at, jv obj, jv a, jv b, jv c) {
    int64_t st = 1;
    if (c.t != JV_UNDEF && c.t != JV_NONE) {
        if (c.t != JV_INT) jx_fail(R, at, "slice indices must be integers");
        st = c.u.i;
        if (st == 0) jx_fail(R, at, "slice step cannot be zero");
    }
    int has_a = a.t != JV_UNDEF && a.t != JV_NONE, has_b = b.t != JV_UNDEF && b.t != JV_NONE;
    if ((has_a && a.t != JV_INT && a.t != JV_BOOL) || (has_b && b.t != JV_INT && b.t != JV_BOOL)) jx_fail(R, at, "slice indices must be integers");
    size_t cnt;
    size_t *o = NULL;
    if (obj.t == JV_STR) o = jx_u8_offsets(R, obj.u.s.p, obj.u.s.n, &cnt);
    else if (obj.t == JV_LIST) cnt = obj.u.l->n;
    else if (obj.t == JV_UNDEF) return v_undef(NULL);
    else jx_fail(R, at, "'%s' object is not subscriptable", jx_tname(obj));
    int64_t n = (int64_t)cnt;
    int64_t s = slice_norm(has_a ? inum(a) : 0, n, st < 0, 1, has_a);
    int64_t e = slice_norm(has_b ? inum(b) : 0, n, st < 0, 0, has_b);
    if (obj.t == JV_LIST) {
        jv l = v_list(R, 0);
        for (int64_t i = s; st > 0 ? i < e : i > e; i += st) jx_push(R, l.u.l, obj.u.l->v[i]);
        return l;
    }
    sb out = {0};
    if (st == 1) { if (e > s) jx_put(R, &out, obj.u.s.p + o[s], o[e] - o[s]); }
    else for (int64_t i = s; st > 0 ? i < e : i > e; i += st) jx_put(R, &out, obj.u.s.p + o[i], o[i + 1] - o[i]);
    return sb_val(&out);
}

/* ---- arguments */
static void eval_args(rt *R, frame *f, const jnode *n, args *A, jv *first) {
    int extra = first ? 1 : 0;
    A->npos = n->nlist + extra;
    A->pos = ja_alloc(&R->A, (size_t)(A->npos + 1) * sizeof(jv));
    if (first) A->pos[0] = *first;
    for (int i = 0; i < n->nlist; i++) A->pos[i + extra] = eval(R, f, n->list[i]);
    A->nkw = n->nlist2;
    A->names = n->names;
    A->kw = ja_alloc(&R->A, (size_t)(A->nkw + 1) * sizeof(jv));
    for (int i = 0; i < n->nlist2; i++) A->kw[i] = eval(R, f, n->list2[i]);
}

/* ---- calls */
static jv range_fn(rt *R, const jnode *at, args *A) {
    int64_t a = 0, b, s = 1;
    if (A->npos == 1) b = inum(A->pos[0]);
    else if (A->npos >= 2) { a = inum(A->pos[0]); b = inum(A->pos[1]); if (A->npos > 2) s = inum(A->pos[2]); }
    else jx_fail(R, at, "range expected at least 1 argument");
    for (int i = 0; i < A->npos; i++)
        if (A->pos[i].t != JV_INT && A->pos[i].t != JV_BOOL) jx_fail(R, at, "range: arguments must be integers");
    if (s == 0) jx_fail(R, at, "range() arg 3 must not be zero");
    double cnt = s > 0 ? ceil(((double)b - (double)a) / (double)s) : ceil(((double)a - (double)b) / (double)-s);
    if (cnt > 1e7) jx_fail(R, at, "range too large (%.0f items)", cnt);
    jv l = v_list(R, cnt > 0 ? (size_t)cnt : 0);
    for (int64_t i = a; s > 0 ? i < b : i > b; i += s) jx_push(R, l.u.l, v_int(i));
    return l;
}

static jv capture(rt *R, frame *f, const jnode *body) {
    char *so = R->out;
    size_t sn = R->on, sc = R->ocap;
    R->out = NULL;
    R->on = R->ocap = 0;
    exec_body(R, f, body);
    jv r = R->out ? v_strn(R->out, R->on) : v_strn("", 0);
    R->out = so;
    R->on = sn;
    R->ocap = sc;
    return r;
}

/* Macros and {% call %} callers: def->names are the parameters, def->list2 the defaults
 * (evaluated at call time in the macro's scope), def->c the body. */
static jv call_macro(rt *R, const jnode *at, jfunc *m, args *A, jv caller) {
    const jnode *def = m->def;
    frame *fr = new_frame(R, m->closure);
    int np = def->nnames;
    jv varargs = v_list(R, 0), kwargs = v_dict(R);
    char *set = ja_alloc(&R->A, (size_t)np + 1);
    for (int i = 0; i < A->npos; i++) {
        if (i < np) { jx_sets(R, &fr->vars, def->names[i], A->pos[i]); set[i] = 1; }
        else jx_push(R, varargs.u.l, A->pos[i]);
    }
    for (int k = 0; k < A->nkw; k++) {
        int hit = 0;
        for (int i = 0; i < np && !hit; i++)
            if (!strcmp(def->names[i], A->names[k])) {
                if (set[i]) jx_fail(R, at, "macro '%s' got multiple values for argument '%s'", m->name, A->names[k]);
                jx_sets(R, &fr->vars, def->names[i], A->kw[k]);
                set[i] = hit = 1;
            }
        if (!hit) jx_sets(R, kwargs.u.d, A->names[k], A->kw[k]);
    }
    jx_sets(R, &fr->vars, "varargs", varargs);
    jx_sets(R, &fr->vars, "kwargs", kwargs);
    if (caller.t == JV_FUNC) jx_sets(R, &fr->vars, "caller", caller);
    for (int i = 0; i < np; i++)
        if (!set[i]) jx_sets(R, &fr->vars, def->names[i], def->list2[i] ? eval(R, fr, def->list2[i]) : v_undef(def->names[i]));
    int ctl = R->ctl;
    jv r = capture(R, fr, def->c);
    R->ctl = ctl;
    return r;
}

static jv call_value(rt *R, frame *f, const jnode *at, jv fnv, args *A) {
    if (fnv.t == JV_UNDEF) jx_fail(R, at, "'%s' is undefined", fnv.u.s.p ? fnv.u.s.p : "value");
    if (fnv.t != JV_FUNC) jx_fail(R, at, "'%s' object is not callable", jx_tname(fnv));
    jfunc *fn = fnv.u.fn;
    switch (fn->kind) {
    case F_METHOD:
        return jx_call_method(R, at, fn->self, fn->name, A);
    case F_MACRO:
    case F_CALLER: return call_macro(R, at, fn, A, v_undef(NULL));
    case F_CYCLE:
        if (!A->npos) jx_fail(R, at, "no items for cycling given");
        return A->pos[inum(fn->self) % A->npos];
    default: break;
    }
    const char *g = fn->name;
    if (!strcmp(g, "range")) return range_fn(R, at, A);
    if (!strcmp(g, "namespace") || !strcmp(g, "dict")) {
        jv d = v_dict(R);
        d.u.d->ns = g[0] == 'n';
        for (int i = 0; i < A->npos; i++) {
            if (A->pos[i].t != JV_DICT) jx_fail(R, at, "%s: positional argument must be a mapping", g);
            for (size_t k = 0; k < A->pos[i].u.d->n; k++) jx_set(R, d.u.d, A->pos[i].u.d->k[k], A->pos[i].u.d->v[k]);
        }
        for (int k = 0; k < A->nkw; k++) jx_sets(R, d.u.d, A->names[k], A->kw[k]);
        return d;
    }
    if (!strcmp(g, "raise_exception")) {
        jv m = jx_to_str(R, jx_arg(A, 0, "message", v_strn("", 0)));
        jx_fail(R, at, "raise_exception: %.*s", (int)(m.u.s.n > 600 ? 600 : m.u.s.n), m.u.s.p);
    }
    if (!strcmp(g, "strftime_now")) {
        jv fmt = jx_need_str(R, at, jx_arg(A, 0, "format", v_undef(NULL)), "strftime_now");
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char buf[512];
        char *fz = ja_strndup(&R->A, fmt.u.s.p, fmt.u.s.n > 200 ? 200 : fmt.u.s.n);
        size_t n = strftime(buf, sizeof buf, fz, &tmv);
        return v_strdup(R, buf, n);
    }
    (void)f;
    jx_fail(R, at, "'%s' is not callable", g);
}

static const char *const globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};

static jv arith(rt *R, const jnode *at, int op, jv a, jv b) {
    static const char *ops[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (a.t == JV_UNDEF || b.t == JV_UNDEF) {
        jv u = a.t == JV_UNDEF ? a : b;
        jx_fail(R, at, "'%s' is undefined", u.u.s.p ? u.u.s.p : "value");
    }
    if (is_num(a) && is_num(b)) {
        int fl = a.t == JV_FLOAT || b.t == JV_FLOAT || op == OP_DIV;
        if (op == OP_POW && !fl && inum(b) < 0) fl = 1;
        if (fl) {
            double x = num(a), y = num(b);
            switch (op) {
            case OP_ADD: return v_float(x + y);
            case OP_SUB: return v_float(x - y);
            case OP_MUL: return v_float(x * y);
            case OP_DIV: if (y == 0) jx_fail(R, at, "division by zero"); return v_float(x / y);
            case OP_FDIV: if (y == 0) jx_fail(R, at, "float floor division by zero"); return v_float(floor(x / y));
            case OP_MOD: {
                if (y == 0) jx_fail(R, at, "float modulo");
                double r = fmod(x, y);
                if (r != 0 && ((r < 0) != (y < 0))) r += y;
                return v_float(r);
            }
            case OP_POW: return v_float(pow(x, y));
            }
        }
        int64_t x = inum(a), y = inum(b), r = 0;
        int ovf = 0;
        switch (op) {
        case OP_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
        case OP_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
        case OP_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
        case OP_FDIV:
        case OP_MOD:
            if (y == 0) jx_fail(R, at, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) { ovf = 1; break; }
            r = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) r--;
            if (op == OP_MOD) r = x - r * y;
            break;
        case OP_POW:
            r = 1;
            for (int64_t i = 0; i < y && !ovf; i++) ovf = __builtin_mul_overflow(r, x, &r);
            break;
        }
        if (ovf) jx_fail(R, at, "integer overflow in '%s'", ops[op]);
        return v_int(r);
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        sb s = {0};
        jx_put(R, &s, a.u.s.p, a.u.s.n);
        jx_put(R, &s, b.u.s.p, b.u.s.n);
        return sb_val(&s);
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST) {
        jv l = v_list(R, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++) jx_push(R, l.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) jx_push(R, l.u.l, b.u.l->v[i]);
        return l;
    }
    if (op == OP_MUL && (a.t == JV_STR || a.t == JV_LIST || b.t == JV_STR || b.t == JV_LIST)) {
        jv seq = (a.t == JV_STR || a.t == JV_LIST) ? a : b, cnt = seq.u.l == a.u.l && seq.t == a.t ? b : a;
        if (cnt.t == JV_INT || cnt.t == JV_BOOL) {
            int64_t k = inum(cnt);
            if (k < 0) k = 0;
            size_t unit = seq.t == JV_STR ? seq.u.s.n : seq.u.l->n * sizeof(jv);
            if (unit && (uint64_t)k > R->max_out / unit) jx_fail(R, at, "repetition too large");
            if (seq.t == JV_STR) {
                sb s = {0};
                for (int64_t i = 0; i < k; i++) jx_put(R, &s, seq.u.s.p, seq.u.s.n);
                return sb_val(&s);
            }
            jv l = v_list(R, 0);
            for (int64_t i = 0; i < k; i++)
                for (size_t j = 0; j < seq.u.l->n; j++) jx_push(R, l.u.l, seq.u.l->v[j]);
            return l;
        }
    }
    jx_fail(R, at, "unsupported operand type(s) for %s: '%s' and '%s'", ops[op], jx_tname(a), jx_tname(b));
}

static int contains(rt *R, const jnode *at, jv x, jv c) {
    if (c.t == JV_STR) {
        if (x.t != JV_STR) jx_fail(R, at, "'in <string>' requires string as left operand, not %s", jx_tname(x));
        return jx_memfind(c.u.s.p, c.u.s.n, x.u.s.p, x.u.s.n) != NULL;
    }
    if (c.t == JV_DICT) return jx_find(c.u.d, x) != NULL;
    if (c.t == JV_LIST) {
        for (size_t i = 0; i < c.u.l->n; i++)
            if (jx_eq(c.u.l->v[i], x)) return 1;
        return 0;
    }
    if (c.t == JV_UNDEF) return 0;
    jx_fail(R, at, "argument of type '%s' is not iterable", jx_tname(c));
}

static jv eval(rt *R, frame *f, const jnode *n) {
    step(R, n);
    if (++R->depth > R->max_depth) jx_fail(R, n, "template evaluation nested deeper than %d", R->max_depth);
    jv r;
    switch (n->k) {
    case N_LIT: r = n->lit; break;
    case N_NAME: {
        jv *v = lookup(f, n->str);
        if (v) r = *v;
        else if (in_set(globals, n->str)) r = v_func(R, F_GLOBAL, n->str);
        else r = v_undef(n->str);
        break;
    }
    case N_ATTR: {
        jv o = eval(R, f, n->a);
        r = o.t == JV_UNDEF ? v_undef(n->str) : jx_get_attr(R, o, n->str);
        break;
    }
    case N_ITEM: {
        jv o = eval(R, f, n->a), k = eval(R, f, n->b);
        r = jx_get_item(R, n, o, k);
        break;
    }
    case N_SLICE: {
        jv o = eval(R, f, n->a);
        jv a = n->b ? eval(R, f, n->b) : v_none(), b = n->c ? eval(R, f, n->c) : v_none(), c = n->d ? eval(R, f, n->d) : v_none();
        r = do_slice(R, n, o, a, b, c);
        break;
    }
    case N_CALL: {
        jv fnv = eval(R, f, n->a);
        args A;
        eval_args(R, f, n, &A, NULL);
        r = call_value(R, f, n, fnv, &A);
        break;
    }
    case N_FILTER: {
        jv v = eval(R, f, n->a);
        args A;
        eval_args(R, f, n, &A, NULL);
        r = jx_filter(R, n, n->str, v, &A);
        break;
    }
    case N_TEST: {
        jv v = eval(R, f, n->a);
        args A;
        eval_args(R, f, n, &A, NULL);
        r = v_bool(jx_test(R, n, n->str, v, &A) != n->op);
        break;
    }
    case N_NOT: r = v_bool(!jx_truthy(eval(R, f, n->a))); break;
    case N_NEG:
    case N_POS: {
        jv v = eval(R, f, n->a);
        if (!is_num(v)) jx_fail(R, n, "bad operand type for unary %c: '%s'", n->k == N_NEG ? '-' : '+', jx_tname(v));
        if (n->k == N_POS) r = v.t == JV_BOOL ? v_int(v.u.b) : v;
        else if (v.t == JV_FLOAT) r = v_float(-v.u.f);
        else {
            if (inum(v) == INT64_MIN) jx_fail(R, n, "integer overflow");
            r = v_int(-inum(v));
        }
        break;
    }
    case N_AND: {
        jv a = eval(R, f, n->a);
        r = jx_truthy(a) ? eval(R, f, n->b) : a;
        break;
    }
    case N_OR: {
        jv a = eval(R, f, n->a);
        r = jx_truthy(a) ? a : eval(R, f, n->b);
        break;
    }
    case N_TERN:
        if (jx_truthy(eval(R, f, n->b))) r = eval(R, f, n->a);
        else r = n->c ? eval(R, f, n->c) : v_undef(NULL);
        break;
    case N_LISTLIT:
    case N_TUPLELIT:
        r = v_list(R, (size_t)n->nlist);
        for (int i = 0; i < n->nlist; i++) jx_push(R, r.u.l, eval(R, f, n->list[i]));
        break;
    case N_DICTLIT:
        r = v_dict(R);
        for (int i = 0; i < n->nlist; i++) {
            jv k = eval(R, f, n->list[i]);
            if (k.t == JV_LIST || k.t == JV_DICT) jx_fail(R, n->list[i], "unhashable type: '%s'", jx_tname(k));
            jx_set(R, r.u.d, k, eval(R, f, n->list2[i]));
        }
        break;
    case N_BIN: {
        jv a = eval(R, f, n->a), b = eval(R, f, n->b);
        switch (n->op) {
        case OP_CAT: {
            sb s = {0};
            jx_to_str_sb(R, &s, a, 0);
            jx_to_str_sb(R, &s, b, 0);
            r = sb_val(&s);
            break;
        }
        case OP_EQ: r = v_bool(jx_eq(a, b)); break;
        case OP_NE: r = v_bool(!jx_eq(a, b)); break;
        case OP_LT: r = v_bool(jx_cmp(R, n, a, b) < 0); break;
        case OP_LE: r = v_bool(jx_cmp(R, n, a, b) <= 0); break;
        case OP_GT: r = v_bool(jx_cmp(R, n, a, b) > 0); break;
        case OP_GE: r = v_bool(jx_cmp(R, n, a, b) >= 0); break;
        case OP_IN: r = v_bool(contains(R, n, a, b)); break;
        case OP_NOTIN: r = v_bool(!contains(R, n, a, b)); break;
        default: r = arith(R, n, n->op, a, b); break;
        }
        break;
    }
    default: jx_fail(R, n, "internal: not an expression");
    }
    R->depth--;
    return r;
}

static void unpack(rt *R, const jnode *at, frame *f, const char **names, int nn, jv v) {
    if (nn == 1) { jx_sets(R, &f->vars, names[0], v); return; }
    jv l = jx_as_list(R, at, v);
    if ((int)l.u.l->n != nn)
        jx_fail(R, at, "%s values to unpack (expected %d, got %zu)", (int)l.u.l->n > nn ? "too many" : "not enough", nn, l.u.l->n);
    for (int i = 0; i < nn; i++) jx_sets(R, &f->vars, names[i], l.u.l->v[i]);
}

static void exec_for(rt *R, frame *f, const jnode *n) {
    jv it = eval(R, f, n->a);
    jv l = jx_as_list(R, n->a, it);
    if (n->b) { /* {% for x in xs if cond %}: filter first (it defines loop.length) */
        jv kept = v_list(R, 0);
        for (size_t i = 0; i < l.u.l->n; i++) {
            frame *tf = new_frame(R, f);
            unpack(R, n, tf, n->names, n->nnames, l.u.l->v[i]);
            if (jx_truthy(eval(R, tf, n->b))) jx_push(R, kept.u.l, l.u.l->v[i]);
        }
        l = kept;
    }
    size_t len = l.u.l->n;
    if (len == 0) {
        if (n->d) exec_body(R, f, n->d);
        return;
    }
    for (size_t i = 0; i < len; i++) {
        step(R, n);
        frame *lf = new_frame(R, f);
        jv loop = v_dict(R);
        jdict *d = loop.u.d;
        jx_sets(R, d, "index", v_int((int64_t)i + 1));
        jx_sets(R, d, "index0", v_int((int64_t)i));
        jx_sets(R, d, "revindex", v_int((int64_t)(len - i)));
        jx_sets(R, d, "revindex0", v_int((int64_t)(len - i - 1)));
        jx_sets(R, d, "first", v_bool(i == 0));
        jx_sets(R, d, "last", v_bool(i == len - 1));
        jx_sets(R, d, "length", v_int((int64_t)len));
        jx_sets(R, d, "depth", v_int(1));
        jx_sets(R, d, "depth0", v_int(0));
        if (i > 0) jx_sets(R, d, "previtem", l.u.l->v[i - 1]);
        if (i + 1 < len) jx_sets(R, d, "nextitem", l.u.l->v[i + 1]);
        jv cyc = v_func(R, F_CYCLE, "cycle");
        cyc.u.fn->self = v_int((int64_t)i);
        jx_sets(R, d, "cycle", cyc);
        jx_sets(R, &lf->vars, "loop", loop);
        unpack(R, n, lf, n->names, n->nnames, l.u.l->v[i]);
        exec_body(R, lf, n->c);
        if (R->ctl == 1) { R->ctl = 0; break; }
        R->ctl = 0;
    }
}

static jv apply_filters(rt *R, frame *f, const jnode *const *fl, int nf, jv v) {
    for (int i = 0; i < nf; i++) {
        args A;
        eval_args(R, f, fl[i], &A, NULL);
        v = jx_filter(R, fl[i], fl[i]->str, v, &A);
    }
    return v;
}

static void exec_stmt(rt *R, frame *f, const jnode *n) {
    step(R, n);
    switch (n->k) {
    case N_BODY: exec_body(R, f, n); break;
    case N_TEXT: emit(R, n->str, n->slen); break;
    case N_OUT: {
        jv v = eval(R, f, n->a);
        if (v.t == JV_STR) emit(R, v.u.s.p, v.u.s.n);
        else {
            sb b = {0};
            jx_to_str_sb(R, &b, v, 0);
            emit(R, b.p ? b.p : "", b.n);
        }
        break;
    }
    case N_IF:
        for (int i = 0; i < n->nlist; i++)
            if (jx_truthy(eval(R, f, n->list[i]))) { exec_body(R, f, n->list2[i]); return; }
        if (n->c) exec_body(R, f, n->c);
        break;
    case N_FOR: exec_for(R, f, n); break;
    case N_SET: {
        jv v = eval(R, f, n->a);
        if (n->c) {
            jv *ns = lookup(f, n->str);
            if (!ns || ns->t != JV_DICT || !ns->u.d->ns) jx_fail(R, n, "cannot assign attribute on non-namespace object '%s'", n->str);
            jx_sets(R, ns->u.d, n->c->str, v);
        } else unpack(R, n, f, n->names, n->nnames, v);
        break;
    }
    case N_SETBLOCK: {
        jv v = capture(R, f, n->a);
        v = apply_filters(R, f, (const jnode *const *)n->list, n->nlist, v);
        jx_sets(R, &f->vars, n->str, v);
        break;
    }
    case N_MACRO: {
        jv m = v_func(R, F_MACRO, n->str);
        m.u.fn->def = n;
        m.u.fn->closure = f;
        jx_sets(R, &f->vars, n->str, m);
        break;
    }
    case N_CALLBLOCK: {
        jv caller = v_func(R, F_CALLER, "caller");
        caller.u.fn->def = n;
        caller.u.fn->closure = f;
        const jnode *call = n->a;
        jv fnv = eval(R, f, call->a);
        args A;
        eval_args(R, f, call, &A, NULL);
        if (fnv.t != JV_FUNC || fnv.u.fn->kind != F_MACRO) jx_fail(R, n, "{%% call %%} needs a macro");
        jv out = call_macro(R, n, fnv.u.fn, &A, caller);
        emit(R, out.u.s.p, out.u.s.n);
        break;
    }
    case N_FILTERBLOCK: {
        jv v = capture(R, f, n->a);
        v = jx_to_str(R, apply_filters(R, f, (const jnode *const *)n->list, n->nlist, v));
        emit(R, v.u.s.p, v.u.s.n);
        break;
    }
    case N_BREAK: R->ctl = 1; break;
    case N_CONTINUE: R->ctl = 2; break;
    case N_DO: eval(R, f, n->a); break;
    default: jx_fail(R, n, "internal: not a statement");
    }
}

static void exec_body(rt *R, frame *f, const jnode *b) {
    if (++R->depth > R->max_depth) jx_fail(R, b, "template evaluation nested deeper than %d", R->max_depth);
    for (int i = 0; i < b->nlist && !R->ctl; i++) exec_stmt(R, f, b->list[i]);
    R->depth--;
}

char *m3_jinja_render(const m3_jinja *t, const json_t *ctx, const m3_jinja_limits *limits, size_t *out_len, m3_err *err) {
    if (!t) { m3_errf(err, "template: NULL"); return NULL; }
    if (ctx && !json_is_object(ctx)) { m3_errf(err, "%s: render context must be a JSON object", t->name); return NULL; }
    rt *R = calloc(1, sizeof *R);
    if (!R) { m3_errf(err, "%s: out of memory", t->name); return NULL; }
    R->err = err;
    R->name = t->name;
    R->max_out = limits && limits->max_output ? limits->max_output : (size_t)64 << 20;
    R->max_steps = limits && limits->max_steps ? limits->max_steps : 50000000;
    R->max_depth = limits && limits->max_depth ? limits->max_depth : 600;
    R->A.limit = limits && limits->max_memory ? limits->max_memory : (size_t)1 << 30;
    R->A.jb = &R->jb;
    R->A.err = err;
    R->A.name = t->name;
    char *res = NULL;
    if (setjmp(R->jb) == 0) {
        frame *root = new_frame(R, NULL);
        if (ctx) {
            const char *k;
            json_t *x;
            json_object_foreach((json_t *)ctx, k, x) jx_sets(R, &root->vars, k, jx_from_json(R, x, 0));
        }
        frame *tf = new_frame(R, root);
        exec_body(R, tf, t->root);
        res = malloc(R->on + 1);
        if (!res) m3_errf(err, "%s: out of memory", t->name);
        else {
            if (R->on) memcpy(res, R->out, R->on);
            res[R->on] = 0;
            if (out_len) *out_len = R->on;
        }
    }
    ja_free_all(&R->A);
    free(R);
    return res;
}
