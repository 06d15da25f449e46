/* File-system helpers for writers. See files.h. */
#include "files.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int m3_mkdir_p(const char *path, m3_err *err) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return m3_errf(err, "%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return m3_errf(err, "%s: cannot create: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return m3_errf(err, "%s: cannot create: %s", buf, strerror(errno));
    struct stat sb;
    if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode)) return m3_errf(err, "%s: not a directory", buf);
    return 0;
}

int m3_write_file(const char *path, const char *data, size_t n, m3_err *err) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return m3_errf(err, "%s: cannot create: %s", tmp, strerror(errno));
    int ok = fwrite(data, 1, n, f) == n;
    if (fclose(f) != 0) ok = 0;
    if (!ok) { unlink(tmp); return m3_errf(err, "%s: write failed: %s", path, strerror(errno)); }
    if (rename(tmp, path) != 0) { unlink(tmp); return m3_errf(err, "%s: rename failed: %s", path, strerror(errno)); }
    return 0;
}
