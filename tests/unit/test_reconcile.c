/* Reconcile's pure parts: the external sort (every size around the memory bound, duplicates
 * within and across spilled runs) and the data-file cache (entries visible only once committed,
 * chunks, pruning), and the report store. */
#include <stdlib.h>
#include <unistd.h>

#include "blobref/config.h"
#include "reconcile/internal.h"
#include "unit.h"

static int cmp(const void *a, const void *b) { return memcmp(a, b, BR_SHA256_LEN); }

static void make_digest(uint32_t v, uint8_t d[BR_SHA256_LEN]) {
  memset(d, 0, BR_SHA256_LEN);
  /* spread over the first bytes so that the order is not the insertion order */
  uint32_t x = v * 2654435761u;
  memcpy(d, &x, 4);
  memcpy(d + 28, &v, 4);
}

static void test_sort(const char *dir) {
  static const struct {
    size_t n, distinct, mem;
  } cases[] = {{0, 1, 1024},         {1, 1, 1024},       {1023, 1023, 1024},
               {1024, 1024, 1024},   {1025, 1025, 1024}, {5000, 700, 1024},
               {20000, 20000, 1024}, {20000, 3, 1024},   {100000, 60000, 4096}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    br_err err;
    dsort *s = dsort_new(dir, cases[c].mem, &err);
    CHECK(s != NULL, "new: %s", err.msg);
    if (!s) continue;
    size_t n = cases[c].n;
    uint8_t *want = malloc((n ? n : 1) * BR_SHA256_LEN);
    int added = 1;
    for (size_t i = 0; i < n; i++) {
      make_digest((uint32_t)((i * 7919) % cases[c].distinct), want + i * BR_SHA256_LEN);
      added &= dsort_add(s, want + i * BR_SHA256_LEN, &err) == 0;
    }
    CHECK(added, "case %zu: add", c);
    qsort(want, n, BR_SHA256_LEN, cmp);
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
      if (!w || memcmp(want + (w - 1) * BR_SHA256_LEN, want + i * BR_SHA256_LEN, BR_SHA256_LEN))
        memmove(want + w++ * BR_SHA256_LEN, want + i * BR_SHA256_LEN, BR_SHA256_LEN);
    CHECK(dsort_finish(s, &err) == 0, "finish: %s", err.msg);
    uint8_t d[BR_SHA256_LEN];
    size_t got = 0;
    int ok = 1, rc;
    while ((rc = dsort_next(s, d, &err)) == 1) {
      if (got >= w || memcmp(d, want + got * BR_SHA256_LEN, BR_SHA256_LEN)) ok = 0;
      got++;
    }
    CHECK(rc == 0 && ok && got == w, "case %zu: %zu of %zu, in order: %d", c, got, w, ok);
    CHECK((dsort_runs(s) > 0) == (n > cases[c].mem), "case %zu: %zu runs", c, dsort_runs(s));
    CHECK(dsort_added(s) == n, "case %zu: added", c);
    dsort_free(s);
    free(want);
  }
}

struct collect {
  size_t n;
  uint8_t last[BR_SHA256_LEN];
};
static int count_fn(void *ud, const uint8_t d[BR_SHA256_LEN]) {
  struct collect *c = ud;
  memcpy(c->last, d, BR_SHA256_LEN);
  c->n++;
  return 0;
}

