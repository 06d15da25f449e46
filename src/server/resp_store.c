/* Stored responses, in memory within a byte budget (see resp_store.h). */
#include "resp_store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../base/fault.h"

#define ENTRY_OVERHEAD 128 /* bytes an entry costs beside its texts (struct, ids, table slot) */

/* a stored text, shared by the entry and whoever reads it (refcounted: freed by the last) */
typedef struct text {
    atomic_int ref;
    size_t n;
    char *p;    /* the caller's buffer, taken (no copy on the event loop) */
} text;

typedef struct entry {
    char *id, *prev;      /* prev NULL: the first response of its conversation */
    text *turn, *resp, *items; /* items NULL: none */
    size_t bytes;
    struct entry *hnext;  /* hash chain */
    struct entry *older, *newer; /* age list: least recently used first */
} entry;

struct m3_resp_store {
    pthread_mutex_t mu;
    entry **tab;
    size_t nb;            /* buckets, a power of two */
    size_t n, bytes, cap, max_read;
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

/* the text p[0..n) as a shared text (p taken: freed whatever happens); NULL when out of memory */
static text *text_of(char *p, size_t n) {
    text *t = p ? m3_fault_malloc(M3_FAULT_SERVER, sizeof *t) : NULL;
    if (!t) {
        free(p);
        return NULL;
    }
    atomic_init(&t->ref, 1);
    t->n = n;
    t->p = p;
    return t;
}

static text *text_ref(text *t) {
    if (t) atomic_fetch_add(&t->ref, 1);
    return t;
}

static void text_unref(text *t) {
    if (t && atomic_fetch_sub(&t->ref, 1) == 1) {
        free(t->p);
        free(t);
    }
}

m3_resp_store *m3_resp_store_new(size_t cap) {
    m3_resp_store *s = m3_fault_calloc(M3_FAULT_SERVER, 1, sizeof *s);
    if (!s) return NULL;
    s->nb = 64;
    if (!(s->tab = m3_fault_calloc(M3_FAULT_SERVER, s->nb, sizeof *s->tab))) { free(s); return NULL; }
    s->cap = cap;
    s->max_read = SIZE_MAX;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void m3_resp_store_set_max_read(m3_resp_store *s, size_t bytes) {
    pthread_mutex_lock(&s->mu);
    s->max_read = bytes;
    pthread_mutex_unlock(&s->mu);
}

static void entry_free(entry *x) {
    free(x->id);
    free(x->prev);
    text_unref(x->turn);
    text_unref(x->resp);
    text_unref(x->items);
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

static void age_unlink(m3_resp_store *s, entry *x) {
    if (x->older) x->older->newer = x->newer;
    else s->oldest = x->newer;
    if (x->newer) x->newer->older = x->older;
    else s->newest = x->older;
    x->older = x->newer = NULL;
}

static void age_push(m3_resp_store *s, entry *x) { /* as the newest */
    x->older = s->newest;
    x->newer = NULL;
    if (s->newest) s->newest->newer = x;
    else s->oldest = x;
    s->newest = x;
}

static void unlink_entry(m3_resp_store *s, entry **p) {
    entry *x = *p;
    *p = x->hnext;
    age_unlink(s, x);
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
    if (bytes > s->cap) {
        free(turn);
        free(resp);
        free(items);
        return 1;
    }
    entry *x = m3_fault_calloc(M3_FAULT_SERVER, 1, sizeof *x);
    text *tt = text_of(turn, turn_len), *rt = text_of(resp, resp_len), *it = items ? text_of(items, items_len) : NULL;
    if (!x || !tt || !rt || (items && !it) || !(x->id = dup_str(id)) || (prev && !(x->prev = dup_str(prev)))) {
        if (x) entry_free(x);
        text_unref(tt);
        text_unref(rt);
        text_unref(it);
        return -1;
    }
    x->turn = tt;
    x->resp = rt;
    x->items = it;
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
    age_push(s, x);
    s->n++;
    s->bytes += bytes;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int m3_resp_store_history(m3_resp_store *s, const char *id, json_t **msgs, char *missing, size_t cap) {
    *msgs = NULL;
    entry **chain = NULL;
    text **turns = NULL;
    size_t n = 0, cn = 0, total = 0;
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
        if ((total += x->turn->n) > s->max_read) { rc = 3; break; }
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
    if (!rc && !(turns = m3_fault_malloc(M3_FAULT_SERVER, (n ? n : 1) * sizeof *turns))) rc = -1;
    /* read: the conversation's responses become the newest, the first first and the last last */
    for (size_t i = n; !rc && i-- > 0;) {
        turns[i] = text_ref(chain[i]->turn);
        age_unlink(s, chain[i]);
        age_push(s, chain[i]);
    }
    pthread_mutex_unlock(&s->mu);
    free(chain);
    /* parsed outside the lock; the texts stay alive through their references */
    json_t *all = rc ? NULL : json_array();
    if (!rc && !all) rc = -1;
    for (size_t i = n; !rc && i-- > 0;) { /* the first response's turn first */
        json_error_t je;
        m3_fault_suspend(1); /* jansson's parser and failed allocations: see fault.h */
        json_t *t = json_loadb(turns[i]->p, turns[i]->n, 0, &je);
        m3_fault_suspend(0);
        if (!t || json_array_extend(all, t)) rc = -1; /* the texts were written by the server: only memory fails */
        json_decref(t);
    }
    for (size_t i = 0; turns && i < n; i++) text_unref(turns[i]);
    free(turns);
    if (rc) json_decref(all);
    else *msgs = all;
    return rc;
}

/* a copy of one of response id's texts (items: its input items, else the response), made
 * outside the lock */
static char *get_text(m3_resp_store *s, const char *id, int items, size_t *len, int *oom) {
    *oom = 0;
    pthread_mutex_lock(&s->mu);
    entry *x = *slot(s, id);
    text *t = !x ? NULL : text_ref(items ? x->items : x->resp);
    pthread_mutex_unlock(&s->mu);
    if (!x) return NULL;
    const char *p = t ? t->p : "[]"; /* stored without items: none */
    size_t n = t ? t->n : 2;
    char *r = m3_fault_malloc(M3_FAULT_SERVER, n + 1);
    if (r) {
        memcpy(r, p, n);
        r[n] = 0;
        *len = n;
    } else *oom = 1;
    text_unref(t);
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
