/* libFuzzer: tokenizer.json loading must never crash or leak; whatever loads must encode
 * and decode a fixed mixed string (and stream-decode its ids) cleanly. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const char TEXT[] = "Hello, world! It's 2024: caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd"
                           "  \t\n\r\n12345 <s> </s> <|endoftext|> [MASK] a-b--c";

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    m3_err err;
    m3_tok *t = m3_tok_load_json((const char *)data, size, &err);
    if (!t) return 0;
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (m3_tok_encode(t, TEXT, sizeof TEXT - 1, special, &ids, &n, &err) == 0) {
            free(m3_tok_decode(t, ids, n, special, NULL, &err));
            m3_tok_stream *s = m3_tok_stream_new(t, special, &err);
            const char *p;
            size_t pn;
            for (size_t i = 0; s && i < n; i++) m3_tok_stream_push(s, ids[i], &p, &pn, &err);
            if (s) m3_tok_stream_finish(s, &p, &pn);
            m3_tok_stream_free(s);
        }
        free(ids);
    }
    m3_tok_free(t);
    return 0;
}
