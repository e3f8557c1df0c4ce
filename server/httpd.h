/* Private to the daemon: server state, request context, routes, the error table and replies. */
#ifndef BLOBREF_HTTPD_H
#define BLOBREF_HTTPD_H

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>

#include "blobref/config.h"
#include "blobref/index.h"
#include "blobref/store.h"

/* Every error the API returns: a stable code, its HTTP status. */
enum br_api_error {
  E_BAD_HASH,
  E_DIGEST_MISMATCH,
  E_TOO_LARGE,
  E_BODY_TOO_LARGE,
  E_TOO_MANY_HASHES,
  E_NO_SPACE,
  E_INDEX_FULL,
  E_NOT_FOUND,
  E_NO_ROUTE,
  E_METHOD_NOT_ALLOWED,
  E_QUARANTINED,
  E_BAD_RANGE,
  E_RANGE_NOT_SATISFIABLE,
  E_URL_TOO_LONG,
  E_HEADERS_TOO_LARGE,
  E_BAD_JSON,
  E_BAD_CONTENT_TYPE,
  E_BAD_REQUEST,
  E_UNAUTHORIZED,
  E_FORBIDDEN,
  E_NOT_READY,
  E_TRY_AGAIN,
  E_STORE_UNAVAILABLE,
  E_INTERNAL,
  E__COUNT
};
const char *br_api_error_code(enum br_api_error e);
unsigned br_api_error_status(enum br_api_error e);

typedef struct br_server br_server;
struct request;

/* What a route's handler returns: the usual MHD result. Handlers queue exactly one response on
 * their final call, through the reply_* functions. */
typedef enum MHD_Result (*route_fn)(struct request *req);
/* Called with each chunk of the request body (routes that take one). Returns 0 to go on, or -1
 * after request_fail(): libmicrohttpd cannot queue a reply in the middle of a body, so the rest
 * of the body is read and dropped (up to a bound, then the connection is cut) and the error is
 * the reply. */
typedef int (*route_body_fn)(struct request *req, const char *data, size_t len);

struct route {
  const char *method;
  const char *pattern; /* "/v1/blobs/{hash}": one {hash} segment at most */
  unsigned scope;      /* BR_SCOPE_* needed */
  route_fn begin;      /* first call, headers known (may answer early); NULL = nothing */
  route_body_fn body;  /* body chunks; NULL = the route takes no body */
  route_fn finish;     /* after the whole body (or at once when there is none) */
};

enum request_phase { PHASE_NEW, PHASE_BODY, PHASE_SUSPENDED, PHASE_RESUMED, PHASE_ANSWERED };

struct request {
  br_server *srv;
  struct MHD_Connection *conn;
  const struct route *route;
  enum request_phase phase;
  int close_after; /* answer with Connection: close (framing errors: the rest is untrusted) */
  int query_cut;   /* the target had too many query arguments: see on_uri */
  const char *method;
  int is_head;
  uint8_t digest[BR_SHA256_LEN]; /* the {hash} of the URL, when the route has one */
  int has_digest;
  /* uploads */
  EVP_MD_CTX *sha;
  br_store_writer *writer;
  br_store *store;
  uint64_t received;
  uint64_t declared_length; /* Content-Length, or UINT64_MAX when absent (chunked) */
  int discard;              /* known blob without Expect: hash the body but do not store it */
  int touch_before_body;    /* a dedup touch was queued before the body was read */
  int gone;                 /* the touch found the blob absent or quarantined */
  char content_type[BR_MAX_CONTENT_TYPE + 1];
  /* what the finisher thread leaves for the resumed handler */
  int finish_rc;
  int created;
  enum br_api_error finish_error;
  char finish_message[sizeof(br_err)];
  /* an error to answer on the final call: found before a body-less request's end (keeps
   * keep-alive) or in the middle of a body (the rest is dropped) */
  int has_pending;
  enum br_api_error pending;
  char pending_message[160];
  uint64_t dropped; /* body bytes read and thrown away after the error */
  /* JSON bodies */
  char *body;
  size_t body_len, body_cap;
  unsigned status; /* what was answered, for /metrics */
  int route_index;
  enum job_kind { JOB_UPLOAD, JOB_TOUCH } job;
  struct request *next_job; /* finisher queue link */
};

struct br_server {
  br_config *cfg;
  br_index *index;
  br_store *stores[BR_MAX_STORES];
  int nstores;
  br_store *upload_store;
  struct blobcache *cache; /* small blobs' bytes; NULL when cache_size = 0 */
  struct MHD_Daemon *daemon;
  atomic_int ready;
  /* upload finishers: fsync + rename + index commit off the network threads */
  pthread_t *finishers;
  int nfinishers;
  pthread_mutex_t job_lock;
  pthread_cond_t job_cv;
  struct request *job_head, *job_tail;
  int jobs_stopping; /* finishers exit */
  int stopping;      /* no new jobs: uploads finishing now get 503 */
  atomic_int jobs_in_flight;
  /* requests between their first handler call and completion: SIGTERM waits for these */
  atomic_int requests_in_progress;
  atomic_int draining; /* SIGTERM seen: every answer closes its connection */
  /* metrics */
  atomic_uint_fast64_t requests[16][6]; /* [route index][status class 0, 1xx..5xx] */
  atomic_uint_fast64_t bytes_in, bytes_out, uploads_created, uploads_dedup;
  uint64_t started_ms;
};

/* http.c */
int br_server_start(br_server *srv, br_err *err);
void br_server_stop(br_server *srv);
br_store *br_server_store(br_server *srv, const char *name);
/* Hands a job (an upload to make durable and index, or a dedup touch) to a finisher thread and
 * suspends the connection until it is done; the route's finish handler then runs again with
 * phase PHASE_RESUMED. Returns -1 (nothing queued) when the server is stopping. */
int br_server_finish_async(struct request *req, enum job_kind job);

/* Remembers an error that is answered on the request's final call. */
void request_fail(struct request *req, enum br_api_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* reply.c: every response goes through these. Each returns the MHD result of queueing. */
enum MHD_Result reply_json(struct request *req, unsigned status, json_t *body); /* steals body */
enum MHD_Result reply_error(struct request *req, enum br_api_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
enum MHD_Result reply_response(struct request *req, unsigned status, struct MHD_Response *resp);
/* Serves a blob's bytes (or headers only, for HEAD), honouring Range, If-Range, If-None-Match. */
enum MHD_Result reply_blob(struct request *req, const br_record *rec, br_store *store,
                           const char *key);
/* 307 to url with a private Cache-Control. */
enum MHD_Result reply_redirect(struct request *req, const char *url);
/* The JSON view of a blob: {"sha256","size","url"} (lookup results). */
json_t *blob_json(const uint8_t digest[BR_SHA256_LEN], uint64_t size);
/* The JSON view of an upload result: blob_json plus "dedup". */
json_t *upload_result_json(const uint8_t digest[BR_SHA256_LEN], uint64_t size, int dedup);
/* Formats milliseconds since the epoch as RFC 3339 UTC. */
void format_time_ms(uint64_t ms, char *out, size_t outlen);

/* Parses a lookup body {"hashes":[...]} (bounded depth and count) into a malloc'd array of n
 * digests. Returns 0, or -1 with the error and its message. */
int lookup_parse(const char *body, size_t len, uint64_t max_hashes, uint8_t **digests, size_t *n,
                 enum br_api_error *e, char *msg, size_t msglen);

/* http_blobs.c, http_lookup.c, http_misc.c: the route handlers. */
extern const struct route br_routes[];
extern const size_t br_nroutes;
void request_free_upload(struct request *req);

#endif
