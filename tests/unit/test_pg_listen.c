/* The cross-node change notifications (server/index/pg_listen.c): payloads within PostgreSQL's
 * 8000 bytes, split into parts, a flush for big batches, and the parser's answers to bad input. */
#include <stdlib.h>

#include "index/pg_listen.h"
#include "unit.h"

static uint8_t digests[PGL_MAX_NOTIFIES * PGL_PER_NOTIFY + 1][BR_SHA256_LEN];

struct seen {
  size_t n, flushes;
  uint8_t last[BR_SHA256_LEN];
  int in_order; /* every digest parsed is digests[n] */
};

static void on_change(void *ud, const uint8_t *digest) {
  struct seen *s = ud;
  if (!digest) {
    s->flushes++;
    return;
  }
  if (memcmp(digest, digests[s->n], BR_SHA256_LEN)) s->in_order = 0;
  memcpy(s->last, digest, BR_SHA256_LEN);
  s->n++;
}

/* Parses every part of the announcement of digests[0..n) in order. */
static struct seen round_trip(size_t n, size_t *parts, size_t *longest) {
  struct seen s = {.in_order = 1};
  char out[PGL_PAYLOAD_MAX + 1];
  *longest = 0;
  size_t p = 0;
  for (size_t part = 0;; part++) {
    size_t len = pgl_payload((const uint8_t(*)[BR_SHA256_LEN])digests, n, part, &p, out);
    if (!len) break;
    if (len > *longest) *longest = len;
    if (strlen(out) != len) s.in_order = 0;
    pgl_parse(out, len, on_change, &s);
  }
  *parts = p;
  return s;
}

static int parse_rc(const char *payload, struct seen *s) {
  memset(s, 0, sizeof *s);
  s->in_order = 1;
  return pgl_parse(payload, strlen(payload), on_change, s);
}

int main(void) {
  for (size_t i = 0; i < sizeof digests / sizeof digests[0]; i++)
    for (size_t j = 0; j < BR_SHA256_LEN; j++) digests[i][j] = (uint8_t)(i * 31 + j * 7);
  CHECK(PGL_PAYLOAD_MAX < 8000, "a payload fits PostgreSQL's limit: %d", PGL_PAYLOAD_MAX);
  size_t parts, longest;
  struct seen s = round_trip(0, &parts, &longest);
  CHECK(parts == 0 && s.n == 0 && s.flushes == 0, "nothing changed: no notification");
  s = round_trip(1, &parts, &longest);
  CHECK(parts == 1 && s.n == 1 && s.in_order && !s.flushes && longest == 3 + 64, "one digest");
  s = round_trip(PGL_PER_NOTIFY, &parts, &longest);
  CHECK(parts == 1 && s.n == PGL_PER_NOTIFY && s.in_order && longest == PGL_PAYLOAD_MAX,
        "a full notification: %zu parts", parts);
  s = round_trip(PGL_PER_NOTIFY + 1, &parts, &longest);
  CHECK(parts == 2 && s.n == PGL_PER_NOTIFY + 1 && s.in_order && !s.flushes, "two parts");
  s = round_trip(PGL_MAX_NOTIFIES * PGL_PER_NOTIFY, &parts, &longest);
  CHECK(parts == PGL_MAX_NOTIFIES && s.n == PGL_MAX_NOTIFIES * PGL_PER_NOTIFY && s.in_order,
        "the most parts");
  s = round_trip(PGL_MAX_NOTIFIES * PGL_PER_NOTIFY + 1, &parts, &longest);
  CHECK(parts == 1 && s.n == 0 && s.flushes == 1, "a bigger batch flushes everything");

  /* bad payloads: a flush each, never a digest */
  char many[PGL_PAYLOAD_MAX + 70];
  memcpy(many, "c1:", 3);
  memset(many + 3, 'a', sizeof many - 4);
  many[3 + (PGL_PER_NOTIFY + 1) * 64] = '\0';
  static const char *const bad[] = {
      "",
      "c",
      "c1",
      "c1:",
      "f",
      "f1 ",
      "F1",
      "c2:00",
      "c1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde",  /* 63 */
      "c1:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef", /* upper case */
      "c1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeg",
      "c1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = parse_rc(bad[i], &s);
    CHECK(rc == -1 && s.n == 0 && s.flushes == 1, "bad payload '%s': %d, %zu digests", bad[i], rc,
          s.n);
  }
  int rc = parse_rc(many, &s);
  CHECK(rc == -1 && s.n == 0 && s.flushes == 1, "more digests than a payload holds: %d", rc);
  CHECK(pgl_parse("c1:\0"
                  "0",
                  5, on_change, &s) == -1,
        "a NUL inside");
  rc = parse_rc("f1", &s);
  CHECK(rc == 0 && s.flushes == 1 && s.n == 0, "an announced flush");
  rc = parse_rc("c1:00000000000000000000000000000000000000000000000000000000000000ff", &s);
  CHECK(rc == 1 && s.n == 1 && s.last[31] == 0xff && s.last[0] == 0, "one digest parsed");
  return unit_summary("pg_listen");
}
