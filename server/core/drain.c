/* The drain thread: deletes the old copies of moved blobs (locations `draining` since longer
 * than drain_grace), under each blob's lock, then drops their locations in batches; each pass
 * under the index's drain lease (on PostgreSQL, one node's pass at a time cluster-wide). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/drain.h"
#include "core/server.h"

struct drain_item {
  uint8_t digest[BR_SHA256_LEN];
  br_location loc;
};

struct drainer {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  int stopping, started;
};

struct drain_scan {
  uint64_t cutoff;
  struct drain_item *items;
  size_t n, cap;
};

enum { DRAIN_BATCH = 1000 };

static int drain_cb(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  struct drain_scan *s = ud;
  for (int i = 0; i < rec->nlocations; i++) {
    const br_location *l = &rec->locations[i];
    if (l->role != BR_ROLE_DRAINING || l->verified_at_ms >= s->cutoff) continue;
    if (s->n == s->cap) return 1; /* the rest on the next pass */
    memcpy(s->items[s->n].digest, digest, BR_SHA256_LEN);
    s->items[s->n++].loc = *l;
  }
  return 0;
}

/* Deletes one draining copy's bytes: under the blob's lock, re-read (still draining since the
 * same time?), then delete (on LMDB after the lock is released: see below). Returns 1 when its
 * location is to be dropped from the record. The drop itself is batched afterwards (drain_batch):
 * it is conditional on the location still draining since that time, so a move back onto the same
 * key meanwhile (which needs the bytes there again, checked under the lock) wins, and a crash
 * before it leaves the location for the next pass. */
static int drain_one(br_server *srv, const struct drain_item *it) {
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(it->digest, hex);
  br_err err;
  br_record rec;
  int drop = 0;
  if (br_server_lock_blob(srv, it->digest, 1) < 0) return 0; /* the next pass tries again */
  int locked = 1;
  int rc = br_index_get_latest(srv->index, it->digest, &rec, &err); /* bytes are deleted on it */
  int still = 0, shared = 0;
  for (int i = 0; rc == 0 && i < rec.nlocations; i++) {
    const br_location *l = &rec.locations[i];
    if (strcmp(l->store, it->loc.store) || strcmp(l->key, it->loc.key)) continue;
    if (l->role == BR_ROLE_DRAINING && l->verified_at_ms == it->loc.verified_at_ms)
      still = 1;
    else
      shared = 1;
  }
  br_store *st = br_server_store(srv, it->loc.store);
  if (rc != 0 || !still) goto out;
  uint8_t owner[BR_SHA256_LEN]; /* invariant 10: never the bytes of a key another record owns */
  int orc = br_index_key_owner(srv->index, it->loc.store, it->loc.key, owner, &err);
  if (orc < 0) goto out;
  if (orc == 2 || (orc == 0 && memcmp(owner, it->digest, BR_SHA256_LEN))) shared = 1;
  if (!shared) {
    if (!st) {
      br_warn("blob %s: draining copy in store %s, which is not configured: kept", hex,
              it->loc.store);
      goto out;
    }
    if (strcmp(br_store_kind(st), "http") == 0) {
      br_info("blob %s: draining copy %s:%s is in a read-only store: only forgotten", hex,
              it->loc.store, it->loc.key);
    } else {
      /* on LMDB the delete runs outside the stripe, registered: an upload of the blob from now
       * on writes under a fresh key, a move refuses to make this key its primary; an upload
       * already committing (perhaps to this key) makes the drain leave it for the next pass */
      int off = br_server_off_stripe(srv);
      if (off && br_server_delete_begin(srv, it->digest) != 0) goto out;
      if (off) {
        br_server_lock_blob(srv, it->digest, 0);
        locked = 0;
      }
      int rc2 = br_store_delete(st, it->loc.key, &err);
      if (off) br_server_delete_end(srv, it->digest);
      if (rc2 < 0) {
        br_warn("blob %s: deleting draining copy %s:%s: %s (retried later)", hex, it->loc.store,
                it->loc.key, err.msg);
        goto out;
      }
    }
  }
  drop = 1;
out:
  if (locked) br_server_lock_blob(srv, it->digest, 0);
  return drop;
}