static void test_state(const char *dir) {
  br_err err;
  rstate *st = rstate_open(dir, &err);
  CHECK(st != NULL, "open: %s", err.msg);
  if (!st) return;
  uint8_t a[BR_SHA256_LEN], b[BR_SHA256_LEN], d[BR_SHA256_LEN];
  rstate_file_id("s3://w/t/data/a.parquet", 100, 10, "img", BR_FORM_HEX, b);
  rstate_file_id("s3://w/t/data/a.parquet", 100, 10, "thumb", BR_FORM_HEX, a);
  CHECK(memcmp(a, b, BR_SHA256_LEN) != 0, "the column is part of a file's identity");
  rstate_file_id("s3://w/t/data/a.parquet", 100, 10, "img", BR_FORM_URL, a);
  CHECK(memcmp(a, b, BR_SHA256_LEN) != 0, "the form is part of a file's identity");
  rstate_file_id("s3://w/t/data/a.parquet", 100, 10, "img", BR_FORM_HEX, a);
  CHECK(memcmp(a, b, BR_SHA256_LEN) == 0, "the same file, column and form: the same identity");
  rstate_file_id("s3://w/t/data/a.parquet", 101, 10, "img", BR_FORM_HEX, b);
  CHECK(memcmp(a, b, BR_SHA256_LEN) != 0, "the size is part of a file's identity");
  struct collect c = {0};
  CHECK(rstate_cached(st, a, count_fn, &c, &err) == 0, "absent at first");
  /* an entry that is never committed stays invisible */
  rstate_entry *e = rstate_entry_begin(st, a, &err);
  for (uint32_t i = 0; i < 70000; i++) { /* more than one chunk */
    make_digest(i, d);
    rstate_entry_add(e, d, &err);
  }
  rstate_entry_abort(e);
  CHECK(rstate_cached(st, a, count_fn, &c, &err) == 0, "an aborted entry is not cached");
  e = rstate_entry_begin(st, a, &err);
  int added = 1;
  for (uint32_t i = 0; i < 70000; i++) {
    make_digest(i, d);
    added &= rstate_entry_add(e, d, &err) == 0;
  }
  CHECK(added, "add");
  CHECK(rstate_entry_commit(e, &err) == 0, "commit: %s", err.msg);
  c.n = 0;
  CHECK(rstate_cached(st, a, count_fn, &c, &err) == 1 && c.n == 70000, "cached: %zu", c.n);
  make_digest(69999, d);
  CHECK(!memcmp(c.last, d, BR_SHA256_LEN), "in the order written");
  /* a file with over 16 chunks of hashes leaves the batch and writes chunk by chunk */
  uint8_t big[BR_SHA256_LEN];
  rstate_file_id("s3://w/t/data/big.parquet", 1, 1, "img", BR_FORM_HEX, big);
  e = rstate_entry_begin(st, big, &err);
  added = 1;
  for (uint32_t i = 0; i < 17 * 65536 + 5; i++) {
    make_digest(i, d);
    added &= rstate_entry_add(e, d, &err) == 0;
  }
  CHECK(added && rstate_entry_commit(e, &err) == 0, "large entry: %s", err.msg);
  c.n = 0;
  CHECK(rstate_cached(st, big, count_fn, &c, &err) == 1 && c.n == 17 * 65536 + 5, "large: %zu",
        c.n);
  /* an empty file is cached too */
  e = rstate_entry_begin(st, b, &err);
  CHECK(rstate_entry_commit(e, &err) == 0, "empty commit");
  c.n = 0;
  CHECK(rstate_cached(st, b, count_fn, &c, &err) == 1 && c.n == 0, "empty cached");
  /* pruning keeps only the ids given */
  CHECK(rstate_prune(st, b, 1, &err) == 0, "prune: %s", err.msg);
  CHECK(rstate_cached(st, big, count_fn, &c, &err) == 0, "large pruned");
  CHECK(rstate_cached(st, a, count_fn, &c, &err) == 0, "pruned");
  CHECK(rstate_cached(st, b, count_fn, &c, &err) == 1, "kept");
  /* reports */
  uint64_t id = rstate_next_run_id(st, &err);
  CHECK(id == 1, "first id %llu", (unsigned long long)id);
  CHECK(rstate_put_report(st, id, "{\"id\":1}", &err) == 0, "put report");
  CHECK(rstate_next_run_id(st, &err) == 2, "next id");
  int found = 0;
  char *text = rstate_get_report(st, 1, &found, &err);
  CHECK(found && text && !strcmp(text, "{\"id\":1}"), "get report");
  free(text);
  text = rstate_get_report(st, 7, &found, &err);
  CHECK(!found && !text, "unknown report");
  rstate_close(st);
}

int main(void) {
  char dir[] = "/tmp/blobref-test-reconcile-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  test_sort(dir);
  test_state(dir);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  return unit_summary("reconcile");
}
