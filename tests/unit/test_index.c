/* Index records (encode/decode round trips and malformed input) and the LMDB index itself:
 * insert vs dedup, restore from quarantine, group commit under concurrency, a full map, and the
 * record cache never answering with a record older than an acknowledged write; the store-key
 * map (one owner per key), the deleting state, stale readers and big puts into a full map. */
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blobref/index.h"
#include "unit.h"

static br_record sample(int nloc) {
  br_record r = {.size = 123456789012ull,
                 .created_ms = 1700000000123ull,
                 .last_upload_ms = 1700000000999ull,
                 .state = BR_STATE_LIVE,
                 .state_ms = 1700000000123ull,
                 .nlocations = nloc};
  strcpy(r.content_type, "image/jpeg");
  for (int i = 0; i < nloc; i++) {
    snprintf(r.locations[i].store, sizeof r.locations[i].store, "store%d", i);
    snprintf(r.locations[i].key, sizeof r.locations[i].key, "sha256/ab/cd/key%d", i);
    r.locations[i].role = (enum br_role)(i % 3);
    r.locations[i].verified_at_ms = 42 + (uint64_t)i;
  }
  return r;
}

/* Makes r's keys d's own: a store key belongs to at most one record (invariant 10). */
static void own_keys(br_record *r, const uint8_t d[BR_SHA256_LEN]) {
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(d, hex);
  for (int i = 0; i < r->nlocations; i++)
    snprintf(r->locations[i].key, sizeof r->locations[i].key, "sha256/%s/key%d", hex, i);
}

static int records_equal(const br_record *a, const br_record *b) {
  if (a->size != b->size || a->created_ms != b->created_ms ||
      a->last_upload_ms != b->last_upload_ms || a->state != b->state ||
      a->state_ms != b->state_ms || strcmp(a->reason, b->reason) ||
      strcmp(a->content_type, b->content_type) || a->nlocations != b->nlocations)
    return 0;
  for (int i = 0; i < a->nlocations; i++)
    if (strcmp(a->locations[i].store, b->locations[i].store) ||
        strcmp(a->locations[i].key, b->locations[i].key) ||
        a->locations[i].role != b->locations[i].role ||
        a->locations[i].verified_at_ms != b->locations[i].verified_at_ms ||
        a->locations[i].dev != b->locations[i].dev || a->locations[i].ino != b->locations[i].ino)
      return 0;
  return 1;
}

/* A record as a server before inode identities wrote it (format version 1), byte for byte:
 * live, 5 bytes, created 1, uploaded 2, state 3, no reason, "text/plain", one primary location
 * fs:k verified at 4. */
static const uint8_t OLD_RECORD[] = {
    1, 0, /* version, state */
    5, 0, 0,   0,   0,   0,   0,   0,   1,   0,   0,   0,   0,   0,
    0, 0, /* size, created_ms */
    2, 0, 0,   0,   0,   0,   0,   0,   3,   0,   0,   0,   0,   0,
    0, 0,                                                             /* last_upload_ms, state_ms */
    0, 0, 10,  0,   't', 'e', 'x', 't', '/', 'p', 'l', 'a', 'i', 'n', /* reason, content_type */
    1, 0, 4,   0,   0,   0,   0,   0,   0,   0, /* 1 location: role, verified_at */
    2, 0, 'f', 's', 1,   0,   'k'};             /* store, key */

/* The codec across format versions: old records decode (no identity) and re-encode to the same
 * bytes; a record with an in-place file's identity is version 2 (16 bytes more a location) and
 * round-trips; a version 2 record without any identity, or cut short, is refused. */
static void test_encoding_identity(void) {
  uint8_t buf[BR_RECORD_MAX_ENCODED];
  br_record back;
  br_err err;
  CHECK(br_record_decode(OLD_RECORD, sizeof OLD_RECORD, &back, &err) == 0, "old: %s", err.msg);
  CHECK(back.size == 5 && back.created_ms == 1 && back.last_upload_ms == 2 && back.state_ms == 3 &&
            !strcmp(back.content_type, "text/plain") && back.nlocations == 1 &&
            !strcmp(back.locations[0].store, "fs") && !strcmp(back.locations[0].key, "k") &&
            back.locations[0].verified_at_ms == 4 && back.locations[0].dev == 0 &&
            back.locations[0].ino == 0,
        "old record fields");
  size_t len = br_record_encode(&back, buf, sizeof buf);
  CHECK(len == sizeof OLD_RECORD && !memcmp(buf, OLD_RECORD, len), "old record re-encoded");
  struct {
    const char *name;
    int nloc, with; /* locations; which one has an identity (-1: none) */
    uint64_t dev, ino;
    uint8_t version;
  } cases[] = {
      {"no locations", 0, -1, 0, 0, 1},
      {"three, none identified", 3, -1, 0, 0, 1},
      {"one identified", 1, 0, 64769, 1234567, 2},
      {"third of eight identified", 8, 2, 2049, 99, 2},
      {"inode only", 2, 1, 0, 7, 2},
      {"device only", 2, 0, 3, 0, 2},
      {"largest values", 1, 0, UINT64_MAX, UINT64_MAX, 2},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    br_record r = sample(cases[c].nloc), plain = r;
    if (cases[c].with >= 0) {
      r.locations[cases[c].with].dev = cases[c].dev;
      r.locations[cases[c].with].ino = cases[c].ino;
    }
    len = br_record_encode(&r, buf, sizeof buf);
    size_t plain_len = br_record_encode(&plain, (uint8_t[BR_RECORD_MAX_ENCODED]){0}, sizeof buf);
    CHECK(len && buf[0] == cases[c].version, "%s: version %u", cases[c].name, buf[0]);
    CHECK(len == plain_len + (cases[c].version == 2 ? 16u * (unsigned)cases[c].nloc : 0),
          "%s: %zu bytes, %zu without identity", cases[c].name, len, plain_len);
    CHECK(br_record_decode(buf, len, &back, &err) == 0 && records_equal(&r, &back),
          "%s: round trip (%s)", cases[c].name, err.msg);
    for (size_t cut = 0; cut < len; cut++)
      if (br_record_decode(buf, cut, &back, &err) == 0) {
        CHECK(0, "%s: cut to %zu of %zu accepted", cases[c].name, cut, len);
        break;
      }
    if (cases[c].version == 2) {
      /* the last location's ino is the last 8 bytes: zeroed, no location has an identity */
      br_record z = sample(cases[c].nloc);
      z.locations[cases[c].nloc - 1].ino = 1;
      len = br_record_encode(&z, buf, sizeof buf);
      memset(buf + len - 8, 0, 8);
      CHECK(len && br_record_decode(buf, len, &back, &err) < 0,
            "%s: version 2 without identity accepted", cases[c].name);
    }
  }
  buf[0] = 3; /* unknown version */
  CHECK(br_record_decode(buf, len, &back, &err) < 0, "version 3 accepted");
}

static void test_encoding(void) {
  uint8_t buf[BR_RECORD_MAX_ENCODED];
  for (int nloc = 0; nloc <= BR_MAX_LOCATIONS; nloc++) {
    br_record r = sample(nloc), back;
    if (nloc == 2) {
      r.state = BR_STATE_QUARANTINED;
      strcpy(r.reason, "unreferenced since 2026-11-01");
    }
    size_t len = br_record_encode(&r, buf, sizeof buf);
    CHECK(len > 0, "encode with %d locations", nloc);
    br_err err;
    CHECK(br_record_decode(buf, len, &back, &err) == 0, "decode: %s", err.msg);
    CHECK(records_equal(&r, &back), "round trip with %d locations", nloc);
    /* every truncation and one extra byte are refused */
    for (size_t cut = 0; cut < len; cut++)
      CHECK(br_record_decode(buf, cut, &back, &err) < 0, "truncated to %zu of %zu accepted", cut,
            len);
    buf[len] = 0;
    CHECK(br_record_decode(buf, len + 1, &back, &err) < 0, "trailing byte accepted");
  }
  br_record r = sample(1), back;
  size_t len = br_record_encode(&r, buf, sizeof buf);
  br_err err;
  buf[0] = 2; /* version 2 has 16 bytes more a location */
  CHECK(br_record_decode(buf, len, &back, &err) < 0, "version 1 bytes as version 2 accepted");
  buf[0] = 1;
  buf[1] = 7; /* unknown state */
  CHECK(br_record_decode(buf, len, &back, &err) < 0, "state 7 accepted");
  /* does not fit / invalid */
  CHECK(br_record_encode(&r, buf, 10) == 0, "encode into 10 bytes");
  r.nlocations = BR_MAX_LOCATIONS + 1;
  CHECK(br_record_encode(&r, buf, sizeof buf) == 0, "too many locations encoded");
}

static char dir[256];

static br_index *open_index(uint64_t map, unsigned batch) {
  br_index_options opt = {.map_size = map, .batch_max = batch};
  br_err err;
  br_index *idx = br_index_open(dir, &opt, &err);
  CHECK(idx != NULL, "open %s: %s", dir, err.msg);
  return idx;
}

