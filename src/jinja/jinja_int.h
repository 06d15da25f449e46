/* Internals shared by the Jinja module's files (not a public API): the arena (arena.c), the
 * tokens (lexer.c), values and the AST (parser.c builds it, the runtime walks it; its own
 * internals are in jinja_rt.h). Everything a template or a render allocates lives in an
 * arena freed at once; errors unwind with longjmp to the API entry point, which frees the
 * arena. */
#ifndef M3_JINJA_INT_H
#define M3_JINJA_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja/jinja.h"

/* ---- arena */
typedef struct jarena_chunk {
    struct jarena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} jarena_chunk;

typedef struct jarena {
    jarena_chunk *head;
    size_t total, limit;
    jmp_buf *jb;     /* where to unwind on out-of-memory */
    m3_err *err;
    const char *name;
} jarena;

void *ja_alloc(jarena *a, size_t n); /* zeroed; unwinds on failure */
void ja_free_all(jarena *a);
char *ja_strndup(jarena *a, const char *s, size_t n);

/* ---- values */
enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC };

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;

typedef struct jv {
    uint8_t t;
    uint8_t safe; /* unused marker kept for |safe */
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;
        jlist *l;
        jdict *d;
        jfunc *fn;
    } u;
} jv;

struct jlist { jv *v; size_t n, cap; };
struct jdict { jv *k; jv *v; size_t n, cap; int ns; /* namespace() object */ };

/* ---- AST */
enum {
    /* statements */
    N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK,
    N_BREAK, N_CONTINUE, N_DO,
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NOT, N_NEG, N_POS,
    N_BIN, N_AND, N_OR, N_TERN, N_LISTLIT, N_TUPLELIT, N_DICTLIT
};

/* binary operators */
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_LE,
       OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct jnode jnode;
struct jnode {
    int k, line, col;
    int op;            /* N_BIN operator; N_TEST negated; N_OUT/N_TEXT unused */
    const char *str;   /* N_NAME / N_ATTR / filter / test / macro name, N_TEXT text */
    size_t slen;
    jnode *a, *b, *c, *d; /* operands, bodies */
    jnode **list; int nlist;      /* positional args, body statements, list items, if conditions */
    jnode **list2; int nlist2;    /* kwarg values, dict values, if bodies, macro defaults */
    const char **names; int nnames; /* kwarg names, targets, macro params */
    jv lit;
};

struct m3_jinja {
    jarena arena;
    jnode *root;
    char name[128];
};

/* ---- tokens (lexer.c) */
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

/* Splits L->src into L->toks, ending with T_EOF; errors longjmp to *L->jb. */
void jx_lex(lexer *L);

/* ---- names the runtime knows (filters.c, tests.c): the parser refuses the others */
int jx_known_filter(const char *name);
int jx_known_test(const char *name);

#endif
