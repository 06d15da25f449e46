#include <stdio.h>
#include "cli.h"
int m3_cmd_bench(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "m3 bench: not built yet\n"); return 1; }
