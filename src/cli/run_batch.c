/* m3 run-batch: vLLM's batch runner (vllm run-batch -i IN.jsonl -o OUT.jsonl --model DIR): a file
 * of OpenAI batch requests in, one result line per request out, in the input's order.
 *
 * Input: one JSON object a line, as OpenAI's Batch API and vLLM take them:
 *   {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}
 * for /v1/chat/completions, /v1/completions and /v1/responses; blank lines are skipped.
 * Output: one line each, in the same order:
 *   {"id": "batch_req_...", "custom_id": "r1", "response": {"status_code": 200, "request_id": "...",
 *    "body": {the endpoint's answer}}, "error": null}
 * A request the server refuses keeps its status code, with a null body and the server's error
 * object in "error" (as vLLM writes them); a line that is not a request (not JSON, no custom_id,
 * another method or url, a streamed body) gets status 400 and a message naming what is wrong.
 * No line stops the run.
 *
 * How: the whole of m3 serve (its flags, the model, the engine, every endpoint's parsing and
 * answers) runs on a Unix socket in a private directory, and 2 x --max-num-seqs requests at a
 * time go to it as HTTP requests, so a batch answer is exactly what the server answers. Results
 * wait in a window until the ones before them are written; the input is read as it is consumed.
 * The output goes to a temporary file beside OUT (its mode and owner when it exists; a symlink's
 * target), renamed to OUT at the end: a run that fails before answering leaves an earlier OUT as
 * it was. OUT that is not a regular file (a FIFO, a device) and '-' are written in place. An
 * interrupted run (SIGINT / SIGTERM) lets the requests in flight finish, writes the answers that
 * follow each other from the first, and says how many were sent and not written and how many
 * were not run.
 *
 * Threads: the workers share three locks, none held across I/O but the input's: in_mu (reading
 * the input, in order: a line's index is given there), mu (the window of results, the counters;
 * one worker at a time writes lines out, with mu released while it writes) and srv_mu (the
 * server while it serves, for the last worker's m3_server_shutdown; the serving thread clears it
 * before the server is freed). A worker waiting for input polls, so that a shutdown reaches it. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../base/sbuf.h"
#include "../server/server.h"
#include "cli.h"

static const char *usage =
    "usage: m3 run-batch -i INPUT.jsonl -o OUTPUT.jsonl DIR | -m DIR [m3 serve's flags]\n"
    "  vLLM's batch runner: each input line is an OpenAI batch request\n"
    "    {\"custom_id\": \"r1\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {...}}\n"
    "  (url: /v1/chat/completions, /v1/completions or /v1/responses; blank lines skipped); each output line\n"
    "  answers one, in the input's order:\n"
    "    {\"id\": ..., \"custom_id\": \"r1\", \"response\": {\"status_code\": 200, \"request_id\": ..., \"body\": {...}}, \"error\": null}\n"
    "  a refused request: its status code, body null and the error in \"error\"; no line stops the run.\n"
    "  -i, --input-file F   the requests ('-': standard input)\n"
    "  -o, --output-file F  the answers ('-': standard output); written to a temporary file beside F and renamed\n"
    "                       at the end (an interrupted run keeps the answers in order up to the first missing);\n"
    "                       a FIFO or a device is written in place\n"
    "  --max-num-seqs N      requests run together (2 N are sent at a time, as vLLM does, at most N + --max-waiting;\n"
    "                        default 64)\n"
    "  --output-tmp-dir D    vLLM's staging directory for outputs to URLs, which m3 does not write: accepted, unused\n"
    "  Every other flag is m3 serve's (m3 serve --help): the batch runs on that server, privately (its line per\n"
    "  request is off unless --enable-log-requests; a progress line every 10 s).\n";

/* a line over --max-body plus this is refused unread (its request could only get a 413) */
#define LINE_SLACK ((size_t)64 << 10)

typedef struct reader { char *p; size_t len, cap, start; int eof; } reader; /* the input's bytes read ahead */

