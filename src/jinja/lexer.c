/* The Jinja lexer: template text -> tokens (jinja_int.h). Whitespace control follows jinja2
 * with trim_blocks and lstrip_blocks on and keep_trailing_newline off; {% raw %} and
 * {# comments #} end here. Errors name the line and column (counted in code points). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "jinja/jinja_int.h"

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
            size_t m = (size_t)m3_utf8_put(cp, u);
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
                size_t m = (size_t)m3_utf8_put(cp, u);
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

void jx_lex(lexer *L) {
    if (memchr(L->src, 0, L->len)) lfail(L, (size_t)((const char *)memchr(L->src, 0, L->len) - L->src), "NUL byte in template");
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
