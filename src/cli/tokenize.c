/* placeholder until the tokenizer lands (issue 3) */
#include <stdio.h>
#include "cli.h"
int m3_cmd_tokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "m3 tokenize: not built yet\n"); return 1; }
int m3_cmd_detokenize(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "m3 detokenize: not built yet\n"); return 1; }
