/* Private to the daemon: server state, request context, routes, the error table and replies. */
#ifndef BLOBREF_HTTPD_H
#define BLOBREF_HTTPD_H

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

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

/* Latency histogram buckets (upper bounds in seconds) and the upload steps timed. */
#define LATENCY_BUCKETS 14
extern const double br_latency_bounds[LATENCY_BUCKETS];
enum upload_step {
  STEP_RECEIVE,      /* first body byte to the last */
  STEP_HASH,         /* SHA-256 of the body */
  STEP_STORE_WRITE,  /* handing bytes to the store (write(2), a multipart part) */
  STEP_STORE_COMMIT, /* fsync and rename (fs), the last part and completion (s3) */
  STEP_INDEX_COMMIT, /* the LMDB commit of the record */
  UPLOAD_STEPS
};
extern const char *const br_upload_step_names[UPLOAD_STEPS];
/* Store errors counted by operation. */
enum store_op { STORE_OP_READ, STORE_OP_WRITE, STORE_OP_CHECK, STORE_OPS };

/* Monotonic nanoseconds, for step timings. */
static inline uint64_t br_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

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
  const char *pattern; /* "/v1/blobs/{hash}": one {hash}, {id} or {file} segment at most */
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
  /* observability (http_ops.c): the access log line, the latency histogram, step timings */
  const char *path;             /* libmicrohttpd's copy of the path: valid until completion */
  uint64_t start_ns;            /* first handler call (headers complete), monotonic */
  uint64_t body_start_ns;       /* first body byte seen */
  uint64_t bytes_in, bytes_out; /* body bytes received; body bytes answered */
  enum request_outcome { OUTCOME_NONE, OUTCOME_CACHE_HIT, OUTCOME_CACHE_MISS } outcome;
  char request_id[65];
  char remote[48];
  char token_name[128];     /* the matched [token NAME], never the token */
  uint64_t json_reserved;   /* bytes of max_json_inflight this request holds */
  struct conn_track *track; /* the connection's slow-client record */
};

#define BLOB_LOCKS 256
#define BR_MAX_ROUTES 32 /* per-route counters; a check in http_blobs.c keeps the table within it */

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
  struct MHD_Daemon *daemon;       /* listen: HTTPS when tls_cert is set */
  struct MHD_Daemon *daemon_plain; /* listen_plain, when set: plain HTTP, same handlers */
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
  atomic_uint_fast64_t requests[BR_MAX_ROUTES][6]; /* [route index][status class 0, 1xx..5xx] */
  atomic_uint_fast64_t latency[BR_MAX_ROUTES][LATENCY_BUCKETS + 1]; /* [route][bucket], not cumulative */
  atomic_uint_fast64_t latency_sum_ns[BR_MAX_ROUTES];
  atomic_uint_fast64_t upload_step_ns[UPLOAD_STEPS];
  atomic_uint_fast64_t cache_hits, cache_misses;
  atomic_uint_fast64_t store_errors[BR_MAX_STORES][STORE_OPS];
  atomic_uint_fast64_t json_inflight; /* bytes reserved by buffered JSON bodies */
  atomic_uint_fast64_t json_refused;  /* JSON bodies refused for want of budget */
  atomic_uint_fast64_t slow_cut[2];   /* connections cut: [0] slow head, [1] slow body */
  struct ops *ops;                    /* access log, request ids, auth table, slow clients */
  atomic_uint_fast64_t bytes_in, bytes_out, uploads_created, uploads_dedup;
  uint64_t started_ms;
};

/* http_ops.c: the operator's side of requests. */
/* Sets up the access log, request ids, trusted proxies, the auth table and the slow-client
 * sweeper from srv->cfg. Returns -1 with err (a bad trusted_proxies, an access log that cannot be
 * opened). */
int ops_start(br_server *srv, br_err *err);
void ops_stop(br_server *srv);
/* SIGHUP: takes what can change safely from a freshly loaded config (tokens, anonymous scopes,
 * access log path, trusted proxies, request limits) and reopens the access log; logs each setting
 * that differs but needs a restart. Returns -1 with err when nothing was applied. */
int ops_reload(br_server *srv, const br_config *fresh, br_err *err);
/* First handler call: request id, remote address, start time. */
void ops_request_begin(struct request *req);
/* Completion: latency histogram, access log line. */
void ops_request_end(struct request *req);
/* Scopes of the request (see http.c); fills req->token_name. -1: an unknown bearer token. */
int ops_granted_scopes(struct request *req, unsigned *scopes);
/* Takes n more bytes of the global JSON budget for req. -1 when it would go over. */
int ops_json_reserve(struct request *req, uint64_t n);
void ops_json_release(struct request *req);
/* libmicrohttpd's connection notifications (slow-client tracking). */
void ops_notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe);
/* Where the connection's request is, for the slow-client sweeper: waiting for a head
 * (TRACK_HEAD: after it opened or its previous request ended), reading a body (TRACK_BODY: the
 * head is complete), or neither (TRACK_BUSY: body complete, being answered). */
enum { TRACK_HEAD, TRACK_BODY, TRACK_BUSY, TRACK_CUT };
void ops_track(struct request *req, int state);
/* req->bytes_in changed (TRACK_BODY). */
void ops_track_body(struct request *req);
/* Counts a failure of store (by pointer) for blobref_store_errors_total. */
void ops_store_error(br_server *srv, const br_store *store, enum store_op op);

/* http_tls.c: the certificate for HTTPS handshakes. */
/* Loads and checks (key matches, not expired) a PEM pair and makes it the one new handshakes
 * use. Returns -1 with err (the previous pair, if any, stays). Not thread-safe against itself. */
int tls_load(const char *cert_path, const char *key_path, br_err *err);
/* The gnutls_certificate_retrieve_function2 for MHD_OPTION_HTTPS_CERT_CALLBACK. */
void *tls_cert_callback(void);
void tls_unload(void);

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
                int collect, uint64_t stall_ms, br_err *err);
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
/* The JSON view of an index record (GET /v1/blobs/{hash}/meta, one entry of GET /v1/blobs). */
json_t *blob_record_json(const uint8_t digest[BR_SHA256_LEN], const br_record *rec);
/* Formats milliseconds since the epoch as RFC 3339 UTC. */
void format_time_ms(uint64_t ms, char *out, size_t outlen);

/* Parses a lookup body {"hashes":[...]} (bounded depth and count) into a malloc'd array of n
 * digests. Returns 0, or -1 with the error and its message. */
int lookup_parse(const char *body, size_t len, uint64_t max_hashes, uint8_t **digests, size_t *n,
                 enum br_api_error *e, char *msg, size_t msglen);

/* http_blobs.c, http_lookup.c, http_misc.c: the route handlers. */
extern const struct route br_routes[];
extern const size_t br_nroutes;
/* The bounded JSON body reader (http_lookup.c) that routes taking JSON use as their body. */
int json_body(struct request *req, const char *data, size_t len);
void request_free_upload(struct request *req);
/* The API error for a store errno (br_store_writer_errno). */
enum br_api_error store_error_code(int e);

#endif
