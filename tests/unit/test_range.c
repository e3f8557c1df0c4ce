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

/* br_range_plan: ranges as "first-last" pairs, the joins wanted as a string of 0/1. */
struct plan_case {
  size_t n;
  uint64_t spans[10][2];
  enum br_range_plan_kind want;
  size_t nreads;
  const char *joins;
};

static const struct plan_case plan_cases[] = {
    {1, {{0, 99}}, BR_PLAN_READS, 1, "0"},
    /* adjacent, near (gap 8191) and far (gap 8192) */
    {2, {{0, 99}, {100, 199}}, BR_PLAN_READS, 1, "01"},
    {2, {{0, 99}, {100 + 8191, 9000}}, BR_PLAN_READS, 1, "01"},
    {2, {{0, 99}, {100 + 8192, 9000}}, BR_PLAN_READS, 2, "00"},
    /* overlapping, repeated and descending ranges never share a read */
    {2, {{0, 99}, {50, 150}}, BR_PLAN_READS, 2, "00"},
    {2, {{0, 99}, {0, 99}}, BR_PLAN_READS, 2, "00"},
    {3, {{200, 299}, {100, 199}, {0, 99}}, BR_PLAN_READS, 3, "000"},
    /* clusters: near ones merged, far ones apart */
    {5,
     {{0, 9}, {20, 29}, {100000, 100009}, {100020, 100029}, {900000, 900000}},
     BR_PLAN_READS,
     3,
     "01010"},
    /* exactly max_reads (8) far reads, and one more: one span through the gaps */
    {8,
     {{0, 0},
      {1 << 20, 1 << 20},
      {2 << 20, 2 << 20},
      {3 << 20, 3 << 20},
      {4 << 20, 4 << 20},
      {5 << 20, 5 << 20},
      {6 << 20, 6 << 20},
      {7 << 20, 7 << 20}},
     BR_PLAN_READS,
     8,
     "00000000"},
    {9,
     {{0, 0},
      {1 << 20, 1 << 20},
      {2 << 20, 2 << 20},
      {3 << 20, 3 << 20},
      {4 << 20, 4 << 20},
      {5 << 20, 5 << 20},
      {6 << 20, 6 << 20},
      {7 << 20, 7 << 20},
      {8 << 20, 8 << 20}},
     BR_PLAN_SPAN,
     1,
     "011111111"},
    /* nine far reads not in ascending order: the whole representation */
    {9,
     {{8 << 20, 8 << 20},
      {1 << 20, 1 << 20},
      {2 << 20, 2 << 20},
      {3 << 20, 3 << 20},
      {4 << 20, 4 << 20},
      {5 << 20, 5 << 20},
      {6 << 20, 6 << 20},
      {7 << 20, 7 << 20},
      {0, 0}},
     BR_PLAN_WHOLE,
     1,
     NULL},
    /* nine overlapping ones (the same range nine times) */
    {9,
     {{5, 6}, {5, 6}, {5, 6}, {5, 6}, {5, 6}, {5, 6}, {5, 6}, {5, 6}, {5, 6}},
     BR_PLAN_WHOLE,
     1,
     NULL},
};

static void test_plan(void) {
  for (size_t c = 0; c < sizeof plan_cases / sizeof plan_cases[0]; c++) {
    const struct plan_case *pc = &plan_cases[c];
    br_byte_range r[10];
    unsigned char joins[10];
    for (size_t i = 0; i < pc->n; i++) r[i] = (br_byte_range){pc->spans[i][0], pc->spans[i][1]};
    size_t nreads = 99;
    enum br_range_plan_kind k =
        br_range_plan(r, pc->n, BR_RANGE_READ_GAP, BR_RANGE_READS_MAX, joins, &nreads);
    CHECK(k == pc->want && nreads == pc->nreads, "plan case %zu: kind %d reads %zu, want %d %zu", c,
          (int)k, nreads, (int)pc->want, pc->nreads);
    for (size_t i = 0; pc->joins && i < pc->n; i++)
      CHECK(joins[i] == (unsigned char)(pc->joins[i] - '0'), "plan case %zu: joins[%zu] = %d", c, i,
            joins[i]);
  }
  /* the brief's case: 64 ascending ranges 10 KiB apart are one read */
  br_byte_range r[BR_RANGE_MAX];
  unsigned char joins[BR_RANGE_MAX];
  for (int i = 0; i < BR_RANGE_MAX; i++)
    r[i] = (br_byte_range){(uint64_t)i * 10240, (uint64_t)i * 10240 + 99};
  size_t nreads = 0;
  CHECK(br_range_plan(r, BR_RANGE_MAX, BR_RANGE_READ_GAP, BR_RANGE_READS_MAX, joins, &nreads) ==
                BR_PLAN_SPAN &&
            nreads == 1,
        "64 spread ranges: %zu reads", nreads);
}

int main(void) {
  test_plan();
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
