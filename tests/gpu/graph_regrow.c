/* CUDA graphs against a workspace that grows (issue 22, the server's forward failures under load):
 * a decode step recorded as a graph, then a step a little longer than any before (its tokens
 * fit the backend's scratch buffers, which grow with headroom, but not the model's activation
 * workspace, which grows to the byte: a new device address), then the recorded decode shape
 * again. The replay must not use the old workspace: every logits row equals the same steps run
 * without graphs (M3_CUDA_GRAPHS=0), no step fails, and the last decodes were replays.
 * Then the same steps with recordings failing (fault module "graph", base/fault.h): the first one
 * only (the shape is recorded at its next step: the last decodes are still replays, no shape
 * refused), then every one (each decode shape refused after its failed tries, graphs still on
 * for other shapes); every logits row still equal to the run without graphs.
 * Runs on a GPU (scripts/gpu.sh, section 1).  usage: graph_regrow CHECKPOINT */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "base/fault.h"
#include "kv/kv.h"
#include "model/m3.h"

enum { NA = 8, NB = 300, NC = 320, DEC = 3 };

static int step(m3_model *m, m3_kv *kv, m3_kv_seq *s, const int32_t *ids, int p0, int n, float *lg, m3_err *err) {
    int32_t pos[NC], sq[NC] = {0};
    for (int i = 0; i < n; i++) pos[i] = p0 + i;
    int row = n - 1;
    m3_kv_seq *ss[1] = {s};
    m3_batch b = {n, pos, sq, ss};
    return m3_forward(m, kv, &b, ids, &row, 1, lg, NULL, err);
}

typedef struct { long replays; int refused, on; } graph_stats;

/* the steps; the logits row of each, appended to out ([n][V]); -1 on a failure. fault: a fault
 * spec armed once the model is loaded (NULL: none); *gs: the decodes after the growth that were
 * replays, the shapes refused, graphs still on */
