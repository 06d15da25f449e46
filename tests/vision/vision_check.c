/* Images end to end against the Hugging Face reference of a vision-language checkpoint
 * (m3vl-tiny.oracle.safetensors: input_ids with the image tokens expanded, pixel_values,
 * image_grid_thw, vision_tower_out, image_embeds, logits, greedy_tokens / greedy_logits):
 *   1. `m3 logits --pixel-values ORACLE --ids <expanded ids>`: vision_tower_out, image_embeds
 *      and the logits of every prompt position within --tol relative L2 (per row), greedy
 *      tokens equal, greedy logits within --tol;
 *   2. `m3 logits --image PNG --ids <one placeholder>`: the prompt expands to the reference's
 *      ids, pixel values within 0.02 (max) / 0.002 (mean) of the reference's, the logits'
 *      argmax equal at every prompt position (relative L2 reported);
 *   3. the same in chunks of --ubatch 7 on one thread (chunks cut through the image rows).
 * usage: vision_check M3_BIN MODEL_DIR ORACLE.safetensors IMAGE.png [--tol 1e-4] [--work DIR] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/safetensors.h"

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { double d = (double)a[i] - ref[i]; num += d * d; den += (double)ref[i] * ref[i]; }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* worst relative L2 over the rows of two [rows, n] tensors; -1 when shapes differ */
static double rows_rel(const m3_tensor *a, const m3_tensor *r, int *worst_row) {
    if (!a || !r || a->numel != r->numel || a->ndim != 2 || r->ndim != 2 || a->shape[1] != r->shape[1]) return -1;
    double w = 0;
    *worst_row = 0;
    for (int64_t i = 0; i < r->shape[0]; i++) {
        double e = rel_l2((const float *)a->data + i * r->shape[1], (const float *)r->data + i * r->shape[1], (size_t)r->shape[1]);
        if (e > w) { w = e; *worst_row = (int)i; }
    }
    return w;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

static char *ids_str(const int32_t *ids, int n) {
    char *s = malloc((size_t)n * 12 + 1);
    size_t o = 0;
    for (int i = 0; i < n; i++) o += (size_t)sprintf(s + o, "%s%d", i ? "," : "", ids[i]);
    s[o] = 0;
    return s;
}

static int run(char *const *av) {
    pid_t pid = fork();
    if (pid == 0) { execv(av[0], av); perror("execv"); _exit(127); }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: vision_check M3 MODEL ORACLE IMAGE.png [--tol X] [--work DIR]\n"); return 2; }
    const char *m3 = argv[1], *model = argv[2], *oracle = argv[3], *png = argv[4], *work = "/tmp";
    double tol = 1e-4;
    for (int i = 5; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tol")) tol = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--work")) work = argv[i + 1];
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    m3_err err;
    m3_st *ref = m3_st_open(oracle, &err);
    if (!ref) { fprintf(stderr, "%s\n", err.msg); return 2; }
    const m3_tensor *rids = m3_st_find(ref, "input_ids"), *rlog = m3_st_find(ref, "logits"), *rgt = m3_st_find(ref, "greedy_tokens");
    const m3_tensor *rgl = m3_st_find(ref, "greedy_logits"), *rpv = m3_st_find(ref, "pixel_values");
    const m3_tensor *rvt = m3_st_find(ref, "vision_tower_out"), *rie = m3_st_find(ref, "image_embeds");
    if (!rids || !rlog || !rgt || !rgl || !rpv || !rvt || !rie) { fprintf(stderr, "%s: missing reference tensors\n", oracle); return 2; }
    const int32_t *ids = rids->data;
    int T = (int)rids->numel, V = (int)rlog->shape[1], N = (int)rgt->numel;
    /* the placeholder form of the prompt: [start, image x n, end] -> [image] (the image token is
     * the one repeated; start / end are its neighbours) */
    int first = -1, last = -1;
    for (int t = 1; t + 1 < T && first < 0; t++)
        if (ids[t] == ids[t + 1]) first = t;
    if (first < 1) { fprintf(stderr, "%s: no run of image tokens in input_ids\n", oracle); return 2; }
    int32_t image = ids[first];
    for (last = first; last + 1 < T && ids[last + 1] == image; last++) {}
    int32_t start = ids[first - 1], end = last + 1 < T ? ids[last + 1] : -1;
    int32_t *short_ids = malloc(sizeof(int32_t) * (size_t)T);
    int ns = 0;
    for (int t = 0; t < T; t++) {
        if (t == first - 1 || (t > first && t <= last) || t == last + 1) continue;
        short_ids[ns++] = ids[t];
    }
    printf("reference: %d prompt tokens, image token %d x %d between %d and %d, %d greedy steps\n", T, image, last - first + 1, start,
           end, N);

    char out[512], nbuf[16], sbuf[16], ebuf[16];
    snprintf(nbuf, sizeof nbuf, "%d", N);
    snprintf(sbuf, sizeof sbuf, "%d", start);
    snprintf(ebuf, sizeof ebuf, "%d", end);
    char *full = ids_str(ids, T), *shrt = ids_str(short_ids, ns);

    /* 1. pixel values from the reference */
    snprintf(out, sizeof out, "%s/vision_check_%d_pv.safetensors", work, (int)getpid());
    {
        char *av[] = {(char *)m3, "logits", "-m", (char *)model, "--ids", full, "--pixel-values", (char *)oracle, "--decode", nbuf,
                      "--dump-vision", "-o", out, NULL};
        int rc = run(av);
        CHECK(rc == 0, "m3 logits --pixel-values exited with %d", rc);
        m3_st *got = rc == 0 ? m3_st_open(out, &err) : NULL;
        if (got) {
            int wr;
            double evt = rows_rel(m3_st_find(got, "vision_tower_out"), rvt, &wr);
            const m3_tensor *gvt = m3_st_find(got, "vision_tower_out"), *gie = m3_st_find(got, "image_embeds");
            printf("pixel-values: vision_tower_out rel L2 %.3g (whole), max per patch %.3g (patch %d)\n",
                   gvt && gvt->numel == rvt->numel ? rel_l2(gvt->data, rvt->data, (size_t)rvt->numel) : -1.0, evt, wr);
            CHECK(evt >= 0 && evt <= tol, "vision_tower_out max rel L2 %.3g > %.0e", evt, tol);
            double eie = rows_rel(gie, rie, &wr);
            printf("pixel-values: image_embeds rel L2 %.3g (whole), max per token %.3g (token %d)\n",
                   gie && gie->numel == rie->numel ? rel_l2(gie->data, rie->data, (size_t)rie->numel) : -1.0, eie, wr);
            CHECK(eie >= 0 && eie <= tol, "image_embeds max rel L2 %.3g > %.0e", eie, tol);
            double el = rows_rel(m3_st_find(got, "logits"), rlog, &wr);
            printf("pixel-values: logits max rel L2 %.3g (position %d)\n", el, wr);
            CHECK(el >= 0 && el <= tol, "logits max rel L2 %.3g > %.0e", el, tol);
            const m3_tensor *gt = m3_st_find(got, "greedy_tokens"), *gl = m3_st_find(got, "greedy_logits");
            int same = gt && gt->numel == N && !memcmp(gt->data, rgt->data, sizeof(int32_t) * (size_t)N);
            double eg = same ? rows_rel(gl, rgl, &wr) : -1;
            printf("pixel-values: greedy tokens %s, greedy logits max rel L2 %.3g\n", same ? "equal" : "DIFFER", eg);
            CHECK(same, "greedy tokens differ");
            CHECK(!same || eg <= tol, "greedy logits max rel L2 %.3g > %.0e", eg, tol);
            m3_st_close(got);
        }
        unlink(out);
    }

    /* 2. and 3. from the PNG, the prompt with one placeholder */
    for (int pass = 0; pass < 2; pass++) {
        const char *tag = pass ? "png, ubatch 7, 1 thread" : "png";
        snprintf(out, sizeof out, "%s/vision_check_%d_png%d.safetensors", work, (int)getpid(), pass);
        char *av[24];
        int ac = 0;
        av[ac++] = (char *)m3; av[ac++] = "logits"; av[ac++] = "-m"; av[ac++] = (char *)model; av[ac++] = "--ids"; av[ac++] = shrt;
        av[ac++] = "--image"; av[ac++] = (char *)png; av[ac++] = "--image-start-id"; av[ac++] = sbuf;
        av[ac++] = "--image-end-id"; av[ac++] = ebuf; av[ac++] = "--decode"; av[ac++] = nbuf; av[ac++] = "--dump-vision";
        av[ac++] = "-o"; av[ac++] = out;
        if (pass) { av[ac++] = "--ubatch"; av[ac++] = "7"; av[ac++] = "--threads"; av[ac++] = "1"; }
        av[ac] = NULL;
        int rc = run(av);
        CHECK(rc == 0, "%s: m3 logits --image exited with %d", tag, rc);
        m3_st *got = rc == 0 ? m3_st_open(out, &err) : NULL;
        if (!got) continue;
        const m3_tensor *gi = m3_st_find(got, "input_ids"), *gp = m3_st_find(got, "pixel_values"), *gg = m3_st_find(got, "image_grid_thw");
        const m3_tensor *rg = m3_st_find(ref, "image_grid_thw");
        int ids_ok = gi && gi->numel == T && !memcmp(gi->data, ids, sizeof(int32_t) * (size_t)T);
        CHECK(ids_ok, "%s: expanded prompt differs from the reference's input_ids", tag);
        int grid_ok = gg && rg && gg->numel == rg->numel && !memcmp(gg->data, rg->data, sizeof(int32_t) * (size_t)rg->numel);
        CHECK(grid_ok, "%s: image_grid_thw differs", tag);
        if (gp && gp->numel == rpv->numel) {
            double mx = 0, sum = 0;
            size_t nexact = 0;
            for (int64_t i = 0; i < rpv->numel; i++) {
                double d = fabs((double)((const float *)gp->data)[i] - ((const float *)rpv->data)[i]);
                if (d > mx) mx = d;
                sum += d;
                nexact += d == 0;
            }
            printf("%s: pixel values max abs error %.3g, mean %.3g (%zu of %lld exact)\n", tag, mx, sum / (double)rpv->numel, nexact,
                   (long long)rpv->numel);
            CHECK(mx <= 0.02 && sum / (double)rpv->numel < 0.002, "%s: pixel values max %.3g / mean %.3g beyond 0.02 / 0.002", tag, mx,
                  sum / (double)rpv->numel);
        } else {
            CHECK(0, "%s: pixel_values missing or shaped differently", tag);
        }
        const m3_tensor *gl = m3_st_find(got, "logits");
        if (gl && gl->numel == rlog->numel) {
            int bad = 0, wr;
            for (int t = 0; t < T; t++)
                if (argmax((const float *)gl->data + (size_t)t * V, V) != argmax((const float *)rlog->data + (size_t)t * V, V)) bad++;
            const m3_tensor *gt = m3_st_find(got, "greedy_tokens");
            int same = gt && gt->numel == N && !memcmp(gt->data, rgt->data, sizeof(int32_t) * (size_t)N);
            printf("%s: logits argmax equal at %d of %d positions, max rel L2 %.3g; greedy tokens %s\n", tag, T - bad, T,
                   rows_rel(gl, rlog, &wr), same ? "equal" : "differ");
            CHECK(bad == 0, "%s: logits argmax differs at %d positions", tag, bad);
        } else {
            CHECK(0, "%s: logits missing or shaped differently", tag);
        }
        m3_st_close(got);
        unlink(out);
    }
    free(full);
    free(shrt);
    free(short_ids);
    m3_st_close(ref);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
