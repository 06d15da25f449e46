/* m3 serve: the connections, watched from outside libevent (see srv.h).
 *
 * libevent 2.1's evhttp neither counts its connections nor bounds the time a request takes to
 * arrive: its --timeout restarts on every byte, so one byte every 20-50 s held a connection
 * forever (slowloris), and nothing capped how many there were. Every 200 ms (srv_peek's timer)
 * this sweep lists the process's sockets connected to the listening port (/proc/self/fd), and
 *   - pauses the listener while there are --max-connections of them (new clients wait in the
 *     kernel's backlog), resuming it below;
 *   - shuts a connection that has been taking a request for longer than --timeout: one with no
 *     request in flight (no generation running for it, none being prepared) to which the server
 *     has sent nothing for that long (TCP_INFO's last send; since the accept when nothing was ever
 *     sent). An idle keep-alive connection sends nothing either and is closed by libevent's own
 *     timeout at the same mark.
 * A shut socket reads EOF, and libevent frees the connection as it does for any client that
 * leaves. */
#include "srv.h"

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/bufferevent.h>
#include <event2/listener.h>

static int port_of(const struct sockaddr_storage *a) {
    if (a->ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)a)->sin_port);
    if (a->ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
    return -1;
}

/* the fd of a connection libevent holds for req (-1: none) */
static int fd_of(struct evhttp_connection *c) {
    struct bufferevent *b = c ? evhttp_connection_get_bufferevent(c) : NULL;
    return b ? bufferevent_getfd(b) : -1;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static void pause_at_cap(srv *s) {
    evconnlistener_disable(evhttp_bound_socket_get_listener(s->bs));
    s->conns_paused = 1;
    if (s->cap_pauses++ % 100 == 0)
        fprintf(stderr, "m3 serve: %d connections (--max-connections %d): new clients wait until some close\n", s->n_conns,
                s->o->max_connections);
}

/* libevent asks for each accepted connection's bufferevent (the one it would make itself): the
 * count goes up at once, so a burst cannot overrun the cap before the next sweep */
struct bufferevent *srv_conns_bev(struct event_base *base, void *arg) {
    srv *s = arg;
    s->n_conns++;
    if (s->o->max_connections > 0 && s->n_conns >= s->o->max_connections && !s->conns_paused && s->bs) pause_at_cap(s);
    return bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
}

void srv_conns_sweep(srv *s) {
    if (!s->bs || (!s->o->max_connections && !(s->o->timeout > 0))) return;
    int lfd = (int)evhttp_bound_socket_get_fd(s->bs);
    struct sockaddr_storage la;
    socklen_t ll = sizeof la;
    if (getsockname(lfd, (struct sockaddr *)&la, &ll)) return;
    const int port = port_of(&la);
    /* the connections with a request in flight: never shut here */
    int busy[4096], nb = 0;
    for (hreq *h = s->live; h && nb < 4096; h = h->next)
        if (!h->closed && h->conn && fd_of(h->conn) >= 0) busy[nb++] = fd_of(h->conn);
    nb += srv_prep_fds(s, busy + nb, 4096 - nb);
    qsort(busy, (size_t)nb, sizeof *busy, cmp_int);
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    int n = 0;
    const double to_ms = s->o->timeout * 1e3;
    struct dirent *de;
    while ((de = readdir(d))) {
        char *end;
        long fd = strtol(de->d_name, &end, 10);
        if (*end || end == de->d_name || fd == lfd || fd == dirfd(d)) continue;
        struct stat st;
        if (fstat((int)fd, &st) || !S_ISSOCK(st.st_mode)) continue;
        struct sockaddr_storage a, p;
        socklen_t al = sizeof a, pl = sizeof p;
        if (getsockname((int)fd, (struct sockaddr *)&a, &al) || port_of(&a) != port) continue;
        if (getpeername((int)fd, (struct sockaddr *)&p, &pl)) continue; /* not connected */
        n++;
        int ifd = (int)fd;
        if (!(s->o->timeout > 0) || bsearch(&ifd, busy, (size_t)nb, sizeof *busy, cmp_int)) continue;
        struct tcp_info ti;
        socklen_t tl = sizeof ti;
        if (getsockopt(ifd, IPPROTO_TCP, TCP_INFO, &ti, &tl) || ti.tcpi_state != TCP_ESTABLISHED) continue;
        /* receiving (a request arriving, however slowly) while nothing was sent for --timeout */
        if ((double)ti.tcpi_last_data_sent > to_ms && (double)ti.tcpi_last_data_recv < (double)ti.tcpi_last_data_sent) {
            shutdown(ifd, SHUT_RDWR);
            s->m.slow_requests_cut++;
        }
    }
    closedir(d);
    s->n_conns = n;
    struct evconnlistener *lis = evhttp_bound_socket_get_listener(s->bs);
    const int cap = s->o->max_connections;
    if (cap > 0 && n >= cap && !s->conns_paused) {
        pause_at_cap(s);
    } else if (s->conns_paused && n < cap) {
        evconnlistener_enable(lis);
        s->conns_paused = 0;
    }
}
