/* `blobref refs`: prints the SHA-256 hashes (or live data files) an Iceberg table references. */
#include <stdio.h>

#include "commands.h"

int cmd_refs(const cli_globals *g, int argc, char **argv) {
  (void)g;
  (void)argc;
  (void)argv;
  fprintf(stderr, "blobref refs: not implemented yet\n");
  return 1;
}
