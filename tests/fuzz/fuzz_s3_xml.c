/* libFuzzer: the S3 answer reader (tags, entities and numeric character references). */
#include <stdlib.h>
#include <string.h>

#include "store/s3_client.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *xml = malloc(size + 1);
  if (!xml) return 0;
  memcpy(xml, data, size);
  xml[size] = '\0';
  char out[64];
  static const char *const tags[] = {"Key", "Code", "Message", "UploadId", "Size"};
  for (size_t t = 0; t < sizeof tags / sizeof tags[0]; t++) {
    const char *from = NULL;
    for (int i = 0; i < 1000 && s3_xml_text(xml, tags[t], &from, out, sizeof out) == 0; i++)
      if (strlen(out) >= sizeof out) abort();
  }
  free(xml);
  return 0;
}
