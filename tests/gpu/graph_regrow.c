/* CUDA graphs against a workspace that grows (issue 22, the server's forward failures under load):
 * a decode step recorded as a graph, then a larger batch that grows the model's activation
 * workspace (a new device address), then the same decode shape again. The replay must not use
 * the old workspace: every logits row equals the same sequence of steps run without graphs
 * (M3_CUDA_GRAPHS=0), and no step fails. Runs on a GPU (scripts/gpu.sh, section 1).
 * usage: graph_regrow CHECKPOINT */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "kv/kv.h"
#include "model/m3.h"

enum { NA = 8, NB = 300, ROWS_B = 64, DEC = 3 };

/* the steps; logits of every step that asks for them, appended to out ([n][V]); -1 on a failure */
static int run(const char *dir, int graphs, float **out, int *n_rows, int *vocab) {
    setenv("M3_CUDA_GRAPHS", graphs ? "1" : "0", 1);
    m3_ops ops;
    m3_model m;
    m3_kv kv;
    m3_err err;
    if (m3_cuda_ops_init(&ops, 0, &err)) { printf("FAIL cuda: %s\n", err.msg); return -1; }
    if (m3_model_load(&m, dir, &ops, NULL, NULL, &err)) { printf("FAIL load: %s\n", err.msg); m3_cuda_ops_free(&ops); return -1; }
    const int V = m.cfg.vocab, page = m3_kv_page_tokens(&m.cfg);
    m3_kv_mem mem = m3_model_kv_mem(&m);
    void *blocker = NULL;
    int rc = m3_kv_create_in(&kv, &m.cfg, M3_KV_BF16, M3_KV_BF16, page, 2 * (NA + NB + 4 * DEC) / page + 8, &mem, &err);
    if (rc) { printf("FAIL kv: %s\n", err.msg); m3_model_free(&m); m3_cuda_ops_free(&ops); return -1; }
    m3_kv_seq a = {0}, b = {0};
    float *lg = calloc((size_t)(2 + 2 * DEC + ROWS_B) * V, sizeof *lg);
    int32_t ids[NB], pos[NB], sq[NB];
    int rows[ROWS_B], nr = 0;
    for (int i = 0; i < NB; i++) { ids[i] = (i * 7919 + 13) % V; sq[i] = 0; }
    m3_kv_seq *sa[1] = {&a}, *sb[1] = {&b};
    /* A: a prompt of NA tokens, then DEC decodes (the second is recorded, the third replays it) */
    for (int i = 0; i < NA; i++) pos[i] = i;
    rows[0] = NA - 1;
    m3_batch ba = {NA, pos, sq, sa};
    rc = m3_forward(&m, &kv, &ba, ids, rows, 1, lg + (size_t)nr++ * V, NULL, &err);
    int p = NA;
    for (int k = 0; !rc && k < DEC; k++, p++) {
        int32_t id = (p * 31) % V, ps = p, z = 0, r0 = 0;
        m3_batch d = {1, &ps, &z, sa};
        rc = m3_forward(&m, &kv, &d, &id, &r0, 1, lg + (size_t)nr++ * V, NULL, &err);
    }
    /* B: a larger batch asking for more logits rows: the workspace grows (a block allocated
     * after it keeps it from growing in place) */
    blocker = rc ? NULL : ops.alloc(ops.ctx, (size_t)1 << 20);
    const void *ws0 = m.ws;
    for (int i = 0; !rc && i < NB; i++) pos[i] = i;
    for (int i = 0; i < ROWS_B; i++) rows[i] = NB - ROWS_B + i;
    m3_batch bb = {NB, pos, sq, sb};
    if (!rc) {
        rc = m3_forward(&m, &kv, &bb, ids, rows, ROWS_B, lg + (size_t)nr * V, NULL, &err);
        nr += ROWS_B;
    }
    if (!rc && m.ws == ws0) { printf("FAIL the workspace did not move: the replay after it is not exercised\n"); rc = -1; }
    /* A again, the recorded decode shape */
    for (int k = 0; !rc && k < DEC; k++, p++) {
        int32_t id = (p * 31) % V, ps = p, z = 0, r0 = 0;
        m3_batch d = {1, &ps, &z, sa};
        rc = m3_forward(&m, &kv, &d, &id, &r0, 1, lg + (size_t)nr++ * V, NULL, &err);
    }
    if (rc) printf("FAIL graphs %d: a step failed: %s\n", graphs, err.msg);
    if (blocker) ops.release(ops.ctx, blocker);
    m3_kv_seq_release(&kv, &a);
    m3_kv_seq_release(&kv, &b);
    free(a.pages);
    free(b.pages);
    m3_kv_destroy(&kv);
    m3_model_free(&m);
    m3_cuda_ops_free(&ops);
    *out = lg;
    *n_rows = nr;
    *vocab = V;
    return rc ? -1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: graph_regrow CHECKPOINT\n"); return 2; }
    if (!m3_cuda_built() || m3_cuda_device_count() < 1) { printf("FAIL no CUDA device\n"); return 1; }
    float *g = NULL, *d = NULL;
    int ng = 0, nd = 0, V = 0;
    int bad = run(argv[1], 1, &g, &ng, &V) != 0;
    bad |= run(argv[1], 0, &d, &nd, &V) != 0;
    if (!bad && ng == nd) {
        for (int r = 0; r < ng; r++) {
            double num = 0, den = 0;
            for (int i = 0; i < V; i++) {
                double x = (double)g[(size_t)r * V + i] - d[(size_t)r * V + i];
                num += x * x;
                den += (double)d[(size_t)r * V + i] * d[(size_t)r * V + i];
            }
            double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            if (!(rel < 1e-6)) { printf("FAIL row %d: graphs vs none, relative L2 %.3g\n", r, rel); bad = 1; }
        }
    }
    free(g);
    free(d);
    printf(bad ? "graph_regrow: FAILED\n" : "graph_regrow: %d logits rows equal with and without graphs, the workspace grown "
           "between a recording and its replay\n", ng);
    return bad;
}
