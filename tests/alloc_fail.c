/* See alloc_fail.h. */
#include "alloc_fail.h"

#include <stdatomic.h>
#include <stddef.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);

static atomic_int armed, failed;
static atomic_long seen, fail_at;

void m3_test_alloc_arm(long first) {
    atomic_store(&seen, 0);
    atomic_store(&failed, 0);
    atomic_store(&fail_at, first);
    atomic_store(&armed, 1);
}

long m3_test_alloc_disarm(void) {
    atomic_store(&armed, 0);
    return atomic_load(&seen);
}

int m3_test_alloc_failed(void) { return atomic_load(&failed); }

/* 1 when this allocation is to fail */
static int hit(void) {
    if (!atomic_load_explicit(&armed, memory_order_relaxed)) return 0;
    long k = atomic_fetch_add(&seen, 1) + 1;
    if (k != atomic_load(&fail_at)) return 0;
    atomic_store(&failed, 1);
    return 1;
}

void *__wrap_malloc(size_t n) { return hit() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t k, size_t n) { return hit() ? NULL : __real_calloc(k, n); }
void *__wrap_realloc(void *p, size_t n) { return hit() ? NULL : __real_realloc(p, n); }
