/* libFuzzer: blob id parsing (URL path segment and JSON strings). A parsed id must re-encode to
 * the canonical 64 lowercase hex digits it came from. */
#include <stdlib.h>
#include <string.h>

#include "blobref/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t d[BR_SHA256_LEN];
  if (br_blob_id_parse((const char *)data, size, d) == 0) {
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(d, hex);
    const char *in = (const char *)data;
    if (size == BR_HEX_LEN + 7) in += 7;
    if (memcmp(hex, in, BR_HEX_LEN) != 0) abort();
  }
  uint64_t v;
  char *s = malloc(size + 1);
  memcpy(s, data, size);
  s[size] = '\0';
  br_parse_size(s, &v);
  br_parse_duration_ms(s, &v);
  free(s);
  return 0;
}
