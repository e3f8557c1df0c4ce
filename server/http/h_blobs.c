/* /v1/blobs: uploads (PUT with the expected hash, POST with the hash computed here), reads
 * (GET/HEAD, proxied or redirected) and the record as JSON (/meta). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/blobcache.h"
#include "http/handlers.h"

static const char *header(struct request *req, const char *name) {
  return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

/* Answers a dedup hit with 200. The hit refreshes last_upload_ms (which protects the blob from
 * reconcile for the grace period) durably before the answer, on a finisher thread so that no
 * network thread waits for the disk, unless it was refreshed less than dedup_touch_interval ago:
 * then the hit changes nothing and is answered at once. */
static enum MHD_Result answer_dedup(struct request *req, const br_record *rec) {
  uint64_t now = br_now_ms();
  req->received = rec->size;
  if (rec->last_upload_ms > now ||
      now - rec->last_upload_ms < req->srv->cfg->dedup_touch_interval_ms) {
    atomic_fetch_add(&req->http->uploads_dedup, 1);
    return reply_json(req, MHD_HTTP_OK, upload_result_json(req->digest, rec->size, 1));
  }
  if (request_finish_async(req, JOB_TOUCH) < 0)
    return reply_error(req, E_NOT_READY, "the server is stopping");
  return MHD_YES;
}

/* Checks Content-Type and Content-Length and prepares hashing; shared by PUT and POST. No type,
 * or application/octet-stream, asks for the type to be detected from the first bytes. */
