/* UTF-8 validation shared by the tokenizer, the templates and the output parsers. */
#ifndef M3_UTF8_H
#define M3_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The sequence starting at s[0] of the n bytes available: its length (1-4) when it is a
 * complete, valid UTF-8 character (no overlongs, no surrogates, <= U+10FFFF); 0 when the
 * n bytes are a valid but unfinished start; -k when the first k bytes can never begin a
 * valid character. n must be >= 1. */
int m3_utf8_len(const uint8_t *s, size_t n);

/* Writes code point cp as UTF-8 into out (room for 4 bytes); returns the byte count. A cp over
 * U+10FFFF is written as U+FFFD; surrogates are written as they are (callers refuse them). */
int m3_utf8_put(uint32_t cp, char *out);

/* Whitespace as Python's str.isspace() sees it (what str.strip() and str.split() take away, the
 * \s of Python's re): ASCII 9-13 and 28-32, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028,
 * U+2029, U+202F, U+205F, U+3000 (not U+FEFF, which JavaScript's trim takes too). Bytes that are
 * not a whole valid character are not whitespace. */
size_t m3_utf8_space_at(const char *s, size_t n);     /* bytes of the whitespace character at s[0] (0: none) */
size_t m3_utf8_space_before(const char *s, size_t n); /* ... of the one ending at s[n-1] (0: none) */
/* bytes of s[0..n)'s leading (tail 0) or trailing (tail 1) whitespace */
size_t m3_utf8_space_run(const char *s, size_t n, int tail);

#endif