typedef struct batch {
    const char *in_path, *out_path;
    int in_fd, in_reg;         /* the input; a regular file (what was not run can be counted) */
    reader rd;
    FILE *out;                 /* the temporary file, or the output itself (stdout, a FIFO, a device) */
    char *final_path;          /* where the temporary file goes: out_path, or the symlink's target */
    char *tmp_path;            /* the temporary file (NULL: none, or renamed) */
    int keep_tmp;              /* it holds answers it could not be renamed with */
    int in_place;              /* the output is written where it is (no temporary file) */
    const char *api_key;
    size_t max_line;           /* longer lines are refused unread */
    char dir[96], sock[128];   /* the private directory and the server's socket in it */
    int conc, window;          /* requests in flight; results held (in flight + waiting for earlier ones) */
    int max_seqs, max_waiting;
    pthread_mutex_t srv_mu;
    struct srv *srv;           /* the server while it serves (srv_mu), for m3_server_shutdown */
    pthread_t coord;
    int coord_on;
    pthread_mutex_t in_mu;     /* the reader, lineno, next_idx */
    long lineno, next_idx;     /* input lines read (blank ones too); requests given an index */
    pthread_mutex_t mu;        /* everything below */
    pthread_cond_t cv;         /* a result taken out, a request finished, the input done, the server gone */
    long reserved;             /* window places taken (next_idx <= reserved) */
    long next_write;           /* the next result to write */
    int writing;               /* a worker is writing results out (mu released meanwhile) */
    char **slot;               /* window results, at idx % window */
    atomic_int stop;           /* the server is gone: nothing more is sent */
    int eof, in_err, out_err;  /* the input is read whole; reading it / writing the output failed (said once) */
    int gone;                  /* a request found the server gone (stop is also set when it stops at the end) */
    int inflight, held;        /* requests being answered; of them, waiting to be sent again after a 429 */
    long n_ok, n_err, unsent;  /* answers with 200 / another status; lines read and never sent (the server gone) */
    double t0, last_note;
} batch;

static const char *out_name(const batch *b) { return strcmp(b->out_path, "-") ? b->out_path : "standard output"; }

/* -------------------------------------------------------------- HTTP over the socket */

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* the body of a chunked message in place; -1 when malformed or cut short */
static long dechunk(char *p, size_t n) {
    size_t r = 0, w = 0;
    for (;;) {
        char *end;
        if (r >= n) return -1;
        unsigned long len = strtoul(p + r, &end, 16);
        char *crlf = memmem(p + r, n - r, "\r\n", 2);
        if (!crlf || end == p + r || end > crlf) return -1;
        r = (size_t)(crlf - p) + 2;
        if (!len) return (long)w;
        if (len > n - r || n - r - len < 2) return -1;
        memmove(p + w, p + r, len);
        w += len;
        r += len + 2;
    }
}

/* POST_UNSENT: no connection (*eno: why); POST_GONE: sent, and the connection ended without a
 * whole answer */
enum { POST_OK = 0, POST_UNSENT = -1, POST_GONE = -2, POST_NOMEM = -3 };

/* POST body to path on the server's socket; *status and the response body in *out. */
static int post(batch *b, const char *path, const char *body, size_t blen, int *status, m3_sbuf *out, int *eno) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) { *eno = errno; return POST_UNSENT; }
    struct sockaddr_un sun;
    memset(&sun, 0, sizeof sun);
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, b->sock, strlen(b->sock));
    if (connect(fd, (struct sockaddr *)&sun, sizeof sun)) {
        *eno = errno;
        close(fd);
        return POST_UNSENT;
    }
    char head[512]; /* (an API key too long for it was refused by before()) */
    int hn = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n%s%s%s\r\n",
                      path, blen, b->api_key ? "Authorization: Bearer " : "", b->api_key ? b->api_key : "",
                      b->api_key ? "\r\n" : "");
    m3_sbuf in = {0};
    int rc = POST_GONE;
    if (write_all(fd, head, (size_t)hn) || write_all(fd, body, blen)) goto out;
    char tmp[65536];
    for (;;) {
        ssize_t r = recv(fd, tmp, sizeof tmp, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) goto out;
        if (!r) break;
        if (m3_sbuf_add(&in, tmp, (size_t)r)) { rc = POST_NOMEM; goto out; }
    }
    char *eoh = in.p ? strstr(in.p, "\r\n\r\n") : NULL;
    if (!eoh || strncmp(in.p, "HTTP/1.1 ", 9)) goto out;
    *status = atoi(in.p + 9);
    *eoh = 0;
    char *bp = eoh + 4;
    size_t bn = in.n - (size_t)(bp - in.p);
    int chunked = 0;
    for (char *h = strstr(in.p, "\r\n"); h; h = strstr(h + 2, "\r\n")) {
        char *f = h + 2, *e = strstr(f, "\r\n");
        if (!strncasecmp(f, "Content-Length:", 15)) {
            unsigned long cl = strtoul(f + 15, NULL, 10);
            if (cl > bn) goto out; /* cut short */
            bn = cl;
        } else if (!strncasecmp(f, "Transfer-Encoding:", 18)) {
            char *c = strstr(f, "chunked");
            chunked = c && (!e || c < e);
        }
    }
    if (chunked) {
        long d = dechunk(bp, bn);
        if (d < 0) goto out;
        bn = (size_t)d;
    }
    m3_sbuf_free(out);
    if (m3_sbuf_add(out, bp, bn)) { rc = POST_NOMEM; goto out; }
    rc = POST_OK;
out:
    close(fd);
    m3_sbuf_free(&in);
    return rc;
}

/* -------------------------------------------------------------- one request */

