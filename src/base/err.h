/* m3_err: error reporting for library code.
 * Library functions never print or exit: they return -1 (or NULL) and fill an m3_err
 * with one line that names the thing (file, tensor, field, expected vs found). */
#ifndef M3_ERR_H
#define M3_ERR_H

typedef struct m3_err {
    char msg[1024];
    int oom; /* an allocation failed: set by m3_errf when its format ends in "out of memory", so a
              * caller tells its own fault (a server's 500) from its input's without reading text
              * the input may have written (a template's raise_exception, say) */
    int over_limit; /* the input is well formed but larger than a limit its caller set (a grammar's
                     * max_states): reset by m3_errf, set by the producer after it, kept by m3_err_prefix */
} m3_err;

/* Formats into err (if non-NULL) and returns -1, so `return m3_errf(err, ...)` works. */
int m3_errf(m3_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an existing message (for adding context as errors travel up; oom and over_limit stay). */
int m3_err_prefix(m3_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 1 when fmt ends in "out of memory": m3_errf's rule for oom, for producers that format a message
 * in parts (a parser's "what (line, column)"): they set err->oom by their own format, never by the
 * text their input brought. */
int m3_err_fmt_oom(const char *fmt);

#endif
