/* m3 kv-info: KV + index-K cache memory per token and capacity per GiB for a config, for
 * every cache dtype, measured from the allocator's page sizes. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int m3_cmd_kv_info(int argc, char **argv) {
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "--config") || !strcmp(argv[i], "-m")) && i + 1 < argc) path = argv[++i];
        else { fprintf(stderr, "m3 kv-info: unknown option '%s'\n", argv[i]); return 2; }
    }
    if (!path) { fprintf(stderr, "m3 kv-info: usage: m3 kv-info --config config.json|DIR\n"); return 2; }
    m3_config c;
    m3_err err;
    if (m3_config_load(&c, path, &err)) { fprintf(stderr, "m3 kv-info: %s\n", err.msg); return 1; }
    int page = m3_kv_page_tokens(&c);
    printf("%s: %d layers (%d sparse), %d KV heads x %d, index-K %d, page %d tokens\n", path, c.n_layers,
           c.n_sparse_layers, c.n_kv_heads, c.head_dim, c.index_dim, page);
    printf("%-8s %-8s %14s %16s\n", "kv", "index", "bytes/token", "tokens/GiB");
    int rc = 0;
    for (int d = 0; d < M3_KV_DTYPE_COUNT; d++) {
        m3_kv kv;
        if (m3_kv_create(&kv, &c, (m3_kv_dtype)d, (m3_kv_dtype)d, page, 1, &err)) {
            printf("%-8s %-8s %s\n", m3_kv_dtype_name((m3_kv_dtype)d), m3_kv_dtype_name((m3_kv_dtype)d), err.msg);
            continue;
        }
        size_t bpt = m3_kv_bytes_per_token(&kv);
        printf("%-8s %-8s %14zu %16.0f\n", m3_kv_dtype_name((m3_kv_dtype)d), m3_kv_dtype_name((m3_kv_dtype)d), bpt,
               (double)(1ull << 30) / (double)bpt);
        m3_kv_destroy(&kv);
    }
    m3_config_free(&c);
    return rc;
}