static void rand_hex(char *out, size_t digits) {
    unsigned char r[32];
    size_t n = (digits + 1) / 2;
    if (n > sizeof r) n = sizeof r;
    if (getrandom(r, n, 0) != (ssize_t)n) { /* no entropy source: the clock and a counter */
        static unsigned long ctr;
        unsigned long long x = (unsigned long long)(m3_now() * 1e9) ^ (__atomic_add_fetch(&ctr, 1, __ATOMIC_RELAXED) << 40);
        for (size_t i = 0; i < n; i++, x = x * 6364136223846793005ull + 1442695040888963407ull) r[i] = (unsigned char)(x >> 56);
    }
    for (size_t i = 0; i < digits; i++) out[i] = "0123456789abcdef"[(r[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[digits] = 0;
}

/* the output line (malloc'd, with its newline): body / err are taken (either may be NULL) */
static char *result_line(json_t *custom_id, int status, json_t *body, json_t *err) {
    char id[48] = "batch_req_", rid[48] = "m3-batch-";
    rand_hex(id + 10, 24);
    rand_hex(rid + 9, 24);
    json_t *resp = json_pack("{s:i, s:s, s:o}", "status_code", status, "request_id", rid, "body", body ? body : json_null());
    json_t *o = resp ? json_pack("{s:s, s:O, s:o, s:o}", "id", id, "custom_id", custom_id ? custom_id : json_null(), "response",
                                 resp, "error", err ? err : json_null())
                     : NULL;
    if (!resp) {
        json_decref(body);
        json_decref(err);
    }
    char *t = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(o);
    if (!t) return NULL;
    size_t n = strlen(t);
    char *line = realloc(t, n + 2);
    if (!line) { free(t); return NULL; }
    line[n] = '\n';
    line[n + 1] = 0;
    return line;
}

/* a line that is not a request: status 400, the message naming the input line */
static char *refusal(json_t *custom_id, long lineno, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static char *refusal(json_t *custom_id, long lineno, const char *fmt, ...) {
    char msg[1024];
    int o = snprintf(msg, sizeof msg, "input line %ld: ", lineno);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + o, sizeof msg - (size_t)o, fmt, ap);
    va_end(ap);
    return result_line(custom_id, 400, NULL, json_string(msg));
}

static int supported_url(const char *u) {
    return !strcmp(u, "/v1/chat/completions") || !strcmp(u, "/v1/completions") || !strcmp(u, "/v1/responses");
}

enum { RUN_ANSWERED, RUN_UNSENT, RUN_GONE };

/* Runs one input line: its output line (NULL: out of memory), *how RUN_ANSWERED; else RUN_UNSENT (the
 * server is not there: not sent) or RUN_GONE (sent; the server went away before answering). ok: a 200. */
static char *run_one(batch *b, const char *text, size_t len, long lineno, int *ok, int *how) {
    *ok = 0;
    *how = RUN_ANSWERED;
    json_error_t je;
    json_t *req = json_loadb(text, len, 0, &je); /* (duplicate keys: the last one, as the server takes them) */
    if (!req) return refusal(NULL, lineno, "not valid JSON: %s (column %d)", je.text, je.column);
    char *line = NULL;
    json_t *cid = json_object_get(req, "custom_id");
    json_t *cid_out = json_is_string(cid) ? cid : NULL;
    json_t *m = json_object_get(req, "method"), *u = json_object_get(req, "url"), *body = json_object_get(req, "body");
    json_t *st = json_object_get(body, "stream");
    if (!json_is_object(req)) line = refusal(NULL, lineno, "a request is a JSON object, not %s", json_is_array(req) ? "an array" : "a scalar");
    else if (!json_is_string(cid)) line = refusal(NULL, lineno, "\"custom_id\": a string is required");
    else if (!json_is_string(m) || strcasecmp(json_string_value(m), "POST"))
        line = refusal(cid_out, lineno, "\"method\": only \"POST\" is supported");
    else if (!json_is_string(u) || !supported_url(json_string_value(u)))
        line = refusal(cid_out, lineno, "\"url\" %s%s%s: supported endpoints are /v1/chat/completions, /v1/completions and "
                       "/v1/responses", json_is_string(u) ? "'" : "", json_is_string(u) ? json_string_value(u) : "missing",
                       json_is_string(u) ? "'" : "");
    else if (!json_is_object(body)) line = refusal(cid_out, lineno, "\"body\": the request's JSON object is required");
    else if (st && !json_is_false(st) && !json_is_null(st))
        line = refusal(cid_out, lineno, "\"body\": \"stream\" must be false: batch requests are answered whole");
    if (line || !json_is_object(req) || !json_is_string(cid)) {
        json_decref(req);
        return line;
    }
    size_t blen;
    char *btext = json_dumps(body, JSON_COMPACT);
    blen = btext ? strlen(btext) : 0;
    m3_sbuf resp = {0};
    int status = 0, eno = 0, rc = btext ? POST_OK : POST_NOMEM, busy = 0;
    while (rc == POST_OK) {
        rc = post(b, json_string_value(u), btext, blen, &status, &resp, &eno);
        /* out of descriptors or buffers for a moment: again shortly (50 ms, up to 10 s) */
        if (rc == POST_UNSENT && (eno == EMFILE || eno == ENFILE || eno == EAGAIN || eno == ENOBUFS || eno == ENOMEM) &&
            busy++ < 200 && !atomic_load(&b->stop)) {
            nanosleep(&(struct timespec){0, 50000000}, NULL);
            rc = POST_OK;
            continue;
        }
        if (rc != POST_OK || status != 429) break;
        /* the engine's waiting queue is full (--max-waiting): again once another request ends, while
         * others are in the server (not waiting here too: then nothing makes room, and the 429 is
         * the answer) */
        pthread_mutex_lock(&b->mu);
        if (b->inflight - b->held - 1 <= 0) { pthread_mutex_unlock(&b->mu); break; }
        b->held++;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        if (!atomic_load(&b->stop)) pthread_cond_timedwait(&b->cv, &b->mu, &ts);
        b->held--;
        pthread_mutex_unlock(&b->mu);
        if (atomic_load(&b->stop)) { rc = POST_UNSENT; eno = ECONNREFUSED; break; }
    }
    free(btext);
    /* the server's two 503s of a shutdown: refused on arrival (not run) or cancelled at
     * --shutdown-timeout (cut); an interrupted run either way, not an answer */
    if (rc == POST_OK && status == 503 && resp.p && strstr(resp.p, M3_SERVER_SHUTTING_DOWN)) {
        rc = strstr(resp.p, M3_SERVER_CANCELLED) ? POST_GONE : POST_UNSENT;
        eno = ECONNREFUSED;
    }
    if (rc == POST_UNSENT && eno != ENOENT && eno != ECONNREFUSED && !atomic_load(&b->stop))
        fprintf(stderr, "m3 run-batch: cannot connect to the server's socket %s for input line %ld: %s\n", b->sock, lineno,
                strerror(eno));
    if (rc == POST_UNSENT) *how = RUN_UNSENT;
    else if (rc == POST_GONE) *how = RUN_GONE;
    else if (rc == POST_OK) {
        json_t *ans = json_loadb(resp.p ? resp.p : "", resp.n, 0, &je);
        if (!ans) ans = json_stringn(resp.p ? resp.p : "", resp.n); /* (the server answers JSON; kept whole if not) */
        *ok = status == 200;
        line = status == 200 ? result_line(cid_out, status, ans, NULL) : result_line(cid_out, status, NULL, ans);
    }
    m3_sbuf_free(&resp);
    json_decref(req);
    return line;
}

/* -------------------------------------------------------------- the input */

/* Reads more of the input into the reader, polling so that a shutdown (b->stop) ends the wait
 * unless ignore_stop. 1: bytes came; 0: the end; -1: an error (errno); -2: stopped. */
static int fill(batch *b, int ignore_stop) {
    reader *r = &b->rd;
    if (r->start && r->start == r->len) r->start = r->len = 0;
    if (r->len == r->cap || (r->start > r->cap / 2)) { /* room: drop what was taken, else grow */
        if (r->start) {
            memmove(r->p, r->p + r->start, r->len - r->start);
            r->len -= r->start;
            r->start = 0;
        }
        if (r->len == r->cap) {
            size_t c = r->cap ? 2 * r->cap : (size_t)1 << 16;
            char *q = realloc(r->p, c);
            if (!q) { errno = ENOMEM; return -1; }
            r->p = q;
            r->cap = c;
        }
    }
    for (;;) {
        if (!ignore_stop && atomic_load(&b->stop)) return -2;
        struct pollfd pf = {b->in_fd, POLLIN, 0};
        int pr = poll(&pf, 1, 200);
        if (pr < 0 && errno != EINTR) return -1;
        if (pr <= 0) continue;
        ssize_t n = read(b->in_fd, r->p + r->len, r->cap - r->len);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) return -1;
        if (!n) return 0;
        r->len += (size_t)n;
        return 1;
    }
}

enum { LINE_OK = 1, LINE_END = 0, LINE_ERR = -1, LINE_STOP = -2 };

/* The next non-blank line (malloc'd in *text, trimmed, *len; *text NULL and *len its length when
 * over b->max_line, its bytes skipped), under in_mu. */
static int next_line(batch *b, char **text, size_t *len, long *lineno, int ignore_stop) {
    static const char ws[] = " \t\r\n\v\f";
    reader *r = &b->rd;
    size_t skipped = 0; /* bytes of an over-long line dropped so far */
    for (;;) {
        char *nl = r->len > r->start ? memchr(r->p + r->start, '\n', r->len - r->start) : NULL;
        if (!nl && !r->eof) {
            if (skipped || r->len - r->start > b->max_line) { /* over the limit: drop what is here, keep looking */
                skipped += r->len - r->start;
                r->start = r->len;
            }
            int f = fill(b, ignore_stop);
            if (f == 1) continue;
            if (f == 0) { r->eof = 1; continue; }
            return f == -2 ? LINE_STOP : LINE_ERR;
        }
        const size_t end = nl ? (size_t)(nl - r->p) : r->len;
        const size_t s0 = r->start, n = end - s0;
        r->start = nl ? end + 1 : r->len;
        if (!nl && !n && !skipped) return LINE_END;
        b->lineno++;
        if (skipped || n > b->max_line) {
            *text = NULL;
            *len = skipped + n;
            *lineno = b->lineno;
            return LINE_OK;
        }
        size_t a = s0, e = end;
        while (a < e && memchr(ws, r->p[a], sizeof ws - 1)) a++; /* (memchr: a NUL byte is no blank) */
        while (e > a && memchr(ws, r->p[e - 1], sizeof ws - 1)) e--;
        if (a == e) continue; /* blank */
        char *t = malloc(e - a + 1);
        if (!t) { errno = ENOMEM; return LINE_ERR; }
        memcpy(t, r->p + a, e - a);
        t[e - a] = 0;
        *text = t;
        *len = e - a;
        *lineno = b->lineno;
        return LINE_OK;
    }
}

/* -------------------------------------------------------------- the workers */

/* Writes the results that follow each other from next_write, one worker at a time, mu released
 * while it writes. Called and returns with mu held. */
static void drain(batch *b) {
    if (b->writing) return; /* the one writing takes these too */
    b->writing = 1;
    for (char **sl; *(sl = &b->slot[b->next_write % b->window]);) {
        char *line = *sl;
        *sl = NULL;
        b->next_write++;
        pthread_cond_broadcast(&b->cv); /* a place in the window */
        pthread_mutex_unlock(&b->mu);
        int bad = !b->out_err && fputs(line, b->out) < 0;
        int eno = errno;
        free(line);
        pthread_mutex_lock(&b->mu);
        if (bad && !b->out_err) {
            b->out_err = 1;
            fprintf(stderr, "m3 run-batch: writing %s: %s\n", b->tmp_path ? b->tmp_path : out_name(b), strerror(eno));
        }
    }
    b->writing = 0;
}

static void *worker(void *arg) {
    batch *b = arg;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        while (!atomic_load(&b->stop) && !b->eof && !b->in_err && !b->out_err && b->reserved - b->next_write >= b->window)
            pthread_cond_wait(&b->cv, &b->mu);
        const int done = atomic_load(&b->stop) || b->eof || b->in_err || b->out_err;
        if (!done) b->reserved++;
        pthread_mutex_unlock(&b->mu);
        if (done) break;
        char *text = NULL;
        size_t len = 0;
        long lineno = 0, idx = -1;
        pthread_mutex_lock(&b->in_mu);
        int r = b->eof ? LINE_END : next_line(b, &text, &len, &lineno, 0);
        int eno = errno;
        if (r == LINE_OK) idx = b->next_idx++;
        pthread_mutex_unlock(&b->in_mu);
        pthread_mutex_lock(&b->mu);
        if (r != LINE_OK) {
            b->reserved--;
            if (r == LINE_END) b->eof = 1;
            else if (r == LINE_ERR && !b->in_err) {
                b->in_err = 1;
                fprintf(stderr, "m3 run-batch: reading %s: %s (the requests after input line %ld are not run)\n",
                        strcmp(b->in_path, "-") ? b->in_path : "standard input", strerror(eno), b->lineno);
            }
            pthread_cond_broadcast(&b->cv);
            pthread_mutex_unlock(&b->mu);
            break;
        }
        b->inflight++;
        pthread_mutex_unlock(&b->mu);
        int ok = 0, how = RUN_ANSWERED;
        char *line;
        if (text) line = run_one(b, text, len, lineno, &ok, &how);
        else {
            char msg[256];
            snprintf(msg, sizeof msg, "input line %ld: %zu bytes, over what a request may have (--max-body %zu bytes)", lineno,
                     len, b->max_line - LINE_SLACK);
            line = result_line(NULL, 413, NULL, json_string(msg));
        }
        free(text);
        if (!line && how == RUN_ANSWERED) line = refusal(NULL, lineno, "out of memory while answering it");
        pthread_mutex_lock(&b->mu);
        b->inflight--;
        if (how != RUN_ANSWERED || !line) { /* the server is gone (or no memory even for a refusal): nothing more is sent */
            free(line);
            if (how == RUN_UNSENT) b->unsent++;
            b->gone = 1;
            if (!atomic_exchange(&b->stop, 1))
                fprintf(stderr, "m3 run-batch: the server %s input line %ld; no further requests are sent\n",
                        how == RUN_UNSENT ? "was gone before" : how == RUN_GONE ? "stopped before answering" : "ran out of memory for",
                        lineno);
            pthread_cond_broadcast(&b->cv);
            pthread_mutex_unlock(&b->mu);
            break;
        }
        ok ? b->n_ok++ : b->n_err++;
        b->slot[idx % b->window] = line;
        drain(b);
        const double now = m3_now();
        if (now - b->last_note >= 10) {
            b->last_note = now;
            fprintf(stderr, "m3 run-batch: %ld requests answered (%ld refused), %ld written, %.0f s\n", b->n_ok + b->n_err,
                    b->n_err, b->next_write, now - b->t0);
        }
        pthread_mutex_unlock(&b->mu);
    }
    return NULL;
}

static void *coordinator(void *arg) {
    batch *b = arg;
    pthread_t *th = calloc((size_t)b->conc, sizeof *th);
    int n = 0;
    if (th) {
        pthread_attr_t at;
        pthread_attr_init(&at);
        /* jansson parses nesting by recursion, up to 2048 levels (~1.3 MiB of stack) */
        pthread_attr_setstacksize(&at, (size_t)4 << 20);
        while (n < b->conc && !pthread_create(&th[n], &at, worker, b)) n++;
        pthread_attr_destroy(&at);
    }
    if (!n) {
        fprintf(stderr, "m3 run-batch: cannot start the request threads\n");
        atomic_store(&b->stop, 1);
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    free(th);
    pthread_mutex_lock(&b->srv_mu);
    if (b->srv) m3_server_shutdown(b->srv); /* (under srv_mu: the server is not freed meanwhile) */
    pthread_mutex_unlock(&b->srv_mu);
    return NULL;
}

/* -------------------------------------------------------------- around the server */

static void on_ready(void *arg, struct srv *srv) {
    batch *b = arg;
    pthread_mutex_lock(&b->srv_mu);
    b->srv = srv;
    pthread_mutex_unlock(&b->srv_mu);
    if (!srv) { /* the server stopped serving (it is being freed): waiting workers end */
        atomic_store(&b->stop, 1);
        pthread_mutex_lock(&b->mu);
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
        return;
    }
    /* each request holds two descriptors (both ends are in this process): within the limit the
     * server has raised by now */
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur != RLIM_INFINITY) {
        long cap = ((long)rl.rlim_cur - 64) / 2;
        if (cap < 1) cap = 1;
        if (b->conc > cap) {
            fprintf(stderr, "m3 run-batch: %d requests at a time (open files limit %ld)\n", (int)cap, (long)rl.rlim_cur);
            b->conc = (int)cap;
        }
    }
    b->t0 = b->last_note = m3_now();
    if (pthread_create(&b->coord, NULL, coordinator, b)) {
        fprintf(stderr, "m3 run-batch: cannot start the request threads\n");
        atomic_store(&b->stop, 1);
        m3_server_shutdown(srv); /* (on the serving thread, before it serves) */
        return;
    }
    b->coord_on = 1;
}

/* the output's temporary file beside its final path, with the mode (and, as root, the owner) of
 * the file it replaces, or of a new file under the umask */
static FILE *open_temp(batch *b) {
    size_t n = strlen(b->final_path);
    if (!(b->tmp_path = malloc(n + 32))) return NULL;
    snprintf(b->tmp_path, n + 32, "%s.tmp-XXXXXX", b->final_path);
    int fd = mkstemp(b->tmp_path);
    if (fd < 0) {
        free(b->tmp_path);
        b->tmp_path = NULL;
        return NULL;
    }
    struct stat st;
    if (!stat(b->final_path, &st)) {
        fchmod(fd, st.st_mode & 07777);
        if (!geteuid() && fchown(fd, st.st_uid, st.st_gid)) {} /* (best effort) */
    } else {
        mode_t um = umask(0);
        umask(um);
        fchmod(fd, 0666 & ~um);
    }
    FILE *f = fdopen(fd, "w");
    if (!f) close(fd);
    return f;
}

static int before(void *arg, m3_server_opts *so, int max_num_seqs) {
    batch *b = arg;
    if (so->api_key && strlen(so->api_key) > 256) {
        fprintf(stderr, "m3 run-batch: --api-key: at most 256 bytes\n");
        return -1;
    }
    if (!b->out) { /* the output (checked before the model loaded; made now, so that a stop while loading leaves nothing) */
        b->out = b->in_place ? fopen(b->final_path, "w") : open_temp(b);
        if (!b->out) {
            fprintf(stderr, "m3 run-batch: cannot write %s: %s\n", b->in_place ? b->final_path : "beside the output",
                    strerror(errno));
            return -1;
        }
    }
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 60) tmp = "/tmp";
    snprintf(b->dir, sizeof b->dir, "%s/m3-batch-XXXXXX", tmp);
    if (!mkdtemp(b->dir)) { /* mode 0700: only this user reaches the server */
        fprintf(stderr, "m3 run-batch: cannot make a private directory in %s for the server's socket: %s\n", tmp, strerror(errno));
        b->dir[0] = 0;
        return -1;
    }
    snprintf(b->sock, sizeof b->sock, "%s/server.sock", b->dir);
    b->api_key = so->api_key;
    b->max_line = (so->max_body ? so->max_body : (size_t)32 << 20) + LINE_SLACK;
    /* 2 x max_num_seqs at a time (vLLM's), no more than the engine runs and lets wait */
    b->conc = 2 * max_num_seqs;
    if (so->max_waiting >= 0 && b->conc > max_num_seqs + so->max_waiting) b->conc = max_num_seqs + so->max_waiting;
    if (so->max_connections > 0 && b->conc > so->max_connections) b->conc = so->max_connections;
    if (b->conc > 1024) b->conc = 1024;
    if (b->conc < 1) b->conc = 1;
    b->window = b->conc < 64 ? 256 : 4 * b->conc;
    if (!(b->slot = calloc((size_t)b->window, sizeof *b->slot))) {
        fprintf(stderr, "m3 run-batch: out of memory\n");
        return -1;
    }
    so->uds = b->sock;
    so->ready = on_ready;
    so->ready_arg = b;
    return 0;
}

