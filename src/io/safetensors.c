#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HEADER (256u << 20)

static const struct { const char *name; size_t size; } DT[M3_DT_COUNT] = {
    [M3_DT_F32] = {"F32", 4},       [M3_DT_F16] = {"F16", 2},      [M3_DT_BF16] = {"BF16", 2},
    [M3_DT_F64] = {"F64", 8},       [M3_DT_F8_E4M3] = {"F8_E4M3", 1},
    [M3_DT_F8_E5M2] = {"F8_E5M2", 1}, [M3_DT_U8] = {"U8", 1},      [M3_DT_I8] = {"I8", 1},
    [M3_DT_I16] = {"I16", 2},       [M3_DT_U16] = {"U16", 2},      [M3_DT_I32] = {"I32", 4},
    [M3_DT_U32] = {"U32", 4},       [M3_DT_I64] = {"I64", 8},      [M3_DT_U64] = {"U64", 8},
    [M3_DT_BOOL] = {"BOOL", 1},
};

const char *m3_dtype_name(m3_dtype t) { return (unsigned)t < M3_DT_COUNT ? DT[t].name : "?"; }
size_t m3_dtype_size(m3_dtype t) { return (unsigned)t < M3_DT_COUNT ? DT[t].size : 0; }

int m3_dtype_parse(const char *s, m3_dtype *out) {
    for (int i = 0; i < M3_DT_COUNT; i++)
        if (strcmp(s, DT[i].name) == 0) { *out = (m3_dtype)i; return 0; }
    return -1;
}

void m3_shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

typedef struct {
    char *path;
    void *map;
    size_t size;
} shard;

struct m3_st {
    shard *files;
    size_t nfiles;
    m3_tensor *t;
    size_t n, cap;
    size_t *slots; /* hash table of tensor index + 1 */
    size_t nslots;
    uint64_t total;
};

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

const m3_tensor *m3_st_find(const m3_st *st, const char *name) {
    if (!st || !st->nslots) return NULL;
    size_t i = hash_str(name) & (st->nslots - 1);
    while (st->slots[i]) {
        const m3_tensor *t = &st->t[st->slots[i] - 1];
        if (strcmp(t->name, name) == 0) return t;
        i = (i + 1) & (st->nslots - 1);
    }
    return NULL;
}

size_t m3_st_count(const m3_st *st) { return st->n; }
const m3_tensor *m3_st_at(const m3_st *st, size_t i) { return i < st->n ? &st->t[i] : NULL; }
size_t m3_st_nfiles(const m3_st *st) { return st->nfiles; }
const char *m3_st_file_path(const m3_st *st, int f) { return st->files[f].path; }
uint64_t m3_st_total_bytes(const m3_st *st) { return st->total; }

void m3_st_close(m3_st *st) {
    if (!st) return;
    for (size_t i = 0; i < st->nfiles; i++) {
        if (st->files[i].map && st->files[i].size) munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    for (size_t i = 0; i < st->n; i++) free(st->t[i].name);
    free(st->files);
    free(st->t);
    free(st->slots);
    free(st);
}

static int build_hash(m3_st *st, m3_err *err) {
    size_t ns = 16;
    while (ns < st->n * 2) ns <<= 1;
    st->slots = calloc(ns, sizeof *st->slots);
    if (!st->slots) return m3_errf(err, "out of memory for the tensor table");
    st->nslots = ns;
    for (size_t k = 0; k < st->n; k++) {
        size_t i = hash_str(st->t[k].name) & (ns - 1);
        while (st->slots[i]) {
            if (strcmp(st->t[st->slots[i] - 1].name, st->t[k].name) == 0)
                return m3_errf(err, "tensor '%s' appears in both %s and %s", st->t[k].name,
                               st->files[st->t[st->slots[i] - 1].file].path,
                               st->files[st->t[k].file].path);
            i = (i + 1) & (ns - 1);
        }
        st->slots[i] = k + 1;
    }
    return 0;
}

typedef struct { uint64_t b, e; size_t idx; } span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b ? 1 : (x->e < y->e ? -1 : x->e > y->e);
}

