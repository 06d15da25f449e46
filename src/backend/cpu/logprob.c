/* Prompt logprobs on the CPU (ops.h logprob_rows): base/rows.c's m3_row_logprobs, a row a task
 * over the backend's threads (each row read by one thread: the same values in any order). */
#include <string.h>

#include "../../base/rows.h"
#include "cpu.h"

typedef struct {
    const float *x;
    int n, V, k;
    size_t ld;
    const int32_t *tok;
    m3_row_lp *out;
} lp_job;

static void lp_range(void *ctx, size_t r0, size_t r1, int worker) {
    (void)worker;
    const lp_job *j = ctx;
    for (size_t r = r0; r < r1; r++) {
        const float *row = j->x + r * j->ld;
        uint32_t bad = 0;
        for (int i = 0; i < j->V; i++) {
            uint32_t b;
            memcpy(&b, row + i, sizeof b);
            bad |= (b & 0x7f800000u) == 0x7f800000u;
        }
        if (bad) {
            memset(&j->out[r], 0, sizeof j->out[r]);
            continue;
        }
        m3_row_logprobs(row, j->n, j->tok[r], j->k, &j->out[r]);
        j->out[r].fin = 1;
    }
}

void m3_cpu_logprob_rows(void *ctx, const float *x, int rows, int n, int V, size_t ld, const int32_t *tok, int k,
                         m3_row_lp *out) {
    m3_cpu *c = ctx;
    if (rows <= 0) return;
    lp_job j = {x, n, V, k, ld, tok, out};
    if (rows == 1 || !c->pool) lp_range(&j, 0, (size_t)rows, 0);
    else m3_pool_for(c->pool, (size_t)rows, 1, lp_range, &j);
}
