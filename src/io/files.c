/* File-system helpers. See files.h. */
#include "files.h"

#include <errno.h>
#include <stdlib.h>
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

char *m3_read_text(const char *path, const char *what, size_t max, m3_err *err) {
    const char *sp = what ? " " : "", *w = what ? what : "";
    FILE *f = fopen(path, "rb");
    if (!f) { m3_errf(err, "%s: cannot open%s%s", path, sp, w); return NULL; }
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n < 0 || (size_t)n > max || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        m3_errf(err, "%s: %s%sunreadable or larger than %zu bytes", path, w, sp, max);
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) { fclose(f); m3_errf(err, "out of memory"); return NULL; }
    size_t got = fread(s, 1, (size_t)n, f);
    fclose(f);
    s[got] = 0;
    return s;
}
