/* Allocation-failure injection for tests: see fault.h. */
#include "fault.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

typedef struct {
    atomic_int armed;
    atomic_long seen, failed, first, count, period;
} plan;

static plan plans[M3_FAULT_NMOD];

void m3_fault_arm(m3_fault_module m, long first, long count, long period) {
    plan *p = &plans[m];
    atomic_store(&p->armed, 0);
    atomic_store(&p->seen, 0);
    atomic_store(&p->failed, 0);
    atomic_store(&p->first, first < 1 ? 1 : first);
    atomic_store(&p->count, count);
    atomic_store(&p->period, period < 1 ? 1 : period);
    atomic_store(&p->armed, 1);
}

void m3_fault_disarm(m3_fault_module m) { atomic_store(&plans[m].armed, 0); }
int m3_fault_armed(m3_fault_module m) { return atomic_load_explicit(&plans[m].armed, memory_order_relaxed); }
long m3_fault_seen(m3_fault_module m) { return atomic_load(&plans[m].seen); }
long m3_fault_failed(m3_fault_module m) { return atomic_load(&plans[m].failed); }

static _Thread_local int suspended;

void m3_fault_suspend(int on) { suspended += on ? 1 : -1; }

int m3_fault_hit(m3_fault_module m) {
    plan *p = &plans[m];
    if (!atomic_load_explicit(&p->armed, memory_order_relaxed) || suspended) return 0;
    long k = atomic_fetch_add(&p->seen, 1) + 1;
    long first = atomic_load(&p->first), count = atomic_load(&p->count), period = atomic_load(&p->period);
    if (k < first || (k - first) % period) return 0;
    long idx = (k - first) / period;
    if (count >= 0 && idx >= count) return 0;
    atomic_fetch_add(&p->failed, 1);
    return 1;
}

void *m3_fault_malloc(m3_fault_module m, size_t n) { return m3_fault_hit(m) ? NULL : malloc(n); }
void *m3_fault_calloc(m3_fault_module m, size_t k, size_t n) { return m3_fault_hit(m) ? NULL : calloc(k, n); }
void *m3_fault_realloc(m3_fault_module m, void *p, size_t n) { return m3_fault_hit(m) ? NULL : realloc(p, n); }

static long parse_long(const char **s, long dflt, int *bad) {
    if (**s != ':') return dflt;
    (*s)++;
    char *end;
    errno = 0;
    long v = strtol(*s, &end, 10);
    if (end == *s || errno) *bad = 1;
    *s = end;
    return v;
}

static const char *const mod_names[M3_FAULT_NMOD] = {"engine", "server", "backend", "device", "graph"};

const char *m3_fault_module_name(m3_fault_module m) { return (unsigned)m < M3_FAULT_NMOD ? mod_names[m] : "?"; }

int m3_fault_arm_spec(const char *spec, m3_err *err) {
    const char *s = spec ? spec : "";
    while (*s) {
        int m = 0;
        while (m < M3_FAULT_NMOD && strncmp(s, mod_names[m], strlen(mod_names[m]))) m++;
        if (m == M3_FAULT_NMOD) return m3_errf(err, "fault spec '%s': expected engine:, server:, backend:, device: or graph:", spec);
        s += strlen(mod_names[m]);
        int bad = *s != ':';
        long first = parse_long(&s, 1, &bad), count = parse_long(&s, 1, &bad), period = parse_long(&s, 1, &bad);
        if (bad || first < 1 || period < 1 || (*s && *s != ','))
            return m3_errf(err, "fault spec '%s': expected MODULE:FIRST[:COUNT[:PERIOD]] (FIRST, PERIOD >= 1)", spec);
        m3_fault_arm((m3_fault_module)m, first, count, period);
        if (*s == ',') s++;
    }
    return 0;
}

static void *json_fault_malloc(size_t n) { return m3_fault_malloc(M3_FAULT_SERVER, n); }

void m3_fault_json_hook(int on) {
    if (on) json_set_alloc_funcs(json_fault_malloc, free);
    else json_set_alloc_funcs(malloc, free);
}
