/* m3 serve: OpenAI-compatible HTTP server (src/server/server.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend/cpu/cpu.h"
#include "../engine/engine.h"
#include "../base/clock.h"
#include "../base/fault.h"
#include "../kv/kv.h"
#include "../server/openai.h"
#include "../server/server.h"
#include "../chat/chat.h"
#include "../tokenizer/tokenizer.h"
#include "cli.h"
#include "tp.h"

static const char *usage =
    "usage: m3 serve DIR | -m DIR [--host 127.0.0.1] [--port 8000 | --uds PATH] [--api-key KEY] [--served-model-name NAME [NAME...]]\n"
    "                [--chat-template FILE|TEXT]\n"
    "                [--threads N] [--kv-cache-memory BYTES | --gpu-memory-utilization F] [--max-num-seqs N]\n"
    "                [--scheduling-policy fcfs|priority] [--reasoning-budget N]\n"
    "                [--max-num-batched-tokens N] [--max-logits-rows N] [--warmup-tokens N]\n"
    "                [--max-model-len N] [--sample-threads N] [--grammar-threads N] [--speculative-config JSON] [--draft DIR]\n"
    "                [--kv-cache-dtype auto|f32|bf16|fp8|nvfp4] [--index-cache-dtype DTYPE]\n"
    "                [--max-waiting N] [--shutdown-timeout SECONDS] [--max-body BYTES] [--max-header-bytes BYTES]\n"
    "                [--timeout SECONDS] [--max-connections N] [--max-image-memory BYTES] [--disable-log-requests]\n"
    "                [--responses-store BYTES] [--enable-prompt-tokens-details]\n"
    "                [--language-model-only]\n"
    "                [--allowed-media-domains HOST[,HOST...]] [--allowed-origins LIST] [-tp N] [--moe-split experts|width]\n"
    "  DIR, -m DIR, --model DIR  the checkpoint directory (Hugging Face layout)\n"
    "  --host H, --port P  the address to listen on (default 127.0.0.1, loopback only; port 8000; 0: any free port)\n"
    "  --uds PATH       listen on a Unix socket at PATH instead (vLLM's flag; a socket left there by a server\n"
    "                   that is gone is replaced; the socket is removed at shutdown)\n"
    "  --api-key KEY    requests but /health and /metrics need 'Authorization: Bearer KEY' exactly (default: none)\n"
    "  --threads N      CPU threads of the CPU backend (default 0: every core)\n"
    "  --max-num-seqs N  sequences the engine runs at once (default 64)\n"
    "  --scheduling-policy fcfs|priority  fcfs (default): requests in arrival order, a preemption takes the\n"
    "                   latest admitted; priority (vLLM's): by the request's \"priority\" (smaller first), then\n"
    "                   arrival, a preemption taking the one served last\n"
    "  --reasoning-budget N  chat requests without a thinking_token_budget get N: at most N tokens of\n"
    "                   reasoning, then </mm:think> (llama.cpp's flag; 0: reasoning closed at once; -1, the\n"
    "                   default: none; a request's thinking_token_budget -1: none for it)\n"
    "  --max-num-batched-tokens N  tokens of one step, prefill chunks included (default 4096 on the GPU, where\n"
    "                   large prefill chunks keep the tensor cores busy; 512 on the CPU)\n"
    "  --max-logits-rows N  logits rows one step may bring back, when more than one a sequence (k + 1 with a\n"
    "                   draft; a smaller N changes nothing): under tensor parallelism prompt logprobs (echo +\n"
    "                   logprobs, prompt_logprobs) come back as rows and run their prompt in chunks of the rows\n"
    "                   a step has left (on one device they are reduced where the logits are: any chunk);\n"
    "                   each row is vocab x 4 bytes of host and device memory, left out of the KV cache's budget\n"
    "  --warmup-tokens N  before listening, one request of N prompt tokens (at most a step) and a few decodes,\n"
    "                   then 8 requests of 2N tokens in all together, not counted and not cached: the first\n"
    "                   requests then find the step buffers sized and the kernels loaded (default:\n"
    "                   --max-num-batched-tokens on the GPU, 0 on the CPU; 0: none)\n"
    "  --precision P    GEMM inputs (attention's q, K, V, probabilities too): bf16 (rounded to bf16; the GPU's\n"
    "                   tensor-core path) or exact (f32); default\n"
    "                   bf16 on the GPU, exact on the CPU ($M3_PRECISION sets the default)\n"
    "  --moe-act-quant Q  the routed experts' FC1 input: none (as is, the Hugging Face reference's; default) or\n"
    "                   nvfp4 (quantized per token to NVFP4 and back, as the M3.1 experts were trained;\n"
    "                   $M3_MOE_ACT_QUANT sets the default)\n"
    "  --disable-log-requests  no line per request on stderr (--enable-log-requests, the default, keeps them)\n"
    "  --served-model-name N [N...]  the names /v1/models lists and requests may ask for; responses carry the\n"
    "                   first (default: the model directory)\n"
    "  --tokenizer DIR  tokenizer.json and tokenizer_config.json from DIR instead of the checkpoint's (vLLM's)\n"
    "  --chat-template T  the chat template: a file, or the template itself (default: the checkpoint's, then the\n"
    "                   built-in MiniMax-M3 one); the special tokens stay the tokenizer config's\n"
    "  --kv-cache-dtype D  the KV cache's dtype; auto (default) = bf16, the model's activation dtype\n"
    "                   (f32 keeps the exact reference arithmetic); --index-cache-dtype follows it unless given\n"
    "  --gpu-memory-utilization F  the share of the device's memory the server may use (default 0.9, as vLLM):\n"
    "                   the KV pool gets what the weights and a profiled step of --max-num-batched-tokens leave\n"
    "                   of it; on the CPU the pool takes a quarter of the available RAM, at most 4 GiB.\n"
    "                   --kv-cache-memory BYTES sets the pool's size instead\n"
    "  --max-model-len N  tokens per request (prompt + output); default: the config's max_position_embeddings,\n"
    "                   at most what the KV pool holds\n"
    "  Flags take '--flag value' or '--flag=value'; sizes take vLLM's suffixes (32k = 32000, 32K = 32768, 4G, 4GiB).\n"
    "  --enable-force-include-usage  every stream ends with a usage chunk, stream_options or not (vLLM's)\n"
    "  --return-tokens-as-token-ids  logprobs name tokens \"token_id:<id>\" unless a request says otherwise (vLLM's)\n"
    "  --trust-request-chat-template  a chat request's own chat_template renders its prompt (vLLM's; refused\n"
    "                   without it); it runs in m3's Jinja sandbox, within its step and memory limits\n"
    "  More of vLLM's flags: --enforce-eager (no CUDA graphs), --disable-uvicorn-access-log\n"
    "  (= --disable-log-requests), --enable-chunked-prefill, --enable-expert-parallel (-tp's default),\n"
    "  --dtype auto|bfloat16, --load-format auto|safetensors, --data/--pipeline-parallel-size 1 and the like are\n"
    "  taken; tuning flags m3 does its own way (--block-size, --swap-space, --compilation-config, ...) are taken\n"
    "  and not used, each said in one line; TLS, LoRA, sleep mode and config overrides are refused.\n"
    "  vLLM's launch lines work: --enable-prefix-caching (default) / --no-enable-prefix-caching,\n"
    "  --enable-auto-tool-choice, --tool-call-parser / --reasoning-parser minimax_m3 (the MiniMax-M3 parsers\n"
    "  are used whenever the chat template writes their markup), --trust-remote-code (nothing is run),\n"
    "  --kv-cache-dtype fp8_e4m3 (= fp8), --seed N (requests without a seed: seeds from N and their order),\n"
    "  --generation-config auto|vllm|DIR (auto, the default: the sampling defaults of the checkpoint's\n"
    "  generation_config.json for requests that leave them out; vllm: OpenAI's defaults),\n"
    "  --override-generation-config JSON (defaults set over those: temperature, top_p, top_k, min_p,\n"
    "  repetition_penalty, max_new_tokens = max_tokens; null: none)\n"
    "  -tp, --tensor-parallel-size N  N ranks: N GPUs (NCCL) with the CUDA backend, N thread groups on the CPU;\n"
    "                   --kv-cache-memory is then per rank (see docs/MULTINODE.md)\n"
    "  --moe-split experts|width  routed experts whole per rank (expert parallel, default) or split by width\n"
    "  --max-waiting N  429 for new generation requests while N sequences wait in the engine (default 1024)\n"
    "  --sample-threads N  threads drawing a step's tokens, or splitting one row's passes when a draw runs\n"
    "                      alone (default: one per CPU up to 8 on a GPU, 1 on the CPU)\n"
    "  --grammar-threads N  threads computing the next step's token masks of structured outputs while the\n"
    "                      forward runs; 0: none, masks are computed as rows are sampled (default: 1 on a GPU,\n"
    "                      0 on the CPU, where the forward's threads take every core)\n"
    "  --shutdown-timeout S  after SIGTERM / SIGINT, requests in flight get S seconds, then are cancelled (default 30)\n"
    "  --max-body BYTES request body limit, 413 beyond it (default 33554432)\n"
    "  --max-header-bytes BYTES  request line + headers limit (default 65536)\n"
    "  --timeout S      a connection silent for S seconds (request not arriving, idle keep-alive, a client\n"
    "                   not reading its stream) is closed and its request cancelled (default 60; 0: never);\n"
    "                   a stream waiting for the engine is never cut: it gets ': keep-alive' SSE comments;\n"
    "                   a request must arrive whole within S seconds, however it trickles in\n"
    "  --max-connections N  connections at once (default 1024; 0: no cap): beyond, new clients wait\n"
    "  --language-model-only  do not load the vision tower: requests with images get 400\n"
    "  --max-image-memory BYTES  preprocessed image pixels all requests together may hold until the vision\n"
    "                   tower has run (default 2147483648; 0: no limit); a request with images beyond it gets 429\n"
    "  --enable-prompt-tokens-details  usage of (chat) completions names the prompt tokens the prefix cache held\n"
    "                   (prompt_tokens_details.cached_tokens)\n"
    "  --responses-store BYTES  memory for stored responses (/v1/responses with store, previous_response_id,\n"
    "                   GET / DELETE /v1/responses/ID; default 268435456): past it the oldest go; 0: none stored\n"
    "  --limit-mm-per-prompt '{\"image\": N}'  at most N images a request (vLLM's; default 32), more get 400\n"
    "  --allowed-media-domains H1,H2  hosts whose http(s) image URLs are named as allowed in the 400 they get\n"
    "                   (remote images are never downloaded: send images as data: URLs)\n"
    "  --allowed-origins LIST  CORS: origins whose browser pages may call the API, as a JSON list\n"
    "                       ('[\"https://app.example\"]', '[\"*\"]' any) or comma-separated (default: none, CORS off)\n"
    "  M3_FAULT_ALLOC=MODULE:FIRST[:COUNT[:PERIOD]] (environment, tests only): allocation failures, see\n"
    "                   src/base/fault.h\n"
    "  --speculative-config '{\"method\":\"dspark\",\"num_speculative_tokens\":7,\"draft_sample_method\":\"probabilistic\"}'\n"
    "                 DSpark speculative decoding with the draft in DIR/dspark (or --draft DIR; default: none);\n"
    "                 optional keys: \"disable_by_batch_size\": N (no drafts in a step of more than N running\n"
    "                 requests), \"max_model_len\": N (no drafts past N tokens), \"dspark_confidence_threshold\": T,\n"
    "                 \"draft_sample_method\": \"greedy\"\n";

/* The vision tower when the checkpoint has one: the engine runs it (on the CPU ops; beside a
 * device backend on a CPU op table of its own) and the server preprocesses images for it. */
