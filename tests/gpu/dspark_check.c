/* The DSpark draft on the GPU against the same draft on the CPU (issue 27): one target and its
 * draft loaded on each backend, the same context features (half appended from host rows, half
 * from rows in device memory, as the engine's capture leaves them), then blocks of three
 * requests of different context lengths (inside and past the window) drafted together on the
 * GPU and one at a time on the CPU (the GPU's second halves in one batched append):
 *   - every slot's Markov-corrected row, teacher-forced with the CPU's draws, within 1e-4
 *     relative L2 of the CPU's, and its argmax (the greedy draw) the CPU's wherever the CPU
 *     row's top two are further apart than 1e-3 of its largest magnitude;
 *   - the greedy drafts of m3_spec_draft_n on the GPU equal m3_spec_draft's on the CPU (the
 *     same near-tie exception, reported).
 * Runs on a GPU (scripts/gpu.sh, section 9). With --cpu the "GPU" side is a second CPU op table
 * (ctest dspark_batch: the batched pass, slot-major rows and the append from backend rows
 * against one request at a time); with --ops-only only the op checks run (argmax_rows, logprob_rows, draw_rows, verify_rows, copy_n:
 * the kernels a racecheck can take).  usage: dspark_check [--cpu | --ops-only] CHECKPOINT (with dspark/) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cuda/cuda.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "model/dspark.h"
#include "model/m3.h"

enum { NR = 3, K = 7 };
static const int LEN[NR] = {100, 23, 64}; /* context positions per request (window 64 in make-tiny's draft) */

