/* Private to the S3 and HTTP stores: one S3 bucket behind an endpoint, and the signed requests made
 * to it over libcurl, with bounded retries, S3 error parsing and a circuit breaker that makes an
 * unreachable endpoint fail fast instead of piling up timeouts. */
#ifndef BLOBREF_S3_CLIENT_H
#define BLOBREF_S3_CLIENT_H

#include <curl/curl.h>
#include <stdatomic.h>

#include "blobref/sigv4.h"

typedef struct s3_target {
  char scheme[8];  /* "http" or "https" */
  char host[256];  /* the endpoint's host[:port] */
  char bucket[64]; /* 3..63 characters */
  int path_style;  /* /bucket/key on the endpoint, else bucket.host/key */
  br_sigv4 signer; /* credentials and region */
  long connect_timeout_ms, timeout_ms;
  long stall_ms; /* an answer that moves no byte for this long is a failure (a frozen S3) */
  unsigned max_retries;
  /* circuit breaker: until this time (ms) requests fail at once with the last transport error */
  atomic_uint_fast64_t down_until_ms;
  char name[64]; /* the store's name, for messages */
} s3_target;

/* Everything a store section gives the client. */
typedef struct s3_target_options {
  const char *name, *endpoint, *region, *bucket;
  const char *access_key, *secret_key, *session_token;
  int path_style;
  uint64_t connect_timeout_ms, timeout_ms, stall_ms;
  unsigned max_retries;
} s3_target_options;

/* Fills t. Credentials default to AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN
 * when the options leave them empty. Returns 0, or -1 with err. */
int s3_target_init(s3_target *t, const s3_target_options *o, br_err *err);
void s3_target_destroy(s3_target *t);

/* The Host header and the encoded request path of key (NULL: the bucket itself). Returns 0, or
 * -1 when a buffer is too small. */
int s3_target_locate(const s3_target *t, const char *key, char *host, size_t hostlen, char *path,
                     size_t pathlen);

/* A presigned GET of key valid for ttl_s seconds from now, as a full URL. Returns 0 or -1. */
int s3_presign_get(s3_target *t, const char *key, uint64_t ttl_s, char *url, size_t urllen,
                   br_err *err);
/* The same with query (already encoded, "" for none, e.g. response-content-disposition=...)
 * among the signed parameters, signed at now_s (its X-Amz-Date): valid until now_s + ttl_s. */
int s3_presign_get_at(s3_target *t, const char *key, const char *query, time_t now_s,
                      uint64_t ttl_s, char *url, size_t urllen, br_err *err);

/* A presigned request of any method with extra signed headers (which the client must send as
 * they are) and payload_hash as the canonical payload (BR_SIGV4_UNSIGNED, or the hex SHA-256 the
 * client sends as x-amz-content-sha256). Returns 0 or -1 with err. */
int s3_presign_at(s3_target *t, const char *method, const char *key, const br_sigv4_header *headers,
                  size_t nheaders, const char *payload_hash, time_t now_s, uint64_t ttl_s,
                  char *url, size_t urllen, br_err *err);

/* The same with query (already encoded, e.g. partNumber=1&uploadId=...) among the signed
 * parameters. */
int s3_presign_query_at(s3_target *t, const char *method, const char *key, const char *query,
                        const br_sigv4_header *headers, size_t nheaders, const char *payload_hash,
                        time_t now_s, uint64_t ttl_s, char *url, size_t urllen, br_err *err);

/* The body of a request: memory, or a byte range of a file descriptor (re-read on retries). */
typedef struct s3_body {
  const void *mem;
  int fd; /* used when mem is NULL and len > 0 */
  uint64_t off, len;
} s3_body;

typedef struct s3_request {
  const char *method;
  const char *key;            /* object key, or NULL for the bucket */
  const char *query;          /* encoded query without '?', "" for none */
  br_sigv4_header headers[8]; /* extra headers, all signed (e.g. x-amz-copy-source) */
  size_t nheaders;
  const char *payload_hash; /* hex SHA-256 of the body, or BR_SIGV4_UNSIGNED; NULL = empty */
  s3_body body;
  int has_range; /* ask for bytes range_first..range_last */
  uint64_t range_first, range_last;
  /* where a successful (2xx) response body goes: into[0..into_cap) when into is set (a longer
   * body is an error), else kept in the response up to 4 MiB */
  char *into;
  size_t into_cap;
  /* or, when sink is set, handed to sink as it arrives (a streamed read of any size in bounded
   * memory): sink returns 0 to stop the transfer (an error); sink_reset is called before each
   * attempt (a retry starts over); sink_len is the expected length, for the time budget */
  int (*sink)(void *ud, const char *data, size_t n);
  void (*sink_reset)(void *ud);
  void *sink_ud;
  uint64_t sink_len;
  int no_retry;    /* one attempt only (health probes) */
  long timeout_ms; /* whole-request limit for this request (0: the target's timeout) */
} s3_request;

typedef struct s3_response {
  long status;             /* HTTP status of the last attempt */
  char *body;              /* malloc'd, NUL-terminated; error bodies always land here */
  size_t body_len;         /* bytes received (into `into`, or into body) */
  uint64_t content_length; /* Content-Length of the answer, UINT64_MAX when absent */
  uint64_t total_size;     /* object size from Content-Range ".../N", else content_length */
  char etag[80];
  char checksum_sha256[64]; /* x-amz-checksum-sha256 of the answer (HEAD with checksum mode) */
  char meta_sha256[72];     /* x-amz-meta-blobref-sha256 (set by a direct upload's PUT) */
  char code[64];            /* S3's error code from the XML error body, e.g. "NoSuchKey" */
  char message[256];        /* and its message */
  int sink_stopped;         /* the request's sink refused bytes: the transfer ended there */
} s3_response;

/* Sends req, retrying transport errors, 500/502/503/504 and SlowDown with exponential backoff
 * and jitter. Returns 0 when an answer came back (look at resp->status; a non-2xx one has code
 * and message parsed), or -1 with err on transport failure (resp->status is then 0). Always call
 * s3_response_free afterwards. */
int s3_perform(s3_target *t, s3_request *req, s3_response *resp, br_err *err);
void s3_response_free(s3_response *resp);

/* "S3 403 AccessDenied: message" style text for a non-2xx response. */
int s3_fail_status(br_err *err, const s3_target *t, const char *what, const s3_response *resp);

/* Is the endpoint marked unreachable right now? */
int s3_target_down(s3_target *t);

/* The text between <tag> and </tag> of the first (or, with from, the next after *from) element
 * of that name in xml, entity-decoded into out. Returns 0, or -1 if absent or too long. S3
 * answers are small flat documents; this is all the XML they need. */
int s3_xml_text(const char *xml, const char *tag, const char **from, char *out, size_t outlen);

/* Reads the answer to a DeleteObjects of keys[0..n) strictly (a DeleteResult of Deleted and Error
 * entries naming keys that were asked for, nothing else) and sets failed[i] for each key it lists
 * as an Error (failed is zeroed by the caller). Returns how many failed, or -1 when the answer is
 * not such a document (then nothing can be taken as deleted). why: the first failure or the
 * refusal. */
int s3_parse_delete_result(const char *xml, size_t len, const char *const *keys, size_t n,
                           uint8_t *failed, char *why, size_t whylen);

/* A reusable easy handle for this thread (freed when the thread exits). */
CURL *s3_curl_handle(void);

#endif
