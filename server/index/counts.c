/* Exact per-state counters: the arithmetic of a record's change (no I/O), used by the writer. */
#include <string.h>

#include "blobref/index.h"

void br_counts_clear(br_counts *c) {
  c->n = 0;
  c->overflow = 0;
}

static br_count *slot(br_counts *c, const char *store, int state, int create) {
  for (size_t i = 0; i < c->n; i++)
    if (c->c[i].state == state && !strcmp(c->c[i].store, store)) return &c->c[i];
  if (!create) return NULL;
  if (c->n == BR_COUNTS_MAX) {
    c->overflow = 1;
    return NULL;
  }
  br_count *e = &c->c[c->n++];
  memset(e, 0, sizeof *e);
  size_t len = strlen(store);
  if (len > BR_MAX_STORE_NAME) len = BR_MAX_STORE_NAME;
  memcpy(e->store, store, len);
  e->state = state;
  return e;
}

int br_counts_add(br_counts *c, const char *store, int state, int64_t blobs, int64_t bytes) {
  br_count *e = slot(c, store, state, 1);
  if (!e) return -1;
  e->blobs += blobs;
  e->bytes += bytes;
  return 0;
}

const br_count *br_counts_find(const br_counts *c, const char *store, int state) {
  return slot((br_counts *)c, store, state, 0);
}

/* Counts rec (sign +1 or -1): in all stores, and once in each store it has a location in. */
static void count_record(br_counts *c, const br_record *rec, int sign) {
  int64_t bytes = (int64_t)rec->size * sign;
  br_counts_add(c, "", (int)rec->state, sign, bytes);
  for (int l = 0; l < rec->nlocations; l++) {
    int seen = 0; /* two locations in one store count once */
    for (int k = 0; k < l; k++) seen |= !strcmp(rec->locations[k].store, rec->locations[l].store);
    if (!seen) br_counts_add(c, rec->locations[l].store, (int)rec->state, sign, bytes);
  }
}

void br_counts_change(br_counts *c, const br_record *old, const br_record *next) {
  if (old) count_record(c, old, -1);
  if (next) count_record(c, next, +1);
}

void br_counts_merge(br_counts *c, const br_counts *d) {
  for (size_t i = 0; i < d->n; i++)
    br_counts_add(c, d->c[i].store, d->c[i].state, d->c[i].blobs, d->c[i].bytes);
  if (d->overflow) c->overflow = 1;
}

/* Entries of a that b lacks or holds with other figures (a zero entry matches a missing one). */
static size_t one_way(const br_counts *a, const br_counts *b, int skip_common) {
  size_t n = 0;
  for (size_t i = 0; i < a->n; i++) {
    const br_count *x = &a->c[i], *y = br_counts_find(b, x->store, x->state);
    if (y && skip_common) continue;
    int64_t blobs = y ? y->blobs : 0, bytes = y ? y->bytes : 0;
    if (x->blobs != blobs || x->bytes != bytes) n++;
  }
  return n;
}

size_t br_counts_diff(const br_counts *a, const br_counts *b) {
  return one_way(a, b, 0) + one_way(b, a, 1);
}
