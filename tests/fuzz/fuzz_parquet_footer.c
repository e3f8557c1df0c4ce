/* libFuzzer target: the Thrift compact FileMetaData decoder (and page headers) on arbitrary bytes.
 */
#include <stdint.h>
#include <stddef.h>

#include "parquet/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pq_meta m;
  br_err err;
  if (pq_meta_decode(data, size, &m, &err) == 0) pq_meta_free(&m);
  pq_page_header h;
  size_t used;
  (void)pq_page_header_decode(data, size, &h, &used, &err);
  return 0;
}
