/* AWS Signature Version 4 for S3: signed requests (Authorization header) and presigned URLs, with
 * the daily signing key cached. Pure computation over OpenSSL's HMAC-SHA256; no I/O. */
#ifndef BLOBREF_SIGV4_H
#define BLOBREF_SIGV4_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "blobref/common.h"

#define BR_SIGV4_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define BR_SIGV4_UNSIGNED "UNSIGNED-PAYLOAD"

/* Credentials, scope and the cached signing key of one signer (one per store). Thread-safe after
 * br_sigv4_init: the cached key is guarded by lock. */
typedef struct br_sigv4 {
  char access_key[128];
  char secret_key[128];
  char session_token[4096]; /* "" = none */
  char region[64];
  char service[32]; /* "s3" */
  pthread_mutex_t lock;
  char key_date[9]; /* YYYYMMDD the cached key was derived for ("" = none) */
  uint8_t signing_key[32];
} br_sigv4;

/* One request header as it is sent. Names are compared case-insensitively; values are trimmed and
 * inner runs of spaces collapsed when canonicalised. */
typedef struct br_sigv4_header {
  const char *name;
  const char *value;
} br_sigv4_header;

/* A request to sign. path and query are exactly as they appear on the wire: path already
 * percent-encoded (S3 rules: never normalised, never encoded twice), query without the '?', in
 * any order, "" when there is none. host is the Host header's value (with ":port" when the port
 * is not the scheme's default). headers must not contain Host, X-Amz-Date, X-Amz-Security-Token
 * or Authorization: the signer adds those. payload_hash is the hex SHA-256 of the body,
 * BR_SIGV4_EMPTY_SHA256, or BR_SIGV4_UNSIGNED. */
typedef struct br_sigv4_request {
  const char *method;
  const char *host;
  const char *path;
  const char *query;
  const br_sigv4_header *headers;
  size_t nheaders;
  const char *payload_hash;
} br_sigv4_request;

/* Fills s; session_token may be NULL or "". Returns 0, or -1 (err) when a value is too long or
 * a required one is empty. */
int br_sigv4_init(br_sigv4 *s, const char *access_key, const char *secret_key,
                  const char *session_token, const char *region, const char *service, br_err *err);
void br_sigv4_destroy(br_sigv4 *s);

/* Formats t as the ISO 8601 basic X-Amz-Date, "YYYYMMDDTHHMMSSZ". */
void br_sigv4_amz_date(time_t t, char out[17]);

/* Header signing at time now. Writes the Authorization header's value into authorization (no
 * "Authorization: " prefix) and the X-Amz-Date value into amz_date. The caller must send Host,
 * X-Amz-Date, X-Amz-Content-Sha256 (= payload_hash), X-Amz-Security-Token (when a session token
 * is set) and every header in req->headers, unchanged. X-Amz-Content-Sha256 is signed: include
 * it in req->headers. Returns 0, or -1 (err) when an output does not fit. */
int br_sigv4_sign(br_sigv4 *s, const br_sigv4_request *req, time_t now, char *authorization,
                  size_t authlen, char amz_date[17], br_err *err);

/* Query signing (a presigned URL) at time now, valid expires_s seconds (1..604800). Writes the
 * complete query string to append after '?': req->query's parameters followed by the X-Amz-*
 * ones (X-Amz-Algorithm, -Credential, -Date, -Expires, -SignedHeaders, [-Security-Token,]
 * -Signature). Only Host and req->headers are signed; payload_hash is normally
 * BR_SIGV4_UNSIGNED. Returns 0, or -1 (err). */
int br_sigv4_presign(br_sigv4 *s, const br_sigv4_request *req, time_t now, uint64_t expires_s,
                     char *query_out, size_t outlen, br_err *err);

/* The intermediate texts, for tests and debugging: the canonical request and the string to sign
 * that br_sigv4_sign (presign = 0) or br_sigv4_presign (presign = 1) would use. */
int br_sigv4_canonical(br_sigv4 *s, const br_sigv4_request *req, time_t now, int presign,
                       uint64_t expires_s, char *creq, size_t creqlen, char *sts, size_t stslen,
                       br_err *err);

/* Percent-encodes in per RFC 3986 as SigV4 wants (unreserved A-Z a-z 0-9 - _ . ~ kept; '/' kept
 * when keep_slash). Returns the length written, or 0 when it does not fit (in non-empty). */
size_t br_sigv4_uri_encode(const char *in, int keep_slash, char *out, size_t outlen);

/* The signing key for now's date (UTC): the cached one, or derived and cached (added for tests
 * and callers that sign chunks). */
void br_sigv4_signing_key(br_sigv4 *s, time_t now, uint8_t key[32]);

#endif
