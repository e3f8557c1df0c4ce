/* libFuzzer target: the Avro container reader as a manifest list and as a manifest, from bytes in
 * memory. */
#include <stdint.h>
#include <string.h>

#include "iceberg/internal.h"

static int on_ref(void *ud, const ice_manifest_ref *r, br_err *err) {
  (void)err;
  *(size_t *)ud += r->path_len + (size_t)r->content;
  return 0;
}

static int on_entry(void *ud, const ice_entry *e, br_err *err) {
  (void)err;
  *(size_t *)ud += e->path_len + e->format_len + (size_t)e->status;
  return 0;
}

/* libavro's schema parser leaks on some malformed schemas (e.g. a named type defined twice);
 * that is libavro's, bounded by the 1 MiB schema limit, and only on damaged files. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libavro.so\n"; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t sum = 0;
  br_err err;
  ice_read_manifest_list(data, size, on_ref, &sum, NULL, &err);
  ice_read_manifest(data, size, on_entry, &sum, NULL, &err);
  return 0;
}
