/* The Jinja parser: tokens (lexer.c) -> AST (jinja_int.h), by recursive descent with
 * jinja2's operator precedence; and m3_jinja_parse / m3_jinja_free. Unknown filters and
 * tests are refused here, with the line and column of their name. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_int.h"

typedef struct parser {
    lexer *L;
    size_t i;
    int depth;
} parser;

static tok *peek(parser *P) { return &P->L->toks[P->i]; }
static tok *next(parser *P) {
    tok *k = &P->L->toks[P->i];
    if (k->t != T_EOF) P->i++;
    return k;
}

static const char *tokdesc(tok *k, char *buf, size_t n) {
    switch (k->t) {
    case T_TEXT: return "template text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "end of print statement '}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "end of statement block '%}'";
    case T_EOF: return "end of template";
    case T_STRING: return "string literal";
    case T_INT: case T_FLOAT: return "number";
    default: snprintf(buf, n, "'%.60s'", k->s); return buf;
    }
}

static void pfail(parser *P, tok *k, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
static void pfail(parser *P, tok *k, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    m3_errf(P->L->err, "%s: line %d, column %d: %s", P->L->name, k->line, k->col, msg);
    longjmp(*P->L->jb, 1);
}

static void unexpected(parser *P, tok *k, const char *expected) __attribute__((noreturn));
static void unexpected(parser *P, tok *k, const char *expected) {
    char b[80];
    pfail(P, k, "expected %s, got %s", expected, tokdesc(k, b, sizeof b));
}

static int is_op(tok *k, const char *op) { return k->t == T_OP && !strcmp(k->s, op); }
static int is_name(tok *k, const char *nm) { return k->t == T_NAME && !strcmp(k->s, nm); }
static void expect_op(parser *P, const char *op) {
    tok *k = peek(P);
    if (!is_op(k, op)) {
        char e[16];
        snprintf(e, sizeof e, "'%s'", op);
        unexpected(P, k, e);
    }
    next(P);
}
static const char *expect_name(parser *P) {
    tok *k = peek(P);
    if (k->t != T_NAME) unexpected(P, k, "a name");
    next(P);
    return k->s;
}

static jnode *node(parser *P, int kind, tok *at) {
    jnode *n = ja_alloc(P->L->A, sizeof(jnode));
    n->k = kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* growable pointer arrays in the arena */
typedef struct vec { void **v; int n, cap; } vec;
static void vpush(parser *P, vec *v, void *x) {
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 4;
        void **nv = ja_alloc(P->L->A, (size_t)nc * sizeof(void *));
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof(void *));
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static jnode *expr(parser *P);
static jnode *expr_noternary(parser *P);
static jnode *or_expr(parser *P);
static jnode *unary(parser *P, int with_filter);

static void enter(parser *P, tok *k) {
    if (++P->depth > 200) pfail(P, k, "template nested too deeply");
}

/* (args) after '(' has been consumed: positional args in list, kwargs in names/list2 */
static void call_args(parser *P, jnode *n) {
    vec pos = {0}, kv = {0}, kn = {0};
    while (!is_op(peek(P), ")")) {
        if (pos.n + kv.n) expect_op(P, ",");
        if (is_op(peek(P), ")")) break;
        tok *k = peek(P);
        if (k->t == T_NAME && is_op(&P->L->toks[P->i + 1], "=")) {
            next(P);
            next(P);
            vpush(P, &kn, (void *)k->s);
            vpush(P, &kv, expr(P));
        } else {
            if (kv.n) pfail(P, k, "positional argument after keyword argument");
            vpush(P, &pos, expr(P));
        }
    }
    next(P);
    n->list = (jnode **)pos.v;
    n->nlist = pos.n;
    n->list2 = (jnode **)kv.v;
    n->nlist2 = kv.n;
    n->names = (const char **)kn.v;
    n->nnames = kn.n;
}

