/* m3 make-tiny: writes a MiniMax-M3 checkpoint with random weights (model/random_ckpt.h: the
 * values, the config, the layout and the memory rules), optionally with chat tokenizer files
 * and a random DSpark draft. This file only parses the arguments and prints the summary.
 *
 *   m3 make-tiny --out DIR [--config FILE] [--seed S] [--quant none|mxfp8-nvfp4|mxfp8-nvfp4-modelopt]
 *                [--layout hub|bare] [--shard-mb N] [--tokenizer tokenizer.json] [--with-dspark]
 *                [--dspark-config FILE]
 *
 * Returns 0 on success, 2 on a usage error, 1 on any other failure; every failure is one
 * line "m3 make-tiny: <message>" on stderr. argv[0] is the command name and is skipped. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"
#include "../base/err.h"
#include "../model/random_ckpt.h"
#include "cli.h"

static const char USAGE[] =
    "usage: m3 make-tiny --out DIR [--config FILE] [--seed S] [--quant none|mxfp8-nvfp4|mxfp8-nvfp4-modelopt]\n"
    "                    [--layout hub|bare] [--shard-mb N] [--tokenizer FILE] [--with-dspark] [--dspark-config FILE]\n"
    "  --out DIR       checkpoint directory to write (created if missing)\n"
    "  --config FILE   config.json to copy (hub or transformers spelling); default: a built-in tiny\n"
    "                  model (hidden 128, 4 layers: full+dense, 2x sparse+MoE, full+MoE; vocab 1024)\n"
    "  --seed S        random seed (unsigned integer, default 1234)\n"
    "  --quant Q       none (BF16; default), mxfp8-nvfp4 (MXFP8 linears, NVFP4 routed experts in the\n"
    "                  compressed-tensors spelling), mxfp8-nvfp4-modelopt (experts in the ModelOpt spelling)\n"
    "  --layout L      hub (names under 'language_model.'; default) or bare (no prefix)\n"
    "  --shard-mb N    split into files of about N MB (10^6 bytes) with model.safetensors.index.json;\n"
    "                  0 (default): one model.safetensors\n"
    "  --tokenizer FILE copy this tokenizer.json into the checkpoint with the MiniMax-M3 chat tokens added\n"
    "                  after its vocabulary (]~!b[ ]~b] [e~[ <mm:think> </mm:think> ]<]minimax[>[), write a\n"
    "                  tokenizer_config.json, and set vocab_size / bos / eos_token_id in config.json to match\n"
    "  --with-dspark   also write a random DSpark draft in DIR/dspark (config.json + model.safetensors in the\n"
    "                  real layout: BF16 fc / norms / Markov and confidence heads, MXFP8 decoder linears)\n"
    "  --dspark-config FILE  the same with this draft config.json (copied byte for byte; e.g. the real\n"
    "                  shapes in shared/configs/m3.1-flash-dspark-shapes.json); implies --with-dspark\n";


static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "m3 make-tiny: %s (m3 make-tiny --help for usage)\n", msg);
    return 2;
}

static int parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-' || *s == '+' || isspace((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static const char *quant_name(m3_rand_quant q) {
    return q == M3_RQ_NONE ? "none" : q == M3_RQ_CT ? "mxfp8-nvfp4" : "mxfp8-nvfp4-modelopt";
}

int m3_cmd_make_tiny(int argc, char **argv) {
    const char *out = NULL, *config = NULL, *tokenizer = NULL;
    uint64_t seed = 1234, shard_mb = 0;
    m3_rand_quant qm = M3_RQ_NONE;
    int bare = 0, with_dspark = 0;
    const char *dspark_config = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!a) continue;
        if (strcmp(a, "--with-dspark") == 0) { with_dspark = 1; continue; }
        if (strcmp(a, "--dspark-config") == 0) {
            if (i + 1 >= argc || !argv[i + 1] || !*argv[i + 1]) return usage_error("%s", "--dspark-config needs a file name");
            dspark_config = argv[++i];
            with_dspark = 1;
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        }
        static const char *const flags[] = {"--out", "--config", "--seed", "--quant", "--layout", "--shard-mb", "--tokenizer"};
        const char *val = NULL;
        int which = -1;
        for (int f = 0; f < (int)(sizeof flags / sizeof *flags); f++) {
            size_t fl = strlen(flags[f]);
            if (strcmp(a, flags[f]) == 0) {
                if (i + 1 >= argc || !argv[i + 1]) return usage_error("%s needs a value", flags[f]);
                val = argv[++i];
                which = f;
                break;
            }
            if (strncmp(a, flags[f], fl) == 0 && a[fl] == '=') {
                val = a + fl + 1;
                which = f;
                break;
            }
        }
        switch (which) {
        case 0: out = val; break;
        case 1: config = val; break;
        case 2:
            if (parse_u64(val, &seed)) return usage_error("--seed: '%s' is not an unsigned integer", val);
            break;
        case 3:
            if (strcmp(val, "none") == 0) qm = M3_RQ_NONE;
            else if (strcmp(val, "mxfp8-nvfp4") == 0) qm = M3_RQ_CT;
            else if (strcmp(val, "mxfp8-nvfp4-modelopt") == 0) qm = M3_RQ_MODELOPT;
            else return usage_error("--quant: '%s' is not one of none, mxfp8-nvfp4, mxfp8-nvfp4-modelopt", val);
            break;
        case 4:
            if (strcmp(val, "hub") == 0) bare = 0;
            else if (strcmp(val, "bare") == 0) bare = 1;
            else return usage_error("--layout: '%s' is not hub or bare", val);
            break;
        case 5:
            if (parse_u64(val, &shard_mb) || shard_mb > (1ull << 40))
                return usage_error("--shard-mb: '%s' is not a non-negative integer", val);
            break;
        case 6: tokenizer = val; break;
        default: return usage_error("unknown argument '%s'", a);
        }
    }
    if (!out || !*out) return usage_error("%s", "--out DIR is required");
    if (config && !*config) return usage_error("%s", "--config needs a file name");
    if (strlen(out) > 3800) return usage_error("%s", "--out: path too long");

    const double t0 = m3_now();
    m3_err err = {0};
    m3_rand_opts o = {.out = out, .config = config, .seed = seed, .quant = qm, .bare = bare, .shard_mb = shard_mb,
                      .tokenizer = tokenizer, .with_dspark = with_dspark, .dspark_config = dspark_config};
    m3_rand_report r;
    if (m3_rand_ckpt_write(&o, &r, &err)) {
        fprintf(stderr, "m3 make-tiny: %s\n", err.msg[0] ? err.msg : "failed");
        return 1;
    }
    if (r.dspark)
        fprintf(stderr,
                "m3 make-tiny: wrote a DSpark draft (%zu weights, %.1f MB; %d layers fed from target layers%s%s) to "
                "%s/dspark\n",
                r.dspark_weights, (double)r.dspark_bytes / 1e6, r.dspark_layers, r.dspark_targets[0] ? " " : "",
                r.dspark_targets, out);
    fprintf(stderr,
            "m3 make-tiny: wrote %zu tensors (%zu weights), %llu bytes (%.1f MB) in %d file%s to %s in %.2f s "
            "(quant %s, layout %s, seed %llu, %d threads)\n",
            r.n_entries, r.n_weights, (unsigned long long)r.bytes, (double)r.bytes / 1e6, r.n_files ? r.n_files : 1,
            r.n_files > 1 ? "s" : "", out, m3_now() - t0, quant_name(qm), bare ? "bare" : "hub",
            (unsigned long long)seed, r.threads);
    return 0;
}
