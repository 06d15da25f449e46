/* OpenAI Responses requests translated without HTTP (src/server/responses.h), and the store of
 * responses (src/server/resp_store.h):
 *   1. accepted requests become the chat request that means the same (compared whole), with
 *      the turn, the echoed fields and the flags the response needs;
 *   2. refused ones get a 400 naming the field at fault;
 *   3. allocation failure at every point of each accepted translation: the same result as
 *      without the failure, or a clean 500, with nothing leaked (jansson's allocations are
 *      counted here, besides ASan's leak check);
 *   4. the store: put / get / history / delete, the oldest evicted past the budget, allocation
 *      failures, the chain limit, and threads on distinct ids (race-free by construction).
 * The JSON in the tables is written with ' for " (load()).
 * Usage: test_responses */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "server/resp_store.h"
#include "server/responses.h"

#include "../check.h"

/* jansson's allocations: counted (live), and failing where the server module is armed */
static atomic_long live;
static void *count_malloc(size_t n) {
    if (m3_fault_hit(M3_FAULT_SERVER)) return NULL;
    void *p = malloc(n);
    if (p) atomic_fetch_add(&live, 1);
    return p;
}
static void count_free(void *p) {
    if (p) atomic_fetch_sub(&live, 1);
    free(p);
}

/* JSON text with ' for " (\\' for an escaped quote inside a string) */
static json_t *load(const char *s) {
    if (!s) return NULL;
    char *t = strdup(s);
    for (char *c = t; *c; c++)
        if (*c == '\'') *c = '"';
    json_error_t je;
    json_t *j = json_loads(t, JSON_DECODE_ANY, &je);
    if (!j) fprintf(stderr, "test JSON does not parse: %s: %s\n", je.text, t);
    free(t);
    return j;
}

/* JSON text for a message (freed with count_free: jansson made it) */
static char *dump(json_t *j) { return j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL; }

/* CHECK that got equals want, printing both */
#define CHECK_JSON(got, want, ...)                                                                   \
    do {                                                                                             \
        int eq_ = (got) && (want) && json_equal((got), (want));                                      \
        if (!eq_) {                                                                                  \
            char *g_ = dump(got), *w_ = dump(want);                                                  \
            CHECK(eq_, __VA_ARGS__);                                                                 \
            fprintf(stderr, "  got:  %s\n  want: %s\n", g_ ? g_ : "(none)", w_ ? w_ : "(none)");     \
            count_free(g_);                                                                                \
            count_free(w_);                                                                                \
        }                                                                                            \
    } while (0)

/* ------------------------------------------------------------------ 1. translations */

/* in (+ hist: previous_response_id's conversation) -> want; the turn is want's messages after
 * the instructions and the history; echo (when given) the whole echoed object */