static int vision_setup(const char *cmd, m3_vision *vis, m3_model *m, m3_ops *ops, const char *dir, int threads, m3_ops *vops,
                        int *own_vops, m3_media_ctx *media, m3_engine_opts *eo) {
    m3_err err;
    if (m3_vision_load(vis, dir, m->st, &err)) { fprintf(stderr, "%s: %s\n", cmd, err.msg); return -1; }
    if (!vis->present) return 0;
    const m3_vision_config *vc = &vis->cfg;
    if (vc->text_hidden != m->cfg.hidden) {
        fprintf(stderr, "%s: vision config text hidden size %d differs from the text model's %d\n", cmd, vc->text_hidden, m->cfg.hidden);
        return -1;
    }
    if (vc->image_token < 0 || vc->image_token >= m->cfg.vocab) {
        fprintf(stderr, "%s: image_token_index %d is outside the vocabulary (%d)\n", cmd, vc->image_token, m->cfg.vocab);
        return -1;
    }
    m3_image_opts_default(&media->io);
    media->io.patch = vc->patch;
    media->io.temporal = vc->temporal;
    media->io.merge = vc->merge;
    if (m3_image_opts_load(&media->io, dir, &err)) { fprintf(stderr, "%s: %s\n", cmd, err.msg); return -1; }
    m3_ops *use = ops;
    const char *vcpu = getenv("M3_VISION_CPU");
    /* tensor-parallel ranks, a backend without vision ops, or M3_VISION_CPU=1: a CPU op table of
     * its own; a device backend with them: the engine puts the tower's weights there */
    if (!ops || !ops->attention_full || (ops->device_memory && vcpu && atoi(vcpu) == 1)) {
        if (m3_cpu_ops_init(vops, threads, &err)) { fprintf(stderr, "%s: vision tower ops: %s\n", cmd, err.msg); return -1; }
        *own_vops = 1;
        use = vops;
    }
    eo->vision = vis;
    eo->vision_ops = use;
    media->vc = vc;
    fprintf(stderr, "%s: vision tower: %d layers, hidden %d, image token %d%s\n", cmd, vc->layers, vc->hidden, vc->image_token,
            use != ops ? " (on a CPU op table of its own)" : use->device_memory ? " (on the GPU)" : "");
    return 0;
}

