#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "m3: MiniMax-M3 inference engine\n"
            "usage: m3 <command> [options]\n"
            "  serve      -m DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--kv-cache-memory BYTES] ...\n"
            "  run-batch  -i IN.jsonl -o OUT.jsonl -m DIR [serve's flags]   (OpenAI batch requests, answered in order)\n"
            "  logits     -m DIR --ids 1,2,3 [--decode N] [--kv-cache-dtype f32|bf16] [--dump-index] -o OUT.safetensors\n"
            "             [--image FILE ... | --pixel-values FILE] [--image-start-id N --image-end-id N] [--dump-vision]\n"
            "  generate   -m DIR --ids 1,2,3 -n N [--temperature T --top-p P --top-k K --seed S] [--speculative-config JSON]\n"
            "  make-tiny  --out DIR [--config FILE] [--seed S] [--quant none|mxfp8-nvfp4|mxfp8-nvfp4-modelopt]\n"
            "  bench      -m DIR [--prompt N] [--decode N] [--threads N]\n"
            "  tokenize   -t TOKENIZER [--special]   (text on stdin, ids on stdout)\n"
            "  detokenize -t TOKENIZER [--skip-special] (ids on stdin, text on stdout)\n"
            "  kv-info    --config config.json|DIR   (KV cache bytes per token and tokens per GiB per dtype)\n"
            "  chat-template -m DIR|--template FILE --messages FILE.json [--tools FILE.json] [--add-generation-prompt] [--kwargs JSON]\n"
            "common: --threads N (default: all cores; $M3_THREADS)\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "logits")) return m3_cmd_logits(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return m3_cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "make-tiny")) return m3_cmd_make_tiny(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return m3_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return m3_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "detokenize")) return m3_cmd_detokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat-template")) return m3_cmd_chat_template(argc - 1, argv + 1);
    if (!strcmp(cmd, "kv-info")) return m3_cmd_kv_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return m3_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "run-batch")) return m3_cmd_run_batch(argc - 1, argv + 1);
    fprintf(stderr, "m3: unknown command '%s' (try m3 --help)\n", cmd);
    return 2;
}
