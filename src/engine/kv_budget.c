/* The KV pool's size when the user gives none (see kv_budget.h). */
#include "kv_budget.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/group.h"

#define GIB 1073741824.0

/* The profile step's inputs: T stand-in tokens of one sequence at positions 0..T-1, the logits
 * of its last n_out, every token's prompt logprobs when n_lp (m3_taps.lp_rows) */
typedef struct {
    int T, n_out, n_lp;
    int32_t *ids, *pos, *sq, *lpr;
    int *rows;
    float *lg;
    m3_row_lp *lpo;
    m3_taps taps;
} prof_step;

static void prof_free(prof_step *p) {
    free(p->ids); free(p->pos); free(p->sq); free(p->rows); free(p->lg); free(p->lpr); free(p->lpo);
}

static int check_utilization(double u, m3_err *err) {
    if (u > 0 && u <= 1) return 0;
    return m3_errf(err, "--gpu-memory-utilization %g: expected a fraction in (0, 1]", u);
}

static int prof_init(prof_step *p, int max_tokens, int max_rows, int n_lp, int vocab, m3_err *err) {
    memset(p, 0, sizeof *p);
    const int T = max_tokens < 1 ? 1 : max_tokens, n_out = max_rows < 1 ? 1 : max_rows > T ? T : max_rows;
    p->T = T, p->n_out = n_out, p->n_lp = n_lp ? T : 0;
    p->ids = calloc((size_t)T, sizeof *p->ids), p->pos = malloc(sizeof *p->pos * (size_t)T);
    p->sq = calloc((size_t)T, sizeof *p->sq), p->rows = malloc(sizeof *p->rows * (size_t)n_out);
    p->lg = malloc(sizeof *p->lg * (size_t)n_out * (size_t)vocab);
    if (p->n_lp) p->lpr = malloc(sizeof *p->lpr * 2 * (size_t)T), p->lpo = malloc(sizeof *p->lpo * (size_t)T);
    if (!p->ids || !p->pos || !p->sq || !p->rows || !p->lg || (p->n_lp && (!p->lpr || !p->lpo))) {
        prof_free(p);
        return m3_errf(err, "kv budget: out of memory");
    }
    for (int t = 0; t < T; t++) p->pos[t] = t;
    m3_stand_in_ids(p->ids, T, vocab);
    for (int i = 0; i < n_out; i++) p->rows[i] = T - n_out + i;
    if (p->n_lp) {
        for (int t = 0; t < T; t++) {
            p->lpr[t] = t;
            p->lpr[T + t] = vocab;
        }
        p->taps.lp_rows = p->lpr;
        p->taps.lp_tok = p->ids;
        p->taps.lp_n = p->lpr + T;
        p->taps.n_lp = p->n_lp;
        p->taps.lp_k = M3_ROW_TOP_MAX;
        p->taps.lp_out = p->lpo;
    }
    return 0;
}

int m3_kv_budget_device(m3_model *m, m3_kv_dtype dt, m3_kv_dtype idt, int max_tokens, int max_rows, int prompt_rows,
                        double utilization,
                        size_t *bytes, char *how, size_t how_cap, m3_err *err) {
    const m3_ops *op = m->ops;
    if (!op || !op->mem_info) return m3_errf(err, "kv budget: the backend cannot report its memory");
    if (check_utilization(utilization, err)) return -1;
    prof_step p;
    if (prof_init(&p, max_tokens, max_rows, prompt_rows && op->logprob_rows, m->cfg.vocab, err)) return -1;
    const int T = p.T, page = m3_kv_page_tokens(&m->cfg);
    m3_kv kv;
    m3_kv_mem mem = m3_model_kv_mem(m);
    m3_kv_seq seq = {0};
    int rc = 0;
    if (m3_kv_create_in(&kv, &m->cfg, dt, idt, page, (T + page - 1) / page, &mem, err))
        rc = m3_err_prefix(err, "kv budget: the profile step's cache");
    else {
        m3_kv_seq *seqs[1] = {&seq};
        m3_batch b = {T, p.pos, p.sq, seqs};
        if (m3_forward(m, &kv, &b, p.ids, p.rows, p.n_out, p.lg, p.n_lp ? &p.taps : NULL, err))
            rc = m3_err_prefix(err, "kv budget: the profile step (%d tokens, %d logits rows, %d prompt logprob rows)", T,
                               p.n_out, p.n_lp);
        m3_kv_seq_release(&kv, &seq);
        free(seq.pages);
        m3_kv_destroy(&kv);
    }
    prof_free(&p);
    if (rc) return -1;
    size_t fr = 0, tot = 0;
    op->mem_info(op->ctx, &fr, &tot);
    const double keep = (1 - utilization) * (double)tot;
    if ((double)fr <= keep)
        return m3_errf(err, "no device memory left for the KV cache: %.2f GiB free of %.2f GiB after the weights and a "
                       "%d-token step, and --gpu-memory-utilization %.2f keeps %.2f GiB free (raise it, or lower "
                       "--max-num-batched-tokens)", fr / GIB, tot / GIB, T, utilization, keep / GIB);
    *bytes = (size_t)((double)fr - keep);
    snprintf(how, how_cap, "%.2f x %.1f GiB of device memory less %.2f GiB in use after the weights and a profiled %d-token step",
             utilization, tot / GIB, (tot - fr) / GIB, T);
    return 0;
}