static const struct {
    const char *in, *hist, *want, *echo;
    int store, logprobs;
    const char *prev;
} OK[] = {
    /* 0: input as a string; every echoed field at its default */
    {"{'model':'m','input':'hi'}", NULL, "{'model':'m','messages':[{'role':'user','content':'hi'}]}",
     "{'instructions':null,'max_output_tokens':null,'temperature':null,'top_p':null,'user':null,'prompt_cache_key':null,"
     "'safety_identifier':null,'previous_response_id':null,'metadata':{},'parallel_tool_calls':true,'store':true,"
     "'background':false,'truncation':'disabled','service_tier':'default','top_logprobs':0,'tools':[],'tool_choice':'auto',"
     "'text':{'format':{'type':'text'},'verbosity':'medium'},'reasoning':{'effort':null,'summary':null}}",
     1, 0, NULL},
    /* 1: messages of every role, content as a string and as parts (input_text, input_image,
     * output_text, refusal); instructions first; the pass-through fields, max_output_tokens;
     * store false; the checked-and-kept fields; background false; unknown fields ignored */
    {"{'model':'m','instructions':'be brief','input':["
     "{'role':'system','content':'sys'},"
     "{'type':'message','role':'developer','content':[{'type':'input_text','text':'dev'}]},"
     "{'role':'user','content':[{'type':'input_text','text':'look'},{'type':'input_image','image_url':'https://x/y.png',"
     "'detail':'high'}]},"
     "{'type':'message','role':'assistant','content':[{'type':'output_text','text':'a cat','annotations':[]},"
     "{'type':'refusal','refusal':'no more'}]},"
     "{'role':'user','content':'thanks'}],"
     "'stream':true,'temperature':0.5,'top_p':0.9,'parallel_tool_calls':false,'max_output_tokens':77,'top_k':5,'min_p':0.1,"
     "'repetition_penalty':1.1,'presence_penalty':0.2,'frequency_penalty':0.3,'seed':42,'stop':['x'],'ignore_eos':true,"
     "'min_tokens':3,'user':'u1','store':false,'metadata':{'k':'v'},'truncation':'auto','service_tier':'auto',"
     "'prompt_cache_key':'pk','safety_identifier':'si','unknown_field':1,'top_logprobs':4,'background':false}",
     NULL,
     "{'model':'m','stream':true,'temperature':0.5,'top_p':0.9,'parallel_tool_calls':false,'max_tokens':77,'top_k':5,"
     "'min_p':0.1,'repetition_penalty':1.1,'presence_penalty':0.2,'frequency_penalty':0.3,'seed':42,'stop':['x'],"
     "'ignore_eos':true,'min_tokens':3,'messages':["
     "{'role':'system','content':'be brief'},"
     "{'role':'system','content':'sys'},"
     "{'role':'developer','content':[{'type':'text','text':'dev'}]},"
     "{'role':'user','content':[{'type':'text','text':'look'},{'type':'image_url','image_url':{'url':'https://x/y.png'}}]},"
     "{'role':'assistant','content':[{'type':'text','text':'a cat'},{'type':'text','text':'no more'}]},"
     "{'role':'user','content':'thanks'}]}",
     "{'instructions':'be brief','max_output_tokens':77,'temperature':0.5,'top_p':0.9,'user':'u1','prompt_cache_key':'pk',"
     "'safety_identifier':'si','previous_response_id':null,'metadata':{'k':'v'},'parallel_tool_calls':false,'store':false,"
     "'background':false,'truncation':'auto','service_tier':'auto','top_logprobs':4,'tools':[],'tool_choice':'auto',"
     "'text':{'format':{'type':'text'},'verbosity':'medium'},'reasoning':{'effort':null,'summary':null}}",
     0, 0, NULL},
    /* 2: reasoning (content), an assistant message and calls in a row: one assistant message;
     * the outputs (a string, parts) as tool messages; reasoning (summary only) and a call, then
     * an assistant message after the calls: a new message */
    {"{'model':'m','input':["
     "{'role':'user','content':'weather?'},"
     "{'type':'reasoning','id':'rs_1','summary':[],'content':[{'type':'reasoning_text','text':'think1'},"
     "{'type':'reasoning_text','text':'think2'}]},"
     "{'type':'message','role':'assistant','content':[{'type':'output_text','text':'checking'}]},"
     "{'type':'function_call','call_id':'c1','name':'w','arguments':'{\\'city\\':\\'P\\'}'},"
     "{'type':'function_call','id':'fc_2','call_id':'c2','name':'w','arguments':'{\\'city\\':\\'L\\'}','status':'completed'},"
     "{'type':'function_call_output','call_id':'c1','output':'sunny'},"
     "{'type':'function_call_output','call_id':'c2','output':[{'type':'input_text','text':'rain'},"
     "{'type':'input_image','image_url':'data:image/png;base64,QUJD'}]},"
     "{'type':'reasoning','summary':[{'type':'summary_text','text':'s1'},{'type':'summary_text','text':'s2'}]},"
     "{'type':'function_call','call_id':'c3','name':'v','arguments':'{}'},"
     "{'type':'message','role':'assistant','content':'done'}]}",
     NULL,
     "{'model':'m','messages':["
     "{'role':'user','content':'weather?'},"
     "{'role':'assistant','reasoning_content':'think1\\n\\nthink2','content':[{'type':'text','text':'checking'}],"
     "'tool_calls':[{'id':'c1','type':'function','function':{'name':'w','arguments':'{\\'city\\':\\'P\\'}'}},"
     "{'id':'c2','type':'function','function':{'name':'w','arguments':'{\\'city\\':\\'L\\'}'}}]},"
     "{'role':'tool','tool_call_id':'c1','content':'sunny'},"
     "{'role':'tool','tool_call_id':'c2','content':[{'type':'text','text':'rain'},"
     "{'type':'image_url','image_url':{'url':'data:image/png;base64,QUJD'}}]},"
     "{'role':'assistant','reasoning_content':'s1\\n\\ns2','content':[],"
     "'tool_calls':[{'id':'c3','type':'function','function':{'name':'v','arguments':'{}'}}]},"
     "{'role':'assistant','content':[{'type':'text','text':'done'}]}]}",
     NULL, 1, 0, NULL},
    /* 3: reasoning after an assistant's text: the next step's (a new message) */
    {"{'model':'m','input':[{'role':'user','content':'q'},{'role':'assistant','content':'a'},"
     "{'type':'reasoning','summary':[{'type':'summary_text','text':'r'}]},{'role':'assistant','content':'b'}]}",
     NULL,
     "{'model':'m','messages':[{'role':'user','content':'q'},{'role':'assistant','content':[{'type':'text','text':'a'}]},"
     "{'role':'assistant','reasoning_content':'r','content':[{'type':'text','text':'b'}]}]}",
     NULL, 1, 0, NULL},
    /* 4: previous_response_id's conversation after the instructions, before the new input */
    {"{'model':'m','instructions':'sys!','previous_response_id':'resp_1','input':[{'role':'user','content':'again'}]}",
     "[{'role':'user','content':'first'},{'role':'assistant','content':[{'type':'text','text':'one'}]}]",
     "{'model':'m','messages':[{'role':'system','content':'sys!'},{'role':'user','content':'first'},"
     "{'role':'assistant','content':[{'type':'text','text':'one'}]},{'role':'user','content':'again'}]}",
     NULL, 1, 0, "resp_1"},
    /* 5: function tools (description / parameters / strict only when given, strict only when
     * true), tool_choice a string */
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a','description':'da','parameters':{'type':'object',"
     "'properties':{}},'strict':true},{'type':'function','name':'b','strict':false},{'type':'function','name':'c',"
     "'parameters':{'type':'object'}}],'tool_choice':'required'}",
     NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'tools':["
     "{'type':'function','function':{'name':'a','description':'da','parameters':{'type':'object','properties':{}},'strict':true}},"
     "{'type':'function','function':{'name':'b'}},{'type':'function','function':{'name':'c','parameters':{'type':'object'}}}],"
     "'tool_choice':'required'}",
     NULL, 1, 0, NULL},
    /* 6, 7: tool_choice "none", {type: function, name} */
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a'}],'tool_choice':'none'}", NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'tools':[{'type':'function','function':{'name':'a'}}],"
     "'tool_choice':'none'}",
     NULL, 1, 0, NULL},
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a'},{'type':'function','name':'b'}],"
     "'tool_choice':{'type':'function','name':'b'}}",
     NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'tools':[{'type':'function','function':{'name':'a'}},"
     "{'type':'function','function':{'name':'b'}}],'tool_choice':{'type':'function','function':{'name':'b'}}}",
     NULL, 1, 0, NULL},
    /* 8, 9: allowed_tools: the tools cut to those named (in the tools' order), the mode the choice;
     * the echo keeps tools and tool_choice as the request gave them */
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a'},{'type':'function','name':'b'},"
     "{'type':'function','name':'c'}],'tool_choice':{'type':'allowed_tools','mode':'required','tools':["
     "{'type':'function','name':'c'},{'type':'function','name':'a'}]}}",
     NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'tools':[{'type':'function','function':{'name':'a'}},"
     "{'type':'function','function':{'name':'c'}}],'tool_choice':'required'}",
     "{'instructions':null,'max_output_tokens':null,'temperature':null,'top_p':null,'user':null,'prompt_cache_key':null,"
     "'safety_identifier':null,'previous_response_id':null,'metadata':{},'parallel_tool_calls':true,'store':true,"
     "'background':false,'truncation':'disabled','service_tier':'default','top_logprobs':0,"
     "'tools':[{'type':'function','name':'a'},{'type':'function','name':'b'},{'type':'function','name':'c'}],"
     "'tool_choice':{'type':'allowed_tools','mode':'required','tools':[{'type':'function','name':'c'},"
     "{'type':'function','name':'a'}]},'text':{'format':{'type':'text'},'verbosity':'medium'},"
     "'reasoning':{'effort':null,'summary':null}}",
     1, 0, NULL},
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a'},{'type':'function','name':'b'}],"
     "'tool_choice':{'type':'allowed_tools','mode':'auto','tools':[{'name':'b'}]}}",
     NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'tools':[{'type':'function','function':{'name':'b'}}],"
     "'tool_choice':'auto'}",
     NULL, 1, 0, NULL},
    /* 10-13: text.format json_object, json_schema (name defaults to "output"; name, strict,
     * description kept), text (nothing) */
    {"{'model':'m','input':'x','text':{'format':{'type':'json_object'},'verbosity':'low'}}", NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'response_format':{'type':'json_object'}}", NULL, 1, 0, NULL},
    {"{'model':'m','input':'x','text':{'format':{'type':'json_schema','schema':{'type':'object'}}}}", NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'response_format':{'type':'json_schema','json_schema':"
     "{'name':'output','schema':{'type':'object'}}}}",
     NULL, 1, 0, NULL},
    {"{'model':'m','input':'x','text':{'format':{'type':'json_schema','name':'pt','schema':{'type':'array'},'strict':false,"
     "'description':'d'}}}",
     NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'response_format':{'type':'json_schema','json_schema':"
     "{'name':'pt','schema':{'type':'array'},'strict':false,'description':'d'}}}",
     NULL, 1, 0, NULL},
    {"{'model':'m','input':'x','text':{'format':{'type':'text'},'verbosity':'high'}}", NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}]}",
     "{'instructions':null,'max_output_tokens':null,'temperature':null,'top_p':null,'user':null,'prompt_cache_key':null,"
     "'safety_identifier':null,'previous_response_id':null,'metadata':{},'parallel_tool_calls':true,'store':true,"
     "'background':false,'truncation':'disabled','service_tier':'default','top_logprobs':0,'tools':[],'tool_choice':'auto',"
     "'text':{'format':{'type':'text'},'verbosity':'high'},'reasoning':{'effort':null,'summary':null}}",
     1, 0, NULL},
    /* 14-17: reasoning.effort none -> thinking off, high / minimal -> on, a summary alone: nothing */
    {"{'model':'m','input':'x','reasoning':{'effort':'none','summary':'auto'}}", NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'chat_template_kwargs':{'thinking_mode':'disabled'}}",
     "{'instructions':null,'max_output_tokens':null,'temperature':null,'top_p':null,'user':null,'prompt_cache_key':null,"
     "'safety_identifier':null,'previous_response_id':null,'metadata':{},'parallel_tool_calls':true,'store':true,"
     "'background':false,'truncation':'disabled','service_tier':'default','top_logprobs':0,'tools':[],'tool_choice':'auto',"
     "'text':{'format':{'type':'text'},'verbosity':'medium'},'reasoning':{'effort':'none','summary':'auto'}}",
     1, 0, NULL},
    {"{'model':'m','input':'x','reasoning':{'effort':'high'}}", NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'chat_template_kwargs':{'thinking_mode':'enabled'}}", NULL, 1,
     0, NULL},
    {"{'model':'m','input':'x','reasoning':{'effort':'minimal','generate_summary':'concise'}}", NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'chat_template_kwargs':{'thinking_mode':'enabled'}}", NULL, 1,
     0, NULL},
    {"{'model':'m','input':'x','reasoning':{'summary':'detailed'}}", NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}]}", NULL, 1, 0, NULL},
    /* 18-20: include logprobs -> logprobs + top_logprobs; encrypted reasoning: nothing; top_logprobs
     * without the include: not asked */
    {"{'model':'m','input':'x','include':['reasoning.encrypted_content','message.output_text.logprobs'],'top_logprobs':3}",
     NULL, "{'model':'m','messages':[{'role':'user','content':'x'}],'logprobs':true,'top_logprobs':3}", NULL, 1, 1, NULL},
    {"{'model':'m','input':'x','include':['reasoning.encrypted_content'],'store':true}", NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}]}", NULL, 1, 0, NULL},
    {"{'model':'m','input':'x','top_logprobs':3,'include':['message.output_text.logprobs']}", NULL,
     "{'model':'m','messages':[{'role':'user','content':'x'}],'logprobs':true,'top_logprobs':3}", NULL, 1, 1, NULL},
    /* 21: nulls are absent; an assistant message given as a string alone */
    {"{'model':'m','input':[{'role':'assistant','content':'pre'}],'instructions':null,'tools':null,'tool_choice':null,"
     "'text':null,'reasoning':null,'metadata':null,'previous_response_id':null,'include':null,'store':null}",
     NULL, "{'model':'m','messages':[{'role':'assistant','content':[{'type':'text','text':'pre'}]}]}", NULL, 1, 0, NULL},
    /* 22: a reasoning item with no text (encrypted_content only, as Codex-style clients send it back)
     * adds nothing: no empty assistant turn, and a call after it still joins the text before */
    {"{'model':'m','input':[{'role':'user','content':'q'},{'type':'reasoning','id':'rs_1','summary':[],"
     "'encrypted_content':'opaque'},{'role':'user','content':'again'},{'role':'assistant','content':'a'},"
     "{'type':'reasoning','summary':[{'type':'summary_text','text':''}]},{'type':'function_call','call_id':'c','name':'f',"
     "'arguments':'{}'}]}",
     NULL, "{'model':'m','messages':[{'role':'user','content':'q'},{'role':'user','content':'again'},{'role':'assistant',"
     "'content':[{'type':'text','text':'a'}],'tool_calls':[{'id':'c','type':'function','function':{'name':'f','arguments':'{}'}}]}]}",
     NULL, 1, 0, NULL},
};

