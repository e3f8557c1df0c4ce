/* POST /v1/lookup: which of many hashes exist (size, URL) and which are missing. Also the
 * bounded JSON body reader shared by routes that take JSON. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "httpd.h"

#define MAX_JSON_DEPTH 32

/* Accumulates a JSON request body up to max_json_size. */
int json_body(struct request *req, const char *data, size_t len) {
  uint64_t max = req->srv->cfg->max_json_size;
  if (req->body_len + len > max) {
    reply_error(req, E_BODY_TOO_LARGE, "the JSON body is over %" PRIu64 " bytes", max);
    return -1;
  }
  if (req->body_len + len + 1 > req->body_cap) {
    size_t cap = req->body_cap ? req->body_cap : 4096;
    while (cap < req->body_len + len + 1) cap *= 2;
    char *grown = realloc(req->body, cap);
    if (!grown) {
      reply_error(req, E_INTERNAL, "out of memory");
      return -1;
    }
    req->body = grown;
    req->body_cap = cap;
  }
  memcpy(req->body + req->body_len, data, len);
  req->body_len += len;
  return 0;
}

/* Nesting depth of JSON text (brackets outside strings), so that hostile nesting is refused
 * before the recursive parser sees it. */
static int json_depth(const char *s, size_t len) {
  int depth = 0, max = 0, in_string = 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (in_string) {
      if (c == '\\')
        i++;
      else if (c == '"')
        in_string = 0;
    } else if (c == '"') {
      in_string = 1;
    } else if (c == '[' || c == '{') {
      if (++depth > max) max = depth;
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
  return max;
}

/* Parses the body as a JSON object; answers 400 bad_json itself and returns NULL on failure. */
static json_t *parse_json_body(struct request *req) {
  if (json_depth(req->body ? req->body : "", req->body_len) > MAX_JSON_DEPTH) {
    reply_error(req, E_BAD_JSON, "JSON nested deeper than %d levels", MAX_JSON_DEPTH);
    return NULL;
  }
  json_error_t jerr;
  json_t *root = json_loadb(req->body ? req->body : "", req->body_len, JSON_REJECT_DUPLICATES,
                            &jerr);
  if (!root) {
    reply_error(req, E_BAD_JSON, "invalid JSON at line %d column %d: %s", jerr.line,
                jerr.column, jerr.text);
    return NULL;
  }
  if (!json_is_object(root)) {
    json_decref(root);
    reply_error(req, E_BAD_JSON, "the body must be a JSON object");
    return NULL;
  }
  return root;
}

enum MHD_Result lookup_finish(struct request *req) {
  json_t *root = parse_json_body(req);
  if (!root) return MHD_YES;
  enum MHD_Result r;
  json_t *hashes = json_object_get(root, "hashes");
  json_t *found = NULL, *missing = NULL;
  if (!json_is_array(hashes)) {
    r = reply_error(req, E_BAD_JSON, "\"hashes\" must be an array of strings");
    goto done;
  }
  size_t n = json_array_size(hashes);
  if (n > req->srv->cfg->max_lookup_hashes) {
    r = reply_error(req, E_TOO_MANY_HASHES, "%zu hashes, at most %" PRIu64 " per call", n,
                    req->srv->cfg->max_lookup_hashes);
    goto done;
  }
  found = json_array();
  missing = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *h = json_array_get(hashes, i);
    uint8_t digest[BR_SHA256_LEN];
    if (!json_is_string(h)) {
      r = reply_error(req, E_BAD_JSON, "hashes[%zu] is not a string", i);
      goto done;
    }
    if (br_blob_id_parse(json_string_value(h), json_string_length(h), digest) < 0) {
      r = reply_error(req, E_BAD_HASH, "hashes[%zu] is not 64 lowercase hex digits", i);
      goto done;
    }
    br_record rec;
    br_err err;
    int rc = br_index_get(req->srv->index, digest, &rec, &err);
    if (rc < 0) {
      r = reply_error(req, E_INTERNAL, "%s", err.msg);
      goto done;
    }
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(digest, hex);
    if (rc == 0 && rec.state == BR_STATE_LIVE) {
      char url[80];
      snprintf(url, sizeof url, "/v1/blobs/%s", hex);
      json_array_append_new(found, json_pack("{s:s,s:I,s:s}", "sha256", hex, "size",
                                             (json_int_t)rec.size, "url", url));
    } else {
      json_array_append_new(missing, json_string(hex));
    }
  }
  r = reply_json(req, MHD_HTTP_OK, json_pack("{s:O,s:O}", "found", found, "missing", missing));
done:
  json_decref(found);
  json_decref(missing);
  json_decref(root);
  return r;
}
