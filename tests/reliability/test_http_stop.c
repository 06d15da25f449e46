/* The HTTP layer's listener at a stop (src/server/http.c, http_server_stop_listening): clients
 * that connected before it and are still in the kernel's listen queue, unaccepted (one with its
 * request already sent, one sending after the stop), are taken in and answered; clients that come
 * after it find no socket; the server is told how many of them have yet to send a request (it
 * waits for them before it exits), and of each one's first request as it comes (first_done); each
 * reply counts as being sent (http_stats.sending) from the handler's answer until it is all written
 * (sent_done), or until its connection goes (a client that closes on an 8 MB reply it has not
 * read), which a stopping server waits for too. Closing the socket with them queued reset
 * them unread: a batch runner could not tell such a request from one the server ran and lost
 * (server_batch's interrupted run).
 * The event loop does not run between the connects and the stop, so the clients are in the queue
 * by construction; then it runs until both answers are read (no fixed waits: a deadline fails).
 * Usage: test_http_stop */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "server/http.h"

#include "../check.h"

static http_server *hs;
static int handled, firsts, handled_at_first[2], sent, sending_at_answer[2];

/* http_opts.first_done: called before the request it reports (if any) is handled */
static void first_done(void *arg) {
    (void)arg;
    if (firsts < 2) handled_at_first[firsts] = handled;
    firsts++;
}

#define BIG ((size_t)8 << 20) /* a reply no socket buffer takes whole */

static void handler(http_req *r, void *arg) {
    (void)arg;
    handled++;
    struct evbuffer *b = evbuffer_new();
    if (!strcmp(http_target(r), "/big")) {
        char *z = calloc(1, BIG);
        if (z) evbuffer_add(b, z, BIG);
        free(z);
    } else evbuffer_add_printf(b, "answer to %s", http_target(r));
    http_reply(r, 200, "text/plain", b);
    evbuffer_free(b);
    http_stats st;
    http_server_stats(hs, &st);
    if (handled <= 2) sending_at_answer[handled - 1] = st.sending; /* this reply is waiting to be written */
}

/* http_opts.sent_done: a reply is all written */
static void sent_done(void *arg) {
    (void)arg;
    sent++;
}

static int client(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {0};
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int send_all(int fd, const char *s) {
    size_t n = strlen(s);
    while (n) {
        ssize_t k = write(fd, s, n);
        if (k <= 0) return -1;
        s += k;
        n -= (size_t)k;
    }
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* a reset client's write fails (the check), not the program */
    char dir[] = "/tmp/m3-test-http-XXXXXX", path[128];
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    snprintf(path, sizeof path, "%s/s.sock", dir);
    struct event_base *base = event_base_new();
    http_opts o = {.max_head = 8192, .max_body = 1 << 20, .timeout = 30, .first_done = first_done, .sent_done = sent_done};
    hs = base ? http_server_new(base, &o, handler, NULL) : NULL;
    char err[256] = "";
    if (!hs || http_server_listen_unix(hs, path, err, sizeof err)) {
        fprintf(stderr, "cannot listen on %s: %s\n", path, err);
        return 1;
    }
    /* two clients in the listen queue (the loop has not run: nothing was accepted) */
    const int a = client(path), b = client(path);
    CHECK(a >= 0 && b >= 0, "connect before the stop: %s", strerror(errno));
    CHECK(a < 0 || !send_all(a, "GET /first HTTP/1.1\r\nHost: x\r\n\r\n"), "send");
    http_server_stop_listening(hs);
    struct stat st;
    CHECK(lstat(path, &st) && errno == ENOENT, "the socket's path is removed at the stop");
    const int late = client(path);
    CHECK(late < 0, "a client after the stop finds no socket");
    if (late >= 0) close(late);
    http_stats hst;
    http_server_stats(hs, &hst);
    CHECK(hst.awaiting_first == 2 && hst.connections == 2, "2 clients taken from the queue, waited for: %d (%d open)",
          hst.awaiting_first, hst.connections);
    CHECK(b < 0 || !send_all(b, "GET /second HTTP/1.1\r\nHost: x\r\n\r\n"), "send after the stop");
    /* both answered: run the loop until each client has read its whole answer */
    const int fds[2] = {a, b};
    const char *want[2] = {"answer to /first", "answer to /second"};
    char got[2][1024] = {{0}};
    size_t n[2] = {0, 0};
    int done[2] = {a < 0, b < 0};
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
    const double t0 = now();
    while ((!done[0] || !done[1]) && now() - t0 < 30) {
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
        for (int i = 0; i < 2; i++) {
            if (done[i]) continue;
            ssize_t k = read(fds[i], got[i] + n[i], sizeof got[i] - 1 - n[i]);
            if (k > 0) n[i] += (size_t)k;
            else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) done[i] = 1; /* closed or reset */
            if (strstr(got[i], want[i])) done[i] = 1;
        }
    }
    for (int i = 0; i < 2; i++) {
        CHECK(!strncmp(got[i], "HTTP/1.1 200", 12) && strstr(got[i], want[i]), "client %d (queued at the stop) answered: %.*s", i,
              (int)n[i], got[i]);
        if (fds[i] >= 0) close(fds[i]);
    }
    CHECK(handled == 2, "%d requests handled", handled);
    /* both reports, waited for as a state: a report may come in a later pass of the loop than
     * the one whose write the client has already read */
    while (sent < 2 && now() - t0 < 30) event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    http_server_stats(hs, &hst);
    CHECK(hst.awaiting_first == 0, "no client from the queue waited for once both sent: %d", hst.awaiting_first);
    CHECK(firsts == 2 && handled_at_first[0] == 0 && handled_at_first[1] == 1,
          "first_done told of each client's first request, before it was handled: %d calls, at %d / %d handled", firsts,
          handled_at_first[0], handled_at_first[1]);
    CHECK(sending_at_answer[0] >= 1 && sending_at_answer[1] >= 1 && hst.sending == 0 && sent == 2,
          "each reply counted as being sent until written: %d / %d at the answers, %d after, %d sent_done calls", sending_at_answer[0],
          sending_at_answer[1], hst.sending, sent);
    http_server_free(hs);

    /* a reply its client closes on unread: it counts as being sent until the connection goes */
    snprintf(path, sizeof path, "%s/t.sock", dir);
    hs = http_server_new(base, &o, handler, NULL);
    CHECK(hs && !http_server_listen_unix(hs, path, err, sizeof err), "second listener: %s", err);
    const int c = hs ? client(path) : -1;
    CHECK(c >= 0 && !send_all(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"), "send /big");
    const int handled0 = handled, sent0 = sent;
    const double t1 = now();
    while (hs && handled == handled0 && now() - t1 < 30) event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    if (hs) http_server_stats(hs, &hst);
    CHECK(handled == handled0 + 1 && hst.sending == 1 && sent == sent0, "the big reply is being sent: %d handled, %d sending, %d reports",
          handled - handled0, hst.sending, sent - sent0);
    if (c >= 0) close(c);
    while (hs && sent == sent0 && now() - t1 < 30) event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    if (hs) http_server_stats(hs, &hst);
    CHECK(sent == sent0 + 1 && hst.sending == 0 && hst.connections == 0, "its client gone: %d reports, %d sending, %d open",
          sent - sent0, hst.sending, hst.connections);
    if (hs) http_server_free(hs);
    unlink(path);
    event_base_free(base);
    rmdir(dir);
    if (failures) fprintf(stderr, "test_http_stop: %d checks failed\n", failures);
    else printf("test_http_stop: ok (2 queued clients answered after the stop, a later one refused)\n");
    return failures != 0;
}
