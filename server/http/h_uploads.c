/* POST /v1/uploads (which blobs to send and where: presigned PUTs straight to the store),
 * DELETE /v1/uploads/{upload_id} (a client gives up a multipart plan) and
 * POST /v1/uploads/commit (verify what landed, then record it): uploads that skip blobrefd. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/direct_plans.h"
#include "core/server.h"
#include "http/handlers.h"

#define UPLOADS_MAX 10000 /* blobs per negotiation or commit */
#define HASHES_MAX 20000  /* part hashes (negotiation) or part ETags (commit) per request */
#define UPLOAD_ID_MAX DIRECT_UPLOAD_ID_MAX
#define ETAG_MAX 127

/* One part of a multipart blob: its SHA-256 (negotiation) or the ETag the store gave it (commit).
 */
struct upload_part {
  uint8_t digest[BR_SHA256_LEN];
  char etag[ETAG_MAX + 1];
};

/* One blob of a request body: {"sha256", "size", "content_type"?}, and for a multipart blob
 * "part_size"? + "part_sha256" (negotiation) or "upload_id" + "parts" (commit: ETags). */
struct upload_item {
  uint8_t digest[BR_SHA256_LEN];
  uint64_t size;
  char content_type[BR_MAX_CONTENT_TYPE + 1];
  uint64_t part_size;                /* 0: not said */
  size_t part0, nparts;              /* this blob's parts in the batch's parts */
  char upload_id[UPLOAD_ID_MAX + 1]; /* commit of a multipart upload (negotiation: the one
                                        created), else "" */
  int planned;                       /* negotiation: an upload or multipart plan was handed out */
  const char *status; /* commit: "created" | "present" | "missing" | "mismatch" | "error" */
  char message[BR_MAX_KEY + BR_MAX_STORE_NAME + 2 * sizeof(br_err)];
};

struct upload_batch {
  size_t n;
  atomic_int unlocked; /* commit: a blob's lock could not be had (the database is unavailable) */
  json_t *answer;      /* negotiation: the answer the finisher built */
  struct upload_part *parts; /* in the same allocation, after items */
  struct upload_item items[];
};

/* Parses item i's multipart fields into it and b->parts (from *next). NULL, or why not. */
static const char *parse_parts(json_t *o, struct upload_batch *b, struct upload_item *it,
                               size_t *next, int commit, char *msg, size_t msglen, size_t i) {
  json_t *ps = json_object_get(o, "part_size");
  json_t *arr = json_object_get(o, commit ? "parts" : "part_sha256");
  json_t *uid = json_object_get(o, "upload_id");
  if (ps && (!json_is_integer(ps) || json_integer_value(ps) < (json_int_t)BR_DIRECT_MIN_PART ||
             json_integer_value(ps) > (json_int_t)BR_DIRECT_MAX_PART)) {
    snprintf(msg, msglen, "blobs[%zu].part_size must be 5 MiB to 5 GiB", i);
    return msg;
  }
  if (arr && !json_is_array(arr)) {
    snprintf(msg, msglen, "blobs[%zu].%s must be an array", i, commit ? "parts" : "part_sha256");
    return msg;
  }
  if (commit && (!!uid != !!arr || (uid && (!json_is_string(uid) || !*json_string_value(uid) ||
                                            strlen(json_string_value(uid)) > UPLOAD_ID_MAX)))) {
    snprintf(msg, msglen,
             "blobs[%zu]: a multipart commit names upload_id (1 to %d characters) "
             "and parts (their ETags in order)",
             i, UPLOAD_ID_MAX);
    return msg;
  }
  if (uid) snprintf(it->upload_id, sizeof it->upload_id, "%s", json_string_value(uid));
  it->part_size = ps ? (uint64_t)json_integer_value(ps) : 0;
  if (!arr) return NULL;
  size_t n = json_array_size(arr);
  if (n == 0 || n > BR_DIRECT_MAX_PARTS) {
    snprintf(msg, msglen, "blobs[%zu]: 1 to %d parts", i, BR_DIRECT_MAX_PARTS);
    return msg;
  }
  if (!commit && (!it->part_size || (it->size + it->part_size - 1) / it->part_size != n)) {
    snprintf(msg, msglen,
             "blobs[%zu]: part_sha256 needs part_size and one hash per part_size "
             "bytes of size",
             i);
    return msg;
  }
  it->part0 = *next;
  it->nparts = n;
  for (size_t k = 0; k < n; k++) {
    struct upload_part *p = &b->parts[(*next)++];
    const char *v = json_string_value(json_array_get(arr, k));
    if (commit ? !v || !*v || strlen(v) > ETAG_MAX
               : !v || br_blob_id_parse(v, strlen(v), p->digest) < 0) {
      snprintf(msg, msglen, "blobs[%zu].%s[%zu] is not %s", i, commit ? "parts" : "part_sha256", k,
               commit ? "an ETag (1 to 127 characters)" : "64 lowercase hex digits");
      return msg;
    }
    if (commit) snprintf(p->etag, sizeof p->etag, "%s", v);
  }
  return NULL;
}