static jnode *primary(parser *P) {
    tok *k = peek(P);
    enter(P, k);
    jnode *n;
    switch (k->t) {
    case T_NAME:
        next(P);
        n = node(P, N_LIT, k);
        if (!strcmp(k->s, "true") || !strcmp(k->s, "True")) { n->lit.t = JV_BOOL; n->lit.u.b = 1; }
        else if (!strcmp(k->s, "false") || !strcmp(k->s, "False")) { n->lit.t = JV_BOOL; n->lit.u.b = 0; }
        else if (!strcmp(k->s, "none") || !strcmp(k->s, "None")) n->lit.t = JV_NONE;
        else { n->k = N_NAME; n->str = k->s; }
        break;
    case T_STRING: {
        next(P);
        n = node(P, N_LIT, k);
        /* adjacent literals concatenate */
        size_t tot = k->n;
        size_t j = P->i;
        while (P->L->toks[j].t == T_STRING) tot += P->L->toks[j++].n;
        char *s = ja_alloc(P->L->A, tot + 1);
        memcpy(s, k->s, k->n);
        size_t o = k->n;
        while (peek(P)->t == T_STRING) {
            tok *q = next(P);
            memcpy(s + o, q->s, q->n);
            o += q->n;
        }
        n->lit.t = JV_STR;
        n->lit.u.s.p = s;
        n->lit.u.s.n = tot;
        break;
    }
    case T_INT:
        next(P);
        n = node(P, N_LIT, k);
        n->lit.t = JV_INT;
        n->lit.u.i = k->i;
        break;
    case T_FLOAT:
        next(P);
        n = node(P, N_LIT, k);
        n->lit.t = JV_FLOAT;
        n->lit.u.f = k->f;
        break;
    case T_OP:
        if (is_op(k, "(")) {
            next(P);
            if (is_op(peek(P), ")")) { next(P); n = node(P, N_TUPLELIT, k); break; }
            jnode *e = expr(P);
            if (is_op(peek(P), ",")) {
                vec items = {0};
                vpush(P, &items, e);
                while (is_op(peek(P), ",")) {
                    next(P);
                    if (is_op(peek(P), ")")) break;
                    vpush(P, &items, expr(P));
                }
                n = node(P, N_TUPLELIT, k);
                n->list = (jnode **)items.v;
                n->nlist = items.n;
            } else n = e;
            expect_op(P, ")");
            break;
        }
        if (is_op(k, "[")) {
            next(P);
            vec items = {0};
            while (!is_op(peek(P), "]")) {
                if (items.n) expect_op(P, ",");
                if (is_op(peek(P), "]")) break;
                vpush(P, &items, expr(P));
            }
            next(P);
            n = node(P, N_LISTLIT, k);
            n->list = (jnode **)items.v;
            n->nlist = items.n;
            break;
        }
        if (is_op(k, "{")) {
            next(P);
            vec ks = {0}, vs = {0};
            while (!is_op(peek(P), "}")) {
                if (ks.n) expect_op(P, ",");
                if (is_op(peek(P), "}")) break;
                vpush(P, &ks, expr(P));
                expect_op(P, ":");
                vpush(P, &vs, expr(P));
            }
            next(P);
            n = node(P, N_DICTLIT, k);
            n->list = (jnode **)ks.v;
            n->nlist = ks.n;
            n->list2 = (jnode **)vs.v;
            n->nlist2 = vs.n;
            break;
        }
        /* fallthrough */
    default:
        unexpected(P, k, "an expression");
    }
    P->depth--;
    return n;
}

static jnode *postfix(parser *P, jnode *n) {
    for (;;) {
        tok *k = peek(P);
        if (is_op(k, ".")) {
            next(P);
            tok *a = peek(P);
            if (a->t == T_NAME) {
                next(P);
                jnode *m = node(P, N_ATTR, a);
                m->a = n;
                m->str = a->s;
                n = m;
            } else if (a->t == T_INT) {
                next(P);
                jnode *m = node(P, N_ITEM, a);
                m->a = n;
                m->b = node(P, N_LIT, a);
                m->b->lit.t = JV_INT;
                m->b->lit.u.i = a->i;
                n = m;
            } else unexpected(P, a, "an attribute name");
        } else if (is_op(k, "[")) {
            next(P);
            jnode *parts[3] = {0};
            int ncolon = 0;
            for (;;) {
                tok *q = peek(P);
                if (is_op(q, "]")) break;
                if (is_op(q, ":")) {
                    if (++ncolon > 2) unexpected(P, q, "']'");
                    next(P);
                    continue;
                }
                if (parts[ncolon]) unexpected(P, q, "']' or ':'");
                parts[ncolon] = expr(P);
            }
            next(P);
            if (ncolon == 0) {
                if (!parts[0]) unexpected(P, k, "a subscript");
                jnode *m = node(P, N_ITEM, k);
                m->a = n;
                m->b = parts[0];
                n = m;
            } else {
                jnode *m = node(P, N_SLICE, k);
                m->a = n;
                m->b = parts[0];
                m->c = parts[1];
                m->d = parts[2];
                n = m;
            }
        } else if (is_op(k, "(")) {
            next(P);
            jnode *m = node(P, N_CALL, k);
            m->line = n->line; /* errors of a call point at the callee */
            m->col = n->col;
            m->a = n;
            call_args(P, m);
            n = m;
        } else return n;
    }
}

