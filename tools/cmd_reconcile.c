/* `blobref reconcile` (start a run, optionally wait for its report) and `blobref restore HASH`
 * (bring back a blob quarantined by reconcile or by an admin). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "http_client.h"

static const char reconcile_usage[] =
    "usage: blobref reconcile [--dry-run] [--force] [--full] [--wait]\n"
    "       blobref reconcile runs        the latest runs, newest first: ID STATE STARTED ...\n"
    "       blobref reconcile show ID [--action A]\n"
    "                                     one run's report, or its list of blobs of action A:\n"
    "                                     quarantined, restored, deleted, pending or held\n"
    "  --dry-run  decide and report, change nothing\n"
    "  --force    quarantine even over max_fraction\n"
    "  --full     read every data file again (ignore the cache)\n"
    "  --wait     wait for the run to end and print its report; exit 1 when it failed,\n"
    "             3 when max_fraction refused it\n"
    "  --json     print the server's JSON (the run's id and links; with --wait, its report)\n";

/* Prints a reply as one JSON document; returns 0, or -1 when standard output failed. */
static int print_json(json_t *doc) {
  return json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) == 0 &&
                 fputc('\n', stdout) != EOF && fflush(stdout) == 0
             ? 0
             : -1;
}

static void print_summary(json_t *rep) {
  json_t *b = json_object_get(rep, "blobs");
  printf(
      "run %lld %s: %lld live, %lld marked, %lld quarantined, %lld restored, %lld deleted, "
      "%lld bytes reclaimed%s\n",
      (long long)json_integer_value(json_object_get(rep, "id")),
      json_string_value(json_object_get(rep, "state")),
      (long long)json_integer_value(json_object_get(b, "live")),
      (long long)json_integer_value(json_object_get(b, "marked")),
      (long long)json_integer_value(json_object_get(b, "quarantined")),
      (long long)json_integer_value(json_object_get(b, "restored")),
      (long long)json_integer_value(json_object_get(b, "deleted")),
      (long long)json_integer_value(json_object_get(rep, "bytes_reclaimed")),
      json_is_true(json_object_get(rep, "dry_run")) ? " (dry run: nothing changed)" : "");
  const char *refused = json_string_value(json_object_get(rep, "refused"));
  if (refused) printf("refused: %s\n", refused);
  json_t *l = json_object_get(rep, "lists");
  if (json_is_object(l))
    printf(
        "listed: %lld quarantined, %lld restored, %lld deleted, %lld held, %lld pending (%lld "
        "bytes); see 'blobref reconcile show ID --action A'\n",
        (long long)json_integer_value(json_object_get(l, "quarantined")),
        (long long)json_integer_value(json_object_get(l, "restored")),
        (long long)json_integer_value(json_object_get(l, "deleted")),
        (long long)json_integer_value(json_object_get(l, "held")),
        (long long)json_integer_value(json_object_get(l, "pending")),
        (long long)json_integer_value(json_object_get(l, "bytes")));
  else if (json_is_null(l))
    printf("listed: nothing, the run recorded counts only ([reconcile] lists = false)\n");
  json_t *errs = json_object_get(rep, "errors");
  for (size_t i = 0; i < json_array_size(errs); i++)
    printf("error: %s\n", json_string_value(json_array_get(errs, i)));
}

int cli_get_print(const cli_globals *g, const char *command, const char *path,
                  void (*text_fn)(json_t *)) {
  long status = 0;
  json_t *reply = NULL;
  br_err err;
  if (br_http_json(g->server, g->token, "GET", path, NULL, &status, &reply, &err) < 0) {
    fprintf(stderr, "blobref %s: %s\n", command, err.msg);
    return CLI_EXIT_FAILURE;
  }
  int rc = 0;
  if (g->json)
    rc = print_json(reply);
  else
    text_fn(reply);
  json_decref(reply);
  return rc < 0 || fflush(stdout) != 0 ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}