/* Parses {"blobs":[{"sha256","size","content_type"?}...]} (at most UPLOADS_MAX, each size within
 * max_blob_size, each content type passing the header grammar) into a malloc'd batch. Returns
 * the batch, or NULL with the error and its message (nothing else happened). */
static struct upload_batch *parse_batch(struct request *req, int commit, enum br_api_error *e,
                                        char *msg, size_t msglen) {
  json_error_t jerr;
  json_t *root =
      req->body ? json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
  json_t *arr = json_object_get(root, "blobs");
  struct upload_batch *b = NULL;
  *e = E_BAD_JSON;
  if (!json_is_array(arr)) {
    snprintf(msg, msglen,
             "the body must be {\"blobs\": [{\"sha256\", \"size\", \"content_type\"}, "
             "...]}");
    goto done;
  }
  size_t n = json_array_size(arr);
  if (n > UPLOADS_MAX) {
    *e = E_TOO_MANY_HASHES;
    snprintf(msg, msglen, "%zu blobs, at most %d per call", n, UPLOADS_MAX);
    goto done;
  }
  size_t hashes = 0, next = 0;
  for (size_t i = 0; i < n; i++)
    hashes +=
        json_array_size(json_object_get(json_array_get(arr, i), commit ? "parts" : "part_sha256"));
  if (hashes > HASHES_MAX) {
    *e = E_TOO_MANY_HASHES;
    snprintf(msg, msglen, "%zu part %s, at most %d per call", hashes, commit ? "ETags" : "hashes",
             HASHES_MAX);
    goto done;
  }
  size_t items = sizeof *b + (n ? n : 1) * sizeof b->items[0];
  b = calloc(1, items + (hashes ? hashes : 1) * sizeof b->parts[0]);
  if (b) b->parts = (struct upload_part *)((char *)b + items);
  if (!b) {
    *e = E_INTERNAL;
    snprintf(msg, msglen, "out of memory");
    goto done;
  }
  b->n = n;
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_array_get(arr, i);
    struct upload_item *it = &b->items[i];
    const char *hex = json_string_value(json_object_get(o, "sha256"));
    json_t *size = json_object_get(o, "size");
    json_t *ctj = json_object_get(o, "content_type");
    const char *ct = json_string_value(ctj);
    const char *why = NULL;
    if (!ct || !*ct) ct = "application/octet-stream";
    if (!json_is_object(o)) {
      snprintf(msg, msglen, "blobs[%zu] is not an object", i);
    } else if (!hex || br_blob_id_parse(hex, strlen(hex), it->digest) < 0) {
      *e = E_BAD_HASH;
      snprintf(msg, msglen, "blobs[%zu].sha256 is not 64 lowercase hex digits", i);
    } else if (!json_is_integer(size) || json_integer_value(size) < 0) {
      snprintf(msg, msglen, "blobs[%zu].size must be a non-negative integer", i);
    } else if ((uint64_t)json_integer_value(size) > req->srv->cfg->max_blob_size) {
      *e = E_TOO_LARGE;
      snprintf(msg, msglen, "blobs[%zu].size is over max_blob_size (%" PRIu64 " bytes)", i,
               req->srv->cfg->max_blob_size);
    } else if ((ctj && !json_is_string(ctj)) || strlen(ct) > BR_MAX_CONTENT_TYPE ||
               (why = br_header_content_type_check(ct))) {
      *e = E_BAD_CONTENT_TYPE;
      snprintf(msg, msglen, "blobs[%zu].content_type: %s", i, why ? why : "not a media type");
    } else {
      it->size = (uint64_t)json_integer_value(size);
      snprintf(it->content_type, sizeof it->content_type, "%s", ct);
      if (!parse_parts(o, b, it, &next, commit, msg, msglen, i)) continue;
      *e = E_BAD_JSON;
    }
    free(b);
    b = NULL;
    goto done;
  }