static enum MHD_Result upload_begin_common(struct request *req) {
  const char *ct = header(req, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (!ct || !*ct) ct = "application/octet-stream";
  const char *why = br_header_content_type_check(ct); /* it is sent back with every read */
  if (why) return reply_error(req, E_BAD_CONTENT_TYPE, "Content-Type: %s", why);
  memcpy(req->content_type, ct, strlen(ct) + 1);
  req->sniff_wanted = br_sniff_wanted(ct);

  req->declared_length = UINT64_MAX;
  const char *cl = header(req, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (cl) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(cl, &end, 10);
    if (errno || end == cl || *end || cl[0] == '-')
      return reply_error(req, E_BAD_REQUEST, "Content-Length is not a number");
    req->declared_length = v;
    if (v > req->srv->cfg->max_blob_size)
      return reply_error(req, E_TOO_LARGE, "the blob is %llu bytes, over the limit of %" PRIu64, v,
                         req->srv->cfg->max_blob_size);
  }
  req->sha = EVP_MD_CTX_new();
  if (!req->sha || !EVP_DigestInit_ex(req->sha, EVP_sha256(), NULL))
    return reply_error(req, E_INTERNAL, "cannot start SHA-256");
  return MHD_YES;
}

static enum MHD_Result open_writer(struct request *req) {
  br_err err;
  req->store = req->srv->upload_store;
  errno = 0;
  req->writer = br_store_write_begin(req->store, &err);
  if (!req->writer) {
    br_server_store_error(req->srv, req->store, STORE_OP_WRITE);
    return reply_error(req, store_error_code(errno), "%s", err.msg);
  }
  if (!req->sniff_wanted) br_store_write_content_type(req->writer, req->content_type);
  if (req->has_digest) { /* PUT: the key is known before the body */
    char key[BR_MAX_KEY + 1];
    if (br_store_default_key(req->store, req->digest, key, sizeof key))
      br_store_write_key_hint(req->writer, key);
  }
  return MHD_YES;
}

/* An upload of a blob an admin quarantined is refused, not acknowledged: the client could not read
 * what it was told is stored (a blob reconcile quarantined is restored by an upload instead). */
static enum MHD_Result refuse_held(struct request *req) {
  return reply_error(req, E_QUARANTINED,
                     "the blob is quarantined by an admin: uploads are refused until it is "
                     "restored (POST /v1/blobs/{hash}/restore)");
}

/* Queues the durable attach of req->digest to its lease on a finisher thread (no network thread
 * waits for the disk); the upload goes on in upload_finish once it is done. */
static enum MHD_Result queue_lease_attach(struct request *req) {
  req->lease_job = 1;
  req->job_fn = lease_attach_job;
  if (request_finish_async(req, JOB_CALL) < 0) {
    request_free_upload(req);
    return reply_error(req, E_NOT_READY, "the server is stopping; nothing was kept");
  }
  return MHD_YES;
}

/* PUT before its body, the lease (if any) attached: the record decides whether the body is kept
 * (new), hashed only (a dedup hit: the hash is checked before it is answered) or refused. */
static enum MHD_Result put_decide(struct request *req) {
  br_record rec;
  br_err err;
  int rc = br_index_get(req->srv->index, req->digest, &rec, &err);
  if (rc < 0) return reply_error(req, index_error(rc), "%s", err.msg);
  if (rc == 0 && rec.state == BR_STATE_HELD) return refuse_held(req);
  if (rc == 0 && rec.state == BR_STATE_LIVE) {
    const char *expect = header(req, MHD_HTTP_HEADER_EXPECT);
    if (expect && !strcasecmp(expect, "100-continue")) {
      req->touch_before_body = 1;
      return answer_dedup(req, &rec);
    }
    req->discard = 1; /* the body is on its way: hash it, keep nothing */
    return MHD_YES;
  }
  req->absent_before_body = rc == 1 && br_server_off_stripe(req->srv) == 0;
  return open_writer(req);
}

enum MHD_Result put_begin(struct request *req) {
  enum MHD_Result r = upload_begin_common(req);
  if (req->phase == PHASE_ANSWERED || r != MHD_YES) return r;
  r = lease_take(req); /* an unknown lease refuses the upload before its body */
  if (req->phase == PHASE_ANSWERED || r != MHD_YES) return r;
  if (req->lease[0]) return queue_lease_attach(req); /* attached before the record is read */
  return put_decide(req);
}

enum MHD_Result post_begin(struct request *req) {
  enum MHD_Result r = upload_begin_common(req);
  if (req->phase == PHASE_ANSWERED || r != MHD_YES) return r;
  r = lease_take(req);
  if (req->phase == PHASE_ANSWERED || r != MHD_YES) return r;
  return open_writer(req);
}

/* Keeps a copy of the first BR_SNIFF_BYTES of the body, and detects once they are in. */
static void sniff_gather(struct request *req, const char *data, size_t len) {
  if (!req->sniff_wanted || !req->writer) return;
  if (!req->sniff_buf && !(req->sniff_buf = malloc(BR_SNIFF_BYTES))) {
    req->sniff_wanted = 0; /* no memory for 4 KiB: keep the type the client gave */
    return;
  }
  size_t n = BR_SNIFF_BYTES - req->sniff_len < len ? BR_SNIFF_BYTES - req->sniff_len : len;
  memcpy(req->sniff_buf + req->sniff_len, data, n);
  req->sniff_len += n;
  if (req->sniff_len == BR_SNIFF_BYTES) request_sniff_finish(req); /* S3 may need it now */
}

int upload_body(struct request *req, const char *data, size_t len) {
  req->received += len;
  atomic_fetch_add(&req->http->bytes_in, len);
  if (req->received > req->srv->cfg->max_blob_size) {
    request_fail(req, E_TOO_LARGE, "the blob is over the limit of %" PRIu64 " bytes",
                 req->srv->cfg->max_blob_size);
    request_free_upload(req);
    return -1;
  }
  uint64_t t0 = br_mono_ns();
  EVP_DigestUpdate(req->sha, data, len);
  uint64_t t1 = br_mono_ns();
  atomic_fetch_add(&req->http->upload_step_ns[STEP_HASH], t1 - t0);
  if (req->writer) {
    sniff_gather(req, data, len); /* before the write that may fill the first S3 part */
    br_err err;
    int rc = br_store_write(req->writer, data, len, &err);
    atomic_fetch_add(&req->http->upload_step_ns[STEP_STORE_WRITE], br_mono_ns() - t1);
    if (rc < 0) {
      br_server_store_error(req->srv, req->store, STORE_OP_WRITE);
      request_fail(req, store_error_code(br_store_writer_errno(req->writer)), "%s", err.msg);
      request_free_upload(req);
      return -1;
    }
    if (br_store_write_backlogged(req->writer, 0)) request_wait_spool(req); /* S3 is behind */
  }
  return 0;
}

static enum MHD_Result upload_decide(struct request *req);

enum MHD_Result upload_finish(struct request *req) {
  if (req->phase == PHASE_RESUMED && req->lease_job) { /* the attach is done (or refused) */
    req->lease_job = 0;
    if (req->finish_rc < 0) {
      request_free_upload(req);
      return reply_error(req, req->finish_error, "%s", req->finish_message);
    }
    req->phase = PHASE_BODY;
    if (req->route->begin == put_begin && !req->sha_done) /* PUT: before its body */
      return put_decide(req); /* no reply: the body follows (100 Continue if asked) */
    return upload_decide(req);
  }
  if (req->phase == PHASE_RESUMED) {
    enum MHD_Result r;
    if (req->job == JOB_TOUCH && req->finish_rc == 0 && req->gone) {
      /* deleted or quarantined since we looked: the bytes are needed after all */
      if (req->touch_before_body) {
        req->touch_before_body = 0;
        req->received = 0;
        req->phase = PHASE_BODY;
        return open_writer(req); /* no reply: libmicrohttpd sends 100 Continue, body follows */
      }
      return reply_error(req, E_TRY_AGAIN, "the blob changed state during the upload; retry");
    }
    if (req->finish_rc < 0) {
      r = reply_error(req, req->finish_error, "%s", req->finish_message);
    } else {
      atomic_fetch_add(req->created ? &req->http->uploads_created : &req->http->uploads_dedup, 1);
      r = reply_json(req, req->created ? MHD_HTTP_CREATED : MHD_HTTP_OK,
                     upload_result_json(req->digest, req->received, !req->created));
    }
    return r;
  }
  uint8_t got[BR_SHA256_LEN];
  unsigned int glen = 0;
  EVP_DigestFinal_ex(req->sha, got, &glen);
  if (req->has_digest) {
    if (memcmp(got, req->digest, BR_SHA256_LEN) != 0) {
      char hex[BR_HEX_LEN + 1];
      br_hex_encode(got, hex);
      request_free_upload(req);
      return reply_error(req, E_DIGEST_MISMATCH, "the body's SHA-256 is %s", hex);
    }
  } else {
    memcpy(req->digest, got, BR_SHA256_LEN);
    req->has_digest = 1;
  }
  if (req->writer) br_store_write_set_digest(req->writer, req->digest);
  req->sha_done = 1;
  /* POST: the hash is known now; attached (off this thread) before the record is read */
  if (req->lease[0] && req->route->begin == post_begin) return queue_lease_attach(req);
  return upload_decide(req);
}

/* After the body (hash checked, lease attached): held, a dedup hit, or made durable. A PUT that
 * found no record before its body, on a shared index, does not read it again (a round trip to the
 * database): the record may have appeared since on any node, which the index writer's decision
 * under the blob's lock handles (a dedup, or held stays held), as it must anyway for a record
 * that appears after this read. */
static enum MHD_Result upload_decide(struct request *req) {
  br_record rec;
  br_err err;
  int rc = req->absent_before_body && req->writer
               ? 1
               : br_index_get(req->srv->index, req->digest, &rec, &err);
  if (rc < 0) return reply_error(req, index_error(rc), "%s", err.msg);
  if (rc == 0 && rec.state == BR_STATE_HELD) {
    request_free_upload(req);
    return refuse_held(req);
  }
  if (rc == 0 && rec.state == BR_STATE_LIVE) {
    request_free_upload(req);
    return answer_dedup(req, &rec);
  }
  if (!req->writer) /* discarded body of a blob quarantined or gone meanwhile: send it again */
    return reply_error(req, E_TRY_AGAIN, "the blob changed state during the upload; retry");
  /* detection of a body shorter than BR_SNIFF_BYTES, fsync, rename, index commit on a finisher
   * thread (libmagic on text takes a while: not on a network thread); then this runs again */
  if (request_finish_async(req, JOB_UPLOAD) < 0) {
    request_free_upload(req);
    return reply_error(req, E_NOT_READY, "the server is stopping; nothing was kept");
  }
  return MHD_YES;
}

/* Does the small-blob cache hold the request's blob (checked against its hash when it went in)? */
static int blob_cached(struct request *req) {
  cached_blob *hit = blobcache_get(req->srv->cache, req->digest);
  if (hit) blobcache_release(hit);
  return hit != NULL;
}

enum MHD_Result blob_get(struct request *req) {
  br_record rec;
  br_err err;
  int rc = br_index_get(req->srv->index, req->digest, &rec, &err);
  if (rc < 0) return reply_error(req, index_error(rc), "%s", err.msg);
  if (rc > 0) return reply_error(req, E_NOT_FOUND, "no such blob");
  if (rec.state != BR_STATE_LIVE)
    return reply_error(req, E_QUARANTINED, "the blob is quarantined%s: %s",
                       rec.state == BR_STATE_HELD ? " by an admin" : "", rec.reason);
  const br_location *loc = br_record_primary(&rec);
  br_store *store = loc ? br_server_store(req->srv, loc->store) : NULL;
  if (!store)
    return reply_error(req, E_STORE_UNAVAILABLE, "the blob's store %s is not configured",
                       loc ? loc->store : "(none)");
  /* redirects are for GET: a HEAD is answered from the index (a presigned URL is GET-only), and
   * a small blob the cache holds is served from it while the store is unreachable */
  if (br_store_serve_mode(store) == BR_SERVE_REDIRECT && !req->proxy && !req->is_head &&
      !(br_store_unavailable(store) && blob_cached(req))) {
    char url[4096];
    uint64_t valid_ms;
    /* an active type goes where the answer is a download, or is proxied with our headers */
    int attachment = !br_content_type_is_passive(blob_content_type(&rec));
    int u = br_store_redirect_url(store, loc->key, attachment, blob_content_type(&rec), url,
                                  sizeof url, &valid_ms, &err);
    if (u == 0) return reply_redirect(req, url, valid_ms);
    if (u < 0) return reply_error(req, E_STORE_UNAVAILABLE, "%s", err.msg);
  }
  enum MHD_Result r = reply_blob(req, &rec, store, loc->key);
  if (req->phase == PHASE_ANSWERED && req->status >= 500) /* the store failed us */
    br_server_store_error(req->srv, store, STORE_OP_READ);
  return r;
}

enum MHD_Result blob_preview(struct request *req) {
  br_record rec;
  br_err err;
  int rc = br_index_get(req->srv->index, req->digest, &rec, &err);
  if (rc < 0) return reply_error(req, index_error(rc), "%s", err.msg);
  if (rc > 0) return reply_error(req, E_NOT_FOUND, "no such blob");
  if (rec.state == BR_STATE_DELETING) /* its bytes may be gone already */
    return reply_error(req, E_NOT_FOUND, "the blob is being deleted");
  const br_location *loc = br_record_primary(&rec);
  br_store *store = loc ? br_server_store(req->srv, loc->store) : NULL;
  if (!store)
    return reply_error(req, E_STORE_UNAVAILABLE, "the blob's store %s is not configured",
                       loc ? loc->store : "(none)");
  req->preview = 1; /* never a redirect: a presigned URL would outlive the admin's look */
  enum MHD_Result r = reply_blob(req, &rec, store, loc->key);
  if (req->phase == PHASE_ANSWERED && req->status >= 500)
    br_server_store_error(req->srv, store, STORE_OP_READ);
  return r;
}

enum MHD_Result blob_meta(struct request *req) {
  br_record rec;
  br_err err;
  int rc = br_index_get(req->srv->index, req->digest, &rec, &err);
  if (rc < 0) return reply_error(req, index_error(rc), "%s", err.msg);
  if (rc > 0) return reply_error(req, E_NOT_FOUND, "no such blob");
  return reply_json(req, MHD_HTTP_OK, blob_record_json(req->digest, &rec));
}
