/* m3 chat-template: render a chat template the way transformers' apply_chat_template does.
 *   m3 chat-template -m DIR|--template FILE --messages FILE.json [--tools FILE.json]
 *                    [--add-generation-prompt] [--kwargs JSON] [--dump-template]
 * Prints the prompt exactly (no newline added). --dump-template prints the template text
 * that would be used (for -m DIR: the checkpoint's, or the built-in MiniMax-M3 one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "chat/chat.h"

static int usage(void) {
    fprintf(stderr, "usage: m3 chat-template -m DIR|--template FILE --messages FILE.json [--tools FILE.json] "
                    "[--add-generation-prompt] [--kwargs JSON] [--dump-template]\n");
    return 2;
}

static json_t *load_json(const char *path, const char *what, m3_err *err) {
    json_error_t je;
    json_t *j = json_load_file(path, JSON_DECODE_ANY, &je);
    if (!j) m3_errf(err, "%s %s: line %d, column %d: %s", what, path, je.line, je.column, je.text);
    return j;
}

int m3_cmd_chat_template(int argc, char **argv) {
    const char *dir = NULL, *tfile = NULL, *mfile = NULL, *toolfile = NULL, *kw = NULL;
    int gen = 0, dump = 0;
    for (int i = 1; i < argc; i++) { /* argv[0] is "chat-template" */
        const char *a = argv[i];
        int has = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has) dir = argv[++i];
        else if (!strcmp(a, "--template") && has) tfile = argv[++i];
        else if (!strcmp(a, "--messages") && has) mfile = argv[++i];
        else if (!strcmp(a, "--tools") && has) toolfile = argv[++i];
        else if (!strcmp(a, "--kwargs") && has) kw = argv[++i];
        else if (!strcmp(a, "--add-generation-prompt")) gen = 1;
        else if (!strcmp(a, "--dump-template")) dump = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(), 0;
        else {
            fprintf(stderr, "m3 chat-template: unknown or incomplete option '%s'\n", a);
            return usage();
        }
    }
    if ((!dir) == (!tfile)) {
        fprintf(stderr, "m3 chat-template: give exactly one of -m DIR or --template FILE\n");
        return usage();
    }
    if (!mfile && !dump) {
        fprintf(stderr, "m3 chat-template: --messages FILE.json is required\n");
        return usage();
    }
    m3_err err = {0};
    m3_chat *c = NULL;
    json_t *msgs = NULL, *tools = NULL, *kwargs = NULL;
    char *out = NULL;
    int rc = 1;
    if (dir) c = m3_chat_load(dir, &err);
    else {
        FILE *f = fopen(tfile, "rb");
        if (!f) { m3_errf(&err, "%s: cannot open", tfile); goto done; }
        char *buf = NULL;
        size_t n = 0, cap = 0, r;
        do {
            if (n + 65536 > cap) {
                cap = cap ? cap * 2 : 65536 * 2;
                char *nb = realloc(buf, cap);
                if (!nb) { free(buf); fclose(f); m3_errf(&err, "%s: out of memory", tfile); goto done; }
                buf = nb;
            }
            r = fread(buf + n, 1, cap - n, f);
            n += r;
        } while (r > 0);
        fclose(f);
        c = m3_chat_from_source(buf ? buf : "", n, tfile, &err);
        free(buf);
    }
    if (!c) goto done;
    if (dump) {
        fputs(m3_chat_source(c), stdout);
        rc = 0;
        goto done;
    }
    if (!(msgs = load_json(mfile, "messages", &err))) goto done;
    if (toolfile && !(tools = load_json(toolfile, "tools", &err))) goto done;
    if (kw) {
        json_error_t je;
        kwargs = json_loads(kw, 0, &je);
        if (!kwargs) { m3_errf(&err, "--kwargs: column %d: %s", je.column, je.text); goto done; }
    }
    size_t len = 0;
    out = m3_chat_render(c, msgs, tools, gen, kwargs, NULL, &len, &err);
    if (!out) goto done;
    if (fwrite(out, 1, len, stdout) != len || fflush(stdout) != 0) { m3_errf(&err, "stdout: write error"); goto done; }
    rc = 0;
done:
    if (rc) fprintf(stderr, "m3 chat-template: %s\n", err.msg);
    free(out);
    json_decref(msgs);
    json_decref(tools);
    json_decref(kwargs);
    m3_chat_free(c);
    return rc;
}