static int run(const char *dir, int graphs, const char *fault, float **out, int *n_rows, int *vocab, graph_stats *gs) {
    setenv("M3_CUDA_GRAPHS", graphs ? "1" : "0", 1);
    m3_ops ops;
    m3_model m;
    m3_kv kv;
    m3_err err;
    if (m3_cuda_ops_init(&ops, 0, &err)) { printf("FAIL cuda: %s\n", err.msg); return -1; }
    if (m3_model_load(&m, dir, &ops, NULL, NULL, &err)) { printf("FAIL load: %s\n", err.msg); m3_cuda_ops_free(&ops); return -1; }
    if (fault && m3_fault_arm_spec(fault, &err)) { printf("FAIL fault spec: %s\n", err.msg); exit(1); }
    const int V = m.cfg.vocab, page = m3_kv_page_tokens(&m.cfg);
    m3_kv_mem mem = m3_model_kv_mem(&m);
    void *blocker = NULL;
    int rc = m3_kv_create_in(&kv, &m.cfg, M3_KV_BF16, M3_KV_BF16, page, (NA + NB + NC + 4 * DEC) / page + 8, &mem, &err);
    if (rc) { printf("FAIL kv: %s\n", err.msg); m3_model_free(&m); m3_cuda_ops_free(&ops); return -1; }
    m3_kv_seq a = {0}, b = {0}, c = {0};
    float *lg = calloc((size_t)(4 + 2 * DEC) * V, sizeof *lg);
    int32_t ids[NC];
    int nr = 0, p = NA;
    for (int i = 0; i < NC; i++) ids[i] = (i * 7919 + 13) % V;
    /* B: the longest step so far (the scratch buffers reach their size) */
    rc = step(&m, &kv, &b, ids, 0, NB, lg + (size_t)nr++ * V, &err);
    /* A: a prompt, then decodes (the second is recorded, the third replays it) */
    if (!rc) rc = step(&m, &kv, &a, ids, 0, NA, lg + (size_t)nr++ * V, &err);
    for (int k = 0; !rc && k < DEC; k++, p++) {
        int32_t id = (p * 31) % V;
        rc = step(&m, &kv, &a, &id, p, 1, lg + (size_t)nr++ * V, &err);
    }
    /* C: a little longer than B: the workspace grows (a block allocated after it keeps it from
     * growing in place), the scratch buffers do not */
    blocker = rc ? NULL : ops.alloc(ops.ctx, (size_t)1 << 20);
    const void *ws0 = m.ws;
    if (!rc) rc = step(&m, &kv, &c, ids, 0, NC, lg + (size_t)nr++ * V, &err);
    if (!rc && m.ws == ws0) { printf("FAIL the workspace did not move: the replay after it is not exercised\n"); rc = -1; }
    /* A again, the recorded decode shape */
    long r0 = m3_cuda_graph_replays(&ops);
    for (int k = 0; !rc && k < DEC; k++, p++) {
        int32_t id = (p * 31) % V;
        rc = step(&m, &kv, &a, &id, p, 1, lg + (size_t)nr++ * V, &err);
    }
    gs->replays = m3_cuda_graph_replays(&ops) - r0;
    gs->refused = m3_cuda_graphs_refused(&ops, &gs->on);
    if (fault) m3_fault_disarm(M3_FAULT_GRAPH);
    if (rc) printf("FAIL graphs %d%s%s: a step failed: %s\n", graphs, fault ? ", faults " : "", fault ? fault : "", err.msg);
    if (blocker) ops.release(ops.ctx, blocker);
    m3_kv_seq_release(&kv, &a);
    m3_kv_seq_release(&kv, &b);
    m3_kv_seq_release(&kv, &c);
    free(a.pages);
    free(b.pages);
    free(c.pages);
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
    float *d = NULL;
    int nd = 0, V = 0;
    graph_stats gs;
    int bad = run(argv[1], 0, NULL, &d, &nd, &V, &gs) != 0;
    /* with graphs: no fault; the first recording failing; every recording failing */
    static const char *const faults[3] = {NULL, "graph:1:1", "graph:1:-1"};
    for (int f = 0; f < 3 && !bad; f++) {
        float *g = NULL;
        int ng = 0;
        bad |= run(argv[1], 1, faults[f], &g, &ng, &V, &gs) != 0;
        for (int r = 0; !bad && r < ng && ng == nd; r++) {
            double num = 0, den = 0;
            for (int i = 0; i < V; i++) {
                double x = (double)g[(size_t)r * V + i] - d[(size_t)r * V + i];
                num += x * x;
                den += (double)d[(size_t)r * V + i] * d[(size_t)r * V + i];
            }
            double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            if (!(rel < 1e-6)) { printf("FAIL row %d (faults %s): graphs vs none, relative L2 %.3g\n", r, faults[f] ? faults[f] : "none", rel); bad = 1; }
        }
        free(g);
        if (bad) break;
        printf("graphs, faults %s: %d rows equal to the run without graphs; %ld of the %d decodes after the growth were "
               "replays, %d shapes refused, graphs %s\n", faults[f] ? faults[f] : "none", ng, gs.replays, DEC, gs.refused,
               gs.on ? "on" : "off");
        const int want_replay = f < 2; /* a failed recording is tried again at the shape's next step */
        if (want_replay ? gs.replays < 1 : gs.replays != 0) { printf("FAIL replays %ld after the growth\n", gs.replays); bad = 1; }
        if (f < 2 ? gs.refused != 0 : gs.refused < 1) { printf("FAIL %d shapes refused\n", gs.refused); bad = 1; }
        if (!gs.on) { printf("FAIL graphs turned off for the whole process\n"); bad = 1; }
    }
    free(d);
    printf(bad ? "graph_regrow: FAILED\n" : "graph_regrow: logits rows equal with and without graphs, the workspace grown "
           "between a recording and its replay, and with recordings failing\n");
    return bad;
}