done:
  json_decref(root);
  return b;
}

static json_t *headers_json(const br_direct_put *put) {
  json_t *headers = json_object();
  for (size_t h = 0; h < put->nheaders; h++)
    json_object_set_new(headers, put->headers[h].name, json_string(put->headers[h].value));
  return headers;
}

/* The plan of a blob over the store's part size: without part hashes, which part size to hash
 * at (status part_hashes: negotiate again with part_sha256); with them, a multipart upload
 * created under the content key and a presigned UploadPart per part, each signing its part's
 * x-amz-content-sha256. NULL on a store error (err). */
static json_t *multipart_action(br_store *st, const struct upload_batch *b, struct upload_item *it,
                                const char *key, const char *hex, br_err *err) {
  if (!it->nparts) {
    uint64_t ps = br_store_direct_max(st),
             fit = (it->size + BR_DIRECT_MAX_PARTS - 1) / BR_DIRECT_MAX_PARTS;
    if (fit > ps) ps = (fit + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
    return json_pack("{s:s,s:s,s:I}", "sha256", hex, "status", "part_hashes", "part_size",
                     (json_int_t)ps);
  }
  char *upload_id = it->upload_id;
  int rc =
      br_store_multipart_begin(st, key, it->content_type, upload_id, sizeof it->upload_id, err);
  if (rc < 0) return NULL;
  if (rc > 0) return json_pack("{s:s,s:s}", "sha256", hex, "status", "via_server");
  it->planned = 1; /* journaled with the others of the batch, or aborted */
  json_t *parts = json_array();
  br_direct_put put;
  for (size_t k = 0; k < it->nparts; k++) {
    if (br_store_presign_part(st, key, upload_id, (unsigned)k + 1, b->parts[it->part0 + k].digest,
                              &put, err) < 0) {
      json_decref(parts);
      br_err aerr;
      br_store_multipart_abort(st, key, upload_id, &aerr);
      it->planned = 0;
      it->upload_id[0] = '\0';
      return NULL;
    }
    json_array_append_new(
        parts, json_pack("{s:I,s:s,s:s,s:o}", "part_number", (json_int_t)k + 1, "method", "PUT",
                         "url", put.url, "headers", headers_json(&put)));
  }
  char expires[40];
  br_format_time_ms(put.expires_ms, expires, sizeof expires);
  return json_pack("{s:s,s:s,s:s,s:I,s:o,s:s}", "sha256", hex, "status", "multipart", "upload_id",
                   upload_id, "part_size", (json_int_t)it->part_size, "parts", parts, "expires_at",
                   expires);
}

/* The negotiation answer for one blob not in the index: a presigned PUT when the upload store
 * takes direct uploads and the blob fits in one part, a multipart plan when it does not, else
 * via_server. NULL on a store error. */
static json_t *upload_action(br_store *st, const struct upload_batch *b, struct upload_item *it,
                             const char *hex, br_err *err) {
  char key[BR_MAX_KEY + 1];
  br_direct_put put;
  if (br_store_direct_mode(st) == BR_DIRECT_NONE ||
      !br_store_default_key(st, it->digest, key, sizeof key))
    return json_pack("{s:s,s:s}", "sha256", hex, "status", "via_server");
  if (it->size > br_store_direct_max(st)) return multipart_action(st, b, it, key, hex, err);
  int rc = br_store_presign_put(st, key, it->digest, &put, err);
  if (rc < 0) return NULL;
  if (rc > 0) return json_pack("{s:s,s:s}", "sha256", hex, "status", "via_server");
  it->planned = 1;
  json_t *headers = headers_json(&put);
  char expires[40];
  br_format_time_ms(put.expires_ms, expires, sizeof expires);
  return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s}", "sha256", hex, "status", "upload", "method", "PUT",
                   "url", put.url, "headers", headers, "expires_at", expires);
}

