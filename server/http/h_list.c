/* GET /v1/blobs?after=HEX&limit=N[&state=live|quarantined]: the index in key order, one bounded
 * page per request, for exports, notebooks and audits. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "http/httpd.h"

#define LIST_DEFAULT_LIMIT 1000
#define LIST_MAX_LIMIT 10000

static const char *query_arg(struct request *req, const char *name) {
  return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

/* Appends one record to the page array given as ud. */
static int add_entry(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  json_t *entry = blob_record_json(digest, rec);
  return !entry || json_array_append_new(ud, entry) != 0;
}

enum MHD_Result list_get(struct request *req) {
  const char *after_s = query_arg(req, "after");
  const char *limit_s = query_arg(req, "limit");
  const char *state_s = query_arg(req, "state");
  uint8_t after[BR_SHA256_LEN], next[BR_SHA256_LEN];
  unsigned long limit = LIST_DEFAULT_LIMIT;
  int state = -1, has_next = 0;
  if (after_s && *after_s && br_blob_id_parse(after_s, strlen(after_s), after) < 0)
    return reply_error(req, E_BAD_HASH, "after must be 64 lowercase hex digits");
  if (limit_s) {
    char *end = NULL;
    errno = 0;
    limit = strtoul(limit_s, &end, 10);
    if (errno || end == limit_s || *end || limit_s[0] == '-' || limit_s[0] == '+' || limit < 1 ||
        limit > LIST_MAX_LIMIT)
      return reply_error(req, E_BAD_REQUEST, "limit must be a number from 1 to %d", LIST_MAX_LIMIT);
  }
  if (state_s) {
    if (!strcmp(state_s, "live"))
      state = BR_STATE_LIVE;
    else if (!strcmp(state_s, "quarantined"))
      state = BR_STATE_QUARANTINED;
    else
      return reply_error(req, E_BAD_REQUEST, "state must be live or quarantined");
  }
  json_t *blobs = json_array();
  if (!blobs) return reply_error(req, E_INTERNAL, "out of memory");
  br_err err;
  if (br_index_list_after(req->srv->index, after_s && *after_s ? after : NULL, limit, state,
                          add_entry, blobs, next, &has_next, &err) < 0) {
    json_decref(blobs);
    return reply_error(req, E_INTERNAL, "%s", err.msg);
  }
  json_t *next_j = json_null();
  if (has_next) {
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(next, hex);
    next_j = json_string(hex);
  }
  return reply_json(req, MHD_HTTP_OK, json_pack("{s:o,s:o}", "blobs", blobs, "next", next_j));
}
