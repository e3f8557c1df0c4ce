/* libFuzzer: the header grammar (content types, echoed text, request ids) and the passive-type
 * list. Checks that nothing accepted could break a header line. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blobref/header.h"

/* Aborts when an accepted value holds a byte that could end or fold a header line. */
static void must_be_one_line(const char *v) {
  for (const char *p = v; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *v = malloc(size + 1);
  if (!v) return 0;
  memcpy(v, data, size);
  v[size] = '\0';
  if (!br_header_content_type_check(v)) {
    if (strlen(v) > BR_MAX_HEADER_CONTENT_TYPE || !strchr(v, '/')) abort();
    must_be_one_line(v);
    for (const char *p = v; *p; p++)
      if ((unsigned char)*p >= 0x80) abort();
  }
  if (!br_header_text_check(v, 255)) {
    if (strlen(v) > 255 || !*v) abort();
    must_be_one_line(v);
  }
  if (br_header_request_id_ok(v)) {
    if (strlen(v) > BR_MAX_REQUEST_ID) abort();
    for (const char *p = v; *p; p++)
      if (*p == '"' || *p == '\\' || *p == ' ' || (unsigned char)*p >= 0x7f) abort();
    must_be_one_line(v);
  }
  (void)br_content_type_is_passive(v);
  free(v);
  return 0;
}
