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
 * The output goes to a temporary file beside OUT, renamed to OUT at the end: a run that fails
 * before answering leaves an earlier OUT as it was. An interrupted run (SIGINT / SIGTERM) lets
 * the requests in flight finish, writes the answers that follow each other from the first, and
 * says how many. */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
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
    "                       at the end (an interrupted run keeps the answers in order up to the first missing)\n"
    "  --max-num-seqs N      requests run together (2 N are sent at a time, as vLLM does; default 64)\n"
    "  --output-tmp-dir D    vLLM's staging directory for outputs to URLs, which m3 does not write: accepted, unused\n"
    "  Every other flag is m3 serve's (m3 serve --help): the batch runs on that server, privately.\n";

enum { MAX_LINE_BYTES = 1 << 30 };

typedef struct batch {
    const char *in_path, *out_path;
    FILE *in, *out;
    char *tmp_path;            /* the output's temporary file (NULL: standard output, or renamed to out_path) */
    int keep_tmp;              /* it holds answers it could not be renamed with */
    const char *api_key;
    char dir[96], sock[128];   /* the private directory and the server's socket in it */
    int conc, window;          /* requests in flight; results held (in flight + waiting for earlier ones) */
    struct srv *srv;           /* the server while it serves (under mu), for m3_server_shutdown */
    pthread_t coord;
    int coord_on;
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* a result written, a request finished, the input done */
    long lineno;               /* input lines read (blank ones too) */
    long next_idx;             /* requests handed out */
    long next_write;           /* the next result to write */
    char **slot;               /* window results, at idx % window */
    int eof, stop;             /* the input is read whole; the server went away (an interrupted run) */
    int in_err, out_err;       /* reading the input / writing the output failed (said once) */
    int inflight;              /* requests being answered */
    int held;                  /* of them, waiting to be sent again after a 429 */
    long n_ok, n_err;
    double t0, last_note;
} batch;

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

/* the body of a chunked message in place; -1 when malformed */
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

enum { POST_OK = 0, POST_GONE = -1, POST_NOMEM = -2 };

/* POST body to path on the server's socket; *status and the response body in *out. POST_GONE:
 * the server is not there (shut down) or cut the connection without an answer. */
static int post(batch *b, const char *path, const char *body, size_t blen, int *status, m3_sbuf *out) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return POST_GONE;
    struct sockaddr_un sun;
    memset(&sun, 0, sizeof sun);
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, b->sock, strlen(b->sock));
    if (connect(fd, (struct sockaddr *)&sun, sizeof sun)) { close(fd); return POST_GONE; }
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n%s%s%s\r\n",
                      path, blen, b->api_key ? "Authorization: Bearer " : "", b->api_key ? b->api_key : "",
                      b->api_key ? "\r\n" : "");
    m3_sbuf in = {0};
    int rc = POST_GONE;
    /* (an API key too long for the head was refused by before()) */
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
            if (cl < bn) bn = cl;
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

/* Runs one input line; returns its output line (NULL: out of memory, or *gone: the server went
 * away before answering). ok: it got a 200. */
static char *run_one(batch *b, const char *text, size_t len, long lineno, int *ok, int *gone) {
    *ok = 0;
    *gone = 0;
    json_error_t je;
    json_t *req = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!req) return refusal(NULL, lineno, "not a JSON object: %s (column %d)", je.text, je.column);
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
    int status = 0, rc = btext ? POST_OK : POST_NOMEM;
    while (rc == POST_OK) {
        rc = post(b, json_string_value(u), btext, blen, &status, &resp);
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
        if (!b->stop) pthread_cond_timedwait(&b->cv, &b->mu, &ts);
        b->held--;
        const int stop = b->stop;
        pthread_mutex_unlock(&b->mu);
        if (stop) { rc = POST_GONE; break; }
    }
    free(btext);
    /* the server's two 503s of a shutdown (refused, or cancelled at --shutdown-timeout) both say
     * "shutting down": an interrupted run, not an answer */
    if (rc == POST_OK && status == 503 && resp.p && strstr(resp.p, "shutting down")) rc = POST_GONE;
    if (rc == POST_GONE) *gone = 1;
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

/* -------------------------------------------------------------- the workers */

/* the next non-blank input line (malloc'd in *text, length *len), under b->mu; 0 at the end */
static int next_line(batch *b, char **text, size_t *len, long *lineno) {
    static const char ws[] = " \t\r\n\v\f";
    for (;;) {
        char *p = NULL;
        size_t cap = 0;
        errno = 0;
        ssize_t n = getline(&p, &cap, b->in);
        if (n < 0) {
            if (errno && !b->in_err) {
                b->in_err = 1;
                fprintf(stderr, "m3 run-batch: reading %s: %s (the requests after input line %ld are not run)\n", b->in_path,
                        strerror(errno), b->lineno);
            }
            free(p);
            return 0;
        }
        b->lineno++;
        size_t s = strspn(p, ws);
        size_t e = (size_t)n;
        while (e > s && strchr(ws, p[e - 1])) e--;
        if (e == s) { free(p); continue; }
        if (e - s > MAX_LINE_BYTES) { /* answered as a refusal below, without the text */
            free(p);
            p = NULL;
            e = s = 0;
        } else if (s) memmove(p, p + s, e - s);
        if (p) p[e - s] = 0;
        *text = p;
        *len = e - s;
        *lineno = b->lineno;
        return 1;
    }
}

