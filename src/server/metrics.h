/* m3 serve metrics: counters and latency histograms kept by the HTTP thread, rendered in the
 * Prometheus text exposition format (version 0.0.4) for GET /metrics.
 *
 * What is measured where: token timings (time to first token, inter-token latency) are taken
 * on the HTTP thread when a token's record arrives from the engine, which is what a client
 * sees minus the network; end-to-end latency runs from the request's arrival to its last
 * byte handed to libevent. Engine-side numbers (running / waiting sequences, KV blocks,
 * prefix-cache hits, preemptions) come from m3_engine_get_stats at render time.
 *
 * Ownership and threads: an m3_metrics is plain data owned by the server; one thread (the
 * HTTP thread) updates and renders it. */
#ifndef M3_SERVER_METRICS_H
#define M3_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/engine.h"
#include "../base/fault.h"

#define M3_HIST_MAX_BUCKETS 24

typedef struct m3_hist {
    const double *le;                      /* upper bounds, increasing; +Inf is implied */
    int n_le;
    uint64_t counts[M3_HIST_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last: above every bound */
    uint64_t count;
    double sum;
} m3_hist;

typedef struct m3_metrics {
    uint64_t finished[5];      /* choices finished, by M3_FINISH_* (index 0 unused) */
    uint64_t http_codes[600];  /* responses by HTTP status code */
    uint64_t prompt_tokens, generation_tokens;
    uint64_t requests_rejected_overload;
    uint64_t slow_clients_dropped;  /* streams dropped by the stall check (the HTTP layer counts write timeouts) */
    uint64_t keepalives;       /* SSE keep-alive comments sent to silent streams */
    uint64_t images;           /* images in accepted generation requests */
    m3_hist ttft, itl, e2e;    /* seconds */
} m3_metrics;

/* What the server knows beyond the engine's stats. */
typedef struct m3_metrics_info {
    const char *model_name;
    int capacity_tokens;       /* m3_engine_capacity_tokens */
    int max_model_len;
    size_t kv_bytes_per_token; /* 0: unknown (not reported) */
    int max_waiting;
    int draining;              /* 1 after SIGTERM / SIGINT */
    int http_in_flight;        /* generation requests not finished */
    int preparing;             /* requests on the preparation threads (prompt rendering, image decoding) */
    unsigned long prepared;    /* requests the preparation threads have finished with */
    int http_connections;      /* client connections open */
    unsigned long http_refused;/* requests the HTTP layer refused (malformed, over a limit, late) */
    unsigned long http_slow_requests;   /* of them, requests that did not arrive within --timeout */
    unsigned long http_write_timeouts;  /* connections closed: the client took no bytes for --timeout */
    unsigned long http_turned_away;     /* connections closed as soon as accepted: no memory for their state */
    unsigned long http_accept_pauses;   /* accept() out of file descriptors: the listener paused for 100 ms */
    unsigned long http_accept_resumes;  /* those pauses ended */
    int responses_store;       /* stored responses (resp_store.h): report these */
    unsigned long responses_stored, responses_evicted;
    size_t responses_bytes, responses_cap;
    int fault_armed;           /* fault injection (tests): report the failures injected */
    long fault_injected[M3_FAULT_NMOD]; /* by module (src/base/fault.h) */
    long fault_seen[M3_FAULT_NMOD];     /* allocations counted, by module */
} m3_metrics_info;

void m3_metrics_init(m3_metrics *m);
void m3_hist_observe(m3_hist *h, double v);
void m3_metrics_http(m3_metrics *m, int code);

/* The whole exposition text (malloc'd, *len bytes), or NULL when out of memory. */
char *m3_metrics_render(const m3_metrics *m, const m3_engine_stats *st, const m3_metrics_info *info, size_t *len);

#endif
