/* Every HTTP reply of the daemon: JSON bodies, JSON errors, redirects and blob bodies with
 * conditional requests and ranges (single from the file with sendfile, multiple as
 * multipart/byteranges). */
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/blobcache.h"
#include "core/suspect.h"
#include "blobref/range.h"
#include "http/httpd.h"
#include "http/proxy.h"
#include "http/rehash.h"

static const struct {
  const char *code;
  unsigned status;
} errors[E__COUNT] = {
    [E_BAD_HASH] = {"bad_hash", 400},
    [E_DIGEST_MISMATCH] = {"digest_mismatch", 400},
    [E_TOO_LARGE] = {"too_large", 413},
    [E_BODY_TOO_LARGE] = {"body_too_large", 413},
    [E_TOO_MANY_HASHES] = {"too_many_hashes", 413},
    [E_NO_SPACE] = {"no_space", 507},
    [E_INDEX_FULL] = {"index_full", 507},
    [E_INDEX_UNAVAILABLE] = {"index_unavailable", 503},
    [E_NOT_FOUND] = {"not_found", 404},
    [E_NO_ROUTE] = {"no_route", 404},
    [E_METHOD_NOT_ALLOWED] = {"method_not_allowed", 405},
    [E_QUARANTINED] = {"quarantined", 410},
    [E_BAD_RANGE] = {"bad_range", 416},
    [E_RANGE_NOT_SATISFIABLE] = {"range_not_satisfiable", 416},
    [E_URL_TOO_LONG] = {"url_too_long", 414},
    [E_HEADERS_TOO_LARGE] = {"headers_too_large", 431},
    [E_BAD_JSON] = {"bad_json", 400},
    [E_BAD_CONTENT_TYPE] = {"bad_content_type", 400},
    [E_BAD_REQUEST] = {"bad_request", 400},
    [E_UNAUTHORIZED] = {"unauthorized", 401},
    [E_FORBIDDEN] = {"forbidden", 403},
    [E_NOT_READY] = {"not_ready", 503},
    [E_TRY_AGAIN] = {"try_again", 503},
    [E_SPOOL_FULL] = {"spool_full", 503},
    [E_STORE_UNAVAILABLE] = {"store_unavailable", 503},
    [E_STORE_ERROR] = {"store_error", 502},
    [E_RECONCILE_RUNNING] = {"reconcile_running", 409},
    [E_LOCATION_CHANGED] = {"location_changed", 409},
    [E_VERIFY_FAILED] = {"verify_failed", 422},
    [E_TOO_MANY_LOCATIONS] = {"too_many_locations", 409},
    [E_KEY_IN_USE] = {"key_in_use", 409},
    [E_BLOB_DELETING] = {"blob_deleting", 409},
    [E_JOB_CONFLICT] = {"job_conflict", 409},
    [E_LEASE_NOT_FOUND] = {"lease_not_found", 404},
    [E_LEASE_FULL] = {"lease_full", 409},
    [E_LISTS_NOT_RECORDED] = {"lists_not_recorded", 404},
    [E_INTERNAL] = {"internal", 500},
};

const char *br_api_error_code(enum br_api_error e) { return errors[e].code; }
unsigned br_api_error_status(enum br_api_error e) { return errors[e].status; }

enum br_api_error index_error(int rc) {
  return rc == BR_INDEX_FULL          ? E_INDEX_FULL
         : rc == BR_INDEX_NO_SPACE    ? E_NO_SPACE
         : rc == BR_INDEX_KEY_TAKEN   ? E_KEY_IN_USE
         : rc == BR_INDEX_UNAVAILABLE ? E_INDEX_UNAVAILABLE
                                      : E_INTERNAL;
}

enum br_api_error store_error_code(int e) {
  switch (e) {
    case ENOSPC:
    case EDQUOT:
      return E_NO_SPACE;
    case EHOSTUNREACH:
      return E_STORE_UNAVAILABLE;
    case EBUSY:
      return E_SPOOL_FULL;
    case EPROTO:
      return E_STORE_ERROR;
    default:
      return E_INTERNAL;
  }
}

enum MHD_Result reply_response(struct request *req, unsigned status, struct MHD_Response *resp) {
  if (!resp) return MHD_NO;
  if (req->close_after || atomic_load(&req->http->draining))
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  if (req->request_id[0]) MHD_add_response_header(resp, "X-Request-Id", req->request_id);
  req->status = status;
  req->phase = PHASE_ANSWERED;
  enum MHD_Result r = MHD_queue_response(req->conn, status, resp);
  MHD_destroy_response(resp);
  return r;
}

/* A response whose body is body as compact JSON plus a newline; steals body. NULL on failure.
 * *size: the body's length (for the access log). */
