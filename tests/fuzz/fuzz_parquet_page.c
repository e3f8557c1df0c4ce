/* libFuzzer target: the column-chunk/page decoder. Input: [column kind][codec][num_values u16 LE]
 * then the chunk bytes (page headers and pages) for one of a few fixed column descriptions. */
#include <stdint.h>
#include <stddef.h>

#include "parquet/internal.h"

static int count(void *ud, const uint8_t *data, size_t len, int is_null) {
  size_t *n = ud;
  (*n)++;
  if (!is_null && len) *n += data[0] & 1; /* touch the bytes */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static pq_leaf cols[] = {
      {"s", BR_PQ_BYTE_ARRAY, 0, -1, 1, 0},
      {"s", BR_PQ_BYTE_ARRAY, 0, -1, 0, 0},
      {"f", BR_PQ_FIXED_LEN_BYTE_ARRAY, 4, -1, 1, 0},
      {"i", BR_PQ_INT32, 0, -1, 1, 0},
      {"l", BR_PQ_INT64, 0, -1, 1, 0},
      {"r", BR_PQ_INT32, 0, -1, 3, 1},
      {"b", BR_PQ_BOOLEAN, 0, -1, 1, 0},
      {"d", BR_PQ_DOUBLE, 0, -1, 2, 2},
  };
  if (size < 4) return 0;
  const pq_leaf *col = &cols[data[0] % (sizeof cols / sizeof cols[0])];
  int codec = data[1] % 8;
  int64_t nv = data[2] | data[3] << 8;
  pq_scratch s = {0};
  br_err err;
  size_t n = 0;
  int64_t rows;
  (void)pq_decode_chunk(col, codec, data + 4, size - 4, nv, &s, count, &n, &rows, &err);
  pq_scratch_free(&s);
  return 0;
}
