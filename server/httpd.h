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
  E_STORE_ERROR,
  E_RECONCILE_RUNNING,
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
  struct proxy_job *proxy; /* a proxied read from an S3/http store (http_proxy.c) */
  char boundary[64];       /* multipart/byteranges boundary, kept across a suspension */
  uint64_t run_id;         /* the {id} of /v1/reconcile/runs/{id} */
  enum job_kind { JOB_UPLOAD, JOB_TOUCH, JOB_CALL } job;
  void (*job_fn)(struct request *req); /* JOB_CALL: run on a finisher thread */
  void *job_data;                      /* owned by the route; freed (free()) on completion */
  struct request *next_job;            /* finisher queue link */
};

#define BLOB_LOCKS 256

struct br_server {
  br_config *cfg;
  br_index *index;
  br_store *stores[BR_MAX_STORES];
  int nstores;
  br_store *upload_store;
  struct blobcache *cache;    /* small blobs' bytes; NULL when cache_size = 0 */
  struct proxy_engine *proxy; /* the curl multi loop behind proxied reads */
  /* store health, refreshed by the health thread: 0 ok, else the message in store_error */
  atomic_int store_ok[BR_MAX_STORES];
  char store_error[BR_MAX_STORES][sizeof(br_err)];
  pthread_mutex_t health_lock;
  pthread_mutex_t blob_locks[BLOB_LOCKS]; /* uploads vs reconcile's deletes, by hash */
  struct reconcile_runner *reconcile;     /* http_reconcile.c */
  struct cdn_purger *purger;              /* cdn_purge.c: purges when blobs go */
  struct mover *mover;                    /* http_move.c: deletes draining copies */
  pthread_t health_thread;
  int health_running;
  pthread_cond_t health_cv;
  struct MHD_Daemon *daemon;
  atomic_int ready;
  atomic_int refuse_connections; /* stopping: new connections are closed at once */
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
/* Locks (lock = 1) or unlocks the stripe of digest: held by an upload's commit and by reconcile's
 * final delete of the same hash, and by admin state changes. */
void br_server_lock_blob(br_server *srv, const uint8_t digest[BR_SHA256_LEN], int lock);
/* A blob stopped being servable (quarantined, held, deleted): forget its cached bytes and queue
 * its purge at the CDNs. */
void br_server_blob_gone(br_server *srv, const uint8_t digest[BR_SHA256_LEN]);
/* http_reconcile.c: the run thread (periodic and on demand). */
int reconcile_start(br_server *srv, br_err *err);
void reconcile_stop(br_server *srv);
/* Appends reconcile's Prometheus lines. */
struct text;
void reconcile_metrics(br_server *srv, void (*emit)(void *ud, const char *line), void *ud);

/* http_move.c: the drain thread (deletes moved blobs' old copies after drain_grace). */
int move_start(br_server *srv, br_err *err);
void move_stop(br_server *srv);

/* 0 when every store passed its last health check, else -1 with the first problem in msg. */
int br_server_store_health(br_server *srv, char *msg, size_t msglen);
/* Hands a job (an upload to make durable and index, or a dedup touch) to a finisher thread and
 * suspends the connection until it is done; the route's finish handler then runs again with
 * phase PHASE_RESUMED. Returns -1 (nothing queued) when the server is stopping. */
int br_server_finish_async(struct request *req, enum job_kind job);

/* http_proxy.c: reads from stores that are read over HTTP, without blocking network threads. */
int proxy_engine_start(br_server *srv, br_err *err);
/* Fails every proxied read in progress (their connections resume) and stops the loop. */
void proxy_engine_stop(br_server *srv);
/* One piece of a proxied body: literal bytes (literal_len > 0), or len bytes of the object from
 * first. */
struct proxy_part {
  const char *literal;
  size_t literal_len;
  uint64_t first, len;
};
/* Starts fetching the pieces from url and suspends req; the route's finish handler runs again
 * (PHASE_RESUMED, req->proxy set) once the origin answered (collect = 0) or the whole body is
 * in memory (collect = 1). Returns 0, or -1 with err (nothing started, not suspended). */
int proxy_start(struct request *req, const char *url, const struct proxy_part *parts, size_t n,
                int collect, br_err *err);
/* After the resume: 0, or -1 with the failure in msg (*status: the origin's HTTP status, 0 when
 * it could not be reached). */
int proxy_result(struct request *req, long *status, char *msg, size_t msglen);
/* collect = 1: the bytes received. */
const char *proxy_collected(struct request *req, size_t *len);
/* A response whose size-byte body streams from the transfer. */
struct MHD_Response *proxy_response(struct request *req, uint64_t size);
/* Releases the request's hold on its proxied read (on completion). */
void proxy_request_done(struct request *req);

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
/* 307 to url with a private Cache-Control whose max-age is cache_max_age, and at most half of
 * valid_ms (how long the URL works; UINT64_MAX: no limit). */
enum MHD_Result reply_redirect(struct request *req, const char *url, uint64_t valid_ms);
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
/* The API error for a store errno (br_store_writer_errno). */
enum br_api_error store_error_code(int e);

#endif
