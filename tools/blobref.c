/* blobref: the command-line tool. Takes the global options wherever they appear, then
 * dispatches to a subcommand (each in its own tools/cmd_*.c). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blobref/version.h"
#include "commands.h"
#include "http_client.h"

static const struct command {
  const char *name;
  int (*run)(const cli_globals *g, int argc, char **argv);
  const char *usage;
  const char *own; /* global option names this command takes as its own after its name */
} commands[] = {
    {"put", cmd_put, "put [--type CONTENT-TYPE] [-r] [--jobs N] FILE|DIR...|-  upload blobs", NULL},
    {"get", cmd_get, "get [--range SPEC] [--preview] [-o FILE] HASH   download a blob", NULL},
    {"stat", cmd_stat, "stat HASH                                        show a blob's record",
     NULL},
    {"lookup", cmd_lookup, "lookup [HASH...|-]                               which blobs exist",
     NULL},
    {"ls", cmd_ls, "ls [--state live|quarantined] [--limit N]         list the index", NULL},
    {"refs", cmd_refs,
     "refs TABLE --column NAME [--form hex|binary|url] [--rewrite FROM=TO]... [--count|--files]",
     "--token"}, /* the REST catalog's token */
    {"reconcile", cmd_reconcile,
     "reconcile [--dry-run] [--force] [--full] [--wait]  start a reconcile run (admin)\n"
     "  reconcile runs | reconcile show ID               the runs' reports",
     NULL},
    {"hold", cmd_hold,
     "hold HASH [--reason TEXT]                        quarantine a blob by hand (admin)", NULL},
    {"restore", cmd_restore,
     "restore HASH                                     un-quarantine a blob (admin)", NULL},
    {"why", cmd_why,
     "why HASH                                         what keeps a blob, or why it is not "
     "quarantined",
     NULL},
    {"extract-parquet", cmd_extract_parquet,
     "extract-parquet IN OUT --column NAME [--as NEW] [--form hex|binary]   binaries -> SHA-256",
     NULL},
    {"column", cmd_column,
     "column FILE --name COL                           a Parquet/ORC string or binary column",
     NULL},
    {"export", cmd_export,
     "export -o FILE.parquet [--state live|quarantined]   the index as Parquet", NULL},
    {"migrate", cmd_migrate,
     "migrate --from STORE --to STORE [--verify sha256|size] [--detach] ...  move blobs (admin)",
     NULL},
    {"jobs", cmd_jobs,
     "jobs [ID] | jobs cancel ID                       the server's migrate/import jobs (admin)",
     NULL},
    {"import", cmd_import,
     "import SOURCE -c CONFIG --store NAME [--in-place|--copy] ...  index existing files (admin)",
     NULL},
    {"token", cmd_token,
     "token new --scopes read,write,admin [--name NAME]    a bearer token and its [token] section",
     NULL},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out) {
  fprintf(out,
          "usage: blobref [--server URL] [--token T] [--json] COMMAND [ARGS]\n"
          "       blobref --version\n\ncommands:\n");
  for (size_t i = 0; i < NCOMMANDS; i++) fprintf(out, "  %s\n", commands[i].usage);
  fprintf(out,
          "\nglobal options may come anywhere (before a lone '--'), as --opt VALUE or "
          "--opt=VALUE.\n"
          "environment: BLOBREF_SERVER, BLOBREF_TOKEN\n"
          "exit status: 0 ok, 1 failure, 2 usage, 3 refused by a guard\n");
}

/* The command closest to a mistyped one (within 2 edits, or the only one it is a prefix of). */
static const char *closest_command(const char *typed) {
  const char *best = NULL, *prefix_of = NULL;
  size_t best_d = 3, prefixes = 0;
  for (size_t i = 0; i < NCOMMANDS; i++) {
    size_t d = br_cli_edit_distance(typed, commands[i].name);
    if (d < best_d) best_d = d, best = commands[i].name;
    if (*typed && !strncmp(commands[i].name, typed, strlen(typed)))
      prefixes++, prefix_of = commands[i].name;
  }
  return best ? best : prefixes == 1 ? prefix_of : NULL;
}

