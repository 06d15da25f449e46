/* vLLM's serve flags that have no m3 option of their own, so that a vLLM launch line runs as it is:
 * each is taken because m3 already does what it asks (silently), or taken and not used because it
 * tunes something m3 does its own way (one line on stderr says so), or refused with the reason when
 * m3 cannot do what it asks (TLS, LoRA, other parallelisms, a changed model). A value outside what
 * m3 does is refused naming the values it takes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum { SAME, UNUSED, REFUSE, EAGER, NO_ACCESS_LOG };

typedef struct {
    const char *flag;
    int value;           /* takes a value */
    int kind;
    const char *allowed; /* the values taken, '|'-separated; NULL: any */
    const char *why;     /* UNUSED: what m3 does instead; REFUSE and a refused value: why */
} vflag;

static const vflag flags[] = {
    /* what m3 does anyway */
    {"--enable-chunked-prefill", 0, SAME, NULL, NULL},
    {"--disable-log-stats", 0, SAME, NULL, NULL},
    {"--enable-expert-parallel", 0, SAME, NULL, NULL}, /* -tp N keeps routed experts whole per rank by default */
    {"-ep", 0, SAME, NULL, NULL},
    {"--no-enforce-eager", 0, SAME, NULL, NULL},
    {"--no-disable-log-stats", 0, SAME, NULL, NULL},
    {"--no-async-scheduling", 0, SAME, NULL, NULL},
    {"--no-enable-expert-parallel", 0, UNUSED, NULL, "m3's -tp keeps routed experts whole per rank (--moe-split width splits them)"},
    {"--disable-fastapi-docs", 0, SAME, NULL, NULL},
    {"--enable-request-id-headers", 0, SAME, NULL, NULL}, /* an X-Request-Id sent is echoed */
    {"--disable-frontend-multiprocessing", 0, SAME, NULL, NULL},
    {"--dtype", 1, SAME, "auto|bfloat16|bf16", "m3 runs the model in bf16 activations (f32 accumulation)"},
    {"--load-format", 1, SAME, "auto|safetensors", "m3 reads safetensors checkpoints"},
    {"--data-parallel-size", 1, SAME, "1", "m3 has no data parallelism (one engine a process; -tp N splits the model over N GPUs)"},
    {"-dp", 1, SAME, "1", "m3 has no data parallelism (one engine a process; -tp N splits the model over N GPUs)"},
    {"--pipeline-parallel-size", 1, SAME, "1", "m3 has no pipeline parallelism (-tp N splits the model over N GPUs)"},
    {"-pp", 1, SAME, "1", "m3 has no pipeline parallelism (-tp N splits the model over N GPUs)"},
    {"--distributed-executor-backend", 1, SAME, "mp|uni", "m3's ranks are threads of one process (docs/MULTINODE.md)"},
    {"--cpu-offload-gb", 1, SAME, "0", "m3 keeps the weights on the device"},
    {"--response-role", 1, SAME, "assistant", "m3 answers in the assistant role"},
    {"--chat-template-content-format", 1, SAME, "auto", "m3 gives the template each message's content as the request has it"},
    {"--tokenizer-mode", 1, SAME, "auto|slow|hf", "m3 runs the checkpoint's tokenizer.json"},
    {"--enforce-eager", 0, EAGER, NULL, NULL},
    {"--disable-uvicorn-access-log", 0, NO_ACCESS_LOG, NULL, NULL},
    /* tuning that m3 does its own way */
    {"--no-enable-chunked-prefill", 0, UNUSED, NULL, "m3 splits long prompts into chunks of --max-num-batched-tokens"},
    {"--async-scheduling", 0, UNUSED, NULL, "m3's engine plans each step itself"},
    {"--disable-custom-all-reduce", 0, UNUSED, NULL, "m3's tensor parallelism reduces over NCCL"},
    {"--calculate-kv-scales", 0, UNUSED, NULL, "m3's FP8 / NVFP4 caches carry per-block scales"},
    {"--block-size", 1, UNUSED, NULL, "m3's KV pages have the model's fixed size (the index-K cache's blocks)"},
    {"--swap-space", 1, UNUSED, NULL, "m3 preempts by recomputation, with no swap space"},
    {"--preemption-mode", 1, UNUSED, "recompute|swap", "m3 preempts by recomputation"},
    {"--uvicorn-log-level", 1, UNUSED, "critical|error|warning|info|debug|trace", "m3 has its own HTTP server and log lines"},
    {"--max-log-len", 1, UNUSED, NULL, "m3's request log lines hold no prompt text"},
    {"--quantization", 1, UNUSED, NULL, "m3 reads each tensor in its stored format (MXFP8, NVFP4, BF16)"},
    {"-q", 1, UNUSED, NULL, "m3 reads each tensor in its stored format (MXFP8, NVFP4, BF16)"},
    {"--download-dir", 1, UNUSED, NULL, "m3 reads the local checkpoint directory"},
    {"--revision", 1, UNUSED, NULL, "m3 reads the local checkpoint directory"},
    {"--tokenizer-revision", 1, UNUSED, NULL, "m3 reads the local checkpoint directory"},
    {"--code-revision", 1, UNUSED, NULL, "m3 runs no code from the checkpoint"},
    {"--compilation-config", 1, UNUSED, NULL, "m3's kernels are compiled ahead of time; CUDA graphs are recorded per step shape"},
    {"-O", 1, UNUSED, NULL, "m3's kernels are compiled ahead of time; CUDA graphs are recorded per step shape"},
    {"--cuda-graph-sizes", 1, UNUSED, NULL, "m3 records CUDA graphs per step shape as they come"},
    {"--max-seq-len-to-capture", 1, UNUSED, NULL, "m3 records CUDA graphs per step shape as they come"},
    {"--max-num-partial-prefills", 1, UNUSED, NULL, "m3 plans each step's prefill chunks itself"},
    {"--max-long-partial-prefills", 1, UNUSED, NULL, "m3 plans each step's prefill chunks itself"},
    {"--long-prefill-token-threshold", 1, UNUSED, NULL, "m3 plans each step's prefill chunks itself"},
    {"--num-scheduler-steps", 1, UNUSED, NULL, "m3's engine schedules every step"},
    {"--scheduler-delay-factor", 1, UNUSED, NULL, "m3's engine schedules every step at once"},
    {"--guided-decoding-backend", 1, UNUSED, NULL, "m3 compiles grammars with its own engine"},
    {"--structured-outputs-config", 1, UNUSED, NULL, "m3 compiles grammars with its own engine"},
    {"--mm-processor-kwargs", 1, UNUSED, NULL, "m3 preprocesses images as the checkpoint's preprocessor config says"},
    {"--allowed-local-media-path", 1, UNUSED, NULL, "m3 reads no local files for requests: images come as data: URLs"},
    {"--max-logprobs", 1, UNUSED, NULL, "m3 takes up to 20 top logprobs a token, as OpenAI does"},
    {"--root-path", 1, UNUSED, NULL, "m3 serves its routes at the root (a proxy may strip a prefix)"},
    {"--api-server-count", 1, UNUSED, NULL, "m3 serves HTTP from one event loop with preparation threads"},
    /* what m3 cannot do */
    {"--ssl-keyfile", 1, REFUSE, NULL, "m3 serves plain HTTP; put a TLS-terminating proxy in front"},
    {"--ssl-certfile", 1, REFUSE, NULL, "m3 serves plain HTTP; put a TLS-terminating proxy in front"},
    {"--ssl-ca-certs", 1, REFUSE, NULL, "m3 serves plain HTTP; put a TLS-terminating proxy in front"},
    {"--enable-lora", 0, REFUSE, NULL, "m3 serves no LoRA adapters"},
    {"--lora-modules", 1, REFUSE, NULL, "m3 serves no LoRA adapters"},
    {"--enable-sleep-mode", 0, REFUSE, NULL, "m3 has no sleep mode"},
    {"--middleware", 1, REFUSE, NULL, "m3 runs no Python middleware"},
    {"--hf-overrides", 1, REFUSE, NULL, "m3 runs the checkpoint's config.json as it is (edit a copy of the checkpoint's)"},
    {"--rope-scaling", 1, REFUSE, NULL, "m3 runs the checkpoint's config.json as it is (edit a copy of the checkpoint's)"},
    {"--rope-theta", 1, REFUSE, NULL, "m3 runs the checkpoint's config.json as it is (edit a copy of the checkpoint's)"},
    {"--kv-transfer-config", 1, REFUSE, NULL, "m3 has no disaggregated prefill / KV transfer"},
};

