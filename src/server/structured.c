/* m3 serve: structured outputs (response_format, guided_json / _regex / _choice /
 * structured_outputs, forced tool calls) compiled for the engine, on the preparation threads
 * (prep.c).
 *
 * The grammar vocabulary is made once, at the first constrained request: every id of the
 * model's vocabulary with the bytes it decodes to (m3_tok_id_bytes); special tokens, the
 * reasoning tags and ids no token spells are empty (never allowed inside a constrained
 * output); the end ids are the tokenizer's EOS and the model config's. Compiled grammars are
 * cached by their text (the compact schema, or the tools + the forced function + the call
 * limit): a schema seen before costs a lookup. The cache holds SRV_GRAMMAR_CACHE of them,
 * least recently used out first (requests still running keep theirs: refcounted).
 *
 * A compile walks the vocabulary once per automaton state (tens to hundreds of ms for a large
 * schema at a 200K vocabulary, paid by the first request of that schema): with half the machine's
 * CPUs (2..8) it runs on a pool of that many threads, one compile at a time (another compiles
 * alone meanwhile). On a smaller machine, or when the threads cannot be made, it runs on the
 * preparation thread. */
#include "srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/pool.h"

#define SRV_GRAMMAR_CACHE 64
/* A compile walks the vocabulary once per state: ~0.1-1 ms a state at a 150K vocabulary, 2-25 KB
 * of masks a state; the automaton itself ~50 us a state for patterns whose states hold many NFA
 * states. Bigger grammars (a pattern like (.{1000}|x.{999}|...)) fail while they are built (in
 * at most ~2.5 s): refused, not compiled for minutes. The largest tool or schema grammars of the
 * tests have ~3,500 states. */
#define SRV_GRAMMAR_MAX_STATES 50000

typedef struct gentry {
    char *key;
    size_t klen;
    m3_engine_grammar *eg;
    uint64_t used;
} gentry;

struct srv_grammars {
    pthread_mutex_t mu;
    m3_grammar_vocab *v;
    int v_failed;
    char v_err[256];
    gentry ent[SRV_GRAMMAR_CACHE];
    int n;
    uint64_t clock;
    uint64_t hits, compiled;
    pthread_mutex_t pool_mu; /* held by the compile using the pool */
    m3_pool *pool;
    int pool_tried;
};

int srv_grammars_init(srv *s) {
    s->gram = calloc(1, sizeof *s->gram);
    if (!s->gram) return -1;
    pthread_mutex_init(&s->gram->mu, NULL);
    pthread_mutex_init(&s->gram->pool_mu, NULL);
    return 0;
}

void srv_grammars_free(srv *s) {
    struct srv_grammars *G = s->gram;
    if (!G) return;
    for (int i = 0; i < G->n; i++) {
        m3_engine_grammar_release(G->ent[i].eg);
        free(G->ent[i].key);
    }
    /* grammars still held by the engine's requests (the engine outlives the server) only free
     * themselves: nothing reads the vocabulary once the engine thread has stopped */
    m3_grammar_vocab_free(G->v);
    m3_pool_free(G->pool);
    pthread_mutex_destroy(&G->pool_mu);
    pthread_mutex_destroy(&G->mu);
    free(G);
    s->gram = NULL;
}

/* under G->mu */
static m3_grammar_vocab *vocab_get(srv *s, m3_err *err) {
    struct srv_grammars *G = s->gram;
    if (G->v || G->v_failed) {
        if (!G->v) m3_errf(err, "%s", G->v_err);
        return G->v;
    }
    int32_t n = s->vocab;
    const char **bytes = calloc((size_t)n, sizeof *bytes);
    uint32_t *lens = calloc((size_t)n, sizeof *lens);
    if (!bytes || !lens) {
        free(bytes);
        free(lens);
        m3_errf(err, "out of memory");
        return NULL;
    }
    for (int32_t id = 0; id < s->n_text && id < n; id++) {
        size_t len;
        const char *b = m3_tok_id_bytes(s->tok, id, &len);
        if (!b || !len || m3_tok_is_special(s->tok, id)) continue;
        if ((len == 10 && !memcmp(b, "<mm:think>", 10)) || (len == 11 && !memcmp(b, "</mm:think>", 11))) continue;
        bytes[id] = b;
        lens[id] = (uint32_t)len;
    }
    int32_t eos[2];
    int n_eos = 0;
    int32_t te = m3_tok_eos_id(s->tok);
    if (te >= 0 && te < n) eos[n_eos++] = te;
    if (s->o->eos_id >= 0 && s->o->eos_id < n && s->o->eos_id != te) eos[n_eos++] = s->o->eos_id;
    G->v = m3_grammar_vocab_new(n, bytes, lens, eos, n_eos, err);
    free(bytes);
    free(lens);
    if (!G->v) {
        G->v_failed = 1;
        snprintf(G->v_err, sizeof G->v_err, "%s", err->msg);
    }
    return G->v;
}

