/* A small JSON Schema validator for the subset src/grammar supports (oneOf checked as anyOf,
 * additionalProperties absent = false when "properties" is given), so that the tests and the
 * fuzz targets can check that constrained outputs satisfy their schema. Header-only. */
#ifndef M3_TEST_GRAMMAR_JSV_H
#define M3_TEST_GRAMMAR_JSV_H

#include <jansson.h>
#include <string.h>

static inline json_t *jsv_ref(json_t *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    json_t *cur = root;
    const char *p = ref + 1;
    while (*p) {
        if (*p++ != '/') return NULL;
        char tok[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '0') { tok[k++] = '~'; p += 2; }
            else if (p[0] == '~' && p[1] == '1') { tok[k++] = '/'; p += 2; }
            else tok[k++] = *p++;
        }
        tok[k] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) cur = json_array_get(cur, (size_t)atol(tok));
        else return NULL;
        if (!cur) return NULL;
    }
    return cur;
}

static inline size_t jsv_cps(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static inline int jsv_type(json_t *s, json_t *d, const char *t) {
    if (!strcmp(t, "string")) {
        if (!json_is_string(d)) return 0;
        size_t n = jsv_cps(json_string_value(d), json_string_length(d));
        json_t *a = json_object_get(s, "minLength"), *b = json_object_get(s, "maxLength");
        if (a && (json_int_t)n < json_integer_value(a)) return 0;
        if (b && (json_int_t)n > json_integer_value(b)) return 0;
        return 1;
    }
    if (!strcmp(t, "integer") || !strcmp(t, "number")) {
        if (!strcmp(t, "integer") ? !json_is_integer(d) : !json_is_number(d)) return 0;
        double x = json_number_value(d);
        json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
        json_t *emn = json_object_get(s, "exclusiveMinimum"), *emx = json_object_get(s, "exclusiveMaximum");
        if (mn && (emn && json_is_true(emn) ? !(x > json_number_value(mn)) : !(x >= json_number_value(mn)))) return 0;
        if (mx && (emx && json_is_true(emx) ? !(x < json_number_value(mx)) : !(x <= json_number_value(mx)))) return 0;
        if (emn && json_is_number(emn) && !(x > json_number_value(emn))) return 0;
        if (emx && json_is_number(emx) && !(x < json_number_value(emx))) return 0;
        return 1;
    }
    if (!strcmp(t, "boolean")) return json_is_boolean(d);
    if (!strcmp(t, "null")) return json_is_null(d);
    return -1; /* object / array: the caller */
}

static int jsv_valid(json_t *root, json_t *s, json_t *d, int depth);

static inline int jsv_object(json_t *root, json_t *s, json_t *d, int depth) {
    if (!json_is_object(d)) return 0;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    for (size_t i = 0; req && i < json_array_size(req); i++)
        if (!json_object_get(d, json_string_value(json_array_get(req, i)))) return 0;
    const char *k;
    json_t *v;
    json_object_foreach(d, k, v) {
        json_t *ps = props ? json_object_get(props, k) : NULL;
        if (ps) {
            if (!jsv_valid(root, ps, v, depth + 1)) return 0;
        } else if (addl ? json_is_false(addl) : props != NULL) return 0;
        else if (addl && !jsv_valid(root, addl, v, depth + 1)) return 0;
    }
    return 1;
}

static inline int jsv_array(json_t *root, json_t *s, json_t *d, int depth) {
    if (!json_is_array(d)) return 0;
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    size_t n = json_array_size(d), np = prefix ? json_array_size(prefix) : 0;
    if (mn && (json_int_t)n < json_integer_value(mn)) return 0;
    if (mx && (json_int_t)n > json_integer_value(mx)) return 0;
    for (size_t i = 0; i < n; i++) {
        json_t *es = i < np ? json_array_get(prefix, i) : items;
        if (es && !jsv_valid(root, es, json_array_get(d, i), depth + 1)) return 0;
    }
    return 1;
}

static int jsv_valid(json_t *root, json_t *s, json_t *d, int depth) {
    if (depth > 200) return 0;
    if (json_is_true(s)) return 1;
    if (json_is_false(s) || !json_is_object(s)) return 0;
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        json_t *t = jsv_ref(root, json_string_value(ref));
        return t && jsv_valid(root, t, d, depth + 1);
    }
    json_t *c = json_object_get(s, "const");
    if (c) return json_equal(c, d);
    json_t *en = json_object_get(s, "enum");
    if (en) {
        for (size_t i = 0; i < json_array_size(en); i++)
            if (json_equal(json_array_get(en, i), d)) return 1;
        return 0;
    }
    static const char *alts[] = {"anyOf", "oneOf", "allOf"};
    for (int a = 0; a < 3; a++) {
        json_t *l = json_object_get(s, alts[a]);
        if (!l) continue;
        for (size_t i = 0; i < json_array_size(l); i++) {
            int ok = jsv_valid(root, json_array_get(l, i), d, depth + 1);
            if (a < 2 && ok) return 1;
            if (a == 2 && !ok) return 0;
        }
        return a == 2;
    }
    json_t *ty = json_object_get(s, "type");
    const char *types[8];
    int nt = 0;
    if (json_is_string(ty)) types[nt++] = json_string_value(ty);
    else if (json_is_array(ty))
        for (size_t i = 0; i < json_array_size(ty) && nt < 8; i++) types[nt++] = json_string_value(json_array_get(ty, i));
    else if (json_object_get(s, "properties") || json_object_get(s, "required") || json_object_get(s, "additionalProperties"))
        types[nt++] = "object";
    else if (json_object_get(s, "items") || json_object_get(s, "prefixItems") || json_object_get(s, "minItems") ||
             json_object_get(s, "maxItems"))
        types[nt++] = "array";
    else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength")) types[nt++] = "string";
    else if (json_object_get(s, "minimum") || json_object_get(s, "maximum") || json_object_get(s, "exclusiveMinimum") ||
             json_object_get(s, "exclusiveMaximum"))
        types[nt++] = "number";
    else return 1;
    for (int i = 0; i < nt; i++) {
        if (!types[i]) continue;
        int r = jsv_type(s, d, types[i]);
        if (r < 0) r = !strcmp(types[i], "object") ? jsv_object(root, s, d, depth) : jsv_array(root, s, d, depth);
        if (r) return 1;
    }
    return 0;
}

#endif