/* Drops the locations of items[0..n) whose bytes are gone, in one batch of index changes. */
static void drain_drop(br_server *srv, const struct drain_item *items, size_t n, uint64_t cutoff) {
  if (!n) return;
  br_loc_change *ch = calloc(n, sizeof *ch);
  if (!ch) return; /* the next pass */
  for (size_t i = 0; i < n; i++) {
    ch[i].kind = BR_LOC_DROP;
    ch[i].expect = items[i].loc;
    ch[i].cutoff_ms = cutoff;
    memcpy(ch[i].digest, items[i].digest, BR_SHA256_LEN);
  }
  br_err err;
  if (br_index_apply_locations(srv->index, ch, n, br_now_ms(), &err) < 0) {
    br_warn("drain: dropping %zu draining location(s): %s", n, err.msg);
  } else {
    for (size_t i = 0; i < n; i++) {
      if (ch[i].outcome != BR_LOC_APPLIED) continue;
      char hex[BR_HEX_LEN + 1];
      br_hex_encode(items[i].digest, hex);
      br_info("blob %s: draining copy %s:%s deleted", hex, items[i].loc.store, items[i].loc.key);
    }
  }
  free(ch);
}

static uint64_t drain_interval(const br_config *cfg) {
  uint64_t iv = cfg->drain_grace_ms / 4;
  if (iv < 250) iv = 250;
  if (iv > 60000) iv = 60000;
  return iv;
}

static void *drain_main(void *arg) {
  br_server *srv = arg;
  struct drainer *mv = srv->drain;
  struct drain_scan s = {.cap = DRAIN_BATCH};
  s.items = calloc(DRAIN_BATCH, sizeof *s.items);
  uint64_t iv = drain_interval(srv->cfg);
  pthread_mutex_lock(&mv->lock);
  while (!mv->stopping && s.items) {
    pthread_mutex_unlock(&mv->lock);
    uint64_t now = br_now_ms();
    s.cutoff = now > srv->cfg->drain_grace_ms ? now - srv->cfg->drain_grace_ms : 0;
    s.n = 0;
    br_err err;
    /* once cluster-wide: a pass runs under the drain lease (another node's pass: skipped) */
    int lease = br_index_lease(srv->index, BR_INDEX_LEASE_DRAIN, 1, &err);
    if (lease < 0) br_warn("drain: %s (the next pass)", err.msg);
    if (lease == 1 && br_index_foreach(srv->index, drain_cb, &s, &err) < 0)
      br_warn("drain: scanning the index: %s", err.msg);
    size_t ndrop = 0;
    for (size_t i = 0; i < s.n; i++) {
      pthread_mutex_lock(&mv->lock);
      int stop = mv->stopping;
      pthread_mutex_unlock(&mv->lock);
      if (stop) break;
      if (drain_one(srv, &s.items[i])) s.items[ndrop++] = s.items[i];
    }
    drain_drop(srv, s.items, ndrop, s.cutoff + 1);
    if (lease == 1) br_index_lease(srv->index, BR_INDEX_LEASE_DRAIN, 0, &err);
    pthread_mutex_lock(&mv->lock);
    if (s.n == s.cap) continue; /* more to do at once */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(iv / 1000);
    ts.tv_nsec += (long)(iv % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    if (!mv->stopping) pthread_cond_timedwait(&mv->cv, &mv->lock, &ts);
  }
  pthread_mutex_unlock(&mv->lock);
  free(s.items);
  return NULL;
}

int drain_start(br_server *srv, br_err *err) {
  struct drainer *mv = calloc(1, sizeof *mv);
  if (!mv) return br_fail(err, "out of memory");
  pthread_mutex_init(&mv->lock, NULL);
  pthread_cond_init(&mv->cv, NULL);
  srv->drain = mv;
  if (pthread_create(&mv->thread, NULL, drain_main, srv))
    return br_fail(err, "cannot start the drain thread");
  mv->started = 1;
  return 0;
}

void drain_stop(br_server *srv) {
  struct drainer *mv = srv->drain;
  if (!mv) return;
  pthread_mutex_lock(&mv->lock);
  mv->stopping = 1;
  pthread_cond_broadcast(&mv->cv);
  pthread_mutex_unlock(&mv->lock);
  if (mv->started) pthread_join(mv->thread, NULL);
  pthread_mutex_destroy(&mv->lock);
  pthread_cond_destroy(&mv->cv);
  free(mv);
  srv->drain = NULL;
}