/* the cached grammar of key (a new reference), or NULL; under G->mu */
static m3_engine_grammar *lookup(struct srv_grammars *G, const char *key, size_t klen) {
    for (int i = 0; i < G->n; i++)
        if (G->ent[i].klen == klen && !memcmp(G->ent[i].key, key, klen)) {
            G->ent[i].used = ++G->clock;
            m3_engine_grammar_retain(G->ent[i].eg);
            G->hits++;
            return G->ent[i].eg;
        }
    return NULL;
}

/* keeps eg under key (takes the key; the cache takes its own reference of eg); under G->mu */
static void insert(struct srv_grammars *G, char *key, size_t klen, m3_engine_grammar *eg) {
    int at = G->n;
    if (G->n == SRV_GRAMMAR_CACHE) { /* the least recently used goes */
        at = 0;
        for (int i = 1; i < G->n; i++)
            if (G->ent[i].used < G->ent[at].used) at = i;
        m3_engine_grammar_release(G->ent[at].eg);
        free(G->ent[at].key);
    } else G->n++;
    m3_engine_grammar_retain(eg);
    G->ent[at] = (gentry){key, klen, eg, ++G->clock};
}

/* the compile pool (made at the first compile), or NULL: compile on this thread; under pool_mu */
static m3_pool *compile_pool(struct srv_grammars *G) {
    if (!G->pool_tried) {
        G->pool_tried = 1;
        long n = sysconf(_SC_NPROCESSORS_ONLN) / 2;
        if (n > 8) n = 8;
        if (n >= 2) G->pool = m3_pool_create((int)n); /* NULL (no threads): serial, slower but the same */
    }
    return G->pool;
}

/* memory is the server's (500), told by the error's kind: the message quotes the request's schema,
 * pattern or grammar (a property named "out of memory"), which says nothing of the server */
static int compile_error(m3_oai_error *e, const char *param, const m3_err *err) {
    if (err->oom) return m3_oai_errorf(e, 500, "server_error", param, "%s", err->msg);
    return m3_oai_errorf(e, 400, "invalid_request_error", param, "%s", err->msg);
}

/* the grammar of a choices array (compact JSON, checked by openai.c) */
static m3_grammar *choice_grammar(const char *text, const m3_grammar_opts *o, m3_err *err) {
    json_t *a = json_loads(text, 0, NULL);
    size_t n = json_array_size(a);
    const char **t = calloc(n ? n : 1, sizeof *t);
    size_t *l = calloc(n ? n : 1, sizeof *l);
    m3_grammar *g = NULL;
    if (!a || !t || !l) m3_errf(err, "out of memory");
    else {
        for (size_t i = 0; i < n; i++) {
            t[i] = json_string_value(json_array_get(a, i));
            l[i] = json_string_length(json_array_get(a, i));
        }
        g = m3_grammar_from_choices(t, l, (int)n, o, err);
    }
    free(t);
    free(l);
    json_decref(a);
    return g;
}