static int after(void *arg, int served) {
    batch *b = arg;
    /* the server's signal handlers are gone: a second Ctrl-C must not stop the output's renaming */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    if (b->coord_on) pthread_join(b->coord, NULL);
    b->coord_on = 0;
    if (b->out_err) {
        fprintf(stderr, "m3 run-batch: the answers could not be written; %s\n",
                b->in_place ? "the output is incomplete" : "the output file is unchanged");
        return 1;
    }
    const int whole = served && b->eof && !b->gone && !b->in_err && b->next_write == b->next_idx;
    long unread = -1; /* what was never read: counted in a regular file; unknown in a pipe */
    if (!whole && !b->in_err && b->in_reg) {
        unread = 0;
        char *t;
        size_t n;
        long ln;
        for (int r; (r = next_line(b, &t, &n, &ln, 1)) == LINE_OK;) {
            free(t);
            unread++;
        }
    }
    if (fflush(b->out) || (b->tmp_path && fsync(fileno(b->out)))) {
        fprintf(stderr, "m3 run-batch: writing %s: %s; %s\n", b->tmp_path ? b->tmp_path : out_name(b), strerror(errno),
                b->in_place ? "the output is incomplete" : "the output file is unchanged");
        return 1;
    }
    const char *where = out_name(b);
    if (b->tmp_path && (whole || b->next_write)) {
        if (rename(b->tmp_path, b->final_path)) {
            fprintf(stderr, "m3 run-batch: cannot rename %s to %s: %s\n", b->tmp_path, b->final_path, strerror(errno));
            where = b->tmp_path; /* kept: the answers are there */
            b->keep_tmp = 1;
        } else {
            free(b->tmp_path);
            b->tmp_path = NULL;
        }
    }
    const double dt = b->t0 > 0 ? m3_now() - b->t0 : 0;
    if (whole) {
        fprintf(stderr, "m3 run-batch: %ld requests answered (%ld ok, %ld refused) in %.1f s, written to %s\n", b->next_write,
                b->n_ok, b->n_err, dt, where);
        return b->keep_tmp;
    }
    /* read and given an index: written, sent and not written (answered after a missing one, or
     * cut by the shutdown), or never sent */
    const long sent_unwritten = b->next_idx - b->next_write - b->unsent;
    char rest[64] = "the rest of the input was not read";
    if (unread >= 0) snprintf(rest, sizeof rest, "%ld were not run", unread + b->unsent);
    else if (b->unsent) snprintf(rest, sizeof rest, "%ld were read and not run, the rest not read", b->unsent);
    const char *why = !served ? "the server failed (above)" : b->in_err ? "the input could not be read" : "the server stopped";
    if (b->next_write)
        fprintf(stderr, "m3 run-batch: stopped early (%s): the answers to the first %ld requests are in %s; %ld more were sent "
                "and not written, %s\n", why, b->next_write, where, sent_unwritten, rest);
    else fprintf(stderr, "m3 run-batch: stopped early (%s) before any answer was written; %s\n", why,
                 b->in_place ? "nothing was written" : "the output file is unchanged");
    return 1;
}

