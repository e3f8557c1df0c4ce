/* PUT /v1/blobs/{hash}/location: moving a blob between stores without a failed read (PRODUCT.md
 * invariant 7). The new copy is verified (its size and SHA-256, by re-reading it) on a finisher
 * thread and the primary switched in the index writer's transaction, conditional on the expected
 * current primary; the old location becomes `draining` (since the switch, kept in the record)
 * and the drain thread (core/drain.c) deletes it after drain_grace, durably across restarts. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/server.h"
#include "http/handlers.h"
#include "store/internal.h"

/* ---- PUT /v1/blobs/{hash}/location ------------------------------------------------------------
 */

struct move_job {
  br_location expect, to;
  int verify_sha; /* what the client asked for: 1 sha256, 0 size (both hash the copy now) */
  /* results */
  int ok;                  /* switched */
  enum br_api_error error; /* else why not */
  char message[sizeof(br_err) + 200];
  br_record after;
  uint64_t verify_ms, switch_ms;
};

static int parse_location(json_t *j, br_location *out, const char *what, char *msg, size_t msglen) {
  const char *store = json_string_value(json_object_get(j, "store"));
  const char *key = json_string_value(json_object_get(j, "key"));
  if (!json_is_object(j) || !store || !key) {
    snprintf(msg, msglen, "\"%s\" must be {\"store\": NAME, \"key\": KEY}", what);
    return -1;
  }
  if (strlen(store) > BR_MAX_STORE_NAME || strlen(key) > BR_MAX_KEY ||
      br_store_key_valid(key) < 0) {
    snprintf(msg, msglen, "\"%s\": invalid store name or key", what);
    return -1;
  }
  memset(out, 0, sizeof *out);
  snprintf(out->store, sizeof out->store, "%s", store);
  snprintf(out->key, sizeof out->key, "%s", key);
  return 0;
}