static struct MHD_Response *json_response(json_t *body, uint64_t *size) {
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (!text) return NULL;
  size_t len = strlen(text);
  text[len] = '\n'; /* replaces the NUL: the body is len + 1 bytes, not a C string any more */
  *size = len + 1;
  struct MHD_Response *resp = MHD_create_response_from_buffer(len + 1, text, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(text);
    return NULL;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  return resp;
}

static json_t *error_json(enum br_api_error e, const char *msg) {
  return json_pack("{s:{s:s,s:s}}", "error", "code", errors[e].code, "message", msg);
}

json_t *error_body(enum br_api_error e, const char *fmt, ...) {
  char msg[sizeof(br_err) + 256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return error_json(e, msg);
}

enum MHD_Result reply_json(struct request *req, unsigned status, json_t *body) {
  return reply_response(req, status, json_response(body, &req->bytes_out));
}

enum MHD_Result reply_error(struct request *req, enum br_api_error e, const char *fmt, ...) {
  char msg[sizeof(br_err) + 256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  unsigned status = errors[e].status;
  if (status >= 500)
    br_error("%s %s: %u %s: %s", req->method, req->route ? req->route->pattern : "-", status,
             errors[e].code, msg);
  else if (e != E_NOT_FOUND)
    br_info("%s %s: %u %s: %s", req->method, req->route ? req->route->pattern : "-", status,
            errors[e].code, msg);
  struct MHD_Response *resp = json_response(error_json(e, msg), &req->bytes_out);
  if (!resp) return MHD_NO;
  if (e == E_METHOD_NOT_ALLOWED && req->route) {
    char allow[128] = "";
    const struct route *routes = req->http->routes;
    for (size_t i = 0; i < req->http->nroutes; i++)
      if (!strcmp(routes[i].pattern, req->route->pattern)) {
        if (*allow) strncat(allow, ", ", sizeof allow - strlen(allow) - 1);
        strncat(allow, routes[i].method, sizeof allow - strlen(allow) - 1);
        if (!strcmp(routes[i].method, MHD_HTTP_METHOD_GET))
          strncat(allow, ", HEAD", sizeof allow - strlen(allow) - 1);
      }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
  }
  if (e == E_UNAUTHORIZED) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
  if (req->retry_after_s) {
    char ra[16];
    snprintf(ra, sizeof ra, "%u", req->retry_after_s);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
  } else if (e == E_TRY_AGAIN || e == E_NOT_READY || e == E_SPOOL_FULL) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  }
  return reply_response(req, status, resp);
}

enum MHD_Result reply_redirect(struct request *req, const char *url, uint64_t valid_ms) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
  if (!resp) return MHD_NO;
  char cc[64] = "private, max-age=", digits[24];
  uint64_t max_age_ms = req->srv->cfg->cache_max_age_ms;
  if (valid_ms != UINT64_MAX && max_age_ms > valid_ms / 2) max_age_ms = valid_ms / 2;
  /* the seconds written without printf, which was a tenth of a redirect's CPU */
  size_t nd = 0;
  uint64_t secs = max_age_ms / 1000;
  do digits[nd++] = (char)('0' + secs % 10);
  while ((secs /= 10) && nd < sizeof digits);
  size_t at = strlen(cc);
  while (nd) cc[at++] = digits[--nd];
  cc[at] = '\0';
  MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, url);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, cc);
  return reply_response(req, MHD_HTTP_TEMPORARY_REDIRECT, resp);
}

json_t *blob_json(const uint8_t digest[BR_SHA256_LEN], uint64_t size) {
  char hex[BR_HEX_LEN + 1], url[80];
  br_hex_encode(digest, hex);
  snprintf(url, sizeof url, "/v1/blobs/%s", hex);
  return json_pack("{s:s,s:I,s:s}", "sha256", hex, "size", (json_int_t)size, "url", url);
}

json_t *upload_result_json(const uint8_t digest[BR_SHA256_LEN], uint64_t size, int dedup) {
  json_t *j = blob_json(digest, size);
  if (j) json_object_set_new(j, "dedup", json_boolean(dedup));
  return j;
}

static const char *role_name(enum br_role r) {
  return r == BR_ROLE_PRIMARY ? "primary" : r == BR_ROLE_COPY ? "copy" : "draining";
}

json_t *blob_record_json(const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  char hex[BR_HEX_LEN + 1], created[40], uploaded[40], changed[40];
  br_hex_encode(digest, hex);
  br_format_time_ms(rec->created_ms, created, sizeof created);
  br_format_time_ms(rec->last_upload_ms, uploaded, sizeof uploaded);
  br_format_time_ms(rec->state_ms, changed, sizeof changed);
  json_t *locs = json_array();
  for (int i = 0; i < rec->nlocations; i++) {
    const br_location *l = &rec->locations[i];
    json_t *v = json_null();
    if (l->verified_at_ms) {
      char t[40];
      br_format_time_ms(l->verified_at_ms, t, sizeof t);
      v = json_string(t);
    }
    json_array_append_new(locs, json_pack("{s:s,s:s,s:s,s:o}", "store", l->store, "key", l->key,
                                          "role", role_name(l->role), "verified_at", v));
  }
  json_t *body = json_pack("{s:s,s:I,s:s,s:s,s:s,s:s,s:o}", "sha256", hex, "size",
                           (json_int_t)rec->size, "content_type", rec->content_type, "created_at",
                           created, "last_upload_at", uploaded, "state",
                           rec->state == BR_STATE_LIVE       ? "live"
                           : rec->state == BR_STATE_DELETING ? "deleting"
                                                             : "quarantined",
                           "locations", locs);
  if (body && rec->state != BR_STATE_LIVE)
    json_object_set_new(body, "quarantine",
                        json_pack("{s:s,s:s,s:s}", "reason", rec->reason, "at", changed, "by",
                                  rec->state == BR_STATE_HELD ? "admin" : "reconcile"));
  return body;
}

/* ---- JSON text for pages of records ------------------------------------------------------- */

static int text_reserve(struct json_text *t, size_t n) {
  if (t->failed) return -1;
  if (t->len + n + 1 <= t->cap) return 0;
  size_t cap = t->cap ? t->cap : 4096;
  while (cap < t->len + n + 1) cap *= 2;
  char *grown = realloc(t->buf, cap);
  if (!grown) {
    t->failed = 1;
    return -1;
  }
  t->buf = grown;
  t->cap = cap;
  return 0;
}

void json_text_raw(struct json_text *t, const char *s, size_t n) {
  if (text_reserve(t, n) < 0) return;
  memcpy(t->buf + t->len, s, n);
  t->len += n;
}

/* The length of the UTF-8 sequence at s (as jansson's utf8 check accepts it), or 0. */
static size_t utf8_len(const unsigned char *s) {
  unsigned c = s[0];
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2, cp = c & 0x1F;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3, cp = c & 0x0F;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4, cp = c & 0x07;
  else
    return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n;
}

