/* placeholder until the chat templates land (issue 3) */
#include <stdio.h>
#include "cli.h"
int m3_cmd_chat_template(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "m3 chat-template: not built yet\n"); return 1; }