/* the whole result of one translation */
typedef struct result {
    int rc;
    json_t *out;
    m3_resp_req r;
    m3_oai_error e;
} result;

static void translate(json_t *in, json_t *hist, result *x) {
    memset(x, 0, sizeof *x);
    x->rc = m3_resp_to_oai(in, hist, &x->out, &x->r, &x->e);
}

static void result_free(result *x) {
    json_decref(x->out);
    m3_resp_req_free(&x->r);
    x->out = NULL;
}

static int same_result(const result *a, const result *b) {
    return a->rc == b->rc && json_equal(a->out, b->out) && json_equal(a->r.turn, b->r.turn) &&
           json_equal(a->r.echo, b->r.echo) && a->r.store == b->r.store && a->r.logprobs == b->r.logprobs &&
           ((!a->r.previous_id && !b->r.previous_id) ||
            (a->r.previous_id && b->r.previous_id && !strcmp(a->r.previous_id, b->r.previous_id)));
}

static int translations(void) {
    int n = 0;
    for (size_t k = 0; k < sizeof OK / sizeof *OK; k++) {
        json_t *in = load(OK[k].in), *hist = load(OK[k].hist), *want = load(OK[k].want), *echo = load(OK[k].echo);
        result x;
        translate(in, hist, &x);
        CHECK(x.rc == 0, "request %zu: %d %s: %s", k, x.rc, x.e.param, x.e.message);
        if (!x.rc) {
            CHECK_JSON(x.out, want, "request %zu: the chat request", k);
            /* the turn: the new input only (no instructions, no history) */
            json_t *wm = json_object_get(want, "messages"), *turn = json_array();
            size_t skip = (json_is_string(json_object_get(in, "instructions")) ? 1 : 0) + json_array_size(hist);
            for (size_t i = skip; i < json_array_size(wm); i++) json_array_append(turn, json_array_get(wm, i));
            CHECK_JSON(x.r.turn, turn, "request %zu: the turn", k);
            json_decref(turn);
            if (echo) CHECK_JSON(x.r.echo, echo, "request %zu: the echoed fields", k);
            CHECK(json_is_object(x.r.echo) && json_is_boolean(json_object_get(x.r.echo, "store")) &&
                      json_is_true(json_object_get(x.r.echo, "store")) == OK[k].store,
                  "request %zu: echo.store", k);
            CHECK(x.r.store == OK[k].store, "request %zu: store %d (want %d)", k, x.r.store, OK[k].store);
            CHECK(x.r.logprobs == OK[k].logprobs, "request %zu: logprobs %d (want %d)", k, x.r.logprobs, OK[k].logprobs);
            const char *ep = json_string_value(json_object_get(x.r.echo, "previous_response_id"));
            CHECK(OK[k].prev ? x.r.previous_id && !strcmp(x.r.previous_id, OK[k].prev) && ep && !strcmp(ep, OK[k].prev)
                             : !x.r.previous_id && json_is_null(json_object_get(x.r.echo, "previous_response_id")),
                  "request %zu: previous_id %s (want %s)", k, x.r.previous_id ? x.r.previous_id : "(none)",
                  OK[k].prev ? OK[k].prev : "(none)");
            /* the results outlive the body and the history (references taken) */
            json_t *want_turn = json_deep_copy(x.r.turn), *want_out = json_deep_copy(x.out);
            json_decref(in);
            json_decref(hist);
            in = hist = NULL;
            CHECK(json_equal(x.out, want_out) && json_equal(x.r.turn, want_turn), "request %zu: results changed", k);
            json_decref(want_turn);
            json_decref(want_out);
            n++;
        }
        result_free(&x);
        json_decref(in);
        json_decref(hist);
        json_decref(want);
        json_decref(echo);
    }
    /* previous_response_id alone (before the history is looked up) */
    const char *id = "x";
    m3_oai_error e;
    json_t *b = load("{'previous_response_id':'resp_9','input':'x'}");
    CHECK(m3_resp_previous_id(b, &id, &e) == 0 && id && !strcmp(id, "resp_9"), "previous id: %s", id ? id : "(none)");
    json_decref(b);
    b = load("{'previous_response_id':null}");
    CHECK(m3_resp_previous_id(b, &id, &e) == 0 && !id, "previous id null: %s", id ? id : "(none)");
    json_decref(b);
    b = load("[1]");
    CHECK(m3_resp_previous_id(b, &id, &e) == 0 && !id, "previous id of an array");
    json_decref(b);
    const char *badids[] = {"{'previous_response_id':5}", "{'previous_response_id':''}", "{'previous_response_id':['a']}"};
    for (size_t i = 0; i < 3; i++) {
        b = load(badids[i]);
        int rc = m3_resp_previous_id(b, &id, &e);
        CHECK(rc == 400 && !id && !strcmp(e.param, "previous_response_id") && strstr(e.message, "response id"),
              "previous id %s: %d %s", badids[i], rc, e.message);
        json_decref(b);
    }
    return n;
}

/* ------------------------------------------------------------------ 2. refusals */