/* writes the results that follow each other from next_write (under b->mu) */
static void flush_ready(batch *b) {
    while (b->next_write < b->next_idx) {
        char **sl = &b->slot[b->next_write % b->window];
        if (!*sl) break;
        if (!b->out_err && fputs(*sl, b->out) < 0) {
            b->out_err = 1;
            fprintf(stderr, "m3 run-batch: writing %s: %s\n", b->tmp_path ? b->tmp_path : "standard output", strerror(errno));
        }
        free(*sl);
        *sl = NULL;
        b->next_write++;
    }
    pthread_cond_broadcast(&b->cv);
}

static void *worker(void *arg) {
    batch *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->stop && !b->eof && !b->out_err && b->next_idx - b->next_write >= b->window) pthread_cond_wait(&b->cv, &b->mu);
        if (b->stop || b->eof || b->out_err) break;
        char *text = NULL;
        size_t len = 0;
        long lineno = 0;
        if (!next_line(b, &text, &len, &lineno)) {
            b->eof = 1;
            pthread_cond_broadcast(&b->cv);
            break;
        }
        const long idx = b->next_idx++;
        b->inflight++;
        pthread_mutex_unlock(&b->mu);
        int ok = 0, gone = 0;
        char *line = text ? run_one(b, text, len, lineno, &ok, &gone)
                          : refusal(NULL, lineno, "longer than %d bytes", MAX_LINE_BYTES);
        free(text);
        if (!line && !gone) line = refusal(NULL, lineno, "out of memory while answering it");
        pthread_mutex_lock(&b->mu);
        b->inflight--;
        if (gone || !line) { /* the server is gone (or no memory even for a refusal): nothing more is run */
            free(line);
            if (!b->stop)
                fprintf(stderr, "m3 run-batch: the server %s before answering input line %ld; no further requests are sent\n",
                        gone ? "shut down" : "ran out of memory", lineno);
            b->stop = 1;
            pthread_cond_broadcast(&b->cv);
            break;
        }
        ok ? b->n_ok++ : b->n_err++;
        b->slot[idx % b->window] = line;
        flush_ready(b);
        const double now = m3_now();
        if (now - b->last_note >= 10) {
            b->last_note = now;
            fprintf(stderr, "m3 run-batch: %ld requests answered (%ld refused), %ld written, %.0f s\n", b->n_ok + b->n_err,
                    b->n_err, b->next_write, now - b->t0);
        }
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

