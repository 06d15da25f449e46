/* CHECK for the C test programs: counts failures in `failures` and names the condition. */
#ifndef M3_TEST_CHECK_H
#define M3_TEST_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(cond, ...)                                                             \
    do {                                                                             \
        if (!(cond)) {                                                               \
            failures++;                                                              \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                            \
            fprintf(stderr, "\n");                                                   \
        }                                                                            \
    } while (0)

#endif