static uint64_t rs = 88172645463325252ull;
static float frand(void) {
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* the top two of a row: argmax and the gap to the second */
static int top2(const float *r, int V, float *gap, float *mag) {
    int a = 0;
    float b1 = -INFINITY, b2 = -INFINITY, mx = 0;
    for (int i = 0; i < V; i++) {
        if (fabsf(r[i]) > mx) mx = fabsf(r[i]);
        if (r[i] > b1) { b2 = b1; b1 = r[i]; a = i; }
        else if (r[i] > b2) b2 = r[i];
    }
    *gap = b1 - b2;
    *mag = mx;
    return a;
}

int main(int argc, char **argv) {
    const int cpu = argc == 3 && !strcmp(argv[1], "--cpu"), ops_only = argc == 3 && !strcmp(argv[1], "--ops-only");
    if (argc != 2 && !cpu && !ops_only) { fprintf(stderr, "usage: dspark_check [--cpu | --ops-only] CHECKPOINT\n"); return 2; }
    const char *dir = argv[argc - 1];
    setenv("M3_DRAWS", "backend", 1); /* the CPU drafts through draw_rows too (its default: the host's loop) */
    char ddir[4200];
    snprintf(ddir, sizeof ddir, "%s/dspark", dir);
    m3_ops cops, gops;
    m3_model mc, mg;
    m3_dspark dc, dg;
    m3_err err;
    if (m3_cpu_ops_init(&cops, 2, &err) || (cpu ? m3_cpu_ops_init(&gops, 2, &err) : m3_cuda_ops_init(&gops, 0, &err))) {
        printf("FAIL ops: %s\n", err.msg);
        return 1;
    }
    if (m3_model_load(&mc, dir, &cops, NULL, NULL, &err) || m3_model_load(&mg, dir, &gops, NULL, NULL, &err) ||
        m3_dspark_load(&dc, ddir, &mc, &cops, &err) || m3_dspark_load(&dg, ddir, &mg, &gops, &err)) {
        printf("FAIL load: %s\n", err.msg);
        return 1;
    }
    int fails = 0, ties = 0;
    {   /* argmax_rows (the greedy draws) against the CPU's rule on rows of the M3 vocabulary's width:
         * ties across the GPU's chunks, NaN at 0, rows of NaN or -inf, NaN beside the maximum, a
         * text width below the row's */
        enum { AR = 8, AW = 200064 };
        const int an[AR] = {AW, AW, AW, AW, AW, AW, 200000, 5};
        float *ax = malloc(sizeof(float) * AR * AW), *dax = gops.alloc(gops.ctx, sizeof(float) * AR * AW);
        int32_t *dai = gops.alloc(gops.ctx, sizeof(int32_t) * AR), ag[AR], ac[AR];
        if (!ax || !dax || !dai) { printf("FAIL out of memory\n"); return 1; }
        for (size_t i = 0; i < (size_t)AR * AW; i++) ax[i] = frand();
        ax[0 * AW + 150000] = ax[0 * AW + 9000] = 5.0f;      /* a tie in two chunks: the first */
        ax[1 * AW + 0] = NAN; ax[1 * AW + 7] = 9.0f;         /* NaN at 0: 0 */
        for (int i = 0; i < AW; i++) { ax[2 * AW + i] = NAN; ax[3 * AW + i] = -INFINITY; }
        ax[4 * AW + 100] = NAN; ax[4 * AW + 199999] = 7.0f;  /* NaN never wins */
        ax[5 * AW + 200063] = 3.0f;                           /* the last value */
        ax[6 * AW + 200001] = 8.0f;                           /* past the text width */
        gops.upload(gops.ctx, dax, ax, sizeof(float) * AR * AW);
        for (int r = 0; r < AR; r++) {
            gops.argmax_rows(gops.ctx, dax + (size_t)r * AW, 1, an[r], AW, dai + r);
            cops.argmax_rows(cops.ctx, ax + (size_t)r * AW, 1, an[r], AW, ac + r);
        }
        gops.download(gops.ctx, ag, dai, sizeof ag);
        int bad = 0;
        for (int r = 0; r < AR; r++) bad += ag[r] != ac[r];
        gops.argmax_rows(gops.ctx, dax, AR, AW, AW, dai); /* all rows in one call */
        gops.download(gops.ctx, ag, dai, sizeof ag);
        for (int r = 0; r < AR; r++) {
            int want;
            cops.argmax_rows(cops.ctx, ax + (size_t)r * AW, 1, AW, AW, &want);
            bad += ag[r] != want;
        }
        { /* argmax_rows_fin: the same ids, and whether each whole row is finite (rows 1-4 are not) */
            int32_t *dfin = gops.alloc(gops.ctx, sizeof(int32_t) * AR), gf[AR], cf[AR], ci[AR];
            if (!dfin) { printf("FAIL out of memory\n"); return 1; }
            gops.argmax_rows_fin(gops.ctx, dax, AR, 200000, AW, AW, dai, dfin);
            gops.download(gops.ctx, ag, dai, sizeof ag);
            gops.download(gops.ctx, gf, dfin, sizeof gf);
            cops.argmax_rows_fin(cops.ctx, ax, AR, 200000, AW, AW, ci, cf);
            for (int r = 0; r < AR; r++) bad += ag[r] != ci[r] || gf[r] != cf[r] || cf[r] != (r < 1 || r > 4);
            gops.release(gops.ctx, dfin);
        }
        printf("argmax_rows(_fin): %d rows (ties across chunks, NaN, -inf, a narrower text width, finite flags) %s\n", AR,
               bad ? "FAIL: differs from the CPU's" : "as the CPU's");
        if (bad) { printf("FAIL argmax_rows: %d rows differ\n", bad); return 1; }
        if (ac[0] != 9000 || ac[1] != 0 || ac[2] != 0 || ac[3] != 0 || ac[4] != 199999 || ac[5] != 200063) {
            printf("FAIL argmax_rows: the CPU's rule changed (%d %d %d %d %d %d)\n", ac[0], ac[1], ac[2], ac[3], ac[4], ac[5]);
            return 1;
        }
        gops.release(gops.ctx, dax);
        gops.release(gops.ctx, dai);
        free(ax);
    }
    {   /* logprob_rows (prompt logprobs where the logits are) against the CPU's (base/rows.c
         * m3_row_logprobs): 300 rows of the M3 vocabulary's width in one call (two launches), and
         * single rows (the most slices a row): random rows, rows of few distinct values (ties for
         * the rank and the top ids, settled by the lower id), the token's value shared, a token
         * outside the text ids (-1, n), a narrower text width with larger values past it, NaN / +inf
         * / -inf (not finite); k 0, 1, 7 and 20; and a 5-id vocabulary (fewer ids than k). The same
         * finite flags, ranks and top ids; logprobs within 1e-4 (the GPU sums exp in float a thread, the
         * CPU in double across blocks of 256; a worst case of a few hundred float additions is ~2e-5). (--cpu: 24 rows, the CPU against
         * itself: what it checks there is the rule's fixed points below.) */
        enum { LRMAX = 300, LW = 200064 };
        const int LR = cpu ? 24 : LRMAX;
        float *x = malloc(sizeof(float) * (size_t)LR * LW), *dx = gops.alloc(gops.ctx, sizeof(float) * (size_t)LR * LW);
        m3_row_lp *dlp = gops.alloc(gops.ctx, sizeof(m3_row_lp) * LR), *gl = malloc(sizeof(m3_row_lp) * LR),
                  *cl = malloc(sizeof(m3_row_lp) * LR);
        int32_t tok[LRMAX];
        if (!x || !dx || !dlp || !gl || !cl) { printf("FAIL out of memory\n"); return 1; }
        for (int r = 0; r < LR; r++) {
            float *row = x + (size_t)r * LW;
            const int kind = r % 6;
            for (int i = 0; i < LW; i++) {
                const float u = frand();
                row[i] = kind == 1 ? floorf(u * 4.0f) * 2.0f : kind == 2 ? floorf(u * 40.0f) * 0.25f : u * 8.0f;
            }
            tok[r] = (int32_t)((frand() * 0.5f + 0.5f) * (LW - 1));
            if (kind == 3) tok[r] = r % 12 == 3 ? -1 : 200000; /* outside the text ids in the single-row pass (n 200000) */
            if (kind == 4) row[tok[r]] = 9.0f, row[(tok[r] + 77777) % LW] = 9.0f; /* the best, shared */
            if (kind == 3) row[200010] = 50.0f; /* past the text width there: not counted */
        }
        x[(size_t)5 * LW + 123] = NAN;
        x[(size_t)11 * LW + 200063] = INFINITY;
        x[(size_t)17 * LW + 0] = -INFINITY;
        gops.upload(gops.ctx, dx, x, sizeof(float) * (size_t)LR * LW);
        int bad = 0, nfin = 0;
        double worst = 0;
        const int ks[4] = {20, 7, 1, 0};
        for (int ki = 0; ki < 4; ki++) {
            const int k = ks[ki];
            for (int pass = 0; pass < 2; pass++) { /* all rows in one call; then each kind's rows as single rows */
                const int n = pass == 0 ? LW : 200000;
                if (pass == 0) gops.logprob_rows(gops.ctx, dx, LR, n, LW, LW, tok, k, dlp);
                else
                    for (int r = 0; r < 12; r++) gops.logprob_rows(gops.ctx, dx + (size_t)r * LW, 1, n, LW, LW, tok + r, k, dlp + r);
                const int nr = pass == 0 ? LR : 12;
                gops.download(gops.ctx, gl, dlp, sizeof(m3_row_lp) * (size_t)nr);
                cops.logprob_rows(cops.ctx, x, nr, n, LW, LW, tok, k, cl);
                for (int r = 0; r < nr; r++) {
                    const m3_row_lp *g = &gl[r], *c = &cl[r];
                    int d = g->fin != c->fin;
                    if (c->fin && !d) {
                        nfin += ki == 0 && pass == 0;
                        d = g->rank != c->rank || g->n_top != c->n_top ||
                            !(fabs((double)g->logprob - c->logprob) < 1e-4 || (isinf(g->logprob) && isinf(c->logprob)));
                        worst = isfinite(c->logprob) && fabs((double)g->logprob - c->logprob) > worst ? fabs((double)g->logprob - c->logprob) : worst;
                        for (int j = 0; !d && j < c->n_top; j++)
                            d = g->top_ids[j] != c->top_ids[j] || fabs((double)g->top_lp[j] - c->top_lp[j]) > 1e-4;
                    }
                    if (d && bad < 5)
                        printf("  logprob_rows row %d (k %d, n %d): gpu fin %d rank %d top %d lp %.7f [%d %d]; cpu fin %d rank %d top %d "
                               "lp %.7f [%d %d]\n", r, k, n, g->fin, g->rank, g->n_top, g->logprob, g->top_ids[0], g->top_ids[1],
                               c->fin, c->rank, c->n_top, c->logprob, c->top_ids[0], c->top_ids[1]);
                    bad += d;
                }
            }
        }
        if (cl[5].fin || cl[11].fin || cl[17].fin || !cl[0].fin || cl[3].rank != 200001 || !isinf(cl[3].logprob) || cl[4].rank != 1 ||
            cl[1].n_top != 0)
            printf("FAIL logprob_rows: the CPU's rule changed (fin %d %d %d %d, rank %d %d, top %d)\n", cl[5].fin, cl[11].fin,
                   cl[17].fin, cl[0].fin, cl[3].rank, cl[4].rank, cl[1].n_top), bad++;
        { /* a 5-id vocabulary: every id in the top 20 */
            float sx[5] = {0.5f, 2.0f, 2.0f, -1.0f, 0.0f};
            int32_t st = 2;
            gops.upload(gops.ctx, dx, sx, sizeof sx);
            gops.logprob_rows(gops.ctx, dx, 1, 5, 5, 5, &st, 20, dlp);
            gops.download(gops.ctx, gl, dlp, sizeof(m3_row_lp));
            cops.logprob_rows(cops.ctx, sx, 1, 5, 5, 5, &st, 20, cl);
            int d = gl[0].n_top != 5 || cl[0].n_top != 5 || gl[0].rank != 1 || cl[0].rank != 1 || gl[0].fin != 1;
            for (int j = 0; !d && j < 5; j++) d = gl[0].top_ids[j] != cl[0].top_ids[j] || fabsf(gl[0].top_lp[j] - cl[0].top_lp[j]) > 1e-4f;
            d |= cl[0].top_ids[0] != 1 || cl[0].top_ids[1] != 2;
            if (d) printf("  logprob_rows, 5 ids: gpu top %d rank %d; cpu top %d rank %d\n", gl[0].n_top, gl[0].rank, cl[0].n_top, cl[0].rank);
            bad += d;
        }
        printf("logprob_rows: %d rows x k 20 / 7 / 1 / 0 in one call and alone (%d finite; ties, tokens outside the text, "
               "a narrower width, NaN / inf), a 5-id vocabulary: %s (logprobs within %.2e)\n", LR, nfin,
               bad ? "FAIL: differs from the CPU's" : "as the CPU's", worst);
        if (bad) { printf("FAIL logprob_rows: %d rows differ\n", bad); return 1; }
        gops.release(gops.ctx, dx);
        gops.release(gops.ctx, dlp);
        free(x);
        free(gl);
        free(cl);
    }
    {   /* draw_rows (the probabilistic draws) against the CPU's rule: 40 rows of the M3 vocabulary's
         * width in one call (two launches of the CUDA table), peaked and flat, rows of few distinct
         * values (ties at the cuts), every filter alone and together, greedy, a narrower text width,
         * +inf / NaN-at-0 / -inf rows. The same kept ids,
         * probabilities within 1e-5 relative, the same draw unless the uniform lies within 1e-9 of
         * a boundary of the CPU's running sum (the sums' order differs) */
        enum { DRN = 40, AW = 200064 };
        float *hx = malloc(sizeof(float) * DRN * AW), *hc = malloc(sizeof(float) * DRN * AW), *hg = malloc(sizeof(float) * DRN * AW);
        float *dx = gops.alloc(gops.ctx, sizeof(float) * DRN * AW);
        int32_t *dids = gops.alloc(gops.ctx, sizeof(int32_t) * DRN), gid[DRN], cid[DRN];
        if (!hx || !hc || !hg || !dx || !dids) { printf("FAIL out of memory\n"); return 1; }
        m3_draw_param par[DRN];
        for (int r = 0; r < DRN; r++) {
            float *row = hx + (size_t)r * AW;
            const float sd = r % 3 == 0 ? 3.0f : 1.0f;
            for (int i = 0; i < AW; i++) row[i] = sd * frand();
            for (int j = 0; j < 20; j++) row[(int)((frand() + 1) * 0.5f * (AW - 1))] += r % 2 ? 9.0f : 2.0f;
            if (r % 4 == 1)
                for (int i = 0; i < AW; i++) row[i] = roundf(row[i] * 4) / 4; /* ties at every cut */
            const float T[4] = {1.0f, 0.7f, 1.3f, 0.0f};
            const int tk[5] = {0, 40, 5000, 1, 0};
            const float tp[3] = {1.0f, 0.9f, 0.5f};
            par[r] = (m3_draw_param){T[r % 4], tp[r % 3], r % 7 == 2 ? 0.05f : 0.0f, tk[r % 5], r % 6 == 5 ? 200000 : AW,
                                     (r * 0.618034) - (int)(r * 0.618034)};
        }
        for (int i = 0; i < AW; i++) { hx[37 * AW + i] = 0; hx[38 * AW + i] = (float)(i % 13); hx[39 * AW + i] = -INFINITY; }
        hx[37 * AW + 4] = INFINITY;
        hx[38 * AW] = NAN;
        par[37].temperature = par[38].temperature = par[39].temperature = 1.0f;
        memcpy(hc, hx, sizeof(float) * DRN * AW);
        gops.upload(gops.ctx, dx, hx, sizeof(float) * DRN * AW);
        gops.draw_rows(gops.ctx, dx, DRN, AW, AW, par, dids);
        cops.draw_rows(cops.ctx, hc, DRN, AW, AW, par, cid);
        gops.download(gops.ctx, hg, dx, sizeof(float) * DRN * AW);
        gops.download(gops.ctx, gid, dids, sizeof gid);
        if (gops.check && gops.check(gops.ctx, &err)) { printf("FAIL draw_rows: %s\n", err.msg); return 1; }
        int bad_set = 0, bad_val = 0, bad_id = 0, near = 0;
        double wrel = 0;
        long kept = 0;
        for (int r = 0; r < DRN; r++) {
            const float *c = hc + (size_t)r * AW, *g = hg + (size_t)r * AW;
            double tot = 0;
            for (int i = 0; i < AW; i++) {
                kept += c[i] > 0;
                if ((c[i] > 0) != (g[i] > 0)) { bad_set++; continue; }
                if (c[i] > 0) {
                    const double rel = fabs((double)g[i] - c[i]) / c[i];
                    wrel = rel > wrel ? rel : wrel;
                    bad_val += rel > 1e-5;
                }
                tot += c[i];
            }
            if (gid[r] == cid[r]) continue;
            double acc = 0, x = par[r].u * tot; /* the CPU's stretches: is u near a boundary? */
            int close = 0;
            for (int i = 0; i < AW && !close; i++) {
                if (!(c[i] > 0)) continue;
                close = fabs(x - acc) < 1e-9 * tot;
                acc += c[i];
            }
            if (close) near++;
            else { bad_id++; printf("FAIL draw_rows row %d: drew %d (gpu) vs %d (cpu)\n", r, gid[r], cid[r]); }
        }
        printf("draw_rows: %d rows, %ld kept ids: %d kept by one side only, %d probabilities off 1e-5 (worst rel %.2g), %d draws "
               "differ (%d at a boundary)\n", DRN, kept, bad_set, bad_val, wrel, bad_id + near, near);
        if (cid[37] != 4 || cid[38] != 0 || cid[39] != 0) { printf("FAIL draw_rows: the CPU's rule changed (%d %d %d)\n", cid[37], cid[38], cid[39]); fails++; }
        if (bad_set || bad_val || bad_id) { printf("FAIL draw_rows differs from the CPU's\n"); fails++; }
        {   /* verify_rows (sampled drafts verified where the rows are) against the CPU's, on the same
             * rows: the CPU's distributions above as the target's p, 17 groups (two launches) of k 0..7;
             * q_i = p_i (every draft accepted), p_i reweighted (some), another row's (few), one-hot
             * (greedy drafts), and one whose residual has no mass left (p = q but a hair at d). The
             * rule is integers: every id equal */
            enum { NG = 17 };
            static const int KS[NG] = {7, 0, 1, 3, 2, 1, 0, 2, 1, 0, 1, 2, 1, 0, 1, 0, 1};
            m3_verify_group vg[NG], cg[NG];
            int nq = 0, r0 = 0;
            for (int j = 0; j < NG; j++) nq += KS[j];
            float *hq = malloc(sizeof(float) * (size_t)nq * AW);
            float *dq = gops.alloc(gops.ctx, sizeof(float) * (size_t)nq * AW), *dp = gops.alloc(gops.ctx, sizeof(float) * DRN * AW);
            int32_t *dout = gops.alloc(gops.ctx, sizeof(int32_t) * DRN), cout[DRN], gout[DRN];
            if (!hq || !dq || !dp || !dout) { printf("FAIL out of memory\n"); return 1; }
            int qi = 0;
            for (int j = 0; j < NG; j++) {
                m3_verify_group *G = &vg[j];
                memset(G, 0, sizeof *G);
                G->row0 = r0;
                G->k = KS[j];
                const int kind = j % 4; /* 0: q = p, 1: reweighted, 2: another row's, 3: one-hot */
                for (int i = 0; i < G->k; i++, qi++) {
                    const float *pr = hc + (size_t)(r0 + i) * AW;
                    float *q = hq + (size_t)qi * AW;
                    if (kind == 2) memcpy(q, hc + (size_t)((r0 + i + 11) % DRN) * AW, sizeof(float) * AW);
                    else {
                        double z = 0;
                        for (int t = 0; t < AW; t++) z += q[t] = kind == 1 ? pr[t] * (1.0f + 0.4f * frand()) : pr[t];
                        for (int t = 0; kind == 1 && t < AW; t++) q[t] = (float)(q[t] / z);
                    }
                    G->d[i] = m3_spec_draw(q, AW, 0.5 + 0.5 * frand());
                    if (kind == 3) { G->d[i] = cid[r0 + i]; } /* greedy drafts: an id of p's own (its draw) */
                }
                for (int i = 0; i <= G->k; i++) G->u[i] = 0.5 + 0.5 * frand();
                r0 += G->k + 1;
            }
            {   /* group 2 (k 1): no residual mass left */
                m3_verify_group *G = &vg[2];
                const float *pr = hc + (size_t)G->row0 * AW;
                int32_t a = 0;
                for (int t = 1; t < AW; t++) a = pr[t] > pr[a] ? t : a;
                float *q = hq + (size_t)(KS[0] + KS[1]) * AW;
                memcpy(q, pr, sizeof(float) * AW);
                q[a] = nextafterf(pr[a], 2.0f);
                G->d[0] = a;
                G->u[0] = 1 - 0x1.0p-40;
            }
            memcpy(cg, vg, sizeof vg);
            for (int j = 0, o = 0; j < NG; j++) { /* the q rows: device memory for the GPU, host for the CPU */
                vg[j].q = j % 4 == 3 ? NULL : dq + (size_t)o * AW;
                cg[j].q = j % 4 == 3 ? NULL : hq + (size_t)o * AW;
                o += KS[j];
            }
            for (int r = 0; r < DRN; r++) cout[r] = -7;
            for (int j = 0; j < NG; j++) cout[vg[j].row0 + vg[j].k] = cid[vg[j].row0 + vg[j].k]; /* the bonus draws */
            gops.upload(gops.ctx, dp, hc, sizeof(float) * DRN * AW);
            gops.upload(gops.ctx, dq, hq, sizeof(float) * (size_t)nq * AW);
            gops.upload(gops.ctx, dout, cout, sizeof cout);
            gops.verify_rows(gops.ctx, dp, AW, AW, NG, vg, dout);
            cops.verify_rows(cops.ctx, hc, AW, AW, NG, cg, cout);
            gops.download(gops.ctx, gout, dout, sizeof gout);
            if (gops.check && gops.check(gops.ctx, &err)) { printf("FAIL verify_rows: %s\n", err.msg); return 1; }
            int diff = 0, acc = 0, rej = 0;
            for (int r = 0; r < DRN; r++) diff += gout[r] != cout[r];
            for (int j = 0; j < NG; j++) {
                int i = 0;
                while (i < vg[j].k && cout[vg[j].row0 + i] == vg[j].d[i]) i++;
                acc += i;
                rej += i < vg[j].k;
            }
            printf("verify_rows: %d groups, %d drafts accepted, %d rejections (one with no residual mass): %d ids differ from the "
                   "CPU's\n", NG, acc, rej, diff);
            if (diff || !acc || !rej) { printf("FAIL verify_rows differs from the CPU's or covers too little\n"); fails++; }
            gops.release(gops.ctx, dq);
            gops.release(gops.ctx, dp);
            gops.release(gops.ctx, dout);
            free(hq);
        }
        gops.release(gops.ctx, dx);
        gops.release(gops.ctx, dids);
        free(hx); free(hc); free(hg);
    }
    {   /* copy_n (the context append's ring rows): 70 copies (two launches of the CUDA table), of
         * aligned and unaligned offsets and sizes, one empty, into one buffer; the bytes between
         * the copies' destinations keep their values */
        enum { NCP = 70, CB = 1 << 20 };
        uint8_t *hs = malloc(CB), *hd = malloc(CB), *want = malloc(CB);
        uint8_t *ds = gops.alloc(gops.ctx, CB), *dd = gops.alloc(gops.ctx, CB);
        if (!hs || !hd || !want || !ds || !dd) { printf("FAIL out of memory\n"); return 1; }
        for (int i = 0; i < CB; i++) { hs[i] = (uint8_t)(frand() * 127 + 128); want[i] = (uint8_t)i; }
        gops.upload(gops.ctx, ds, hs, CB);
        gops.upload(gops.ctx, dd, want, CB);
        void *dst[NCP];
        const void *src[NCP];
        size_t bytes[NCP];
        size_t at = 0;
        for (int i = 0; i < NCP; i++) { /* destination i at [at, at + bytes): disjoint, in order */
            const size_t nb = i == 5 ? 0 : i % 3 == 0 ? (size_t)16 * (1 + i * 37 % 500) : (size_t)(1 + i * 131 % 9000);
            const size_t so = i % 4 == 1 ? (size_t)(i * 7 + 3) : (size_t)16 * (i * 11);
            at += i % 2 ? 5 : 16;
            at = i % 3 == 0 ? (at + 15) & ~(size_t)15 : at;
            dst[i] = dd + at;
            src[i] = ds + so;
            bytes[i] = nb;
            memcpy(want + at, hs + so, nb);
            at += nb;
        }
        if (at > CB) { printf("FAIL copy_n check: %zu bytes past its buffer\n", at); return 1; }
        gops.copy_n(&gops, NCP, dst, src, bytes);
        gops.download(gops.ctx, hd, dd, CB);
        const int same = !memcmp(hd, want, CB);
        printf("copy_n: %d copies (aligned, unaligned, empty) %s\n", NCP, same ? "as memcpy" : "FAIL: differ from memcpy");
        if (!same) return 1;
        gops.release(gops.ctx, ds);
        gops.release(gops.ctx, dd);
        free(hs); free(hd); free(want);
    }
    if (ops_only) { /* the ops alone (argmax_rows, draw_rows, verify_rows, copy_n): what a sanitizer's racecheck takes */
        printf("%s: the ops on the GPU against the CPU's\n", fails ? "FAILED" : "ok");
        return fails ? 1 : 0;
    }
    const int V = mc.cfg.vocab, F = m3_dspark_feat_dim(&dc);
    int maxlen = 0;
    for (int j = 0; j < NR; j++) maxlen = LEN[j] > maxlen ? LEN[j] : maxlen;
    float *feat = malloc(sizeof(float) * (size_t)maxlen * F), *rc_ = malloc(sizeof(float) * (size_t)NR * V);
    float *rg = malloc(sizeof(float) * (size_t)NR * V), *scratch = malloc(sizeof(float) * (size_t)K * V);
    float *dfeat = gops.alloc(gops.ctx, sizeof(float) * (size_t)maxlen * F);
    m3_sample_ws *ws = m3_sample_ws_create(V, &err);
    if (!feat || !rc_ || !rg || !scratch || !dfeat || !ws) { printf("FAIL out of memory\n"); return 1; }
    for (size_t i = 0; i < (size_t)maxlen * F; i++) feat[i] = frand();
    gops.upload(gops.ctx, dfeat, feat, sizeof(float) * (size_t)maxlen * F);
    m3_dspark_ctx cc[NR], cg[NR];
    memset(cc, 0, sizeof cc);
    memset(cg, 0, sizeof cg);
    /* the second halves in one batched append (the engine's), request 1's in two pieces */
    m3_dspark_rows half[NR];
    for (int j = 0; j < NR; j++) {
        const int h = LEN[j] / 2, h2 = j == 1 ? h + 3 : h;
        if (m3_dspark_ctx_append(&dc, &cc[j], feat, 0, LEN[j], &err) ||
            m3_dspark_ctx_append(&dg, &cg[j], feat, 0, h, &err) ||
            (h2 > h && m3_dspark_ctx_append_dev(&dg, &cg[j], dfeat + (size_t)h * F, h, h2 - h, &err))) {
            printf("FAIL append: %s\n", err.msg);
            return 1;
        }
        half[j] = (m3_dspark_rows){&cg[j], dfeat + (size_t)h2 * F, h2, LEN[j] - h2};
    }
    {   /* bad batches change nothing: a context twice, a position that is not the context's end */
        m3_dspark_rows twice[2] = {half[0], half[0]}, gap = half[2];
        gap.pos0++;
        if (!m3_dspark_ctx_append_n(&dg, twice, 2, &err) || !m3_dspark_ctx_append_n(&dg, &gap, 1, &err) ||
            cg[0].len != half[0].pos0 || cg[2].len != half[2].pos0) {
            printf("FAIL a bad batched append was taken\n");
            return 1;
        }
    }
    if (m3_dspark_ctx_append_n(&dg, half, NR, &err)) {
        printf("FAIL batched append: %s\n", err.msg);
        return 1;
    }
    for (int j = 0; j < NR; j++)
        if (cg[j].len != LEN[j]) { printf("FAIL batched append: context %d holds %d positions, not %d\n", j, cg[j].len, LEN[j]); return 1; }
    /* teacher-forced rows: CPU one request at a time, GPU all three in one block */
    int32_t anchor[NR] = {77, 5, 300 % V}, prev_c[NR][K + 1];
    double worst = 0;
    for (int j = 0; j < NR; j++) {
        const m3_dspark_ctx *one = &cc[j];
        int pos = LEN[j];
        if (m3_dspark_block_n(&dc, 1, &one, &anchor[j], &pos, K, &err)) { printf("FAIL cpu block: %s\n", err.msg); return 1; }
        prev_c[j][0] = anchor[j];
        for (int i = 0; i < K; i++) {
            if (m3_dspark_markov_n(&dc, i, &prev_c[j][i], rc_ + (size_t)j * V, &err)) { printf("FAIL cpu markov: %s\n", err.msg); return 1; }
            float g, m;
            prev_c[j][i + 1] = top2(rc_ + (size_t)j * V, V, &g, &m);
        }
    }
    const m3_dspark_ctx *gp[NR] = {&cg[0], &cg[1], &cg[2]};
    int gpos[NR] = {LEN[0], LEN[1], LEN[2]};
    if (m3_dspark_block_n(&dg, NR, gp, anchor, gpos, K, &err)) { printf("FAIL gpu block: %s\n", err.msg); return 1; }
    for (int i = 0; i < K; i++) {
        int32_t pv[NR];
        for (int j = 0; j < NR; j++) pv[j] = prev_c[j][i];
        if (m3_dspark_markov_n(&dg, i, pv, rg, &err)) { printf("FAIL gpu markov: %s\n", err.msg); return 1; }
        for (int j = 0; j < NR; j++) { /* the CPU's row of slot i again (its block pass is gone): recompute */
            const m3_dspark_ctx *one = &cc[j];
            int pos = LEN[j];
            float *cr = rc_ + (size_t)j * V;
            if (m3_dspark_block_n(&dc, 1, &one, &anchor[j], &pos, K, &err)) { printf("FAIL cpu block: %s\n", err.msg); return 1; }
            for (int s = 0; s <= i; s++)
                if (m3_dspark_markov_n(&dc, s, &prev_c[j][s], cr, &err)) { printf("FAIL cpu markov: %s\n", err.msg); return 1; }
            double num = 0, den = 0;
            const float *gr = rg + (size_t)j * V;
            for (int v = 0; v < V; v++) { num += (double)(gr[v] - cr[v]) * (gr[v] - cr[v]); den += (double)cr[v] * cr[v]; }
            double rel = sqrt(num / (den > 0 ? den : 1));
            worst = rel > worst ? rel : worst;
            float gc, mc_, gg, mg_;
            int ac = top2(cr, V, &gc, &mc_), ag = top2(gr, V, &gg, &mg_);
            if (rel > 1e-4) { printf("FAIL request %d slot %d: rel L2 %.3g\n", j, i, rel); fails++; }
            if (ac != ag) {
                if (gc > 1e-3f * mc_) { printf("FAIL request %d slot %d: argmax %d (gpu) vs %d (cpu), gap %.3g\n", j, i, ag, ac, gc); fails++; }
                else ties++;
            }
        }
    }
    printf("teacher-forced rows (%d requests x %d slots, one batched block vs one at a time): worst rel L2 %.3g, %d near-tie argmax "
           "differences\n", NR, K, worst, ties);
    /* the engine's drafting: greedy drafts of all three together on the GPU, one by one on the CPU */
    m3_sampler *sm[NR];
    m3_rng rng[NR];
    m3_spec_draft_req rq[NR];
    int32_t dr_g[NR][K], dr_c[NR][K];
    for (int j = 0; j < NR; j++) {
        m3_sampling sp = {0};
        int32_t p0 = 1;
        if (!(sm[j] = m3_sampler_create(&sp, V, &p0, 1, &err))) { printf("FAIL sampler: %s\n", err.msg); return 1; }
        m3_rng_seed(&rng[j], 5);
        int qu;
        if (m3_spec_draft(&dc, &cc[j], sm[j], ws, &rng[j], M3_SPEC_DRAFT_GREEDY, anchor[j], LEN[j], K, scratch, dr_c[j], NULL,
                          &qu, &err)) { printf("FAIL cpu draft: %s\n", err.msg); return 1; }
        rq[j] = (m3_spec_draft_req){&cg[j], sm[j], &rng[j], anchor[j], LEN[j], dr_g[j], NULL, NULL, 0, 0, NULL, 0};
    }
    if (m3_spec_draft_n(&dg, rq, NR, ws, M3_SPEC_DRAFT_GREEDY, K, scratch, &err)) { printf("FAIL gpu draft: %s\n", err.msg); return 1; }
    /* the greedy chain on the backend (m3_dspark_greedy_n, which m3_spec_draft takes) against the
     * slot-by-slot draws of the teacher-forced pass above (markov_n, then the host's argmax):
     * the same ops in the same order on the CPU, so the same ids */
    for (int j = 0; j < NR; j++)
        for (int i = 0; i < K; i++)
            if (dr_c[j][i] != prev_c[j][i + 1]) {
                printf("FAIL request %d slot %d: the CPU's chain drew %d, slot by slot %d\n", j, i, dr_c[j][i], prev_c[j][i + 1]);
                fails++;
            }
    if (dc.cfg.confidence_head) { /* its confidences: chain against confidence_n slot by slot, on each backend */
        m3_dspark *ds[2] = {&dc, &dg};
        m3_dspark_ctx *cx[2] = {cc, cg};
        double cworst = 0;
        for (int b = 0; b < 2; b++) {
            const m3_dspark_ctx *pc[NR] = {&cx[b][0], &cx[b][1], &cx[b][2]};
            int32_t ids[K * NR], pv[NR];
            float cf[K * NR], c1[NR];
            if (m3_dspark_block_n(ds[b], NR, pc, anchor, gpos, K, &err) ||
                m3_dspark_greedy_n(ds[b], anchor, K, V, ids, cf, &err) ||
                m3_dspark_block_n(ds[b], NR, pc, anchor, gpos, K, &err)) { printf("FAIL chain: %s\n", err.msg); return 1; }
            for (int i = 0; i < K; i++) {
                for (int j = 0; j < NR; j++) pv[j] = i ? ids[(i - 1) * NR + j] : anchor[j];
                if (m3_dspark_markov_n(ds[b], i, pv, NULL, &err) || m3_dspark_confidence_n(ds[b], i, c1, &err)) {
                    printf("FAIL confidence: %s\n", err.msg);
                    return 1;
                }
                for (int j = 0; j < NR; j++) {
                    const double e = fabs((double)c1[j] - cf[i * NR + j]);
                    cworst = e > cworst ? e : cworst;
                    if (e > 1e-5) { printf("FAIL %s request %d slot %d: confidence %g (chain) vs %g\n", b ? "gpu" : "cpu", j, i, cf[i * NR + j], c1[j]); fails++; }
                }
            }
        }
        printf("confidence head: the chain's within %.3g of slot by slot\n", cworst);
    }
    {   /* probabilistic drafts of plain samplers (draw_rows on each backend): all three together on
         * the GPU, one by one on the CPU, the same seeds: the same drafts and distributions (rel L2
         * 1e-4), unless a uniform falls within 1e-6 of a boundary of the CPU's distribution */
        float *qc = malloc(sizeof(float) * (size_t)NR * K * V), *qg = malloc(sizeof(float) * (size_t)NR * K * V);
        if (!qc || !qg) { printf("FAIL out of memory\n"); return 1; }
        int32_t pd_g[NR][K], pd_c[NR][K];
        m3_sampler *ps[NR];
        m3_rng pr[NR];
        m3_spec_draft_req pq[NR];
        m3_sampling sp;
        memset(&sp, 0, sizeof sp);
        sp.temperature = 0.9f;
        sp.top_k = 50;
        sp.top_p = 0.95f;
        for (int j = 0; j < NR; j++) {
            int32_t p0 = 1;
            int qu;
            if (!(ps[j] = m3_sampler_create(&sp, V, &p0, 1, &err))) { printf("FAIL sampler: %s\n", err.msg); return 1; }
            m3_rng_seed(&pr[j], 40 + (uint64_t)j);
            if (m3_spec_draft(&dc, &cc[j], ps[j], ws, &pr[j], M3_SPEC_DRAFT_PROBABILISTIC, anchor[j], LEN[j], K, scratch, pd_c[j],
                              qc + (size_t)j * K * V, &qu, &err)) { printf("FAIL cpu probabilistic draft: %s\n", err.msg); return 1; }
            m3_rng_seed(&pr[j], 40 + (uint64_t)j);
            pq[j] = (m3_spec_draft_req){&cg[j], ps[j], &pr[j], anchor[j], LEN[j], pd_g[j], qg + (size_t)j * K * V, NULL, 0, 0, NULL, 0};
        }
        if (m3_spec_draft_n(&dg, pq, NR, ws, M3_SPEC_DRAFT_PROBABILISTIC, K, scratch, &err)) {
            printf("FAIL gpu probabilistic draft: %s\n", err.msg);
            return 1;
        }
        double qworst = 0;
        int pequal = 0, pnear = 0;
        for (int j = 0; j < NR; j++) {
            m3_rng ur;
            m3_rng_seed(&ur, 40 + (uint64_t)j);
            int i = 0;
            for (; i < K; i++) {
                const float *a = qc + ((size_t)j * K + i) * V, *b = qg + ((size_t)j * K + i) * V;
                const double u = m3_rng_uniform(&ur);
                double num = 0, den = 0, tot = 0;
                for (int v = 0; v < V; v++) { num += (double)(a[v] - b[v]) * (a[v] - b[v]); den += (double)a[v] * a[v]; tot += a[v]; }
                const double rel = sqrt(num / (den > 0 ? den : 1));
                qworst = rel > qworst ? rel : qworst;
                if (rel > 1e-4) { printf("FAIL request %d slot %d: distribution rel L2 %.3g\n", j, i, rel); fails++; break; }
                if (pd_g[j][i] == pd_c[j][i]) continue;
                double acc = 0, dmin = 1e300; /* u * tot against the CPU's stretches' ends */
                for (int v = 0; v < V; v++) {
                    if (!(a[v] > 0)) continue;
                    acc += a[v];
                    dmin = fmin(dmin, fabs(acc - u * tot));
                }
                if (dmin < 1e-6 * tot) pnear++;
                else { printf("FAIL request %d slot %d: drew %d (gpu) vs %d (cpu)\n", j, i, pd_g[j][i], pd_c[j][i]); fails++; }
                break; /* the later slots follow other draws */
            }
            pequal += i == K;
        }
        /* the CPU chain's distributions and draws against the host's way, slot by slot: the
         * request alone, each Markov row corrected with the chain's own draw before it, made a
         * distribution by m3_sampler_probs, drawn with the same uniform (its running sum) */
        double hworst = 0;
        float *hq = malloc(sizeof(float) * (size_t)V), *row = malloc(sizeof(float) * (size_t)V);
        if (!hq || !row) { printf("FAIL out of memory\n"); return 1; }
        for (int j = 0; j < NR; j++) {
            const m3_dspark_ctx *one = &cc[j];
            int pos = LEN[j];
            m3_rng ur;
            m3_rng_seed(&ur, 40 + (uint64_t)j);
            if (m3_dspark_block_n(&dc, 1, &one, &anchor[j], &pos, K, &err)) { printf("FAIL cpu block: %s\n", err.msg); return 1; }
            for (int i = 0; i < K; i++) {
                const int32_t prev = i ? pd_c[j][i - 1] : anchor[j];
                if (m3_dspark_markov_n(&dc, i, &prev, row, &err) || m3_sampler_probs(ps[j], row, ws, hq, &err)) {
                    printf("FAIL host distribution: %s\n", err.msg);
                    return 1;
                }
                const float *cq = qc + ((size_t)j * K + i) * V;
                double num = 0, den = 0, tot = 0, acc = 0, dmin = 1e300;
                int setdiff = 0, want = -1;
                for (int v = 0; v < V; v++) {
                    num += (double)(cq[v] - hq[v]) * (cq[v] - hq[v]);
                    den += (double)hq[v] * hq[v];
                    setdiff += (cq[v] > 0) != (hq[v] > 0);
                    tot += hq[v];
                }
                const double u = m3_rng_uniform(&ur) * tot;
                for (int v = 0; v < V && want < 0; v++) {
                    if (!(hq[v] > 0)) continue;
                    dmin = fmin(dmin, fabs(acc - u));
                    acc += hq[v];
                    if (u < acc) want = v;
                }
                const double rel = sqrt(num / (den > 0 ? den : 1));
                hworst = rel > hworst ? rel : hworst;
                if (rel > 1e-5 || setdiff) { printf("FAIL request %d slot %d: chain's distribution vs the host's: rel L2 %.3g, %d ids kept by one only\n", j, i, rel, setdiff); fails++; }
                if (want != pd_c[j][i] && dmin > 1e-6 * tot) { printf("FAIL request %d slot %d: chain drew %d, the host's running sum %d\n", j, i, pd_c[j][i], want); fails++; }
            }
            m3_sampler_free(ps[j]);
        }
        printf("probabilistic chain on the CPU vs the host's slot by slot (m3_sampler_probs, same uniforms): distributions within "
               "rel L2 %.3g, draws equal\n", hworst);
        free(hq);
        free(row);
        printf("probabilistic drafts (T 0.9, top-k 50, top-p 0.95): %d of %d requests equal, %d at a boundary, distributions "
               "within rel L2 %.3g\n", pequal, NR, pnear, qworst);
        free(qc);
        free(qg);
    }
    int same = 0;
    for (int j = 0; j < NR; j++) {
        same += !memcmp(dr_g[j], dr_c[j], sizeof dr_g[j]) && !rq[j].failed;
        printf("request %d (context %d): gpu", j, LEN[j]);
        for (int i = 0; i < K; i++) printf(" %d", dr_g[j][i]);
        printf(" / cpu");
        for (int i = 0; i < K; i++) printf(" %d", dr_c[j][i]);
        printf("\n");
    }
    {   /* one request a pass, as at batch 1: request 0 alone, 5 rounds, its context one position
         * longer each round (past the window: the ring wraps). The CUDA backend records such a pass
         * in a graph from its second time (dspark_attention_table: the positions in device memory)
         * and replays it after; each round's greedy drafts are the CPU's (or differ first at a
         * near tie of the CPU's row) */
        const long r0 = cpu ? 0 : m3_cuda_graph_replays(&gops);
        int rsame = 0, rties = 0, psame = 0, pnear1 = 0;
        enum { ROUNDS = 5 };
        /* ... and probabilistic drafts alone (T 0.9, top-k 50, top-p 0.95; the slots' parameters in
         * device memory, draw_rows_dev): the CPU's, unless a uniform lies within 1e-6 of a
         * boundary of the CPU's distribution */
        m3_sampling psp;
        memset(&psp, 0, sizeof psp);
        psp.temperature = 0.9f;
        psp.top_k = 50;
        psp.top_p = 0.95f;
        int32_t pz = 1;
        m3_sampler *ps1 = m3_sampler_create(&psp, V, &pz, 1, &err);
        float *q1c = malloc(sizeof(float) * (size_t)K * V), *q1g = malloc(sizeof(float) * (size_t)K * V);
        if (!ps1 || !q1c || !q1g) { printf("FAIL sampler / out of memory: %s\n", err.msg); return 1; }
        for (int r = 0; r < ROUNDS; r++) {
            const int len = cc[0].len;
            if (r && (m3_dspark_ctx_append(&dc, &cc[0], feat + (size_t)r * F, len, 1, &err) ||
                      m3_dspark_ctx_append(&dg, &cg[0], feat + (size_t)r * F, len, 1, &err))) {
                printf("FAIL append: %s\n", err.msg);
                return 1;
            }
            const int at = cc[0].len;
            const int32_t an = (int32_t)((anchor[0] + 31 * r) % V);
            int32_t dc1[K], dg1[K];
            int qu;
            m3_spec_draft_req one = {&cg[0], sm[0], &rng[0], an, at, dg1, NULL, NULL, 0, 0, NULL, 0};
            if (m3_spec_draft(&dc, &cc[0], sm[0], ws, &rng[0], M3_SPEC_DRAFT_GREEDY, an, at, K, scratch, dc1, NULL, &qu, &err) ||
                m3_spec_draft_n(&dg, &one, 1, ws, M3_SPEC_DRAFT_GREEDY, K, scratch, &err) || one.failed) {
                printf("FAIL round %d draft: %s\n", r, err.msg);
                return 1;
            }
            {   /* probabilistic, the same seed on each side */
                int32_t pc1[K], pg1[K];
                m3_rng rc1, rg1, ur;
                m3_rng_seed(&rc1, 70 + (uint64_t)r);
                m3_rng_seed(&rg1, 70 + (uint64_t)r);
                m3_rng_seed(&ur, 70 + (uint64_t)r);
                m3_spec_draft_req p1 = {&cg[0], ps1, &rg1, an, at, pg1, q1g, NULL, 0, 0, NULL, 0};
                if (m3_spec_draft(&dc, &cc[0], ps1, ws, &rc1, M3_SPEC_DRAFT_PROBABILISTIC, an, at, K, scratch, pc1, q1c, &qu, &err) ||
                    m3_spec_draft_n(&dg, &p1, 1, ws, M3_SPEC_DRAFT_PROBABILISTIC, K, scratch, &err) || p1.failed) {
                    printf("FAIL round %d probabilistic draft: %s\n", r, err.msg);
                    return 1;
                }
                int i = 0;
                for (; i < K; i++) {
                    const float *a = q1c + (size_t)i * V, *b = q1g + (size_t)i * V;
                    const double uu = m3_rng_uniform(&ur);
                    double num = 0, den = 0, tot = 0;
                    for (int v = 0; v < V; v++) { num += (double)(a[v] - b[v]) * (a[v] - b[v]); den += (double)a[v] * a[v]; tot += a[v]; }
                    if (sqrt(num / (den > 0 ? den : 1)) > 1e-4) { printf("FAIL round %d slot %d: distribution differs\n", r, i); fails++; break; }
                    if (pg1[i] == pc1[i]) continue;
                    double acc = 0, dmin = 1e300;
                    for (int v = 0; v < V; v++) {
                        if (!(a[v] > 0)) continue;
                        acc += a[v];
                        dmin = fmin(dmin, fabs(acc - uu * tot));
                    }
                    if (dmin < 1e-6 * tot) pnear1++;
                    else { printf("FAIL round %d slot %d: drew %d (gpu) vs %d (cpu)\n", r, i, pg1[i], pc1[i]); fails++; }
                    break; /* the later slots follow other draws */
                }
                psame += i == K;
            }
            int i = 0;
            while (i < K && dc1[i] == dg1[i]) i++;
            if (i == K) { rsame++; continue; }
            /* the CPU's row at the first difference (its own draws before it): a near tie? */
            const m3_dspark_ctx *pc = &cc[0];
            int pos = at;
            float *cr = rc_;
            if (m3_dspark_block_n(&dc, 1, &pc, &an, &pos, K, &err)) { printf("FAIL cpu block: %s\n", err.msg); return 1; }
            for (int s2 = 0; s2 <= i; s2++) {
                const int32_t pv = s2 ? dc1[s2 - 1] : an;
                if (m3_dspark_markov_n(&dc, s2, &pv, cr, &err)) { printf("FAIL cpu markov: %s\n", err.msg); return 1; }
            }
            float gap, mag;
            top2(cr, V, &gap, &mag);
            if (gap > 1e-3f * mag) {
                printf("FAIL round %d (context %d) slot %d: drew %d (gpu) vs %d (cpu), gap %.3g\n", r, at, i, dg1[i], dc1[i], gap);
                fails++;
            } else rties++;
        }
        const long replays = cpu ? 0 : m3_cuda_graph_replays(&gops) - r0;
        /* does the backend take these shapes for a pass's table (and so record the pass)? */
        const m3_config *db = &dg.cfg.base;
        const m3_dspark_attn_req probe = {NULL, NULL, 1, 0, 0, 0};
        const int tab = !cpu && gops.dspark_attention_table &&
                        gops.dspark_attention_table(gops.ctx, 1, 1, &probe, K, db->n_heads, db->n_kv_heads, db->head_dim,
                                                    dg.cfg.window);
        printf("one request a pass, %d rounds (contexts %d..%d): greedy drafts %d equal to the CPU's, %d at a near tie; "
               "probabilistic %d equal, %d at a boundary; %ld graph replays%s\n",
               ROUNDS, cc[0].len - ROUNDS + 1, cc[0].len, rsame, rties, psame, pnear1, replays,
               cpu ? "" : tab ? " (block passes, greedy and drawn chains)" : " (chains: no table for these shapes, no block pass recorded)");
        m3_sampler_free(ps1);
        free(q1c);
        free(q1g);
        /* each kind runs directly the first round, is recorded the second, replayed after: two
         * block passes a round (greedy, probabilistic: the same key) and the two chains */
        const int gdev = !cpu && gops.draw_rows_dev;
        const long want = cpu ? 0 : (tab ? 2 * ROUNDS - 2 : 0) + (ROUNDS - 2) * (gdev ? 2 : 1);
        if (replays < want) { printf("FAIL one-request passes: %ld graph replays, not %ld\n", replays, want); fails++; }
    }
    if (same != NR && ties == 0) { printf("FAIL greedy drafts differ (%d of %d equal)\n", same, NR); fails++; }
    printf("%s: greedy drafts %d of %d equal, draft on the %s vs the CPU\n", fails ? "FAILED" : "ok", same, NR,
           cpu ? "CPU (batched)" : "GPU");
    for (int j = 0; j < NR; j++) { m3_dspark_ctx_free(&cc[j]); m3_dspark_ctx_free(&cg[j]); m3_sampler_free(sm[j]); }
    gops.release(gops.ctx, dfeat);
    m3_dspark_free(&dc);
    m3_dspark_free(&dg);
    m3_model_free(&mc);
    m3_model_free(&mg);
    m3_sample_ws_free(ws);
    free(feat); free(rc_); free(rg); free(scratch);
    if (cpu) m3_cpu_ops_free(&gops);
    else m3_cuda_ops_free(&gops);
    m3_cpu_ops_free(&cops);
    return fails ? 1 : 0;
}