int m3_kv_budget_group(struct m3_group *g, m3_kv_dtype dt, m3_kv_dtype idt, int max_tokens, int max_rows,
                       double utilization, size_t *bytes, char *how, size_t how_cap, m3_err *err) {
    if (check_utilization(utilization, err)) return -1;
    const int n = m3_group_size(g);
    for (int r = 0; r < n; r++) {
        const m3_ops *op = m3_group_model(g, r)->ops;
        if (!op || !op->mem_info) return m3_errf(err, "kv budget: rank %d's backend cannot report its memory", r);
    }
    const m3_config *c = &m3_group_model(g, 0)->cfg;
    prof_step p;
    if (prof_init(&p, max_tokens, max_rows, 0, c->vocab, err)) return -1;
    const int T = p.T, page = m3_kv_page_tokens(c);
    int rc = 0;
    if (m3_group_kv_create(g, dt, idt, page, (T + page - 1) / page, err))
        rc = m3_err_prefix(err, "kv budget: the profile step's cache");
    else {
        m3_kv_seq seq = {0};
        m3_kv_seq *seqs[1] = {&seq};
        m3_batch b = {T, p.pos, p.sq, seqs};
        if (m3_group_forward(g, &b, p.ids, p.rows, p.n_out, p.lg, NULL, err))
            rc = m3_err_prefix(err, "kv budget: the profile step (%d tokens, %d logits rows) over %d ranks", T, p.n_out, n);
        m3_kv_seq_release(m3_group_kv(g, 0), &seq);
        free(seq.pages);
        /* the profile's pool down to a page (the engine makes the real one next) */
        m3_err e2;
        if (m3_group_kv_create(g, dt, idt, page, 1, rc ? &e2 : err) && !rc)
            rc = m3_err_prefix(err, "kv budget: the profile step's cache, made one page");
    }
    prof_free(&p);
    if (rc) return -1;
    double best = -1, tot0 = 0, used0 = 0;
    int worst = 0;
    for (int r = 0; r < n; r++) {
        const m3_ops *op = m3_group_model(g, r)->ops;
        size_t fr = 0, tot = 0;
        op->mem_info(op->ctx, &fr, &tot);
        const double avail = (double)fr - (1 - utilization) * (double)tot;
        if (r == 0 || avail < best) best = avail, tot0 = (double)tot, used0 = (double)(tot - fr), worst = r;
    }
    if (best <= 0)
        return m3_errf(err, "no device memory left for the KV cache on rank %d: %.2f GiB in use of %.2f GiB after its "
                       "weights and a %d-token step, and --gpu-memory-utilization %.2f keeps %.2f GiB free (raise it, or "
                       "lower --max-num-batched-tokens)", worst, used0 / GIB, tot0 / GIB, T, utilization,
                       (1 - utilization) * tot0 / GIB);
    *bytes = (size_t)best;
    snprintf(how, how_cap, "%.2f x %.1f GiB of device memory less %.2f GiB in use after the weights and a profiled "
             "%d-token step, on rank %d (the fullest of %d)", utilization, tot0 / GIB, used0 / GIB, T, worst, n);
    return 0;
}

size_t m3_kv_budget_host(char *how, size_t how_cap) {
    size_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) { avail = (size_t)kb << 10; break; }
    }
    if (f) fclose(f);
    if (!avail) { /* no /proc: the physical memory */
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (pages > 0 && psz > 0) avail = (size_t)pages * (size_t)psz;
    }
    size_t b = avail / 4, cap = (size_t)4 << 30, floor_b = (size_t)64 << 20;
    if (!avail || b > cap) b = cap;
    if (b < floor_b) b = floor_b;
    snprintf(how, how_cap, "host memory: a quarter of the %.1f GiB available, at most 4 GiB", avail / GIB);
    return b;
}
