/* Small file-system helpers: create a directory with its parents, write a file atomically
 * (PATH.tmp, then renamed over PATH, so a reader never sees half a file), read a small text file. */
#ifndef M3_FILES_H
#define M3_FILES_H

#include <stddef.h>

#include "../base/err.h"

/* mkdir -p: creates path and missing parents; fails if path exists and is not a directory */
int m3_mkdir_p(const char *path, m3_err *err);

/* writes n bytes of data to path through path.tmp and a rename; 0, or -1 with err set */
int m3_write_file(const char *path, const char *data, size_t n, m3_err *err);

/* the whole of a text file of at most max bytes, NUL-terminated (free() it); NULL with err naming
 * the path (and what the file is, when what is given: "PATH: cannot open config") when it cannot
 * be opened or is larger, or with "out of memory" */
char *m3_read_text(const char *path, const char *what, size_t max, m3_err *err);

#endif