void json_text_str(struct json_text *t, const char *s) {
  static const char hexd[] = "0123456789ABCDEF";
  const unsigned char *p = (const unsigned char *)s;
  if (text_reserve(t, strlen(s) * 6 + 2) < 0) return; /* the worst case: every byte \u00XX */
  char *o = t->buf + t->len;
  *o++ = '"';
  while (*p) {
    unsigned c = *p;
    if (c >= 0x80) {
      size_t n = utf8_len(p);
      if (!n) {
        t->failed = 1;
        return;
      }
      memcpy(o, p, n);
      o += n, p += n;
      continue;
    }
    p++;
    if (c == '"' || c == '\\') {
      *o++ = '\\', *o++ = (char)c;
    } else if (c >= 0x20) {
      *o++ = (char)c;
    } else {
      *o++ = '\\';
      switch (c) {
        case '\b':
          *o++ = 'b';
          break;
        case '\f':
          *o++ = 'f';
          break;
        case '\n':
          *o++ = 'n';
          break;
        case '\r':
          *o++ = 'r';
          break;
        case '\t':
          *o++ = 't';
          break;
        default:
          *o++ = 'u', *o++ = '0', *o++ = '0', *o++ = hexd[c >> 4], *o++ = hexd[c & 15];
      }
    }
  }
  *o++ = '"';
  t->len = (size_t)(o - t->buf);
}

static void text_lit(struct json_text *t, const char *s) { json_text_raw(t, s, strlen(s)); }

int blob_record_text(struct json_text *t, const uint8_t digest[BR_SHA256_LEN],
                     const br_record *rec) {
  char hex[BR_HEX_LEN + 1], tm[40], num[80];
  br_hex_encode(digest, hex);
  text_lit(t, "{\"sha256\":\"");
  json_text_raw(t, hex, BR_HEX_LEN);
  snprintf(num, sizeof num,
           "\",\"size\":%" JSON_INTEGER_FORMAT ",\"content_type\":", (json_int_t)rec->size);
  text_lit(t, num);
  json_text_str(t, rec->content_type);
  br_format_time_ms(rec->created_ms, tm, sizeof tm);
  text_lit(t, ",\"created_at\":\"");
  text_lit(t, tm);
  br_format_time_ms(rec->last_upload_ms, tm, sizeof tm);
  text_lit(t, "\",\"last_upload_at\":\"");
  text_lit(t, tm);
  text_lit(t, rec->state == BR_STATE_LIVE       ? "\",\"state\":\"live\",\"locations\":["
              : rec->state == BR_STATE_DELETING ? "\",\"state\":\"deleting\",\"locations\":["
                                                : "\",\"state\":\"quarantined\",\"locations\":[");
  for (int i = 0; i < rec->nlocations; i++) {
    const br_location *l = &rec->locations[i];
    text_lit(t, i ? ",{\"store\":" : "{\"store\":");
    json_text_str(t, l->store);
    text_lit(t, ",\"key\":");
    json_text_str(t, l->key);
    text_lit(t, ",\"role\":\"");
    text_lit(t, role_name(l->role));
    if (l->verified_at_ms) {
      br_format_time_ms(l->verified_at_ms, tm, sizeof tm);
      text_lit(t, "\",\"verified_at\":\"");
      text_lit(t, tm);
      text_lit(t, "\"}");
    } else {
      text_lit(t, "\",\"verified_at\":null}");
    }
  }
  text_lit(t, "]");
  if (rec->state != BR_STATE_LIVE) {
    text_lit(t, ",\"quarantine\":{\"reason\":");
    json_text_str(t, rec->reason);
    br_format_time_ms(rec->state_ms, tm, sizeof tm);
    text_lit(t, ",\"at\":\"");
    text_lit(t, tm);
    text_lit(t, rec->state == BR_STATE_HELD ? "\",\"by\":\"admin\"}" : "\",\"by\":\"reconcile\"}");
  }
  text_lit(t, "}");
  return t->failed ? -1 : 0;
}

enum MHD_Result reply_json_text(struct request *req, unsigned status, struct json_text *t) {
  json_text_raw(t, "\n", 1);
  struct MHD_Response *resp =
      t->failed ? NULL : MHD_create_response_from_buffer(t->len, t->buf, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(t->buf);
    t->buf = NULL;
    return reply_error(req, E_INTERNAL, "out of memory");
  }
  t->buf = NULL;
  req->bytes_out = t->len;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  return reply_response(req, status, resp);
}

/* ---- blob bodies ---------------------------------------------------------------------------- */

/* The blob's hex id, its ETag ("hex") and its Repr-Digest value (sha-256=:base64:), without
 * printf: every read needs them. */
static void blob_etag_repr(const uint8_t digest[BR_SHA256_LEN], char hex[BR_HEX_LEN + 1],
                           char etag[BR_HEX_LEN + 3], char repr[80]) {
  br_hex_encode(digest, hex);
  etag[0] = '"';
  memcpy(etag + 1, hex, BR_HEX_LEN);
  etag[BR_HEX_LEN + 1] = '"';
  etag[BR_HEX_LEN + 2] = '\0';
  memcpy(repr, "sha-256=:", 9);
  int n = EVP_EncodeBlock((unsigned char *)repr + 9, digest, BR_SHA256_LEN); /* 44 characters */
  repr[9 + n] = ':';
  repr[10 + n] = '\0';
}

/* Does an If-None-Match value list our ETag? (weak comparison: W/ is ignored) */
static int etag_listed(const char *value, const char *etag, int allow_star) {
  if (!value) return 0;
  size_t elen = strlen(etag);
  const char *p = value;
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    if (allow_star && *p == '*') return 1;
    if (!strncmp(p, "W/", 2)) p += 2; /* weak comparison is fine for If-None-Match */
    if (!strncmp(p, etag, elen) &&
        (p[elen] == '\0' || p[elen] == ',' || p[elen] == ' ' || p[elen] == '\t'))
      return 1;
    while (*p && *p != ',') p++;
  }
  return 0;
}

/* Is an If-Range value exactly our strong ETag? (RFC 9110 13.1.5: one entity tag or a date; a
 * list, a weak tag or a date never match) */
