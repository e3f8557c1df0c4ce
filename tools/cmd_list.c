/* `blobref ls` (the index, page by page) and `blobref hold HASH` (quarantine by an admin): the
 * calls operators made with curl. */
#include <curl/curl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "http_client.h"

#define LS_PAGE 1000 /* blobs per GET /v1/blobs */

static const char ls_help[] =
    "usage: blobref ls [--state live|quarantined] [--limit N] [--json]\n"
    "\n"
    "Lists the index in hash order, one blob per line: HASH SIZE STATE CONTENT-TYPE\n"
    "(with --json, the record of GET /v1/blobs/HASH/meta, one object per line).\n"
    "\n"
    "  --state S   only blobs in state S (live or quarantined)\n"
    "  --limit N   at most N blobs (default: all)\n"
    "  -h, --help  this help\n";

/* Prints one listed record; returns 0, or -1 when standard output failed. */
static int ls_print(const cli_globals *g, json_t *b) {
  if (g->json) {
    char *text = json_dumps(b, JSON_COMPACT | JSON_PRESERVE_ORDER);
    int w = text ? printf("%s\n", text) : -1;
    free(text);
    return w < 0 ? -1 : 0;
  }
  const char *type = json_string_value(json_object_get(b, "content_type"));
  return printf("%s %" JSON_INTEGER_FORMAT " %s %s\n",
                json_string_value(json_object_get(b, "sha256")),
                json_integer_value(json_object_get(b, "size")),
                json_string_value(json_object_get(b, "state")), type && *type ? type : "-") < 0
             ? -1
             : 0;
}

int cmd_ls(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {{"state", required_argument, NULL, 's'},
                                           {"limit", required_argument, NULL, 'l'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  const char *state = NULL;
  unsigned long long limit = 0; /* 0 = all */
  int opt;
  char *end;
  optind = 0;
  opterr = 0;
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (opt) {
      case 's':
        if (strcmp(optarg, "live") != 0 && strcmp(optarg, "quarantined") != 0)
          return br_cli_usage_error("ls", "--state must be live or quarantined");
        state = optarg;
        break;
      case 'l':
        limit = strtoull(optarg, &end, 10);
        if (!*optarg || *end || optarg[0] == '-' || limit == 0)
          return br_cli_usage_error("ls", "--limit must be a positive number");
        break;
      case 'h':
        fputs(ls_help, stdout);
        return CLI_EXIT_OK;
      default:
        return br_cli_bad_option("ls", argv, longopts);
    }
  }
  if (optind != argc) return br_cli_usage_error("ls", "unexpected argument '%s'", argv[optind]);
  char after[BR_HEX_LEN + 1] = "";
  unsigned long long printed = 0;
  for (;;) {
    char path[256];
    unsigned long long want = limit && limit - printed < LS_PAGE ? limit - printed : LS_PAGE;
    snprintf(path, sizeof path, "/v1/blobs?limit=%llu%s%s%s%s", want, after[0] ? "&after=" : "",
             after, state ? "&state=" : "", state ? state : "");
    long status = 0;
    json_t *reply = NULL;
    br_err err;
    if (br_http_json(g->server, g->token, "GET", path, NULL, &status, &reply, &err) < 0) {
      fprintf(stderr, "blobref ls: %s\n", err.msg);
      return CLI_EXIT_FAILURE;
    }
    json_t *blobs = json_object_get(reply, "blobs");
    for (size_t i = 0; i < json_array_size(blobs); i++) {
      if (ls_print(g, json_array_get(blobs, i)) < 0) {
        json_decref(reply);
        fprintf(stderr, "blobref ls: cannot write to standard output\n");
        return CLI_EXIT_FAILURE;
      }
      printed++;
    }
    const char *next = json_string_value(json_object_get(reply, "next"));
    int more = next && strlen(next) == BR_HEX_LEN && (!limit || printed < limit);
    if (more) memcpy(after, next, BR_HEX_LEN + 1);
    json_decref(reply);
    if (!more) break;
  }
  return fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
}

static const char hold_help[] =
    "usage: blobref hold HASH [--reason TEXT]\n"
    "\n"
    "Quarantines a blob by hand (admin): it is no longer served (410) and no reconcile\n"
    "run brings it back; 'blobref restore HASH' does. Prints 'HASH STATE' (or, with\n"
    "--json, the record).\n"
    "\n"
    "  --reason TEXT  why (kept in the record, at most 256 bytes, one line)\n"
    "  -h, --help     this help\n";

int cmd_hold(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {{"reason", required_argument, NULL, 'r'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  const char *reason = NULL;
  int opt;
  optind = 0;
  opterr = 0;
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (opt) {
      case 'r':
        reason = optarg;
        break;
      case 'h':
        fputs(hold_help, stdout);
        return CLI_EXIT_OK;
      default:
        return br_cli_bad_option("hold", argv, longopts);
    }
  }
  if (argc - optind != 1) return br_cli_usage_error("hold", "expected exactly one HASH");
  char hex[BR_HEX_LEN + 1];
  if (br_cli_hash_parse(argv[optind], hex) != 0)
    return br_cli_usage_error("hold", "'%.80s' is not a SHA-256 (64 hex digits)", argv[optind]);
  char path[1024];
  int n = snprintf(path, sizeof path, "/v1/blobs/%s", hex);
  if (reason) {
    char *esc = curl_easy_escape(NULL, reason, 0);
    if (!esc) return CLI_EXIT_FAILURE;
    n = snprintf(path, sizeof path, "/v1/blobs/%s?reason=%s", hex, esc);
    curl_free(esc);
    if (n < 0 || (size_t)n >= sizeof path)
      return br_cli_usage_error("hold", "--reason is too long");
  }
  long status = 0;
  json_t *reply = NULL;
  br_err err;
  if (br_http_json(g->server, g->token, "DELETE", path, NULL, &status, &reply, &err) < 0) {
    fprintf(stderr, "blobref hold: %s\n", err.msg);
    return CLI_EXIT_FAILURE;
  }
  int w;
  if (g->json) {
    char *text = json_dumps(reply, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    w = text ? printf("%s\n", text) : -1;
    free(text);
  } else {
    w = printf("%s %s\n", hex, json_string_value(json_object_get(reply, "state")));
  }
  json_decref(reply);
  return w < 0 || fflush(stdout) != 0 ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}
