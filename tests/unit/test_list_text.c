/* GET /v1/blobs's records written as text: byte for byte what jansson's JSON_COMPACT dump of
 * blob_record_json writes, for every state, location shape and awkward string. */
#include <jansson.h>
#include <stdlib.h>

#include "http/httpd.h"
#include "unit.h"

static uint64_t rng_state = 25;
static uint64_t next_rand(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Strings a record may hold: escapes, control bytes, multi-byte UTF-8, an empty one. */
static const char *const awkward[] = {"image/jpeg",
                                      "",
                                      "a \"quoted\" \\ back\\slash",
                                      "tab\there\nnew\rline\b\f",
                                      "\x01\x1f\x7f",
                                      "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
                                      "sha256/ab/cd/x",
                                      "/slash/"};
#define NAWK (sizeof awkward / sizeof awkward[0])

static void fill(char *dst, size_t cap, const char *s) { snprintf(dst, cap, "%s", s); }

/* Compares the two writings of rec; 1 when equal. */
static int same(const uint8_t d[BR_SHA256_LEN], const br_record *rec, int *text_failed) {
  json_t *j = blob_record_json(d, rec);
  char *want = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  struct json_text t = {0};
  *text_failed = blob_record_text(&t, d, rec) != 0;
  int eq = want && !*text_failed && strlen(want) == t.len && !memcmp(want, t.buf, t.len);
  if (!eq && want && !*text_failed)
    fprintf(stderr, "jansson: %s\ntext:    %.*s\n", want, (int)t.len, t.buf);
  free(want);
  free(t.buf);
  return eq || (!want && *text_failed); /* both refuse (not UTF-8) */
}

int main(void) {
  int states[] = {BR_STATE_LIVE, BR_STATE_QUARANTINED, BR_STATE_HELD, BR_STATE_DELETING};
  int all = 1;
  for (int i = 0; i < 2000; i++) {
    br_record rec;
    memset(&rec, 0, sizeof rec);
    uint8_t d[BR_SHA256_LEN];
    for (int k = 0; k < BR_SHA256_LEN; k++) d[k] = (uint8_t)next_rand();
    rec.size = i % 7 ? next_rand() % (1ull << (i % 63)) : 0;
    rec.state = states[i % 4];
    rec.created_ms = next_rand() % 4102444800000ull;
    rec.last_upload_ms = next_rand() % 4102444800000ull;
    rec.state_ms = i % 5 ? next_rand() % 4102444800000ull : 0;
    fill(rec.content_type, sizeof rec.content_type, awkward[next_rand() % NAWK]);
    fill(rec.reason, sizeof rec.reason, awkward[next_rand() % NAWK]);
    rec.nlocations = (int)(next_rand() % (BR_MAX_LOCATIONS + 1));
    for (int l = 0; l < rec.nlocations; l++) {
      fill(rec.locations[l].store, sizeof rec.locations[l].store, awkward[next_rand() % NAWK]);
      fill(rec.locations[l].key, sizeof rec.locations[l].key, awkward[next_rand() % NAWK]);
      rec.locations[l].role = (enum br_role)(next_rand() % 3);
      rec.locations[l].verified_at_ms = next_rand() % 2 ? next_rand() % 4102444800000ull : 0;
    }
    int failed;
    int eq = same(d, &rec, &failed);
    if (!eq) {
      all = 0;
      break;
    }
  }
  CHECK(all, "2,000 records of every kind: the same bytes");
  /* not UTF-8: both refuse */
  static const char *const bad[] = {"\xc3", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                    "ok\xff"};
  for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
    br_record rec;
    memset(&rec, 0, sizeof rec);
    uint8_t d[BR_SHA256_LEN] = {1};
    fill(rec.content_type, sizeof rec.content_type, bad[b]);
    int failed;
    CHECK(same(d, &rec, &failed) && failed, "bad UTF-8 %zu is refused by both", b);
  }
  return unit_summary("list_text");
}
