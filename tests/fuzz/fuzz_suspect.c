/* libFuzzer: the suspect list (DATA_DIR/suspect) as br_suspect_load reads it; every entry it
 * returns must be well formed and findable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/suspect.h"

static char dir[64];

/* Writes the input as a data directory's suspect list, loads it and checks what came back. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "/tmp/fuzz_suspect.XXXXXX");
    if (!mkdtemp(dir)) abort();
  }
  char path[128];
  snprintf(path, sizeof path, "%s/suspect", dir);
  FILE *f = fopen(path, "we");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
  br_suspect *list;
  size_t n;
  br_err err;
  if (br_suspect_load(dir, &list, &n, &err) < 0) abort(); /* a readable file always loads */
  if (n > size / (BR_HEX_LEN + 4)) abort();               /* a line is at least "<hex> 0 s k\n" */
  for (size_t i = 0; i < n; i++) {
    const br_suspect *s = &list[i];
    size_t ls = strlen(s->store), lk = strlen(s->key);
    if (!ls || ls > BR_MAX_STORE_NAME || !lk || lk > BR_MAX_KEY) abort();
    if (strchr(s->store, ' ') || strchr(s->key, '\n')) abort();
    const br_suspect *hit = br_suspect_find(list, n, s->digest, s->store, s->key);
    if (!hit || hit < s) abort(); /* the newest entry for it: this one or a later one */
  }
  free(list);
  unlink(path);
  return 0;
}
