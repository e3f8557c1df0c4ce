/* libFuzzer: the POST /v1/lookup body parser (depth check, jansson, type and hash checks). */
#include <stdlib.h>

#include "http/handlers.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *digests = NULL;
  size_t n = 0;
  enum br_api_error e;
  char msg[256];
  if (lookup_parse((const char *)data, size, 1000, &digests, &n, &e, msg, sizeof msg) == 0) {
    if (n > 1000) abort();
    free(digests);
  } else if (digests) {
    abort();
  }
  return 0;
}