static jnode *filters_and_tests(parser *P, jnode *n) {
    for (;;) {
        tok *k = peek(P);
        if (is_op(k, "|")) {
            next(P);
            tok *nt = peek(P);
            const char *name = expect_name(P);
            if (!jx_known_filter(name)) pfail(P, nt, "unknown filter '%s'", name);
            jnode *m = node(P, N_FILTER, nt);
            m->a = n;
            m->str = name;
            if (is_op(peek(P), "(")) { next(P); call_args(P, m); }
            n = m;
        } else if (is_name(k, "is")) {
            next(P);
            int neg = 0;
            if (is_name(peek(P), "not")) { next(P); neg = 1; }
            tok *nt = peek(P);
            const char *name = expect_name(P);
            if (!jx_known_test(name)) pfail(P, nt, "unknown test '%s'", name);
            jnode *m = node(P, N_TEST, nt);
            m->a = n;
            m->str = name;
            m->op = neg;
            tok *q = peek(P);
            if (is_op(q, "(")) { next(P); call_args(P, m); }
            else if ((q->t == T_NAME && strcmp(q->s, "else") && strcmp(q->s, "or") && strcmp(q->s, "and") &&
                      strcmp(q->s, "if") && strcmp(q->s, "is") && strcmp(q->s, "in") && strcmp(q->s, "not")) ||
                     q->t == T_STRING || q->t == T_INT || q->t == T_FLOAT || is_op(q, "[") || is_op(q, "{")) {
                jnode *arg = postfix(P, primary(P));
                m->list = ja_alloc(P->L->A, sizeof(jnode *));
                m->list[0] = arg;
                m->nlist = 1;
            }
            n = m;
        } else return n;
    }
}

static jnode *unary(parser *P, int with_filter) {
    tok *k = peek(P);
    enter(P, k);
    jnode *n;
    if (is_op(k, "-") || is_op(k, "+")) {
        next(P);
        n = node(P, k->s[0] == '-' ? N_NEG : N_POS, k);
        n->a = unary(P, 0);
    } else n = postfix(P, primary(P));
    if (with_filter) n = filters_and_tests(P, n);
    P->depth--;
    return n;
}

