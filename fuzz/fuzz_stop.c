/* libFuzzer: stop-string matching (m3_stop_scan, src/engine/sampler.h) against the plain rule.
 * Input: byte 0 = the number of stop strings (1..4, from its low bits), then the strings
 * separated by 0xFF, then, after a 0xFE, the output text; each byte of the text below 0x08
 * ends a chunk (a call with the text so far), as tokens arrive. Checked at every call: the
 * same answer as the plain rule (earliest start, the first listed on a tie; else the longest
 * suffix that begins a string is held back), never a crash; stop strings of any length. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

static int plain(char **strs, const size_t *lens, int n, const char *text, size_t len, size_t checked, m3_stop_match *m) {
    m->which = -1;
    m->start = m->end = 0;
    m->safe = len;
    size_t best = (size_t)-1;
    for (int i = 0; i < n; i++)
        for (size_t st = 0; st + lens[i] <= len; st++)
            if (st + lens[i] > checked && !memcmp(text + st, strs[i], lens[i]) && st < best) {
                best = st;
                m->which = i;
                m->start = st;
                m->end = st + lens[i];
            }
    if (m->which >= 0) { m->safe = m->start; return 1; }
    size_t hold = 0;
    for (int i = 0; i < n; i++)
        for (size_t h = lens[i] - 1 < len ? lens[i] - 1 : len; h > hold; h--)
            if (!memcmp(text + len - h, strs[i], h)) { hold = h; break; }
    m->safe = len - hold;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    int n = 1 + (data[0] & 3);
    const uint8_t *p = data + 1, *end = data + size;
    const uint8_t *sep = memchr(p, 0xFE, (size_t)(end - p));
    if (!sep) return 0;
    char *strs[4];
    size_t lens[4];
    int k = 0;
    const uint8_t *q = p;
    while (k < n && q < sep) {
        const uint8_t *e = memchr(q, 0xFF, (size_t)(sep - q));
        if (!e) e = sep;
        /* NUL-free, non-empty strings (m3_stop_create takes C strings) */
        size_t L = 0;
        char *s = malloc((size_t)(e - q) + 1);
        for (const uint8_t *r = q; r < e; r++)
            if (*r) s[L++] = (char)*r;
        s[L] = 0;
        if (L) { strs[k] = s; lens[k] = L; k++; }
        else free(s);
        q = e + 1;
    }
    if (!k) return 0;
    m3_err err;
    m3_stop *st = m3_stop_create((const char *const *)strs, k, NULL, 0, &err);
    if (!st) abort();
    size_t tn = (size_t)(end - sep - 1);
    char *text = malloc(tn + 1);
    size_t len = 0, checked = 0;
    for (size_t i = 0; i <= tn; i++) {
        int cut = i == tn || sep[1 + i] < 8;
        if (i < tn && !cut) text[len++] = (char)sep[1 + i];
        if (!cut) continue;
        m3_stop_match a, b;
        int ra = m3_stop_scan(st, text, len, checked, &a), rb = plain(strs, lens, k, text, len, checked, &b);
        if (ra != rb || a.safe != b.safe || (ra && (a.which != b.which || a.start != b.start || a.end != b.end))) abort();
        if (ra) break;
        checked = len;
    }
    free(text);
    m3_stop_free(st);
    for (int i = 0; i < k; i++) free(strs[i]);
    return 0;
}
