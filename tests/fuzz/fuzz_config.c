/* libFuzzer: the INI config loader (inih + our key table) and its cross-checks. */
#include <stdlib.h>
#include <string.h>

#include "blobref/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  memcpy(text, data, size);
  text[size] = '\0';
  br_config cfg;
  br_err err;
  br_config_init(&cfg);
  if (br_config_load_string(&cfg, text, "fuzz.conf", &err) == 0) br_config_finish(&cfg, &err);
  br_config_free(&cfg);
  free(text);
  return 0;
}