static jnode *binop(parser *P, tok *k, int op, jnode *a, jnode *b) {
    jnode *n = node(P, N_BIN, k);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *pow_expr(parser *P) {
    jnode *n = unary(P, 1);
    while (is_op(peek(P), "**")) {
        tok *k = next(P);
        n = binop(P, k, OP_POW, n, unary(P, 1));
    }
    return n;
}
static jnode *math2(parser *P) {
    jnode *n = pow_expr(P);
    for (;;) {
        tok *k = peek(P);
        int op = is_op(k, "*") ? OP_MUL : is_op(k, "/") ? OP_DIV : is_op(k, "//") ? OP_FDIV : is_op(k, "%") ? OP_MOD : 0;
        if (!op) return n;
        next(P);
        n = binop(P, k, op, n, pow_expr(P));
    }
}
static jnode *concat(parser *P) {
    jnode *n = math2(P);
    while (is_op(peek(P), "~")) {
        tok *k = next(P);
        n = binop(P, k, OP_CAT, n, math2(P));
    }
    return n;
}
static jnode *math1(parser *P) {
    jnode *n = concat(P);
    for (;;) {
        tok *k = peek(P);
        int op = is_op(k, "+") ? OP_ADD : is_op(k, "-") ? OP_SUB : 0;
        if (!op) return n;
        next(P);
        n = binop(P, k, op, n, concat(P));
    }
}
static jnode *compare(parser *P) {
    jnode *n = math1(P);
    for (;;) {
        tok *k = peek(P);
        int op = 0;
        if (is_op(k, "==")) op = OP_EQ;
        else if (is_op(k, "!=")) op = OP_NE;
        else if (is_op(k, "<")) op = OP_LT;
        else if (is_op(k, "<=")) op = OP_LE;
        else if (is_op(k, ">")) op = OP_GT;
        else if (is_op(k, ">=")) op = OP_GE;
        else if (is_name(k, "in")) op = OP_IN;
        else if (is_name(k, "not") && is_name(&P->L->toks[P->i + 1], "in")) { next(P); op = OP_NOTIN; }
        if (!op) return n;
        next(P);
        n = binop(P, k, op, n, math1(P));
    }
}
static jnode *not_expr(parser *P) {
    tok *k = peek(P);
    if (is_name(k, "not")) {
        next(P);
        enter(P, k);
        jnode *n = node(P, N_NOT, k);
        n->a = not_expr(P);
        P->depth--;
        return n;
    }
    return compare(P);
}
static jnode *and_expr(parser *P) {
    jnode *n = not_expr(P);
    while (is_name(peek(P), "and")) {
        tok *k = next(P);
        jnode *m = node(P, N_AND, k);
        m->a = n;
        m->b = not_expr(P);
        n = m;
    }
    return n;
}
static jnode *or_expr(parser *P) {
    jnode *n = and_expr(P);
    while (is_name(peek(P), "or")) {
        tok *k = next(P);
        jnode *m = node(P, N_OR, k);
        m->a = n;
        m->b = and_expr(P);
        n = m;
    }
    return n;
}
static jnode *expr(parser *P) {
    tok *k0 = peek(P);
    enter(P, k0);
    jnode *n = or_expr(P);
    while (is_name(peek(P), "if")) {
        tok *k = next(P);
        jnode *m = node(P, N_TERN, k);
        m->a = n;
        m->b = or_expr(P);
        if (is_name(peek(P), "else")) { next(P); m->c = expr(P); }
        n = m;
    }
    P->depth--;
    return n;
}
static jnode *expr_noternary(parser *P) { return or_expr(P); }

/* expression or bare tuple (for `set a, b = ...` right-hand sides and `for` iterables) */
static jnode *tuple_expr(parser *P, int allow_ternary) {
    tok *k = peek(P);
    jnode *e = allow_ternary ? expr(P) : expr_noternary(P);
    if (!is_op(peek(P), ",")) return e;
    vec items = {0};
    vpush(P, &items, e);
    while (is_op(peek(P), ",")) {
        next(P);
        tok *q = peek(P);
        if (q->t == T_BLOCK_END || q->t == T_VAR_END || is_name(q, "in")) break;
        vpush(P, &items, allow_ternary ? expr(P) : expr_noternary(P));
    }
    jnode *n = node(P, N_TUPLELIT, k);
    n->list = (jnode **)items.v;
    n->nlist = items.n;
    return n;
}

static void end_block(parser *P) {
    tok *k = peek(P);
    if (k->t != T_BLOCK_END) unexpected(P, k, "end of statement block '%}'");
    next(P);
}

/* Parses statements until a block tag whose name is in ends (NULL-terminated). On return
 * the parser sits on that name (after '{%'); *which gets its index. */
static jnode *body(parser *P, const char *const *ends, int *which, tok *opener, const char *what);

static void targets(parser *P, vec *names) {
    int paren = is_op(peek(P), "(");
    if (paren) next(P);
    for (;;) {
        vpush(P, names, (void *)expect_name(P));
        if (!is_op(peek(P), ",")) break;
        next(P);
        if (paren && is_op(peek(P), ")")) break;
    }
    if (paren) expect_op(P, ")");
}

static void params(parser *P, jnode *n) {
    vec names = {0}, defs = {0};
    expect_op(P, "(");
    while (!is_op(peek(P), ")")) {
        if (names.n) expect_op(P, ",");
        if (is_op(peek(P), ")")) break;
        vpush(P, &names, (void *)expect_name(P));
        if (is_op(peek(P), "=")) { next(P); vpush(P, &defs, expr(P)); }
        else vpush(P, &defs, NULL);
    }
    next(P);
    n->names = (const char **)names.v;
    n->nnames = names.n;
    n->list2 = (jnode **)defs.v;
    n->nlist2 = defs.n;
}

static jnode *statement(parser *P, tok *open) {
    tok *k = peek(P);
    if (k->t != T_NAME) unexpected(P, k, "a statement name");
    const char *s = k->s;
    next(P);
    int which;
    if (!strcmp(s, "if")) {
        jnode *n = node(P, N_IF, k);
        vec conds = {0}, bodies = {0};
        vpush(P, &conds, expr(P));
        end_block(P);
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        for (;;) {
            vpush(P, &bodies, body(P, ends, &which, open, "if"));
            next(P);
            if (which == 0) { vpush(P, &conds, expr(P)); end_block(P); continue; }
            if (which == 1) {
                end_block(P);
                static const char *const ends2[] = {"endif", NULL};
                n->c = body(P, ends2, &which, open, "if");
                next(P);
            }
            end_block(P);
            break;
        }
        n->list = (jnode **)conds.v;
        n->nlist = conds.n;
        n->list2 = (jnode **)bodies.v;
        n->nlist2 = bodies.n;
        return n;
    }
    if (!strcmp(s, "for")) {
        jnode *n = node(P, N_FOR, k);
        vec names = {0};
        targets(P, &names);
        n->names = (const char **)names.v;
        n->nnames = names.n;
        if (!is_name(peek(P), "in")) unexpected(P, peek(P), "'in'");
        next(P);
        n->a = tuple_expr(P, 0);
        if (is_name(peek(P), "if")) { next(P); n->b = expr(P); }
        if (is_name(peek(P), "recursive")) pfail(P, peek(P), "recursive loops are not supported");
        end_block(P);
        static const char *const ends[] = {"else", "endfor", NULL};
        n->c = body(P, ends, &which, open, "for");
        next(P);
        if (which == 0) {
            end_block(P);
            static const char *const ends2[] = {"endfor", NULL};
            n->d = body(P, ends2, &which, open, "for");
            next(P);
        }
        end_block(P);
        return n;
    }
    if (!strcmp(s, "set")) {
        tok *t0 = peek(P);
        const char *nm = expect_name(P);
        if (is_op(peek(P), ".")) { /* set ns.attr = value */
            next(P);
            jnode *n = node(P, N_SET, k);
            n->str = nm;
            n->c = node(P, N_ATTR, t0);
            n->c->str = expect_name(P);
            expect_op(P, "=");
            n->a = tuple_expr(P, 1);
            end_block(P);
            return n;
        }
        vec names = {0};
        vpush(P, &names, (void *)nm);
        while (is_op(peek(P), ",")) { next(P); vpush(P, &names, (void *)expect_name(P)); }
        if (peek(P)->t == T_BLOCK_END || is_op(peek(P), "|")) {
            if (names.n != 1) unexpected(P, peek(P), "'='");
            jnode *n = node(P, N_SETBLOCK, k);
            n->str = nm;
            vec filt = {0};
            while (is_op(peek(P), "|")) { /* {% set x | filter %} */
                next(P);
                tok *nt = peek(P);
                const char *fname = expect_name(P);
                if (!jx_known_filter(fname)) pfail(P, nt, "unknown filter '%s'", fname);
                jnode *f = node(P, N_FILTER, nt);
                f->str = fname;
                if (is_op(peek(P), "(")) { next(P); call_args(P, f); }
                vpush(P, &filt, f);
            }
            n->list = (jnode **)filt.v;
            n->nlist = filt.n;
            end_block(P);
            static const char *const ends[] = {"endset", NULL};
            n->a = body(P, ends, &which, open, "set");
            next(P);
            end_block(P);
            return n;
        }
        expect_op(P, "=");
        jnode *n = node(P, N_SET, k);
        n->names = (const char **)names.v;
        n->nnames = names.n;
        n->a = tuple_expr(P, 1);
        end_block(P);
        return n;
    }
    if (!strcmp(s, "macro")) {
        jnode *n = node(P, N_MACRO, k);
        n->str = expect_name(P);
        params(P, n);
        end_block(P);
        static const char *const ends[] = {"endmacro", NULL};
        n->c = body(P, ends, &which, open, "macro");
        next(P);
        if (peek(P)->t == T_NAME) next(P); /* {% endmacro name %} */
        end_block(P);
        return n;
    }
    if (!strcmp(s, "call")) {
        jnode *n = node(P, N_CALLBLOCK, k);
        if (is_op(peek(P), "(")) params(P, n);
        n->a = expr(P);
        if (n->a->k != N_CALL) pfail(P, k, "expected a call after 'call'");
        end_block(P);
        static const char *const ends[] = {"endcall", NULL};
        n->c = body(P, ends, &which, open, "call");
        next(P);
        end_block(P);
        return n;
    }
    if (!strcmp(s, "filter")) {
        jnode *n = node(P, N_FILTERBLOCK, k);
        vec filt = {0};
        for (;;) {
            tok *nt = peek(P);
            const char *fname = expect_name(P);
            if (!jx_known_filter(fname)) pfail(P, nt, "unknown filter '%s'", fname);
            jnode *f = node(P, N_FILTER, nt);
            f->str = fname;
            if (is_op(peek(P), "(")) { next(P); call_args(P, f); }
            vpush(P, &filt, f);
            if (!is_op(peek(P), "|")) break;
            next(P);
        }
        n->list = (jnode **)filt.v;
        n->nlist = filt.n;
        end_block(P);
        static const char *const ends[] = {"endfilter", NULL};
        n->a = body(P, ends, &which, open, "filter");
        next(P);
        end_block(P);
        return n;
    }
    if (!strcmp(s, "generation")) { /* transformers' assistant-mask marker: renders its body */
        end_block(P);
        static const char *const ends[] = {"endgeneration", NULL};
        jnode *n = body(P, ends, &which, open, "generation");
        next(P);
        end_block(P);
        return n;
    }
    if (!strcmp(s, "break") || !strcmp(s, "continue")) {
        jnode *n = node(P, s[0] == 'b' ? N_BREAK : N_CONTINUE, k);
        end_block(P);
        return n;
    }
    if (!strcmp(s, "do")) {
        jnode *n = node(P, N_DO, k);
        n->a = tuple_expr(P, 1);
        end_block(P);
        return n;
    }
    pfail(P, k, "unknown tag '%s'", s);
}

static jnode *body(parser *P, const char *const *ends, int *which, tok *opener, const char *what) {
    vec st = {0};
    jnode *b = node(P, N_BODY, peek(P));
    for (;;) {
        tok *k = peek(P);
        if (k->t == T_EOF) {
            if (ends) {
                int last = 0;
                while (ends[last + 1]) last++;
                pfail(P, opener, "'%s' block is never closed (expected '%s')", what, ends[last]);
            }
            break;
        }
        if (k->t == T_TEXT) {
            next(P);
            jnode *n = node(P, N_TEXT, k);
            n->str = k->s;
            n->slen = k->n;
            vpush(P, &st, n);
            continue;
        }
        if (k->t == T_VAR_BEGIN) {
            next(P);
            jnode *n = node(P, N_OUT, k);
            n->a = expr(P);
            tok *e = peek(P);
            if (e->t != T_VAR_END) unexpected(P, e, "end of print statement '}}'");
            next(P);
            vpush(P, &st, n);
            continue;
        }
        if (k->t == T_BLOCK_BEGIN) {
            tok *nm = &P->L->toks[P->i + 1];
            if (nm->t == T_NAME && ends) {
                int hit = -1;
                for (int q = 0; ends[q]; q++)
                    if (!strcmp(nm->s, ends[q])) hit = q;
                if (hit >= 0) {
                    next(P);
                    *which = hit;
                    break;
                }
            }
            if (nm->t == T_NAME && (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "elif") || !strcmp(nm->s, "else")))
                pfail(P, nm, "unexpected '%s'%s%s%s", nm->s, ends ? " (the innermost open block is '" : "", ends ? what : "", ends ? "')" : "");
            next(P);
            enter(P, k);
            vpush(P, &st, statement(P, k));
            P->depth--;
            continue;
        }
        char bd[80];
        pfail(P, k, "unexpected %s", tokdesc(k, bd, sizeof bd));
    }
    b->list = (jnode **)st.v;
    b->nlist = st.n;
    return b;
}

m3_jinja *m3_jinja_parse(const char *src, size_t len, const char *name, m3_err *err) {
    m3_jinja *volatile t = calloc(1, sizeof *t);
    if (!t) { m3_errf(err, "%s: out of memory", name ? name : "template"); return NULL; }
    snprintf(t->name, sizeof t->name, "%s", name ? name : "template");
    jmp_buf jb;
    t->arena.jb = &jb;
    t->arena.err = err;
    t->arena.name = t->name;
    t->arena.limit = (size_t)1 << 30;
    lexer L = {.A = &t->arena, .src = src, .len = len, .line = 1, .col = 1, .jb = &jb, .err = err, .name = t->name};
    if (setjmp(jb)) {
        ja_free_all(&t->arena);
        free(t);
        return NULL;
    }
    /* the template text is referenced by the AST: keep a copy in the arena */
    L.src = ja_strndup(&t->arena, src, len);
    jx_lex(&L);
    parser P = {.L = &L};
    t->root = body(&P, NULL, NULL, NULL, NULL);
    t->arena.jb = NULL;
    t->arena.err = NULL;
    return t;
}

void m3_jinja_free(m3_jinja *t) {
    if (!t) return;
    ja_free_all(&t->arena);
    free(t);
}
