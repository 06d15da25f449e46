/* The KV pool's size when the user gives none (see kv_budget.h). */
#include "kv_budget.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/group.h"

#define GIB 1073741824.0
/* a tensor-parallel rank's step workspace, not profiled (activations of a 512-token step at
 * M3.1-Flash shapes, the logits rows and the backend's scratch fit with room) */
#define TP_RESERVE ((size_t)4 << 30)

int m3_kv_budget_device(m3_model *m, m3_kv_dtype dt, m3_kv_dtype idt, int max_tokens, int max_rows, int prompt_rows,
                        double utilization,
                        size_t *bytes, char *how, size_t how_cap, m3_err *err) {
    const m3_ops *op = m->ops;
    if (!op || !op->mem_info) return m3_errf(err, "kv budget: the backend cannot report its memory");
    if (!(utilization > 0 && utilization <= 1))
        return m3_errf(err, "--gpu-memory-utilization %g: expected a fraction in (0, 1]", utilization);
    const int T = max_tokens < 1 ? 1 : max_tokens, n_out = max_rows < 1 ? 1 : max_rows > T ? T : max_rows;
    const int page = m3_kv_page_tokens(&m->cfg);
    m3_kv kv;
    m3_kv_mem mem = m3_model_kv_mem(m);
    m3_kv_seq seq = {0};
    int32_t *ids = calloc((size_t)T, sizeof *ids), *pos = malloc(sizeof *pos * (size_t)T), *sq = calloc((size_t)T, sizeof *sq);
    int *rows = malloc(sizeof *rows * (size_t)n_out);
    float *lg = malloc(sizeof *lg * (size_t)n_out * (size_t)m->cfg.vocab);
    const int n_lp = prompt_rows && op->logprob_rows ? T : 0; /* every token a prompt logprob row */
    int32_t *lpr = n_lp ? malloc(sizeof *lpr * 2 * (size_t)T) : NULL;
    m3_row_lp *lpo = n_lp ? malloc(sizeof *lpo * (size_t)T) : NULL;
    int rc = 0;
    if (!ids || !pos || !sq || !rows || !lg || (n_lp && (!lpr || !lpo))) rc = m3_errf(err, "kv budget: out of memory");
    else if (m3_kv_create_in(&kv, &m->cfg, dt, idt, page, (T + page - 1) / page, &mem, err))
        rc = m3_err_prefix(err, "kv budget: the profile step's cache");
    else {
        for (int t = 0; t < T; t++) pos[t] = t;
        m3_stand_in_ids(ids, T, m->cfg.vocab);
        for (int i = 0; i < n_out; i++) rows[i] = T - n_out + i;
        m3_kv_seq *seqs[1] = {&seq};
        m3_batch b = {T, pos, sq, seqs};
        m3_taps taps = {0};
        if (n_lp) {
            for (int t = 0; t < T; t++) {
                lpr[t] = t;
                lpr[T + t] = m->cfg.vocab;
            }
            taps.lp_rows = lpr;
            taps.lp_tok = ids;
            taps.lp_n = lpr + T;
            taps.n_lp = n_lp;
            taps.lp_k = M3_ROW_TOP_MAX;
            taps.lp_out = lpo;
        }
        if (m3_forward(m, &kv, &b, ids, rows, n_out, lg, n_lp ? &taps : NULL, err))
            rc = m3_err_prefix(err, "kv budget: the profile step (%d tokens, %d logits rows, %d prompt logprob rows)", T,
                               n_out, n_lp);
        m3_kv_seq_release(&kv, &seq);
        free(seq.pages);
        m3_kv_destroy(&kv);
    }
    free(ids); free(pos); free(sq); free(rows); free(lg); free(lpr); free(lpo);
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

int m3_kv_budget_group(struct m3_group *g, double utilization, size_t extra, size_t *bytes, char *how, size_t how_cap,
                       m3_err *err) {
    const double reserve = (double)TP_RESERVE + (double)extra;
    if (!(utilization > 0 && utilization <= 1))
        return m3_errf(err, "--gpu-memory-utilization %g: expected a fraction in (0, 1]", utilization);
    const int n = m3_group_size(g);
    double best = -1, tot0 = 0;
    for (int r = 0; r < n; r++) {
        const m3_ops *op = m3_group_model(g, r)->ops;
        if (!op || !op->mem_info) return m3_errf(err, "kv budget: rank %d's backend cannot report its memory", r);
        size_t fr = 0, tot = 0;
        op->mem_info(op->ctx, &fr, &tot);
        double avail = (double)fr - (1 - utilization) * (double)tot - reserve;
        if (best < 0 || avail < best) { best = avail; tot0 = (double)tot; }
    }
    if (best <= 0)
        return m3_errf(err, "no device memory left for the KV cache on some rank after the weights, a %.1f GiB step "
                       "reserve and --gpu-memory-utilization %.2f", reserve / GIB, utilization);
    *bytes = (size_t)best;
    snprintf(how, how_cap, "per rank: %.2f x %.1f GiB of device memory less what is in use and a %.1f GiB step reserve "
             "(the smallest of %d ranks)", utilization, tot0 / GIB, reserve / GIB, n);
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