/* Journals the plans of items[0..n) (DATA_DIR/direct-plans.log, fsync'd) before any is answered,
 * so that the sweep removes what an unfinished one leaves. When they cannot be journaled, the
 * multipart uploads are aborted and: the journal is full, each becomes via_server in out (0);
 * else -1 with err (the caller answers 500). */
static int journal_plans(br_server *srv, br_store *st, struct upload_batch *b, size_t n,
                         json_t *out, br_err *err) {
  size_t np = 0;
  for (size_t i = 0; i < n; i++) np += b->items[i].planned;
  if (!np) return 0;
  struct direct_plan *plans = calloc(np, sizeof *plans);
  char(*keys)[BR_MAX_KEY + 1] = calloc(np, sizeof *keys);
  int rc = plans && keys ? 0 : br_fail(err, "out of memory");
  size_t k = 0;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    struct upload_item *it = &b->items[i];
    if (!it->planned) continue;
    br_store_default_key(st, it->digest, keys[k], sizeof keys[k]);
    memcpy(plans[k].digest, it->digest, BR_SHA256_LEN);
    plans[k].store = br_store_name(st);
    plans[k].key = keys[k];
    plans[k].upload_id = it->upload_id;
    k++;
  }
  if (rc == 0) rc = direct_plans_add(srv, plans, np, err);
  for (size_t i = 0, j = 0; rc != 0 && i < n; i++) {
    struct upload_item *it = &b->items[i];
    if (!it->planned) continue;
    br_err aerr;
    if (it->upload_id[0] && keys && br_store_multipart_abort(st, keys[j], it->upload_id, &aerr) < 0)
      br_warn("POST /v1/uploads: %s", aerr.msg);
    j++;
    if (rc > 0) {
      char hex[BR_HEX_LEN + 1];
      br_hex_encode(it->digest, hex);
      json_array_set_new(out, i, json_pack("{s:s,s:s}", "sha256", hex, "status", "via_server"));
    }
  }
  if (rc > 0) br_warn("POST /v1/uploads: the plan journal is full: %zu blob(s) via_server", np);
  free(plans);
  free(keys);
  return rc < 0 ? -1 : 0;
}

/* The finisher's part of a negotiation (multipart plans create uploads in the store). */
static void negotiate_run(struct request *req) {
  struct upload_batch *b = req->job_data;
  br_store *st = req->srv->upload_store;
  json_t *out = json_array();
  req->finish_rc = 0;
  for (size_t i = 0; i < b->n; i++) {
    struct upload_item *it = &b->items[i];
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(it->digest, hex);
    br_record rec;
    br_err err;
    int rc = br_index_get(req->srv->index, it->digest, &rec, &err);
    json_t *o = rc < 0 ? NULL
                : rc == 0 && rec.state == BR_STATE_LIVE
                    ? json_pack("{s:s,s:s}", "sha256", hex, "status", "present")
                    : upload_action(st, b, it, hex, &err);
    if (!o) {
      /* the plans made so far are journaled: the sweep removes them after the grace */
      br_warn("POST /v1/uploads: %s", err.msg);
      br_err jerr;
      if (journal_plans(req->srv, st, b, i, out, &jerr) < 0)
        br_warn("POST /v1/uploads: %s", jerr.msg);
      json_decref(out);
      out = json_string(err.msg);
      break;
    }
    json_array_append_new(out, o);
  }
  br_err jerr;
  if (json_is_array(out) && journal_plans(req->srv, st, b, b->n, out, &jerr) < 0) {
    br_warn("POST /v1/uploads: %s", jerr.msg);
    json_decref(out);
    out = json_string(jerr.msg);
  }
  b->answer = out;
}