static const struct { const char *in, *param, *says; } BADS[] = {
    {"[]", "", "JSON object"},
    {"'x'", "", "JSON object"},
    {"{'model':'m','input':'x','background':true}", "background", "background responses are not supported"},
    {"{'model':'m','input':'x','background':'no'}", "background", "'background' must be a boolean"},
    {"{'model':'m','input':'x','conversation':'conv_1'}", "conversation", "conversations are not supported"},
    {"{'model':'m','input':'x','conversation':{'id':'conv_1'}}", "conversation", "conversations are not supported"},
    {"{'model':'m','input':'x','prompt':{'id':'pmpt_1'}}", "prompt", "stored prompts are not supported"},
    {"{'model':'m','input':'x','store':'no'}", "store", "'store' must be a boolean"},
    {"{'model':'m','input':'x','instructions':['a']}", "instructions", "'instructions' must be a string"},
    {"{'model':'m','input':'x','truncation':'middle'}", "truncation", "\"auto\" or \"disabled\""},
    {"{'model':'m','input':'x','truncation':true}", "truncation", "\"auto\" or \"disabled\""},
    {"{'model':'m','input':'x','user':5}", "user", "'user' must be a string"},
    {"{'model':'m','input':'x','service_tier':5}", "service_tier", "'service_tier' must be a string"},
    {"{'model':'m','input':'x','safety_identifier':{}}", "safety_identifier", "'safety_identifier' must be a string"},
    {"{'model':'m','input':'x','metadata':'u'}", "metadata", "object of strings"},
    {"{'model':'m','input':'x','metadata':{'a':'b','k':5}}", "metadata", "'metadata.k' must be a string"},
    {"{'model':'m','input':'x','previous_response_id':5}", "previous_response_id", "must be a response id"},
    {"{'model':'m','input':'x','previous_response_id':''}", "previous_response_id", "must be a response id"},
    {"{'model':'m','input':'x','include':'message.output_text.logprobs'}", "include", "array of strings"},
    {"{'model':'m','input':'x','include':['message.output_text.logprobs','file_search_call.results']}", "include",
     "'include[1]' (file_search_call.results) is not supported"},
    {"{'model':'m','input':'x','include':[5]}", "include", "(not a string) is not supported"},
    {"{'model':'m'}", "input", "non-empty array"},
    {"{'model':'m','input':[]}", "input", "non-empty array"},
    {"{'model':'m','input':5}", "input", "non-empty array"},
    {"{'model':'m','input':[5]}", "input[0]", "must be an object"},
    {"{'model':'m','input':[{'role':'user','content':'x'},{'type':'item_reference','id':'msg_1'}]}", "input[1]",
     "item references are not supported"},
    {"{'model':'m','input':[{'role':'user','content':'x'},{'type':'web_search_call','id':'ws_1'}]}", "input[1]",
     "items of type 'web_search_call' are not supported"},
    {"{'model':'m','input':[{'type':'computer_call_output','call_id':'c'}]}", "input[0]", "'computer_call_output'"},
    {"{'model':'m','input':[{'role':'tool','content':'x'}]}", "input[0]", "role must be"},
    {"{'model':'m','input':[{'content':'x'}]}", "input[0]", "role must be"},
    {"{'model':'m','input':[{'role':'user','content':5}]}", "input[0].content", "a string or an array of content parts"},
    {"{'model':'m','input':[{'role':'user','content':[{'type':'input_text','text':'a'},{'type':'input_file',"
     "'file_id':'file_1'}]}]}",
     "input[0].content[1]", "input_file parts are not supported"},
    {"{'model':'m','input':[{'role':'user','content':[{'type':'input_image','file_id':'file_1'}]}]}", "input[0].content[0]",
     "'file_id' need the Files API"},
    {"{'model':'m','input':[{'role':'user','content':[{'type':'input_image','detail':'auto'}]}]}", "input[0].content[0]",
     "needs an 'image_url' string"},
    {"{'model':'m','input':[{'role':'user','content':[{'type':'input_image','image_url':'https://a/b.png','detail':5}]}]}",
     "input[0].content[0]", "detail must be a string"},
    {"{'model':'m','input':[{'role':'system','content':[{'type':'input_image','image_url':'https://a/b.png'}]}]}",
     "input[0].content[0]", "parts of type 'input_image' are not supported here"},
    {"{'model':'m','input':[{'role':'user','content':'x'},{'role':'assistant','content':[{'type':'input_image',"
     "'image_url':'https://a/b.png'}]}]}",
     "input[1].content[0]", "(output_text, refusal)"},
    {"{'model':'m','input':[{'role':'user','content':[{'type':'refusal','refusal':'no'}]}]}", "input[0].content[0]",
     "parts of type 'refusal'"},
    {"{'model':'m','input':[{'role':'user','content':[{'type':'input_text'}]}]}", "input[0].content[0]", "'text' string"},
    {"{'model':'m','input':[{'role':'assistant','content':[{'type':'refusal'}]}]}", "input[0].content[0]",
     "'refusal' string"},
    {"{'model':'m','input':[{'role':'user','content':[{'text':'x'}]}]}", "input[0].content[0]", "'(none)'"},
    {"{'model':'m','input':[{'type':'reasoning','content':'x'}]}", "input[0]", "input[0].content must be an array"},
    {"{'model':'m','input':[{'type':'reasoning','summary':{}}]}", "input[0]", "input[0].summary must be an array"},
    {"{'model':'m','input':[{'type':'reasoning','content':[{'type':'summary_text','text':'x'}]}]}", "input[0]",
     "input[0].content[0] must be {\"type\": \"reasoning_text\""},
    {"{'model':'m','input':[{'type':'reasoning','summary':[{'type':'summary_text'}]}]}", "input[0]",
     "input[0].summary[0] must be {\"type\": \"summary_text\""},
    {"{'model':'m','input':[{'type':'function_call','name':'w','arguments':'{}'}]}", "input[0]",
     "needs 'call_id', 'name' and 'arguments' strings"},
    {"{'model':'m','input':[{'type':'function_call','call_id':'c','name':'w','arguments':{}}]}", "input[0]",
     "needs 'call_id', 'name' and 'arguments' strings"},
    {"{'model':'m','input':[{'type':'function_call_output','output':'x'}]}", "input[0]", "needs a 'call_id' string"},
    {"{'model':'m','input':[{'type':'function_call_output','call_id':'c','output':5}]}", "input[0]",
     "input[0].output must be a string or an array"},
    {"{'model':'m','input':[{'type':'function_call_output','call_id':'c','output':[{'type':'input_file'}]}]}",
     "input[0].output[0]", "input_file parts are not supported"},
    {"{'model':'m','input':'x','tools':{}}", "tools", "'tools' must be an array"},
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a'},{'type':'web_search'}]}", "tools[1]",
     "tools of type 'web_search' are not supported"},
    {"{'model':'m','input':'x','tools':[{'type':'mcp','server_label':'s'}]}", "tools[0]", "'mcp'"},
    {"{'model':'m','input':'x','tools':[{'name':'a'}]}", "tools[0]", "'(none)'"},
    {"{'model':'m','input':'x','tools':[{'type':'function'}]}", "tools[0]", "needs a 'name' string"},
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a','parameters':'x'}]}", "tools[0]",
     "parameters must be a JSON schema"},
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a','description':5}]}", "tools[0]",
     "description must be a string"},
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a','strict':'yes'}]}", "tools[0]",
     "strict must be a boolean"},
    {"{'model':'m','input':'x','tool_choice':'any'}", "tool_choice", "must be \"auto\", \"none\", \"required\""},
    {"{'model':'m','input':'x','tool_choice':5}", "tool_choice", "must be \"auto\", \"none\", \"required\""},
    {"{'model':'m','input':'x','tool_choice':{}}", "tool_choice", "must be \"auto\", \"none\", \"required\""},
    {"{'model':'m','input':'x','tool_choice':{'type':'function'}}", "tool_choice", "needs a 'name' string"},
    {"{'model':'m','input':'x','tool_choice':{'type':'web_search_preview'}}", "tool_choice",
     "of type 'web_search_preview' is not supported"},
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a'}],'tool_choice':{'type':'allowed_tools','mode':'none',"
     "'tools':[{'type':'function','name':'a'}]}}",
     "tool_choice", "'tool_choice.mode' must be"},
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a'}],'tool_choice':{'type':'allowed_tools','mode':'auto'}}",
     "tool_choice", "'tool_choice.tools' must be an array"},
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a'}],'tool_choice':{'type':'allowed_tools','mode':'auto',"
     "'tools':[{'type':'function','name':'a'},{'type':'function','name':'zz'}]}}",
     "tool_choice", "'tool_choice.tools[1]' names 'zz', which is not among 'tools'"},
    {"{'model':'m','input':'x','tool_choice':{'type':'allowed_tools','mode':'auto','tools':[{'type':'function','name':'a'}]}}",
     "tool_choice", "names 'a', which is not among 'tools'"},
    {"{'model':'m','input':'x','tools':[{'type':'function','name':'a'}],'tool_choice':{'type':'allowed_tools','mode':'auto',"
     "'tools':[{'type':'mcp','name':'a'}]}}",
     "tool_choice", "'tool_choice.tools[0]' must be {\"type\": \"function\""},
    {"{'model':'m','input':'x','text':'json'}", "text", "'text' must be an object"},
    {"{'model':'m','input':'x','text':{'verbosity':'max'}}", "text.verbosity", "'text.verbosity' must be"},
    {"{'model':'m','input':'x','text':{'format':'json'}}", "text.format", "'text.format' must be an object"},
    {"{'model':'m','input':'x','text':{'format':{'type':'xml'}}}", "text.format", "'text.format.type' must be"},
    {"{'model':'m','input':'x','text':{'format':{'type':'json_schema','name':'n'}}}", "text.format",
     "'text.format.schema' must be a JSON schema"},
    {"{'model':'m','input':'x','text':{'format':{'type':'json_schema','schema':{},'name':5}}}", "text.format",
     "'text.format.name' must be a string"},
    {"{'model':'m','input':'x','text':{'format':{'type':'json_schema','schema':{},'strict':'y'}}}", "text.format",
     "'text.format.strict' must be a boolean"},
    {"{'model':'m','input':'x','text':{'format':{'type':'json_schema','schema':{},'description':[]}}}", "text.format",
     "'text.format.description' must be a string"},
    {"{'model':'m','input':'x','reasoning':'high'}", "reasoning", "'reasoning' must be an object"},
    {"{'model':'m','input':'x','reasoning':{'effort':'max'}}", "reasoning.effort", "'reasoning.effort' must be"},
    {"{'model':'m','input':'x','reasoning':{'effort':1}}", "reasoning.effort", "'reasoning.effort' must be"},
    {"{'model':'m','input':'x','reasoning':{'summary':'long'}}", "reasoning.summary", "'reasoning.summary' must be"},
    {"{'model':'m','input':'x','reasoning':{'generate_summary':true}}", "reasoning.summary",
     "'reasoning.generate_summary' must be"},
};

