/* HTTP Range header parsing (RFC 9110 section 14): pure, bounded, table-tested. */
#ifndef BLOBREF_RANGE_H
#define BLOBREF_RANGE_H

#include <stddef.h>
#include <stdint.h>

#define BR_RANGE_MAX 64          /* most ranges accepted in one request */
#define BR_RANGE_HEADER_MAX 4096 /* longest Range header considered */

typedef struct br_byte_range {
  uint64_t first, last; /* inclusive, already clamped to the representation */
} br_byte_range;

enum br_range_result {
  BR_RANGE_IGNORE,        /* no Range, or a unit other than bytes: serve the whole thing (200) */
  BR_RANGE_OK,            /* *n >= 1 satisfiable ranges in out (206) */
  BR_RANGE_UNSATISFIABLE, /* well-formed, none satisfiable (416, Content-Range: bytes *\/size) */
  BR_RANGE_MALFORMED,     /* a bytes= value that does not follow the grammar (416 bad_range) */
  BR_RANGE_TOO_MANY,      /* more than BR_RANGE_MAX ranges or an over-long header (416) */
};

/* Parses a Range header value (NULL = absent) against a representation of size bytes.
 * Unsatisfiable ranges in a list that has satisfiable ones are dropped; out has room for
 * BR_RANGE_MAX entries. */
enum br_range_result br_range_parse(const char *header, uint64_t size, br_byte_range *out,
                                    size_t *n);

#endif
