/* The KV budget of a tensor-parallel group (src/engine/kv_budget.h, m3_kv_budget_group): the
 * profile step runs over every rank, then the pool is what the fullest rank has left. Two CPU
 * ranks (threads communicator) whose op tables report device memory through a stand-in
 * mem_info: each rank's free memory falls by a MiB per token of the largest step it has embedded
 * (as a device's scratch grows with its steps) and by its KV pool's bytes, rank 1 holding a GiB
 * less than rank 0. Checked: the step ran on both ranks with max_num_batched_tokens tokens and
 * the step's logits rows; the bytes are the fullest rank's free memory with the profile's pool
 * made one page, less (1 - utilization) x total, to the byte; the group's pool is one page after;
 * the group still steps; bad input and no memory left are refused naming their cause; a rank
 * whose step fails fails the budget, naming the step.
 * Usage: test_kv_budget [DATA_DIR (default tests/data)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "engine/kv_budget.h"
#include "model/group.h"
#include "parallel/comm.h"

#include "check.h"

#define MIB 1048576.0
#define GIB 1073741824.0
#define TOTAL (80 * GIB)

static m3_ops base[2];                /* each rank's CPU table, which the stand-ins call */
static int biggest[2];                /* per rank: the most tokens one embed call took */
static int lm_rows[2];                /* per rank: the most rows one lm_head (its shard) call took */
static int fail_rank = -1;            /* this rank's check fails (a step that fails there) */
static m3_group *grp;                 /* mem_fake counts each rank's pool; linear_count finds its lm_head */
static double base_free[2] = {60 * GIB, 59 * GIB};

static void *cpu_ctx[2]; /* each rank's CPU context: the stand-ins find their rank by it */
static int rank_of(void *ctx) { return ctx == cpu_ctx[1]; }

static void embed_count(void *ctx, const m3_linear *E, const int32_t *ids, int T, float *out) {
    const int r = rank_of(ctx);
    if (T > biggest[r]) biggest[r] = T;
    base[r].embed(ctx, E, ids, T, out);
}

static void linear_count(void *ctx, const m3_linear *W, const float *x, int T, float *y) {
    const int r = rank_of(ctx);
    if (grp && W == &m3_model_weights(m3_group_model(grp, r))->lm_head && T > lm_rows[r]) lm_rows[r] = T;
    base[r].linear(ctx, W, x, T, y);
}

static int check_fail(void *ctx, m3_err *err) {
    const int r = rank_of(ctx);
    if (r == fail_rank) return m3_errf(err, "rank %d: a stand-in failure", r);
    return base[r].check ? base[r].check(ctx, err) : 0;
}

static void mem_fake(void *ctx, size_t *fr, size_t *tot) {
    const int r = rank_of(ctx);
    m3_kv *kv = grp ? m3_group_kv(grp, r) : NULL;
    const double pool = kv ? (double)kv->n_pages * kv->page * m3_kv_bytes_per_token(kv) : 0;
    *fr = (size_t)(base_free[r] - biggest[r] * MIB - pool);
    *tot = (size_t)TOTAL;
}

/* each rank's table: the CPU's, with embed, check and mem_info standing in */
static int ops_init(void *arg, int rank, m3_ops *ops, m3_comm *comm, m3_err *err) {
    (void)arg; (void)comm;
    if (m3_cpu_ops_init(ops, 1, err)) return -1;
    base[rank] = *ops;
    cpu_ctx[rank] = ops->ctx;
    ops->embed = embed_count;
    ops->linear = linear_count;
    ops->check = check_fail;
    ops->mem_info = mem_fake;
    return 0;
}

static void ops_free(void *arg, int rank, m3_ops *ops) {
    (void)arg; (void)rank;
    m3_cpu_ops_free(ops);
}