/* one refusal: 400, the param, the message; nothing returned */
static void refused(json_t *in, json_t *hist, const char *what, const char *param, const char *says) {
    result x;
    translate(in, hist, &x);
    CHECK(x.rc == 400 && !x.out && !x.r.echo && !x.r.turn && x.e.type && !strcmp(x.e.type, "invalid_request_error") &&
              !strcmp(x.e.param, param) && strstr(x.e.message, says),
          "refusal %s: %d param '%s' (want '%s'): %s (want ...%s...)", what, x.rc, x.e.param, param, x.e.message, says);
    result_free(&x);
}

static int refusals(void) {
    int n = 0;
    for (size_t k = 0; k < sizeof BADS / sizeof *BADS; k++, n++) {
        char what[16];
        snprintf(what, sizeof what, "%zu", k);
        json_t *in = load(BADS[k].in);
        refused(in, NULL, what, BADS[k].param, BADS[k].says);
        json_decref(in);
    }
    /* limits built here: metadata (17 pairs, a 65-byte key, a 513-byte value), input items,
     * the conversation with its history, tools */
    json_t *b = load("{'model':'m','input':'x','metadata':{}}"), *m = json_object_get(b, "metadata");
    char k[128];
    for (int i = 0; i < M3_RESP_MAX_METADATA; i++) {
        snprintf(k, sizeof k, "k%d", i);
        json_object_set_new(m, k, json_string("v"));
    }
    result x;
    translate(b, NULL, &x); /* 16: the limit, accepted */
    CHECK(x.rc == 0 && json_equal(json_object_get(x.r.echo, "metadata"), m), "16 metadata pairs: %d %s", x.rc, x.e.message);
    result_free(&x);
    json_object_set_new(m, "k16", json_string("v"));
    refused(b, NULL, "metadata 17", "metadata", "17 pairs; the limit is 16");
    json_object_clear(m);
    memset(k, 'a', 64);
    k[64] = 0;
    json_object_set_new(m, k, json_string("v"));
    translate(b, NULL, &x); /* a 64-byte key: accepted */
    CHECK(x.rc == 0, "a 64-byte metadata key: %d %s", x.rc, x.e.message);
    result_free(&x);
    json_object_clear(m);
    memset(k, 'a', 65);
    k[65] = 0;
    json_object_set_new(m, k, json_string("v"));
    refused(b, NULL, "metadata key", "metadata", "keys are at most 64 characters");
    json_object_clear(m);
    char v[600];
    memset(v, 'v', 513);
    v[513] = 0;
    json_object_set_new(m, "k", json_string(v));
    refused(b, NULL, "metadata value", "metadata", "'metadata.k' must be a string of at most 512 characters");
    v[512] = 0;
    json_object_set_new(m, "k", json_string(v));
    translate(b, NULL, &x);
    CHECK(x.rc == 0, "a 512-byte metadata value: %d %s", x.rc, x.e.message);
    result_free(&x);
    json_decref(b);
    n += 6;

    json_t *in = json_array();
    for (int i = 0; i <= M3_OAI_MAX_MESSAGES; i++) json_array_append_new(in, json_pack("{s:s,s:s}", "role", "user", "content", "x"));
    b = json_pack("{s:s,s:O}", "model", "m", "input", in);
    refused(b, NULL, "input items", "input", "has 4097 items; the limit is 4096");
    json_decref(b);
    json_array_remove(in, 0); /* 4096 input messages + instructions: the conversation's limit */
    b = json_pack("{s:s,s:s,s:O}", "model", "m", "instructions", "i", "input", in);
    refused(b, NULL, "instructions + 4096", "input", "the conversation has 4097 messages; the limit is 4096");
    json_decref(b);
    b = json_pack("{s:s,s:O}", "model", "m", "input", in); /* 4096: accepted */
    translate(b, NULL, &x);
    CHECK(x.rc == 0 && json_array_size(json_object_get(x.out, "messages")) == M3_OAI_MAX_MESSAGES, "4096 messages: %d %s",
          x.rc, x.e.message);
    result_free(&x);
    json_decref(b);
    b = load("{'model':'m','input':'x','previous_response_id':'r'}"); /* a history of 4096 + the new input */
    refused(b, in, "history + 1", "previous_response_id", "the conversation has 4097 messages");
    json_decref(b);
    json_decref(in);
    json_t *tl = json_array();
    for (int i = 0; i <= M3_OAI_MAX_TOOLS; i++) {
        snprintf(k, sizeof k, "f%d", i);
        json_array_append_new(tl, json_pack("{s:s,s:s}", "type", "function", "name", k));
    }
    b = json_pack("{s:s,s:s,s:o}", "model", "m", "input", "x", "tools", tl);
    refused(b, NULL, "tools 513", "tools", "'tools' has 513 entries; the limit is 512");
    json_decref(b);
    n += 5;
    return n;
}

/* ------------------------------------------------------------------ 3. allocation failures */

static void faults(long *runs, long *same, long *oom) {
    for (size_t k = 0; k < sizeof OK / sizeof *OK; k++) {
        json_t *in = load(OK[k].in), *hist = load(OK[k].hist);
        result ref, x;
        m3_fault_arm(M3_FAULT_SERVER, 1, 0, 1); /* count only */
        translate(in, hist, &ref);
        long total = m3_fault_seen(M3_FAULT_SERVER);
        m3_fault_disarm(M3_FAULT_SERVER);
        long base = atomic_load(&live);
        CHECK(ref.rc == 0 && total > 0, "request %zu without faults: %d (%ld allocations)", k, ref.rc, total);
        for (long n = 1; n <= total; n++) {
            m3_fault_arm(M3_FAULT_SERVER, n, 1, 1);
            translate(in, hist, &x);
            long failed = m3_fault_failed(M3_FAULT_SERVER);
            m3_fault_disarm(M3_FAULT_SERVER);
            (*runs)++;
            CHECK(failed == 1, "request %zu, allocation %ld: %ld failures injected", k, n, failed);
            if (!x.rc) {
                int s = same_result(&x, &ref);
                if (!s) {
                    char *g = dump(x.out), *w = dump(ref.out);
                    CHECK(s, "request %zu, allocation %ld failing: accepted as another request\n  got:  %s\n  want: %s", k, n,
                          g ? g : "(none)", w ? w : "(none)");
                    count_free(g);
                    count_free(w);
                }
                *same += s;
            } else {
                int clean = x.rc == 500 && !x.out && !x.r.echo && !x.r.turn && x.e.type && !strcmp(x.e.type, "server_error") &&
                            strstr(x.e.message, "memory");
                CHECK(clean, "request %zu, allocation %ld failing: %d %s", k, n, x.rc, x.e.message);
                *oom += clean;
            }
            result_free(&x);
            long now = atomic_load(&live);
            CHECK(now == base, "request %zu, allocation %ld failing: %ld JSON allocations leaked", k, n, now - base);
            atomic_store(&live, base); /* one leak reported once */
        }
        result_free(&ref);
        json_decref(in);
        json_decref(hist);
    }
}

/* ------------------------------------------------------------------ 4. the store */