/* Frees a negotiation's batch with the answer its finisher built: a request torn down between
 * the two (the client went away) never reaches the resumed call that takes the answer. */
static void batch_free(void *p) {
  struct upload_batch *b = p;
  if (b) json_decref(b->answer);
  free(b);
}

enum MHD_Result uploads_post(struct request *req) {
  if (req->phase == PHASE_RESUMED) {
    struct upload_batch *b = req->job_data;
    json_t *out = b->answer;
    b->answer = NULL;
    if (json_is_string(out)) {
      enum MHD_Result r = reply_error(req, E_INTERNAL, "%s", json_string_value(out));
      json_decref(out);
      return r;
    }
    return reply_json(req, MHD_HTTP_OK, json_pack("{s:o}", "blobs", out));
  }
  enum br_api_error e;
  char msg[256];
  struct upload_batch *b = parse_batch(req, 0, &e, msg, sizeof msg);
  if (!b) {
    br_info("POST /v1/uploads refused: %s", msg);
    return reply_error(req, e, "%s", msg);
  }
  req->job_data = b;
  req->job_free = batch_free;
  req->job_fn = negotiate_run;
  if (request_finish_async(req, JOB_SLOW) < 0)
    return reply_error(req, E_NOT_READY, "the server is stopping");
  return MHD_YES;
}

/* Takes (lock = 1) or releases the blob's stripe for commit_one when `off` (the store calls run
 * outside it, registered with br_server_commit_begin); else commit_one runs wholly under it. */
static int commit_lock(struct request *req, const struct upload_item *it, int off, int lock) {
  return off ? br_server_lock_blob(req->srv, it->digest, lock) : 0;
}

/* Checks one directly uploaded object and records it, as a PUT through blobrefd does: on LMDB
 * the store calls (CompleteMultipartUpload, HEAD, the re-hash) run outside the blob's stripe,
 * registered as a commit (see finish_upload: a delete of the same hash either saw it and left
 * the blob alone, or was in flight before, and then the commit is refused: the client's object
 * is at the content key, which that delete names); the index decisions take the stripe. On a
 * shared index the caller holds the stripe throughout (off = 0). */
