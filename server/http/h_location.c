/* Moving blobs between stores without a failed read (PRODUCT.md invariant 7):
 * PUT /v1/blobs/{hash}/location verifies the new copy (size, or SHA-256 by re-reading it) on a
 * finisher thread and switches the primary in the index writer's transaction, conditional on the
 * expected current primary; the old location becomes `draining` (since the switch, kept in the
 * record) and the drain thread deletes it after drain_grace, durably across restarts.
 * Also GET /v1/blobs?after=HEX&limit=N (paged listing) and POST /v1/import (index existing
 * objects in place, each checked in its store first). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/httpd.h"
#include "store/internal.h"

/* Implemented in http_blobs.c: the /meta view of a record. */
json_t *blob_record_json(const uint8_t digest[BR_SHA256_LEN], const br_record *rec);

static enum MHD_Result reply_code(struct request *req, unsigned status, const char *code,
                                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Errors of these routes that the shared table has no code for (409 location_changed, 422
 * verify_failed), in the same {"error":{"code","message"}} shape. */
static enum MHD_Result reply_code(struct request *req, unsigned status, const char *code,
                                  const char *fmt, ...) {
  char msg[sizeof(br_err) + 64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return reply_json(req, status, json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", msg));
}

static void hex_of(const uint8_t d[BR_SHA256_LEN], char hex[BR_HEX_LEN + 1]) {
  br_hex_encode(d, hex);
}

/* ---- reading a whole object back, hashing it ---------------------------------------------- */

/* SHA-256 and size of key in st. Returns 0, 1 if absent, -1 + err. */
static int hash_object(br_store *st, const char *key, uint8_t out[BR_SHA256_LEN], uint64_t *size,
                       br_err *err) {
  br_store_reader r;
  int rc = br_store_open_read(st, key, &r, err);
  if (rc) return rc;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  enum { CHUNK = 1 << 20 };
  char *buf = malloc(CHUNK);
  rc = ctx && buf && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ? 0 : br_fail(err, "out of memory");
  for (uint64_t off = 0; rc == 0 && off < r.size;) {
    size_t n = r.size - off < CHUNK ? (size_t)(r.size - off) : CHUNK;
    rc = r.source->pread(r.source, buf, n, off, err);
    if (rc == 0) EVP_DigestUpdate(ctx, buf, n);
    off += n;
  }
  if (rc == 0) EVP_DigestFinal_ex(ctx, out, NULL);
  *size = r.size;
  free(buf);
  EVP_MD_CTX_free(ctx);
  br_store_reader_close(&r);
  return rc;
}

/* ---- PUT /v1/blobs/{hash}/location ------------------------------------------------------------
 */

struct move_job {
  br_location expect, to;
  int verify_sha; /* 1: re-read and hash; 0: size only */
  /* results */
  unsigned status;
  char code[32];
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

static void move_fail(struct move_job *mj, unsigned status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void move_fail(struct move_job *mj, unsigned status, const char *code, const char *fmt,
                      ...) {
  mj->status = status;
  snprintf(mj->code, sizeof mj->code, "%s", code);
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
  hex_of(req->digest, hex);
  br_store *dst = br_server_store(srv, mj->to.store);
  int locked = 0;
  int rc = br_index_get(srv->index, req->digest, &rec, &err);
  if (rc < 0) {
    move_fail(mj, 500, "internal", "%s", err.msg);
    goto out;
  }
  if (rc > 0) {
    move_fail(mj, 404, "not_found", "no such blob");
    goto out;
  }
  const br_location *p = br_record_primary(&rec);
  if (!p || p->role != BR_ROLE_PRIMARY || strcmp(p->store, mj->expect.store) ||
      strcmp(p->key, mj->expect.key)) {
    move_fail(mj, 409, "location_changed", "the primary location is %s:%s, not %s:%s",
              p ? p->store : "(none)", p ? p->key : "", mj->expect.store, mj->expect.key);
    mj->after = rec;
    goto out;
  }
  uint64_t t0 = br_now_ms();
  uint64_t size = 0;
  if (mj->verify_sha) {
    uint8_t got[BR_SHA256_LEN];
    rc = hash_object(dst, mj->to.key, got, &size, &err);
    if (rc == 0 && (size != rec.size || memcmp(got, req->digest, BR_SHA256_LEN))) {
      char ghex[BR_HEX_LEN + 1];
      hex_of(got, ghex);
      move_fail(mj, 422, "verify_failed", "%s:%s has %" PRIu64 " bytes with SHA-256 %s, not %s",
                mj->to.store, mj->to.key, size, ghex, hex);
      goto out;
    }
  } else {
    rc = br_store_stat(dst, mj->to.key, &size, &err);
    if (rc == 0 && size != rec.size) {
      move_fail(mj, 422, "verify_failed", "%s:%s has %" PRIu64 " bytes, the blob %" PRIu64,
                mj->to.store, mj->to.key, size, rec.size);
      goto out;
    }
  }
  if (rc > 0) {
    move_fail(mj, 422, "verify_failed", "%s:%s: no such object", mj->to.store, mj->to.key);
    goto out;
  }
  if (rc < 0) {
    move_fail(mj, 503, "store_unavailable", "%s: %s", mj->to.store, err.msg);
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
      move_fail(mj, 503, "store_unavailable", "%s: %s", mj->to.store, err.msg);
    else
      move_fail(mj, 422, "verify_failed", "%s:%s changed or went away while verified", mj->to.store,
                mj->to.key);
    goto out;
  }
  uint64_t t1 = br_now_ms();
  mj->verify_ms = t1 - t0;
  br_loc_change ch = {.kind = BR_LOC_SWITCH, .expect = mj->expect, .to = mj->to};
  ch.to.verified_at_ms = t1;
  memcpy(ch.digest, req->digest, BR_SHA256_LEN);
  rc = br_index_apply_locations(srv->index, &ch, 1, t1, &err);
  mj->switch_ms = br_now_ms() - t1;
  if (rc < 0) {
    move_fail(mj, rc == BR_INDEX_FULL || rc == BR_INDEX_NO_SPACE ? 507 : 500,
              rc == BR_INDEX_FULL       ? "index_full"
              : rc == BR_INDEX_NO_SPACE ? "no_space"
                                        : "internal",
              "%s", err.msg);
    goto out;
  }
  mj->after = ch.after;
  switch (ch.outcome) {
    case BR_LOC_APPLIED:
      mj->status = 200;
      break;
    case BR_LOC_ABSENT:
      move_fail(mj, 404, "not_found", "no such blob");
      break;
    case BR_LOC_FULL:
      move_fail(mj, 409, "too_many_locations", "the blob has %d locations already",
                BR_MAX_LOCATIONS - 1);
      break;
    case BR_LOC_KEY_TAKEN:
      move_fail(mj, 409, "key_in_use", "%s:%s is another blob's location", mj->to.store,
                mj->to.key);
      break;
    default:
      move_fail(mj, 409, "location_changed", "the primary location changed meanwhile");
  }
out:
  if (locked) br_server_lock_blob(srv, req->digest, 0);
  if (mj->status == 200) {
    br_info("blob %s: moved %s:%s -> %s:%s (verified by %s)", hex, mj->expect.store, mj->expect.key,
            mj->to.store, mj->to.key, mj->verify_sha ? "sha256" : "size");
    if (strcmp(mj->expect.store, mj->to.store) || strcmp(mj->expect.key, mj->to.key))
      br_server_blob_gone(srv, req->digest); /* cached redirects and CDN copies point elsewhere */
  }
}

enum MHD_Result blob_location_put(struct request *req) {
  if (req->phase == PHASE_RESUMED) {
    struct move_job *mj = req->job_data;
    if (mj->status != 200) return reply_code(req, mj->status, mj->code, "%s", mj->message);
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
  if (br_server_finish_async(req, JOB_CALL) < 0)
    return reply_error(req, E_NOT_READY, "the server is stopping");
  return MHD_YES;
}

/* ---- POST /v1/import -------------------------------------------------------------------------
 * {"blobs":[{"sha256","size","store","key","content_type"}...]} -> {"results":[{"sha256","key",
 * "result":"created"|"exists"|"duplicate"|"error","message"?}]}. Each key is stat'ed in its
 * store (on a finisher thread) and must have the given size; the records are inserted in one
 * batch of conditional inserts (an existing record is never changed). */

#define IMPORT_MAX 1000

struct import_item {
  br_record rec;
  uint8_t digest[BR_SHA256_LEN];
  char result[16];
  char message[BR_MAX_KEY + BR_MAX_STORE_NAME + sizeof(br_err)];
  int ok; /* passed the checks: goes to the index */
};

struct import_job {
  size_t n;
  struct import_item items[];
};

static void import_run(struct request *req) {
  struct import_job *ij = req->job_data;
  br_server *srv = req->srv;
  uint64_t now = br_now_ms();
  br_loc_change *ch = calloc(ij->n ? ij->n : 1, sizeof *ch);
  size_t *of = calloc(ij->n ? ij->n : 1, sizeof *of);
  size_t m = 0;
  req->finish_rc = 0;
  if (!ch || !of) {
    req->finish_rc = -1;
    snprintf(req->finish_message, sizeof req->finish_message, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < ij->n; i++) {
    struct import_item *it = &ij->items[i];
    if (!it->ok) continue;
    br_location *l = &it->rec.locations[0];
    br_store *st = br_server_store(srv, l->store);
    uint64_t size = 0;
    br_err err;
    int rc = br_store_stat(st, l->key, &size, &err);
    if (rc != 0 || size != it->rec.size) {
      snprintf(it->result, sizeof it->result, "error");
      if (rc > 0)
        snprintf(it->message, sizeof it->message, "%s:%s: no such object", l->store, l->key);
      else if (rc < 0)
        snprintf(it->message, sizeof it->message, "%s", err.msg);
      else
        snprintf(it->message, sizeof it->message, "%s:%s has %" PRIu64 " bytes, not %" PRIu64,
                 l->store, l->key, size, it->rec.size);
      continue;
    }
    it->rec.created_ms = it->rec.last_upload_ms = it->rec.state_ms = now;
    l->verified_at_ms = now;
    ch[m].kind = BR_LOC_INSERT;
    ch[m].rec = &it->rec;
    memcpy(ch[m].digest, it->digest, BR_SHA256_LEN);
    of[m++] = i;
  }
  br_err err;
  int rc = br_index_apply_locations(srv->index, ch, m, now, &err);
  if (rc < 0) {
    req->finish_rc = -1;
    snprintf(req->finish_message, sizeof req->finish_message, "%s", err.msg);
    goto done;
  }
  for (size_t j = 0; j < m; j++) {
    struct import_item *it = &ij->items[of[j]];
    const char *r = ch[j].outcome == BR_LOC_APPLIED     ? "created"
                    : ch[j].outcome == BR_LOC_EXISTS    ? "exists"
                    : ch[j].outcome == BR_LOC_KEY_TAKEN ? "key_in_use"
                                                        : "duplicate";
    snprintf(it->result, sizeof it->result, "%s", r);
    if (ch[j].outcome == BR_LOC_KEY_TAKEN)
      snprintf(it->message, sizeof it->message, "the key is another blob's location");
    if (ch[j].outcome == BR_LOC_DUPLICATE) {
      const br_location *p = br_record_primary(&ch[j].after);
      snprintf(it->message, sizeof it->message, "already indexed at %s:%s", p ? p->store : "",
               p ? p->key : "");
    }
  }
done:
  free(ch);
  free(of);
}

enum MHD_Result import_post(struct request *req) {
  if (req->phase == PHASE_RESUMED) {
    struct import_job *ij = req->job_data;
    if (req->finish_rc < 0) return reply_error(req, E_INTERNAL, "%s", req->finish_message);
    json_t *res = json_array();
    for (size_t i = 0; i < ij->n; i++) {
      struct import_item *it = &ij->items[i];
      char hex[BR_HEX_LEN + 1];
      hex_of(it->digest, hex);
      json_t *o = json_pack("{s:s,s:s,s:s}", "sha256", hex, "key", it->rec.locations[0].key,
                            "result", it->result);
      if (it->message[0]) json_object_set_new(o, "message", json_string(it->message));
      json_array_append_new(res, o);
    }
    return reply_json(req, MHD_HTTP_OK, json_pack("{s:o}", "results", res));
  }
  json_error_t jerr;
  json_t *root =
      req->body ? json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
  json_t *arr = json_object_get(root, "blobs");
  if (!json_is_array(arr)) {
    json_decref(root);
    return reply_error(req, E_BAD_JSON,
                       "the body must be {\"blobs\": [{\"sha256\", \"size\", "
                       "\"store\", \"key\", \"content_type\"}, ...]}");
  }
  size_t n = json_array_size(arr);
  if (n > IMPORT_MAX) {
    json_decref(root);
    return reply_error(req, E_TOO_MANY_HASHES, "at most %d blobs per call", IMPORT_MAX);
  }
  struct import_job *ij = calloc(1, sizeof *ij + (n ? n : 1) * sizeof ij->items[0]);
  if (!ij) {
    json_decref(root);
    return reply_error(req, E_INTERNAL, "out of memory");
  }
  req->job_data = ij;
  ij->n = n;
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(arr, i);
    struct import_item *it = &ij->items[i];
    const char *hex = json_string_value(json_object_get(o, "sha256"));
    json_t *size = json_object_get(o, "size");
    const char *store = json_string_value(json_object_get(o, "store"));
    const char *key = json_string_value(json_object_get(o, "key"));
    const char *ct = json_string_value(json_object_get(o, "content_type"));
    if (!ct || !*ct) ct = "application/octet-stream";
    snprintf(it->result, sizeof it->result, "error");
    br_location *l = &it->rec.locations[0];
    if (key) snprintf(l->key, sizeof l->key, "%s", key);
    if (!hex || br_blob_id_parse(hex, strlen(hex), it->digest) < 0) {
      snprintf(it->message, sizeof it->message, "sha256 must be 64 hex digits");
    } else if (!json_is_integer(size) || json_integer_value(size) < 0) {
      snprintf(it->message, sizeof it->message, "size must be a non-negative integer");
    } else if (!store || !br_server_store(req->srv, store)) {
      snprintf(it->message, sizeof it->message, "no store named %s", store ? store : "(none)");
    } else if (!key || strlen(key) > BR_MAX_KEY || br_store_key_valid(key) < 0) {
      snprintf(it->message, sizeof it->message, "not a valid object key");
    } else if (strlen(ct) > BR_MAX_CONTENT_TYPE) {
      snprintf(it->message, sizeof it->message, "content_type is too long");
    } else if ((uint64_t)json_integer_value(size) > req->srv->cfg->max_blob_size) {
      snprintf(it->message, sizeof it->message, "over max_blob_size");
    } else {
      it->ok = 1;
      it->rec.size = (uint64_t)json_integer_value(size);
      it->rec.state = BR_STATE_LIVE;
      it->rec.nlocations = 1;
      snprintf(it->rec.content_type, sizeof it->rec.content_type, "%s", ct);
      snprintf(l->store, sizeof l->store, "%s", store);
      l->role = BR_ROLE_PRIMARY;
    }
  }
  json_decref(root);
  req->job_fn = import_run;
  if (br_server_finish_async(req, JOB_CALL) < 0)
    return reply_error(req, E_NOT_READY, "the server is stopping");
  return MHD_YES;
}

/* ---- the drain thread -------------------------------------------------------------------------
 */

struct drain_item {
  uint8_t digest[BR_SHA256_LEN];
  br_location loc;
};

struct mover {
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
 * same time?), delete. Returns 1 when its location is to be dropped from the record. The drop
 * itself is batched afterwards (drain_batch): it is conditional on the location still draining
 * since that time, so a move back onto the same key meanwhile (which needs the bytes there again,
 * checked under the lock) wins, and a crash before it leaves the location for the next pass. */
static int drain_one(br_server *srv, const struct drain_item *it) {
  char hex[BR_HEX_LEN + 1];
  hex_of(it->digest, hex);
  br_err err;
  br_record rec;
  int drop = 0;
  br_server_lock_blob(srv, it->digest, 1);
  int rc = br_index_get(srv->index, it->digest, &rec, &err);
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
    } else if (br_store_delete(st, it->loc.key, &err) < 0) {
      br_warn("blob %s: deleting draining copy %s:%s: %s (retried later)", hex, it->loc.store,
              it->loc.key, err.msg);
      goto out;
    }
  }
  drop = 1;
out:
  br_server_lock_blob(srv, it->digest, 0);
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
      hex_of(items[i].digest, hex);
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
  struct mover *mv = srv->mover;
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
    if (br_index_foreach(srv->index, drain_cb, &s, &err) < 0)
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

int move_start(br_server *srv, br_err *err) {
  struct mover *mv = calloc(1, sizeof *mv);
  if (!mv) return br_fail(err, "out of memory");
  pthread_mutex_init(&mv->lock, NULL);
  pthread_cond_init(&mv->cv, NULL);
  srv->mover = mv;
  if (pthread_create(&mv->thread, NULL, drain_main, srv))
    return br_fail(err, "cannot start the drain thread");
  mv->started = 1;
  return 0;
}

void move_stop(br_server *srv) {
  struct mover *mv = srv->mover;
  if (!mv) return;
  pthread_mutex_lock(&mv->lock);
  mv->stopping = 1;
  pthread_cond_broadcast(&mv->cv);
  pthread_mutex_unlock(&mv->lock);
  if (mv->started) pthread_join(mv->thread, NULL);
  pthread_mutex_destroy(&mv->lock);
  pthread_cond_destroy(&mv->cv);
  free(mv);
  srv->mover = NULL;
}