static void move_fail(struct move_job *mj, enum br_api_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void move_fail(struct move_job *mj, enum br_api_error e, const char *fmt, ...) {
  mj->error = e;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(mj->message, sizeof mj->message, fmt, ap);
  va_end(ap);
}

/* Verifies `to`, then switches under the blob's lock (the drain thread's delete of a draining
 * copy takes it too, so a copy being verified cannot be deleted before the switch). Runs on a
 * finisher thread. */
static void move_run(struct request *req) {
  struct move_job *mj = req->job_data;
  br_server *srv = req->srv;
  br_err err;
  br_record rec;
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(req->digest, hex);
  br_store *dst = br_server_store(srv, mj->to.store);
  int locked = 0;
  int rc = br_index_get(srv->index, req->digest, &rec, &err);
  if (rc < 0) {
    move_fail(mj, E_INTERNAL, "%s", err.msg);
    goto out;
  }
  if (rc > 0) {
    move_fail(mj, E_NOT_FOUND, "no such blob");
    goto out;
  }
  const br_location *p = br_record_primary(&rec);
  if (!p || p->role != BR_ROLE_PRIMARY || strcmp(p->store, mj->expect.store) ||
      strcmp(p->key, mj->expect.key)) {
    move_fail(mj, E_LOCATION_CHANGED, "the primary location is %s:%s, not %s:%s",
              p ? p->store : "(none)", p ? p->key : "", mj->expect.store, mj->expect.key);
    mj->after = rec;
    goto out;
  }
  uint64_t t0 = br_now_ms();
  uint64_t size = 0;
  /* `to` is always read back and hashed: a size check alone let a store that flipped bits on
   * the way become the primary (verify "size" adds nothing to it any more) */
  uint8_t got[BR_SHA256_LEN];
  rc = br_store_hash(dst, mj->to.key, got, &size, &err);
  if (rc == 0 && size != rec.size) {
    move_fail(mj, E_VERIFY_FAILED, "%s:%s has %" PRIu64 " bytes, the blob %" PRIu64, mj->to.store,
              mj->to.key, size, rec.size);
    goto out;
  }
  if (rc == 0 && memcmp(got, req->digest, BR_SHA256_LEN)) {
    char ghex[BR_HEX_LEN + 1];
    br_hex_encode(got, ghex);
    move_fail(mj, E_VERIFY_FAILED, "%s:%s has %" PRIu64 " bytes with SHA-256 %s, not %s",
              mj->to.store, mj->to.key, size, ghex, hex);
    goto out;
  }
  if (rc > 0) {
    move_fail(mj, E_VERIFY_FAILED, "%s:%s: no such object", mj->to.store, mj->to.key);
    goto out;
  }
  if (rc < 0) {
    move_fail(mj, E_STORE_UNAVAILABLE, "%s: %s", mj->to.store, err.msg);
    goto out;
  }
  /* The drain thread deletes draining copies under the blob's lock: `to` may be one (a move
   * back). Checked again under the lock, it cannot go away before it is the primary. */
  br_server_lock_blob(srv, req->digest, 1);
  locked = 1;
  uint64_t size2 = 0;
  rc = br_store_stat(dst, mj->to.key, &size2, &err);
  if (rc != 0 || size2 != size) {
    if (rc < 0)
      move_fail(mj, E_STORE_UNAVAILABLE, "%s: %s", mj->to.store, err.msg);
    else
      move_fail(mj, E_VERIFY_FAILED, "%s:%s changed or went away while verified", mj->to.store,
                mj->to.key);
    goto out;
  }
  uint64_t t1 = br_now_ms();
  mj->verify_ms = t1 - t0;
  br_loc_change ch = {.kind = BR_LOC_SWITCH, .expect = mj->expect, .to = mj->to};
  ch.to.verified_at_ms = t0; /* the hash began then: a later write shows in the file's ctime */
  memcpy(ch.digest, req->digest, BR_SHA256_LEN);
  rc = br_index_apply_locations(srv->index, &ch, 1, t1, &err);
  mj->switch_ms = br_now_ms() - t1;
  if (rc < 0) {
    move_fail(mj, index_error(rc), "%s", err.msg);
    goto out;
  }
  mj->after = ch.after;
  switch (ch.outcome) {
    case BR_LOC_APPLIED:
      mj->ok = 1;
      break;
    case BR_LOC_ABSENT:
      move_fail(mj, E_NOT_FOUND, "no such blob");
      break;
    case BR_LOC_FULL:
      move_fail(mj, E_TOO_MANY_LOCATIONS, "the blob has %d locations already",
                BR_MAX_LOCATIONS - 1);
      break;
    case BR_LOC_KEY_TAKEN:
      move_fail(mj, E_KEY_IN_USE, "%s:%s is another blob's location", mj->to.store, mj->to.key);
      break;
    default:
      move_fail(mj, E_LOCATION_CHANGED, "the primary location changed meanwhile");
  }
out:
  if (locked) br_server_lock_blob(srv, req->digest, 0);
  if (!mj->ok && mj->error == E_VERIFY_FAILED)
    br_warn("blob %s: move %s:%s -> %s:%s refused, verify_failed (digest mismatch): %s", hex,
            mj->expect.store, mj->expect.key, mj->to.store, mj->to.key, mj->message);
  if (mj->ok) {
    br_info("blob %s: moved %s:%s -> %s:%s (verified by sha256%s)", hex, mj->expect.store,
            mj->expect.key, mj->to.store, mj->to.key, mj->verify_sha ? "" : ", asked for size");
    if (strcmp(mj->expect.store, mj->to.store) || strcmp(mj->expect.key, mj->to.key))
      br_server_blob_gone(srv, req->digest); /* cached redirects and CDN copies point elsewhere */
  }
}

enum MHD_Result blob_location_put(struct request *req) {
  if (req->phase == PHASE_RESUMED) {
    struct move_job *mj = req->job_data;
    if (!mj->ok) return reply_error(req, mj->error, "%s", mj->message);
    json_t *body = blob_record_json(req->digest, &mj->after);
    json_object_set_new(body, "timings",
                        json_pack("{s:I,s:I}", "verify_ms", (json_int_t)mj->verify_ms, "switch_ms",
                                  (json_int_t)mj->switch_ms));
    return reply_json(req, MHD_HTTP_OK, body);
  }
  json_error_t jerr;
  json_t *root =
      req->body ? json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
  if (!json_is_object(root)) {
    json_decref(root);
    return reply_error(
        req, E_BAD_JSON,
        "the body must be {\"expect\":{\"store\",\"key\"},\"to\":{\"store\",\"key\"},"
        "\"verify\":\"sha256\"|\"size\"}");
  }
  struct move_job *mj = calloc(1, sizeof *mj);
  if (!mj) {
    json_decref(root);
    return reply_error(req, E_INTERNAL, "out of memory");
  }
  req->job_data = mj;
  char msg[160];
  const char *verify = json_string_value(json_object_get(root, "verify"));
  int bad =
      parse_location(json_object_get(root, "expect"), &mj->expect, "expect", msg, sizeof msg) < 0 ||
      parse_location(json_object_get(root, "to"), &mj->to, "to", msg, sizeof msg) < 0;
  if (!bad && verify && strcmp(verify, "sha256") && strcmp(verify, "size")) {
    snprintf(msg, sizeof msg, "\"verify\" must be \"sha256\" or \"size\"");
    bad = 1;
  }
  mj->verify_sha = !verify || !strcmp(verify, "sha256");
  json_decref(root);
  if (bad) return reply_error(req, E_BAD_REQUEST, "%s", msg);
  if (!br_server_store(req->srv, mj->to.store))
    return reply_error(req, E_BAD_REQUEST, "no store named %s", mj->to.store);
  req->job_fn = move_run;
  if (request_finish_async(req, JOB_CALL) < 0)
    return reply_error(req, E_NOT_READY, "the server is stopping");
  return MHD_YES;
}
