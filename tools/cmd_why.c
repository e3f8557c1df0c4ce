/* `blobref why HASH`: which tables, snapshots and data files keep a blob, or why an unreferenced
 * one is not quarantined yet (GET /v1/blobs/{hash}/refs). */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "http_client.h"

/* The refs reply as text: the blob's state and why, then each table's data files and snapshots. */
static void print_refs(json_t *reply) {
  printf("%s %s: %s\n", json_string_value(json_object_get(reply, "sha256")),
         json_string_value(json_object_get(reply, "state")),
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

int cmd_why(const cli_globals *g, int argc, char **argv) {
  char hex[BR_HEX_LEN + 1];
  if (argc != 2 || br_cli_hash_parse(argv[1], hex) < 0)
    return br_cli_usage_error("why", "expected one HASH (64 hex digits, optionally sha256:)");
  char path[128];
  snprintf(path, sizeof path, "/v1/blobs/%s/refs", hex);
  return cli_get_print(g, "why", path, print_refs);
}
