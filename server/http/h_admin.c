/* The admin's changes of one blob's state: DELETE /v1/blobs/{hash} (quarantine, "hold") and
 * POST /v1/blobs/{hash}/restore. */
#include <stdio.h>
#include <string.h>

#include "core/server.h"
#include "http/handlers.h"

/* DELETE /v1/blobs/{hash} (HOLD) and POST /v1/blobs/{hash}/restore (RELEASE), under the blob's
 * lock so that they cannot interleave with reconcile's final delete. */
static enum MHD_Result change_state(struct request *req, enum br_change_kind kind) {
  const char *reason = NULL;
  if (kind == BR_CHANGE_HOLD) {
    reason = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "reason");
    if (!reason || !*reason) reason = "quarantined by an admin";
    const char *why = br_header_text_check(reason, BR_MAX_REASON); /* echoed in replies, logs */
    if (why)
      return reply_error(req, E_BAD_REQUEST,
                         "reason: %s (at most %d bytes, no control "
                         "characters)",
                         why, BR_MAX_REASON);
  }
  br_change ch = {.kind = kind, .reason = reason};
  memcpy(ch.digest, req->digest, BR_SHA256_LEN);
  br_err err;
  if (br_server_lock_blob(req->srv, req->digest, 1) < 0)
    return reply_error(req, E_INDEX_UNAVAILABLE,
                       "the blob's lock cannot be had: the index database is unavailable");
  int rc = br_index_apply_changes(req->srv->index, &ch, 1, br_now_ms(), &err);
  br_record rec;
  int grc = rc == 0 ? br_index_get_latest(req->srv->index, req->digest, &rec, &err) : -1;
  br_server_lock_blob(req->srv, req->digest, 0);
  if (rc < 0) return reply_error(req, index_error(rc), "%s", err.msg);
  if (grc > 0) return reply_error(req, E_NOT_FOUND, "no such blob");
  if (grc < 0) return reply_error(req, index_error(grc), "%s", err.msg);
  if (rec.state == BR_STATE_DELETING)
    return reply_error(req, E_BLOB_DELETING,
                       "the blob is being deleted for good: its bytes are gone or going; upload "
                       "it again");
  if (kind == BR_CHANGE_HOLD && ch.applied) br_server_blob_gone(req->srv, req->digest);
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(req->digest, hex);
  br_info("blob %s: %s by an admin%s%s", hex, kind == BR_CHANGE_HOLD ? "quarantined" : "restored",
          reason ? ": " : "", reason ? reason : "");
  return reply_json(req, MHD_HTTP_OK, blob_record_json(req->digest, &rec));
}

enum MHD_Result blob_hold(struct request *req) { return change_state(req, BR_CHANGE_HOLD); }
enum MHD_Result blob_release(struct request *req) { return change_state(req, BR_CHANGE_RELEASE); }