/* Is argv word a (--name or --name=value) the option name, listed in own ("--a --b")? */
static int is_own_option(const char *own, const char *a) {
  size_t n = strcspn(a, "=");
  for (const char *p = own; p && *p;) {
    size_t len = strcspn(p, " ");
    if (len == n && !strncmp(p, a, n)) return 1;
    p += len;
    p += strspn(p, " ");
  }
  return 0;
}

/* The entry of command name, or NULL. */
static const struct command *find_command(const char *name) {
  for (size_t c = 0; c < NCOMMANDS; c++)
    if (!strcmp(name, commands[c].name)) return &commands[c];
  return NULL;
}

/* Takes a global option at argv[*i] ("--server URL", "--server=URL", "--token", "--json"),
 * advancing *i past its value. Returns 1 when it was one, 0 when not, -1 when its value is
 * missing. */
static int take_global(cli_globals *g, int argc, char **argv, int *i) {
  static const struct {
    const char *name;
    size_t offset;
  } valued[] = {{"--server", offsetof(cli_globals, server)},
                {"--token", offsetof(cli_globals, token)}};
  const char *a = argv[*i];
  if (!strcmp(a, "--json")) return g->json = 1;
  for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) {
    size_t n = strlen(valued[k].name);
    if (strncmp(a, valued[k].name, n) != 0 || (a[n] != '\0' && a[n] != '=')) continue;
    const char **slot = (const char **)((char *)g + valued[k].offset);
    if (a[n] == '=') {
      *slot = a + n + 1;
    } else {
      if (*i + 1 >= argc) return -1;
      *slot = argv[++*i];
    }
    return 1;
  }
  return 0;
}

/* Runs the command rest[0] with the global options g. Returns the exit status. */
static int dispatch(const cli_globals *g, int nrest, char **rest) {
  if (nrest == 0) {
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *name = rest[0];
  if (!strcmp(name, "--version") || !strcmp(name, "version")) {
    if (g->json)
      printf("{\"version\": \"%s\"}\n", BLOBREF_VERSION);
    else
      printf("blobref %s\n", BLOBREF_VERSION);
    return CLI_EXIT_OK;
  }
  if (!strcmp(name, "-h") || !strcmp(name, "--help") || !strcmp(name, "help")) {
    usage(stdout);
    return CLI_EXIT_OK;
  }
  if (name[0] == '-') {
    fprintf(stderr, "blobref: unknown option %s (a command comes first: see 'blobref --help')\n",
            name);
    return CLI_EXIT_USAGE;
  }
  const struct command *c = find_command(name);
  if (c) return c->run(g, nrest, rest);
  const char *guess = closest_command(name);
  if (guess)
    fprintf(stderr, "blobref: unknown command '%s'; did you mean '%s'?\n", name, guess);
  else
    fprintf(stderr, "blobref: unknown command '%s' (see 'blobref --help')\n", name);
  return CLI_EXIT_USAGE;
}

int main(int argc, char **argv) {
  cli_globals g = {getenv("BLOBREF_SERVER"), getenv("BLOBREF_TOKEN"), 0};
  if (!g.server || !*g.server) g.server = "http://127.0.0.1:8080";
  /* The command's own argv: everything but the global options (none are taken after "--"). */
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  if (!rest) {
    fprintf(stderr, "blobref: out of memory\n");
    return CLI_EXIT_FAILURE;
  }
  int nrest = 0, dashdash = 0;
  const struct command *cmd = NULL; /* once its name is seen */
  for (int i = 1; i < argc; i++) {
    if (!dashdash && !strcmp(argv[i], "--")) dashdash = 1;
    int own = cmd && is_own_option(cmd->own, argv[i]);
    int t = dashdash || own ? 0 : take_global(&g, argc, argv, &i);
    if (t < 0) {
      fprintf(stderr, "blobref: %s needs a value\n", argv[i]);
      free(rest);
      return CLI_EXIT_USAGE;
    }
    if (t == 0) {
      if (own && i + 1 < argc && !strchr(argv[i], '=')) /* its value is the command's too */
        rest[nrest++] = argv[i++];
      rest[nrest++] = argv[i];
      if (nrest == 1) cmd = find_command(argv[i]);
    }
  }
  int rc = dispatch(&g, nrest, rest);
  free(rest);
  return rc;
}
