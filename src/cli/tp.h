/* --tensor-parallel-size N (-tp N) for the m3 commands: the full model's host weights (the
 * safetensors mapping), and N ranks each with its view of them: on the CPU N thread ranks
 * (thread communicator, threads / N workers each), on CUDA one GPU per rank (NCCL, device r
 * for rank r, one CUDA context and thread per rank; each GPU receives only its slices). */
#ifndef M3_CLI_TP_H
#define M3_CLI_TP_H

#include "../model/group.h"

typedef struct m3_cli_tp {
    m3_group *g;
    m3_comm **comms;
    int size;
    int cuda;                /* 1: GPU ranks */
    int threads_per_rank;    /* CPU ranks */
} m3_cli_tp;

/* Loads dir into *full (host weights only: full stays the caller's and must outlive tp) and
 * starts the group. backend: cpu, cuda, auto / NULL ($M3_BACKEND, else cuda when enough GPUs
 * and NCCL are there, else cpu). Prints errors ("m3 CMD: ...") and a summary per rank. */
int m3_cli_tp_load(m3_cli_tp *tp, m3_model *full, const char *backend, const char *dir, int threads, int size,
                   m3_moe_split moe, const char *cmd, const int32_t *ids, int n_ids);
void m3_cli_tp_free(m3_cli_tp *tp);

#endif