/* -------------------------------------------------------------- the command */

/* checks the output can be written before anything loads: its directory (a regular or new file,
 * written beside it), or itself (a FIFO, a device: written in place) */
static int check_output(batch *b) {
    if (!strcmp(b->out_path, "-")) {
        b->out = stdout;
        b->in_place = 1;
        return 0;
    }
    struct stat st;
    if (!stat(b->out_path, &st)) {
        if (S_ISDIR(st.st_mode)) {
            fprintf(stderr, "m3 run-batch: -o %s is a directory\n", b->out_path);
            return -1;
        }
        if (!S_ISREG(st.st_mode)) { /* a FIFO, a device: written in place */
            b->in_place = 1;
            if (!(b->final_path = strdup(b->out_path))) return -1;
            if (access(b->out_path, W_OK)) {
                fprintf(stderr, "m3 run-batch: cannot write %s: %s\n", b->out_path, strerror(errno));
                return -1;
            }
            return 0;
        }
        b->final_path = realpath(b->out_path, NULL); /* a symlink: its target is replaced, the link kept */
    } else b->final_path = strdup(b->out_path);
    if (!b->final_path) { fprintf(stderr, "m3 run-batch: %s: %s\n", b->out_path, strerror(errno)); return -1; }
    char *d = strdup(b->final_path);
    if (!d) return -1;
    const char *dn = dirname(d);
    int bad = access(dn, W_OK | X_OK);
    if (bad) fprintf(stderr, "m3 run-batch: cannot write beside %s (in %s): %s\n", b->out_path, dn, strerror(errno));
    free(d);
    return bad ? -1 : 0;
}

