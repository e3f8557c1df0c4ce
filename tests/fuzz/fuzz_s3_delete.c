/* libFuzzer: the DeleteObjects answer reader (s3_parse_delete_result), on a fixed list of keys. */
#include <stdlib.h>
#include <string.h>

#include "store/s3_client.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const keys[] = {"sha256/aa/bb/aabb", "a&b<c", "k", "photos/\xc3\xa9.jpg"};
  enum { N = sizeof keys / sizeof keys[0] };
  char *xml = malloc(size ? size : 1); /* not NUL-terminated: the reader must keep to size */
  if (!xml) return 0;
  memcpy(xml, data, size);
  uint8_t failed[N] = {0};
  char why[128];
  int rc = s3_parse_delete_result(xml, size, keys, N, failed, why, sizeof why);
  int set = 0;
  for (int i = 0; i < N; i++) set += failed[i];
  if (rc > N || (rc >= 0 && rc != set) || strlen(why) >= sizeof why) abort();
  free(xml);
  return 0;
}