static char *turn_of(const char *id) {
    char b[160];
    snprintf(b, sizeof b, "[{\"role\":\"user\",\"content\":\"%s\"}]", id);
    return strdup(b);
}
static char *resp_of(const char *id, const char *v) {
    char b[160];
    snprintf(b, sizeof b, "{\"id\":\"%s\",\"v\":\"%s\"}", id, v);
    return strdup(b);
}
static int put(m3_resp_store *s, const char *id, const char *prev, const char *v) {
    char *t = turn_of(id), *r = resp_of(id, v);
    return m3_resp_store_put(s, id, prev, t, strlen(t), r, strlen(r), NULL, 0);
}
/* response id is stored with version v */
static int has(m3_resp_store *s, const char *id, const char *v) {
    size_t len = 0;
    int oom = 1;
    char *got = m3_resp_store_get(s, id, &len, &oom), *want = resp_of(id, v);
    int ok = got && !oom && len == strlen(want) && !strcmp(got, want);
    free(got);
    free(want);
    return ok;
}
static int absent_id(m3_resp_store *s, const char *id) {
    size_t len = 0;
    int oom = 1;
    char *got = m3_resp_store_get(s, id, &len, &oom);
    free(got);
    return !got && !oom;
}
/* the conversation ending with id is the turns of ids (n of them, first first) */
static int history_is(m3_resp_store *s, const char *id, const char *const *ids, size_t n) {
    json_t *msgs = (json_t *)1;
    char missing[64] = "?";
    int rc = m3_resp_store_history(s, id, &msgs, missing, sizeof missing);
    json_t *want = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(want, json_pack("{s:s,s:s}", "role", "user", "content", ids[i]));
    int ok = rc == 0 && msgs && json_equal(msgs, want);
    if (!ok) {
        char *g = dump(msgs), *w = dump(want);
        fprintf(stderr, "  history of %s: %d missing %s\n  got:  %s\n  want: %s\n", id, rc, missing, g ? g : "(none)", w);
        count_free(g);
        count_free(w);
    }
    json_decref(msgs);
    json_decref(want);
    return ok;
}
/* the conversation ending with id is refused naming gone */
static int history_missing(m3_resp_store *s, const char *id, const char *gone) {
    json_t *msgs = (json_t *)1;
    char missing[64] = "?";
    int rc = m3_resp_store_history(s, id, &msgs, missing, sizeof missing);
    int ok = rc == 1 && !msgs && !strcmp(missing, gone);
    if (!ok) fprintf(stderr, "  history of %s: %d missing '%s' (want 1 '%s')\n", id, rc, missing, gone);
    if (msgs != (json_t *)1) json_decref(msgs);
    return ok;
}
static m3_resp_store_stats stats(m3_resp_store *s) {
    m3_resp_store_stats st;
    m3_resp_store_get_stats(s, &st);
    return st;
}

static void store_basics(void) {
    m3_resp_store *s = m3_resp_store_new(1 << 20);
    CHECK(s, "store_new");
    m3_resp_store_stats st = stats(s);
    CHECK(st.n == 0 && st.bytes == 0 && st.cap == 1 << 20 && st.evicted == 0, "empty store: %zu %zu %zu %llu", st.n, st.bytes,
          st.cap, st.evicted);
    CHECK(put(s, "a", NULL, "1") == 0 && has(s, "a", "1"), "put then get a");
    size_t b1 = stats(s).bytes;
    CHECK(stats(s).n == 1 && b1 >= strlen("[{\"role\":\"user\",\"content\":\"a\"}]") + strlen("{\"id\":\"a\",\"v\":\"1\"}") + 1,
          "stats after one put: n %zu bytes %zu", stats(s).n, b1);
    CHECK(put(s, "b", "a", "1") == 0 && put(s, "c", "b", "1") == 0, "put b, c");
    size_t b3 = stats(s).bytes;
    CHECK(stats(s).n == 3 && b3 > b1, "stats after three: n %zu bytes %zu", stats(s).n, b3);
    static const char *const abc[] = {"a", "b", "c"};
    CHECK(history_is(s, "c", abc, 3), "history of a -> b -> c");
    CHECK(history_is(s, "b", abc, 2), "history of a -> b");
    CHECK(history_is(s, "a", abc, 1), "history of a");
    CHECK(history_missing(s, "zz", "zz"), "history of an id never stored");
    /* the missing id cut to the caller's buffer */
    json_t *msgs = NULL;
    char small[4];
    CHECK(m3_resp_store_history(s, "abcdefgh", &msgs, small, sizeof small) == 1 && !msgs && !strcmp(small, "abc"),
          "missing id cut: '%s'", small);
    CHECK(m3_resp_store_history(s, "abcdefgh", &msgs, NULL, 0) == 1 && !msgs, "missing id with no buffer");
    /* replacing an id: one entry, the new text, the chain still read */
    size_t bb = stats(s).bytes;
    CHECK(put(s, "b", "a", "2") == 0 && has(s, "b", "2") && stats(s).n == 3 && stats(s).bytes == bb && stats(s).evicted == 0,
          "replacing b: n %zu bytes %zu (was %zu)", stats(s).n, stats(s).bytes, bb);
    CHECK(history_is(s, "c", abc, 3), "history after replacing b");
    CHECK(put(s, "b", "a", "longer version") == 0 && has(s, "b", "longer version") &&
              stats(s).bytes == bb + strlen("longer version") - 1,
          "replacing b with a longer text: bytes %zu (was %zu)", stats(s).bytes, bb);
    /* delete: 1 then 0; the conversation past it refused naming it */
    size_t before = stats(s).bytes;
    CHECK(m3_resp_store_delete(s, "b") == 1, "delete b");
    CHECK(m3_resp_store_delete(s, "b") == 0, "delete b again");
    CHECK(absent_id(s, "b") && has(s, "a", "1") && has(s, "c", "1"), "b gone, a and c kept");
    CHECK(history_missing(s, "c", "b"), "history of c past a deleted b");
    CHECK(history_is(s, "a", abc, 1), "history of a after b's delete");
    CHECK(stats(s).n == 2 && stats(s).bytes < before, "stats after delete: n %zu bytes %zu", stats(s).n, stats(s).bytes);
    CHECK(put(s, "b", "a", "3") == 0 && history_is(s, "c", abc, 3), "b put back: the chain whole again");
    CHECK(m3_resp_store_delete(s, "a") == 1 && m3_resp_store_delete(s, "b") == 1 && m3_resp_store_delete(s, "c") == 1 &&
              m3_resp_store_delete(s, "nope") == 0,
          "delete all");
    st = stats(s);
    CHECK(st.n == 0 && st.bytes == 0 && st.evicted == 0, "emptied: n %zu bytes %zu evicted %llu", st.n, st.bytes, st.evicted);
    /* a table grown past its first buckets: every entry still found */
    char id[32], prev[32];
    for (int i = 0; i < 300; i++) {
        snprintf(id, sizeof id, "g%d", i);
        snprintf(prev, sizeof prev, "g%d", i - 1);
        CHECK(put(s, id, i ? prev : NULL, "1") == 0, "put %s", id);
    }
    int found = 0;
    for (int i = 0; i < 300; i++) {
        snprintf(id, sizeof id, "g%d", i);
        found += has(s, id, "1");
    }
    CHECK(found == 300 && stats(s).n == 300, "300 entries: %d found, n %zu", found, stats(s).n);
    CHECK(m3_resp_store_history(s, "g299", &msgs, NULL, 0) == 0 && json_array_size(msgs) == 300 &&
              !strcmp(json_string_value(json_object_get(json_array_get(msgs, 0), "content")), "g0") &&
              !strcmp(json_string_value(json_object_get(json_array_get(msgs, 299), "content")), "g299"),
          "history of 300");
    json_decref(msgs);
    m3_resp_store_free(s);
}

