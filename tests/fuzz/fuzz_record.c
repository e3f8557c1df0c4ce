/* libFuzzer: index record decoding; whatever decodes must re-encode to the same bytes. */
#include <stdlib.h>
#include <string.h>

#include "blobref/index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  br_record rec;
  br_err err;
  if (br_record_decode(data, size, &rec, &err) == 0) {
    static uint8_t buf[BR_RECORD_MAX_ENCODED];
    size_t len = br_record_encode(&rec, buf, sizeof buf);
    if (len != size || memcmp(buf, data, size) != 0) abort();
  }
  return 0;
}