static void digest_of(unsigned n, uint8_t d[BR_SHA256_LEN]) {
  memset(d, 0, BR_SHA256_LEN);
  for (int i = 0; i < 4; i++) d[i] = (uint8_t)(n >> (8 * i));
  d[31] = 0x5a;
}

struct worker {
  br_index *idx;
  unsigned first, count;
  int created, failed;
};

static void *upload_many(void *arg) {
  struct worker *w = arg;
  for (unsigned i = 0; i < w->count; i++) {
    uint8_t d[BR_SHA256_LEN];
    digest_of(w->first + i, d);
    br_record r = sample(1);
    own_keys(&r, d);
    int created = 0;
    br_err err;
    if (br_index_record_upload(w->idx, d, &r, &created, NULL, &err) < 0)
      w->failed++;
    else
      w->created += created;
  }
  return NULL;
}

static void test_lmdb(void) {
  snprintf(dir, sizeof dir, "/tmp/blobref-test-index-%d", (int)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  br_index *idx = open_index(64 << 20, 64);
  uint8_t d[BR_SHA256_LEN];
  digest_of(1, d);
  br_record r = sample(1), got;
  br_err err;
  CHECK(br_index_get(idx, d, &got, &err) == 1, "absent before insert");
  int created = -1;
  CHECK(br_index_record_upload(idx, d, &r, &created, NULL, &err) == 0 && created == 1, "insert");
  CHECK(br_index_get(idx, d, &got, &err) == 0 && records_equal(&r, &got), "get after insert");
  /* a second upload is a dedup: keeps the record, moves last_upload forward only */
  br_record again = {.last_upload_ms = r.last_upload_ms + 1000};
  CHECK(br_index_record_upload(idx, d, &again, &created, &got, &err) == 0 && created == 0, "dedup");
  CHECK(got.last_upload_ms == r.last_upload_ms + 1000 && got.size == r.size && got.nlocations == 1,
        "dedup record: last_upload %llu", (unsigned long long)got.last_upload_ms);
  /* touch: moves last_upload forward on a live record, never creates one */
  CHECK(br_index_touch(idx, d, r.last_upload_ms + 5000, &err) == 0, "touch live: %s", err.msg);
  CHECK(br_index_get(idx, d, &got, &err) == 0 && got.last_upload_ms == r.last_upload_ms + 5000 &&
            got.size == r.size && got.nlocations == 1,
        "touch kept the record and moved last_upload");
  CHECK(br_index_touch(idx, d, 7, &err) == 0 && br_index_get(idx, d, &got, &err) == 0 &&
            got.last_upload_ms == r.last_upload_ms + 5000,
        "touch never goes back");
  uint8_t absent[BR_SHA256_LEN];
  digest_of(999999, absent);
  CHECK(br_index_touch(idx, absent, 123, &err) == 1, "touch of an absent blob says gone");
  CHECK(br_index_get(idx, absent, &got, &err) == 1, "touch of an absent blob created nothing");
  br_record older = {.last_upload_ms = 5};
  br_index_record_upload(idx, d, &older, &created, &got, &err);
  CHECK(got.last_upload_ms == r.last_upload_ms + 5000, "last_upload never goes back");

  /* concurrent uploads: 8 threads x 500, each digest twice across threads -> exactly one create */
  struct worker w[8];
  pthread_t t[8];
  for (int i = 0; i < 8; i++) {
    w[i] = (struct worker){.idx = idx, .first = 1000 + (unsigned)(i % 4) * 500, .count = 500};
    pthread_create(&t[i], NULL, upload_many, &w[i]);
  }
  int total_created = 0, failed = 0;
  for (int i = 0; i < 8; i++) {
    pthread_join(t[i], NULL);
    total_created += w[i].created;
    failed += w[i].failed;
  }
  CHECK(failed == 0 && total_created == 2000, "concurrent: %d created, %d failed", total_created,
        failed);
  br_index_stats st;
  br_index_get_stats(idx, &st);
  CHECK(st.entries == 2001, "entries %llu", (unsigned long long)st.entries);
  CHECK(st.commits < st.ops, "group commit: %llu commits for %llu ops",
        (unsigned long long)st.commits, (unsigned long long)st.ops);
  br_index_close(idx);

  /* reopen: everything is still there */
  idx = open_index(64 << 20, 64);
  br_index_get_stats(idx, &st);
  CHECK(st.entries == 2001, "entries after reopen %llu", (unsigned long long)st.entries);
  digest_of(1499, d);
  CHECK(br_index_get(idx, d, &got, &err) == 0, "digest 1499 after reopen");
  br_index_close(idx);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);

  /* a tiny map fills up: a clear error (BR_INDEX_FULL), never a crash, earlier data intact */
  idx = open_index(256 << 10, 16);
  int full = 0, ok = 0;
  for (unsigned i = 0; i < 20000 && !full; i++) {
    digest_of(i, d);
    br_record big = sample(BR_MAX_LOCATIONS);
    own_keys(&big, d);
    int rc = br_index_record_upload(idx, d, &big, NULL, NULL, &err);
    if (rc == BR_INDEX_FULL)
      full = 1;
    else if (rc == 0)
      ok++;
  }
  CHECK(full, "map never filled after %d records", ok);
  digest_of(0, d);
  CHECK(ok > 0 && br_index_get(idx, d, &got, &err) == 0, "first record survives a full map");
  br_index_close(idx);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* Conditional state changes: each kind against records in each state, with the cutoffs. */
static void test_changes(void) {
  snprintf(dir, sizeof dir, "/tmp/blobref-test-changes-%d", (int)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot clean %s\n", dir);
  br_index *idx = open_index(64 << 20, 64);
  static const struct {
    enum br_state state;
    uint64_t last_upload, state_ms;
    enum br_change_kind kind;
    uint64_t cutoff, expect_state_ms;
    int applied;
    int after; /* the state afterwards, or -1: the record is gone */
  } cases[] = {
      {BR_STATE_LIVE, 100, 50, BR_CHANGE_QUARANTINE, 200, 0, 1, BR_STATE_QUARANTINED},
      {BR_STATE_LIVE, 300, 50, BR_CHANGE_QUARANTINE, 200, 0, 0, BR_STATE_LIVE}, /* fresh upload */
      {BR_STATE_LIVE, 200, 50, BR_CHANGE_QUARANTINE, 200, 0, 0, BR_STATE_LIVE}, /* at cutoff */
      {BR_STATE_HELD, 100, 50, BR_CHANGE_QUARANTINE, 200, 0, 0, BR_STATE_HELD},
      {BR_STATE_QUARANTINED, 100, 50, BR_CHANGE_RESTORE, 0, 0, 1, BR_STATE_LIVE},
      {BR_STATE_HELD, 100, 50, BR_CHANGE_RESTORE, 0, 0, 0, BR_STATE_HELD}, /* admin's stays */
      {BR_STATE_LIVE, 100, 50, BR_CHANGE_RESTORE, 0, 0, 0, BR_STATE_LIVE},
      {BR_STATE_LIVE, 100, 50, BR_CHANGE_HOLD, 0, 0, 1, BR_STATE_HELD},
      {BR_STATE_QUARANTINED, 100, 50, BR_CHANGE_HOLD, 0, 0, 1, BR_STATE_HELD},
      {BR_STATE_HELD, 100, 50, BR_CHANGE_RELEASE, 0, 0, 1, BR_STATE_LIVE},
      {BR_STATE_QUARANTINED, 100, 50, BR_CHANGE_RELEASE, 0, 0, 1, BR_STATE_LIVE},
      {BR_STATE_LIVE, 100, 50, BR_CHANGE_RELEASE, 0, 0, 0, BR_STATE_LIVE},
      {BR_STATE_QUARANTINED, 100, 50, BR_CHANGE_REMOVE, 60, 50, 1, -1},
      {BR_STATE_QUARANTINED, 100, 50, BR_CHANGE_REMOVE, 60, 49, 0, BR_STATE_QUARANTINED},
      {BR_STATE_QUARANTINED, 100, 50, BR_CHANGE_REMOVE, 50, 50, 0, BR_STATE_QUARANTINED},
      {BR_STATE_HELD, 100, 50, BR_CHANGE_REMOVE, 60, 50, 1, -1},
      {BR_STATE_LIVE, 100, 50, BR_CHANGE_REMOVE, 60, 50, 0, BR_STATE_LIVE},
  };
  size_t n = sizeof cases / sizeof cases[0];
  br_change ch[sizeof cases / sizeof cases[0]];
  br_err err;
  for (size_t i = 0; i < n; i++) {
    br_record r = sample(1);
    r.state = cases[i].state;
    r.last_upload_ms = cases[i].last_upload;
    r.state_ms = cases[i].state_ms;
    if (r.state != BR_STATE_LIVE) strcpy(r.reason, "old");
    memset(&ch[i], 0, sizeof ch[i]);
    digest_of(1000 + (unsigned)i, ch[i].digest);
    own_keys(&r, ch[i].digest);
    CHECK(br_index_record_upload(idx, ch[i].digest, &r, NULL, NULL, &err) == 0, "setup %zu", i);
    ch[i].kind = cases[i].kind;
    ch[i].cutoff_ms = cases[i].cutoff;
    ch[i].expect_state_ms = cases[i].expect_state_ms;
    ch[i].reason = "why";
  }
  CHECK(br_index_apply_changes(idx, ch, n, 5000, &err) == 0, "apply: %s", err.msg);
  for (size_t i = 0; i < n; i++) {
    br_record got;
    int rc = br_index_get(idx, ch[i].digest, &got, &err);
    CHECK(ch[i].applied == cases[i].applied, "case %zu: applied %d", i, ch[i].applied);
    if (cases[i].after < 0) {
      CHECK(rc == 1, "case %zu: the record is gone", i);
      continue;
    }
    CHECK(rc == 0 && (int)got.state == cases[i].after, "case %zu: state %d", i, (int)got.state);
    if (cases[i].applied)
      CHECK(got.state_ms == 5000 && !strcmp(got.reason, got.state == BR_STATE_LIVE ? "" : "why"),
            "case %zu: state_ms %llu reason '%s'", i, (unsigned long long)got.state_ms, got.reason);
    if (cases[i].applied && cases[i].kind == BR_CHANGE_RELEASE)
      CHECK(got.last_upload_ms == 5000, "case %zu: a release is a fresh grace", i);
  }
  /* an absent blob: nothing applied, no error */
  br_change absent = {.kind = BR_CHANGE_HOLD};
  digest_of(99999, absent.digest);
  CHECK(br_index_apply_changes(idx, &absent, 1, 5000, &err) == 0 && !absent.applied, "absent");
  br_index_close(idx);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

struct page {
  uint8_t keys[64][BR_SHA256_LEN];
  int n;
  int states[64];
};

static int collect(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  struct page *p = ud;
  if (p->n == 64) return 1;
  memcpy(p->keys[p->n], digest, BR_SHA256_LEN);
  p->states[p->n++] = (int)rec->state;
  return 0;
}

/* Paging with br_index_list_after: every record exactly once, in key order, with and without a
 * state filter, from an absent `after` key too. */
static void test_list(void) {
  snprintf(dir, sizeof dir, "/tmp/blobref-test-index-list-%d", (int)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  br_index *idx = open_index(64 << 20, 64);
  br_err err;
  uint8_t d[BR_SHA256_LEN], next[BR_SHA256_LEN];
  int has_next = -1;
  struct page pg = {0};
  CHECK(br_index_list_after(idx, NULL, 10, -1, collect, &pg, next, &has_next, &err) == 0 &&
            pg.n == 0 && has_next == 0,
        "empty index lists nothing");
  int nq = 0;
  for (unsigned i = 0; i < 37; i++) {
    br_record r = sample(1);
    if (i % 3 == 0) {
      r.state = BR_STATE_QUARANTINED;
      strcpy(r.reason, "test");
      nq++;
    }
    digest_of(i, d);
    own_keys(&r, d);
    CHECK(br_index_record_upload(idx, d, &r, NULL, NULL, &err) == 0, "insert %u", i);
  }
  for (int state = -1; state <= 1; state++) {
    for (size_t limit = 1; limit <= 40; limit += 6) {
      int total = 0, pages = 0, order_ok = 1, state_ok = 1;
      uint8_t last[BR_SHA256_LEN];
      const uint8_t *after = NULL;
      for (;;) {
        pg.n = 0;
        if (br_index_list_after(idx, after, limit, state, collect, &pg, next, &has_next, &err)) {
          CHECK(0, "list: %s", err.msg);
          break;
        }
        CHECK(pg.n <= (int)limit, "page of %d over limit %zu", pg.n, limit);
        for (int i = 0; i < pg.n; i++) {
          if (total > 0 && memcmp(last, pg.keys[i], BR_SHA256_LEN) >= 0) order_ok = 0;
          if (state >= 0 && pg.states[i] != state) state_ok = 0;
          memcpy(last, pg.keys[i], BR_SHA256_LEN);
          total++;
        }
        pages++;
        if (!has_next || pages > 100) break;
        memcpy(d, next, BR_SHA256_LEN);
        after = d;
      }
      int want = state < 0 ? 37 : state == BR_STATE_QUARANTINED ? nq : 37 - nq;
      CHECK(total == want && order_ok && state_ok, "state %d limit %zu: %d of %d, order %d", state,
            limit, total, want, order_ok);
    }
  }
  /* after a key that is not in the index: starts at the next greater key */
  uint8_t mid[BR_SHA256_LEN];
  memset(mid, 0x80, sizeof mid);
  mid[0] = 0x10; /* between digest_of(16) and digest_of(17) */
  pg.n = 0;
  CHECK(br_index_list_after(idx, mid, 64, -1, collect, &pg, next, &has_next, &err) == 0 &&
            has_next == 0,
        "list after an absent key");
  int ok = 1;
  for (int i = 0; i < pg.n; i++) ok &= memcmp(pg.keys[i], mid, BR_SHA256_LEN) > 0;
  CHECK(ok && pg.n == 20, "after an absent key: %d greater keys", pg.n);
  br_index_close(idx);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

static int count_cb(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  (void)digest, (void)rec;
  ++*(int *)ud;
  return 0;
}
struct nth_arg {
  int want;
  uint8_t *out;
  int *seen;
};
static int nth_cb(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  (void)rec;
  struct nth_arg *a = ud;
  if (*a->seen == a->want) {
    memcpy(a->out, digest, BR_SHA256_LEN);
    return 1;
  }
  ++*a->seen;
  return 0;
}

static br_location loc_at(const char *store, const char *key, uint64_t verified) {
  br_location l = {.role = BR_ROLE_PRIMARY, .verified_at_ms = verified};
  snprintf(l.store, sizeof l.store, "%s", store);
  snprintf(l.key, sizeof l.key, "%s", key);
  return l;
}

static int count_role(const br_record *r, enum br_role role) {
  int n = 0;
  for (int i = 0; i < r->nlocations; i++) n += r->locations[i].role == role;
  return n;
}

/* Moves: a switch is conditional on the primary, the old one drains, a drop is conditional on
 * the draining location and its time, a move back replaces the draining entry; imports insert
 * only when absent; listing resumes after a key. */
static void test_locations(void) {
  snprintf(dir, sizeof dir, "/tmp/blobref-test-index-loc-%d", (int)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  br_index *idx = open_index(64 << 20, 64);
  uint8_t d[BR_SHA256_LEN];
  digest_of(7, d);
  br_record r = sample(0), got;
  r.nlocations = 1;
  r.locations[0] = loc_at("a", "k1", 10);
  br_err err;
  br_loc_change ins = {.kind = BR_LOC_INSERT, .rec = &r};
  memcpy(ins.digest, d, BR_SHA256_LEN);
  CHECK(br_index_apply_locations(idx, &ins, 1, 100, &err) == 0 && ins.outcome == BR_LOC_APPLIED,
        "insert absent");
  CHECK(br_index_apply_locations(idx, &ins, 1, 100, &err) == 0 && ins.outcome == BR_LOC_EXISTS,
        "insert again: exists (%d)", ins.outcome);
  br_record other = r;
  other.locations[0] = loc_at("a", "elsewhere", 10);
  ins.rec = &other;
  CHECK(br_index_apply_locations(idx, &ins, 1, 100, &err) == 0 && ins.outcome == BR_LOC_DUPLICATE,
        "insert of a known hash at another key: duplicate, nothing changed");
  CHECK(br_index_get(idx, d, &got, &err) == 0 && got.nlocations == 1, "still one location");

  /* switch with a stale expectation: conflict, nothing changed */
  br_loc_change sw = {
      .kind = BR_LOC_SWITCH, .expect = loc_at("a", "nope", 0), .to = loc_at("b", "k2", 200)};
  memcpy(sw.digest, d, BR_SHA256_LEN);
  CHECK(br_index_apply_locations(idx, &sw, 1, 150, &err) == 0 && sw.outcome == BR_LOC_CONFLICT,
        "switch with a wrong expect");
  sw.expect = loc_at("a", "k1", 0);
  CHECK(br_index_apply_locations(idx, &sw, 1, 150, &err) == 0 && sw.outcome == BR_LOC_APPLIED,
        "switch");
  CHECK(br_index_get(idx, d, &got, &err) == 0 && got.nlocations == 2 &&
            !strcmp(br_record_primary(&got)->store, "b") &&
            br_record_primary(&got)->verified_at_ms == 200 &&
            count_role(&got, BR_ROLE_DRAINING) == 1 && got.locations[1].verified_at_ms == 150 &&
            !strcmp(got.locations[1].key, "k1"),
        "after the switch: b primary, a draining since 150");
  CHECK(br_index_apply_locations(idx, &sw, 1, 160, &err) == 0 && sw.outcome == BR_LOC_CONFLICT,
        "the same switch again: conflict (primary moved)");

  /* drop: only the draining location with its time, only past the cutoff */
  br_loc_change dr = {.kind = BR_LOC_DROP, .expect = loc_at("a", "k1", 150), .cutoff_ms = 150};
  memcpy(dr.digest, d, BR_SHA256_LEN);
  CHECK(br_index_apply_locations(idx, &dr, 1, 170, &err) == 0 && dr.outcome == BR_LOC_CONFLICT,
        "drop before the cutoff");
  dr.cutoff_ms = 151;
  dr.expect.verified_at_ms = 149;
  CHECK(br_index_apply_locations(idx, &dr, 1, 170, &err) == 0 && dr.outcome == BR_LOC_CONFLICT,
        "drop with another draining time");
  dr.expect = loc_at("b", "k2", 200);
  dr.cutoff_ms = 1000;
  CHECK(br_index_apply_locations(idx, &dr, 1, 170, &err) == 0 && dr.outcome == BR_LOC_CONFLICT,
        "drop of the primary refused");

  /* move back onto the draining location: it becomes the primary, b drains */
  br_loc_change back = {
      .kind = BR_LOC_SWITCH, .expect = loc_at("b", "k2", 0), .to = loc_at("a", "k1", 300)};
  memcpy(back.digest, d, BR_SHA256_LEN);
  CHECK(br_index_apply_locations(idx, &back, 1, 300, &err) == 0 && back.outcome == BR_LOC_APPLIED,
        "switch back");
  CHECK(br_index_get(idx, d, &got, &err) == 0 && got.nlocations == 2 &&
            !strcmp(br_record_primary(&got)->store, "a") &&
            count_role(&got, BR_ROLE_DRAINING) == 1 && !strcmp(got.locations[1].store, "b"),
        "after the move back: a primary, b draining, no duplicate entry");
  dr.expect = loc_at("a", "k1", 150);
  dr.cutoff_ms = 1000;
  CHECK(br_index_apply_locations(idx, &dr, 1, 400, &err) == 0 && dr.outcome == BR_LOC_CONFLICT,
        "the old draining entry of a (now primary) is not dropped");
  dr.expect = loc_at("b", "k2", 300);
  CHECK(br_index_apply_locations(idx, &dr, 1, 400, &err) == 0 && dr.outcome == BR_LOC_APPLIED,
        "drop b");
  CHECK(br_index_get(idx, d, &got, &err) == 0 && got.nlocations == 1 &&
            got.locations[0].role == BR_ROLE_PRIMARY && !strcmp(got.locations[0].store, "a"),
        "only the primary is left");
  /* an encoded record round-trips with a draining location (format unchanged) */
  uint8_t buf[BR_RECORD_MAX_ENCODED];
  br_record enc = got, dec;
  enc.locations[enc.nlocations++] = loc_at("z", "old", 5);
  enc.locations[1].role = BR_ROLE_DRAINING;
  size_t len = br_record_encode(&enc, buf, sizeof buf);
  CHECK(len && br_record_decode(buf, len, &dec, &err) == 0 && records_equal(&enc, &dec),
        "draining round trip");

  uint8_t absent[BR_SHA256_LEN];
  digest_of(424242, absent);
  br_loc_change ab = {
      .kind = BR_LOC_SWITCH, .expect = loc_at("a", "k1", 0), .to = loc_at("b", "k2", 1)};
  memcpy(ab.digest, absent, BR_SHA256_LEN);
  CHECK(br_index_apply_locations(idx, &ab, 1, 1, &err) == 0 && ab.outcome == BR_LOC_ABSENT,
        "switch of an absent blob");

  /* paging: foreach_after resumes strictly after the key */
  for (unsigned i = 100; i < 110; i++) {
    uint8_t di[BR_SHA256_LEN];
    digest_of(i, di);
    br_record ri = r;
    own_keys(&ri, di);
    br_index_record_upload(idx, di, &ri, NULL, NULL, &err);
  }
  int all = 0;
  CHECK(br_index_foreach(idx, count_cb, &all, &err) == 0 && all == 11, "11 records (%d)", all);
  uint8_t mid[BR_SHA256_LEN];
  int k = 0;
  struct nth_arg na = {.want = 4, .out = mid, .seen = &k};
  br_index_foreach(idx, nth_cb, &na, &err);
  int rest = 0;
  CHECK(br_index_foreach_after(idx, mid, count_cb, &rest, &err) == 0 && rest == 11 - 5,
        "after the 5th: %d", rest);
  br_index_close(idx);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* ---- record cache ---------------------------------------------------------------------------- */

static br_change change_of(const uint8_t d[BR_SHA256_LEN], enum br_change_kind kind) {
  br_change c = {.kind = kind, .cutoff_ms = UINT64_MAX, .reason = "test"};
  memcpy(c.digest, d, BR_SHA256_LEN);
  return c;
}

static int state_of(br_index *idx, const uint8_t d[BR_SHA256_LEN], br_record *got) {
  br_err err;
  int rc = br_index_get(idx, d, got, &err);
  return rc == 0 ? (int)got->state : rc == 1 ? -1 : -2;
}

/* Every kind of write to a cached record is seen by the next read: hold, release, quarantine,
 * restore, remove, a dedup upload, a touch, a location switch. */
static void test_cache_sequential(void) {
  snprintf(dir, sizeof dir, "/tmp/blobref-test-index-cache-%d", (int)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  br_index *idx = open_index(64 << 20, 64);
  uint8_t d[BR_SHA256_LEN];
  digest_of(99, d);
  br_record r = sample(1), got;
  r.locations[0].role = BR_ROLE_PRIMARY;
  br_err err;
  CHECK(br_index_record_upload(idx, d, &r, NULL, NULL, &err) == 0, "insert");
  br_index_stats st0, st1;
  br_index_get_stats(idx, &st0);
  for (int i = 0; i < 3; i++) CHECK(state_of(idx, d, &got) == BR_STATE_LIVE, "live %d", i);
  br_index_get_stats(idx, &st1);
  CHECK(st1.cache_hits - st0.cache_hits >= 2 && st1.cache_misses - st0.cache_misses == 1,
        "three reads: one miss then hits (%llu hits, %llu misses)",
        (unsigned long long)(st1.cache_hits - st0.cache_hits),
        (unsigned long long)(st1.cache_misses - st0.cache_misses));

  static const struct {
    enum br_change_kind kind;
    int want;
  } steps[] = {
      {BR_CHANGE_HOLD, BR_STATE_HELD},
      {BR_CHANGE_RELEASE, BR_STATE_LIVE},
      {BR_CHANGE_QUARANTINE, BR_STATE_QUARANTINED},
      {BR_CHANGE_RESTORE, BR_STATE_LIVE},
      {BR_CHANGE_QUARANTINE, BR_STATE_QUARANTINED},
  };
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    CHECK(state_of(idx, d, &got) >= 0, "cached before step %zu", i); /* warm */
    br_change c = change_of(d, steps[i].kind);
    CHECK(br_index_apply_changes(idx, &c, 1, 1000 + i, &err) == 0 && c.applied == 1,
          "step %zu applied", i);
    CHECK(state_of(idx, d, &got) == steps[i].want, "step %zu: state %d after the write", i,
          (int)got.state);
  }
  /* a dedup upload brings the quarantined blob back and moves last_upload */
  CHECK(state_of(idx, d, &got) == BR_STATE_QUARANTINED, "warm");
  br_record again = r;
  again.last_upload_ms = r.last_upload_ms + 777;
  CHECK(br_index_record_upload(idx, d, &again, NULL, NULL, &err) == 0, "dedup upload");
  CHECK(state_of(idx, d, &got) == BR_STATE_LIVE && got.last_upload_ms == again.last_upload_ms,
        "dedup upload seen at once");
  CHECK(br_index_touch(idx, d, again.last_upload_ms + 1, &err) == 0, "touch");
  CHECK(state_of(idx, d, &got) == BR_STATE_LIVE && got.last_upload_ms == again.last_upload_ms + 1,
        "touch seen at once");
  /* a move: the new primary is what the next read finds */
  br_loc_change sw = {.kind = BR_LOC_SWITCH, .expect = r.locations[0]};
  snprintf(sw.to.store, sizeof sw.to.store, "moved");
  snprintf(sw.to.key, sizeof sw.to.key, "new/key");
  memcpy(sw.digest, d, BR_SHA256_LEN);
  CHECK(br_index_apply_locations(idx, &sw, 1, 5000, &err) == 0 && sw.outcome == BR_LOC_APPLIED,
        "switch: %s (%d)", err.msg, sw.outcome);
  CHECK(state_of(idx, d, &got) == BR_STATE_LIVE && !strcmp(br_record_primary(&got)->store, "moved"),
        "the move seen at once (primary %s)", br_record_primary(&got)->store);
  /* a final removal: gone at once */
  br_change q = change_of(d, BR_CHANGE_QUARANTINE);
  CHECK(br_index_apply_changes(idx, &q, 1, 6000, &err) == 0 && q.applied, "quarantine again");
  CHECK(state_of(idx, d, &got) == BR_STATE_QUARANTINED, "warm before removal");
  br_change rm = change_of(d, BR_CHANGE_REMOVE);
  rm.expect_state_ms = 6000;
  CHECK(br_index_apply_changes(idx, &rm, 1, 7000, &err) == 0 && rm.applied, "remove");
  CHECK(state_of(idx, d, &got) == -1, "removed: absent at once");
  br_index_close(idx);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* Readers race a writer that holds and releases a few hot blobs. Each change sets the record's
 * state_ms to its own time, which only grows; once a change has returned, the writer publishes that
 * time. A read that starts after the publication must find at least that state_ms: a stale cached
 * record would show an older one. (A read may also find a newer one, committed but not yet
 * acknowledged: that is fine.) */
#define RACE_BLOBS 4
#define RACE_T0 1800000000000ull
struct cache_race {
  br_index *idx;
  _Atomic uint64_t acked[RACE_BLOBS];
  atomic_int stop;
  long reads, stale;
};

static void *cache_reader(void *arg) {
  struct cache_race *cr = arg;
  br_record got;
  for (unsigned n = 0; !atomic_load(&cr->stop); n++) {
    unsigned b = n % RACE_BLOBS;
    uint8_t d[BR_SHA256_LEN];
    digest_of(500 + b, d);
    uint64_t acked = atomic_load(&cr->acked[b]);
    int s = state_of(cr->idx, d, &got);
    __atomic_add_fetch(&cr->reads, 1, __ATOMIC_RELAXED);
    if (s < 0 || got.state_ms < acked) __atomic_add_fetch(&cr->stale, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

static void test_cache_race(void) {
  snprintf(dir, sizeof dir, "/tmp/blobref-test-index-race-%d", (int)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  struct cache_race cr = {.idx = open_index(64 << 20, 64)};
  br_err err;
  for (unsigned b = 0; b < RACE_BLOBS; b++) {
    uint8_t d[BR_SHA256_LEN];
    digest_of(500 + b, d);
    br_record r = sample(1);
    own_keys(&r, d);
    CHECK(br_index_record_upload(cr.idx, d, &r, NULL, NULL, &err) == 0, "insert %u", b);
  }
  pthread_t t[3];
  for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, cache_reader, &cr);
  unsigned applied = 0;
  for (unsigned round = 0; round < 600; round++) {
    unsigned b = round % RACE_BLOBS;
    uint8_t d[BR_SHA256_LEN];
    digest_of(500 + b, d);
    br_change c = change_of(d, (round / RACE_BLOBS) % 2 ? BR_CHANGE_RELEASE : BR_CHANGE_HOLD);
    uint64_t when = RACE_T0 + round;
    if (br_index_apply_changes(cr.idx, &c, 1, when, &err) != 0 || !c.applied) break;
    applied++;
    atomic_store(&cr.acked[b], when);
    usleep(200);
  }
  atomic_store(&cr.stop, 1);
  for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
  br_index_stats st;
  br_index_get_stats(cr.idx, &st);
  CHECK(applied == 600, "all 600 holds and releases applied (%u)", applied);
  CHECK(cr.reads > 1000 && st.cache_hits > 1000,
        "enough reads (%ld) answered from the cache (%llu)", cr.reads,
        (unsigned long long)st.cache_hits);
  CHECK(cr.stale == 0, "%ld of %ld reads saw a record older than an acknowledged write", cr.stale,
        cr.reads);
  br_index_close(cr.idx);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* ---- integrity (issue 19) ------------------------------------------------------------------- */

static void fresh_dir(const char *name) {
  snprintf(dir, sizeof dir, "/tmp/blobref-test-%s-%d", name, (int)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot clean %s\n", dir);
}

static void remove_dir(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* A map that fills inside mdb_put of a large record (overflow pages) is BR_INDEX_FULL, never a
 * generic error from a transaction used on after LMDB failed it. */
static void test_full_big_put(void) {
  fresh_dir("index-bigfull");
  br_index *idx = open_index(256 << 10, 1);
  br_err err;
  int full = 0, ok = 0, other = 0;
  for (unsigned i = 0; i < 2000 && !full && !other; i++) {
    uint8_t d[BR_SHA256_LEN];
    digest_of(i, d);
    br_record big = sample(BR_MAX_LOCATIONS);
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(d, hex);
    for (int l = 0; l < big.nlocations; l++) { /* ~1,000-byte keys: a record of ~8 KB */
      int n = snprintf(big.locations[l].key, sizeof big.locations[l].key, "%s/%d/", hex, l);
      memset(big.locations[l].key + n, 'x', 900);
      big.locations[l].key[n + 900] = '\0';
    }
    int rc = br_index_record_upload(idx, d, &big, NULL, NULL, &err);
    if (rc == BR_INDEX_FULL)
      full = 1;
    else if (rc == 0)
      ok++;
    else
      other = rc;
  }
  CHECK(full && !other, "a big put into a full map: BR_INDEX_FULL (got %d after %d: %s)", other, ok,
        err.msg);
  uint8_t d0[BR_SHA256_LEN];
  br_record got;
  digest_of(0, d0);
  CHECK(ok > 0 && br_index_get(idx, d0, &got, &err) == 0, "earlier records survive");
  br_index_close(idx);
  remove_dir();
}

/* The child: opens the index directory with LMDB of its own, begins a read transaction, says so
 * on fd and waits to be killed (its reader slot stays behind, pinning its snapshot). */
static void stale_reader_child(int fd) {
  MDB_env *env = NULL;
  MDB_txn *txn = NULL;
  if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 4) ||
      mdb_env_open(env, dir, MDB_NOTLS | MDB_RDONLY, 0644) ||
      mdb_txn_begin(env, NULL, MDB_RDONLY, &txn))
    _exit(1);
  if (write(fd, "r", 1) != 1) _exit(1);
  for (;;) pause();
}

/* A reader killed in the middle of a read transaction (a killed `blobrefd --fsck`) never blocks
 * the writer: without mdb_reader_check its snapshot keeps every page freed since, and a small
 * map fills after a few hundred writes (then every write failed). */
static void test_stale_reader(void) {
  fresh_dir("index-stale");
  br_index *idx = open_index(4 << 20, 1);
  br_err err;
  uint8_t d[BR_SHA256_LEN];
  for (unsigned i = 0; i < 20; i++) {
    digest_of(i, d);
    br_record r = sample(1);
    own_keys(&r, d);
    CHECK(br_index_record_upload(idx, d, &r, NULL, NULL, &err) == 0, "seed %u", i);
  }
  int p[2];
  CHECK(pipe(p) == 0, "pipe");
  pid_t pid = fork();
  if (pid == 0) stale_reader_child(p[1]);
  char c = 0;
  CHECK(read(p[0], &c, 1) == 1 && c == 'r', "the child holds a read transaction");
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  close(p[0]);
  close(p[1]);
  int failed = 0;
  br_err first = {{0}};
  for (unsigned i = 0; i < 2000; i++) {
    digest_of(1000 + i, d);
    br_record r = sample(1);
    own_keys(&r, d);
    if (br_index_record_upload(idx, d, &r, NULL, NULL, &err) != 0 && failed++ == 0) first = err;
  }
  CHECK(failed == 0, "2000 writes after a killed reader: %d failed (%s)", failed, first.msg);
  br_index_stats st;
  br_index_get_stats(idx, &st);
  CHECK(st.stale_readers >= 1, "the stale slot was cleared (%llu)",
        (unsigned long long)st.stale_readers);
  br_index_close(idx);
  remove_dir();
}

static br_record at(const char *store, const char *key, enum br_state state, uint64_t state_ms) {
  br_record r = sample(0);
  r.nlocations = 1;
  r.state = state;
  r.state_ms = state_ms;
  snprintf(r.locations[0].store, sizeof r.locations[0].store, "%s", store);
  snprintf(r.locations[0].key, sizeof r.locations[0].key, "%s", key);
  return r;
}

/* A store key belongs to at most one record: imports, switches and uploads onto another
 * record's key are refused; the owner is known until its record lets the key go. */
static void test_key_owner(void) {
  fresh_dir("index-keys");
  br_index *idx = open_index(64 << 20, 8);
  br_err err;
  uint8_t a[BR_SHA256_LEN], b[BR_SHA256_LEN], c[BR_SHA256_LEN], owner[BR_SHA256_LEN];
  digest_of(1, a);
  digest_of(2, b);
  digest_of(3, c);
  br_record ra = at("local", "photos/x.jpg", BR_STATE_LIVE, 10);
  br_record rb = at("local", "photos/x.jpg", BR_STATE_LIVE, 10);
  br_loc_change ins[2] = {{.kind = BR_LOC_INSERT, .rec = &ra}, {.kind = BR_LOC_INSERT, .rec = &rb}};
  memcpy(ins[0].digest, a, BR_SHA256_LEN);
  memcpy(ins[1].digest, b, BR_SHA256_LEN);
  CHECK(br_index_apply_locations(idx, ins, 2, 100, &err) == 0, "imports: %s", err.msg);
  CHECK(ins[0].outcome == BR_LOC_APPLIED && ins[1].outcome == BR_LOC_KEY_TAKEN,
        "the second import of one key is refused (%d %d)", ins[0].outcome, ins[1].outcome);
  br_record got;
  CHECK(br_index_get(idx, b, &got, &err) == 1, "nothing was inserted for b");
  CHECK(br_index_key_owner(idx, "local", "photos/x.jpg", owner, &err) == 0 &&
            !memcmp(owner, a, BR_SHA256_LEN),
        "a owns the key");
  CHECK(br_index_key_owner(idx, "other", "photos/x.jpg", owner, &err) == 1, "no owner elsewhere");
  /* an upload onto it */
  br_record rc = at("local", "photos/x.jpg", BR_STATE_LIVE, 10);
  CHECK(br_index_record_upload(idx, c, &rc, NULL, NULL, &err) == BR_INDEX_KEY_TAKEN,
        "an upload onto another record's key: BR_INDEX_KEY_TAKEN");
  CHECK(br_index_get(idx, c, &got, &err) == 1, "nothing was recorded for c");
  /* a switch onto it */
  rb = at("local", "photos/b.jpg", BR_STATE_LIVE, 10);
  ins[1].outcome = -1;
  CHECK(
      br_index_apply_locations(idx, &ins[1], 1, 100, &err) == 0 && ins[1].outcome == BR_LOC_APPLIED,
      "b imported at its own key");
  br_loc_change sw = {.kind = BR_LOC_SWITCH,
                      .expect = loc_at("local", "photos/b.jpg", 0),
                      .to = loc_at("local", "photos/x.jpg", 200)};
  memcpy(sw.digest, b, BR_SHA256_LEN);
  CHECK(br_index_apply_locations(idx, &sw, 1, 200, &err) == 0 && sw.outcome == BR_LOC_KEY_TAKEN,
        "a switch onto another record's key: refused (%d)", sw.outcome);
  CHECK(br_index_get(idx, b, &got, &err) == 0 && got.nlocations == 1 &&
            !strcmp(got.locations[0].key, "photos/b.jpg"),
        "b unchanged");
  /* a switch to a free key moves the ownership along; the old key stays b's while it drains */
  sw.to = loc_at("s3", "sha256/bb", 200);
  CHECK(br_index_apply_locations(idx, &sw, 1, 200, &err) == 0 && sw.outcome == BR_LOC_APPLIED,
        "switch to a free key");
  CHECK(br_index_key_owner(idx, "s3", "sha256/bb", owner, &err) == 0 &&
            !memcmp(owner, b, BR_SHA256_LEN) &&
            br_index_key_owner(idx, "local", "photos/b.jpg", owner, &err) == 0 &&
            !memcmp(owner, b, BR_SHA256_LEN),
        "b owns its new key and its draining one");
  br_loc_change dr = {
      .kind = BR_LOC_DROP, .expect = loc_at("local", "photos/b.jpg", 200), .cutoff_ms = 1000};
  memcpy(dr.digest, b, BR_SHA256_LEN);
  CHECK(br_index_apply_locations(idx, &dr, 1, 300, &err) == 0 && dr.outcome == BR_LOC_APPLIED,
        "drop the draining copy");
  CHECK(br_index_key_owner(idx, "local", "photos/b.jpg", owner, &err) == 1,
        "a dropped location frees its key");
  /* a removed record frees its keys */
  br_change ch[2] = {{.kind = BR_CHANGE_HOLD, .reason = "test"}};
  memcpy(ch[0].digest, a, BR_SHA256_LEN);
  CHECK(br_index_apply_changes(idx, ch, 1, 500, &err) == 0 && ch[0].applied, "hold a");
  ch[1] = (br_change){.kind = BR_CHANGE_REMOVE, .cutoff_ms = UINT64_MAX, .expect_state_ms = 500};
  memcpy(ch[1].digest, a, BR_SHA256_LEN);
  CHECK(br_index_apply_changes(idx, &ch[1], 1, 600, &err) == 0 && ch[1].applied, "remove a");
  CHECK(br_index_key_owner(idx, "local", "photos/x.jpg", owner, &err) == 1,
        "a removed record frees its key");
  CHECK(br_index_record_upload(idx, c, &rc, NULL, NULL, &err) == 0, "now c may take it");
  CHECK(br_index_key_owner(idx, "local", "photos/x.jpg", owner, &err) == 0 &&
            !memcmp(owner, c, BR_SHA256_LEN),
        "c owns it");
  br_index_close(idx);
  remove_dir();
}

/* An index written before the reverse map existed is upgraded when opened for writing: the map
 * is built once; a key several records share is nobody's (its bytes are never deleted). */
static void test_keys_upgrade(void) {
  fresh_dir("index-upgrade");
  CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
  MDB_env *env = NULL;
  MDB_txn *txn = NULL;
  MDB_dbi dbi;
  int rc = mdb_env_create(&env);
  if (!rc) rc = mdb_env_set_maxdbs(env, 4);
  if (!rc) rc = mdb_env_open(env, dir, MDB_NOTLS, 0644);
  if (!rc) rc = mdb_txn_begin(env, NULL, 0, &txn);
  if (!rc) rc = mdb_dbi_open(txn, "blobs", MDB_CREATE, &dbi);
  uint8_t d[3][BR_SHA256_LEN], owner[BR_SHA256_LEN];
  const char *keys[3] = {"in/place.bin", "in/place.bin", "own/key"};
  for (int i = 0; i < 3 && !rc; i++) {
    digest_of(50 + (unsigned)i, d[i]);
    br_record r = at("local", keys[i], BR_STATE_LIVE, 10);
    uint8_t buf[BR_RECORD_MAX_ENCODED];
    MDB_val k = {BR_SHA256_LEN, d[i]}, v = {br_record_encode(&r, buf, sizeof buf), buf};
    rc = mdb_put(txn, dbi, &k, &v, 0);
  }
  if (!rc) rc = mdb_txn_commit(txn);
  mdb_env_close(env);
  CHECK(rc == 0, "an index of the old format: %s", mdb_strerror(rc));
  br_err err;
  br_index_options ro = {.map_size = 64 << 20, .batch_max = 1, .read_only = 1};
  br_index *idx = br_index_open(dir, &ro, &err);
  CHECK(idx && br_index_key_owner(idx, "local", "own/key", owner, &err) < 0,
        "a read-only open of an old index: no map, an error");
  br_index_close(idx);
  idx = open_index(64 << 20, 8);
  CHECK(br_index_key_owner(idx, "local", "own/key", owner, &err) == 0 &&
            !memcmp(owner, d[2], BR_SHA256_LEN),
        "upgraded: own/key is its record's");
  CHECK(br_index_key_owner(idx, "local", "in/place.bin", owner, &err) == 2,
        "a shared key is marked shared");
  br_record r3 = at("local", "own/key", BR_STATE_LIVE, 10);
  uint8_t e[BR_SHA256_LEN];
  digest_of(60, e);
  CHECK(br_index_record_upload(idx, e, &r3, NULL, NULL, &err) == BR_INDEX_KEY_TAKEN,
        "the upgraded map refuses a second owner");
  br_index_close(idx);
  idx = open_index(64 << 20, 8); /* opened again: the map is complete, kept as it is */
  CHECK(br_index_key_owner(idx, "local", "own/key", owner, &err) == 0, "still there on reopen");
  br_index_close(idx);
  remove_dir();
}

/* The deleting state: only quarantined or held records with the expected state time are
 * marked; a deleting record is never restored, released or held; an upload replaces it; a
 * remove finishes it. */
static void test_deleting(void) {
  fresh_dir("index-deleting");
  br_index *idx = open_index(64 << 20, 8);
  br_err err;
  static const struct {
    enum br_state state;
    enum br_change_kind kind;
    uint64_t expect;
    int applied;
    int after;
  } cases[] = {
      {BR_STATE_QUARANTINED, BR_CHANGE_MARK_DELETE, 50, 1, BR_STATE_DELETING},
      {BR_STATE_HELD, BR_CHANGE_MARK_DELETE, 50, 1, BR_STATE_DELETING},
      {BR_STATE_QUARANTINED, BR_CHANGE_MARK_DELETE, 49, 0, BR_STATE_QUARANTINED},
      {BR_STATE_LIVE, BR_CHANGE_MARK_DELETE, 50, 0, BR_STATE_LIVE},
      {BR_STATE_DELETING, BR_CHANGE_MARK_DELETE, 50, 0, BR_STATE_DELETING},
      {BR_STATE_DELETING, BR_CHANGE_RESTORE, 0, 0, BR_STATE_DELETING},
      {BR_STATE_DELETING, BR_CHANGE_RELEASE, 0, 0, BR_STATE_DELETING},
      {BR_STATE_DELETING, BR_CHANGE_HOLD, 0, 0, BR_STATE_DELETING},
      {BR_STATE_DELETING, BR_CHANGE_QUARANTINE, 0, 0, BR_STATE_DELETING},
      {BR_STATE_DELETING, BR_CHANGE_REMOVE, 50, 1, -1},
  };
  size_t n = sizeof cases / sizeof cases[0];
  br_change ch[sizeof cases / sizeof cases[0]];
  for (size_t i = 0; i < n; i++) {
    br_record r = sample(1);
    r.state = cases[i].state;
    r.state_ms = 50;
    r.last_upload_ms = 10;
    memset(&ch[i], 0, sizeof ch[i]);
    digest_of(2000 + (unsigned)i, ch[i].digest);
    own_keys(&r, ch[i].digest);
    CHECK(br_index_record_upload(idx, ch[i].digest, &r, NULL, NULL, &err) == 0, "setup %zu", i);
    ch[i].kind = cases[i].kind;
    ch[i].cutoff_ms = UINT64_MAX;
    ch[i].expect_state_ms = cases[i].expect;
  }
  CHECK(br_index_apply_changes(idx, ch, n, 5000, &err) == 0, "apply: %s", err.msg);
  for (size_t i = 0; i < n; i++) {
    br_record got;
    int rc = br_index_get(idx, ch[i].digest, &got, &err);
    CHECK(ch[i].applied == cases[i].applied, "case %zu: applied %d", i, ch[i].applied);
    if (cases[i].after < 0)
      CHECK(rc == 1, "case %zu: gone", i);
    else
      CHECK(rc == 0 && (int)got.state == cases[i].after, "case %zu: state %d", i, (int)got.state);
    if (cases[i].applied && cases[i].after == BR_STATE_DELETING)
      CHECK(got.state_ms == 5000, "case %zu: marked at 5000", i);
  }
  /* listed with the quarantined ones */
  struct page pg = {0};
  uint8_t next[BR_SHA256_LEN];
  int has_next = 0;
  CHECK(br_index_list_after(idx, NULL, 64, BR_STATE_QUARANTINED, collect, &pg, next, &has_next,
                            &err) == 0,
        "list quarantined");
  int deleting = 0;
  for (int i = 0; i < pg.n; i++) deleting += pg.states[i] == BR_STATE_DELETING;
  CHECK(deleting == 7, "deleting records are listed as quarantined (%d)", deleting);
  /* an upload of a deleting blob starts it afresh */
  br_record up = sample(1);
  own_keys(&up, ch[0].digest);
  up.last_upload_ms = 6000;
  up.state_ms = 6000;
  int created = 0;
  br_record got;
  CHECK(br_index_record_upload(idx, ch[0].digest, &up, &created, &got, &err) == 0 && created == 1 &&
            got.state == BR_STATE_LIVE && got.state_ms == 6000,
        "an upload replaces a deleting record (created %d state %d)", created, (int)got.state);
  br_change late = {.kind = BR_CHANGE_REMOVE, .cutoff_ms = UINT64_MAX, .expect_state_ms = 5000};
  memcpy(late.digest, ch[0].digest, BR_SHA256_LEN);
  CHECK(br_index_apply_changes(idx, &late, 1, 7000, &err) == 0 && !late.applied &&
            br_index_get(idx, ch[0].digest, &got, &err) == 0,
        "the delete's last step no longer applies");
  br_index_close(idx);
  remove_dir();
}

static br_index *open_purging(int queue_purges) {
  br_index_options opt = {.map_size = 64 << 20, .batch_max = 8, .queue_purges = queue_purges};
  br_err err;
  br_index *idx = br_index_open(dir, &opt, &err);
  CHECK(idx != NULL, "open %s: %s", dir, err.msg);
  return idx;
}

/* The pending purges due at now_ms, as a bit per digest_of(3000 + i). */
static unsigned purges_due_mask(br_index *idx, uint64_t now_ms, br_purge *out, int *n) {
  uint8_t next[BR_SHA256_LEN];
  int wrapped = 0;
  br_err err;
  *n = br_index_purges_due(idx, NULL, now_ms, out, 64, next, &wrapped, &err);
  CHECK(*n >= 0 && wrapped, "purges_due: %d (%s)", *n, err.msg);
  unsigned mask = 0;
  for (int i = 0; i < *n; i++) {
    uint8_t d[BR_SHA256_LEN];
    for (unsigned j = 0; j < 16; j++) {
      digest_of(3000 + j, d);
      if (!memcmp(d, out[i].digest, BR_SHA256_LEN)) mask |= 1u << j;
    }
  }
  return mask;
}

/* Each change that makes a CDN copy stale writes its purge in its own transaction; changes that
 * do not apply write none; settling removes or reschedules only the queuing it read. */
static void test_purges(void) {
  fresh_dir("index-purges");
  br_index *idx = open_purging(1);
  br_err err;
  enum { N = 8 };
  uint8_t d[N][BR_SHA256_LEN];
  for (unsigned i = 0; i < N; i++) {
    br_record r = sample(1);
    r.last_upload_ms = 10;
    digest_of(3000 + i, d[i]);
    own_keys(&r, d[i]);
    if (i == 5) r.state = BR_STATE_QUARANTINED, r.state_ms = 50;
    CHECK(br_index_record_upload(idx, d[i], &r, NULL, NULL, &err) == 0, "setup %u", i);
  }
  br_purge due[64];
  int n;
  CHECK(purges_due_mask(idx, UINT64_MAX, due, &n) == 0 && n == 0, "uploads queue no purge (%d)", n);
  br_change ch[] = {change_of(d[0], BR_CHANGE_QUARANTINE), change_of(d[1], BR_CHANGE_HOLD),
                    change_of(d[2], BR_CHANGE_RESTORE), change_of(d[3], BR_CHANGE_QUARANTINE),
                    change_of(d[5], BR_CHANGE_REMOVE)};
  ch[3].cutoff_ms = 5; /* uploaded after the cutoff: not quarantined */
  ch[4].expect_state_ms = 50;
  CHECK(br_index_apply_changes(idx, ch, 5, 1000, &err) == 0, "apply: %s", err.msg);
  CHECK(ch[0].applied && ch[1].applied && !ch[2].applied && !ch[3].applied && ch[4].applied,
        "applied as expected");
  br_record got;
  CHECK(state_of(idx, d[5], &got) == -1, "removed");
  br_loc_change sw = {.kind = BR_LOC_SWITCH};
  memcpy(sw.digest, d[6], BR_SHA256_LEN);
  CHECK(state_of(idx, d[6], &got) == BR_STATE_LIVE, "d6 live");
  sw.expect = got.locations[0];
  sw.to = loc_at("other", "moved/6", 0);
  br_loc_change same = {.kind = BR_LOC_SWITCH};
  memcpy(same.digest, d[7], BR_SHA256_LEN);
  CHECK(state_of(idx, d[7], &got) == BR_STATE_LIVE, "d7 live");
  same.expect = got.locations[0];
  same.to = got.locations[0]; /* a re-verification in place: nothing stale */
  CHECK(br_index_apply_locations(idx, &sw, 1, 2000, &err) == 0 && sw.outcome == BR_LOC_APPLIED,
        "switch: %s", err.msg);
  CHECK(br_index_apply_locations(idx, &same, 1, 2000, &err) == 0 && same.outcome == BR_LOC_APPLIED,
        "refresh");
  unsigned want = 1u << 0 | 1u << 1 | 1u << 5 | 1u << 6;
  unsigned mask = purges_due_mask(idx, 3000, due, &n);
  CHECK(mask == want && n == 4, "purges of quarantine, hold, remove, switch (mask %#x, %d)", mask,
        n);
  br_index_stats st;
  br_index_get_stats(idx, &st);
  CHECK(st.purges_pending == 4, "4 pending (%llu)", (unsigned long long)st.purges_pending);
  /* durable: a reopen finds them */
  br_index_close(idx);
  idx = open_purging(1);
  mask = purges_due_mask(idx, 3000, due, &n);
  CHECK(mask == want, "pending after a reopen (mask %#x)", mask);
  /* settle: one acknowledged, one retried later; one queued again after it was read */
  br_purge settle[3];
  for (int i = 0; i < n; i++) {
    if (!memcmp(due[i].digest, d[0], BR_SHA256_LEN)) settle[0] = due[i], settle[0].done = 1;
    if (!memcmp(due[i].digest, d[1], BR_SHA256_LEN)) settle[1] = due[i];
    if (!memcmp(due[i].digest, d[5], BR_SHA256_LEN)) settle[2] = due[i], settle[2].done = 1;
  }
  settle[1].attempts = 1;
  settle[1].acked = 1;
  settle[1].next_ms = 90000;
  CHECK(br_index_queue_purges(idx, (const uint8_t(*)[BR_SHA256_LEN])d[5], 1, &err) == 0,
        "queue again: %s", err.msg);
  CHECK(br_index_settle_purges(idx, settle, 3, &err) == 0, "settle: %s", err.msg);
  mask = purges_due_mask(idx, 3000, due, &n);
  CHECK(mask == (1u << 5 | 1u << 6), "done gone, retried later, queued-again kept (%#x)", mask);
  mask = purges_due_mask(idx, 90000, due, &n);
  CHECK(mask == (1u << 1 | 1u << 5 | 1u << 6), "the retry is due at its time (%#x)", mask);
  for (int i = 0; i < n; i++)
    if (!memcmp(due[i].digest, d[1], BR_SHA256_LEN))
      CHECK(due[i].attempts == 1 && due[i].acked == 1, "attempts %u acked %u", due[i].attempts,
            due[i].acked);
  br_index_close(idx);
  /* without queue_purges a change writes none */
  idx = open_purging(0);
  br_change hold = change_of(d[4], BR_CHANGE_HOLD);
  CHECK(br_index_apply_changes(idx, &hold, 1, 1000, &err) == 0 && hold.applied, "hold");
  mask = purges_due_mask(idx, UINT64_MAX, due, &n);
  CHECK(!(mask & 1u << 4), "no purge queued without queue_purges (%#x)", mask);
  br_index_close(idx);
  remove_dir();
}

/* The live count of all stores, or -1 when absent. */
static int64_t live_count(const br_counts *c) {
  const br_count *e = br_counts_find(c, "", BR_STATE_LIVE);
  return e ? e->blobs : -1;
}

/* Counters: kept through uploads and state changes; dropped (an index from before them) they are
 * recounted at the next open; wrong, a recount says so and repairs them. */
static void test_counts_kept_and_repaired(void) {
  snprintf(dir, sizeof dir, "/tmp/blobref-unit-counts-%d", (int)getpid());
  br_index *idx = open_index(64ull << 20, 16);
  br_err err;
  uint8_t d[BR_SHA256_LEN];
  for (unsigned i = 0; i < 20; i++) {
    digest_of(1000 + i, d);
    br_record r = sample(1);
    r.size = 10;
    own_keys(&r, d);
    int created = 0;
    CHECK(br_index_record_upload(idx, d, &r, &created, NULL, &err) == 0, "upload: %s", err.msg);
  }
  br_change ch = {.kind = BR_CHANGE_HOLD, .reason = "test"};
  digest_of(1000, ch.digest);
  CHECK(br_index_apply_changes(idx, &ch, 1, 1, &err) == 0 && ch.applied, "hold");
  static br_counts c, found, stored;
  CHECK(br_index_counts(idx, &c, &err) == 0, "counts kept");
  CHECK(live_count(&c) == 19, "live %lld, want 19", (long long)live_count(&c));
  const br_count *held = br_counts_find(&c, "", BR_STATE_HELD);
  CHECK(held && held->blobs == 1 && held->bytes == 10, "held");
  CHECK(br_index_recount(idx, 0, &found, &stored, &err) == 0, "recount differs");
  br_index_close(idx);
  /* an index from before the counters: no counts database */
  MDB_env *env = NULL;
  MDB_txn *txn = NULL;
  MDB_dbi dbi;
  mdb_env_create(&env);
  mdb_env_set_maxdbs(env, 8);
  CHECK(mdb_env_open(env, dir, 0, 0644) == 0, "mdb open");
  mdb_txn_begin(env, NULL, 0, &txn);
  CHECK(mdb_dbi_open(txn, "counts", 0, &dbi) == 0, "counts database");
  CHECK(mdb_drop(txn, dbi, 1) == 0, "drop");
  mdb_txn_commit(txn);
  mdb_env_close(env);
  idx = open_index(64ull << 20, 16);
  CHECK(br_index_counts(idx, &c, &err) == 0 && live_count(&c) == 19, "recounted at open: %lld",
        (long long)live_count(&c));
  br_index_close(idx);
  /* a wrong figure (one more live blob): found by a recount, repaired by one */
  mdb_env_create(&env);
  mdb_env_set_maxdbs(env, 8);
  mdb_env_open(env, dir, 0, 0644);
  mdb_txn_begin(env, NULL, 0, &txn);
  mdb_dbi_open(txn, "counts", 0, &dbi);
  uint8_t key[2] = {0, BR_STATE_LIVE}, val[16] = {20};
  MDB_val k = {2, key}, v = {16, val};
  CHECK(mdb_put(txn, dbi, &k, &v, 0) == 0, "tamper");
  mdb_txn_commit(txn);
  mdb_env_close(env);
  idx = open_index(64ull << 20, 16);
  CHECK(br_index_recount(idx, 0, &found, &stored, &err) == 1, "mismatch not found");
  CHECK(live_count(&stored) == 20 && live_count(&found) == 19, "stored %lld found %lld",
        (long long)live_count(&stored), (long long)live_count(&found));
  CHECK(br_index_recount(idx, 1, &found, &stored, &err) == 1, "repair");
  CHECK(br_index_recount(idx, 0, &found, &stored, &err) == 0, "still differs after repair");
  CHECK(br_index_counts(idx, &c, &err) == 0 && live_count(&c) == 19, "repaired: %lld",
        (long long)live_count(&c));
  br_index_close(idx);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0, "rm");
}

/* The change mark: which commits between two marks were reconcile's alone. A table for the rule,
 * then a real LMDB index: reconcile's changes and purge bookkeeping keep "only reconcile", any
 * other write ends it. */
static void test_change_mark(void) {
  static const struct {
    br_index_mark a, b;
    int only;
  } rule[] = {
      {{10, 5, 2}, {12, 7, 2}, 1}, /* two commits, both reconcile's */
      {{10, 5, 5}, {10, 5, 5}, 1}, /* nothing committed */
      {{10, 5, 2}, {12, 7, 6}, 0}, /* one of them held another write */
      {{10, 5, 2}, {12, 7, 5}, 1}, /* the last other write was before a */
      {{10, 5, 2}, {13, 7, 2}, 0}, /* a commit not this writer's (another process) */
      {{10, 5, 2}, {11, 7, 2}, 0}, /* a commit that wrote nothing: not provable */
      {{10, 5, 2}, {9, 5, 2}, 0},  /* the number went back */
      {{10, 5, 2}, {10, 4, 2}, 0}, /* the count went back (another open) */
  };
  for (size_t i = 0; i < sizeof rule / sizeof rule[0]; i++)
    CHECK(br_index_only_reconcile_since(&rule[i].a, &rule[i].b) == rule[i].only, "rule %zu", i);

  fresh_dir("index-mark");
  br_index *idx = open_purging(1);
  br_err err;
  uint8_t d[3][BR_SHA256_LEN];
  for (unsigned i = 0; i < 3; i++) {
    br_record r = sample(1);
    r.last_upload_ms = 10;
    digest_of(5000 + i, d[i]);
    own_keys(&r, d[i]);
    CHECK(br_index_record_upload(idx, d[i], &r, NULL, NULL, &err) == 0, "setup %u", i);
  }
  br_index_mark a, b;
  CHECK(br_index_change_mark(idx, &a, &err) == 0, "mark: %s", err.msg);
  br_change ch = change_of(d[0], BR_CHANGE_QUARANTINE);
  ch.by_reconcile = 1;
  CHECK(br_index_apply_changes(idx, &ch, 1, 1000, &err) == 0 && ch.applied, "quarantine");
  CHECK(br_index_queue_purges(idx, (const uint8_t(*)[BR_SHA256_LEN])d[1], 1, &err) == 0,
        "queue purge: %s", err.msg);
  CHECK(br_index_change_mark(idx, &b, &err) == 0 && b.seq > a.seq, "mark after: %s", err.msg);
  CHECK(br_index_only_reconcile_since(&a, &b), "reconcile's change and a purge: only reconcile");
  br_change other = change_of(d[1], BR_CHANGE_HOLD); /* an admin's, not flagged */
  CHECK(br_index_apply_changes(idx, &other, 1, 1001, &err) == 0 && other.applied, "hold");
  CHECK(br_index_change_mark(idx, &b, &err) == 0, "mark");
  CHECK(!br_index_only_reconcile_since(&a, &b), "an admin hold is another write");
  CHECK(br_index_change_mark(idx, &a, &err) == 0, "mark");
  CHECK(br_index_touch(idx, d[2], 2000, &err) == 0, "touch: %s", err.msg);
  CHECK(br_index_change_mark(idx, &b, &err) == 0, "mark");
  CHECK(!br_index_only_reconcile_since(&a, &b), "a dedup touch is another write");
  br_index_close(idx);
  remove_dir();
}

int main(void) {
  test_encoding();
  test_encoding_identity();
  test_lmdb();
  test_changes();
  test_list();
  test_locations();
  test_cache_sequential();
  test_cache_race();
  test_full_big_put();
  test_stale_reader();
  test_key_owner();
  test_keys_upgrade();
  test_deleting();
  test_purges();
  test_counts_kept_and_repaired();
  test_change_mark();
  return unit_summary("index");
}
