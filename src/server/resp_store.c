/* Stored responses, in memory within a byte budget (see resp_store.h). */
#include "resp_store.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../base/fault.h"

#define ENTRY_OVERHEAD 128 /* bytes an entry costs beside its texts (struct, ids, table slot) */

typedef struct entry {
    char *id, *prev;      /* prev NULL: the first response of its conversation */
    char *turn, *resp, *items; /* items NULL: none */
    size_t turn_len, resp_len, items_len, bytes;
    struct entry *hnext;  /* hash chain */
    struct entry *older, *newer; /* age list */
} entry;

struct m3_resp_store {
    pthread_mutex_t mu;
    entry **tab;
    size_t nb;            /* buckets, a power of two */
    size_t n, bytes, cap;
    unsigned long long evicted;
    entry *oldest, *newest;
};

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = m3_fault_malloc(M3_FAULT_SERVER, n);
    if (d) memcpy(d, s, n);
    return d;
}

m3_resp_store *m3_resp_store_new(size_t cap) {
    m3_resp_store *s = m3_fault_calloc(M3_FAULT_SERVER, 1, sizeof *s);
    if (!s) return NULL;
    s->nb = 64;
    if (!(s->tab = m3_fault_calloc(M3_FAULT_SERVER, s->nb, sizeof *s->tab))) { free(s); return NULL; }
    s->cap = cap;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

static void entry_free(entry *x) {
    free(x->id);
    free(x->prev);
    free(x->turn);
    free(x->resp);
    free(x->items);
    free(x);
}

void m3_resp_store_free(m3_resp_store *s) {
    if (!s) return;
    for (entry *x = s->oldest, *nx; x; x = nx) {
        nx = x->newer;
        entry_free(x);
    }
    free(s->tab);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static entry **slot(m3_resp_store *s, const char *id) {
    entry **p = &s->tab[hash_str(id) & (s->nb - 1)];
    while (*p && strcmp((*p)->id, id)) p = &(*p)->hnext;
    return p;
}

static void unlink_entry(m3_resp_store *s, entry **p) {
    entry *x = *p;
    *p = x->hnext;
    if (x->older) x->older->newer = x->newer;
    else s->oldest = x->newer;
    if (x->newer) x->newer->older = x->older;
    else s->newest = x->older;
    s->n--;
    s->bytes -= x->bytes;
    entry_free(x);
}

/* doubles the table (a failed allocation keeps the old one: longer chains, still correct) */
static void grow(m3_resp_store *s) {
    size_t nb = s->nb * 2;
    entry **t = m3_fault_calloc(M3_FAULT_SERVER, nb, sizeof *t);
    if (!t) return;
    for (size_t i = 0; i < s->nb; i++)
        for (entry *x = s->tab[i], *nx; x; x = nx) {
            nx = x->hnext;
            entry **q = &t[hash_str(x->id) & (nb - 1)];
            x->hnext = *q;
            *q = x;
        }
    free(s->tab);
    s->tab = t;
    s->nb = nb;
}

int m3_resp_store_put(m3_resp_store *s, const char *id, const char *prev, char *turn, size_t turn_len, char *resp,
                      size_t resp_len, char *items, size_t items_len) {
    if (!items) items_len = 0;
    size_t bytes = turn_len + resp_len + items_len + strlen(id) + (prev ? strlen(prev) : 0) + ENTRY_OVERHEAD;
    entry *x = bytes > s->cap ? NULL : m3_fault_calloc(M3_FAULT_SERVER, 1, sizeof *x);
    if (!x || !(x->id = dup_str(id)) || (prev && !(x->prev = dup_str(prev)))) {
        if (x) entry_free(x);
        free(turn);
        free(resp);
        free(items);
        return bytes > s->cap ? 1 : -1;
    }
    x->turn = turn;
    x->turn_len = turn_len;
    x->resp = resp;
    x->resp_len = resp_len;
    x->items = items;
    x->items_len = items_len;
    x->bytes = bytes;
    pthread_mutex_lock(&s->mu);
    entry **p = slot(s, id);
    if (*p) unlink_entry(s, p);
    while (s->bytes + bytes > s->cap && s->oldest) {
        unlink_entry(s, slot(s, s->oldest->id));
        s->evicted++;
    }
    if (s->n + 1 > s->nb) grow(s);
    p = slot(s, id);
    *p = x;
    x->older = s->newest;
    if (s->newest) s->newest->newer = x;
    else s->oldest = x;
    s->newest = x;
    s->n++;
    s->bytes += bytes;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int m3_resp_store_history(m3_resp_store *s, const char *id, json_t **msgs, char *missing, size_t cap) {
    *msgs = NULL;
    entry **chain = NULL;
    size_t n = 0, cn = 0;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    for (const char *at = id; at;) {
        entry *x = *slot(s, at);
        if (!x) {
            if (cap) {
                strncpy(missing, at, cap - 1);
                missing[cap - 1] = 0;
            }
            rc = 1;
            break;
        }
        if (n >= M3_RESP_STORE_MAX_CHAIN) { rc = 2; break; } /* (a cycle ends here too) */
        if (n == cn) {
            size_t nc = cn ? cn * 2 : 16;
            entry **nw = m3_fault_realloc(M3_FAULT_SERVER, chain, nc * sizeof *nw);
            if (!nw) { rc = -1; break; }
            chain = nw;
            cn = nc;
        }
        chain[n++] = x;
        at = x->prev;
    }
    json_t *all = rc ? NULL : json_array();
    if (!rc && !all) rc = -1;
    for (size_t i = n; !rc && i-- > 0;) { /* the first response's turn first */
        json_error_t je;
        m3_fault_suspend(1); /* jansson's parser and failed allocations: see fault.h */
        json_t *t = json_loadb(chain[i]->turn, chain[i]->turn_len, 0, &je);
        m3_fault_suspend(0);
        if (!t || json_array_extend(all, t)) rc = -1; /* the texts were written by the server: only memory fails */
        json_decref(t);
    }
    pthread_mutex_unlock(&s->mu);
    free(chain);
    if (rc) json_decref(all);
    else *msgs = all;
    return rc;
}

/* a copy of one of response id's texts (items: its input items, else the response) */
static char *get_text(m3_resp_store *s, const char *id, int items, size_t *len, int *oom) {
    *oom = 0;
    char *r = NULL;
    pthread_mutex_lock(&s->mu);
    entry *x = *slot(s, id);
    const char *t = !x ? NULL : !items ? x->resp : x->items ? x->items : "[]";
    size_t n = !x ? 0 : !items ? x->resp_len : x->items ? x->items_len : 2;
    if (t && (r = m3_fault_malloc(M3_FAULT_SERVER, n + 1))) {
        memcpy(r, t, n);
        r[n] = 0;
        *len = n;
    } else if (t) *oom = 1;
    pthread_mutex_unlock(&s->mu);
    return r;
}

char *m3_resp_store_get(m3_resp_store *s, const char *id, size_t *len, int *oom) { return get_text(s, id, 0, len, oom); }

char *m3_resp_store_get_items(m3_resp_store *s, const char *id, size_t *len, int *oom) {
    return get_text(s, id, 1, len, oom);
}

int m3_resp_store_delete(m3_resp_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    entry **p = slot(s, id);
    int found = *p != NULL;
    if (found) unlink_entry(s, p);
    pthread_mutex_unlock(&s->mu);
    return found;
}

void m3_resp_store_get_stats(m3_resp_store *s, m3_resp_store_stats *st) {
    pthread_mutex_lock(&s->mu);
    st->n = s->n;
    st->bytes = s->bytes;
    st->cap = s->cap;
    st->evicted = s->evicted;
    pthread_mutex_unlock(&s->mu);
}