static int if_range_matches(const char *value, const char *etag) {
  while (*value == ' ' || *value == '\t') value++;
  size_t elen = strlen(etag);
  if (strncmp(value, etag, elen) != 0) return 0;
  for (value += elen; *value == ' ' || *value == '\t';) value++;
  return *value == '\0';
}

const char *blob_content_type(const br_record *rec) {
  const char *ct = rec->content_type;
  return ct[0] && !br_header_content_type_check(ct) ? ct : "application/octet-stream";
}

/* A preview (an admin's look at a held blob) is shown inline only when it is a passive image:
 * anything else a held blob holds is a download, whatever a browser makes of it. */
static int preview_inline(const char *ct) {
  return !strncasecmp(ct, "image/", 6) && br_content_type_is_passive(ct);
}

/* Stored content never runs on our origin (where the console keeps its token): no sniffing, a
 * sandbox with nothing allowed, and anything but a passive type downloaded, not rendered. On every
 * blob reply: 200, 206, 304, 416, HEAD, proxied, cached. */
static void add_confinement_headers(struct MHD_Response *resp, const br_record *rec, int preview) {
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(resp, "Content-Security-Policy", "default-src 'none'; sandbox");
  if (!(preview ? preview_inline(blob_content_type(rec))
                : br_content_type_is_passive(blob_content_type(rec))))
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_DISPOSITION, "attachment");
}

/* with_type 0: no Content-Type (a 304, or multipart/byteranges set by the caller). */
/* preview: the answer of GET .../preview, kept by no cache (the blob may be held for a reason). */
static void add_blob_headers(struct MHD_Response *resp, const br_record *rec, int with_type,
                             const char *etag, const char *repr_digest, int preview) {
  add_confinement_headers(resp, rec, preview);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, etag);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
                          preview ? "private, no-store" : "public, max-age=31536000, immutable");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
  MHD_add_response_header(resp, "Repr-Digest", repr_digest);
  if (with_type)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, blob_content_type(rec));
}

/* A multipart/byteranges body assembled on the fly: part headers from memory, part bodies read
 * from the store. */
struct multipart {
  br_store_reader reader;
  size_t nparts;
  struct part {
    uint64_t start;    /* offset of this part's header in the body */
    size_t header_len; /* bytes of header text before the data */
    size_t header_off; /* into headers */
    uint64_t first, len;
  } parts[BR_RANGE_MAX];
  uint64_t trailer_start;
  size_t trailer_len, trailer_off;
  char *headers; /* all part headers then the closing delimiter */
};

static ssize_t multipart_read(void *cls, uint64_t pos, char *buf, size_t max) {
  struct multipart *mp = cls;
  size_t done = 0;
  while (done < max) {
    if (pos >= mp->trailer_start) {
      uint64_t off = pos - mp->trailer_start;
      if (off >= mp->trailer_len) break;
      size_t n = mp->trailer_len - (size_t)off;
      if (n > max - done) n = max - done;
      memcpy(buf + done, mp->headers + mp->trailer_off + off, n);
      done += n, pos += n;
      continue;
    }
    size_t i = 0;
    while (i + 1 < mp->nparts && pos >= mp->parts[i + 1].start) i++;
    struct part *pt = &mp->parts[i];
    uint64_t off = pos - pt->start;
    if (off < pt->header_len) {
      size_t n = pt->header_len - (size_t)off;
      if (n > max - done) n = max - done;
      memcpy(buf + done, mp->headers + pt->header_off + off, n);
      done += n, pos += n;
      continue;
    }
    off -= pt->header_len;
    uint64_t left = pt->len - off;
    size_t n = left < max - done ? (size_t)left : max - done;
    if (mp->reader.source->pread(mp->reader.source, buf + done, n, pt->first + off, NULL) < 0)
      return done ? (ssize_t)done : MHD_CONTENT_READER_END_WITH_ERROR;
    done += n, pos += n;
  }
  return done ? (ssize_t)done : MHD_CONTENT_READER_END_OF_STREAM;
}

static void multipart_free(void *cls) {
  struct multipart *mp = cls;
  br_store_reader_close(&mp->reader);
  free(mp->headers);
  free(mp);
}

/* Streams a non-fd store object (S3, HTTP origins) from offset base. */
struct source_body {
  br_store_reader reader;
  uint64_t base;
};

static ssize_t source_read(void *cls, uint64_t pos, char *buf, size_t max) {
  struct source_body *sb = cls;
  uint64_t left = sb->reader.size - (sb->base + pos);
  size_t n = left < max ? (size_t)left : max;
  if (!n) return MHD_CONTENT_READER_END_OF_STREAM;
  if (sb->reader.source->pread(sb->reader.source, buf, n, sb->base + pos, NULL) < 0)
    return MHD_CONTENT_READER_END_WITH_ERROR;
  return (ssize_t)n;
}

static void source_free(void *cls) {
  struct source_body *sb = cls;
  br_store_reader_close(&sb->reader);
  free(sb);
}

/* The body of HEAD and 304 responses, which is never read: created with a block size of 1, as
 * libmicrohttpd allocates and clears a block of that size with every response. */
static ssize_t no_body(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)cls, (void)pos, (void)buf, (void)max;
  return MHD_CONTENT_READER_END_WITH_ERROR; /* HEAD responses are never read */
}

/* A response with `len` bytes of the object from `first`; takes ownership of the reader. */
static struct MHD_Response *range_response(br_store_reader *r, uint64_t first, uint64_t len) {
  if (r->fd >= 0) {
    int fd = br_store_reader_take_fd(r);
    br_store_reader_close(r);
    struct MHD_Response *resp = MHD_create_response_from_fd_at_offset64(len, fd, first);
    if (!resp) close(fd);
    return resp;
  }
  struct source_body *sb = malloc(sizeof *sb);
  if (!sb) {
    br_store_reader_close(r);
    return NULL;
  }
  sb->reader = *r;
  sb->base = first;
  struct MHD_Response *resp =
      MHD_create_response_from_callback(len, 256 * 1024, source_read, sb, source_free);
  if (!resp) source_free(sb);
  return resp;
}

