/* The suspect list (core/suspect.c): marks round-trip through DATA_DIR/suspect, the newest entry
 * wins, malformed and torn lines are skipped, and the file stops growing at its bound. */
#include <stdlib.h>
#include <unistd.h>

#include "core/suspect.h"
#include "unit.h"

int main(void) {
  char dir[] = "/tmp/blobref-suspect-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  char path[64];
  snprintf(path, sizeof path, "%s/suspect", dir);
  br_err err;
  br_suspect *list;
  size_t n;
  CHECK(br_suspect_load(dir, &list, &n, &err) == 0 && n == 0 && !list, "no file: empty list");

  uint8_t a[BR_SHA256_LEN] = {0xab, 1}, b[BR_SHA256_LEN] = {0xcd, 2};
  CHECK(br_suspect_mark(dir, a, "lake", "sha256/ab/01/x", &err) == 0, "%s", err.msg);
  CHECK(br_suspect_mark(dir, b, "origin", "in/a key with spaces.bin", &err) == 0, "%s", err.msg);
  CHECK(br_suspect_mark(dir, a, "lake", "sha256/ab/01/x", &err) == 0, "%s", err.msg);
  CHECK(br_suspect_mark(dir, a, "bad store", "k", &err) < 0, "a store name with a space");
  CHECK(br_suspect_mark(dir, a, "lake", "two\nlines", &err) < 0, "a key with a newline");
  FILE *f = fopen(path, "a");
  fputs("not a line\n", f);
  fputs("abab 12 lake k\n", f);
  fputs("abababababababababababababababababababababababababababababababab x lake k\n", f);
  fputs("cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd 5 lake\n", f);
  fputs("cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd 5 lake torn", f);
  fclose(f);
  CHECK(br_suspect_load(dir, &list, &n, &err) == 0, "%s", err.msg);
  CHECK(n == 3, "%zu entries, want 3", n);
  const br_suspect *s = br_suspect_find(list, n, a, "lake", "sha256/ab/01/x");
  CHECK(s == &list[2], "the newest entry of a location");
  s = br_suspect_find(list, n, b, "origin", "in/a key with spaces.bin");
  CHECK(s && s->at_ms > 0, "a key with spaces");
  CHECK(!br_suspect_find(list, n, b, "lake", "in/a key with spaces.bin"), "another store");
  CHECK(!br_suspect_find(list, n, a, "lake", "sha256/ab/01/y"), "another key");
  free(list);

  /* bounded: a full list refuses more marks */
  CHECK(truncate(path, BR_SUSPECT_FILE_MAX) == 0, "truncate");
  CHECK(br_suspect_mark(dir, a, "lake", "k", &err) < 0 && strstr(err.msg, "full"),
        "a full list: %s", err.msg);
  unlink(path);
  rmdir(dir);
  return unit_summary("test_suspect");
}
