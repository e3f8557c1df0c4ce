/* blobref put/get/stat/lookup: the blob commands of the command-line tool (work in progress). */
#include <stdio.h>

#include "commands.h"

static int not_yet(const char *name) {
  fprintf(stderr, "blobref: %s: not implemented yet\n", name);
  return 1;
}

int cmd_put(const cli_globals *g, int argc, char **argv) { return not_yet("put"); }
int cmd_get(const cli_globals *g, int argc, char **argv) { return not_yet("get"); }
int cmd_stat(const cli_globals *g, int argc, char **argv) { return not_yet("stat"); }
int cmd_lookup(const cli_globals *g, int argc, char **argv) { return not_yet("lookup"); }