int m3_cmd_serve(int argc, char **argv) { return m3_serve_main(argc, argv, NULL); }

int m3_serve_main(int argc, char **argv, const m3_serve_hook *hook) {
    const char *name = hook ? hook->name : "serve", *cmd = hook ? hook->cmd : "m3 serve";
    const char *dir = NULL, *names[17] = {0}, *chat_tmpl = NULL, *spec_json = NULL, *draft_dir = NULL, *kvd = NULL, *ikd = NULL;
    long threads = 0, port = 8000, kvmem = 0, seqs = 0, batched = 0, lrows = 0, warm = -1, mml = 0, waiting = -1, grace = -1, body = 0, sthreads = 0, gthreads = -1, rbudget = -1;
    long hdr = 0, tmo = -1, tpn = 1, imgmem = -1, maxconn = -1, rstore = -1;
    double util = 0.9;
    const char *moe_split = NULL;
    int lm_only = 0;
    const char *media_domains = NULL;
    const char *mm_limit = NULL; /* vLLM's --limit-mm-per-prompt JSON */
    const char *tok_dir = NULL;  /* vLLM's --tokenizer DIR (default: the checkpoint's) */
    m3_media_ctx mm_lim = {0};   /* ... checked before anything loads, into this */
    const char *origins_arg = NULL; /* --allowed-origins: a JSON list (vLLM's form) or comma-separated */
    m3_server_opts so;
    m3_server_opts_default(&so);
    m3_vllm_flags vfl = {0};
    m3_err err;
    long seed = -1;
    const char *gen_cfg = "auto"; /* the checkpoint's generation_config.json (vLLM's default) */
    const char *gen_over = NULL;  /* --override-generation-config: JSON set over it */
    int prefix = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char flag[96], dotted[256];
        const char *eq = a[0] == '-' ? strchr(a, '=') : NULL;
        if (eq && (size_t)(eq - a) < sizeof flag) { /* --flag=value (and -tp=2), as vLLM's launch lines spell it */
            memcpy(flag, a, (size_t)(eq - a));
            flag[eq - a] = 0;
            a = flag;
            v = eq + 1;
        } else if (!strncmp(a, "-O", 2) && a[2] && a[2] != '.') { /* -O3: vLLM's optimization level */
            eq = a + 1;
            v = a + 2;
            a = "-O";
        }
        if (a[0] == '-' && a[1] == '-' && strchr(a, '_') && strlen(a) < sizeof flag) { /* --max_model_len: vLLM takes _ for - */
            if (a != flag) strcpy(flag, a);
            for (char *q = flag; *q; q++)
                if (*q == '_') *q = '-';
            a = flag;
        }
        const char *dot = a[0] == '-' ? strchr(a, '.') : NULL;
        if (dot && (size_t)(dot - a) < sizeof flag) { /* --limit-mm-per-prompt.image 2: one key of a JSON flag */
            char key[64];
            snprintf(key, sizeof key, "%s", dot + 1);
            if (a != flag) memcpy(flag, a, (size_t)(dot - a));
            flag[dot - a] = 0;
            a = flag;
            if (v && !strcmp(a, "--limit-mm-per-prompt")) { /* (the others are taken unused: any value) */
                snprintf(dotted, sizeof dotted, "{\"%s\": %s}", key, v);
                v = dotted;
            }
        }
        int r = 0, takes = !eq; /* a value from the next argument */
        if (a[0] != '-') { /* the model, positional (vllm serve MODEL) */
            if (dir) { fprintf(stderr, "%s: two models given ('%s' and '%s')\n", cmd, dir, a); return 2; }
            dir = a;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(hook ? hook->usage : usage, stdout); return 0; }
        /* switches */
        int sw = 1;
        if (!strcmp(a, "--disable-log-requests") || !strcmp(a, "--no-enable-log-requests")) so.log_requests = 0;
        else if (!strcmp(a, "--enable-log-requests")) so.log_requests = 1;
        else if (!strcmp(a, "--language-model-only")) lm_only = 1;
        else if (!strcmp(a, "--enable-prefix-caching")) prefix = 1;
        else if (!strcmp(a, "--no-enable-prefix-caching")) prefix = 0;
        else if (!strcmp(a, "--enable-prompt-tokens-details")) so.prompt_tokens_details = 1;
        else if (!strcmp(a, "--enable-force-include-usage")) so.force_include_usage = 1;
        else if (!strcmp(a, "--return-tokens-as-token-ids")) so.ids_as_tokens = 1;
        else if (!strcmp(a, "--trust-request-chat-template")) so.trust_templates = 1;
        else if (!strcmp(a, "--enable-auto-tool-choice")) {} /* tool calls are parsed whenever the template writes them */
        else if (!strcmp(a, "--trust-remote-code")) {}       /* nothing from the checkpoint is ever run */
        else sw = 0;
        if (sw) {
            if (eq) { fprintf(stderr, "%s: %s takes no value\n", cmd, a); return 2; }
            continue;
        }
        /* a flag with a value: V is it, or "" with `missing` set (said below, once the flag is known) */
        const char *missing = NULL;
#define V (v ? v : (missing = a, ""))
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (v && dir && strcmp(dir, v)) { fprintf(stderr, "%s: two models given ('%s' and '%s')\n", cmd, dir, V); return 2; }
            dir = V;
        } else if (hook && (!strcmp(a, "--host") || !strcmp(a, "--port") || !strcmp(a, "--uds"))) {
            fprintf(stderr, "%s: %s: %s\n", cmd, a, hook->no_listen);
            return 2;
        } else if (!strcmp(a, "--host")) so.host = V;
        else if (!strcmp(a, "--uds")) so.uds = V;
        else if (!strcmp(a, "--api-key")) so.api_key = V;
        else if (!strcmp(a, "--served-model-name")) { /* one or more names (vLLM: nargs +), the flag repeatable */
            int nn = 0;
            while (names[nn]) nn++;
            if (v && nn < 16) names[nn++] = V;
            while (!eq && i + 2 < argc && argv[i + 2][0] != '-' && nn < 16) names[nn++] = argv[++i + 1];
            if (!eq && i + 2 < argc && argv[i + 2][0] != '-') {
                fprintf(stderr, "%s: --served-model-name: at most 16 names\n", cmd);
                return 2;
            }
            for (int k = 0; k < nn; k++)
                if (!*names[k]) { fprintf(stderr, "%s: --served-model-name: an empty name\n", cmd); return 2; }
            if (!v) missing = a;
        } else if (!strcmp(a, "--chat-template")) chat_tmpl = V;
        else if (!strcmp(a, "--port")) r = m3_cli_int(a, V, 0, 65535, &port, &err);
        else if (!strcmp(a, "--threads")) r = m3_cli_int(a, V, 0, 1024, &threads, &err);
        else if (!strcmp(a, "--kv-cache-memory")) r = m3_cli_size(a, V, 1, __LONG_MAX__, &kvmem, &err);
        else if (!strcmp(a, "--gpu-memory-utilization")) {
            char *end;
            util = strtod(V, &end);
            if (v && (*end || end == v || !(util > 0 && util <= 1))) {
                fprintf(stderr, "%s: --gpu-memory-utilization '%s': expected a fraction in (0, 1]\n", cmd, V);
                return 2;
            }
        } else if (!strcmp(a, "--max-num-seqs")) r = m3_cli_int(a, V, 1, 1 << 16, &seqs, &err);
        else if (!strcmp(a, "--scheduling-policy")) {
            if (!V || (strcmp(V, "fcfs") && strcmp(V, "priority"))) {
                fprintf(stderr, "%s: --scheduling-policy '%s': expected fcfs or priority\n", cmd, V ? V : "");
                return 2;
            }
            so.scheduling_priority = !strcmp(V, "priority");
        }
        else if (!strcmp(a, "--reasoning-budget")) r = m3_cli_int(a, V, -1, INT32_MAX, &rbudget, &err);
        else if (!strcmp(a, "--max-num-batched-tokens")) r = m3_cli_size(a, V, 1, 1 << 24, &batched, &err);
        else if (!strcmp(a, "--max-logits-rows")) r = m3_cli_int(a, V, 1, 1 << 16, &lrows, &err);
        else if (!strcmp(a, "--warmup-tokens")) r = m3_cli_size(a, V, 0, 1 << 24, &warm, &err);
        else if (!strcmp(a, "--precision")) { if (m3_cli_set_precision(V, name)) return 2; }
        else if (!strcmp(a, "--moe-act-quant")) { if (m3_cli_set_moe_act_quant(V, name)) return 2; }
        else if (!strcmp(a, "--max-model-len")) r = m3_cli_size(a, V, 1, 1 << 30, &mml, &err);
        else if (!strcmp(a, "--sample-threads")) r = m3_cli_int(a, V, 1, 64, &sthreads, &err);
        else if (!strcmp(a, "--grammar-threads")) r = m3_cli_int(a, V, 0, 64, &gthreads, &err);
        else if (!strcmp(a, "--kv-cache-dtype")) kvd = V;
        else if (!strcmp(a, "--index-cache-dtype")) ikd = V;
        else if (!strcmp(a, "--max-waiting")) r = m3_cli_int(a, V, 0, 1 << 30, &waiting, &err);
        else if (!strcmp(a, "--shutdown-timeout")) r = m3_cli_int(a, V, 0, 1 << 20, &grace, &err);
        else if (!strcmp(a, "--max-body")) r = m3_cli_size(a, V, 1, __LONG_MAX__, &body, &err);
        else if (!strcmp(a, "--max-header-bytes")) r = m3_cli_size(a, V, 256, 1 << 30, &hdr, &err);
        else if (!strcmp(a, "--timeout")) r = m3_cli_int(a, V, 0, 1 << 20, &tmo, &err);
        else if (!strcmp(a, "--max-image-memory")) r = m3_cli_size(a, V, 0, __LONG_MAX__, &imgmem, &err);
        else if (!strcmp(a, "--responses-store")) r = m3_cli_size(a, V, 0, __LONG_MAX__, &rstore, &err);
        else if (!strcmp(a, "--max-connections")) r = m3_cli_int(a, V, 0, 1 << 24, &maxconn, &err);
        else if (!strcmp(a, "--speculative-config")) spec_json = V;
        else if (!strcmp(a, "--draft")) draft_dir = V;
        else if (!strcmp(a, "--allowed-media-domains")) media_domains = V;
        else if (!strcmp(a, "--limit-mm-per-prompt")) { /* (each given adds its counts) */
            mm_limit = V;
            if (v && m3_media_limit_parse(&mm_lim, v, &err)) {
                fprintf(stderr, "%s: --limit-mm-per-prompt '%s': %s\n", cmd, v, err.msg);
                return 2;
            }
        }
        else if (!strcmp(a, "--tokenizer")) tok_dir = V;
        else if (!strcmp(a, "--allowed-origins")) origins_arg = V;
        else if (!strcmp(a, "-tp") || !strcmp(a, "--tensor-parallel-size")) r = m3_cli_int(a, V, 1, 64, &tpn, &err);
        else if (!strcmp(a, "--moe-split")) moe_split = V;
        else if (!strcmp(a, "--seed")) r = m3_cli_int(a, V, 0, __LONG_MAX__, &seed, &err);
        else if (!strcmp(a, "--generation-config")) gen_cfg = V;
        else if (!strcmp(a, "--override-generation-config")) gen_over = V;
        else if (!strcmp(a, "--tool-call-parser") || !strcmp(a, "--reasoning-parser")) {
            /* m3 has the MiniMax-M3 parsers, used whenever the chat template writes their markup */
            if (V[0] && strcmp(v, "minimax_m3") && strcmp(v, "minimax") && strcmp(v, "minimax_m2")) {
                fprintf(stderr, "%s: %s '%s': m3 parses MiniMax-M3 output (minimax_m3, minimax, minimax_m2)\n", cmd, a, v);
                return 2;
            }
        } else {
            const int vf = m3_cli_vllm_flag(cmd, a, v, eq != NULL, &vfl);
            if (vf < 0) return 2;
            if (!vf) {
                fprintf(stderr, "%s: unknown option '%s' (m3 serve --help lists them)\n", cmd, a);
                return 2;
            }
            if (vf == 1) takes = 0;
            if (vfl.no_access_log) so.log_requests = vfl.no_access_log = 0; /* (a later --enable-log-requests wins) */
        }