/* One line per run: id, state, start time (UTC), dry run or not, and its counts. */
static void print_runs(json_t *reply) {
  json_t *runs = json_object_get(reply, "runs");
  printf("%-6s %-9s %-20s %-4s %10s %10s %10s\n", "ID", "STATE", "STARTED (UTC)", "DRY", "LIVE",
         "QUARANT.", "DELETED");
  for (size_t i = 0; i < json_array_size(runs); i++) {
    json_t *r = json_array_get(runs, i), *b = json_object_get(r, "blobs");
    char when[32] = "-";
    json_t *started = json_object_get(r, "started_at");
    if (json_is_string(started)) snprintf(when, sizeof when, "%.20s", json_string_value(started));
    printf("%-6lld %-9s %-20s %-4s %10lld %10lld %10lld\n",
           (long long)json_integer_value(json_object_get(r, "id")),
           json_string_value(json_object_get(r, "state")), when,
           json_is_true(json_object_get(r, "dry_run")) ? "yes" : "no",
           (long long)json_integer_value(json_object_get(b, "live")),
           (long long)json_integer_value(json_object_get(b, "quarantined")),
           (long long)json_integer_value(json_object_get(b, "deleted")));
  }
}

/* Prints every blob of one run's list, page by page: one "HASH [ELIGIBLE_AT]" line each, or with
 * --json one document {"run","action","blobs":[...]}. Returns the exit status. */
static int show_list(const cli_globals *g, const char *id, const char *action) {
  json_t *all = json_array();
  char after[BR_HEX_LEN + 1] = "";
  int rc = CLI_EXIT_OK;
  for (;;) {
    char path[256];
    snprintf(path, sizeof path, "/v1/reconcile/runs/%s/blobs?action=%s&limit=1000%s%s", id, action,
             *after ? "&after=" : "", after);
    long status = 0;
    json_t *reply = NULL;
    br_err err;
    if (br_http_json(g->server, g->token, "GET", path, NULL, &status, &reply, &err) < 0) {
      fprintf(stderr, "blobref reconcile: %s\n", err.msg);
      rc = CLI_EXIT_FAILURE;
      break;
    }
    json_t *blobs = json_object_get(reply, "blobs");
    for (size_t i = 0; i < json_array_size(blobs); i++) {
      json_t *b = json_array_get(blobs, i);
      if (g->json) {
        json_array_append(all, b);
        continue;
      }
      const char *when = json_string_value(json_object_get(b, "eligible_at"));
      printf("%s%s%s\n", json_string_value(json_object_get(b, "sha256")), when ? " " : "",
             when ? when : "");
    }
    const char *next = json_string_value(json_object_get(reply, "next"));
    if (next) snprintf(after, sizeof after, "%s", next);
    json_decref(reply);
    if (!next) break;
  }
  if (rc == CLI_EXIT_OK && g->json) {
    json_t *doc = json_pack("{s:I,s:s,s:O}", "run", (json_int_t)strtoll(id, NULL, 10), "action",
                            action, "blobs", all);
    if (print_json(doc) < 0) rc = CLI_EXIT_FAILURE;
    json_decref(doc);
  }
  json_decref(all);
  return rc == CLI_EXIT_OK && fflush(stdout) != 0 ? CLI_EXIT_FAILURE : rc;
}

