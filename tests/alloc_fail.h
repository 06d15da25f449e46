/* Allocation failure for unit tests of code that does not count its allocations through
 * base/fault.h (the grammar compiler, the image decoders, the tokenizer): a test program linked
 * with m3_alloc_fail() (tests/CMakeLists.txt: -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc)
 * sends the malloc / calloc / realloc calls of its own objects, of m3core and of the static
 * libraries (libjpeg, libwebp, utf8proc) through here. Shared libraries (jansson, libpng, pcre2)
 * and libc's own (strdup) allocate unseen, so jansson's parser, which does not survive a failed
 * allocation (base/fault.h), is never hit. One thread at a time while armed. */
#ifndef M3_TEST_ALLOC_FAIL_H
#define M3_TEST_ALLOC_FAIL_H

/* Counts allocations from 1 from now on; number `first` fails (first 0: none does). */
void m3_test_alloc_arm(long first);
/* Stops failing and counting: the allocations seen since armed. */
long m3_test_alloc_disarm(void);
/* 1 once the armed failure has happened. */
int m3_test_alloc_failed(void);

#endif
