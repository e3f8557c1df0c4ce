/* Range header parsing per RFC 9110 14.1-14.2: bytes=first-last, first-, -suffix, lists; and the
 * plan of upstream reads that serves a list of ranges. */
#include "blobref/range.h"

#include <string.h>
#include <strings.h>

static int is_ows(char c) { return c == ' ' || c == '\t'; }

/* Parses 1*DIGIT at *p, saturating at UINT64_MAX. Returns 0 if there was no digit. */
static int parse_digits(const char **p, uint64_t *out) {
  const char *s = *p;
  uint64_t v = 0;
  while (*s >= '0' && *s <= '9') {
    unsigned d = (unsigned)(*s - '0');
    v = v > (UINT64_MAX - d) / 10 ? UINT64_MAX : v * 10 + d;
    s++;
  }
  if (s == *p) return 0;
  *p = s;
  *out = v;
  return 1;
}

enum br_range_result br_range_parse(const char *header, uint64_t size, br_byte_range *out,
                                    size_t *n) {
  *n = 0;
  if (!header) return BR_RANGE_IGNORE;
  size_t hlen = strnlen(header, BR_RANGE_HEADER_MAX + 1);
  const char *p = header;
  while (is_ows(*p)) p++;
  const char *eq = strchr(p, '=');
  if (!eq) return BR_RANGE_IGNORE; /* not a ranges-specifier we know: ignore it */
  size_t unit_len = (size_t)(eq - p);
  while (unit_len && is_ows(p[unit_len - 1])) unit_len--;
  if (unit_len != 5 || strncasecmp(p, "bytes", 5) != 0) return BR_RANGE_IGNORE;
  if (hlen > BR_RANGE_HEADER_MAX) return BR_RANGE_TOO_MANY;
  p = eq + 1;
  size_t specs = 0, count = 0;
  for (;;) {
    while (is_ows(*p)) p++;
    if (*p == ',') { /* empty list element: allowed by the #rule */
      p++;
      continue;
    }
    if (!*p) break;
    uint64_t first = 0, last = UINT64_MAX;
    int satisfiable;
    if (*p == '-') {
      p++;
      uint64_t suffix;
      if (!parse_digits(&p, &suffix)) return BR_RANGE_MALFORMED;
      satisfiable = suffix > 0 && size > 0;
      if (satisfiable) {
        first = suffix >= size ? 0 : size - suffix;
        last = size - 1;
      }
    } else {
      if (!parse_digits(&p, &first) || *p != '-') return BR_RANGE_MALFORMED;
      p++;
      if (*p >= '0' && *p <= '9') {
        parse_digits(&p, &last);
        if (last < first) return BR_RANGE_MALFORMED;
      }
      satisfiable = first < size;
      if (satisfiable && last >= size) last = size - 1;
    }
    while (is_ows(*p)) p++;
    if (*p && *p != ',') return BR_RANGE_MALFORMED;
    if (++specs > BR_RANGE_MAX) return BR_RANGE_TOO_MANY;
    if (satisfiable) {
      out[count].first = first;
      out[count].last = last;
      count++;
    }
    if (*p == ',') p++;
  }
  if (specs == 0) return BR_RANGE_MALFORMED;
  if (count == 0) return BR_RANGE_UNSATISFIABLE;
  *n = count;
  return BR_RANGE_OK;
}

enum br_range_plan_kind br_range_plan(const br_byte_range *ranges, size_t n, uint64_t max_gap,
                                      size_t max_reads, unsigned char *joins, size_t *nreads) {
  size_t reads = 0;
  int ascending = 1;
  for (size_t i = 0; i < n; i++) {
    int after = i > 0 && ranges[i].first > ranges[i - 1].last;
    ascending &= i == 0 || after;
    joins[i] = (unsigned char)(after && ranges[i].first - ranges[i - 1].last - 1 < max_gap);
    reads += !joins[i];
  }
  *nreads = reads;
  if (reads <= max_reads) return BR_PLAN_READS;
  *nreads = 1;
  if (!ascending) return BR_PLAN_WHOLE;
  for (size_t i = 1; i < n; i++) joins[i] = 1;
  return BR_PLAN_SPAN;
}