int main(int argc, char **argv) {
    const char *data = argc > 1 ? argv[1] : "tests/data";
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/m3-tiny-q", data);
    m3_model full;
    m3_err err;
    if (m3_model_load(&full, dir, NULL, NULL, NULL, &err)) { fprintf(stderr, "%s: %s\n", dir, err.msg); return 1; }
    m3_comm *comms[2];
    if (m3_comm_threads_create(2, comms, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    m3_group_opts go = {2, M3_MOE_EXPERTS, comms, ops_init, ops_free, NULL, NULL};
    m3_group *g = m3_group_create(&full, &go, &err);
    if (!g) { fprintf(stderr, "group: %s\n", err.msg); return 1; }
    grp = g;

    /* the profile step, 96 tokens (several pages), 8 logits rows, utilization 0.9 */
    const int T = 96;
    size_t bytes = 0;
    char how[512] = "";
    int rc = m3_kv_budget_group(g, M3_KV_BF16, M3_KV_BF16, T, 8, 0.9, &bytes, how, sizeof how, &err);
    CHECK(rc == 0, "budget: %s", rc ? err.msg : "ok");
    CHECK(biggest[0] == T && biggest[1] == T, "the step embedded %d / %d tokens on the ranks, expected %d", biggest[0],
          biggest[1], T);
    CHECK(lm_rows[0] == 8 && lm_rows[1] == 8, "the step's lm_head took %d / %d rows on the ranks, expected 8", lm_rows[0],
          lm_rows[1]);
    m3_kv *kv1 = m3_group_kv(g, 1);
    const double page1 = kv1 ? (double)kv1->page * m3_kv_bytes_per_token(kv1) : 0; /* rank 1's one page */
    const size_t want = (size_t)(59 * GIB - T * MIB - page1 - 0.1 * TOTAL);
    CHECK(page1 > 0 && bytes == want, "budget %zu bytes, expected %zu (rank 1's free with a one-page pool, less 10%% of "
          "the total)", bytes, want);
    CHECK(strstr(how, "rank 1") && strstr(how, "96-token step"), "how it was sized: '%s'", how);
    CHECK(m3_group_kv(g, 0) && m3_group_kv(g, 0)->n_pages == 1 && m3_group_kv(g, 1)->n_pages == 1,
          "the profile's pool is one page after");

    /* the fuller rank decides: rank 0 now holds less; a step of 48 tokens and 48 logits rows (the
     * steps seen start again) */
    base_free[0] = 50 * GIB;
    memset(biggest, 0, sizeof biggest);
    memset(lm_rows, 0, sizeof lm_rows);
    rc = m3_kv_budget_group(g, M3_KV_BF16, M3_KV_BF16, 48, 100, 0.9, &bytes, how, sizeof how, &err);
    CHECK(rc == 0 && bytes == (size_t)(50 * GIB - 48 * MIB - page1 - 0.1 * TOTAL) && strstr(how, "rank 0"),
          "rank 0 the fullest: %zu bytes, '%s'", bytes, rc ? err.msg : how);
    CHECK(biggest[0] == 48 && biggest[1] == 48 && lm_rows[0] == 48 && lm_rows[1] == 48,
          "a 48-token step with its logits rows capped at 48: %d / %d tokens, %d / %d rows", biggest[0], biggest[1],
          lm_rows[0], lm_rows[1]);

    /* then the group steps as the engine's would, in the pool it makes */
    err.msg[0] = 0;
    rc = m3_group_kv_create(g, M3_KV_BF16, M3_KV_BF16, m3_kv_page_tokens(&full.cfg), 8, &err);
    m3_kv_seq seq = {0};
    m3_kv_seq *seqs[1] = {&seq};
    int32_t ids[5] = {1, 2, 3, 4, 5}, pos[5] = {0, 1, 2, 3, 4}, sq[5] = {0};
    m3_batch b = {5, pos, sq, seqs};
    int row = 4;
    float *lg = malloc(sizeof(float) * (size_t)full.cfg.vocab);
    if (!rc) rc = m3_group_forward(g, &b, ids, &row, 1, lg, NULL, &err);
    CHECK(rc == 0, "a step after the budget: %s", rc ? err.msg : "ok");
    m3_kv_seq_release(m3_group_kv(g, 0), &seq);
    free(seq.pages);
    free(lg);

    /* refusals: a utilization out of (0, 1]; nothing left on one rank; a rank's step failing */
    rc = m3_kv_budget_group(g, M3_KV_BF16, M3_KV_BF16, T, 8, 1.5, &bytes, how, sizeof how, &err);
    CHECK(rc && strstr(err.msg, "--gpu-memory-utilization 1.5"), "utilization 1.5: %s", rc ? err.msg : "accepted");
    base_free[1] = 7 * GIB; /* less than the 10% of 80 GiB kept free */
    rc = m3_kv_budget_group(g, M3_KV_BF16, M3_KV_BF16, T, 8, 0.9, &bytes, how, sizeof how, &err);
    CHECK(rc && strstr(err.msg, "no device memory left for the KV cache on rank 1") &&
              strstr(err.msg, "--max-num-batched-tokens"),
          "nothing left on rank 1: %s", rc ? err.msg : "accepted");
    base_free[1] = 59 * GIB;
    fail_rank = 1;
    rc = m3_kv_budget_group(g, M3_KV_BF16, M3_KV_BF16, T, 8, 0.9, &bytes, how, sizeof how, &err);
    CHECK(rc && strstr(err.msg, "kv budget: the profile step (96 tokens, 8 logits rows) over 2 ranks") &&
              strstr(err.msg, "a stand-in failure"),
          "a failing step: %s", rc ? err.msg : "accepted");
    fail_rank = -1;

    m3_group_free(g);
    m3_comm_destroy_all(comms, 2);
    m3_model_free(&full);
    printf(failures ? "kv budget (tensor parallel group): %d checks FAILED\n" : "kv budget (tensor parallel group): all checks passed\n",
           failures);
    return failures != 0;
}
