/* The kernel set this CPU runs: see simd.h. */
#include <cpuid.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

/* 0 scalar, 1 avx2, 2 avx512; atomic: the ranks of a TP group (src/parallel) may ask first at once */
static atomic_int simd_level = -1;

/* the widest kernel set this CPU runs; $M3_SIMD=scalar|avx2 caps it (for tests and comparisons) */
int m3_simd_level(void) {
    int lvl = atomic_load_explicit(&simd_level, memory_order_relaxed);
    if (lvl < 0) { /* every thread computes the same value */
        const char *e = getenv("M3_SIMD");
        __builtin_cpu_init();
        int hw = 0;
        unsigned a, b, c, d;
        int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C); /* not every compiler names f16c below */
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) hw = 1;
        if (hw && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) hw = 2;
        int cap = !e ? 2 : !strcmp(e, "scalar") ? 0 : !strcmp(e, "avx2") ? 1 : 2;
        lvl = hw < cap ? hw : cap;
        atomic_store_explicit(&simd_level, lvl, memory_order_relaxed);
    }
    return lvl;
}