static void commit_one(struct request *req, br_store *st, const struct upload_batch *b,
                       struct upload_item *it, int off) {
  br_server *srv = req->srv;
  char hex[BR_HEX_LEN + 1], key[BR_MAX_KEY + 1];
  br_hex_encode(it->digest, hex);
  br_err err;
  br_record rec;
  int rc = br_index_get(srv->index, it->digest, &rec, &err);
  if (!br_store_default_key(st, it->digest, key, sizeof key)) {
    snprintf(err.msg, sizeof err.msg, "object key too long");
    goto fail;
  }
  if (rc == 0 && rec.state == BR_STATE_LIVE) {
    /* a dedup hit: keep it from reconcile for another grace period, as a PUT would */
    rc = br_index_touch(srv->index, it->digest, br_now_ms(), &err);
    if (rc == 0) {
      br_err aerr; /* another commit won: this client's parts are not needed */
      if (it->upload_id[0] && br_store_multipart_abort(st, key, it->upload_id, &aerr) < 0)
        br_warn("POST /v1/uploads/commit: %s", aerr.msg);
      it->status = "present";
      return;
    }
  }
  if (rc < 0) goto fail;
  if (it->upload_id[0]) {
    /* a multipart upload: complete it under the content key; its object is then checked as a
     * single PUT's is (re-hashed: a composite checksum is not the blob's) */
    const char **etags = malloc(it->nparts * sizeof *etags); /* up to 10,000: not on the stack */
    if (!etags) {
      snprintf(err.msg, sizeof err.msg, "out of memory");
      goto fail;
    }
    for (size_t k = 0; k < it->nparts; k++) etags[k] = b->parts[it->part0 + k].etag;
    rc = br_store_multipart_complete(st, key, it->upload_id, etags, it->nparts, &err);
    free(etags);
    if (rc > 0) {
      br_err aerr;
      br_store_multipart_abort(st, key, it->upload_id, &aerr);
      it->status = "missing";
      snprintf(it->message, sizeof it->message, "%s", err.msg);
      br_info("POST /v1/uploads/commit: %s: %s", hex, err.msg);
      return;
    }
    if (rc < 0) goto fail;
  }
  uint64_t size = it->size;
  uint8_t sha[BR_SHA256_LEN];
  int has_sha = 0;
  /* a store that does not check the bytes is read whole below anyway: its GET says whether the
   * object is there and how long it is, so no HEAD first (one request per blob, not two) */
  rc = br_store_direct_mode(st) == BR_DIRECT_REHASH
           ? 0
           : br_store_head_checksum(st, key, &size, sha, &has_sha, &err);
  if (rc > 0) {
    it->status = "missing";
    snprintf(it->message, sizeof it->message, "no object at %s:%s", br_store_name(st), key);
    return;
  }
  if (rc < 0) goto fail;
  int bad = size != it->size || (has_sha && memcmp(sha, it->digest, BR_SHA256_LEN));
  if (!bad && (br_store_direct_mode(st) != BR_DIRECT_TRUSTED || !has_sha || it->upload_id[0])) {
    /* the backend does not check the bytes against the signed checksum (or left no checksum to
     * compare), or the object was put together from parts (their hashes, chosen by the client,
     * say nothing of the whole): read the object and hash it before it can ever be served */
    uint64_t t0 = br_mono_ns(), got_size = 0;
    rc = br_store_hash_expect(st, key, size, sha, &got_size, &err);
    atomic_fetch_add(&req->http->direct_rehash_ns, br_mono_ns() - t0);
    if (rc == 0) atomic_fetch_add(&req->http->direct_rehash_bytes, got_size);
    if (rc > 0) {
      it->status = "missing";
      snprintf(it->message, sizeof it->message, "no object at %s:%s", br_store_name(st), key);
      return;
    }
    if (rc < 0) goto fail;
    size = got_size; /* over it->size: read no further than that */
    bad = got_size != it->size || memcmp(sha, it->digest, BR_SHA256_LEN);
  }
  if (bad) {
    it->status = "mismatch";
    snprintf(it->message, sizeof it->message, "%s:%s is not blob %s (%" PRIu64 " bytes%s): deleted",
             br_store_name(st), key, hex, size, has_sha ? " or another checksum" : "");
    uint8_t owner[BR_SHA256_LEN];
    /* under the stripe: a PUT of the blob must not commit its bytes there in between */
    if (commit_lock(req, it, off, 1) < 0) {
      rc = -1;
      snprintf(err.msg, sizeof err.msg, "the blob's lock cannot be had");
    } else {
      rc = br_index_key_owner(srv->index, br_store_name(st), key, owner, &err);
      if (rc == 1 && br_store_delete(st, key, &err) < 0) rc = -1;
      commit_lock(req, it, off, 0);
    }
    if (rc != 1) {
      snprintf(it->message, sizeof it->message, "%s:%s is not blob %s: left in place (%s)",
               br_store_name(st), key, hex, rc < 0 ? err.msg : "a record owns the key");
    }
    br_warn("POST /v1/uploads/commit: %s", it->message);
    return;
  }
  uint64_t now = br_now_ms();
  br_record add;
  br_record_init(&add, it->size, it->content_type, br_store_name(st), key, now, now);
  int created = 0;
  if (commit_lock(req, it, off, 1) < 0) {
    snprintf(err.msg, sizeof err.msg, "the blob's lock cannot be had");
    goto fail;
  }
  rc = br_index_record_upload(srv->index, it->digest, &add, &created, NULL, &err);
  commit_lock(req, it, off, 0);
  if (rc < 0) goto fail;
  it->status = created ? "created" : "present";
  atomic_fetch_add(created ? &req->http->uploads_created : &req->http->uploads_dedup, 1);
  return;
fail:
  it->status = "error";
  snprintf(it->message, sizeof it->message, "%s", err.msg);
  br_warn("POST /v1/uploads/commit: %s: %s", hex, err.msg);
}

