/* libFuzzer: the OpenAI request parser of m3 serve (src/server/openai.h), on a byte-level
 * tokenizer with the MiniMax-M3 chat tokens and the built-in MiniMax-M3 chat template, and the
 * translations into it of Anthropic's Messages requests (anthropic.h) and OpenAI's Responses
 * requests (responses.h).
 * Input: byte 0 picks the endpoint (bit 0: chat), whether a model name is required (bit 1),
 * the context length (bits 2-3), whether an allocation fails (bit 4: then byte 1 says which)
 * and the API (bits 5-6: 0 OpenAI, 1 Anthropic, 2 Responses, 3 Responses continuing a stored
 * conversation); the rest is the request body. Checked: never a crash or a leak; a translated
 * request is a chat request whose translation parts (the Responses echo and turn) are there;
 * an accepted request
 * obeys every limit (choices, prompts of a batch, each prompt within the context, ids in the
 * vocabulary, min_tokens <= max_tokens, ...);
 * a refused one has a status of 400 / 404 / 500, a type, and a non-empty message that is
 * valid UTF-8. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "base/fault.h"
#include "server/anthropic.h"
#include "server/openai.h"
#include "server/responses.h"

#include "bytetok.h"

static m3_tok *tok;
static m3_chat *chat;

static int valid_utf8(const char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n) {
        int k = m3_utf8_len((const uint8_t *)s + i, n - i);
        if (k <= 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

static void check_error(const m3_oai_error *e, int rc) {
    if (rc != e->status || (rc != 400 && rc != 404 && rc != 500)) abort();
    if (!e->type || !e->message[0] || !valid_utf8(e->message) || !valid_utf8(e->param)) abort();
    json_t *m = json_string(e->message); /* what the server sends must be a JSON string */
    if (!m && !m3_fault_armed(M3_FAULT_SERVER)) abort();
    json_decref(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) {
        m3_err err;
        char *tj = m3_test_bytetok_json();
        if (!tj || !(tok = m3_tok_load_json(tj, strlen(tj), &err))) abort();
        free(tj);
        if (!(chat = m3_chat_builtin_minimax(&err))) abort();
        m3_fault_json_hook(1); /* jansson's allocations count as the server's (disarmed: plain malloc) */
    }
    if (size < 2) return 0;
    const uint8_t ctl = data[0], nth = data[1];
    data += 2, size -= 2;
    static const int MML[4] = {8, 64, 512, 1 << 20};
    /* (nth, the failing allocation when ctl & 16, picks the server-wide defaults otherwise) */
    const int free_nth = !(ctl & 16);
    m3_oai_ctx c = {tok, chat, m3_tok_n_vocab(tok), (ctl & 2) ? "m3-test" : NULL, NULL, MML[(ctl >> 2) & 3], 1, 1, NULL, NULL, ctl >> 7, -1, 0, 0,
                    free_nth && (nth & 1), free_nth && (nth & 2), 0};
    const int is_chat = (ctl & 1) || ((ctl >> 5) & 3); /* translated requests are chat requests */
    if (ctl & 16) m3_fault_arm(M3_FAULT_SERVER, 1 + nth, 1, 1);
    m3_oai_error e;
    json_t *body = NULL;
    int rc = m3_oai_parse_body((const char *)data, size, &body, &e);
    const int api = (ctl >> 5) & 3;
    m3_resp_req rr = {0};
    if (!rc && api) { /* the other APIs' requests, spelled as the chat request that means the same */
        json_t *oai = NULL, *history = NULL;
        if (api == 3) { /* a stored conversation: what m3_resp_store_history hands over */
            json_error_t je;
            history = json_loads("[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Yo\","
                                 "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                                 "\"arguments\":\"{}\"}}]}]", 0, &je);
            if (!history && !m3_fault_armed(M3_FAULT_SERVER)) abort();
        }
        rc = api == 1 ? m3_anth_to_oai(body, 0, &oai, &e) : m3_resp_to_oai(body, history, &oai, &rr, &e);
        json_decref(history);
        if (!rc && (!json_is_object(oai) || !json_is_array(json_object_get(oai, "messages")))) abort();
        if (!rc && api >= 2 && (!json_is_object(rr.echo) || !json_is_array(rr.turn) ||
                                json_array_size(rr.turn) > json_array_size(json_object_get(oai, "messages"))))
            abort();
        json_decref(body);
        body = oai;
    }
    if (rc) check_error(&e, rc);
    else {
        m3_oai_params g;
        rc = m3_oai_parse_generate(&c, body, is_chat, &g, &e);
        if (rc) check_error(&e, rc);
        else {
            long long mml = c.max_model_len;
            if (g.n_prompts < 1 || g.n_prompts > M3_OAI_MAX_PROMPTS || (is_chat && g.n_prompts != 1) ||
                g.n * g.n_prompts > M3_OAI_MAX_CHOICES || g.prompt_off[0] != 0 || g.prompt_off[g.n_prompts] != g.n_ids)
                abort();
            for (int p = 0; p < g.n_prompts; p++) { /* every prompt non-empty and within the context */
                long long len = (long long)(g.prompt_off[p + 1] - g.prompt_off[p]);
                if (len < 1 || len > mml || (len == mml && g.max_tokens > 0) || len + g.max_tokens > mml) abort();
                if (g.echo && !is_chat && g.echo_off[p + 1] < g.echo_off[p]) abort();
            }
            /* max_tokens 0 only with echo (the prompt alone); prompt logprobs 0..20, not in a stream but echo's */
            if (g.max_tokens < (g.echo && !is_chat ? 0 : 1) || g.prompt_logprobs < -1 ||
                g.prompt_logprobs > M3_SAMPLE_MAX_TOP_LOGPROBS || (g.prompt_logprobs >= 0 && g.stream && !(g.echo && g.logprobs)))
                abort();
            if (g.n < 1 || g.n > M3_OAI_MAX_N || !g.n_ids || g.min_tokens < 0 || g.min_tokens > g.max_tokens ||
                g.top_logprobs < 0 || g.top_logprobs > M3_SAMPLE_MAX_TOP_LOGPROBS || g.n_stop_strs > M3_OAI_MAX_STOP ||
                g.n_stop_ids > M3_OAI_MAX_STOP_IDS + 1 || g.n_bias > M3_OAI_MAX_LOGIT_BIAS ||
                !(g.temperature >= 0 && g.temperature <= 2) || !(g.top_p >= 0 && g.top_p <= 1))
                abort();
            for (size_t i = 0; i < g.n_ids; i++)
                if (g.ids[i] < 0 || g.ids[i] >= c.vocab) abort();
            for (size_t i = 0; i < g.n_stop_ids; i++)
                if (g.stop_ids[i] < 0 || g.stop_ids[i] >= c.vocab) abort();
            for (int i = 0; i < g.n_bias; i++)
                if (g.bias[i].token < 0 || g.bias[i].token >= c.vocab || !(g.bias[i].bias >= -100 && g.bias[i].bias <= 100))
                    abort();
            for (int i = 0; i < g.n_stop_strs; i++)
                if (!g.stop_strs[i] || !g.stop_strs[i][0]) abort();
            /* chat's echo (vLLM's): one prompt's text, the last message's, or none */
            if (is_chat && g.echo && (g.echo_off[0] != 0 || g.echo_off[1] != g.echo_len || (g.echo_len && !g.echo_text)))
                abort();
            /* a reasoning budget: >= 0, its tags in the vocabulary, read from within the prompt */
            if (g.think_on && (g.think_budget < 0 || g.think_open < 0 || g.think_open >= c.vocab || g.think_close < 0 ||
                               g.think_close >= c.vocab || g.think_from < 0 || (size_t)g.think_from >= g.n_ids))
                abort();
            /* vLLM's extras: allowed ids in the vocabulary (none: NULL), prompts within a truncation,
             * a priority only under the priority policy, a request_id that can name a response */
            if ((g.n_allowed > 0) != (g.allowed != NULL) || g.truncate < 0 || (g.priority && !c.priority_policy)) abort();
            /* the server-wide defaults: forced usage on every stream; token ids as tokens unless the
             * request (not translated from another API) says false */
            if (c.force_usage && !g.include_usage) abort();
            const json_t *rt = json_object_get(body, "return_tokens_as_token_ids");
            if (c.ids_as_tokens && !g.ids_as_tokens && !json_is_false(rt)) abort();
            for (size_t i = 0; i < g.n_allowed; i++)
                if (g.allowed[i] < 0 || g.allowed[i] >= c.vocab) abort();
            for (int p = 0; g.truncate && p < g.n_prompts; p++)
                if ((long long)(g.prompt_off[p + 1] - g.prompt_off[p]) > g.truncate) abort();
            for (const char *q = g.request_id; *q; q++)
                if (*q <= 0x20 || *q >= 0x7f) abort();
            if (g.cache_salt && !g.cache_salt_len) abort();
        }
        m3_oai_params_free(&g);
    }
    m3_resp_req_free(&rr);
    json_decref(body);
    m3_fault_disarm(M3_FAULT_SERVER);
    return 0;
}
