/* The index's per-state counters (server/index/counts.c): a table of record transitions, each
 * applied to known counts, and the counts expected after it. */
#include <string.h>

#include "blobref/index.h"
#include "unit.h"

/* A record of size bytes in state, with locations in the stores named by `stores` ("a,b,a"). */
static br_record rec_of(enum br_state state, uint64_t size, const char *stores) {
  br_record r = {.size = size, .state = state};
  char buf[256];
  snprintf(buf, sizeof buf, "%s", stores);
  for (char *save = NULL, *s = strtok_r(buf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
    snprintf(r.locations[r.nlocations].store, sizeof r.locations[0].store, "%s", s);
    snprintf(r.locations[r.nlocations].key, sizeof r.locations[0].key, "k%d", r.nlocations);
    r.nlocations++;
  }
  return r;
}

struct want {
  const char *store;
  int state;
  int64_t blobs, bytes;
};

struct transition {
  const char *name;
  int has_old, has_next;
  enum br_state old_state, next_state;
  uint64_t old_size, next_size;
  const char *old_stores, *next_stores;
  struct want want[6]; /* after the change, starting from 10 live blobs of 1000 bytes in "a" */
};

static const struct transition cases[] = {
    {"new upload", 0, 1, 0, BR_STATE_LIVE, 0, 7, "", "a", {{"", 0, 11, 1007}, {"a", 0, 11, 1007}}},
    {"deleted", 1, 0, BR_STATE_LIVE, 0, 100, 0, "a", "", {{"", 0, 9, 900}, {"a", 0, 9, 900}}},
    {"quarantined",
     1,
     1,
     BR_STATE_LIVE,
     BR_STATE_QUARANTINED,
     100,
     100,
     "a",
     "a",
     {{"", 0, 9, 900}, {"a", 0, 9, 900}, {"", 1, 1, 100}, {"a", 1, 1, 100}}},
    {"held",
     1,
     1,
     BR_STATE_LIVE,
     BR_STATE_HELD,
     100,
     100,
     "a",
     "a",
     {{"", 0, 9, 900}, {"", 2, 1, 100}, {"a", 2, 1, 100}}},
    {"deleting",
     1,
     1,
     BR_STATE_LIVE,
     BR_STATE_DELETING,
     100,
     100,
     "a",
     "a",
     {{"", 3, 1, 100}, {"a", 3, 1, 100}, {"", 1, 0, 0}}},
    {"touch (no change)",
     1,
     1,
     BR_STATE_LIVE,
     BR_STATE_LIVE,
     100,
     100,
     "a",
     "a",
     {{"", 0, 10, 1000}, {"a", 0, 10, 1000}}},
    {"moved a -> b (a draining)",
     1,
     1,
     BR_STATE_LIVE,
     BR_STATE_LIVE,
     100,
     100,
     "a",
     "b,a",
     {{"", 0, 10, 1000}, {"a", 0, 10, 1000}, {"b", 0, 1, 100}}},
    {"drained (a dropped)",
     1,
     1,
     BR_STATE_LIVE,
     BR_STATE_LIVE,
     100,
     100,
     "b,a",
     "b",
     {{"", 0, 10, 1000}, {"a", 0, 9, 900}, {"b", 0, 0, 0}}},
    {"two places in one store count once",
     0,
     1,
     0,
     BR_STATE_LIVE,
     0,
     5,
     "",
     "a,a,c",
     {{"", 0, 11, 1005}, {"a", 0, 11, 1005}, {"c", 0, 1, 5}}},
    {"deleting blob uploaded again",
     1,
     1,
     BR_STATE_DELETING,
     BR_STATE_LIVE,
     100,
     100,
     "a",
     "a",
     {{"", 0, 11, 1100}, {"a", 0, 11, 1100}, {"", 3, -1, -100}}},
};

int main(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const struct transition *t = &cases[i];
    br_counts c;
    br_counts_clear(&c);
    br_counts_add(&c, "", BR_STATE_LIVE, 10, 1000);
    br_counts_add(&c, "a", BR_STATE_LIVE, 10, 1000);
    br_record old = rec_of(t->old_state, t->old_size, t->old_stores);
    br_record next = rec_of(t->next_state, t->next_size, t->next_stores);
    br_counts_change(&c, t->has_old ? &old : NULL, t->has_next ? &next : NULL);
    CHECK(!c.overflow, "%s: overflow", t->name);
    for (size_t w = 0; w < 6 && t->want[w].store; w++) {
      const struct want *x = &t->want[w];
      const br_count *e = br_counts_find(&c, x->store, x->state);
      int64_t blobs = e ? e->blobs : 0, bytes = e ? e->bytes : 0;
      CHECK(blobs == x->blobs && bytes == x->bytes,
            "%s: store '%s' state %d: %lld/%lld, want %lld/%lld", t->name, x->store, x->state,
            (long long)blobs, (long long)bytes, (long long)x->blobs, (long long)x->bytes);
    }
  }
  /* a recount equals the counters kept by the transitions; a missing entry equals a zero one */
  br_counts kept, recount;
  br_counts_clear(&kept);
  br_counts_clear(&recount);
  br_record a = rec_of(BR_STATE_LIVE, 10, "a"), q = rec_of(BR_STATE_QUARANTINED, 10, "a");
  br_counts_change(&kept, NULL, &a);
  br_counts_change(&kept, &a, &q);
  br_counts_change(&recount, NULL, &q);
  CHECK(br_counts_diff(&kept, &recount) == 0, "kept vs recount: %zu differ",
        br_counts_diff(&kept, &recount));
  br_counts_add(&recount, "a", BR_STATE_HELD, 1, 1);
  CHECK(br_counts_diff(&kept, &recount) == 1, "one more entry: %zu differ",
        br_counts_diff(&kept, &recount));
  CHECK(br_counts_diff(&recount, &kept) == 1, "symmetric: %zu differ",
        br_counts_diff(&recount, &kept));
  /* the table is bounded: one entry too many is refused and marks it inexact */
  br_counts full;
  br_counts_clear(&full);
  char name[16];
  for (int i = 0; i < BR_COUNTS_MAX; i++) {
    snprintf(name, sizeof name, "s%d", i);
    CHECK(br_counts_add(&full, name, 0, 1, 1) == 0, "entry %d refused", i);
  }
  CHECK(br_counts_add(&full, "one-more", 0, 1, 1) == -1 && full.overflow, "overflow not seen");
  /* merge adds entry by entry */
  br_counts_merge(&kept, &recount);
  const br_count *e = br_counts_find(&kept, "", BR_STATE_QUARANTINED);
  CHECK(e && e->blobs == 2 && e->bytes == 20, "merge: %lld", e ? (long long)e->blobs : -1);
  return unit_summary("counts");
}