#undef V
        if (missing) { fprintf(stderr, "%s: %s needs a value\n", cmd, missing); return 2; }
        if (r) { fprintf(stderr, "%s: %s\n", cmd, err.msg); return 2; }
        if (takes) i++;
    }
    if (!dir) {
        fprintf(stderr, "%s: a model directory is required (%s DIR, or -m DIR)\n%s", cmd, cmd, hook ? hook->usage : usage);
        return 2;
    }
    if (so.uds && !*so.uds) { fprintf(stderr, "%s: --uds: an empty path\n", cmd); return 2; }
    if (mm_limit && mm_lim.has_max_images && mm_lim.images_asked > mm_lim.max_images)
        fprintf(stderr, "%s: --limit-mm-per-prompt: %d images a request asked, m3 takes at most %d\n", cmd,
                mm_lim.images_asked, mm_lim.max_images);
    if (mm_limit && mm_lim.has_max_images && !mm_lim.max_images) lm_only = 2; /* no images: no vision tower either */
    if (vfl.eager) setenv("M3_CUDA_GRAPHS", "0", 1); /* --enforce-eager: read when the CUDA backend starts */
    m3_kv_dtype kdt = M3_KV_BF16, idt = M3_KV_BF16; /* auto; checked before anything is loaded */
    if (kvd && m3_kv_dtype_parse(kvd, &kdt)) { fprintf(stderr, "%s: --kv-cache-dtype: unknown dtype '%s' (auto, f32, bf16, fp8 = fp8_e4m3, nvfp4)\n", cmd, kvd); return 2; }
    if (ikd && m3_kv_dtype_parse(ikd, &idt)) { fprintf(stderr, "%s: --index-cache-dtype: unknown dtype '%s' (f32, bf16, fp8, nvfp4)\n", cmd, ikd); return 2; }
    so.port = (int)port;
    if (waiting >= 0) so.max_waiting = (int)waiting;
    if (grace >= 0) so.shutdown_timeout = (double)grace;
    if (body) so.max_body = (size_t)body;
    if (hdr) so.max_header_bytes = (size_t)hdr;
    if (tmo >= 0) so.timeout = (double)tmo;
    if (imgmem >= 0) so.max_image_memory = (size_t)imgmem;
    if (rstore >= 0) so.responses_store = (size_t)rstore;
    if (maxconn >= 0) so.max_connections = (int)maxconn;
    char **origins = NULL; /* checked now, kept from just before the server starts */
    if (origins_arg) {
        if (m3_cli_list(origins_arg, &origins, &err)) { fprintf(stderr, "%s: --allowed-origins: %s\n", cmd, err.msg); return 2; }
        free(origins);
        origins = NULL;
    }
    if (seed >= 0) { so.seed = (uint64_t)seed; so.has_seed = 1; }
    so.fault_spec = getenv("M3_FAULT_ALLOC");
    if (so.fault_spec && !*so.fault_spec) so.fault_spec = NULL;
    if (so.fault_spec) { /* checked now, armed once the server listens */
        int bad = m3_fault_arm_spec(so.fault_spec, &err);
        m3_fault_disarm(M3_FAULT_ENGINE);
        m3_fault_disarm(M3_FAULT_SERVER);
        if (bad) { fprintf(stderr, "%s: M3_FAULT_ALLOC: %s\n", cmd, err.msg); return 2; }
    }
    if (!names[0]) names[0] = dir;
    so.model_name = names[0];
    so.model_names = names;
    m3_oai_defaults gdef;
    memset(&gdef, 0, sizeof gdef);
    if (strcmp(gen_cfg, "vllm") || gen_over) { /* auto: the model's directory; else a directory holding the file */
        const char *gdir = !strcmp(gen_cfg, "vllm") ? NULL : strcmp(gen_cfg, "auto") ? gen_cfg : dir;
        char gpath[4096];
        snprintf(gpath, sizeof gpath, "%s/generation_config.json", gdir ? gdir : "");
        const int gfile = gdir && !access(gpath, F_OK); /* (named in the line below only when there) */
        if (gdir && m3_oai_defaults_load(&gdef, gdir, &err)) { fprintf(stderr, "%s: --generation-config: %s\n", cmd, err.msg); return 1; }
        if (gen_over && m3_oai_defaults_override(&gdef, gen_over, &err)) {
            fprintf(stderr, "%s: --override-generation-config '%s': %s\n", cmd, gen_over, err.msg);
            return 2;
        }
        so.gen_defaults = &gdef;
        if (gdef.has_temperature || gdef.has_top_p || gdef.has_top_k || gdef.has_min_p || gdef.has_repetition_penalty ||
            gdef.has_max_new_tokens) {
            char line[256] = "";
            size_t o = 0;
            if (gdef.has_temperature) o += (size_t)snprintf(line + o, sizeof line - o, " temperature %g", gdef.temperature);
            if (gdef.has_top_p) o += (size_t)snprintf(line + o, sizeof line - o, " top_p %g", gdef.top_p);
            if (gdef.has_top_k) o += (size_t)snprintf(line + o, sizeof line - o, " top_k %lld", gdef.top_k);
            if (gdef.has_min_p) o += (size_t)snprintf(line + o, sizeof line - o, " min_p %g", gdef.min_p);
            if (gdef.has_repetition_penalty)
                o += (size_t)snprintf(line + o, sizeof line - o, " repetition_penalty %g", gdef.repetition_penalty);
            if (gdef.has_max_new_tokens) snprintf(line + o, sizeof line - o, " max_tokens %lld", gdef.max_new_tokens);
            fprintf(stderr, "%s: sampling defaults from %s%s%s (requests that leave them out):%s\n", cmd, gfile ? gpath : "",
                    gfile && gen_over ? " and " : "", gen_over ? "--override-generation-config" : "", line);
        }
    }
    /* vLLM's --tokenizer DIR: tokenizer.json and tokenizer_config.json (special tokens, the chat
     * template) from there; a template neither there nor given: the checkpoint's */
    const char *tdir = tok_dir ? tok_dir : dir;
    m3_tok *tok = m3_tok_load(tdir, &err);
    if (!tok) { fprintf(stderr, "%s: tokenizer%s: %s\n", cmd, tok_dir ? " (--tokenizer)" : "", err.msg); return 1; }
    m3_chat *chat = m3_chat_load_with(tdir, chat_tmpl, &err);
    if (!chat && tok_dir && !chat_tmpl && strstr(err.msg, "no chat template")) { /* the checkpoint's, with tdir's tokens */
        chat = m3_chat_load_with(dir, NULL, &err);
        if (chat && m3_chat_tokens_from(chat, tdir, &err)) {
            m3_chat_free(chat);
            chat = NULL;
        }
    }
    if (!chat && chat_tmpl) { /* asked for: a template that does not load is an error, not a server without chat */
        fprintf(stderr, "%s: --chat-template: %s\n", cmd, err.msg);
        m3_tok_free(tok);
        return 2;
    }
    if (rbudget >= 0 && (m3_tok_token_to_id(tok, "<mm:think>") < 0 || m3_tok_token_to_id(tok, "</mm:think>") < 0)) {
        fprintf(stderr, "%s: --reasoning-budget: the tokenizer has no <mm:think> / </mm:think> tokens to close "
                "the reasoning with\n", cmd);
        m3_tok_free(tok);
        m3_chat_free(chat);
        return 2;
    }
    so.reasoning_budget = (int)rbudget;
    if (!chat) fprintf(stderr, "%s: no chat template (%s); /v1/chat/completions disabled\n", cmd, err.msg);
    else fprintf(stderr, "%s: chat template from %s\n", cmd, m3_chat_origin(chat));
    m3_moe_split msplit = M3_MOE_EXPERTS;
    if (moe_split && m3_moe_split_parse(moe_split, &msplit)) {
        fprintf(stderr, "%s: --moe-split: unknown split '%s' (experts or width)\n", cmd, moe_split);
        m3_tok_free(tok);
        m3_chat_free(chat);
        return 2;
    }
    m3_ops ops = {0};
    m3_model m;
    m3_cli_tp tp = {0};
    if (tpn > 1 ? m3_cli_tp_load(&tp, &m, NULL, dir, (int)threads, (int)tpn, msplit, name, NULL, 0)
                : m3_cli_load(&m, &ops, dir, (int)threads, name, NULL, 0)) {
        m3_tok_free(tok);
        m3_chat_free(chat);
        return 1;
    }
    m3_engine_opts eo;
    m3_engine_opts_default(&eo);
    eo.enable_prefix_caching = prefix;
    if (kvmem) eo.kv_bytes = (size_t)kvmem;
    else eo.gpu_memory_utilization = util; /* the pool from the memory there is (src/engine/kv_budget.h) */
    if (seqs) eo.max_num_seqs = (int)seqs;
    eo.scheduling_priority = so.scheduling_priority;
    if (batched) eo.max_num_batched_tokens = (int)batched;
    else if (tp.g ? tp.cuda : ops.name && !strcmp(ops.name, "cuda"))
        eo.max_num_batched_tokens = 4096; /* H200, 8 layers at M3.1-Flash shapes: prefill 13,000 tok/s in chunks of 512, 25,500 in 4096 */
    if (mml) eo.max_model_len = (int)mml;
    eo.max_logits_rows = (int)lrows;
    eo.sample_threads = (int)sthreads;
    eo.grammar_threads = gthreads < 0 ? 0 : gthreads ? (int)gthreads : -1; /* absent: the engine's default */
    eo.group = tp.g;
    int rc = 1;
    m3_engine *e = NULL;
    m3_vision vis = {0};
    m3_ops vops = {0}, dops = {0};
    int own_vops = 0, own_dops = 0;
    m3_media_ctx media = {0};
    media.start_id = media.end_id = -1;
    media.allowed_domains = media_domains;
    media.max_images = mm_lim.max_images;
    media.has_max_images = mm_lim.has_max_images;
    media.no_vision = "this model has no vision tower (a text-only checkpoint): image inputs are not supported";
    if (lm_only == 2) media.no_vision = "image inputs are off (--limit-mm-per-prompt with an image count of 0)";
    else if (lm_only) media.no_vision = "the server runs the language model only (--language-model-only): image inputs are not supported";
    else if (vision_setup(cmd, &vis, &m, tp.g ? NULL : &ops, dir, (int)threads, &vops, &own_vops, &media, &eo)) goto done;
    if (media.vc) {
        media.start_id = m3_tok_token_to_id(tok, "]<]start of image[>[");
        media.end_id = m3_tok_token_to_id(tok, "]<]end of image[>[");
    }
    so.media = &media;
    eo.kv_dtype = kdt;
    eo.index_dtype = ikd ? idt : eo.kv_dtype;
    if ((spec_json || draft_dir) && m3_spec_config_parse(&eo.spec, spec_json ? spec_json : "{}", dir, draft_dir, &err)) {
        fprintf(stderr, "%s: %s\n", cmd, err.msg);
        goto done;
    }
    /* the draft beside tensor-parallel ranks (or a GPU, when asked): a CPU op table of its own;
     * else on the target's op table (its device) */
    if ((tp.g || (eo.spec.draft_on_cpu && ops.name && strcmp(ops.name, "cpu") != 0)) && eo.spec.method != M3_SPEC_NONE) {
        if (m3_cpu_ops_init(&dops, (int)threads, &err)) { fprintf(stderr, "%s: draft ops: %s\n", cmd, err.msg); goto done; }
        own_dops = 1;
        eo.draft_ops = &dops;
    }
    e = m3_engine_create(&m, &eo, &err);
    if (!e) { fprintf(stderr, "%s: %s\n", cmd, err.msg); goto done; }
    so.eos_id = m.cfg.eos_id;
    if (eo.spec.method != M3_SPEC_NONE) { /* what the speculation will do, as the operator asked for it */
        char off[48] = "", len[48] = "", thr[48] = "";
        if (eo.spec.disable_by_batch_size) snprintf(off, sizeof off, ", off above %d running", eo.spec.disable_by_batch_size);
        if (eo.spec.max_model_len) snprintf(len, sizeof len, ", none past %d tokens", eo.spec.max_model_len);
        if (eo.spec.confidence_threshold > 0) snprintf(thr, sizeof thr, ", confidence >= %g", eo.spec.confidence_threshold);
        fprintf(stderr, "%s: speculative decoding: DSpark draft %s on %s, %d drafts a step (%s)%s%s%s\n", cmd, eo.spec.draft_dir,
                eo.draft_ops ? "the CPU" : ops.name, eo.spec.num_speculative_tokens,
                eo.spec.draft_sample_method == M3_SPEC_DRAFT_GREEDY ? "greedy" : "probabilistic", thr, len, off);
    }
    { /* bytes per token of the engine's caches, measured on a one-page pool (as m3 kv-info does) */
        m3_kv probe;
        m3_config pc = m.cfg; /* shallow: read by m3_kv_create only */
        if (tp.g) pc.n_kv_heads = m3_group_model(tp.g, 0)->shard.n_kv_heads;
        if (!m3_kv_create(&probe, &pc, eo.kv_dtype, eo.index_dtype, m3_kv_page_tokens(&m.cfg), 1, &err)) {
            so.kv_bytes_per_token = m3_kv_bytes_per_token(&probe);
            m3_kv_destroy(&probe);
            int cap = m3_engine_capacity_tokens(e);
            fprintf(stderr, "%s: KV cache %s, index-K %s: %zu bytes per token%s; pool of %d tokens, %.2f GiB%s (%s); "
                    "context %d tokens\n", cmd, m3_kv_dtype_name(eo.kv_dtype), m3_kv_dtype_name(eo.index_dtype),
                    so.kv_bytes_per_token, tp.g ? " per rank" : "", cap, (double)so.kv_bytes_per_token * cap / 1073741824.0,
                    tp.g ? " per rank" : "", kvmem ? "--kv-cache-memory" : m3_engine_pool_how(e), m3_engine_max_model_len(e));
        }
    }
    { /* the warm-up step (m3_engine_warmup): on a device by default, where first use costs most */
        const int dev = tp.g ? tp.cuda : ops.name && strcmp(ops.name, "cpu") != 0;
        const long wt = warm >= 0 ? warm : dev ? eo.max_num_batched_tokens : 0;
        if (wt > 0) {
            const double t0 = m3_now();
            const int n = m3_engine_warmup(e, (int)wt, &err);
            if (n < 0) { fprintf(stderr, "%s: %s\n", cmd, err.msg); goto done; }
            fprintf(stderr, "%s: warm-up: %d prompt tokens and decodes, then requests together, in %.2f s\n", cmd, n,
                    m3_now() - t0);
        }
    }
    if (origins_arg && m3_cli_list(origins_arg, &origins, &err)) { fprintf(stderr, "%s: --allowed-origins: %s\n", cmd, err.msg); goto done; }
    so.allowed_origins = (const char *const *)origins;
    if (hook && hook->before(hook->arg, &so, eo.max_num_seqs)) goto done;
    const int ran = m3_server_run(e, tok, chat, m.cfg.vocab, &so, &err);
    if (ran) fprintf(stderr, "%s: %s\n", cmd, err.msg);
    rc = hook ? hook->after(hook->arg, ran == 0) : ran ? 1 : 0;
done:
    m3_engine_destroy(e);
    if (own_vops) m3_cpu_ops_free(&vops);
    if (own_dops) m3_cpu_ops_free(&dops);
    m3_vision_free(&vis);
    if (tp.g) m3_cli_tp_free(&tp); /* the ranks before the full model they view */
    m3_model_free(&m);
    if (!tpn || tpn == 1) m3_cli_ops_free(&ops);
    m3_chat_free(chat);
    m3_tok_free(tok);
    free(origins);
    return rc;
}
