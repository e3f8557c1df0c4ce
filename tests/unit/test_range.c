/* Range header parsing: RFC 9110 examples and edge cases, as a table. */
#include "blobref/range.h"
#include "unit.h"

struct range_case {
  const char *header;
  uint64_t size;
  enum br_range_result want;
  size_t n;
  uint64_t spans[4][2];
};

static const struct range_case cases[] = {
    /* RFC 9110 14.1.2 examples on a 10000-byte representation */
    {"bytes=0-499", 10000, BR_RANGE_OK, 1, {{0, 499}}},
    {"bytes=500-999", 10000, BR_RANGE_OK, 1, {{500, 999}}},
    {"bytes=-500", 10000, BR_RANGE_OK, 1, {{9500, 9999}}},
    {"bytes=9500-", 10000, BR_RANGE_OK, 1, {{9500, 9999}}},
    {"bytes=0-0,-1", 10000, BR_RANGE_OK, 2, {{0, 0}, {9999, 9999}}},
    {"bytes= 0-999, 4500-5499, -1000",
     10000,
     BR_RANGE_OK,
     3,
     {{0, 999}, {4500, 5499}, {9000, 9999}}},
    {"bytes=500-600,601-999", 10000, BR_RANGE_OK, 2, {{500, 600}, {601, 999}}},
    {"bytes=500-700,601-999", 10000, BR_RANGE_OK, 2, {{500, 700}, {601, 999}}},
    /* clamping and saturation */
    {"bytes=0-99999", 100, BR_RANGE_OK, 1, {{0, 99}}},
    {"bytes=-99999", 100, BR_RANGE_OK, 1, {{0, 99}}},
    {"bytes=0-184467440737095516150000", 100, BR_RANGE_OK, 1, {{0, 99}}},
    {"bytes=99-", 100, BR_RANGE_OK, 1, {{99, 99}}},
    {"BYTES=1-2", 100, BR_RANGE_OK, 1, {{1, 2}}},
    {"bytes=1-2,,3-4", 100, BR_RANGE_OK, 2, {{1, 2}, {3, 4}}},
    {"bytes=1-2,", 100, BR_RANGE_OK, 1, {{1, 2}}},
    /* unsatisfiable */
    {"bytes=100-", 100, BR_RANGE_UNSATISFIABLE, 0, {{0}}},
    {"bytes=100-200", 100, BR_RANGE_UNSATISFIABLE, 0, {{0}}},
    {"bytes=-0", 100, BR_RANGE_UNSATISFIABLE, 0, {{0}}},
    {"bytes=0-0", 0, BR_RANGE_UNSATISFIABLE, 0, {{0}}},
    {"bytes=-5", 0, BR_RANGE_UNSATISFIABLE, 0, {{0}}},
    {"bytes=184467440737095516150000-", 100, BR_RANGE_UNSATISFIABLE, 0, {{0}}},
    {"bytes=200-300,5-6", 100, BR_RANGE_OK, 1, {{5, 6}}},
    /* malformed */
    {"bytes=", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    {"bytes=,", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    {"bytes=abc", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    {"bytes=5-1", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    {"bytes=1", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    {"bytes=-", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    {"bytes=--5", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    {"bytes=1-2-3", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    {"bytes=+1-2", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    {"bytes=1 -2", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    {"bytes=0x10-20", 100, BR_RANGE_MALFORMED, 0, {{0}}},
    /* ignored: absent or other units */
    {NULL, 100, BR_RANGE_IGNORE, 0, {{0}}},
    {"items=0-5", 100, BR_RANGE_IGNORE, 0, {{0}}},
    {"bytes 0-5", 100, BR_RANGE_IGNORE, 0, {{0}}},
    {"", 100, BR_RANGE_IGNORE, 0, {{0}}},
};

int main(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const struct range_case *c = &cases[i];
    br_byte_range out[BR_RANGE_MAX];
    size_t n = 99;
    enum br_range_result r = br_range_parse(c->header, c->size, out, &n);
    CHECK(r == c->want, "'%s' size %llu: result %d, want %d", c->header ? c->header : "(null)",
          (unsigned long long)c->size, r, c->want);
    CHECK(n == c->n, "'%s': %zu ranges, want %zu", c->header ? c->header : "(null)", n, c->n);
    for (size_t k = 0; k < c->n && k < n; k++)
      CHECK(out[k].first == c->spans[k][0] && out[k].last == c->spans[k][1],
            "'%s' range %zu: %llu-%llu, want %llu-%llu", c->header, k,
            (unsigned long long)out[k].first, (unsigned long long)out[k].last,
            (unsigned long long)c->spans[k][0], (unsigned long long)c->spans[k][1]);
  }
  /* bounds: 64 ranges are fine, 65 are too many, an over-long header is refused */
  char hdr[BR_RANGE_HEADER_MAX + 64] = "bytes=";
  for (int i = 0; i < 64; i++)
    snprintf(hdr + strlen(hdr), sizeof hdr - strlen(hdr), "%d-%d,", i, i);
  br_byte_range out[BR_RANGE_MAX];
  size_t n = 0;
  CHECK(br_range_parse(hdr, 1000, out, &n) == BR_RANGE_OK && n == 64, "64 ranges: n=%zu", n);
  strcat(hdr, "70-71");
  CHECK(br_range_parse(hdr, 1000, out, &n) == BR_RANGE_TOO_MANY, "65 ranges must be too many");
  memset(hdr + 6, ' ', sizeof hdr - 7);
  hdr[sizeof hdr - 1] = '\0';
  CHECK(br_range_parse(hdr, 1000, out, &n) == BR_RANGE_TOO_MANY, "over-long header");
  return unit_summary("range");
}
