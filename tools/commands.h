/* The `blobref` command table: each subcommand is one function in its own file under tools/. */
#ifndef BLOBREF_TOOLS_COMMANDS_H
#define BLOBREF_TOOLS_COMMANDS_H

/* Options shared by every subcommand, from the global flags and the environment. */
typedef struct cli_globals {
  const char *server; /* base URL, default http://127.0.0.1:8080 or $BLOBREF_SERVER */
  const char *token;  /* bearer token or NULL ($BLOBREF_TOKEN) */
  int json;           /* --json: print data as JSON (one document, or one per line) */
} cli_globals;

/* Exit statuses of every command (documented in the README and blobref(1)). */
enum {
  CLI_EXIT_OK = 0,
  CLI_EXIT_FAILURE = 1, /* failed (or, for lookup, some hashes missing); a one-line error */
  CLI_EXIT_USAGE = 2,   /* the command line is wrong */
  CLI_EXIT_REFUSED = 3, /* a guard refused it (reconcile over max_fraction, ...) */
};

/* Each command gets argv starting at its own name, without the global options (they may appear
 * anywhere on the command line); returns one of the CLI_EXIT_ statuses. */
int cmd_put(const cli_globals *g, int argc, char **argv);
int cmd_get(const cli_globals *g, int argc, char **argv);
int cmd_stat(const cli_globals *g, int argc, char **argv);
int cmd_lookup(const cli_globals *g, int argc, char **argv);
int cmd_refs(const cli_globals *g, int argc, char **argv);
int cmd_reconcile(const cli_globals *g, int argc, char **argv);
int cmd_restore(const cli_globals *g, int argc, char **argv);
int cmd_why(const cli_globals *g, int argc, char **argv);
int cmd_ls(const cli_globals *g, int argc, char **argv);
int cmd_hold(const cli_globals *g, int argc, char **argv);
int cmd_token(const cli_globals *g, int argc, char **argv);
int cmd_extract_parquet(const cli_globals *g, int argc, char **argv);
int cmd_export(const cli_globals *g, int argc, char **argv);
int cmd_migrate(const cli_globals *g, int argc, char **argv);
int cmd_import(const cli_globals *g, int argc, char **argv);
int cmd_column(const cli_globals *g, int argc, char **argv);
int cmd_jobs(const cli_globals *g, int argc, char **argv);

/* cmd_jobs.c: polls GET /v1/jobs/ID, showing progress on stderr, until the job ends: 0 with
 * *final its last state (json_decref it); 1 when Ctrl-C detached (the job goes on); -1 when the
 * server refused or could not be reached (a line on stderr). Needs <jansson.h>. */
typedef struct json_t json_t;
int cli_job_follow(const cli_globals *g, long long id, json_t **final);

/* cmd_reconcile.c: GETs path and prints the reply: JSON with --json, else through text_fn; a
 * failure is one line on stderr naming `blobref COMMAND`. Returns the exit status. */
int cli_get_print(const cli_globals *g, const char *command, const char *path,
                  void (*text_fn)(json_t *));

#endif