int srv_structured(srv *s, m3_oai_params *g, m3_oai_error *e) {
    if (!g->constraint) return 0;
    struct srv_grammars *G = s->gram;
    const char *param = g->constraint_param ? g->constraint_param : "response_format";
    /* the key: what the grammar is made of */
    m3_sbuf key = {0};
    char *tools_text = NULL;
    int max_calls = g->parallel_tool_calls ? 0 : 1, bad = 0;
    if (g->constraint == M3_OAI_C_JSON_OBJECT) bad |= m3_sbuf_str(&key, "O");
    else if (g->constraint == M3_OAI_C_JSON_SCHEMA) bad |= m3_sbuf_str(&key, "S") | m3_sbuf_str(&key, g->constraint_text);
    else if (g->constraint == M3_OAI_C_REGEX) bad |= m3_sbuf_str(&key, "R") | m3_sbuf_str(&key, g->constraint_text);
    else if (g->constraint == M3_OAI_C_CHOICE) bad |= m3_sbuf_str(&key, "C") | m3_sbuf_str(&key, g->constraint_text);
    else if (g->constraint == M3_OAI_C_GRAMMAR) bad |= m3_sbuf_str(&key, "G") | m3_sbuf_str(&key, g->constraint_text);
    else {
        char head[64];
        tools_text = srv_json_text(g->tools, NULL);
        snprintf(head, sizeof head, "%c%d:", g->constraint == M3_OAI_C_TOOLS_AUTO ? 'A' : 'T', max_calls);
        bad |= !tools_text || m3_sbuf_str(&key, head) || m3_sbuf_str(&key, g->tool_name ? g->tool_name : "") ||
               m3_sbuf_add(&key, "", 1) || m3_sbuf_str(&key, tools_text);
    }
    free(tools_text);
    if (bad) {
        free(key.p);
        return m3_oai_errorf(e, 500, "server_error", NULL, "out of memory");
    }
    m3_err err = {0};
    pthread_mutex_lock(&G->mu);
    m3_grammar_vocab *v = vocab_get(s, &err);
    m3_engine_grammar *eg = v ? lookup(G, key.p, key.n) : NULL;
    pthread_mutex_unlock(&G->mu);
    if (!v) {
        free(key.p);
        return m3_oai_errorf(e, 500, "server_error", param, "structured output: the grammar vocabulary: %s", err.msg);
    }
    if (eg) {
        free(key.p);
        g->grammar = eg;
        return 0;
    }
    /* compiled outside the lock (another thread may compile the same text meanwhile: the first
     * one kept wins) */
    m3_grammar *gr = NULL;
    m3_grammar_opts o;
    m3_grammar_opts_default(&o);
    o.max_states = SRV_GRAMMAR_MAX_STATES; /* a bigger one fails while it is built, before its masks */
    m3_fault_suspend(1); /* the schema compiler parses with jansson (fault.h: no injection there) */
    if (g->constraint == M3_OAI_C_JSON_OBJECT) gr = m3_grammar_json(&o, &err);
    else if (g->constraint == M3_OAI_C_JSON_SCHEMA) gr = m3_grammar_from_schema(g->constraint_text, strlen(g->constraint_text), &o, &err);
    else if (g->constraint == M3_OAI_C_REGEX) gr = m3_grammar_from_regex(g->constraint_text, strlen(g->constraint_text), &o, &err);
    else if (g->constraint == M3_OAI_C_CHOICE) gr = choice_grammar(g->constraint_text, &o, &err);
    else if (g->constraint == M3_OAI_C_GRAMMAR) gr = m3_grammar_from_gbnf(g->constraint_text, strlen(g->constraint_text), &o, &err);
    else if (g->constraint == M3_OAI_C_TOOLS_AUTO) gr = m3_tool_call_grammar_auto(g->tools, max_calls, &o, &err);
    else gr = m3_tool_call_grammar(g->tools, g->tool_name, max_calls, &o, &err);
    m3_fault_suspend(0);
    /* the served state limit (the automaton's own limits and the request's words do not count) */
    if (!gr && err.over_limit) m3_err_prefix(&err, "structured output: served grammars have at most %d automaton states", SRV_GRAMMAR_MAX_STATES);
    int pooled = gr && pthread_mutex_trylock(&G->pool_mu) == 0;
    m3_grammar_compiled *gc = gr ? m3_grammar_compile(gr, v, pooled ? compile_pool(G) : NULL, &err) : NULL;
    if (pooled) pthread_mutex_unlock(&G->pool_mu);
    if (!gc) {
        m3_grammar_free(gr);
        free(key.p);
        return compile_error(e, param, &err);
    }
    eg = m3_engine_grammar_new(gr, gc, &err);
    if (!eg) {
        free(key.p);
        return m3_oai_errorf(e, 500, "server_error", NULL, "%s", err.msg);
    }
    pthread_mutex_lock(&G->mu);
    m3_engine_grammar *had = lookup(G, key.p, key.n);
    if (had) {
        m3_engine_grammar_release(eg);
        eg = had;
        free(key.p);
    } else {
        insert(G, key.p, key.n, eg);
        G->compiled++;
    }
    pthread_mutex_unlock(&G->mu);
    g->grammar = eg;
    return 0;
}

void srv_grammar_stats(srv *s, uint64_t *compiled, uint64_t *hits) {
    struct srv_grammars *G = s->gram;
    *compiled = *hits = 0;
    if (!G) return;
    pthread_mutex_lock(&G->mu);
    *compiled = G->compiled;
    *hits = G->hits;
    pthread_mutex_unlock(&G->mu);
}
