/* The prefill attention's chunk walk (backend/cuda/attn_keys.cuh), checked on the host (built with
 * nvcc; no GPU needed): tile_walk, which attention_wg.cu's producers and consumers step by counters,
 * gives every chunk i of random tiles' tables (dense: 1-8 runs of any length; sparse: up to 8 runs'
 * distinct blocks, blocks of 32 / 64 / 128 / 200 keys, so 1-4 chunks a block, and the runs' last
 * positions inside their last blocks) exactly as tile_chunk's chunk i: its run, keys [a, e) and
 * (sparse) the tokens whose selection holds its block. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attn_keys.cuh"

static int fails;
#define CHECK(c, ...) do { if (!(c)) { if (fails++ < 10) { printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } } while (0)

static unsigned rng = 12345u;
static int rnd(int n) { rng = rng * 1103515245u + 12345u; return (int)((rng >> 8) % (unsigned)n); }

int main(void) {
    const int TT = 8, topk = 16, CH = 64;
    const int Bs[4] = {32, 64, 128, 200};
    static int mem[4096];
    long chunks = 0;
    for (int iter = 0; iter < 4000; iter++) {
        const bool sparse = iter % 2;
        const int B = Bs[rnd(4)], cpb = (B + CH - 1) / CH;
        memset(mem, 0, sizeof mem);
        const tile_keys k = tile_keys_at(mem, TT, topk, true);
        const int nr = 1 + rnd(TT);
        int tot = 0;
        for (int r = 0; r < nr; r++) {
            k.rseq[r] = r;
            k.rmax[r] = rnd(5000);
            k.rch[r] = k.rmax[r] / CH + 1;
            tot += k.rch[r];
        }
        if (!sparse) {
            k.nch[0] = tot;
        } else {
            /* distinct keys (run << 24 | block), ascending: each run's blocks up to its last position's */
            int nu = 0;
            for (int r = 0; r < nr && nu < TT * topk; r++)
                for (int b = 0; b <= k.rmax[r] / B && nu < TT * topk; b++)
                    if (rnd(3) == 0 || b == k.rmax[r] / B) {
                        k.ukey[nu] = r << 24 | b;
                        k.umask[nu] = 1 + rnd(255);
                        nu++;
                    }
            k.nch[1] = nu;
            k.nch[0] = nu * cpb;
        }
        tile_walk w = {0, 0};
        for (int i = 0; i < k.nch[0]; i++, tile_walk_next(k, sparse, cpb, w)) {
            int r0, a0, e0, key, r1, a1, e1, um;
            tile_chunk(k, sparse, i, B, CH, cpb, &r0, &a0, &e0, &key);
            tile_walk_at(k, sparse, w, B, CH, &r1, &a1, &e1, &um);
            const int um0 = sparse ? k.umask[i / cpb] : -1;
            CHECK(r0 == r1 && a0 == a1 && e0 == e1 && um0 == um, "%s tile (B %d), chunk %d of %d: tile_chunk run %d [%d, %d) tokens %x, the walk run %d [%d, %d) tokens %x",
                  sparse ? "sparse" : "dense", B, i, k.nch[0], r0, a0, e0, um0, r1, a1, e1, um);
            chunks++;
        }
    }
    printf("%ld chunks of 4000 tiles: %s\n", chunks, fails ? "FAILED" : "the walk is tile_chunk's");
    return fails != 0;
}
