/* libFuzzer target: the ORC reader (postscript, footer, stripe footers, streams, string columns)
 * on a whole file of arbitrary bytes, and the integer/byte RLE decoders on the same bytes. */
#include <stdint.h>
#include <stddef.h>

#include "blobref/orc.h"

static int sink(void *ud, const uint8_t *data, size_t len, int is_null) {
  volatile uint8_t x = 0;
  if (!is_null && len) x = data[0] ^ data[len - 1];
  (void)x;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  br_err err;
  uint64_t vals[600];
  uint8_t bytes[600];
  (void)br_orc_read_all_from_memory(data, size, sink, NULL, &err);
  for (int version = 1; version <= 2; version++)
    for (int is_signed = 0; is_signed <= 1; is_signed++)
      (void)br_orc_rle_decode(version, is_signed, data, size, vals, 600, &err);
  (void)br_orc_byte_rle_decode(data, size, bytes, 600, &err);
  (void)br_orc_bool_decode(data, size, bytes, 600, &err);
  return 0;
}
