#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "../backend/cpu/cpu.h"
#include "../base/clock.h"
#include "../backend/cuda/cuda.h"
#include "cli.h"

int m3_cli_parse_ids(const char *s, int32_t **ids, int *n, m3_err *err) {
    int cap = 16, cnt = 0;
    int32_t *v = malloc(sizeof *v * (size_t)cap);
    if (!v) return m3_errf(err, "out of memory");
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return m3_errf(err, "--ids: '%.20s' is not a non-negative token id", p);
        }
        if (cnt == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, sizeof *v * (size_t)cap);
            if (!nv) { free(v); return m3_errf(err, "out of memory"); }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = end;
        if (*p && *p != ',' && *p != ' ' && *p != '\n' && *p != '\t') {
            free(v);
            return m3_errf(err, "--ids: unexpected character '%c' (use comma-separated integers)", *p);
        }
    }
    if (!cnt) { free(v); return m3_errf(err, "--ids: no token ids given"); }
    *ids = v;
    *n = cnt;
    return 0;
}

int m3_cli_int(const char *opt, const char *val, long lo, long hi, long *out, m3_err *err) {
    if (!val) return m3_errf(err, "%s needs a value", opt);
    char *end;
    errno = 0;
    long x = strtol(val, &end, 10);
    if (end == val || *end || errno || x < lo || x > hi)
        return m3_errf(err, "%s: '%s' is not an integer in [%ld, %ld]", opt, val, lo, hi);
    *out = x;
    return 0;
}

int m3_cli_list(const char *val, char ***out, m3_err *err) {
    *out = NULL;
    const char *items[256];
    size_t lens[256];
    int n = 0;
    json_t *j = NULL;
    const char *p = val;
    while (*p == ' ') p++;
    if (*p == '[') {
        json_error_t je;
        j = json_loads(val, 0, &je);
        if (!j || !json_is_array(j)) { json_decref(j); return m3_errf(err, "'%s' is not a JSON list (%s)", val, je.text); }
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) {
            if (!json_is_string(v) || !json_string_length(v) || n == 256) {
                json_decref(j);
                return m3_errf(err, "'%s': every item must be a non-empty string (at most 256)", val);
            }
            items[n] = json_string_value(v);
            lens[n++] = json_string_length(v);
        }
    } else {
        for (const char *q = val;;) {
            while (*q == ' ') q++;
            const char *e = q;
            while (*e && *e != ',') e++;
            size_t l = (size_t)(e - q);
            while (l && q[l - 1] == ' ') l--;
            if (!l || n == 256) return m3_errf(err, "'%s': an empty item (or more than 256)", val);
            items[n] = q;
            lens[n++] = l;
            if (!*e) break;
            q = e + 1;
        }
    }
    size_t bytes = sizeof(char *) * (size_t)(n + 1);
    for (int i = 0; i < n; i++) bytes += lens[i] + 1;
    char **a = malloc(bytes);
    if (!a) { json_decref(j); return m3_errf(err, "out of memory"); }
    char *str = (char *)(a + n + 1);
    for (int i = 0; i < n; i++) {
        memcpy(str, items[i], lens[i]);
        str[lens[i]] = 0;
        a[i] = str;
        str += lens[i] + 1;
    }
    a[n] = NULL;
    json_decref(j);
    *out = a;
    return 0;
}

int m3_cli_size(const char *opt, const char *val, long lo, long hi, long *out, m3_err *err) {
    if (!val) return m3_errf(err, "%s needs a value", opt);
    char *end;
    errno = 0;
    double x = strtod(val, &end);
    double mul = 1;
    /* vLLM's human-readable sizes: k / m / g powers of 1000, K / M / G (and KiB / MiB / GiB)
     * powers of 1024, KB / MB / GB powers of 1000 */
    static const struct { const char *s; double m; } suf[] = {
        {"", 1}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}};
    int found = 0;
    for (size_t i = 0; end != val && i < sizeof suf / sizeof *suf; i++)
        if (!strcmp(end, suf[i].s)) { mul = suf[i].m; found = 1; break; }
    double v = x * mul;
    if (end == val || !found || errno || !(v >= (double)lo && v <= (double)hi) || v != (double)(long)v)
        return m3_errf(err, "%s: '%s' is not a whole number in [%ld, %ld] (suffixes: k m g = 10^3 10^6 10^9, K M G or "
                       "KiB MiB GiB = 2^10 2^20 2^30)", opt, val, lo, hi);
    *out = (long)v;
    return 0;
}

