/* `blobref import`: placeholder until the importer lands. */
#include <stdio.h>

#include "commands.h"

int cmd_import(const cli_globals *g, int argc, char **argv) {
  (void)g, (void)argc, (void)argv;
  fprintf(stderr, "blobref import: not implemented yet\n");
  return 1;
}