static struct MHD_Response *multipart_response(br_store_reader *r, const br_record *rec,
                                               const br_byte_range *ranges, size_t n,
                                               char *boundary, size_t blen) {
  struct multipart *mp = calloc(1, sizeof *mp);
  size_t cap = n * 400 + 128;
  char *h = malloc(cap);
  if (!mp || !h) {
    free(mp), free(h);
    br_store_reader_close(r);
    return NULL;
  }
  mp->reader = *r;
  mp->headers = h;
  mp->nparts = n;
  snprintf(boundary, blen, "blobref-%016" PRIx64 "%08x", br_now_ms(), (unsigned)random());
  const char *type = blob_content_type(rec); /* never a CR or LF into the part headers */
  size_t used = 0;
  uint64_t pos = 0;
  for (size_t i = 0; i < n; i++) {
    int w = snprintf(h + used, cap - used,
                     "%s--%s\r\nContent-Type: %s\r\nContent-Range: bytes %" PRIu64 "-%" PRIu64
                     "/%" PRIu64 "\r\n\r\n",
                     i ? "\r\n" : "", boundary, type, ranges[i].first, ranges[i].last, rec->size);
    struct part *pt = &mp->parts[i];
    pt->start = pos;
    pt->header_off = used;
    pt->header_len = (size_t)w;
    pt->first = ranges[i].first;
    pt->len = ranges[i].last - ranges[i].first + 1;
    used += (size_t)w;
    pos += (uint64_t)w + pt->len;
  }
  int w = snprintf(h + used, cap - used, "\r\n--%s--\r\n", boundary);
  mp->trailer_start = pos;
  mp->trailer_off = used;
  mp->trailer_len = (size_t)w;
  pos += (uint64_t)w;
  struct MHD_Response *resp =
      MHD_create_response_from_callback(pos, 64 * 1024, multipart_read, mp, multipart_free);
  if (!resp) multipart_free(mp);
  return resp;
}

/* Counts a small-blob cache lookup (/metrics) and notes it for the access log. */
static void cache_outcome(struct request *req, int hit) {
  req->outcome = hit ? OUTCOME_CACHE_HIT : OUTCOME_CACHE_MISS;
  atomic_fetch_add(hit ? &req->http->cache_hits : &req->http->cache_misses, 1);
}

/* Lists (store, key) as suspect for --fsck: a read found bytes that are not req->digest's. */
static void mark_suspect(struct request *req, br_store *store, const char *key) {
  br_err err;
  if (br_suspect_mark(req->srv->cfg->data_dir, req->digest, br_store_name(store), key, &err) < 0)
    br_warn("%s", err.msg);
}

/* The blob's bytes from the small-blob cache, read (and checked against the hash) into it on a
 * miss. Returns an entry to release, or NULL with *e set (E__COUNT: caching not possible, serve
 * from the store instead). */
static cached_blob *cached_bytes(struct request *req, const br_record *rec, br_store *store,
                                 const char *key, enum br_api_error *e) {
  blobcache *cache = req->srv->cache;
  *e = E__COUNT;
  if (rec->size > blobcache_max_blob(cache)) return NULL;
  cached_blob *hit = blobcache_get(cache, req->digest);
  if (cache) cache_outcome(req, hit != NULL);
  if (hit) return hit;
  br_store_reader r;
  br_err err;
  if (br_store_open_read(store, key, &r, &err) != 0) return NULL; /* the slow path reports it */
  uint8_t *buf = malloc(rec->size ? rec->size : 1);
  int ok =
      buf && r.size == rec->size && r.source->pread(r.source, buf, (size_t)rec->size, 0, &err) == 0;
  br_store_reader_close(&r);
  cached_blob *entry = NULL;
  if (ok) {
    uint8_t got[BR_SHA256_LEN];
    EVP_Digest(buf, (size_t)rec->size, got, NULL, EVP_sha256(), NULL);
    if (memcmp(got, req->digest, BR_SHA256_LEN) != 0) {
      char hex[BR_HEX_LEN + 1];
      br_hex_encode(req->digest, hex);
      br_error("blob %s: the bytes in %s:%s do not match their hash", hex, br_store_name(store),
               key);
      atomic_fetch_add(&req->http->read_digest_mismatch, 1);
      mark_suspect(req, store, key);
      *e = E_STORE_UNAVAILABLE;
    } else {
      entry = blobcache_put(cache, req->digest, buf, (size_t)rec->size);
    }
  }
  free(buf);
  return entry;
}

/* Headers common to every blob body reply, the byte count, and the queueing. */
static enum MHD_Result finish_blob_reply(struct request *req, const br_record *rec,
                                         struct MHD_Response *resp, unsigned status,
                                         const br_byte_range *ranges, size_t n, const char *etag,
                                         const char *repr) {
  add_blob_headers(resp, rec, n <= 1, etag, repr, req->preview);
  if (status == MHD_HTTP_PARTIAL_CONTENT && n == 1) {
    char cr[80];
    snprintf(cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, ranges[0].first,
             ranges[0].last, rec->size);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
  } else if (n > 1) {
    char ct[128];
    snprintf(ct, sizeof ct, "multipart/byteranges; boundary=%s", req->boundary);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ct);
  }
  uint64_t body_bytes = 0;
  if (status == MHD_HTTP_OK)
    body_bytes = rec->size;
  else
    for (size_t i = 0; i < n; i++) body_bytes += ranges[i].last - ranges[i].first + 1;
  if (!req->is_head) atomic_fetch_add(&req->http->bytes_out, body_bytes);
  req->bytes_out = body_bytes;
  return reply_response(req, status, resp);
}

