/* JSON text the way Python's json.dump(obj, f, indent=N) writes it (the key order kept,
 * ensure_ascii, floats as Python's repr: shortest round-trip digits), so that a config we
 * rewrite reads like one a Python tool wrote. */
#ifndef M3_JSON_WRITE_H
#define M3_JSON_WRITE_H

#include <stddef.h>

#include <jansson.h>

#include "../base/sbuf.h"

/* Appends v to b as json.dump(v, indent=indent) writes it: indent spaces per level, ",\n"
 * between items, ": " after keys. Out of memory sets b->oom. */
void m3_json_write(m3_sbuf *b, json_t *v, int indent);

/* Python repr() of a float into out (n bytes): fixed notation for 1e-4 <= |v| < 1e16 (with
 * ".0" when integral), else d.ddde[+-]XX; NaN / Infinity / -Infinity as json.dump writes them. */
void m3_json_fmt_real(double v, char *out, size_t n);

#endif
