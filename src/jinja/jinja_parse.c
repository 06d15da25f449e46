/* Jinja lexer and parser: template text -> AST (jinja_int.h). Whitespace control follows
 * jinja2 with trim_blocks and lstrip_blocks on and keep_trailing_newline off. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_int.h"

int jx_known_filter(const char *name); /* jinja_eval.c */
int jx_known_test(const char *name);

/* ---- arena */
void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit && a->total + n > a->limit) {
        m3_errf(a->err, "%s: out of template memory (over %zu bytes)", a->name, a->limit);
        longjmp(*a->jb, 1);
    }
    jarena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 - sizeof(jarena_chunk) ? n : 65536 - sizeof(jarena_chunk);
        c = malloc(sizeof(jarena_chunk) + cap);
        if (!c) {
            m3_errf(a->err, "%s: out of memory", a->name);
            longjmp(*a->jb, 1);
        }
        c->used = 0;
        c->cap = cap;
        if (a->head && n > 4096) { /* big block: keep the current chunk for small ones */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

void ja_free_all(jarena *a) {
    jarena_chunk *c = a->head;
    while (c) {
        jarena_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->total = 0;
}

char *ja_strndup(jarena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ---- lexer */
enum { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct tok {
    int t, line, col;
    const char *s; /* text, name, string value, op */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct lexer {
    jarena *A;
    const char *src;
    size_t len;
    tok *toks;
    size_t ntok, cap;
    size_t lc_pos;
    int line, col;
    jmp_buf *jb;
    m3_err *err;
    const char *name;
} lexer;

static void lpos(lexer *L, size_t pos, int *line, int *col) {
    if (pos < L->lc_pos) { L->lc_pos = 0; L->line = 1; L->col = 1; }
    while (L->lc_pos < pos && L->lc_pos < L->len) {
        unsigned char ch = (unsigned char)L->src[L->lc_pos++];
        if (ch == '\n') { L->line++; L->col = 1; }
        else if ((ch & 0xC0) != 0x80) L->col++;
    }
    *line = L->line;
    *col = L->col;
}

static void lfail(lexer *L, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
static void lfail(lexer *L, size_t pos, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    lpos(L, pos, &line, &col);
    m3_errf(L->err, "%s: line %d, column %d: %s", L->name, line, col, msg);
    longjmp(*L->jb, 1);
}

static tok *push(lexer *L, int t, size_t pos) {
    if (L->ntok == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        tok *nt = ja_alloc(L->A, nc * sizeof(tok));
        if (L->ntok) memcpy(nt, L->toks, L->ntok * sizeof(tok));
        L->toks = nt;
        L->cap = nc;
    }
    tok *k = &L->toks[L->ntok++];
    memset(k, 0, sizeof *k);
    k->t = t;
    lpos(L, pos, &k->line, &k->col);
    return k;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_ident0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int hexv(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 63)); o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    if (cp > 0x10FFFF) cp = 0xFFFD;
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* Lexes a string literal at src[pos] (quote char); Python unicode-escape rules. */
static size_t lex_string(lexer *L, size_t pos) {
    char q = L->src[pos];
    size_t i = pos + 1, start = i;
    while (i < L->len && L->src[i] != q) {
        if (L->src[i] == '\\') i++;
        i++;
    }
    if (i >= L->len) lfail(L, pos, "unterminated string literal");
    char *o = ja_alloc(L->A, (i - start) + 1);
    size_t n = 0;
    for (size_t j = start; j < i; j++) {
        char c = L->src[j];
        if (c != '\\') { o[n++] = c; continue; }
        char e = L->src[++j];
        switch (e) {
        case 'n': o[n++] = '\n'; break;
        case 't': o[n++] = '\t'; break;
        case 'r': o[n++] = '\r'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'v': o[n++] = '\v'; break;
        case 'a': o[n++] = '\a'; break;
        case '\\': o[n++] = '\\'; break;
        case '\'': o[n++] = '\''; break;
        case '"': o[n++] = '"'; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = j + 1 + k < i ? hexv(L->src[j + 1 + k]) : -1;
                if (h < 0) lfail(L, j - 1, "truncated \\%c escape in string literal", e);
                cp = cp * 16 + (uint32_t)h;
            }
            j += (size_t)nd;
            char u[4];
            size_t m = put_utf8(u, cp);
            /* \x / \u expand to at most 4 bytes from 4..10 source bytes: fits */
            memcpy(o + n, u, m);
            n += m;
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && j + 1 < i && L->src[j + 1] >= '0' && L->src[j + 1] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(L->src[++j] - '0');
                char u[4];
                size_t m = put_utf8(u, cp);
                memcpy(o + n, u, m);
                n += m;
            } else {
                o[n++] = '\\';
                o[n++] = e;
            }
        }
    }
    o[n] = 0;
    tok *k = push(L, T_STRING, pos);
    k->s = o;
    k->n = n;
    return i + 1;
}

/* Lexes the inside of a tag starting at pos; returns the position after the closing
 * delimiter and sets *strip_after when it was "-%}" / "-}}". */
static size_t lex_tag(lexer *L, size_t pos, char kind, size_t open, int *strip_after) {
    int depth = 0;
    size_t i = pos;
    for (;;) {
        while (i < L->len && is_ws(L->src[i])) i++;
        if (i >= L->len) lfail(L, open, kind == '%' ? "unclosed block tag '{%%' (missing '%%}')" : "unclosed variable tag '{{' (missing '}}')");
        const char *s = L->src + i;
        size_t rem = L->len - i;
        char endc = kind == '%' ? '%' : '}';
        if (depth == 0) {
            if (rem >= 3 && s[0] == '-' && s[1] == endc && s[2] == '}') {
                push(L, kind == '%' ? T_BLOCK_END : T_VAR_END, i);
                *strip_after = 1;
                return i + 3;
            }
            if (rem >= 2 && s[0] == endc && s[1] == '}') {
                push(L, kind == '%' ? T_BLOCK_END : T_VAR_END, i);
                *strip_after = 0;
                return i + 2;
            }
        }
        char c = s[0];
        if (c == '\'' || c == '"') { i = lex_string(L, i); continue; }
        if (is_ident0(c)) {
            size_t j = i;
            while (j < L->len && (is_ident0(L->src[j]) || is_digit(L->src[j]))) j++;
            tok *k = push(L, T_NAME, i);
            k->s = ja_strndup(L->A, s, j - i);
            k->n = j - i;
            i = j;
            continue;
        }
        if (is_digit(c)) {
            size_t j = i;
            while (j < L->len && (is_digit(L->src[j]) || L->src[j] == '_')) j++;
            int isf = 0;
            int after_dot = L->ntok && L->toks[L->ntok - 1].t == T_OP && L->toks[L->ntok - 1].s[0] == '.';
            if (!after_dot && j + 1 < L->len && L->src[j] == '.' && is_digit(L->src[j + 1])) {
                isf = 1;
                j++;
                while (j < L->len && (is_digit(L->src[j]) || L->src[j] == '_')) j++;
            }
            if (!after_dot && j < L->len && (L->src[j] == 'e' || L->src[j] == 'E')) {
                size_t k2 = j + 1;
                if (k2 < L->len && (L->src[k2] == '+' || L->src[k2] == '-')) k2++;
                if (k2 < L->len && is_digit(L->src[k2])) {
                    isf = 1;
                    j = k2;
                    while (j < L->len && is_digit(L->src[j])) j++;
                }
            }
            char buf[64];
            size_t m = 0;
            for (size_t q = i; q < j && m < sizeof buf - 1; q++)
                if (L->src[q] != '_') buf[m++] = L->src[q];
            buf[m] = 0;
            tok *k = push(L, isf ? T_FLOAT : T_INT, i);
            if (isf) k->f = strtod(buf, NULL);
            else {
                unsigned long long v = strtoull(buf, NULL, 10);
                if (m > 18 && (m > 19 || v > (unsigned long long)INT64_MAX)) lfail(L, i, "integer literal too large");
                k->i = (int64_t)v;
            }
            i = j;
            continue;
        }
        static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">="};
        int found = 0;
        for (size_t q = 0; q < sizeof ops2 / sizeof *ops2; q++)
            if (rem >= 2 && s[0] == ops2[q][0] && s[1] == ops2[q][1]) {
                tok *k = push(L, T_OP, i);
                k->s = ops2[q];
                k->n = 2;
                i += 2;
                found = 1;
                break;
            }
        if (found) continue;
        if (strchr("+-*/%~()[]{},.:|=<>", c) && c) {
            static const char singles[] = "+-*/%~()[]{},.:|=<>";
            const char *p = strchr(singles, c);
            tok *k = push(L, T_OP, i);
            char *o = ja_alloc(L->A, 2);
            o[0] = *p;
            k->s = o;
            k->n = 1;
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            i++;
            continue;
        }
        lfail(L, i, "unexpected character '%c'", c);
    }
}

static void lex(lexer *L) {
    size_t pos = 0;
    int strip_next = 0, trim_nl = 0;
    while (pos <= L->len) {
        if (strip_next) {
            while (pos < L->len && is_ws(L->src[pos])) pos++;
            strip_next = 0;
        } else if (trim_nl) {
            if (pos < L->len && L->src[pos] == '\n') pos++;
        }
        trim_nl = 0;
        /* find the next tag */
        size_t i = pos;
        while (i + 1 < L->len && !(L->src[i] == '{' && (L->src[i + 1] == '{' || L->src[i + 1] == '%' || L->src[i + 1] == '#'))) i++;
        if (i + 1 >= L->len) i = L->len;
        size_t tend = i;
        if (i == L->len && tend > pos && L->src[tend - 1] == '\n') tend--; /* keep_trailing_newline=False */
        char kind = i < L->len ? L->src[i + 1] : 0;
        int minus = kind && i + 2 < L->len && L->src[i + 2] == '-';
        int plus = kind && i + 2 < L->len && L->src[i + 2] == '+';
        if (kind && minus) {
            while (tend > pos && is_ws(L->src[tend - 1])) tend--;
        } else if ((kind == '%' || kind == '#') && !plus) {
            /* lstrip_blocks: spaces and tabs from the line start to the tag */
            size_t j = tend;
            while (j > pos && (L->src[j - 1] == ' ' || L->src[j - 1] == '\t')) j--;
            if ((j > pos && L->src[j - 1] == '\n') || (j == pos && (pos == 0 || L->src[pos - 1] == '\n'))) tend = j;
        }
        if (tend > pos) {
            tok *k = push(L, T_TEXT, pos);
            k->s = L->src + pos;
            k->n = tend - pos;
        }
        if (!kind) break;
        size_t inner = i + 2 + (minus || plus);
        if (kind == '#') {
            size_t j = inner;
            while (j + 1 < L->len && !(L->src[j] == '#' && L->src[j + 1] == '}')) j++;
            if (j + 1 >= L->len) lfail(L, i, "unclosed comment '{#' (missing '#}')");
            strip_next = j > inner && L->src[j - 1] == '-';
            trim_nl = !strip_next;
            pos = j + 2;
            continue;
        }
        size_t first = L->ntok;
        push(L, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, i);
        int sa = 0;
        pos = lex_tag(L, inner, kind, i, &sa);
        strip_next = sa;
        trim_nl = kind == '%' && !sa;
        /* {% raw %} ... {% endraw %} */
        if (kind == '%' && L->ntok == first + 3 && L->toks[first + 1].t == T_NAME && !strcmp(L->toks[first + 1].s, "raw")) {
            L->ntok = first;
            size_t start = pos;
            if (strip_next) { while (start < L->len && is_ws(L->src[start])) start++; }
            else if (start < L->len && L->src[start] == '\n') start++;
            size_t j = start;
            for (;;) {
                while (j + 1 < L->len && !(L->src[j] == '{' && L->src[j + 1] == '%')) j++;
                if (j + 1 >= L->len) lfail(L, i, "'raw' block is never closed (expected 'endraw')");
                size_t q = j + 2;
                int m2 = q < L->len && L->src[q] == '-';
                if (m2) q++;
                while (q < L->len && is_ws(L->src[q])) q++;
                if (L->len - q >= 6 && !memcmp(L->src + q, "endraw", 6)) {
                    q += 6;
                    while (q < L->len && is_ws(L->src[q])) q++;
                    int m3 = q < L->len && L->src[q] == '-';
                    if (m3) q++;
                    if (q + 1 < L->len && L->src[q] == '%' && L->src[q + 1] == '}') {
                        size_t e = j;
                        if (m2) while (e > start && is_ws(L->src[e - 1])) e--;
                        if (e > start) {
                            tok *k = push(L, T_TEXT, start);
                            k->s = L->src + start;
                            k->n = e - start;
                        }
                        pos = q + 2;
                        strip_next = m3;
                        trim_nl = !m3;
                        break;
                    }
                }
                j += 2;
            }
        }
    }
    push(L, T_EOF, L->len);
}

/* ---- parser */
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
    if (memchr(L.src, 0, len)) lfail(&L, (size_t)((const char *)memchr(L.src, 0, len) - L.src), "NUL byte in template");
    lex(&L);
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