static void store_eviction(void) {
    /* B: what one entry of this size costs */
    m3_resp_store *s = m3_resp_store_new(1 << 20);
    put(s, "e0", NULL, "1");
    size_t B = stats(s).bytes;
    m3_resp_store_free(s);
    size_t cap = 3 * B + B / 2; /* room for three */
    s = m3_resp_store_new(cap);
    char id[16], old[16];
    for (int i = 0; i < 10; i++) {
        snprintf(id, sizeof id, "e%d", i);
        CHECK(put(s, id, NULL, "1") == 0, "put %s", id);
        m3_resp_store_stats st = stats(s);
        size_t want_n = i < 3 ? (size_t)i + 1 : 3;
        unsigned long long want_ev = i < 3 ? 0 : (unsigned long long)i - 2;
        CHECK(st.n == want_n && st.evicted == want_ev && st.bytes == want_n * B && st.bytes <= cap,
              "after %s: n %zu (want %zu) evicted %llu (want %llu) bytes %zu (B %zu, cap %zu)", id, st.n, want_n, st.evicted,
              want_ev, st.bytes, B, cap);
        CHECK(has(s, id, "1"), "%s kept", id);
        for (int j = 0; j <= i; j++) { /* the oldest went first */
            snprintf(old, sizeof old, "e%d", j);
            CHECK(j > i - 3 ? has(s, old, "1") : absent_id(s, old), "after %s: %s %s", id, old, j > i - 3 ? "kept" : "evicted");
        }
    }
    /* e7 e8 e9 stored; replacing e7 makes it the newest (not an eviction); the next put evicts e8 */
    CHECK(put(s, "e7", NULL, "2") == 0 && stats(s).evicted == 7 && stats(s).n == 3, "replace e7: evicted %llu",
          stats(s).evicted);
    CHECK(put(s, "f0", NULL, "1") == 0 && stats(s).evicted == 8 && absent_id(s, "e8") && has(s, "e7", "2") &&
              has(s, "e9", "1") && has(s, "f0", "1"),
          "after the replacement the oldest is e8: evicted %llu", stats(s).evicted);
    /* an entry larger than the whole budget: 1, not stored, nothing evicted */
    m3_resp_store_stats st0 = stats(s);
    char *t = malloc(cap + 1), *r = strdup("{}");
    memset(t, ' ', cap);
    t[cap] = 0;
    CHECK(m3_resp_store_put(s, "huge", NULL, t, cap, r, 2, NULL, 0) == 1, "an entry over the budget");
    m3_resp_store_stats st1 = stats(s);
    CHECK(absent_id(s, "huge") && st1.n == st0.n && st1.bytes == st0.bytes && st1.evicted == st0.evicted,
          "over the budget: nothing stored or evicted");
    /* one that fits only alone: every other entry evicted */
    size_t L = cap - B;
    t = malloc(L + 1);
    memset(t, ' ', L);
    t[L] = 0;
    r = strdup("{}");
    CHECK(m3_resp_store_put(s, "big", NULL, t, L, r, 2, NULL, 0) == 0, "an entry of most of the budget");
    st1 = stats(s);
    CHECK(st1.n == 1 && st1.evicted == st0.evicted + 3 && st1.bytes <= cap && absent_id(s, "e9") && absent_id(s, "f0"),
          "the big entry alone: n %zu evicted %llu", st1.n, st1.evicted);
    m3_resp_store_free(s);
    /* a conversation whose first response was evicted: refused naming it */
    s = m3_resp_store_new(cap);
    put(s, "e0", NULL, "1");
    put(s, "e1", "e0", "1");
    put(s, "e2", "e1", "1");
    static const char *const e012[] = {"e0", "e1", "e2"};
    CHECK(history_is(s, "e2", e012, 3), "history e0 -> e2");
    put(s, "e3", "e2", "1");
    CHECK(history_missing(s, "e3", "e0"), "history past an evicted e0 (never cut to what is left)");
    m3_resp_store_free(s);
}

/* Reading a conversation makes its responses the most recently used: an insertion-ordered store
 * would evict its first response next, this one evicts the response nobody read. */
static void store_lru(void) {
    m3_resp_store *s = m3_resp_store_new(1 << 20);
    put(s, "x", NULL, "1");
    size_t B = stats(s).bytes;
    m3_resp_store_free(s);
    s = m3_resp_store_new(4 * B + B / 2); /* room for four */
    CHECK(!put(s, "a", NULL, "1") && !put(s, "o1", NULL, "1") && !put(s, "o2", NULL, "1") && !put(s, "b", "a", "1"), "puts");
    /* a o1 o2 b: reading b's conversation makes a and b the newest, a before b: o1 o2 a b */
    static const char *const AB[] = {"a", "b"};
    CHECK(history_is(s, "b", AB, 2), "the conversation a b");
    CHECK(!put(s, "o3", NULL, "1") && absent_id(s, "o1") && has(s, "a", "1") && has(s, "o2", "1"),
          "the next put evicts o1, the least recently used (not a, the oldest stored)");
    CHECK(!put(s, "o4", NULL, "1") && absent_id(s, "o2") && has(s, "a", "1"), "then o2");
    CHECK(!put(s, "o5", NULL, "1") && absent_id(s, "a") && has(s, "b", "1") && history_missing(s, "b", "a"),
          "then a, read before b: b's conversation is refused naming it");
    m3_resp_store_free(s);
    /* the bytes a conversation read back may hold (the server's --max-body) */
    s = m3_resp_store_new(1 << 20);
    CHECK(!put(s, "m1", NULL, "1") && !put(s, "m2", "m1", "1") && !put(s, "m3", "m2", "1"), "puts");
    size_t T = strlen("[{\"role\":\"user\",\"content\":\"m1\"}]"); /* a turn's bytes (turn_of) */
    m3_resp_store_set_max_read(s, 3 * T);
    static const char *const M[] = {"m1", "m2", "m3"};
    CHECK(history_is(s, "m3", M, 3), "three turns within 3 turns' bytes");
    m3_resp_store_set_max_read(s, 3 * T - 1);
    json_t *msgs = (json_t *)1;
    char missing[64] = "";
    int rc = m3_resp_store_history(s, "m3", &msgs, missing, sizeof missing);
    CHECK(rc == 3 && !msgs, "three turns over 3 turns' bytes - 1: %d (want 3)", rc);
    CHECK(history_is(s, "m2", M, 2), "two of them still read");
    m3_resp_store_free(s);
}

static void store_faults(long *runs) {
    /* store_new */
    for (long n = 1;; n++) {
        m3_fault_arm(M3_FAULT_SERVER, n, 1, 1);
        m3_resp_store *s = m3_resp_store_new(4096);
        long failed = m3_fault_failed(M3_FAULT_SERVER);
        m3_fault_disarm(M3_FAULT_SERVER);
        (*runs)++;
        CHECK(failed ? !s : s != NULL, "store_new, allocation %ld failing: %p", n, (void *)s);
        m3_resp_store_free(s);
        if (!failed) break;
    }
    /* put: 64 entries stored, the 65th (continuing one: its id, its prev, the table grown) with
     * each of its allocations failing; then replacing one */
    char id[16];
    for (int replace = 0; replace < 2; replace++)
        for (long n = 1;; n++) {
            m3_resp_store *s = m3_resp_store_new(1 << 20);
            for (int i = 0; i < 64; i++) {
                snprintf(id, sizeof id, "p%d", i);
                put(s, id, NULL, "1");
            }
            const char *nid = replace ? "p10" : "p64";
            m3_fault_arm(M3_FAULT_SERVER, n, 1, 1);
            int rc = put(s, nid, "p9", "2");
            long failed = m3_fault_failed(M3_FAULT_SERVER);
            m3_fault_disarm(M3_FAULT_SERVER);
            (*runs)++;
            m3_resp_store_stats st = stats(s);
            if (rc == -1) /* not stored; what was there kept */
                CHECK(failed && (replace ? has(s, nid, "1") : absent_id(s, nid)) && st.n == 64,
                      "put %s, allocation %ld failing: n %zu", nid, n, st.n);
            else {
                static const char *const chain[2][2] = {{"p9", "p64"}, {"p9", "p10"}};
                CHECK(rc == 0 && has(s, nid, "2") && st.n == (size_t)(replace ? 64 : 65) && history_is(s, nid, chain[replace], 2),
                      "put %s, allocation %ld failing: %d n %zu", nid, n, rc, st.n);
            }
            int found = 0;
            for (int i = 0; i < 64; i++) {
                snprintf(id, sizeof id, "p%d", i);
                found += has(s, id, i == 10 && replace && rc == 0 ? "2" : "1");
            }
            CHECK(found == 64, "put %s, allocation %ld failing: %d of the 64 found after", nid, n, found);
            CHECK(put(s, "after", NULL, "1") == 0 && has(s, "after", "1"), "the store usable after a failed put");
            m3_resp_store_free(s);
            if (!failed) break;
        }
    /* history of a chain of 40 (the chain buffer grown twice, the JSON built) */
    m3_resp_store *s = m3_resp_store_new(1 << 20);
    const char *ids[40];
    char names[40][8];
    for (int i = 0; i < 40; i++) {
        snprintf(names[i], sizeof names[i], "h%d", i);
        ids[i] = names[i];
        put(s, names[i], i ? names[i - 1] : NULL, "1");
    }
    for (long n = 1;; n++) {
        long base = atomic_load(&live);
        json_t *msgs = (json_t *)1;
        char missing[16] = "";
        m3_fault_arm(M3_FAULT_SERVER, n, 1, 1);
        int rc = m3_resp_store_history(s, "h39", &msgs, missing, sizeof missing);
        long failed = m3_fault_failed(M3_FAULT_SERVER);
        m3_fault_disarm(M3_FAULT_SERVER);
        (*runs)++;
        CHECK(failed ? rc == -1 && !msgs : rc == 0 && msgs && json_array_size(msgs) == 40,
              "history, allocation %ld failing: %d (%ld failed)", n, rc, failed);
        if (rc == 0) json_decref(msgs);
        CHECK(atomic_load(&live) == base, "history, allocation %ld failing: %ld JSON allocations leaked", n,
              atomic_load(&live) - base);
        atomic_store(&live, base);
        if (!failed) break;
        CHECK(n < 1000, "history: no end to its allocations");
        if (n >= 1000) break;
    }
    CHECK(history_is(s, "h39", ids, 40), "history after the failures");
    /* get */
    m3_fault_arm(M3_FAULT_SERVER, 1, 1, 1);
    size_t len = 0;
    int oom = 0;
    char *got = m3_resp_store_get(s, "h5", &len, &oom);
    m3_fault_disarm(M3_FAULT_SERVER);
    (*runs)++;
    CHECK(!got && oom == 1, "get, its allocation failing: %p oom %d", (void *)got, oom);
    free(got);
    m3_fault_arm(M3_FAULT_SERVER, 1, 1, 1);
    got = m3_resp_store_get(s, "nope", &len, &oom);
    m3_fault_disarm(M3_FAULT_SERVER);
    CHECK(!got && oom == 0, "get of an id not stored while armed: oom %d", oom);
    CHECK(has(s, "h5", "1") && stats(s).n == 40, "the store after the failed get");
    m3_resp_store_free(s);
}

