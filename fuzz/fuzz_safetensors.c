/* libFuzzer: safetensors header validation on arbitrary files must never crash, read out of
 * bounds or leak; every tensor it accepts lies inside the file. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/m3-fuzz-st-%d.safetensors", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    m3_err err;
    m3_st *st = m3_st_open(path, &err);
    if (st) {
        volatile unsigned char sink = 0;
        for (size_t i = 0; i < m3_st_count(st); i++) {
            const m3_tensor *t = m3_st_at(st, i);
            if (t->nbytes) sink ^= ((const unsigned char *)t->data)[0] ^ ((const unsigned char *)t->data)[t->nbytes - 1];
            if (m3_st_find(st, t->name) != t) abort();
        }
        (void)sink;
        m3_st_close(st);
    }
    unlink(path);
    return 0;
}
