/* -tp N for the commands (see tp.h). */
#include "tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend/cpu/cpu.h"
#include "../backend/cuda/cuda.h"
#include "cli.h"

static int ops_init_cpu(void *arg, int rank, m3_ops *ops, m3_comm *comm, m3_err *err) {
    (void)rank; (void)comm;
    if (m3_cpu_ops_init(ops, ((m3_cli_tp *)arg)->threads_per_rank, err)) return -1;
    m3_cli_apply_precision(ops);
    return 0;
}

/* on rank r's thread: the CUDA context of device r, and the rank's collectives on its stream */
static int ops_init_cuda(void *arg, int rank, m3_ops *ops, m3_comm *comm, m3_err *err) {
    (void)arg;
    if (m3_cuda_ops_init(ops, rank, err)) return -1;
    m3_cli_apply_precision(ops);
    if (m3_comm_set_stream(comm, m3_cuda_stream(ops), err)) { m3_cuda_ops_free(ops); return -1; }
    return 0;
}

static void ops_free_any(void *arg, int rank, m3_ops *ops) {
    (void)rank;
    if (((m3_cli_tp *)arg)->cuda) m3_cuda_ops_free(ops);
    else m3_cpu_ops_free(ops);
}

static double weight_mb(const m3_weights *w) {
    double b = 0;
    for (int f = 0; f < M3_WF_COUNT; f++) b += (double)w->bytes_by_fmt[f];
    return b / 1e6;
}

int m3_cli_tp_load(m3_cli_tp *tp, m3_model *full, const char *backend, const char *dir, int threads, int size,
                   m3_moe_split moe, const char *cmd, const int32_t *ids, int n_ids) {
    memset(tp, 0, sizeof *tp);
    memset(full, 0, sizeof *full);
    m3_err err;
    tp->size = size;
    if (!backend || !strcmp(backend, "auto")) {
        const char *env = getenv("M3_BACKEND");
        backend = env && *env ? env : m3_cuda_device_count() > 0 ? "cuda" : "cpu";
    }
    if (!strcmp(backend, "cuda")) {
        int n = m3_cuda_device_count();
        if (!m3_cuda_built()) { fprintf(stderr, "m3 %s: this m3 was built without the CUDA backend\n", cmd); return -1; }
        if (!m3_comm_nccl_built()) {
            fprintf(stderr, "m3 %s: --tensor-parallel-size %d on GPUs needs NCCL, and this m3 was built without it\n", cmd, size);
            return -1;
        }
        if (n < size) {
            fprintf(stderr, "m3 %s: --tensor-parallel-size %d needs %d GPUs, %d visible\n", cmd, size, size, n);
            return -1;
        }
        tp->cuda = 1;
    } else if (!strcmp(backend, "cpu")) {
        int total = threads;
        if (total <= 0) {
            const char *env = getenv("M3_THREADS");
            total = env ? atoi(env) : 0;
            if (total <= 0) total = (int)sysconf(_SC_NPROCESSORS_ONLN);
        }
        tp->threads_per_rank = total / size > 0 ? total / size : 1;
    } else {
        fprintf(stderr, "m3 %s: unknown backend '%s' (cpu, cuda or auto)\n", cmd, backend);
        return -1;
    }
    if (m3_cli_precheck_moe_act_quant(dir, cmd)) return -1;
    if (m3_model_load(full, dir, NULL, NULL, NULL, &err)) { fprintf(stderr, "m3 %s: %s\n", cmd, err.msg); return -1; }
    if (m3_cli_apply_moe_act_quant(&full->cfg, cmd)) goto fail; /* before the ranks copy the config */
    for (int i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= full->cfg.vocab) {
            fprintf(stderr, "m3 %s: token id %d at index %d is out of range (vocab %d)\n", cmd, ids[i], i, full->cfg.vocab);
            goto fail;
        }
    if (!tp->cuda) m3_weights_prefault(full->st, NULL, NULL); /* the CPU ranks read the mapping in place */
    tp->comms = calloc((size_t)size, sizeof *tp->comms);
    if (!tp->comms) { fprintf(stderr, "m3 %s: out of memory\n", cmd); goto fail; }
    int rc;
    if (tp->cuda) {
        int *devs = malloc(sizeof(int) * (size_t)size);
        if (!devs) { fprintf(stderr, "m3 %s: out of memory\n", cmd); goto fail; }
        for (int r = 0; r < size; r++) devs[r] = r;
        rc = m3_comm_nccl_create(size, devs, tp->comms, &err);
        free(devs);
    } else {
        rc = m3_comm_threads_create(size, tp->comms, &err);
    }
    if (rc) { fprintf(stderr, "m3 %s: %s\n", cmd, err.msg); goto fail; }
    m3_group_opts o = {size, moe, tp->comms, tp->cuda ? ops_init_cuda : ops_init_cpu, ops_free_any, tp, NULL};
    tp->g = m3_group_create(full, &o, &err);
    if (!tp->g) { fprintf(stderr, "m3 %s: %s\n", cmd, err.msg); goto fail; }
    fprintf(stderr, "loaded %s: tensor parallel %d on %s (%s communicator; MoE split: %s), %.1f MB mapped\n", dir, size,
            tp->cuda ? "GPUs" : "the CPU", tp->comms[0]->kind, m3_moe_split_name(moe), m3_st_total_bytes(full->st) / 1e6);
    for (int r = 0; r < size; r++) {
        const m3_model *m = m3_group_model(tp->g, r);
        const m3_shard *s = &m->shard;
        char where[160];
        if (tp->cuda) snprintf(where, sizeof where, "GPU %d: %s", r, m3_cuda_device_name(m->ops));
        else snprintf(where, sizeof where, "%d thread(s), %s kernels", tp->threads_per_rank, m3_cpu_simd_name());
        char ex[64];
        if (moe == M3_MOE_WIDTH) snprintf(ex, sizeof ex, "all experts, 1/%d of their width", size);
        else snprintf(ex, sizeof ex, "experts %d-%d", s->expert0, s->expert0 + s->n_experts - 1);
        fprintf(stderr, "  rank %d: query heads %d-%d, KV heads %d-%d, %s, vocab %d-%d: %.1f MB of weights; %.2fs; %s\n", r,
                s->head0, s->head0 + s->n_heads - 1, s->kv_head0, s->kv_head0 + s->n_kv_heads - 1, ex, s->vocab0,
                s->vocab0 + s->n_vocab - 1, weight_mb(&m->w), m->load_seconds, where);
    }
    return 0;
fail:
    m3_cli_tp_free(tp);
    m3_model_free(full);
    return -1;
}

void m3_cli_tp_free(m3_cli_tp *tp) {
    m3_group_free(tp->g);
    if (tp->comms) m3_comm_destroy_all(tp->comms, tp->size);
    free(tp->comms);
    memset(tp, 0, sizeof *tp);
}