/* M3_RESP_STORE_MAX_CHAIN responses read back at most; a cycle (ids replaced to point back)
 * ends there too */
static void store_chain_limit(void) {
    m3_resp_store *s = m3_resp_store_new((size_t)1 << 40);
    char id[16], prev[16];
    for (int i = 0; i <= M3_RESP_STORE_MAX_CHAIN; i++) {
        snprintf(id, sizeof id, "c%d", i);
        snprintf(prev, sizeof prev, "c%d", i - 1);
        char *t = strdup("[]"), *r = strdup("{}");
        if (m3_resp_store_put(s, id, i ? prev : NULL, t, 2, r, 2, NULL, 0)) {
            CHECK(0, "put %s", id);
            break;
        }
    }
    json_t *msgs = NULL;
    snprintf(id, sizeof id, "c%d", M3_RESP_STORE_MAX_CHAIN - 1); /* exactly the limit */
    int rc = m3_resp_store_history(s, id, &msgs, NULL, 0);
    CHECK(rc == 0 && json_is_array(msgs) && !json_array_size(msgs), "a chain of %d: %d", M3_RESP_STORE_MAX_CHAIN, rc);
    json_decref(msgs);
    msgs = NULL;
    snprintf(id, sizeof id, "c%d", M3_RESP_STORE_MAX_CHAIN); /* one more */
    rc = m3_resp_store_history(s, id, &msgs, NULL, 0);
    CHECK(rc == 2 && !msgs, "a chain of %d responses (longer than M3_RESP_STORE_MAX_CHAIN %d): %d (want 2)",
          M3_RESP_STORE_MAX_CHAIN + 1, M3_RESP_STORE_MAX_CHAIN, rc);
    json_decref(msgs);
    msgs = NULL;
    put(s, "x", "y", "1");
    put(s, "y", "x", "1");
    rc = m3_resp_store_history(s, "x", &msgs, NULL, 0);
    CHECK(rc == 2 && !msgs, "a cycle x -> y -> x: %d (want 2)", rc);
    json_decref(msgs);
    m3_resp_store_free(s);
}

/* threads on distinct ids: chains of 4 put, read back and half deleted */
#define T_THREADS 4
#define T_ITERS 3000
typedef struct tctx {
    m3_resp_store *s;
    int t, bad;
} tctx;

static void *worker(void *arg) {
    tctx *c = arg;
    char id[32], prev[32];
    for (int i = 0; i < T_ITERS; i++) {
        snprintf(id, sizeof id, "t%d-%d", c->t, i);
        snprintf(prev, sizeof prev, "t%d-%d", c->t, i - 1);
        if (put(c->s, id, i % 4 ? prev : NULL, "1")) c->bad++;
        if (!has(c->s, id, "1")) c->bad++;
        json_t *msgs = NULL;
        if (m3_resp_store_history(c->s, id, &msgs, NULL, 0) || json_array_size(msgs) != (size_t)(i % 4 + 1) ||
            strcmp(json_string_value(json_object_get(json_array_get(msgs, i % 4), "content")), id))
            c->bad++;
        json_decref(msgs);
        if (i % 4 == 3 && (i / 4) % 2 == 0) /* every other chain deleted */
            for (int j = i - 3; j <= i; j++) {
                snprintf(id, sizeof id, "t%d-%d", c->t, j);
                if (m3_resp_store_delete(c->s, id) != 1) c->bad++;
            }
        if (i % 97 == 0) {
            m3_resp_store_stats st;
            m3_resp_store_get_stats(c->s, &st);
            if (st.bytes > st.cap) c->bad++;
        }
    }
    return NULL;
}

static void store_threads(void) {
    m3_resp_store *s = m3_resp_store_new((size_t)64 << 20);
    pthread_t th[T_THREADS];
    tctx c[T_THREADS];
    for (int t = 0; t < T_THREADS; t++) {
        c[t] = (tctx){s, t, 0};
        CHECK(pthread_create(&th[t], NULL, worker, &c[t]) == 0, "pthread_create");
    }
    for (int t = 0; t < T_THREADS; t++) {
        pthread_join(th[t], NULL);
        CHECK(c[t].bad == 0, "thread %d: %d wrong answers", t, c[t].bad);
    }
    m3_resp_store_stats st = stats(s);
    size_t kept = T_THREADS * (T_ITERS / 8) * 4;
    CHECK(st.n == kept && st.evicted == 0, "after the threads: n %zu (want %zu) evicted %llu", st.n, kept, st.evicted);
    int found = 0;
    char id[32];
    for (int t = 0; t < T_THREADS; t++)
        for (int i = 0; i < T_ITERS; i++) {
            snprintf(id, sizeof id, "t%d-%d", t, i);
            found += (i / 4) % 2 ? has(s, id, "1") : absent_id(s, id);
        }
    CHECK(found == T_THREADS * T_ITERS, "after the threads: %d of %d as they should be", found, T_THREADS * T_ITERS);
    for (int t = 0; t < T_THREADS; t++)
        for (int i = 0; i < T_ITERS; i++) {
            snprintf(id, sizeof id, "t%d-%d", t, i);
            m3_resp_store_delete(s, id);
        }
    st = stats(s);
    CHECK(st.n == 0 && st.bytes == 0, "all deleted: n %zu bytes %zu", st.n, st.bytes);
    m3_resp_store_free(s);
}

int main(void) {
    json_set_alloc_funcs(count_malloc, count_free);
    /* 1. translations */
    int nok = translations();
    printf("1. %d of %zu requests translated\n", nok, sizeof OK / sizeof *OK);
    /* 2. refusals */
    int nbad = refusals();
    printf("2. %d requests refused with the field at fault\n", nbad);
    /* 3. one allocation failing at every point */
    long runs = 0, same = 0, oom = 0;
    faults(&runs, &same, &oom);
    printf("3. %ld translations with one allocation failing: %ld the same result, %ld a clean 500\n", runs, same, oom);
    CHECK(runs > 0 && same + oom == runs, "fault runs: %ld not clean", runs - same - oom);
    /* 4. the store */
    store_basics();
    store_eviction();
    store_lru();
    long sruns = 0;
    store_faults(&sruns);
    store_chain_limit();
    store_threads();
    printf("4. the store: put / get / history / delete, eviction, %ld runs with an allocation failing, the chain limit, "
           "%d threads x %d\n", sruns, T_THREADS, T_ITERS);
    CHECK(atomic_load(&live) == 0, "%ld JSON allocations alive at the end", atomic_load(&live));
    if (failures) { printf("%d checks FAILED\n", failures); return 1; }
    printf("all passed\n");
    return 0;
}