int cmd_reconcile(const cli_globals *g, int argc, char **argv) {
  int dry = 0, force = 0, full = 0, wait = 0;
  if (argc >= 2 && !strcmp(argv[1], "runs")) {
    if (argc != 2) return br_cli_usage_error("reconcile runs", "takes no arguments");
    return cli_get_print(g, "reconcile", "/v1/reconcile/runs", print_runs);
  }
  if (argc >= 2 && !strcmp(argv[1], "show")) {
    char *end;
    const char *action = NULL;
    if (argc == 5 && !strcmp(argv[3], "--action")) {
      action = argv[4];
      static const char *const actions[] = {"quarantined", "restored", "deleted", "pending",
                                            "held"};
      int known = 0;
      for (size_t i = 0; i < sizeof actions / sizeof *actions; i++)
        known |= !strcmp(action, actions[i]);
      if (!known)
        return br_cli_usage_error("reconcile show",
                                  "--action is quarantined, restored, deleted, pending or held");
    } else if (argc != 3) {
      return br_cli_usage_error("reconcile show", "expected one run ID [--action A]");
    }
    if (!*argv[2] || strtoull(argv[2], &end, 10) == 0 || *end)
      return br_cli_usage_error("reconcile show", "expected one run ID (a positive number)");
    if (action) return show_list(g, argv[2], action);
    char path[128];
    snprintf(path, sizeof path, "/v1/reconcile/runs/%s", argv[2]);
    return cli_get_print(g, "reconcile", path, print_summary);
  }
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dry-run"))
      dry = 1;
    else if (!strcmp(argv[i], "--force"))
      force = 1;
    else if (!strcmp(argv[i], "--full"))
      full = 1;
    else if (!strcmp(argv[i], "--wait"))
      wait = 1;
    else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      fputs(reconcile_usage, stdout);
      return 0;
    } else {
      fprintf(stderr, "blobref reconcile: unknown option %s\n%s", argv[i], reconcile_usage);
      return 2;
    }
  }
  char path[128];
  snprintf(path, sizeof path, "/v1/reconcile?dry_run=%d&force=%d&full=%d", dry, force, full);
  long status = 0;
  json_t *reply = NULL;
  br_err err;
  if (br_http_json(g->server, g->token, "POST", path, NULL, &status, &reply, &err) < 0) {
    fprintf(stderr, "blobref reconcile: %s\n", err.msg);
    return 1;
  }
  long long id = (long long)json_integer_value(json_object_get(reply, "id"));
  if (!wait) {
    int rc = 0;
    if (g->json)
      rc = print_json(reply);
    else
      printf(
          "reconcile run %lld started%s; see 'blobref reconcile --wait' or GET "
          "/v1/reconcile/runs/%lld\n",
          id, dry ? " (dry run)" : "", id);
    json_decref(reply);
    return rc < 0 ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
  }
  json_decref(reply);
  snprintf(path, sizeof path, "/v1/reconcile/runs/%lld", id);
  for (;;) {
    if (br_http_json(g->server, g->token, "GET", path, NULL, &status, &reply, &err) < 0) {
      fprintf(stderr, "blobref reconcile: %s\n", err.msg);
      return 1;
    }
    const char *state = json_string_value(json_object_get(reply, "state"));
    if (state && strcmp(state, "running") != 0) {
      int out = 0;
      if (g->json)
        out = print_json(reply);
      else
        print_summary(reply);
      int failed = !strcmp(state, "failed");
      int refused = json_is_string(json_object_get(reply, "refused"));
      json_decref(reply);
      if (out < 0) return CLI_EXIT_FAILURE;
      return failed ? CLI_EXIT_FAILURE : refused ? CLI_EXIT_REFUSED : CLI_EXIT_OK;
    }
    json_decref(reply);
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

int cmd_restore(const cli_globals *g, int argc, char **argv) {
  if (argc != 2 || argv[1][0] == '-') {
    fprintf(stderr, "usage: blobref restore HASH\n");
    return 2;
  }
  const char *hash = argv[1];
  if (!strncmp(hash, "sha256:", 7)) hash += 7;
  if (strlen(hash) != 64 || strspn(hash, "0123456789abcdef") != 64) {
    fprintf(stderr, "blobref restore: a hash is 64 lowercase hex digits\n");
    return 2;
  }
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s/restore", hash);
  long status = 0;
  json_t *reply = NULL;
  br_err err;
  if (br_http_json(g->server, g->token, "POST", path, NULL, &status, &reply, &err) < 0) {
    fprintf(stderr, "blobref restore: %s\n", err.msg);
    return 1;
  }
  int rc = 0;
  if (g->json)
    rc = print_json(reply);
  else
    printf("%s %s\n", hash, json_string_value(json_object_get(reply, "state")));
  json_decref(reply);
  return rc < 0 ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}
