/* libFuzzer: config.json parsing (both spellings, validation) must never crash or leak. */
#include <stdlib.h>
#include <string.h>

#include "io/config.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    m3_config c;
    m3_err err;
    if (m3_config_parse(&c, text, "fuzz", &err) == 0) m3_config_free(&c);
    free(text);
    return 0;
}
