/* Runs `m3 logits` on every case of a reference file and compares with what the Hugging
 * Face reference computed: logits at every prompt position (relative L2 per row), greedy
 * tokens (equal), greedy logits, and the indexer's block choices (equal as sets).
 * usage: oracle_check M3_BIN MODEL_DIR ORACLE.safetensors [--kv DTYPE] [--cases 0,2]
 *                     [--tol 1e-4] [--threads N] [--ubatch N] [--work DIR] [--backend cpu|cuda]
 *                     [--tp N] [--moe-split experts|width]   (tensor parallel: m3 logits -tp N) */
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <math.h>

#include "io/safetensors.h"

static const m3_tensor *get(const m3_st *st, const char *fmt, int k) {
    char nm[128];
    snprintf(nm, sizeof nm, fmt, k);
    return m3_st_find(st, nm);
}

static double rel_l2(const float *a, const float *ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) { double d = (double)a[i] - ref[i]; num += d * d; den += (double)ref[i] * ref[i]; }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int cmp_i32(const void *a, const void *b) { return *(const int32_t *)a - *(const int32_t *)b; }

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: oracle_check M3 MODEL ORACLE [--kv D] [--cases LIST] [--tol X]\n"); return 2; }
    const char *m3 = argv[1], *model = argv[2], *oracle = argv[3], *kv = NULL, *cases = NULL, *work = "/tmp";
    const char *threads = NULL, *ubatch = NULL, *backend = NULL, *tp = NULL, *moe_split = NULL, *precision = NULL;
    double tol = 1e-4;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--kv")) kv = argv[i + 1];
        else if (!strcmp(argv[i], "--cases")) cases = argv[i + 1];
        else if (!strcmp(argv[i], "--tol")) tol = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--work")) work = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = argv[i + 1];
        else if (!strcmp(argv[i], "--ubatch")) ubatch = argv[i + 1];
        else if (!strcmp(argv[i], "--backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "--tp")) tp = argv[i + 1];
        else if (!strcmp(argv[i], "--moe-split")) moe_split = argv[i + 1];
        else if (!strcmp(argv[i], "--precision")) precision = argv[i + 1]; /* bf16: against a bf16-GEMM oracle */
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    mkdir(work, 0755); /* the scratch directory may not exist yet (EEXIST is fine) */
    m3_err err;
    m3_st *ref = m3_st_open(oracle, &err);
    if (!ref) { fprintf(stderr, "%s\n", err.msg); return 2; }
    int failures = 0, ran = 0;
    for (int k = 0; k < 64; k++) {
        const m3_tensor *ids = get(ref, "case%d.input_ids", k);
        if (!ids) break;
        if (cases) {
            char key[16];
            snprintf(key, sizeof key, ",%d,", k);
            char list[256];
            snprintf(list, sizeof list, ",%s,", cases);
            if (!strstr(list, key)) continue;
        }
        ran++;
        int T = (int)ids->numel;
        const m3_tensor *gt = get(ref, "case%d.greedy_tokens", k);
        int N = gt ? (int)gt->numel : 0;
        char *idstr = malloc((size_t)T * 12 + 1), out[512], nbuf[16];
        size_t o = 0;
        for (int t = 0; t < T; t++) o += (size_t)sprintf(idstr + o, "%s%d", t ? "," : "", ((const int32_t *)ids->data)[t]);
        snprintf(out, sizeof out, "%s/oracle_check_%d_%d.safetensors", work, (int)getpid(), k);
        snprintf(nbuf, sizeof nbuf, "%d", N);
        const char *av[28];
        int ac = 0;
        av[ac++] = m3; av[ac++] = "logits"; av[ac++] = "-m"; av[ac++] = model; av[ac++] = "--ids"; av[ac++] = idstr;
        av[ac++] = "--decode"; av[ac++] = nbuf; av[ac++] = "--dump-index"; av[ac++] = "-o"; av[ac++] = out;
        if (kv) { av[ac++] = "--kv-cache-dtype"; av[ac++] = kv; }
        if (threads) { av[ac++] = "--threads"; av[ac++] = threads; }
        if (ubatch) { av[ac++] = "--ubatch"; av[ac++] = ubatch; }
        if (backend) { av[ac++] = "--backend"; av[ac++] = backend; }
        if (tp) { av[ac++] = "--tensor-parallel-size"; av[ac++] = tp; }
        if (moe_split) { av[ac++] = "--moe-split"; av[ac++] = moe_split; }
        if (precision) { av[ac++] = "--precision"; av[ac++] = precision; }
        av[ac] = NULL;
        pid_t pid = fork();
        if (pid == 0) { execv(m3, (char *const *)av); perror("execv"); _exit(127); }
        int status;
        waitpid(pid, &status, 0);
        free(idstr);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("case %d (T=%d): m3 logits failed (status %d)\n", k, T, status);
            failures++;
            continue;
        }
        m3_st *got = m3_st_open(out, &err);
        if (!got) { printf("case %d: cannot read output: %s\n", k, err.msg); failures++; continue; }
        const m3_tensor *rl = get(ref, "case%d.logits", k), *gl = m3_st_find(got, "logits");
        int V = (int)rl->shape[1];
        double worst = 0;
        int worst_t = 0;
        if (!gl || gl->numel != rl->numel) { printf("case %d: logits shape mismatch\n", k); failures++; m3_st_close(got); continue; }
        for (int t = 0; t < T; t++) {
            double e = rel_l2((const float *)gl->data + (size_t)t * V, (const float *)rl->data + (size_t)t * V, V);
            if (e > worst) { worst = e; worst_t = t; }
        }
        int ok_logits = worst <= tol;
        /* greedy */
        int ok_tokens = 1, first_diff = -1;
        double gworst = 0;
        if (N) {
            const m3_tensor *gtok = m3_st_find(got, "greedy_tokens"), *glg = m3_st_find(got, "greedy_logits");
            const m3_tensor *rglg = get(ref, "case%d.greedy_logits", k);
            for (int i = 0; i < N; i++)
                if (((const int32_t *)gtok->data)[i] != ((const int32_t *)gt->data)[i]) { ok_tokens = 0; first_diff = i; break; }
            int upto = ok_tokens ? N : first_diff + 1; /* logits after a divergence are not comparable */
            for (int i = 0; i < upto; i++) {
                double e = rel_l2((const float *)glg->data + (size_t)i * V, (const float *)rglg->data + (size_t)i * V, V);
                if (e > gworst) gworst = e;
            }
        }
        int ok_glog = gworst <= tol;
        /* index blocks as sets */
        int ok_index = 1, n_index = 0, mism = 0;
        for (int l = 0; l < 256; l++) {
            char nm[64];
            snprintf(nm, sizeof nm, "case%d.index_blocks.layer%d", k, l);
            const m3_tensor *ri = m3_st_find(ref, nm);
            if (!ri) continue;
            n_index++;
            snprintf(nm, sizeof nm, "index_blocks.layer%d", l);
            const m3_tensor *gi = m3_st_find(got, nm);
            if (!gi || gi->numel != ri->numel) { ok_index = 0; printf("case %d layer %d: index_blocks missing or shaped differently\n", k, l); continue; }
            int K = (int)ri->shape[2];
            int32_t a[1024], b[1024];
            for (int64_t row = 0; row < ri->shape[0] * ri->shape[1]; row++) {
                memcpy(a, (const int32_t *)ri->data + row * K, sizeof(int32_t) * K);
                memcpy(b, (const int32_t *)gi->data + row * K, sizeof(int32_t) * K);
                qsort(a, K, sizeof *a, cmp_i32);
                qsort(b, K, sizeof *b, cmp_i32);
                if (memcmp(a, b, sizeof(int32_t) * K)) {
                    if (mism < 3) printf("case %d layer %d head %lld token %lld: blocks differ\n", k, l, (long long)(row / ri->shape[1]), (long long)(row % ri->shape[1]));
                    mism++;
                    ok_index = 0;
                }
            }
        }
        int ok = ok_logits && ok_tokens && ok_glog && ok_index;
        printf("case %d (T=%d, decode %d%s%s): logits max rel L2 %.3g (pos %d)  greedy tokens %s  greedy logits max rel L2 %.3g  index blocks %s (%d layers)  %s\n",
               k, T, N, kv ? ", kv " : "", kv ? kv : "", worst, worst_t,
               ok_tokens ? "equal" : "DIFFER", gworst, ok_index ? "equal" : "DIFFER", n_index, ok ? "ok" : "FAIL");
        if (!ok_tokens) printf("  first differing greedy token at step %d\n", first_diff);
        failures += !ok;
        m3_st_close(got);
        unlink(out);
    }
    m3_st_close(ref);
    if (!ran) { printf("no cases ran\n"); return 1; }
    printf("%d of %d cases passed (tolerance %.0e)\n", ran - failures, ran, tol);
    return failures ? 1 : 0;
}