/* Serves the whole blob or one range of it from a cache entry (taking the reference). */
static enum MHD_Result reply_cached(struct request *req, const br_record *rec, cached_blob *cb,
                                    unsigned status, const br_byte_range *ranges, size_t n,
                                    const char *etag, const char *repr) {
  uint64_t first = n ? ranges[0].first : 0, len = n ? ranges[0].last - first + 1 : rec->size;
  struct MHD_Response *resp = MHD_create_response_from_buffer_with_free_callback_cls(
      (size_t)len, (void *)(cached_blob_data(cb) + first), blobcache_release, cb);
  if (!resp) {
    blobcache_release(cb);
    return reply_error(req, E_INTERNAL, "cannot create the response");
  }
  return finish_blob_reply(req, rec, resp, status, ranges, n, etag, repr);
}

/* The multipart/byteranges framing: the text before each part and the closing delimiter, in
 * one malloc'd buffer; offs[i] / lens[i] locate part i's header, offs[n] / lens[n] the end. */
static char *multipart_framing(struct request *req, const br_record *rec,
                               const br_byte_range *ranges, size_t n, size_t *offs, size_t *lens) {
  size_t cap = n * 400 + 128, used = 0;
  char *h = malloc(cap);
  if (!h) return NULL;
  if (!req->boundary[0])
    snprintf(req->boundary, sizeof req->boundary, "blobref-%016" PRIx64 "%08x", br_now_ms(),
             (unsigned)random());
  const char *type = blob_content_type(rec); /* never a CR or LF into the part headers */
  for (size_t i = 0; i < n; i++) {
    int w =
        snprintf(h + used, cap - used,
                 "%s--%s\r\nContent-Type: %s\r\nContent-Range: bytes %" PRIu64 "-%" PRIu64
                 "/%" PRIu64 "\r\n\r\n",
                 i ? "\r\n" : "", req->boundary, type, ranges[i].first, ranges[i].last, rec->size);
    offs[i] = used;
    lens[i] = (size_t)w;
    used += (size_t)w;
  }
  int w = snprintf(h + used, cap - used, "\r\n--%s--\r\n", req->boundary);
  offs[n] = used;
  lens[n] = (size_t)w;
  return h;
}

/* A blob in an S3 or http store: on the first call the transfer starts and the connection is
 * suspended (small blobs are fetched whole, checked against their hash and cached); on the
 * second the origin's answer is known and the body streams through. Several ranges are read
 * with as few upstream requests as br_range_plan finds (never more than BR_RANGE_READS_MAX);
 * too many unordered ones get the whole blob (200). */
static enum MHD_Result reply_proxied(struct request *req, const br_record *rec, br_store *store,
                                     const char *key, const char *url, unsigned status,
                                     const br_byte_range *ranges, size_t n, const char *etag,
                                     const char *repr) {
  blobcache *cache = req->srv->cache;
  unsigned char joins[BR_RANGE_MAX] = {0};
  size_t nreads = 0;
  if (n > 1 && br_range_plan(ranges, n, BR_RANGE_READ_GAP, BR_RANGE_READS_MAX, joins, &nreads) ==
                   BR_PLAN_WHOLE)
    status = MHD_HTTP_OK, n = 0;
  int cacheable = n <= 1 && rec->size <= blobcache_max_blob(cache) && rec->size > 0;
  if (cacheable) {
    cached_blob *hit = blobcache_get(cache, req->digest);
    if (!req->proxy) cache_outcome(req, hit != NULL); /* counted once, not again on the resume */
    if (hit) return reply_cached(req, rec, hit, status, ranges, n, etag, repr);
  }
  br_err err;
  if (!req->proxy) {
    struct proxy_part parts[2 * BR_RANGE_MAX + 1];
    size_t np = 0;
    char *framing = NULL;
    if (cacheable || status == MHD_HTTP_OK) {
      parts[np++] = (struct proxy_part){NULL, 0, 0, rec->size, 0};
    } else if (n == 1) {
      parts[np++] =
          (struct proxy_part){NULL, 0, ranges[0].first, ranges[0].last - ranges[0].first + 1, 0};
    } else {
      size_t offs[BR_RANGE_MAX + 1], lens[BR_RANGE_MAX + 1];
      framing = multipart_framing(req, rec, ranges, n, offs, lens);
      if (!framing) return reply_error(req, E_INTERNAL, "out of memory");
      for (size_t i = 0; i < n; i++) {
        parts[np++] = (struct proxy_part){framing + offs[i], lens[i], 0, 0, 0};
        parts[np++] = (struct proxy_part){NULL, 0, ranges[i].first,
                                          ranges[i].last - ranges[i].first + 1, joins[i]};
      }
      parts[np++] = (struct proxy_part){framing + offs[n], lens[n], 0, 0, 0};
    }
    int whole = !cacheable && status == MHD_HTTP_OK;
    int rc = proxy_start(req, url, parts, np, cacheable, br_store_stall_ms(store),
                         br_store_name(store), key, br_store_retries(store), whole, &err);
    free(framing);
    if (rc < 0) return reply_error(req, E_STORE_UNAVAILABLE, "%s", err.msg);
    return MHD_YES; /* suspended: the origin's answer brings us back here */
  }
  long origin_status = 0;
  char msg[256];
  if (proxy_result(req, &origin_status, msg, sizeof msg) < 0) {
    if (origin_status == 404)
      br_error("blob: index says store %s has it, but the store answers 404", br_store_name(store));
    return reply_error(req,
                       origin_status >= 400 && origin_status < 500 && origin_status != 404
                           ? E_STORE_ERROR
                           : E_STORE_UNAVAILABLE,
                       "store %s: %s", br_store_name(store), msg);
  }
  if (cacheable) {
    size_t len;
    const char *bytes = proxy_collected(req, &len);
    uint8_t got[BR_SHA256_LEN];
    EVP_Digest(bytes, len, got, NULL, EVP_sha256(), NULL);
    if (len != rec->size || memcmp(got, req->digest, BR_SHA256_LEN) != 0) {
      char hex[BR_HEX_LEN + 1];
      br_hex_encode(req->digest, hex);
      br_error("blob %s: the bytes in store %s do not match their hash", hex, br_store_name(store));
      atomic_fetch_add(&req->http->read_digest_mismatch, 1);
      mark_suspect(req, store, key);
      return reply_error(req, E_STORE_UNAVAILABLE, "the stored bytes do not match their hash");
    }
    cached_blob *cb = blobcache_put(cache, req->digest, bytes, len);
    if (cb) return reply_cached(req, rec, cb, status, ranges, n, etag, repr);
    uint64_t first = n ? ranges[0].first : 0, blen = n ? ranges[0].last - first + 1 : rec->size;
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        (size_t)blen, (void *)(bytes + first), MHD_RESPMEM_MUST_COPY);
    if (!resp) return reply_error(req, E_INTERNAL, "cannot create the response");
    return finish_blob_reply(req, rec, resp, status, ranges, n, etag, repr);
  }
  uint64_t body = 0;
  if (status == MHD_HTTP_OK) {
    body = rec->size;
  } else {
    for (size_t i = 0; i < n; i++) body += ranges[i].last - ranges[i].first + 1;
    if (n > 1) {
      size_t offs[BR_RANGE_MAX + 1], lens[BR_RANGE_MAX + 1];
      char *framing = multipart_framing(req, rec, ranges, n, offs, lens);
      if (!framing) return reply_error(req, E_INTERNAL, "out of memory");
      for (size_t i = 0; i <= n; i++) body += lens[i];
      free(framing);
    }
  }
  struct MHD_Response *resp = proxy_response(req, body);
  if (!resp) return reply_error(req, E_INTERNAL, "cannot create the response");
  return finish_blob_reply(req, rec, resp, status, ranges, n, etag, repr);
}

