/* The re-hash thread: changed in-place files over the inline limit verified again in the
 * background (rehash.h), one at a time, so that a read never waits for a whole-file hash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/move.h"
#include "core/suspect.h"
#include "http/rehash.h"

enum slot_state { SLOT_FREE, SLOT_QUEUED, SLOT_RUNNING, SLOT_WRONG };

struct rehash_slot {
  enum slot_state state;
  uint8_t digest[BR_SHA256_LEN];
  char store[BR_MAX_STORE_NAME + 1], key[BR_MAX_KEY + 1];
  uint64_t changed_ms; /* the file's mtime/ctime when queued (SLOT_WRONG: when found wrong) */
  uint64_t queued;     /* order of queueing: the oldest first */
};

struct rehasher {
  pthread_t thread;
  pthread_mutex_t lock; /* guards slots, seq and stopping; never held over a hash */
  pthread_cond_t cv;
  int stopping;
  uint64_t seq;
  struct rehash_slot slots[REHASH_SLOTS];
};

/* Verifies one location (a move onto itself: hashed, its identity taken, verified_at moved to
 * when the hash began) and tells how it went. Returns 1 when it is not the blob's. */
static int verify_one(br_http *http, const struct rehash_slot *s) {
  struct br_move mv;
  memset(&mv, 0, sizeof mv);
  snprintf(mv.expect.store, sizeof mv.expect.store, "%s", s->store);
  snprintf(mv.expect.key, sizeof mv.expect.key, "%s", s->key);
  mv.expect.role = BR_ROLE_PRIMARY;
  mv.to = mv.expect;
  br_server_move_blob(http->srv, s->digest, &mv);
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(s->digest, hex);
  if (mv.result == BR_MOVE_OK) {
    br_info(
        "blob %s: %s:%s changed after it was hashed; hashed again in the background: the "
        "blob's bytes, served again",
        hex, s->store, s->key);
    return 0;
  }
  if (mv.result != BR_MOVE_VERIFY_FAILED) {
    br_warn(
        "blob %s: %s:%s: the background re-hash did not finish (%s): the next read tries "
        "again",
        hex, s->store, s->key, mv.message);
    return 0;
  }
  br_error("blob %s: %s:%s changed after it was hashed and is not the blob's now: not served (%s)",
           hex, s->store, s->key, mv.message);
  atomic_fetch_add(&http->read_digest_mismatch, 1);
  br_err err;
  if (br_suspect_mark(http->srv->cfg->data_dir, s->digest, s->store, s->key, &err) < 0)
    br_warn("%s", err.msg);
  return 1;
}

static void *rehash_main(void *arg) {
  br_http *http = arg;
  struct rehasher *rh = http->rehasher;
  pthread_mutex_lock(&rh->lock);
  for (;;) {
    int next = -1;
    for (int i = 0; i < REHASH_SLOTS; i++)
      if (rh->slots[i].state == SLOT_QUEUED &&
          (next < 0 || rh->slots[i].queued < rh->slots[next].queued))
        next = i;
    if (rh->stopping) break;
    if (next < 0) {
      pthread_cond_wait(&rh->cv, &rh->lock);
      continue;
    }
    rh->slots[next].state = SLOT_RUNNING;
    struct rehash_slot s = rh->slots[next];
    pthread_mutex_unlock(&rh->lock);
    int wrong = verify_one(http, &s);
    pthread_mutex_lock(&rh->lock);
    rh->slots[next].state = wrong ? SLOT_WRONG : SLOT_FREE;
  }
  pthread_mutex_unlock(&rh->lock);
  return NULL;
}

int rehash_start(br_http *http, br_err *err) {
  struct rehasher *rh = calloc(1, sizeof *rh);
  if (!rh) return br_fail(err, "out of memory");
  pthread_mutex_init(&rh->lock, NULL);
  pthread_cond_init(&rh->cv, NULL);
  http->rehasher = rh;
  if (pthread_create(&rh->thread, NULL, rehash_main, http)) {
    http->rehasher = NULL;
    free(rh);
    return br_fail(err, "cannot start the re-hash thread");
  }
  return 0;
}

void rehash_stop(br_http *http) {
  struct rehasher *rh = http->rehasher;
  if (!rh) return;
  pthread_mutex_lock(&rh->lock);
  rh->stopping = 1;
  pthread_cond_broadcast(&rh->cv);
  pthread_mutex_unlock(&rh->lock);
  pthread_join(rh->thread, NULL);
  http->rehasher = NULL;
  free(rh);
}

void rehash_later(br_http *http, const uint8_t digest[BR_SHA256_LEN], br_store *store,
                  const char *key, uint64_t changed_ms) {
  struct rehasher *rh = http->rehasher;
  if (!rh) return;
  const char *name = br_store_name(store);
  int slot = -1, free_slot = -1, wrong_slot = -1;
  pthread_mutex_lock(&rh->lock);
  for (int i = 0; i < REHASH_SLOTS; i++) {
    struct rehash_slot *s = &rh->slots[i];
    if (s->state == SLOT_FREE) {
      if (free_slot < 0) free_slot = i;
      continue;
    }
    if (s->state == SLOT_WRONG && wrong_slot < 0) wrong_slot = i;
    if (memcmp(s->digest, digest, BR_SHA256_LEN) || strcmp(s->store, name) || strcmp(s->key, key))
      continue;
    if (s->state != SLOT_WRONG || s->changed_ms == changed_ms) { /* on its way, or still wrong */
      pthread_mutex_unlock(&rh->lock);
      return;
    }
    slot = i; /* found wrong before, changed since: once more */
  }
  if (slot < 0) slot = free_slot >= 0 ? free_slot : wrong_slot; /* a wrong one is forgotten */
  if (slot >= 0) {
    struct rehash_slot *s = &rh->slots[slot];
    s->state = SLOT_QUEUED;
    memcpy(s->digest, digest, BR_SHA256_LEN);
    snprintf(s->store, sizeof s->store, "%s", name);
    snprintf(s->key, sizeof s->key, "%s", key);
    s->changed_ms = changed_ms;
    s->queued = ++rh->seq;
    pthread_cond_signal(&rh->cv);
  }
  pthread_mutex_unlock(&rh->lock);
}
