/* JSON writing like Python's json.dump(indent=N). See json_write.h. */
#include "json_write.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Python repr() of a float: shortest round-trip digits, fixed notation for 1e-4 <= |v| < 1e16
 * (with ".0" when integral), else d.ddde[+-]XX. */
void m3_json_fmt_real(double v, char *out, size_t n) {
    if (!isfinite(v)) { snprintf(out, n, "%s", isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity"); return; }
    if (v == 0) { snprintf(out, n, "%s", signbit(v) ? "-0.0" : "0.0"); return; }
    char e[64];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    /* e = [-]d.ddde[+-]XX with p significant digits */
    char digits[32];
    int nd = 0, neg = e[0] == '-';
    const char *q = e + neg;
    for (; *q && *q != 'e'; q++)
        if (isdigit((unsigned char)*q)) digits[nd++] = *q;
    digits[nd] = 0;
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    int exp10 = atoi(q + 1);
    char *o = out;
    size_t left = n;
#define PUT(...) do { int w_ = snprintf(o, left, __VA_ARGS__); if (w_ < 0 || (size_t)w_ >= left) return; o += w_; left -= (size_t)w_; } while (0)
    if (neg) PUT("-");
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            PUT("0.");
            for (int i = 0; i < -exp10 - 1; i++) PUT("0");
            PUT("%s", digits);
        } else if (nd <= exp10 + 1) {
            PUT("%s", digits);
            for (int i = nd; i < exp10 + 1; i++) PUT("0");
            PUT(".0");
        } else {
            PUT("%.*s.%s", exp10 + 1, digits, digits + exp10 + 1);
        }
    } else {
        PUT("%c", digits[0]);
        if (nd > 1) PUT(".%s", digits + 1);
        PUT("e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
#undef PUT
}

static void write_value(m3_sbuf *b, json_t *v, int indent, int depth) {
    char tmp[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        if (json_object_size(v) == 0) { m3_sbuf_str(b, "{}"); return; }
        m3_sbuf_str(b, "{");
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach(v, k, x) {
            m3_sbuf_str(b, first ? "\n" : ",\n");
            first = 0;
            for (int i = 0; i < indent * (depth + 1); i++) m3_sbuf_str(b, " ");
            json_t *ks = json_string(k);
            char *ke = ks ? json_dumps(ks, JSON_ENCODE_ANY | JSON_ENSURE_ASCII) : NULL;
            json_decref(ks);
            if (!ke) { b->oom = 1; return; }
            m3_sbuf_str(b, ke);
            free(ke);
            m3_sbuf_str(b, ": ");
            write_value(b, x, indent, depth + 1);
        }
        m3_sbuf_str(b, "\n");
        for (int i = 0; i < indent * depth; i++) m3_sbuf_str(b, " ");
        m3_sbuf_str(b, "}");
        return;
    }
    case JSON_ARRAY: {
        if (json_array_size(v) == 0) { m3_sbuf_str(b, "[]"); return; }
        m3_sbuf_str(b, "[");
        for (size_t j = 0; j < json_array_size(v); j++) {
            m3_sbuf_str(b, j ? ",\n" : "\n");
            for (int i = 0; i < indent * (depth + 1); i++) m3_sbuf_str(b, " ");
            write_value(b, json_array_get(v, j), indent, depth + 1);
        }
        m3_sbuf_str(b, "\n");
        for (int i = 0; i < indent * depth; i++) m3_sbuf_str(b, " ");
        m3_sbuf_str(b, "]");
        return;
    }
    case JSON_REAL: m3_json_fmt_real(json_real_value(v), tmp, sizeof tmp); m3_sbuf_str(b, tmp); return;
    case JSON_INTEGER: snprintf(tmp, sizeof tmp, "%lld", (long long)json_integer_value(v)); m3_sbuf_str(b, tmp); return;
    default: {
        char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
        if (!s) { b->oom = 1; return; }
        m3_sbuf_str(b, s);
        free(s);
        return;
    }
    }
}

void m3_json_write(m3_sbuf *b, json_t *v, int indent) { write_value(b, v, indent, 0); }
