/* libFuzzer target: br_parquet_replace_column (footer re-encoding, chunk copy, the replaced
 * column's decode and encode) on arbitrary files, for every top-level BYTE_ARRAY column. */
#include <stdint.h>
#include <stddef.h>

#include "blobref/parquet.h"

static int discard(void *ud, const void *buf, size_t len, br_err *err) {
  (void)ud;
  (void)buf;
  (void)len;
  (void)err;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  br_err err;
  br_source *src = br_source_from_memory(data, size, &err);
  if (!src) return 0;
  br_parquet_file *f = br_parquet_open(src, &err);
  if (f) {
    for (size_t i = 0; i < br_parquet_num_columns(f) && i < 8; i++) {
      br_parquet_column_info ci;
      if (br_parquet_column(f, i, &ci) || ci.type != BR_PQ_BYTE_ARRAY) continue;
      br_parquet_replace_options o = {i, "h", (int)(i & 1), NULL, NULL};
      (void)br_parquet_replace_column(f, &o, discard, NULL, &err);
    }
    br_parquet_close(f);
  }
  br_source_close(src);
  return 0;
}
