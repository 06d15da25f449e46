/* Tokenizer helpers: UTF-8 stepping, the byte-level alphabet, hashing, growable buffers,
 * and the added-token trie. */
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "base/utf8.h"

int tok_buf_reserve(tok_buf *b, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    return 0;
}

int tok_buf_put(tok_buf *b, const void *s, size_t n) {
    if (tok_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int tok_utf8_step(const uint8_t *s, size_t n) { return m3_utf8_len(s, n); }

uint32_t tok_utf8_cp(const uint8_t *s, int len) {
    if (len == 1) return s[0];
    uint32_t cp = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) cp = cp << 6 | (s[i] & 0x3F);
    return cp;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes
 * to U+0100.. in byte order. */
static int printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

uint32_t tok_byte_to_cp(int b) {
    if (printable(b)) return (uint32_t)b;
    int k = 0;
    for (int x = 0; x < b; x++) k += !printable(x);
    return 0x100 + (uint32_t)k;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return printable((int)cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68) return -1;
    int k = (int)(cp - 0x100);
    for (int x = 0; x < 256; x++)
        if (!printable(x) && k-- == 0) return x;
    return -1;
}

uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    return h ^ h >> 29;
}

void tok_trie_free(tok_trie *tr) { free(tr->nodes); memset(tr, 0, sizeof *tr); }

static int trie_node(tok_trie *tr, uint8_t byte) {
    if (tr->n == tr->cap) {
        int cap = tr->cap ? tr->cap * 2 : 64;
        tok_trie_node *p = realloc(tr->nodes, (size_t)cap * sizeof *p);
        if (!p) return -1;
        tr->nodes = p;
        tr->cap = cap;
    }
    tr->nodes[tr->n] = (tok_trie_node){.child = -1, .sibling = -1, .added = -1, .byte = byte};
    return tr->n++;
}

int tok_trie_add(tok_trie *tr, const char *s, size_t n, int32_t added) {
    if (n == 0) return 0;
    if (tr->n == 0 && trie_node(tr, 0) < 0) return -1;
    int cur = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int c = tr->nodes[cur].child;
        while (c >= 0 && tr->nodes[c].byte != b) c = tr->nodes[c].sibling;
        if (c < 0) {
            if ((c = trie_node(tr, b)) < 0) return -1;
            tr->nodes[c].sibling = tr->nodes[cur].child;
            tr->nodes[cur].child = c;
        }
        cur = c;
    }
    if (tr->nodes[cur].added < 0) tr->nodes[cur].added = added; /* first wins on duplicates */
    tr->first[(uint8_t)s[0]] = 1;
    return 0;
}
