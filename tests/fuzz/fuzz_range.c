/* libFuzzer: the Range header parser. Checks the invariants of what it returns. */
#include <stdlib.h>
#include <string.h>

#include "blobref/range.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 8) return 0;
  uint64_t repr;
  memcpy(&repr, data, 8);
  repr %= 1ull << 40;
  char *hdr = malloc(size - 8 + 1);
  memcpy(hdr, data + 8, size - 8);
  hdr[size - 8] = '\0';
  br_byte_range out[BR_RANGE_MAX];
  size_t n = 0;
  enum br_range_result r = br_range_parse(hdr, repr, out, &n);
  if (r == BR_RANGE_OK) {
    if (n == 0 || n > BR_RANGE_MAX) abort();
    for (size_t i = 0; i < n; i++)
      if (out[i].first > out[i].last || out[i].last >= repr) abort();
  } else if (n != 0) {
    abort();
  }
  free(hdr);
  return 0;
}
