/* The monotonic clock, in seconds (for durations: never jumps with the wall clock). */
#ifndef M3_BASE_CLOCK_H
#define M3_BASE_CLOCK_H

#include <time.h>

static inline double m3_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