int m3_cmd_run_batch(int argc, char **argv) {
    batch b;
    memset(&b, 0, sizeof b);
    b.in_fd = -1;
    pthread_mutex_init(&b.mu, NULL);
    pthread_mutex_init(&b.in_mu, NULL);
    pthread_mutex_init(&b.srv_mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    char **rest = calloc((size_t)argc + 2, sizeof *rest);
    if (!rest) { fprintf(stderr, "m3 run-batch: out of memory\n"); return 1; }
    int nr = 0;
    rest[nr++] = argv[0];
    rest[nr++] = "--disable-log-requests"; /* a line per request: on with --enable-log-requests, which comes later */
    const char *tmp_dir = NULL; /* vLLM's staging directory for URL outputs (m3 writes none): taken, unused */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = NULL;
        size_t fl = 0;
        if (!strcmp(a, "-i") || !strcmp(a, "--input-file") || !strncmp(a, "--input-file=", 13)) { dst = &b.in_path; fl = 12; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--output-file") || !strncmp(a, "--output-file=", 14)) { dst = &b.out_path; fl = 13; }
        else if (!strcmp(a, "--output-tmp-dir") || !strncmp(a, "--output-tmp-dir=", 17)) { dst = &tmp_dir; fl = 16; }
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(usage, stdout); free(rest); return 0; }
        if (!dst) { rest[nr++] = argv[i]; continue; }
        const char *eq = a[1] == '-' && a[fl] == '=' ? a + fl + 1 : NULL;
        if (!eq && i + 1 >= argc) { fprintf(stderr, "m3 run-batch: %s needs a value\n", a); free(rest); return 2; }
        *dst = eq ? eq : argv[++i];
        if (!**dst) { fprintf(stderr, "m3 run-batch: %.*s: an empty path\n", (int)(eq ? fl : strlen(a)), a); free(rest); return 2; }
    }
    (void)tmp_dir;
    int rc = 2;
    if (!b.in_path || !b.out_path) {
        fprintf(stderr, "m3 run-batch: %s is required\n%s", !b.in_path ? "-i INPUT" : "-o OUTPUT", usage);
        goto done;
    }
    for (int k = 0; k < 2; k++) {
        const char *p = k ? b.out_path : b.in_path;
        if (!strncmp(p, "http://", 7) || !strncmp(p, "https://", 8)) {
            fprintf(stderr, "m3 run-batch: %s '%s': URLs are not read or written (m3 fetches nothing); give a local file\n",
                    k ? "-o" : "-i", p);
            goto done;
        }
    }
    rc = 1;
    b.in_fd = strcmp(b.in_path, "-") ? open(b.in_path, O_RDONLY | O_CLOEXEC) : STDIN_FILENO;
    if (b.in_fd < 0) { fprintf(stderr, "m3 run-batch: cannot read %s: %s\n", b.in_path, strerror(errno)); goto done; }
    struct stat ist;
    if (!fstat(b.in_fd, &ist) && S_ISDIR(ist.st_mode)) { fprintf(stderr, "m3 run-batch: -i %s is a directory\n", b.in_path); goto done; }
    b.in_reg = !fstat(b.in_fd, &ist) && S_ISREG(ist.st_mode);
    if (check_output(&b)) goto done;
    m3_serve_hook hook = {"run-batch", "m3 run-batch", usage,
                          "the batch runner listens on nothing outside (its server's socket is private)", before, after, &b};
    rest[nr] = NULL;
    rc = m3_serve_main(nr, rest, &hook);
done:
    if (b.in_fd > STDIN_FILENO) close(b.in_fd);
    if (b.out && b.out != stdout) fclose(b.out);
    else if (b.out) fflush(b.out);
    if (b.tmp_path && !b.keep_tmp) unlink(b.tmp_path); /* not renamed: the output file stays as it was */
    free(b.tmp_path);
    free(b.final_path);
    free(b.rd.p);
    if (b.dir[0]) {
        unlink(b.sock);
        rmdir(b.dir);
    }
    if (b.slot)
        for (int i = 0; i < b.window; i++) free(b.slot[i]);
    free(b.slot);
    free(rest);
    pthread_mutex_destroy(&b.mu);
    pthread_mutex_destroy(&b.in_mu);
    pthread_mutex_destroy(&b.srv_mu);
    pthread_cond_destroy(&b.cv);
    return rc;
}
