/* m3 subcommands. Each returns the process exit code and prints errors as one line on
 * stderr ("m3 <cmd>: <message>"). */
#ifndef M3_CLI_H
#define M3_CLI_H

#include <stdint.h>

#include "../backend/ops.h"
#include "../model/dspark.h"
#include "../model/m3.h"
#include "../model/vision.h"

int m3_cmd_logits(int argc, char **argv);
int m3_cmd_generate(int argc, char **argv);
int m3_cmd_make_tiny(int argc, char **argv);
int m3_cmd_bench(int argc, char **argv);
int m3_cmd_bench_random(int argc, char **argv);   /* src/cli/bench_gpu.c: m3 bench --random-weights */
/* src/cli/bench_dspark.c: the DSpark draft beside m3 bench --random-weights' model (m->cfg has
 * the benchmarked layers, full_layers the config's): random draft weights on m's device, then
 * per batch the draft, verify and whole speculative step with the projected speedups; verify_s:
 * the verify pass of k + 1 distinct tokens a sequence m3 bench timed (the step's verify); the floors:
 * the decode step's and that verify's bytes over bw (bytes/s), beside which the draft's own is printed */
int m3_bench_dspark_load(const char *path, m3_model *m, int full_layers, uint64_t seed, m3_dspark *d, m3_err *err);
int m3_bench_dspark(m3_model *m, m3_kv *kv, m3_dspark *d, long nb, long ctx, int k, long steps, double decode_s,
                    double verify_s, double decode_floor_s, double verify_floor_s, double bw, int profile, m3_err *err);
int m3_cmd_tokenize(int argc, char **argv);      /* src/cli/tokenize.c */
int m3_cmd_detokenize(int argc, char **argv);    /* src/cli/tokenize.c */
int m3_cmd_chat_template(int argc, char **argv); /* src/cli/chat_template.c */
int m3_cmd_kv_info(int argc, char **argv);       /* src/cli/kv_info.c */
int m3_cmd_serve(int argc, char **argv);         /* src/cli/serve.c */
int m3_cmd_run_batch(int argc, char **argv);     /* src/cli/run_batch.c */
/* m3 serve's flags, model loading and server, for a command that runs the server privately
 * (m3 run-batch): its name in messages and help, and calls around the server's run */
struct m3_server_opts;
typedef struct m3_serve_hook {
    const char *name, *cmd;  /* "run-batch", "m3 run-batch" */
    const char *usage;       /* printed by --help and with a missing model */
    const char *no_listen;   /* the refusal of --host / --port / --uds */
    /* after the engine is made, before the server starts: sets so (its ready callback, where to
     * listen); nonzero: the command stops (it said why) */
    int (*before)(void *arg, struct m3_server_opts *so, int max_num_seqs);
    int (*after)(void *arg, int served); /* the server stopped (served 0: it failed, said): the exit code */
    void *arg;
} m3_serve_hook;
int m3_serve_main(int argc, char **argv, const m3_serve_hook *hook); /* hook NULL: m3 serve */
/* vLLM's serve flags without an m3 option of their own (src/cli/vllm_flags.c): taken when m3 does
 * what they ask anyway, taken and not used (one line on stderr) when they tune what m3 does its
 * own way, refused with the reason otherwise. a: the flag; v: the value given or the next argument
 * (NULL: none); has_eq: given as --flag=value.
 * Returns 0 (not one of them), 1 (a switch taken), 2 (a value taken), -1 (refused: said). */
typedef struct m3_vllm_flags {
    int eager;             /* --enforce-eager: no CUDA graphs */
    int no_access_log;     /* --disable-uvicorn-access-log: no line per request */
} m3_vllm_flags;
int m3_cli_vllm_flag(const char *cmd, const char *a, const char *v, int has_eq, m3_vllm_flags *f);

/* shared helpers */
/* "1,2,3" -> ids (malloc'd); -1 with message on bad input */
int m3_cli_parse_ids(const char *s, int32_t **ids, int *n, m3_err *err);
/* integer option value with range check */
int m3_cli_int(const char *opt, const char *val, long lo, long hi, long *out, m3_err *err);
/* The same with vLLM's size suffixes: 4G, 512M, 32k, 25.6k, 2GiB, 1GB. */
int m3_cli_size(const char *opt, const char *val, long lo, long hi, long *out, m3_err *err);
/* A list option: a JSON list of strings ('["a", "b"]', vLLM's form) or "a,b" (spaces around items
 * dropped) -> a NULL-terminated array of the items, one allocation (free() it). -1 with a message
 * on bad input (not a list of strings, an empty item). */