typedef struct { double t0; int tty; } progress_state;

static void progress(uint64_t done, uint64_t total, void *arg) {
    progress_state *ps = arg;
    if (!ps->tty) return;
    double el = m3_now() - ps->t0, rate = el > 0 ? done / el : 0;
    double left = rate > 0 ? (total - done) / rate : 0;
    fprintf(stderr, "\rloading %.2f / %.2f GB  %.0f MB/s  %.0fs left   ", done / 1e9, total / 1e9, rate / 1e6, left);
    if (done >= total) fputc('\n', stderr);
}

static int cli_precision = -1; /* --precision of this command: -1 none, 0 exact, 1 bf16 */

int m3_cli_set_precision(const char *value, const char *cmd) {
    if (value && !strcmp(value, "exact")) cli_precision = 0;
    else if (value && !strcmp(value, "bf16")) cli_precision = 1;
    else {
        fprintf(stderr, "m3 %s: --precision '%s': exact (f32 GEMM inputs) or bf16 (GEMM inputs, attention's q, K, V and "
                        "probabilities included, rounded to bf16; the GPU's tensor-core path)\n", cmd, value ? value : "");
        return -1;
    }
    return 0;
}

int m3_cli_precision(const char *backend_name) {
    if (cli_precision >= 0) return cli_precision;
    const char *env = getenv("M3_PRECISION");
    if (env && !strcmp(env, "exact")) return 0;
    if (env && !strcmp(env, "bf16")) return 1;
    return backend_name && !strcmp(backend_name, "cuda");
}

void m3_cli_apply_precision(m3_ops *ops) {
    if (!ops->name) return;
    if (!strcmp(ops->name, "cuda")) m3_cuda_set_precision(ops, m3_cli_precision("cuda"));
    else m3_cpu_set_precision(ops, m3_cli_precision("cpu"));
}

static const char *cli_fc1; /* --moe-act-quant of this command, NULL: none given */

int m3_cli_set_moe_act_quant(const char *value, const char *cmd) {
    m3_config probe = {0}; /* the names only: hidden 0 takes either */
    m3_err err;
    if (m3_config_set_fc1_quant(&probe, value, &err)) {
        fprintf(stderr, "m3 %s: --moe-act-quant %s\n", cmd, err.msg);
        return -1;
    }
    cli_fc1 = value;
    return 0;
}

/* the name asked for: the flag's, else $M3_MOE_ACT_QUANT's; NULL when neither */
static const char *fc1_name(void) {
    const char *name = cli_fc1 ? cli_fc1 : getenv("M3_MOE_ACT_QUANT");
    return name && *name ? name : NULL;
}

/* the switch against dir's config before any weight is read (a bad name or shape fails in seconds) */
int m3_cli_precheck_moe_act_quant(const char *dir, const char *cmd) {
    if (!fc1_name()) return 0;
    m3_config c;
    m3_err err;
    if (m3_config_load(&c, dir, &err)) return 0; /* the load says what is wrong with the config */
    const int rc = m3_cli_apply_moe_act_quant(&c, cmd);
    m3_config_free(&c);
    return rc;
}

int m3_cli_apply_moe_act_quant(m3_config *c, const char *cmd) {
    const char *name = fc1_name();
    if (!name) return 0;
    m3_err err;
    if (m3_config_set_fc1_quant(c, name, &err)) {
        fprintf(stderr, "m3 %s: %s %s\n", cmd, cli_fc1 ? "--moe-act-quant" : "$M3_MOE_ACT_QUANT", err.msg);
        return -1;
    }
    return 0;
}