/* Maps one file and appends its tensors. */
static int open_shard(m3_st *st, const char *path, m3_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return m3_errf(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) { close(fd); return m3_errf(err, "%s: stat failed", path); }
    size_t size = (size_t)sb.st_size;
    if (size < 8) { close(fd); return m3_errf(err, "%s: truncated safetensors file (%zu bytes, need at least 8)", path, size); }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return m3_errf(err, "%s: mmap failed: %s", path, strerror(errno));
    shard *nf = realloc(st->files, (st->nfiles + 1) * sizeof *nf);
    if (!nf) { munmap(map, size); return m3_errf(err, "out of memory"); }
    st->files = nf;
    int fi = (int)st->nfiles++;
    st->files[fi].path = strdup(path);
    st->files[fi].map = map;
    st->files[fi].size = size;
    if (!st->files[fi].path) return m3_errf(err, "out of memory");

    uint64_t hlen;
    memcpy(&hlen, map, 8);
    if (hlen > size - 8 || hlen > MAX_HEADER)
        return m3_errf(err, "%s: header length %llu exceeds the file (%zu bytes): truncated or not a safetensors file",
                       path, (unsigned long long)hlen, size);
    const char *hdr = (const char *)map + 8;
    json_error_t je;
    json_t *root = json_loadb(hdr, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) return m3_errf(err, "%s: bad header JSON: %s (at byte %d)", path, je.text, je.position);
    if (!json_is_object(root)) { json_decref(root); return m3_errf(err, "%s: header is not a JSON object", path); }
    const uint64_t data_size = size - 8 - hlen;
    const char *data = hdr + hlen;
    size_t first = st->n;
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        if (!json_is_object(val)) { rc = m3_errf(err, "%s: tensor '%s': entry is not an object", path, key); break; }
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        m3_dtype dt;
        if (!json_is_string(jd) || m3_dtype_parse(json_string_value(jd), &dt) != 0) {
            rc = m3_errf(err, "%s: tensor '%s': unknown or missing dtype %s", path, key,
                         json_is_string(jd) ? json_string_value(jd) : "(none)");
            break;
        }
        if (!json_is_array(js) || json_array_size(js) > M3_MAX_DIMS) {
            rc = m3_errf(err, "%s: tensor '%s': missing or bad shape", path, key);
            break;
        }
        if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
            !json_is_integer(json_array_get(jo, 1))) {
            rc = m3_errf(err, "%s: tensor '%s': missing or bad data_offsets", path, key);
            break;
        }
        if (st->n == st->cap) {
            size_t nc = st->cap ? st->cap * 2 : 256;
            m3_tensor *nt = realloc(st->t, nc * sizeof *nt);
            if (!nt) { rc = m3_errf(err, "out of memory"); break; }
            st->t = nt;
            st->cap = nc;
        }
        m3_tensor *t = &st->t[st->n];
        memset(t, 0, sizeof *t);
        t->dtype = dt;
        t->ndim = (int)json_array_size(js);
        t->file = fi;
        uint64_t numel = 1;
        int bad = 0;
        for (int d = 0; d < t->ndim; d++) {
            json_t *x = json_array_get(js, (size_t)d);
            if (!json_is_integer(x) || json_integer_value(x) < 0) { bad = 1; break; }
            t->shape[d] = json_integer_value(x);
            if (t->shape[d] && numel > (UINT64_MAX / 16) / (uint64_t)t->shape[d]) { bad = 2; break; }
            numel *= (uint64_t)t->shape[d];
        }
        if (bad) { rc = m3_errf(err, "%s: tensor '%s': %s shape", path, key, bad == 1 ? "invalid" : "overflowing"); break; }
        json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
        uint64_t want = numel * m3_dtype_size(dt);
        if (b < 0 || e < b || (uint64_t)e > data_size) {
            rc = m3_errf(err, "%s: tensor '%s': data_offsets [%lld, %lld] outside the data section (%llu bytes)",
                         path, key, (long long)b, (long long)e, (unsigned long long)data_size);
            break;
        }
        if ((uint64_t)(e - b) != want) {
            char sh[128];
            m3_shape_str(t->shape, t->ndim, sh, sizeof sh);
            rc = m3_errf(err, "%s: tensor '%s': %lld bytes stored but %s %s needs %llu", path, key,
                         (long long)(e - b), m3_dtype_name(dt), sh, (unsigned long long)want);
            break;
        }
        t->name = strdup(key);
        if (!t->name) { rc = m3_errf(err, "out of memory"); break; }
        t->numel = (int64_t)numel;
        t->nbytes = (size_t)want;
        t->data = data + b;
        st->n++;
        st->total += want;
    }
    json_decref(root);
    if (rc) return rc;
    /* no two tensors may overlap */
    size_t cnt = st->n - first;
    if (cnt > 1) {
        span *sp = malloc(cnt * sizeof *sp);
        if (!sp) return m3_errf(err, "out of memory");
        for (size_t i = 0; i < cnt; i++) {
            const m3_tensor *t = &st->t[first + i];
            sp[i].b = (uint64_t)((const char *)t->data - data);
            sp[i].e = sp[i].b + t->nbytes;
            sp[i].idx = first + i;
        }
        qsort(sp, cnt, sizeof *sp, cmp_span);
        for (size_t i = 1; i < cnt; i++) {
            if (sp[i].b < sp[i - 1].e && sp[i].e > sp[i].b && sp[i - 1].e > sp[i - 1].b) {
                rc = m3_errf(err, "%s: tensors '%s' and '%s' overlap in the file", path,
                             st->t[sp[i - 1].idx].name, st->t[sp[i].idx].name);
                break;
            }
        }
        free(sp);
    }
    return rc;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int open_index(m3_st *st, const char *index_path, m3_err *err) {
    json_error_t je;
    json_t *root = json_load_file(index_path, 0, &je);
    if (!root) return m3_errf(err, "%s: bad JSON: %s (line %d)", index_path, je.text, je.line);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) { json_decref(root); return m3_errf(err, "%s: no \"weight_map\" object", index_path); }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", index_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    const char *key;
    json_t *val;
    int rc = 0;
    /* open each distinct shard once, in order of first mention */
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val)) { rc = m3_errf(err, "%s: weight_map['%s'] is not a file name", index_path, key); break; }
        const char *fn = json_string_value(val);
        if (strchr(fn, '/') || strcmp(fn, "..") == 0) { rc = m3_errf(err, "%s: weight_map['%s'] names a path outside the checkpoint: %s", index_path, key, fn); break; }
        char full[8192];
        snprintf(full, sizeof full, "%s/%s", dir, fn);
        int have = 0;
        for (size_t i = 0; i < st->nfiles; i++) if (strcmp(st->files[i].path, full) == 0) have = 1;
        if (!have && (rc = open_shard(st, full, err)) != 0) break;
    }
    if (!rc && (rc = build_hash(st, err)) == 0) {
        json_object_foreach(wm, key, val) {
            const m3_tensor *t = m3_st_find(st, key);
            char full[8192];
            snprintf(full, sizeof full, "%s/%s", dir, json_string_value(val));
            if (!t) { rc = m3_errf(err, "%s: tensor '%s' is listed in the index but missing from %s", index_path, key, full); break; }
            if (strcmp(st->files[t->file].path, full) != 0) {
                rc = m3_errf(err, "%s: tensor '%s' is listed in %s but stored in %s", index_path, key, full, st->files[t->file].path);
                break;
            }
        }
    }
    json_decref(root);
    return rc;
}