int m3_cli_list(const char *val, char ***out, m3_err *err);
/* Loads the model on the default backend (see m3_cli_load_on); prints progress on a
 * terminal, one summary line otherwise. ids (may be NULL) are checked against the
 * vocabulary before any weight is read. Free ops with m3_cli_ops_free. */
int m3_cli_load(m3_model *m, m3_ops *ops, const char *dir, int threads, const char *cmd, const int32_t *ids, int n_ids);
/* backend: "cpu", "cuda", or "auto" / NULL: $M3_BACKEND when set, else cuda when a GPU is
 * present and this build has the CUDA backend, else cpu. */
int m3_cli_load_on(m3_model *m, m3_ops *ops, const char *backend, const char *dir, int threads, const char *cmd,
                   const int32_t *ids, int n_ids);
/* Creates the ops of a backend (as above) without a model, in the precision m3_cli_precision
 * gives for it. */
int m3_cli_ops_init(m3_ops *ops, const char *backend, int threads, const char *cmd);
/* Precision of GEMM inputs (issue 25): "bf16" (every GEMM input rounded to bf16; on the GPU the
 * tensor-core path) or "exact" (f32). The default is bf16 on the GPU and exact on the CPU;
 * $M3_PRECISION sets it for both, and a command's --precision (m3_cli_set_precision, before its
 * ops are made) overrides both. m3_cli_set_precision: -1 with a message naming the value when it
 * is neither. m3_cli_precision: 1 for bf16 on a backend named backend_name ("cpu" / "cuda"). */
int m3_cli_set_precision(const char *value, const char *cmd);
int m3_cli_precision(const char *backend_name);
/* applies m3_cli_precision to ops (both backends) */
void m3_cli_apply_precision(m3_ops *ops);
void m3_cli_ops_free(m3_ops *ops);
/* The routed experts' FC1 input quantization (spec section 1; m3_config_set_fc1_quant): a command's
 * --moe-act-quant none|nvfp4 (m3_cli_set_moe_act_quant: -1 with a message naming a bad value), else
 * $M3_MOE_ACT_QUANT, else none. m3_cli_load_on and m3_cli_tp_load apply it to the loaded config
 * (m3_cli_apply_moe_act_quant: -1 with a message when the model cannot take it). */
int m3_cli_set_moe_act_quant(const char *value, const char *cmd);
int m3_cli_apply_moe_act_quant(m3_config *c, const char *cmd);
/* the same against dir's config.json before the weights load (0 when nothing is asked or the
 * config cannot be read: the load then says why) */
int m3_cli_precheck_moe_act_quant(const char *dir, const char *cmd);

/* Image inputs of a command (src/cli/images.c): the vision tower, the pixel values, what the
 * tower made of them and where they go in the expanded prompt. */
typedef struct m3_cli_images {
    m3_vision vis;
    m3_pixels px;
    float *embeds;      /* [n_tokens, hidden] image_embeds */
    float *tower_out;   /* [px.n_patches, vision hidden] vision_tower_out */
    int n_tokens;
    int32_t *rows;      /* [n_rows] positions of the image tokens in the expanded prompt, ascending */
    int n_rows;
} m3_cli_images;
/* Loads the tower of dir (on the loaded model's checkpoint), decodes + preprocesses files
 * (or reads pixel_file: pixel_values + image_grid_thw), runs the tower (on ops when they are
 * host memory, else on a CPU op table of `threads`), then expands the image placeholders of
 * *ids (replaced, *T updated; see m3_vision_expand_prompt; start/end ids < 0: from the
 * checkpoint's tokenizer when it has one, else none). Prints errors; -1 on failure. */
int m3_cli_images_prepare(m3_cli_images *im, m3_model *m, m3_ops *ops, const char *dir, const char *const *files,
                          int n_files, const char *pixel_file, int language_only, int32_t start_id, int32_t end_id,
                          int threads, int32_t **ids, int *T, const char *cmd);
void m3_cli_images_free(m3_cli_images *im);

#endif
