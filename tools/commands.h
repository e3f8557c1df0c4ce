/* The `blobref` command table: each subcommand is one function in its own file under tools/. */
#ifndef BLOBREF_TOOLS_COMMANDS_H
#define BLOBREF_TOOLS_COMMANDS_H

/* Options shared by every subcommand, from the global flags and the environment. */
typedef struct cli_globals {
  const char *server; /* base URL, default http://127.0.0.1:8080 or $BLOBREF_SERVER */
  const char *token;  /* bearer token or NULL ($BLOBREF_TOKEN) */
} cli_globals;

/* Each command gets argv starting at its own name; returns the process exit status
 * (0 success, 1 failure with a one-line error already printed to stderr, 2 usage). */
int cmd_put(const cli_globals *g, int argc, char **argv);
int cmd_get(const cli_globals *g, int argc, char **argv);
int cmd_stat(const cli_globals *g, int argc, char **argv);
int cmd_lookup(const cli_globals *g, int argc, char **argv);
int cmd_refs(const cli_globals *g, int argc, char **argv);
int cmd_reconcile(const cli_globals *g, int argc, char **argv);
int cmd_restore(const cli_globals *g, int argc, char **argv);
int cmd_token(const cli_globals *g, int argc, char **argv);
int cmd_extract_parquet(const cli_globals *g, int argc, char **argv);
int cmd_export(const cli_globals *g, int argc, char **argv);
int cmd_migrate(const cli_globals *g, int argc, char **argv);
int cmd_import(const cli_globals *g, int argc, char **argv);
int cmd_column(const cli_globals *g, int argc, char **argv);

#endif