int m3_cli_ops_init(m3_ops *ops, const char *backend, int threads, const char *cmd) {
    m3_err err;
    if (!backend || !strcmp(backend, "auto")) {
        const char *env = getenv("M3_BACKEND");
        backend = env && *env ? env : m3_cuda_device_count() > 0 ? "cuda" : "cpu";
    }
    int rc;
    if (!strcmp(backend, "cpu")) rc = m3_cpu_ops_init(ops, threads, &err);
    else if (!strcmp(backend, "cuda")) rc = m3_cuda_ops_init(ops, 0, &err);
    else rc = m3_errf(&err, "unknown backend '%s' (cpu, cuda or auto)", backend);
    if (rc) fprintf(stderr, "m3 %s: %s\n", cmd, err.msg);
    else m3_cli_apply_precision(ops);
    return rc;
}

void m3_cli_ops_free(m3_ops *ops) {
    if (ops->name && !strcmp(ops->name, "cuda")) m3_cuda_ops_free(ops);
    else if (ops->name) m3_cpu_ops_free(ops);
}

int m3_cli_load(m3_model *m, m3_ops *ops, const char *dir, int threads, const char *cmd, const int32_t *ids, int n_ids) {
    return m3_cli_load_on(m, ops, NULL, dir, threads, cmd, ids, n_ids);
}

int m3_cli_load_on(m3_model *m, m3_ops *ops, const char *backend, const char *dir, int threads, const char *cmd,
                   const int32_t *ids, int n_ids) {
    m3_err err;
    if (n_ids) {
        m3_config c;
        if (m3_config_load(&c, dir, &err)) { fprintf(stderr, "m3 %s: %s\n", cmd, err.msg); return -1; }
        int vocab = c.vocab;
        m3_config_free(&c);
        for (int i = 0; i < n_ids; i++)
            if (ids[i] >= vocab) {
                fprintf(stderr, "m3 %s: token id %d at index %d is out of range (vocab %d)\n", cmd, ids[i], i, vocab);
                return -1;
            }
    }
    if (m3_cli_precheck_moe_act_quant(dir, cmd) || m3_cli_ops_init(ops, backend, threads, cmd)) return -1;
    progress_state ps = {m3_now(), isatty(2)};
    if (m3_model_load(m, dir, ops, progress, &ps, &err)) {
        fprintf(stderr, "m3 %s: %s\n", cmd, err.msg);
        m3_cli_ops_free(ops);
        return -1;
    }
    if (m3_cli_apply_moe_act_quant(&m->cfg, cmd)) {
        m3_model_free(m);
        m3_cli_ops_free(ops);
        return -1;
    }
    const m3_weights *w = &m->w;
    char fm[256];
    size_t o = 0;
    fm[0] = 0;
    for (int f = 0; f < M3_WF_COUNT; f++)
        if (w->count_by_fmt[f])
            o += (size_t)snprintf(fm + o, sizeof fm - o, "%s%s %d (%.1f MB)", o ? ", " : "", m3_wfmt_name(f),
                                  w->count_by_fmt[f], w->bytes_by_fmt[f] / 1e6);
    char where[160];
    if (!strcmp(ops->name, "cuda")) snprintf(where, sizeof where, "GPU: %s", m3_cuda_device_name(ops));
    else snprintf(where, sizeof where, "%d threads, %s kernels", ((m3_cpu *)ops->ctx)->nthreads, m3_cpu_simd_name());
    fprintf(stderr, "loaded %s: %zu tensors, %.1f MB in %zu file(s); %s; %.2fs; %s%s\n", dir, w->n_tensors_used,
            m3_st_total_bytes(m->st) / 1e6, m3_st_nfiles(m->st), fm, m->load_seconds, where,
            m->cfg.fc1_quant ? "; routed experts' FC1 input in NVFP4 per token" : "");
    return 0;
}
