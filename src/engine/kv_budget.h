/* How large the KV + index-K pool is when the user gives no size (vLLM's rule).
 *
 * A device backend: the pool takes what is left of utilization x the device's total memory
 * once the weights are loaded and the largest step has run: m3_kv_budget_device runs one
 * forward of max_num_batched_tokens tokens (m3_stand_in_ids) asking for the logits of max_rows rows
 * and, with prompt_rows, every token's prompt logprobs reduced on the device (m3_taps.lp_rows: a
 * tile of logits, every row's answer) (its activations and the backend's scratch reach their
 * size and stay allocated), then asks the
 * driver: pool = free - (1 - utilization) x total. What the profile cannot see (longer
 * contexts' attention splits, a vision tower, other processes later) lives in that margin.
 * A tensor-parallel group: the same step over every rank (m3_group_forward, in a pool of its
 * own, made one page after), each rank's free memory then, the smallest over the ranks.
 * The host: a quarter of the memory available now, at most 4 GiB (vLLM's CPU backend takes
 * 4 GiB by default). */
#ifndef M3_ENGINE_KV_BUDGET_H
#define M3_ENGINE_KV_BUDGET_H

#include <stddef.h>

#include "../base/err.h"
#include "../kv/kv.h"
#include "../model/m3.h"

struct m3_group;

/* ids for a step that stands in for real ones (the profile step below, m3_engine_warmup): spread
 * over the vocabulary so that the MoE routes them over many experts, as text does (one repeated id
 * routes every token to the same few experts, and the grouped GEMMs' buffers, sized by the
 * experts in use, stay small) */
static inline void m3_stand_in_ids(int32_t *ids, int n, int vocab) {
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(((long long)i * 7919 + 13) % vocab);
}

/* *bytes: the pool's share of memory; how: one line saying how it was sized (for the
 * start-up line). -1 + err when the profile step fails or nothing is left for a pool. */
int m3_kv_budget_device(m3_model *m, m3_kv_dtype dt, m3_kv_dtype idt, int max_tokens, int max_rows, int prompt_rows,
                        double utilization,
                        size_t *bytes, char *how, size_t how_cap, m3_err *err);
/* A tensor-parallel group (every rank's ops report their memory): the profile step over the
 * group, then *bytes per rank, from the rank with the least left. The group's KV pool is one page
 * afterwards (m3_group_kv_create makes the real one). A failed step leaves the group as a failed
 * m3_group_forward does (after an NCCL abort it refuses further steps). */
int m3_kv_budget_group(struct m3_group *g, m3_kv_dtype dt, m3_kv_dtype idt, int max_tokens, int max_rows,
                       double utilization, size_t *bytes, char *how, size_t how_cap, m3_err *err);
size_t m3_kv_budget_host(char *how, size_t how_cap);

#endif
