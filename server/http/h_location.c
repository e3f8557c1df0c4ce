/* PUT /v1/blobs/{hash}/location: moving a blob between stores without a failed read (PRODUCT.md
 * invariant 7). The new copy is verified (its size and SHA-256, by re-reading it) on a slow-pool
 * thread and the primary switched in the index writer's transaction, conditional on the expected
 * current primary; the old location becomes `draining` (since the switch, kept in the record)
 * and the drain thread (core/drain.c) deletes it after drain_grace, durably across restarts. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/move.h"
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

/* Verifies `to` and switches (core/move.c). Runs on a slow-pool thread (request.c). */
static void move_run(struct request *req) {
  struct move_job *mj = req->job_data;
  struct br_move mv = {.expect = mj->expect, .to = mj->to};
  br_server_move_blob(req->srv, req->digest, &mv);
  static const enum br_api_error errs[] = {
      [BR_MOVE_OK] = E_INTERNAL,
      [BR_MOVE_NOT_FOUND] = E_NOT_FOUND,
      [BR_MOVE_CHANGED] = E_LOCATION_CHANGED,
      [BR_MOVE_VERIFY_FAILED] = E_VERIFY_FAILED,
      [BR_MOVE_UNAVAILABLE] = E_STORE_UNAVAILABLE,
      [BR_MOVE_FULL] = E_TOO_MANY_LOCATIONS,
      [BR_MOVE_KEY_TAKEN] = E_KEY_IN_USE,
      [BR_MOVE_INDEX_ERROR] = E_INTERNAL,
  };
  mj->ok = mv.result == BR_MOVE_OK;
  mj->error = mv.result == BR_MOVE_INDEX_ERROR ? index_error(mv.index_rc) : errs[mv.result];
  snprintf(mj->message, sizeof mj->message, "%s", mv.message);
  mj->after = mv.after;
  mj->verify_ms = mv.verify_ms;
  mj->switch_ms = mv.switch_ms;
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
  if (request_finish_async(req, JOB_SLOW) < 0)
    return reply_error(req, E_NOT_READY, "the server is stopping");
  return MHD_YES;
}
