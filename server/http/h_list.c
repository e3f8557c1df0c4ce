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

/* Appends one record to the page's text given as ud (a comma before all but the first). */
struct page {
  struct json_text t;
  size_t n;
};

static int add_entry(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  struct page *pg = ud;
  if (pg->n++) json_text_raw(&pg->t, ",", 1);
  return blob_record_text(&pg->t, digest, rec) != 0;
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
  /* the page is written as text (no jansson object per field: they were 90 % of an export's
   * server CPU); about 330 bytes a record */
  struct page pg = {{0}, 0};
  pg.t.buf = malloc(limit * 360 + 64);
  pg.t.cap = pg.t.buf ? limit * 360 + 64 : 0;
  json_text_raw(&pg.t, "{\"blobs\":[", 10);
  if (pg.t.failed) return reply_error(req, E_INTERNAL, "out of memory");
  br_err err;
  if (br_index_list_after(req->srv->index, after_s && *after_s ? after : NULL, limit, state,
                          add_entry, &pg, next, &has_next, &err) < 0) {
    free(pg.t.buf);
    return reply_error(req, E_INTERNAL, "%s", err.msg);
  }
  if (has_next) {
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(next, hex);
    json_text_raw(&pg.t, "],\"next\":\"", 10);
    json_text_raw(&pg.t, hex, BR_HEX_LEN);
    json_text_raw(&pg.t, "\"}", 2);
  } else {
    json_text_raw(&pg.t, "],\"next\":null}", 14);
  }
  return reply_json_text(req, MHD_HTTP_OK, &pg.t);
}
