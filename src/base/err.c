#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int m3_errf(m3_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->oom = m3_err_fmt_oom(fmt);
        err->over_limit = 0;
    }
    return -1;
}

int m3_err_fmt_oom(const char *fmt) {
    static const char OOM[] = "out of memory";
    size_t n = fmt ? strlen(fmt) : 0;
    return n >= sizeof OOM - 1 && !strcmp(fmt + n - (sizeof OOM - 1), OOM);
}

int m3_err_prefix(m3_err *err, const char *fmt, ...) {
    if (err) {
        char pre[512], old[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(pre, sizeof pre, fmt, ap);
        va_end(ap);
        memcpy(old, err->msg, sizeof old);
        size_t n = strlen(pre);
        if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
        memcpy(err->msg, pre, n);
        memcpy(err->msg + n, ": ", 2);
        size_t m = strlen(old);
        if (m > sizeof err->msg - n - 3) m = sizeof err->msg - n - 3;
        memcpy(err->msg + n + 2, old, m);
        err->msg[n + 2 + m] = 0;
    }
    return -1;
}