/* Did the file behind an in-place key (indexed where it was, not at the store's content key)
 * change (mtime or ctime) after the location's bytes were last hashed (verified_at)? Content
 * keys are written only by the server (temp file + rename of hashed bytes; a concurrent upload
 * of the same blob renames identical bytes over it). Stores that cannot tell (changed_ms 0) and
 * locations never verified: no. Returns 2 when the open file is another inode than the one
 * verified (a file renamed into place: not served until re-verified, whatever its bytes). */
static int changed_since_verified(const br_record *rec, br_store *store, const char *key,
                                  const uint8_t digest[BR_SHA256_LEN], const br_store_reader *r) {
  char content_key[BR_MAX_KEY + 81];
  if (br_store_default_key(store, digest, content_key, sizeof content_key) &&
      !strcmp(content_key, key))
    return 0;
  for (int i = 0; i < rec->nlocations; i++) {
    const br_location *l = &rec->locations[i];
    if (strcmp(l->store, br_store_name(store)) || strcmp(l->key, key)) continue;
    if ((l->dev || l->ino) && (r->dev || r->ino) && (l->dev != r->dev || l->ino != r->ino))
      return 2;
    return r->changed_ms && l->verified_at_ms && r->changed_ms > l->verified_at_ms;
  }
  return 0;
}

/* Files up to this size that changed after they were hashed are hashed again on each read. */
#define REHASH_MAX (16u << 20)

/* Hashes an open in-place file that moved since it was verified (changed_since_verified).
 * Returns 1 when it is the blob and did not change while hashed (its mtime/ctime are the same
 * after), 0 when its bytes are another blob's, -1 when it could not tell (too large, a read
 * error, or it changed while hashed). */
static int rehash_in_place(br_store_reader *r, const uint8_t digest[BR_SHA256_LEN]) {
  if (r->size > REHASH_MAX || r->fd < 0) return -1;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  char *buf = malloc(1 << 20);
  int rc = ctx && buf && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ? 0 : -1;
  br_err err;
  for (uint64_t off = 0; rc == 0 && off < r->size;) {
    size_t n = r->size - off < (1u << 20) ? (size_t)(r->size - off) : (1u << 20);
    rc = r->source->pread(r->source, buf, n, off, &err);
    if (rc == 0) EVP_DigestUpdate(ctx, buf, n);
    off += n;
  }
  uint8_t got[BR_SHA256_LEN];
  if (rc == 0) EVP_DigestFinal_ex(ctx, got, NULL);
  EVP_MD_CTX_free(ctx);
  free(buf);
  struct stat sb;
  if (rc < 0 || fstat(r->fd, &sb) < 0) return -1;
  uint64_t m = (uint64_t)sb.st_mtim.tv_sec * 1000 + (uint64_t)sb.st_mtim.tv_nsec / 1000000;
  uint64_t c = (uint64_t)sb.st_ctim.tv_sec * 1000 + (uint64_t)sb.st_ctim.tv_nsec / 1000000;
  if ((m > c ? m : c) != r->changed_ms || (uint64_t)sb.st_size != r->size) return -1;
  return memcmp(got, digest, BR_SHA256_LEN) ? 0 : 1;
}

