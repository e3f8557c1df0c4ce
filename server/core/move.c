/* A verified move of one blob (PRODUCT.md invariant 7): the new copy is re-read and hashed, then
 * the primary switches in the index writer's transaction, conditional on the expected current
 * primary; the old location drains (core/drain.c deletes it after drain_grace). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/move.h"

static void move_fail(struct br_move *mv, enum br_move_result r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void move_fail(struct br_move *mv, enum br_move_result r, const char *fmt, ...) {
  mv->result = r;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(mv->message, sizeof mv->message, fmt, ap);
  va_end(ap);
}

void br_server_move_blob(br_server *srv, const uint8_t digest[BR_SHA256_LEN], struct br_move *mv) {
  br_err err;
  br_record rec;
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(digest, hex);
  mv->result = BR_MOVE_OK;
  mv->message[0] = '\0';
  br_store *dst = br_server_store(srv, mv->to.store);
  int locked = 0;
  if (!dst) {
    move_fail(mv, BR_MOVE_UNAVAILABLE, "no store named %s", mv->to.store);
    return;
  }
  int rc = br_index_get(srv->index, digest, &rec, &err);
  if (rc < 0) {
    mv->index_rc = -1;
    move_fail(mv, BR_MOVE_INDEX_ERROR, "%s", err.msg);
    goto out;
  }
  if (rc > 0) {
    move_fail(mv, BR_MOVE_NOT_FOUND, "no such blob");
    goto out;
  }
  const br_location *p = br_record_primary(&rec);
  if (!p || p->role != BR_ROLE_PRIMARY || strcmp(p->store, mv->expect.store) ||
      strcmp(p->key, mv->expect.key)) {
    move_fail(mv, BR_MOVE_CHANGED, "the primary location is %s:%s, not %s:%s",
              p ? p->store : "(none)", p ? p->key : "", mv->expect.store, mv->expect.key);
    mv->after = rec;
    goto out;
  }
  uint64_t t0 = br_now_ms();
  uint64_t size = 0;
  /* `to` is always read back and hashed: a size check alone let a store that flipped bits on
   * the way become the primary */
  uint8_t got[BR_SHA256_LEN];
  /* the file's identity before its hash: one renamed into place later is another inode */
  rc = br_store_identity(dst, mv->to.key, &mv->to.dev, &mv->to.ino, &err);
  if (rc == 0) rc = br_store_hash(dst, mv->to.key, got, &size, &err);
  if (rc == 0 && size != rec.size) {
    move_fail(mv, BR_MOVE_VERIFY_FAILED, "%s:%s has %" PRIu64 " bytes, the blob %" PRIu64,
              mv->to.store, mv->to.key, size, rec.size);
    goto out;
  }
  if (rc == 0 && memcmp(got, digest, BR_SHA256_LEN)) {
    char ghex[BR_HEX_LEN + 1];
    br_hex_encode(got, ghex);
    move_fail(mv, BR_MOVE_VERIFY_FAILED, "%s:%s has %" PRIu64 " bytes with SHA-256 %s, not %s",
              mv->to.store, mv->to.key, size, ghex, hex);
    goto out;
  }
  if (rc > 0) {
    move_fail(mv, BR_MOVE_VERIFY_FAILED, "%s:%s: no such object", mv->to.store, mv->to.key);
    goto out;
  }
  if (rc < 0) {
    move_fail(mv, BR_MOVE_UNAVAILABLE, "%s: %s", mv->to.store, err.msg);
    goto out;
  }
  /* The drain thread decides its deletes of draining copies under the blob's lock (and on LMDB
   * deletes after releasing it, registered: br_server_delete_busy): `to` may be one (a move
   * back). Checked again under the lock, it cannot go away before it is the primary. */
  if (br_server_lock_blob(srv, digest, 1) < 0) {
    mv->index_rc = BR_INDEX_UNAVAILABLE;
    move_fail(mv, BR_MOVE_INDEX_ERROR,
              "the blob's lock cannot be had: the index database is "
              "unavailable");
    goto out;
  }
  locked = 1;
  if (br_server_off_stripe(srv) && br_server_delete_busy(srv, digest)) {
    /* the drain or reconcile is deleting bytes of the blob outside the stripe: perhaps `to` */
    move_fail(mv, BR_MOVE_CHANGED, "a copy of the blob is being deleted: retry");
    goto out;
  }
  uint64_t size2 = 0;
  rc = br_store_stat(dst, mv->to.key, &size2, &err);
  if (rc != 0 || size2 != size) {
    if (rc < 0)
      move_fail(mv, BR_MOVE_UNAVAILABLE, "%s: %s", mv->to.store, err.msg);
    else
      move_fail(mv, BR_MOVE_VERIFY_FAILED, "%s:%s changed or went away while verified",
                mv->to.store, mv->to.key);
    goto out;
  }
  uint64_t t1 = br_now_ms();
  mv->verify_ms = t1 - t0;
  br_loc_change ch = {.kind = BR_LOC_SWITCH, .expect = mv->expect, .to = mv->to};
  ch.to.verified_at_ms = t0; /* the hash began then: a later write shows in the file's ctime */
  memcpy(ch.digest, digest, BR_SHA256_LEN);
  rc = br_index_apply_locations(srv->index, &ch, 1, t1, &err);
  mv->switch_ms = br_now_ms() - t1;
  if (rc < 0) {
    mv->index_rc = rc;
    move_fail(mv, BR_MOVE_INDEX_ERROR, "%s", err.msg);
    goto out;
  }
  mv->after = ch.after;
  switch (ch.outcome) {
    case BR_LOC_APPLIED:
      break;
    case BR_LOC_ABSENT:
      move_fail(mv, BR_MOVE_NOT_FOUND, "no such blob");
      break;
    case BR_LOC_FULL:
      move_fail(mv, BR_MOVE_FULL, "the blob has %d locations already", BR_MAX_LOCATIONS - 1);
      break;
    case BR_LOC_KEY_TAKEN:
      move_fail(mv, BR_MOVE_KEY_TAKEN, "%s:%s is another blob's location", mv->to.store,
                mv->to.key);
      break;
    default:
      move_fail(mv, BR_MOVE_CHANGED, "the primary location changed meanwhile");
  }
out:
  if (locked) br_server_lock_blob(srv, digest, 0);
  if (mv->result == BR_MOVE_VERIFY_FAILED)
    br_warn("blob %s: move %s:%s -> %s:%s refused, verify_failed (digest mismatch): %s", hex,
            mv->expect.store, mv->expect.key, mv->to.store, mv->to.key, mv->message);
  if (mv->result == BR_MOVE_OK) {
    br_info("blob %s: moved %s:%s -> %s:%s (verified by sha256)", hex, mv->expect.store,
            mv->expect.key, mv->to.store, mv->to.key);
    if (strcmp(mv->expect.store, mv->to.store) || strcmp(mv->expect.key, mv->to.key))
      br_server_blob_gone(srv, digest); /* cached redirects and CDN copies point elsewhere */
  }
}
