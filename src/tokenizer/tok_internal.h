/* Internals shared by tokenizer.c (load, queries), tok_encode.c (normalize, pre-tokenize,
 * BPE) and tok_decode.c. Not a public API. */
#ifndef M3_TOK_INTERNAL_H
#define M3_TOK_INTERNAL_H

#include <pcre2.h>
#include <stdint.h>
#include <stdlib.h>

#include "tokenizer/tokenizer.h"

/* growable byte buffer */
typedef struct {
    char *p;
    size_t n, cap;
} tok_buf;
int tok_buf_put(tok_buf *b, const void *s, size_t n);
int tok_buf_reserve(tok_buf *b, size_t n); /* room for n more bytes (and a NUL) */

/* open-addressing map: byte string (stored in t->strs) -> id */
typedef struct {
    uint32_t *slots; /* id + 1, 0 = empty */
    size_t mask;
} tok_strmap;

/* open-addressing map: (left id, right id) -> (rank, merged id) */
typedef struct {
    uint64_t *keys; /* (left << 32 | right) + 1, 0 = empty */
    uint64_t *vals; /* rank << 32 | merged id */
    size_t mask;
} tok_pairmap;

enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWER, NORM_PREPEND, NORM_REPLACE };
typedef struct {
    int kind;
    char *a, *b; /* PREPEND: a; REPLACE: a -> b (literal) */
} tok_norm;

enum { PT_SPLIT, PT_BYTELEVEL, PT_DIGITS };
enum { SB_REMOVED, SB_ISOLATED, SB_MERGED_PREV, SB_MERGED_NEXT, SB_CONTIGUOUS };
typedef struct {
    int kind;
    pcre2_code *re; /* SPLIT (regex or escaped literal), BYTELEVEL with use_regex */
    int behavior, invert;
    int add_prefix_space; /* BYTELEVEL */
    int individual;       /* DIGITS */
} tok_pretok;

typedef struct {
    int32_t id;
    int special, lstrip, rstrip, single_word, normalized;
    char *content;  /* as written in tokenizer.json */
    char *match;    /* what is searched for (content, normalized when `normalized`) */
    size_t match_len;
} tok_added;

/* byte trie over added-token match strings (leftmost-longest search) */
typedef struct {
    int32_t child, sibling, added; /* added: index in t->added, -1 none */
    uint8_t byte;
} tok_trie_node;
typedef struct {
    tok_trie_node *nodes;
    int n, cap;
    uint8_t first[256]; /* 1 when some pattern starts with this byte */
} tok_trie;

struct m3_tok {
    /* vocabulary: id -> model-form bytes (raw bytes for byte-level models) */
    int32_t n_ids;
    uint32_t *off, *len; /* into strs; len UINT32_MAX = no token */
    char **spelling;     /* id -> stored spelling as in the file (NUL-terminated) or NULL */
    tok_buf strs;
    tok_strmap vocab;
    tok_pairmap merges;
    int byte_level;      /* a ByteLevel pre-tokenizer: vocab is stored as raw bytes */
    int32_t byte_id[256];/* byte-level: id of each single byte; byte_fallback: <0xXX> */
    int ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;
    /* pipeline */
    tok_norm *norms;
    int n_norms;
    tok_pretok *pretoks;
    int n_pretoks;
    tok_added *added;
    int n_added;
    uint8_t *is_special; /* per id */
    int32_t *added_of;   /* per id: index in added[] or -1 */
    tok_trie trie_raw, trie_norm;
    /* decoding: per id piece bytes after the per-token decoders */
    uint32_t *doff, *dlen;
    tok_buf dstrs;
    char strip_char[8];
    int strip_char_len, strip_start, strip_end;
    int32_t bos, eos, pad, unk_cfg;
};

#define TOK_MAX_ID (1 << 22) /* ids beyond this are refused (real vocabularies: < 300k) */

/* utf-8 helpers */
/* Length of the valid UTF-8 character at s (n bytes available): >0 valid; 0 incomplete but
 * may still become valid; <0 -(length of the maximal invalid subpart). */
int tok_utf8_step(const uint8_t *s, size_t n);
uint32_t tok_utf8_cp(const uint8_t *s, int len);
/* byte-level alphabet (GPT-2 bytes_to_unicode): code point of byte b / byte of a code point */
uint32_t tok_byte_to_cp(int b);
int tok_cp_to_byte(uint32_t cp); /* -1 if not in the alphabet */

/* hashing maps */
uint64_t tok_hash(const void *p, size_t n);
int32_t tok_vocab_get(const m3_tok *t, const char *s, size_t n);

/* encode pieces (tok_encode.c) */
int tok_normalize(const m3_tok *t, const char *s, size_t n, tok_buf *out, m3_err *err);
void tok_trie_free(tok_trie *tr);
int tok_trie_add(tok_trie *tr, const char *s, size_t n, int32_t added);

#endif
