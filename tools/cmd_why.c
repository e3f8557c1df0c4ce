/* `blobref why HASH`: which tables, snapshots and data files keep a blob, or why an unreferenced
 * one is not quarantined yet (GET /v1/blobs/{hash}/refs). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "http_client.h"

int cmd_why(const cli_globals *g, int argc, char **argv) {
  char hex[BR_HEX_LEN + 1];
  if (argc != 2 || br_cli_hash_parse(argv[1], hex) < 0)
    return br_cli_usage_error("why", "expected one HASH (64 hex digits, optionally sha256:)");
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s/refs", hex);
  long status = 0;
  json_t *reply = NULL;
  br_err err;
  if (br_http_json(g->server, g->token, "GET", path, NULL, &status, &reply, &err) < 0) {
    fprintf(stderr, "blobref why: %s\n", err.msg);
    return CLI_EXIT_FAILURE;
  }
  int rc = 0;
  if (g->json) {
    rc = json_dumpf(reply, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) == 0 &&
                 fputc('\n', stdout) != EOF
             ? 0
             : -1;
  } else {
    printf("%s %s: %s\n", hex, json_string_value(json_object_get(reply, "state")),
           json_string_value(json_object_get(reply, "why")));
    size_t i, j, k;
    json_t *t, *f, *s;
    json_array_foreach(json_object_get(reply, "tables"), i, t) {
      const char *name = json_string_value(json_object_get(t, "name"));
      const char *terr = json_string_value(json_object_get(t, "error"));
      if (terr) printf("  table %s: %s\n", name, terr);
      json_array_foreach(json_object_get(t, "data_files"), j, f) {
        printf("  table %s, %s, snapshots", name, json_string_value(json_object_get(f, "path")));
        json_array_foreach(json_object_get(f, "snapshots"), k, s)
            printf(" %lld", (long long)json_integer_value(s));
        putchar('\n');
      }
    }
  }
  json_decref(reply);
  return rc < 0 || fflush(stdout) != 0 ? CLI_EXIT_FAILURE : CLI_EXIT_OK;
}
