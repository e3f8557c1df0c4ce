/* libFuzzer: the change notifications other nodes send (pg_listen.c); whatever parses as digests
 * must be exactly the payload those digests encode to, anything else a flush. */
#include <stdlib.h>
#include <string.h>

#include "index/pg_listen.h"

struct seen {
  uint8_t digests[PGL_PER_NOTIFY + 1][BR_SHA256_LEN];
  size_t n, flushes;
};

static void on_change(void *ud, const uint8_t *digest) {
  struct seen *s = ud;
  if (!digest) {
    s->flushes++;
    return;
  }
  if (s->n > PGL_PER_NOTIFY) abort(); /* more digests than a payload can hold */
  memcpy(s->digests[s->n++], digest, BR_SHA256_LEN);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static struct seen s;
  s.n = 0, s.flushes = 0;
  int rc = pgl_parse((const char *)data, size, on_change, &s);
  if (rc < 0 || rc == 0) {
    if (s.n || s.flushes != 1) abort(); /* a flush, and nothing else */
    return 0;
  }
  if ((size_t)rc != s.n || s.flushes) abort();
  static char out[PGL_PAYLOAD_MAX + 1];
  size_t parts = 0;
  size_t len = pgl_payload((const uint8_t(*)[BR_SHA256_LEN])s.digests, s.n, 0, &parts, out);
  if (parts != 1 || len != size || memcmp(out, data, size)) abort();
  return 0;
}