m3_st *m3_st_open(const char *path, m3_err *err) {
    m3_st *st = calloc(1, sizeof *st);
    if (!st) { m3_errf(err, "out of memory"); return NULL; }
    int rc;
    char buf[8192];
    if (is_dir(path)) {
        snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
        if (file_exists(buf)) rc = open_index(st, buf, err);
        else {
            snprintf(buf, sizeof buf, "%s/model.safetensors", path);
            if (file_exists(buf)) {
                rc = open_shard(st, buf, err);
                if (!rc) rc = build_hash(st, err);
            } else rc = m3_errf(err, "%s: no model.safetensors or model.safetensors.index.json", path);
        }
    } else if (ends_with(path, ".json")) {
        rc = open_index(st, path, err);
    } else {
        rc = open_shard(st, path, err);
        if (!rc) rc = build_hash(st, err);
    }
    if (rc) { m3_st_close(st); return NULL; }
    return st;
}

/* ---------------- writer ---------------- */

typedef struct { char *name; m3_dtype dt; int ndim; int64_t shape[M3_MAX_DIMS]; const void *data; size_t nbytes; } wentry;
struct m3_st_writer { wentry *e; size_t n, cap; };

m3_st_writer *m3_stw_new(void) { return calloc(1, sizeof(m3_st_writer)); }

