/* POST /v1/import: index existing objects in place, each checked (size and SHA-256) in its store
 * first. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/server.h"
#include "http/handlers.h"
#include "store/internal.h"

/* {"blobs":[{"sha256","size","store","key","content_type"}...]} -> {"results":[{"sha256","key",
 * "result":"created"|"exists"|"duplicate"|"error","message"?}]}. Each key of a blob the index does
 * not know is read and hashed in its store (on a slow-pool thread) and must have the given size
 * and SHA-256 (an indexed one is only stat'ed: it is never inserted again); the records are
 * inserted in one batch of conditional inserts (an existing record is never changed). */

#define IMPORT_MAX 1000

struct import_item {
  br_record rec;
  uint8_t digest[BR_SHA256_LEN];
  char result[16];
  char message[BR_MAX_KEY + BR_MAX_STORE_NAME + sizeof(br_err)];
  int ok;    /* passed the checks: goes to the index */
  int sniff; /* no type or octet-stream given: detect it from the first bytes */
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
    /* a blob the index has already is never inserted again (exists / duplicate): no need to
     * read it; anything new is hashed, so a claimed sha256 its bytes do not have is refused */
    uint8_t got[BR_SHA256_LEN];
    uint64_t hashed_from = br_now_ms(); /* a later write moves the file's ctime past it */
    br_record known;
    int rc = br_index_get(srv->index, it->digest, &known, &err);
    if (rc == 0) {
      rc = br_store_stat(st, l->key, &size, &err);
      memcpy(got, it->digest, BR_SHA256_LEN);
    } else {
      unsigned char head[BR_SNIFF_BYTES];
      size_t head_len = 0;
      /* the file's identity before its hash: one renamed into place later is another inode */
      rc = br_store_identity(st, l->key, &l->dev, &l->ino, &err);
      if (rc == 0)
        rc = br_store_hash_head(st, l->key, got, &size, head, sizeof head, &head_len, &err);
      if (rc == 0 && it->sniff) /* the key's extension, else the first bytes */
        br_sniff_name_or_bytes(l->key, head, head_len, it->rec.content_type,
                               sizeof it->rec.content_type);
    }
    if (rc != 0 || size != it->rec.size || memcmp(got, it->digest, BR_SHA256_LEN)) {
      snprintf(it->result, sizeof it->result, "error");
      char ghex[BR_HEX_LEN + 1];
      br_hex_encode(got, ghex);
      if (rc > 0)
        snprintf(it->message, sizeof it->message, "%s:%s: no such object", l->store, l->key);
      else if (rc < 0)
        snprintf(it->message, sizeof it->message, "%s", err.msg);
      else if (size != it->rec.size)
        snprintf(it->message, sizeof it->message, "%s:%s has %" PRIu64 " bytes, not %" PRIu64,
                 l->store, l->key, size, it->rec.size);
      else
        snprintf(it->message, sizeof it->message, "digest_mismatch: %s:%s has SHA-256 %s", l->store,
                 l->key, ghex);
      if (rc == 0) br_warn("import: %s", it->message);
      continue;
    }
    it->rec.created_ms = it->rec.last_upload_ms = it->rec.state_ms = now;
    l->verified_at_ms = hashed_from;
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
      br_hex_encode(it->digest, hex);
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
    uint8_t named[BR_SHA256_LEN];
    if (key) snprintf(l->key, sizeof l->key, "%s", key);
    if (!hex || br_blob_id_parse(hex, strlen(hex), it->digest) < 0) {
      snprintf(it->message, sizeof it->message, "sha256 must be 64 hex digits");
    } else if (!json_is_integer(size) || json_integer_value(size) < 0) {
      snprintf(it->message, sizeof it->message, "size must be a non-negative integer");
    } else if (!store || !br_server_store(req->srv, store)) {
      snprintf(it->message, sizeof it->message, "no store named %s", store ? store : "(none)");
    } else if (!key || strlen(key) > BR_MAX_KEY || br_store_key_valid(key) < 0) {
      snprintf(it->message, sizeof it->message, "not a valid object key");
    } else if (br_store_default_key_digest(br_server_store(req->srv, store), key, named) == 0 &&
               memcmp(named, it->digest, BR_SHA256_LEN)) {
      /* the place an upload of that other blob writes to: its bytes would replace these */
      snprintf(it->result, sizeof it->result, "key_in_use");
      snprintf(it->message, sizeof it->message, "the key is the default key of another blob");
      br_warn("import: %s:%s refused: the default key of another blob", store, key);
    } else if (br_header_content_type_check(ct)) { /* sent back in every read's headers */
      snprintf(it->message, sizeof it->message, "bad_content_type: %s",
               br_header_content_type_check(ct));
    } else if ((uint64_t)json_integer_value(size) > req->srv->cfg->max_blob_size) {
      snprintf(it->message, sizeof it->message, "over max_blob_size");
    } else {
      it->ok = 1;
      it->sniff = br_sniff_wanted(ct);
      it->rec.size = (uint64_t)json_integer_value(size);
      it->rec.state = BR_STATE_LIVE;
      it->rec.nlocations = 1;
      snprintf(it->rec.content_type, sizeof it->rec.content_type, "%s", ct);
      snprintf(l->store, sizeof l->store, "%s", store);
      l->role = BR_ROLE_PRIMARY;
    }
    if (!it->ok) br_info("POST /v1/import: blob %zu refused: %s", i, it->message);
  }
  json_decref(root);
  req->job_fn = import_run;
  if (request_finish_async(req, JOB_SLOW) < 0)
    return reply_error(req, E_NOT_READY, "the server is stopping");
  return MHD_YES;
}