/* value is one of allowed's '|'-separated items */
static int allowed_value(const char *allowed, const char *v) {
    const size_t n = strlen(v);
    for (const char *p = allowed;;) {
        const char *bar = strchr(p, '|');
        const size_t k = bar ? (size_t)(bar - p) : strlen(p);
        if (k == n && !strncmp(p, v, n)) return 1;
        if (!bar) return 0;
        p = bar + 1;
    }
}

int m3_cli_vllm_flag(const char *cmd, const char *a, const char *v, int has_eq, m3_vllm_flags *f) {
    const vflag *x = NULL;
    for (size_t i = 0; i < sizeof flags / sizeof *flags && !x; i++)
        if (!strcmp(flags[i].flag, a)) x = &flags[i];
    if (!x) return 0;
    if (!x->value && has_eq) { fprintf(stderr, "%s: %s takes no value\n", cmd, a); return -1; }
    if (!x->value) v = NULL;
    if (x->value && !v) { fprintf(stderr, "%s: %s needs a value\n", cmd, a); return -1; }
    if (x->kind == REFUSE) { fprintf(stderr, "%s: %s is not supported: %s\n", cmd, a, x->why); return -1; }
    if (x->allowed && !allowed_value(x->allowed, v)) {
        fprintf(stderr, "%s: %s %s: %s (m3 takes %s)\n", cmd, a, v, x->why, x->allowed);
        return -1;
    }
    switch (x->kind) {
    case UNUSED:
        fprintf(stderr, "%s: %s%s%s taken, not used: %s\n", cmd, a, v ? " " : "", v ? v : "", x->why);
        break;
    case EAGER: f->eager = 1; break;
    case NO_ACCESS_LOG: f->no_access_log = 1; break; /* (the caller applies it in the flags' order) */
    default: break;
    }
    return x->value ? 2 : 1;
}