enum MHD_Result reply_blob(struct request *req, const br_record *rec, br_store *store,
                           const char *key) {
  char hex[BR_HEX_LEN + 1], etag[BR_HEX_LEN + 3], repr[80];
  blob_etag_repr(req->digest, hex, etag, repr);

  struct MHD_Connection *c = req->conn;
  const char *inm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
  if (inm && etag_listed(inm, etag, 1)) {
    /* no body, but a Content-Length equal to the 200's (RFC 9110 15.4.5), so that a cache that
     * merges the 304's headers does not truncate what it holds */
    struct MHD_Response *resp =
        MHD_create_response_from_callback(rec->size, 1, no_body, NULL, NULL);
    if (!resp) return MHD_NO;
    add_blob_headers(resp, rec, 0, etag, repr, req->preview);
    return reply_response(req, MHD_HTTP_NOT_MODIFIED, resp);
  }
  const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_RANGE);
  const char *if_range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_RANGE);
  if (range && if_range && !if_range_matches(if_range, etag))
    range = NULL; /* If-Range did not match (or is a date / weak tag): send everything */
  br_byte_range ranges[BR_RANGE_MAX];
  size_t n = 0;
  enum br_range_result rr = br_range_parse(range, rec->size, ranges, &n);
  if (rr == BR_RANGE_OK && n > 1) {
    /* overlapping ranges could multiply the bytes sent (RFC 9110 14.2 lets us ignore them) */
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += ranges[i].last - ranges[i].first + 1;
    if (total > rec->size) rr = BR_RANGE_IGNORE, n = 0;
  }
  if (rr == BR_RANGE_UNSATISFIABLE || rr == BR_RANGE_MALFORMED || rr == BR_RANGE_TOO_MANY) {
    char cr[48];
    snprintf(cr, sizeof cr, "bytes */%" PRIu64, rec->size);
    enum br_api_error e = rr == BR_RANGE_UNSATISFIABLE ? E_RANGE_NOT_SATISFIABLE : E_BAD_RANGE;
    struct MHD_Response *resp = json_response(
        error_json(e, rr == BR_RANGE_UNSATISFIABLE ? "no requested range is satisfiable"
                      : rr == BR_RANGE_TOO_MANY    ? "too many ranges (at most 64)"
                                                   : "malformed Range header"),
        &req->bytes_out);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
    add_confinement_headers(resp, rec, req->preview);
    return reply_response(req, MHD_HTTP_RANGE_NOT_SATISFIABLE, resp);
  }

  struct MHD_Response *resp;
  unsigned status = rr == BR_RANGE_OK ? MHD_HTTP_PARTIAL_CONTENT : MHD_HTTP_OK;
  if (req->is_head && status == MHD_HTTP_OK) {
    /* HEAD of the whole: no need to touch the store at all */
    resp = MHD_create_response_from_callback(rec->size, 1, no_body, NULL, NULL);
    if (!resp) return MHD_NO;
    add_blob_headers(resp, rec, 1, etag, repr, req->preview);
    return reply_response(req, status, resp);
  }
  /* S3 and http stores are read over HTTP by the proxy loop, never on this thread */
  char url[4096];
  br_err err;
  int via_url = req->proxy != NULL;
  if (!via_url) {
    int fu = br_store_fetch_url(store, key, url, sizeof url, &err);
    if (fu < 0) return reply_error(req, E_STORE_UNAVAILABLE, "%s", err.msg);
    via_url = fu == 0;
    if (via_url && br_store_unavailable(store)) {
      /* a small blob already in the cache was checked against its hash: no need of the store */
      cached_blob *hit = n <= 1 ? blobcache_get(req->srv->cache, req->digest) : NULL;
      if (hit) {
        cache_outcome(req, 1);
        return reply_cached(req, rec, hit, status, ranges, n, etag, repr);
      }
      return reply_error(req, E_STORE_UNAVAILABLE, "store %s cannot be reached right now",
                         br_store_name(store));
    }
  }
  if (via_url) return reply_proxied(req, rec, store, key, url, status, ranges, n, etag, repr);
  if (n <= 1) {
    enum br_api_error cache_error;
    cached_blob *cb = cached_bytes(req, rec, store, key, &cache_error);
    if (!cb && cache_error != E__COUNT)
      return reply_error(req, cache_error, "the stored bytes do not match their hash");
    if (cb) return reply_cached(req, rec, cb, status, ranges, n, etag, repr);
  }
  br_store_reader r;
  int orc = br_store_open_read(store, key, &r, &err);
  if (orc != 0) {
    if (orc > 0) {
      br_error("blob %s: index says %s:%s but the store has no such object", hex,
               br_store_name(store), key);
      return reply_error(req, E_STORE_UNAVAILABLE, "the blob's bytes are missing from store %s",
                         br_store_name(store));
    }
    return reply_error(req, E_STORE_UNAVAILABLE, "store %s: %s", br_store_name(store), err.msg);
  }
  if (r.size != rec->size) {
    br_error("blob %s: store %s has %" PRIu64 " bytes, index says %" PRIu64, hex,
             br_store_name(store), r.size, rec->size);
    br_store_reader_close(&r);
    return reply_error(req, E_STORE_UNAVAILABLE, "the stored size differs from the index");
  }
  int moved = changed_since_verified(rec, store, key, req->digest, &r);
  int same = moved == 2 ? -1 : moved ? rehash_in_place(&r, req->digest) : 1;
  if (same <= 0) {
    br_error(
        "blob %s: %s:%s changed after its bytes were hashed and %s: not served until "
        "re-verified (PUT /v1/blobs/%s/location onto itself)",
        hex, br_store_name(store), key,
        moved == 2  ? "is another file now (inode)"
        : same == 0 ? "hashes to another blob now"
                    : "could not be hashed again",
        hex);
    if (same == 0) {
      atomic_fetch_add(&req->http->read_digest_mismatch, 1);
      mark_suspect(req, store, key);
    }
    int later = moved == 1 && same < 0 && r.size > REHASH_MAX && r.fd >= 0;
    if (later) {
      rehash_later(req->http, req->digest, store, key, r.changed_ms);
      /* about the time to hash it at a few hundred MB/s, a little more */
      req->retry_after_s = (unsigned)(r.size / (200u << 20)) + 2;
    }
    br_store_reader_close(&r);
    return reply_error(req, E_STORE_UNAVAILABLE,
                       later ? "the stored file changed after it was verified: it is being "
                               "hashed again, retry later"
                             : "the stored file changed after it was verified: not served as "
                               "its hash");
  }
  if (status == MHD_HTTP_OK)
    resp = range_response(&r, 0, rec->size);
  else if (n == 1)
    resp = range_response(&r, ranges[0].first, ranges[0].last - ranges[0].first + 1);
  else
    resp = multipart_response(&r, rec, ranges, n, req->boundary, sizeof req->boundary);
  if (!resp) return reply_error(req, E_INTERNAL, "cannot create the response");
  return finish_blob_reply(req, rec, resp, status, ranges, n, etag, repr);
}