#define COMMIT_THREADS 8 /* blobs of one commit checked at a time (HEAD, re-hash, record) */

struct commit_pass {
  struct request *req;
  struct upload_batch *b;
  atomic_size_t next;
};

/* The plan of an item is over unless the client may still PUT and commit again (missing, error);
 * a multipart upload is over once completed or aborted. */
static void forget_plan(br_server *srv, const struct upload_item *it) {
  if (strcmp(it->status, "error") && strcmp(it->status, "missing"))
    direct_plans_forget(srv, it->digest, "");
  if (strcmp(it->status, "error") && it->upload_id[0])
    direct_plans_forget(srv, it->digest, it->upload_id);
}

static void *commit_worker(void *arg) {
  struct commit_pass *cp = arg;
  br_store *st = cp->req->srv->upload_store;
  for (;;) {
    size_t i = atomic_fetch_add(&cp->next, 1);
    if (i >= cp->b->n) return NULL;
    struct upload_item *it = &cp->b->items[i];
    br_server *srv = cp->req->srv;
    if (br_server_off_stripe(srv)) {
      int busy = br_server_commit_begin(srv, it->digest);
      if (busy == 0) commit_one(cp->req, st, cp->b, it, 1);
      if (busy >= 0) br_server_commit_end(srv, it->digest);
      if (busy != 0) {
        it->status = "error";
        snprintf(it->message, sizeof it->message, "%s",
                 busy > 0 ? "the blob is being deleted (its object may be going): retry the upload"
                          : "out of memory");
      }
      forget_plan(srv, it);
      continue;
    }
    if (br_server_lock_blob(srv, it->digest, 1) < 0) {
      atomic_store(&cp->b->unlocked, 1);
      it->status = "error";
      snprintf(it->message, sizeof it->message,
               "the blob's lock cannot be had: the index database is unavailable");
      continue;
    }
    commit_one(cp->req, st, cp->b, it, 0);
    forget_plan(srv, it);
    br_server_lock_blob(srv, it->digest, 0);
  }
}

/* The slow pool's part of a commit: every blob checked and recorded, COMMIT_THREADS at a time so
 * that the store's round trips and the index's group commits overlap; answers keep request
 * order. */
static void commit_run(struct request *req) {
  struct commit_pass cp = {.req = req, .b = req->job_data};
  atomic_init(&cp.next, 0);
  pthread_t threads[COMMIT_THREADS];
  size_t started = 0;
  size_t want = cp.b->n < COMMIT_THREADS ? cp.b->n : COMMIT_THREADS;
  for (; started + 1 < want; started++)
    if (pthread_create(&threads[started], NULL, commit_worker, &cp) != 0) break;
  commit_worker(&cp); /* this thread too */
  for (size_t t = 0; t < started; t++) pthread_join(threads[t], NULL);
  req->finish_rc = 0;
}

