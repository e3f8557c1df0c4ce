/* Reconcile's pure parts: the external sort (every size around the memory bound, duplicates
 * within and across spilled runs) and the data-file cache (entries visible only once committed,
 * chunks, pruning), and the report store; finishing deletes cut short (issue 19); the leases'
 * gate that keeps an attach out of a quarantine batch's check-and-commit. */
#include <lmdb.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blobref/config.h"
#include "blobref/leases.h"
#include "blobref/reconcile.h"
#include "blobref/store.h"
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

/* The sort's buckets (a digest's first two bytes): real digests (about one a bucket here), all in
 * one bucket past the insertion-sort size (qsort's path), buckets of just that size, and
 * duplicates within a bucket, each in memory and spilled; the stream must be qsort's, unique. */
static void test_sort_buckets(const char *dir) {
  enum { N = 30000 };
  uint8_t *in = malloc((size_t)N * BR_SHA256_LEN), *want = malloc((size_t)N * BR_SHA256_LEN);
  for (int shape = 0; shape < 4; shape++) {
    for (size_t i = 0; i < N; i++) {
      uint8_t *d = in + i * BR_SHA256_LEN;
      uint32_t v = (uint32_t)(shape == 3 ? i % 5000 : i);
      SHA256((const uint8_t *)&v, sizeof v, d);
      if (shape == 1) d[0] = d[1] = 0x5a; /* one bucket of N */
      if (shape == 2) {                   /* buckets of 32 */
        d[0] = (uint8_t)(i / 32 >> 8);
        d[1] = (uint8_t)(i / 32);
      }
      if (shape == 3) d[0] = d[1] = (uint8_t)(v % 3); /* three buckets, each digest 6 times */
    }
    memcpy(want, in, (size_t)N * BR_SHA256_LEN);
    qsort(want, N, BR_SHA256_LEN, cmp);
    size_t w = 0;
    for (size_t i = 0; i < N; i++)
      if (!w || memcmp(want + (w - 1) * BR_SHA256_LEN, want + i * BR_SHA256_LEN, BR_SHA256_LEN))
        memmove(want + w++ * BR_SHA256_LEN, want + i * BR_SHA256_LEN, BR_SHA256_LEN);
    for (size_t mem = 4096; mem <= 65536; mem *= 16) { /* spilled (8 runs), then in memory */
      br_err err;
      dsort *s = dsort_new(dir, mem, &err);
      CHECK(s != NULL, "new: %s", err.msg);
      if (!s) continue;
      int ok = 1, rc;
      for (size_t i = 0; i < N; i++) ok &= dsort_add(s, in + i * BR_SHA256_LEN, &err) == 0;
      ok &= dsort_finish(s, &err) == 0;
      uint8_t d[BR_SHA256_LEN];
      size_t got = 0;
      while ((rc = dsort_next(s, d, &err)) == 1) {
        if (got >= w || memcmp(d, want + got * BR_SHA256_LEN, BR_SHA256_LEN)) ok = 0;
        got++;
      }
      CHECK(ok && rc == 0 && got == w, "shape %d, mem %zu: %zu of %zu in order: %d", shape, mem,
            got, w, ok);
      CHECK((dsort_runs(s) > 0) == (mem < N), "shape %d, mem %zu: %zu runs", shape, mem,
            dsort_runs(s));
      dsort_free(s);
    }
  }
  free(in);
  free(want);
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
  rstate *st = rstate_open(dir, NULL, &err);
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

/* ---- finishing deletes (issue 19) ---------------------------------------------------------- */

static void write_file(const char *path, const void *data, size_t n) {
  char cmd[600];
  if ((size_t)snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path) >= sizeof cmd) {
    fprintf(stderr, "path too long: %s\n", path);
    return;
  }
  if (system(cmd) != 0) fprintf(stderr, "%s failed\n", cmd);
  FILE *f = fopen(path, "wb");
  if (f) {
    fwrite(data, 1, n, f);
    fclose(f);
  }
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

/* An index of the old format (no store-key map) with the given records. */
static int old_index(const char *dir, uint8_t (*digests)[BR_SHA256_LEN], const br_record *recs,
                     int n) {
  MDB_env *env = NULL;
  MDB_txn *txn = NULL;
  MDB_dbi dbi;
  mkdir(dir, 0755);
  int rc = mdb_env_create(&env);
  if (!rc) rc = mdb_env_set_maxdbs(env, 4);
  if (!rc) rc = mdb_env_open(env, dir, MDB_NOTLS, 0644);
  if (!rc) rc = mdb_txn_begin(env, NULL, 0, &txn);
  if (!rc) rc = mdb_dbi_open(txn, "blobs", MDB_CREATE, &dbi);
  for (int i = 0; i < n && !rc; i++) {
    uint8_t buf[BR_RECORD_MAX_ENCODED];
    MDB_val k = {BR_SHA256_LEN, digests[i]}, v = {br_record_encode(&recs[i], buf, sizeof buf), buf};
    rc = mdb_put(txn, dbi, &k, &v, 0);
  }
  if (!rc) rc = mdb_txn_commit(txn);
  mdb_env_close(env);
  return rc;
}

/* Deletes marked in the index (a crash or a failed index write cut them short) are finished when
 * the reconciler opens: never the bytes of a key several records share (an index from before the
 * store-key map), never an in-place file rewritten since its import (only the record goes); a
 * content-addressed object and an unchanged in-place file are deleted. */
static void test_finish_deletes(const char *base) {
  char root[300], idxdir[300], statedir[300], conf[1200];
  snprintf(root, sizeof root, "%s/fin-blobs", base);
  snprintf(idxdir, sizeof idxdir, "%s/fin-index", base);
  snprintf(statedir, sizeof statedir, "%s/fin-state", base);
  snprintf(conf, sizeof conf, "[server]\ndata_dir = %s\n[store local]\nkind = fs\nroot = %s\n",
           base, root);
  br_config cfg;
  br_config_init(&cfg);
  br_err err;
  CHECK(br_config_load_string(&cfg, conf, "test", &err) == 0 && br_config_finish(&cfg, &err) == 0,
        "config: %s", err.msg);
  br_store *st = br_store_open(&cfg.stores[0], &err);
  CHECK(st != NULL, "store: %s", err.msg);
  if (!st) return;
  enum { SHARED1, SHARED2, REWRITTEN, CA, GOOD, N };
  static const char *const content[N] = {"shared bytes", "shared bytes", "original bytes!",
                                         "content-addressed", "in place, unchanged"};
  const char *keys[N] = {"in/shared.bin", "in/shared.bin", "in/rewritten.bin", NULL, "in/good.bin"};
  uint8_t d[N][BR_SHA256_LEN];
  br_record recs[N];
  char ca_key[BR_MAX_KEY + 1], path[N][700];
  for (int i = 0; i < N; i++) {
    SHA256((const unsigned char *)content[i], strlen(content[i]), d[i]);
    if (i == SHARED2) d[i][31] ^= 1; /* another blob on the same key */
    if (i == CA) br_store_default_key(st, d[i], ca_key, sizeof ca_key);
    br_record *r = &recs[i];
    memset(r, 0, sizeof *r);
    r->size = strlen(content[i]);
    r->state = i == SHARED2 ? BR_STATE_QUARANTINED : BR_STATE_DELETING;
    r->state_ms = 1000;
    r->nlocations = 1;
    snprintf(r->locations[0].store, sizeof r->locations[0].store, "local");
    snprintf(r->locations[0].key, sizeof r->locations[0].key, "%s", i == CA ? ca_key : keys[i]);
    snprintf(path[i], sizeof path[i], "%s/%s", root, r->locations[0].key);
    const char *bytes = i == REWRITTEN ? "rewritten bytes" : content[i]; /* same size */
    write_file(path[i], bytes, strlen(bytes));
  }
  CHECK(old_index(idxdir, d, recs, N) == 0, "an index of the old format");
  br_index_options opt = {.map_size = 64 << 20, .batch_max = 8};
  br_index *idx = br_index_open(idxdir, &opt, &err);
  CHECK(idx != NULL, "index: %s", err.msg);
  br_store *stores[1] = {st};
  br_reconcile_env env = {
      .cfg = &cfg, .index = idx, .stores = stores, .nstores = 1, .state_dir = statedir};
  br_index_stats before, after;
  if (idx) br_index_get_stats(idx, &before);
  br_reconciler *r = idx ? br_reconciler_open(&env, &err) : NULL;
  CHECK(r != NULL, "reconciler: %s", err.msg);
  if (idx) br_index_get_stats(idx, &after);
  CHECK(after.full_walks == before.full_walks + 1, "the counters say 4 deleting: one walk");
  br_record got;
  for (int i = 0; idx && i < N; i++)
    CHECK(br_index_get(idx, d[i], &got, &err) == (i == SHARED2 ? 0 : 1),
          "record %d: only the quarantined one is left", i);
  CHECK(file_exists(path[SHARED1]), "a key several records share keeps its bytes");
  CHECK(file_exists(path[REWRITTEN]), "an in-place file rewritten since its import is kept");
  CHECK(!file_exists(path[CA]), "a content-addressed object is deleted");
  CHECK(!file_exists(path[GOOD]), "an unchanged in-place file is deleted");
  CHECK(r && br_reconcile_finish_deletes(r, &err) == 0, "nothing left to finish");
  if (idx) br_index_get_stats(idx, &before);
  CHECK(before.full_walks == after.full_walks, "0 deleting counted: the index is not walked");
  br_reconciler_close(r);
  br_index_close(idx);
  br_store_close(st);
  br_config_free(&cfg);
}

struct attacher {
  br_leases *l;
  const char *id;
  uint8_t d[BR_SHA256_LEN];
  atomic_int done;
  int rc;
};
static void *attach_thread(void *ud) {
  struct attacher *a = ud;
  br_err err;
  a->rc = br_lease_attach(a->l, a->id, NULL, a->d, 1, br_now_ms(), &err);
  atomic_store(&a->done, 1);
  return NULL;
}

/* While a thread holds br_leases_block (reconcile between a quarantine batch's lease check and
 * its commit), an attach waits: it is seen neither half-way nor in between; once unblocked it
 * goes through. */
static void test_lease_gate(const char *base) {
  char dir[300];
  snprintf(dir, sizeof dir, "%s/leases", base);
  br_err err;
  br_leases *l = br_leases_open(dir, &err);
  CHECK(l != NULL, "open: %s", err.msg);
  if (!l) return;
  br_lease lease;
  CHECK(br_lease_create(l, "gate", NULL, 60000, br_now_ms(), &lease, &err) == 0, "create: %s",
        err.msg);
  struct attacher a = {.l = l, .id = lease.id};
  make_digest(7, a.d);
  br_leases_block(l);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, attach_thread, &a) == 0, "thread");
  /* a negative: nothing to await, so give the attach time it would need to commit */
  for (int i = 0; i < 50 && !atomic_load(&a.done); i++) usleep(10000);
  CHECK(!atomic_load(&a.done), "an attach waits while blocked");
  CHECK(br_leased_until(l, a.d, br_now_ms(), NULL) == 0, "and is not visible");
  br_leases_unblock(l);
  pthread_join(t, NULL);
  CHECK(a.rc == 1, "attached once unblocked: %d", a.rc);
  CHECK(br_leased_until(l, a.d, br_now_ms(), NULL) == lease.expires_ms, "leased");
  br_leases_close(l);
}

int main(void) {
  char dir[] = "/tmp/blobref-test-reconcile-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  test_sort(dir);
  test_sort_buckets(dir);
  test_state(dir);
  test_finish_deletes(dir);
  test_lease_gate(dir);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  return unit_summary("reconcile");
}
