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

/* Upstream reads for ranges proxied from an HTTP origin (S3, http stores). */
#define BR_RANGE_READ_GAP (8u * 1024) /* a gap this small is read and dropped: one read */
#define BR_RANGE_READS_MAX 8          /* more reads than this and the ranges are read at once */

enum br_range_plan_kind {
  BR_PLAN_READS, /* joins[] says which ranges share the read before them; *nreads <= max_reads */
  BR_PLAN_SPAN,  /* one read from ranges[0].first to ranges[n - 1].last serves them all */
  BR_PLAN_WHOLE, /* too many overlapping or out-of-order ranges: serve the whole thing (200) */
};

/* Plans how few upstream reads serve ranges[0..n) in this order (the order of the parts sent):
 * range i joins the read of range i - 1 (joins[i] = 1) when it starts after that range's last
 * byte with a gap below max_gap (the gap bytes are read and dropped); joins[0] = 0. When that
 * needs more than max_reads reads: BR_PLAN_SPAN if the ranges are ascending without overlap
 * (every joins[i > 0] = 1: one read through all the gaps), else BR_PLAN_WHOLE (RFC 9110 14.2:
 * many overlapping or unordered ranges may be ignored). *nreads is the reads planned (1 for SPAN
 * and WHOLE). joins has room for n entries. Pure. */
enum br_range_plan_kind br_range_plan(const br_byte_range *ranges, size_t n, uint64_t max_gap,
                                      size_t max_reads, unsigned char *joins, size_t *nreads);

#endif