static void *coordinator(void *arg) {
    batch *b = arg;
    pthread_t *th = calloc((size_t)b->conc, sizeof *th);
    int n = 0;
    if (th) {
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setstacksize(&at, (size_t)256 << 10);
        while (n < b->conc && !pthread_create(&th[n], &at, worker, b)) n++;
        pthread_attr_destroy(&at);
    }
    if (!n) fprintf(stderr, "m3 run-batch: cannot start the request threads\n");
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    free(th);
    pthread_mutex_lock(&b->mu);
    if (!n) b->stop = 1;
    flush_ready(b);
    if (b->srv) m3_server_shutdown(b->srv); /* (under mu: the server is not freed meanwhile) */
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* -------------------------------------------------------------- around the server */

static void on_ready(void *arg, struct srv *srv) {
    batch *b = arg;
    pthread_mutex_lock(&b->mu);
    b->srv = srv;
    pthread_mutex_unlock(&b->mu);
    if (!srv) return; /* the server stopped serving (it is being freed) */
    b->t0 = b->last_note = m3_now();
    if (pthread_create(&b->coord, NULL, coordinator, b)) {
        fprintf(stderr, "m3 run-batch: cannot start the request threads\n");
        b->stop = 1;
        m3_server_shutdown(srv); /* (on the serving thread, before it serves) */
        return;
    }
    b->coord_on = 1;
}

static int before(void *arg, m3_server_opts *so, int max_num_seqs) {
    batch *b = arg;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 60) tmp = "/tmp";
    snprintf(b->dir, sizeof b->dir, "%s/m3-batch-XXXXXX", tmp);
    if (!mkdtemp(b->dir)) { /* mode 0700: only this user reaches the server */
        fprintf(stderr, "m3 run-batch: cannot make a private directory in %s for the server's socket: %s\n", tmp, strerror(errno));
        b->dir[0] = 0;
        return -1;
    }
    snprintf(b->sock, sizeof b->sock, "%s/server.sock", b->dir);
    if (so->api_key && strlen(so->api_key) > 256) {
        fprintf(stderr, "m3 run-batch: --api-key: at most 256 bytes\n");
        return -1;
    }
    b->api_key = so->api_key;
    b->conc = 2 * max_num_seqs;
    if (so->max_connections > 0 && b->conc > so->max_connections) b->conc = so->max_connections;
    if (b->conc > 1024) b->conc = 1024;
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
    if (b->coord_on) pthread_join(b->coord, NULL);
    b->coord_on = 0;
    long unread = 0;
    const int whole = served && b->eof && !b->stop && !b->in_err && b->next_write == b->next_idx;
    if (!whole && !b->in_err) { /* what was not run: the rest of the input */
        char *p = NULL;
        size_t cap = 0;
        ssize_t n;
        while ((n = getline(&p, &cap, b->in)) >= 0)
            if (strspn(p, " \t\r\n\v\f") < (size_t)n) unread++;
        free(p);
    }
    if (!b->out_err && (fflush(b->out) || (b->tmp_path && fsync(fileno(b->out))))) {
        fprintf(stderr, "m3 run-batch: writing %s: %s\n", b->tmp_path ? b->tmp_path : "standard output", strerror(errno));
        b->out_err = 1;
    }
    const char *where = b->out_path;
    if (b->tmp_path && !b->out_err && (whole || b->next_write)) {
        if (rename(b->tmp_path, b->out_path)) {
            fprintf(stderr, "m3 run-batch: cannot rename %s to %s: %s\n", b->tmp_path, b->out_path, strerror(errno));
            where = b->tmp_path; /* kept: the answers are there */
            b->keep_tmp = 1;
        } else {
            free(b->tmp_path);
            b->tmp_path = NULL;
        }
    }
    const double dt = b->t0 > 0 ? m3_now() - b->t0 : 0;
    if (b->out_err) {
        fprintf(stderr, "m3 run-batch: the answers could not be written; %s is unchanged\n", b->out_path);
        return 1;
    }
    if (whole) {
        fprintf(stderr, "m3 run-batch: %ld requests answered (%ld ok, %ld refused) in %.1f s, written to %s\n", b->next_write,
                b->n_ok, b->n_err, dt, where);
        return b->keep_tmp;
    }
    const long pending = b->next_idx - b->next_write; /* sent, and after one not answered: not written */
    if (b->next_write)
        fprintf(stderr, "m3 run-batch: stopped early: the answers to the first %ld requests are in %s; %ld more were sent and "
                "not written, %ld were not run\n", b->next_write, where, pending, unread);
    else fprintf(stderr, "m3 run-batch: stopped before any answer was written; %s is unchanged\n", b->out_path);
    return 1;
}

/* -------------------------------------------------------------- the command */

static FILE *open_output(batch *b) {
    if (!strcmp(b->out_path, "-")) return stdout;
    size_t n = strlen(b->out_path);
    if (!(b->tmp_path = malloc(n + 32))) return NULL;
    snprintf(b->tmp_path, n + 32, "%s.tmp-XXXXXX", b->out_path);
    int fd = mkstemp(b->tmp_path);
    if (fd < 0) return NULL;
    mode_t um = umask(0); /* mkstemp's 0600 -> the mode a new file gets under the umask */
    umask(um);
    fchmod(fd, 0666 & ~um);
    FILE *f = fdopen(fd, "w");
    if (!f) close(fd);
    return f;
}

int m3_cmd_run_batch(int argc, char **argv) {
    batch b;
    memset(&b, 0, sizeof b);
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) { fprintf(stderr, "m3 run-batch: out of memory\n"); return 1; }
    int nr = 0;
    const char *tmp_dir = NULL; /* vLLM's staging directory for URL outputs (m3 writes none): taken, unused */
    rest[nr++] = argv[0];
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
    b.in = strcmp(b.in_path, "-") ? fopen(b.in_path, "r") : stdin;
    if (!b.in) { fprintf(stderr, "m3 run-batch: cannot read %s: %s\n", b.in_path, strerror(errno)); goto done; }
    b.out = open_output(&b);
    if (!b.out) { fprintf(stderr, "m3 run-batch: cannot write beside %s: %s\n", b.out_path, strerror(errno)); goto done; }
    m3_serve_hook hook = {"run-batch", "m3 run-batch", usage,
                          "the batch runner listens on nothing outside (its server's socket is private)", before, after, &b};
    rest[nr] = NULL;
    rc = m3_serve_main(nr, rest, &hook);
done:
    if (b.in && b.in != stdin) fclose(b.in);
    if (b.out && b.out != stdout) fclose(b.out);
    else if (b.out) fflush(b.out);
    if (b.tmp_path && !b.keep_tmp) unlink(b.tmp_path); /* not renamed: OUT stays as it was */
    free(b.tmp_path);
    if (b.dir[0]) {
        unlink(b.sock);
        rmdir(b.dir);
    }
    if (b.slot)
        for (int i = 0; i < b.window; i++) free(b.slot[i]);
    free(b.slot);
    free(rest);
    pthread_mutex_destroy(&b.mu);
    pthread_cond_destroy(&b.cv);
    return rc;
}