void m3_stw_free(m3_st_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    free(w);
}

int m3_stw_add(m3_st_writer *w, const char *name, m3_dtype dt, int ndim, const int64_t *shape,
               const void *data, m3_err *err) {
    if (ndim < 0 || ndim > M3_MAX_DIMS) return m3_errf(err, "tensor '%s': bad rank %d", name, ndim);
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 64;
        wentry *ne = realloc(w->e, nc * sizeof *ne);
        if (!ne) return m3_errf(err, "out of memory");
        w->e = ne;
        w->cap = nc;
    }
    wentry *e = &w->e[w->n];
    e->name = strdup(name);
    if (!e->name) return m3_errf(err, "out of memory");
    e->dt = dt;
    e->ndim = ndim;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) { e->shape[i] = shape[i]; numel *= (size_t)shape[i]; }
    e->data = data;
    e->nbytes = numel * m3_dtype_size(dt);
    w->n++;
    return 0;
}

int m3_stw_write(m3_st_writer *w, const char *path, m3_err *err) {
    json_t *root = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    uint64_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        wentry *e = &w->e[i];
        json_t *o = json_object(), *sh = json_array(), *of = json_array();
        for (int d = 0; d < e->ndim; d++) json_array_append_new(sh, json_integer(e->shape[d]));
        json_array_append_new(of, json_integer((json_int_t)off));
        json_array_append_new(of, json_integer((json_int_t)(off + e->nbytes)));
        json_object_set_new(o, "dtype", json_string(m3_dtype_name(e->dt)));
        json_object_set_new(o, "shape", sh);
        json_object_set_new(o, "data_offsets", of);
        json_object_set_new(root, e->name, o);
        off += e->nbytes;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) return m3_errf(err, "%s: could not encode the header", path);
    size_t hl = strlen(hdr), pad = (8 - hl % 8) % 8;
    uint64_t hlen = hl + pad;
    char tmp[8192];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) { free(hdr); return m3_errf(err, "%s: cannot create: %s", tmp, strerror(errno)); }
    int ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(hdr, 1, hl, f) == hl;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    free(hdr);
    for (size_t i = 0; ok && i < w->n; i++)
        ok = w->e[i].nbytes == 0 || fwrite(w->e[i].data, 1, w->e[i].nbytes, f) == w->e[i].nbytes;
    if (fclose(f) != 0) ok = 0;
    if (!ok) { unlink(tmp); return m3_errf(err, "%s: write failed: %s", path, strerror(errno)); }
    if (rename(tmp, path) != 0) { unlink(tmp); return m3_errf(err, "%s: rename failed: %s", path, strerror(errno)); }
    return 0;
}
