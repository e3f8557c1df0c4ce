/* POST /v1/lookup: which of many hashes exist (size, URL) and which are missing. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/handlers.h"

#define MAX_JSON_DEPTH 32

/* Nesting depth of JSON text (brackets outside strings), so that hostile nesting is refused
 * before the recursive parser sees it; *commas: the commas outside strings (one less than the
 * values in arrays and objects), so that a body of millions of tiny values ("{},{},...", each a
 * parsed object of ~100 bytes) is refused before it is parsed. */
static int json_depth(const char *s, size_t len, uint64_t *commas) {
  int depth = 0, max = 0, in_string = 0;
  *commas = 0;
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
    } else if (c == ',') {
      (*commas)++;
    }
  }
  return max;
}

int lookup_parse(const char *body, size_t len, uint64_t max_hashes, uint8_t **digests, size_t *n,
                 enum br_api_error *e, char *msg, size_t msglen) {
  *digests = NULL;
  *n = 0;
  uint64_t commas = 0;
  if (json_depth(body, len, &commas) > MAX_JSON_DEPTH) {
    *e = E_BAD_JSON;
    snprintf(msg, msglen, "JSON nested deeper than %d levels", MAX_JSON_DEPTH);
    return -1;
  }
  if (commas > max_hashes + 16) { /* a few for other members of the object */
    *e = E_TOO_MANY_HASHES;
    snprintf(msg, msglen, "over %" PRIu64 " values; at most %" PRIu64 " hashes per call", commas,
             max_hashes);
    return -1;
  }
  json_error_t jerr;
  json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
  int rc = -1;
  *e = E_BAD_JSON;
  if (!root) {
    snprintf(msg, msglen, "invalid JSON at line %d column %d: %s", jerr.line, jerr.column,
             jerr.text);
    return -1;
  }
  json_t *hashes = json_object_get(root, "hashes");
  if (!json_is_object(root) || !json_is_array(hashes)) {
    snprintf(msg, msglen, "the body must be {\"hashes\": [\"<hex>\", ...]}");
    goto done;
  }
  size_t count = json_array_size(hashes);
  if (count > max_hashes) {
    *e = E_TOO_MANY_HASHES;
    snprintf(msg, msglen, "%zu hashes, at most %" PRIu64 " per call", count, max_hashes);
    goto done;
  }
  uint8_t *out = malloc(count ? count * BR_SHA256_LEN : 1);
  if (!out) {
    *e = E_INTERNAL;
    snprintf(msg, msglen, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < count; i++) {
    json_t *h = json_array_get(hashes, i);
    if (!json_is_string(h)) {
      snprintf(msg, msglen, "hashes[%zu] is not a string", i);
      free(out);
      goto done;
    }
    if (br_blob_id_parse(json_string_value(h), json_string_length(h), out + i * BR_SHA256_LEN) <
        0) {
      *e = E_BAD_HASH;
      snprintf(msg, msglen, "hashes[%zu] is not 64 lowercase hex digits", i);
      free(out);
      goto done;
    }
  }
  *digests = out;
  *n = count;
  rc = 0;
done:
  json_decref(root);
  return rc;
}

/* What a batch get found of hash i: present and live, and its size. */
struct looked {
  uint64_t size;
  int live;
};

static int looked_fn(void *ud, size_t i, const br_record *rec) {
  struct looked *l = ud;
  l[i].live = rec->state == BR_STATE_LIVE;
  l[i].size = rec->size;
  return 0;
}

/* Looks the n digests up (PostgreSQL: one statement per BR_INDEX_GET_MANY). NULL + *rc, err. */
static struct looked *look_up(struct request *req, const uint8_t *digests, size_t n, int *rc,
                              br_err *err) {
  struct looked *l = calloc(n ? n : 1, sizeof *l);
  if (!l) {
    *rc = br_fail(err, "out of memory");
    return NULL;
  }
  *rc = br_index_get_many(req->srv->index, digests, n, looked_fn, l, err);
  if (*rc < 0) {
    free(l);
    return NULL;
  }
  return l;
}

/* A lookup with ?lease=ID: its hashes, while a finisher attaches the present ones to the lease
 * (a durable commit, never made on a network thread). Freed with the request (req->job_data). */
struct lookup_job {
  size_t n;
  int rc; /* 0, or -1 with e and msg */
  enum br_api_error e;
  char msg[sizeof(br_err)];
  struct looked *l; /* read only (a shared index): what the finisher found; freed by the answer */
  uint8_t digests[];
};

static void lookup_job_free(void *data) {
  struct lookup_job *j = data;
  if (j) free(j->l);
  free(j);
}

/* A shared index's lookup without a lease, on a finisher: the database's answer can take
 * milliseconds, and a network thread waiting for it serves nothing else meanwhile. */
static void lookup_read_job(struct request *req) {
  struct lookup_job *j = req->job_data;
  int rc = 0;
  br_err err;
  j->l = look_up(req, j->digests, j->n, &rc, &err);
  j->rc = j->l ? 0 : -1;
  if (!j->l) {
    j->e = index_error(rc);
    snprintf(j->msg, sizeof j->msg, "%s", err.msg);
  }
}

/* The finisher's part: attaches the blobs present and live now; the answer reads them again. */
static void lookup_attach_job(struct request *req) {
  struct lookup_job *j = req->job_data;
  int rc = 0;
  br_err err;
  struct looked *l = look_up(req, j->digests, j->n, &rc, &err);
  uint8_t *present = l ? malloc(j->n ? j->n * BR_SHA256_LEN : 1) : NULL;
  size_t npresent = 0;
  for (size_t i = 0; present && i < j->n; i++)
    if (l[i].live)
      memcpy(present + npresent++ * BR_SHA256_LEN, j->digests + i * BR_SHA256_LEN, BR_SHA256_LEN);
  j->rc = 0;
  if (!present) {
    j->rc = -1;
    j->e = l ? E_INTERNAL : index_error(rc);
    snprintf(j->msg, sizeof j->msg, "%s", l ? "out of memory" : err.msg);
  } else {
    j->rc = lease_attach(req, present, npresent, &j->e, j->msg, sizeof j->msg);
  }
  free(l);
  free(present);
}

/* Appends {"sha256":hex,"size":N,"url":"/v1/blobs/hex"}, byte for byte what json_dumps
 * (JSON_COMPACT) makes of blob_json(digest, size). */
static void found_text(struct json_text *t, const uint8_t *digest, uint64_t size) {
  char hex[BR_HEX_LEN + 1], num[24];
  br_hex_encode(digest, hex);
  int k = snprintf(num, sizeof num, "%" PRIu64, size);
  json_text_raw(t, "{\"sha256\":\"", 11);
  json_text_raw(t, hex, BR_HEX_LEN);
  json_text_raw(t, "\",\"size\":", 9);
  json_text_raw(t, num, (size_t)k);
  json_text_raw(t, ",\"url\":\"/v1/blobs/", 18);
  json_text_raw(t, hex, BR_HEX_LEN);
  json_text_raw(t, "\"}", 2);
}

/* The answer: which of the n digests are present and live, read now (l: already read, taken),
 * written in place (no jansson object per hash: a call may name tens of thousands). */
static enum MHD_Result lookup_answer(struct request *req, const uint8_t *digests, size_t n,
                                     struct looked *l) {
  int rc = 0;
  br_err err;
  if (!l) l = look_up(req, digests, n, &rc, &err);
  if (!l) return reply_error(req, index_error(rc), "%s", err.msg);
  struct json_text t = {0};
  size_t nfound = 0;
  json_text_raw(&t, "{\"found\":[", 10);
  for (size_t i = 0; i < n; i++) {
    if (!l[i].live) continue;
    if (nfound++) json_text_raw(&t, ",", 1);
    found_text(&t, digests + i * BR_SHA256_LEN, l[i].size);
  }
  json_text_raw(&t, "],\"missing\":[", 13);
  for (size_t i = 0, nmissing = 0; i < n; i++) {
    if (l[i].live) continue;
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(digests + i * BR_SHA256_LEN, hex);
    if (nmissing++) json_text_raw(&t, ",", 1);
    json_text_raw(&t, "\"", 1);
    json_text_raw(&t, hex, BR_HEX_LEN);
    json_text_raw(&t, "\"", 1);
  }
  json_text_raw(&t, "]}", 2);
  free(l);
  return reply_json_text(req, MHD_HTTP_OK, &t);
}

enum MHD_Result lookup_finish(struct request *req) {
  if (req->phase == PHASE_RESUMED) { /* ?lease=: the present blobs are attached (or refused) */
    struct lookup_job *j = req->job_data;
    if (j->rc < 0) return reply_error(req, j->e, "%s", j->msg);
    struct looked *l = j->l;
    j->l = NULL;
    return lookup_answer(req, j->digests, j->n, l);
  }
  uint8_t *digests = NULL;
  size_t n = 0;
  enum br_api_error e;
  char msg[256];
  if (lookup_parse(req->body ? req->body : "", req->body_len, req->srv->cfg->max_lookup_hashes,
                   &digests, &n, &e, msg, sizeof msg) < 0)
    return reply_error(req, e, "%s", msg);
  enum MHD_Result r = lease_take(req);
  int shared = !br_server_off_stripe(req->srv);
  if (req->phase == PHASE_ANSWERED || r != MHD_YES || (!req->lease[0] && !shared)) {
    if (req->phase != PHASE_ANSWERED && r == MHD_YES) r = lookup_answer(req, digests, n, NULL);
    free(digests);
    return r;
  }
  /* ?lease=ID: the blobs present are attached first (on a finisher), then read and reported;
   * a shared index without a lease: read on a finisher */
  struct lookup_job *j = calloc(1, sizeof *j + (n ? n * BR_SHA256_LEN : 1));
  if (!j) {
    free(digests);
    return reply_error(req, E_INTERNAL, "out of memory");
  }
  j->n = n;
  memcpy(j->digests, digests, n * BR_SHA256_LEN);
  free(digests);
  req->job_data = j;
  req->job_free = lookup_job_free;
  req->job_fn = req->lease[0] ? lookup_attach_job : lookup_read_job;
  if (request_finish_async(req, JOB_CALL) < 0)
    return reply_error(req, E_NOT_READY, "the server is stopping");
  return MHD_YES;
}
