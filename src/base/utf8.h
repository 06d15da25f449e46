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

#endif
