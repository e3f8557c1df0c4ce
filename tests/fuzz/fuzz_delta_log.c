/* libFuzzer target: the Delta log's commit-line / action parser, log file names, paths and the
 * column mapping lookup in a schemaString. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "delta/internal.h"

static int on_action(void *ud, const dl_action *a, br_err *err) {
  (void)err;
  size_t *n = ud;
  (*n)++;
  if (a->path) {
    char out[DL_MAX_PATH + 1];
    dl_percent_decode(a->path, a->path_len, out, sizeof out);
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  br_err err;
  size_t n = 0;
  dl_parse_commit(data, size, on_action, &n, &err);
  /* The same bytes as a `_delta_log/` file name and as a recorded path. */
  char name[256];
  size_t k = size < sizeof name - 1 ? size : sizeof name - 1;
  memcpy(name, data, k);
  name[k] = 0;
  dl_name nm;
  dl_parse_name(name, &nm);
  char out[64];
  dl_percent_decode((const char *)data, size, out, sizeof out);
  char *schema = malloc(size + 1);
  if (schema) {
    memcpy(schema, data, size);
    schema[size] = 0;
    dl_physical_column(schema, "a.b", out, sizeof out);
    free(schema);
  }
  return 0;
}
