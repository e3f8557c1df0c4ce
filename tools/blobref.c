/* blobref: the command-line tool. Parses the global flags and dispatches to a subcommand. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

static const struct command {
  const char *name;
  int (*run)(const cli_globals *g, int argc, char **argv);
  const char *usage;
} commands[] = {
    {"put", cmd_put, "put [--type CONTENT-TYPE] [--sha256 HEX] FILE|-   upload a blob"},
    {"get", cmd_get, "get [--range SPEC] [-o FILE] HASH               download a blob"},
    {"stat", cmd_stat, "stat HASH                                        show a blob's record"},
    {"lookup", cmd_lookup, "lookup [HASH...|-]                               which blobs exist"},
    {"refs", cmd_refs,
     "refs TABLE --column NAME [--form hex|binary|url] [--rewrite FROM=TO]... [--count|--files]"},
    {"reconcile", cmd_reconcile,
     "reconcile [--dry-run] [--force] [--full] [--wait]  start a reconcile run (admin)"},
    {"restore", cmd_restore,
     "restore HASH                                     un-quarantine a blob (admin)"},
    {"extract-parquet", cmd_extract_parquet,
     "extract-parquet IN OUT --column NAME [--as NEW] [--form hex|binary]   binaries -> SHA-256"},
    {"column", cmd_column,
     "column FILE --name COL                           a Parquet/ORC string or binary column"},
    {"export", cmd_export,
     "export -o FILE.parquet [--state live|quarantined]   the index as Parquet"},
    {"migrate", cmd_migrate,
     "migrate -c CONFIG --from STORE --to STORE [--verify sha256|size] ...  move blobs (admin)"},
    {"import", cmd_import,
     "import SOURCE -c CONFIG --store NAME [--in-place|--copy] ...  index existing files (admin)"},
    {"token", cmd_token,
     "token new --scopes read,write,admin [--name NAME]    a bearer token and its [token] section"},
};

static void usage(FILE *out) {
  fprintf(out, "usage: blobref [--server URL] [--token T] COMMAND [ARGS]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(out, "  %s\n", commands[i].usage);
  fprintf(out, "\nenvironment: BLOBREF_SERVER, BLOBREF_TOKEN\n");
}

int main(int argc, char **argv) {
  cli_globals g = {getenv("BLOBREF_SERVER"), getenv("BLOBREF_TOKEN")};
  if (!g.server || !*g.server) g.server = "http://127.0.0.1:8080";
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (!strcmp(argv[i], "--server") && i + 1 < argc) {
      g.server = argv[++i];
    } else if (!strcmp(argv[i], "--token") && i + 1 < argc) {
      g.token = argv[++i];
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "blobref: unknown option %s\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (i >= argc) {
    usage(stderr);
    return 2;
  }
  for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++)
    if (!strcmp(argv[i], commands[c].name)) return commands[c].run(&g, argc - i, argv + i);
  fprintf(stderr, "blobref: unknown command '%s'\n", argv[i]);
  usage(stderr);
  return 2;
}