enum MHD_Result uploads_commit_post(struct request *req) {
  if (req->phase == PHASE_RESUMED) {
    struct upload_batch *b = req->job_data;
    if (atomic_load(&b->unlocked)) /* the others are recorded: a commit again answers them */
      return reply_error(req, E_INDEX_UNAVAILABLE,
                         "a blob's lock cannot be had: the index database is unavailable; "
                         "commit again");
    json_t *out = json_array();
    for (size_t i = 0; i < b->n; i++) {
      struct upload_item *it = &b->items[i];
      char hex[BR_HEX_LEN + 1];
      br_hex_encode(it->digest, hex);
      json_t *o = json_pack("{s:s,s:s}", "sha256", hex, "status", it->status);
      if (it->message[0]) json_object_set_new(o, "message", json_string(it->message));
      json_array_append_new(out, o);
    }
    return reply_json(req, MHD_HTTP_OK, json_pack("{s:o}", "blobs", out));
  }
  enum br_api_error e;
  char msg[256];
  struct upload_batch *b = parse_batch(req, 1, &e, msg, sizeof msg);
  if (!b) {
    br_info("POST /v1/uploads/commit refused: %s", msg);
    return reply_error(req, e, "%s", msg);
  }
  req->job_data = b;
  req->job_fn = commit_run;
  if (request_finish_async(req, JOB_SLOW) < 0)
    return reply_error(req, E_NOT_READY, "the server is stopping");
  return MHD_YES;
}

/* DELETE /v1/uploads/{upload_id}?sha256=HEX: a client gives up a multipart plan. */
struct abort_job {
  uint8_t digest[BR_SHA256_LEN];
  char upload_id[UPLOAD_ID_MAX + 1];
  char error[sizeof(br_err)]; /* "" when aborted */
};

/* The slow pool's part of an abort: AbortMultipartUpload under the blob's content key (an
 * upload already aborted or completed, or a store without multipart plans, is no error), then
 * the plan is forgotten. */
static void abort_run(struct request *req) {
  struct abort_job *j = req->job_data;
  br_store *st = req->srv->upload_store;
  char key[BR_MAX_KEY + 1];
  br_err err;
  req->finish_rc = 0;
  if (!br_store_default_key(st, j->digest, key, sizeof key)) {
    snprintf(j->error, sizeof j->error, "object key too long");
  } else if (br_store_multipart_abort(st, key, j->upload_id, &err) < 0) {
    snprintf(j->error, sizeof j->error, "%s", err.msg);
  } else {
    direct_plans_forget(req->srv, j->digest, j->upload_id);
    br_info("DELETE /v1/uploads: multipart upload of %s aborted by the client", key);
  }
}

enum MHD_Result uploads_abort(struct request *req) {
  if (req->phase == PHASE_RESUMED) {
    struct abort_job *j = req->job_data;
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(j->digest, hex);
    if (j->error[0]) {
      br_warn("DELETE /v1/uploads: %s", j->error);
      return reply_error(req, E_STORE_ERROR, "%s", j->error);
    }
    return reply_json(
        req, MHD_HTTP_OK,
        json_pack("{s:s,s:s,s:b}", "upload_id", j->upload_id, "sha256", hex, "aborted", 1));
  }
  const char *slash = strrchr(req->path, '/');
  const char *id = slash ? slash + 1 : "";
  const char *hex = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "sha256");
  size_t idlen = strlen(id);
  int printable = idlen > 0 && idlen <= UPLOAD_ID_MAX;
  for (size_t i = 0; printable && i < idlen; i++)
    printable = (unsigned char)id[i] > ' ' && id[i] != 0x7f;
  if (!printable) {
    br_info("DELETE /v1/uploads refused: a bad upload id");
    return reply_error(req, E_BAD_REQUEST, "an upload id is 1 to %d printable characters",
                       UPLOAD_ID_MAX);
  }
  struct abort_job *j = calloc(1, sizeof *j);
  if (!j) return reply_error(req, E_INTERNAL, "out of memory");
  if (!hex || br_blob_id_parse(hex, strlen(hex), j->digest) < 0) {
    free(j);
    br_info("DELETE /v1/uploads refused: no sha256");
    return reply_error(req, E_BAD_HASH,
                       "?sha256= names the blob of the upload: 64 lowercase hex digits");
  }
  memcpy(j->upload_id, id, idlen + 1);
  req->job_data = j;
  req->job_fn = abort_run;
  if (request_finish_async(req, JOB_SLOW) < 0)
    return reply_error(req, E_NOT_READY, "the server is stopping");
  return MHD_YES;
}
