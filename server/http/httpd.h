/* Private to the HTTP front (server/http/): its state, the request context, routes, the error
 * table, replies and the request services that every handler uses. The only header besides the
 * other http/ ones that includes <microhttpd.h>. */
#ifndef BLOBREF_HTTP_HTTPD_H
#define BLOBREF_HTTP_HTTPD_H

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "blobref/config.h"
#include "blobref/header.h"
#include "blobref/index.h"
#include "blobref/sniff.h"
#include "blobref/store.h"
#include "core/server.h"
#include "http/front.h"

/* Every error the API returns: a stable code, its HTTP status. */
enum br_api_error {
  E_BAD_HASH,
  E_DIGEST_MISMATCH,
  E_TOO_LARGE,
  E_BODY_TOO_LARGE,
  E_TOO_MANY_HASHES,
  E_NO_SPACE,
  E_INDEX_FULL,
  E_INDEX_UNAVAILABLE,
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
  E_SPOOL_FULL,
  E_STORE_UNAVAILABLE,
  E_STORE_ERROR,
  E_RECONCILE_RUNNING,
  E_LOCATION_CHANGED,
  E_VERIFY_FAILED,
  E_TOO_MANY_LOCATIONS,
  E_KEY_IN_USE,
  E_BLOB_DELETING,
  E_JOB_CONFLICT,
  E_LEASE_NOT_FOUND,
  E_LEASE_FULL,
  E_LISTS_NOT_RECORDED,
  E_INTERNAL,
  E__COUNT
};
const char *br_api_error_code(enum br_api_error e);
unsigned br_api_error_status(enum br_api_error e);
/* The API error for a failed index write: a full map or a full volume is a 507, else 500. */
enum br_api_error index_error(int rc);
/* The API error for a store errno (br_store_writer_errno). */
enum br_api_error store_error_code(int e);

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
  br_http *http;  /* the front that took the request */
  br_server *srv; /* http->srv: the core (config, index, stores) */
  struct MHD_Connection *conn;
  const struct route *route;
  enum request_phase phase;
  int close_after; /* answer with Connection: close (framing errors: the rest is untrusted) */
  int query_cut;   /* the target had too many query arguments: see on_uri */
  const char *method;
  int is_head;
  int preview;                   /* GET .../preview: private, no-store; inline only for images */
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
  int absent_before_body;   /* PUT on a shared index: the record was absent before the body */
  int gone;                 /* the touch found the blob absent or quarantined */
  char content_type[BR_MAX_CONTENT_TYPE + 1];
  /* no type or octet-stream: the first BR_SNIFF_BYTES of the body, gathered for detection */
  int sniff_wanted;
  unsigned char *sniff_buf; /* owned, NULL until the first chunk; freed with the request */
  size_t sniff_len;
  /* what the finisher thread leaves for the resumed handler */
  int finish_rc;
  int created;
  enum br_api_error finish_error;
  char finish_message[sizeof(br_err)];
  /* an error to answer on the final call: found before a body-less request's end (keeps
   * keep-alive) or in the middle of a body (the rest is dropped) */
  int has_pending;
  unsigned retry_after_s; /* non-zero: the error answer's Retry-After */
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
  /* JOB_SLOW: job_fn on the slow pool (reads of stores: move checks, imports, commits, refs) */
  enum job_kind { JOB_UPLOAD, JOB_TOUCH, JOB_CALL, JOB_SLOW } job;
  void (*job_fn)(struct request *req); /* JOB_CALL, JOB_SLOW: run on a pool thread */
  void *job_data;                      /* owned by the route; freed on completion: */
  void (*job_free)(void *job_data);    /* by this when set, else by free() */
  struct request *next_job;            /* finisher queue link */
  struct request *next_spool;          /* paused-upload list link (request_wait_spool) */
  int spool_paused;                    /* on that list (under http->spool_lock) */
  /* observability (http_ops.c): the access log line, the latency histogram, step timings */
  const char *path;             /* libmicrohttpd's copy of the path: valid until completion */
  uint64_t start_ns;            /* first handler call (headers complete), monotonic */
  uint64_t body_start_ns;       /* first body byte seen */
  uint64_t bytes_in, bytes_out; /* body bytes received; body bytes answered */
  enum request_outcome { OUTCOME_NONE, OUTCOME_CACHE_HIT, OUTCOME_CACHE_MISS } outcome;
  char request_id[BR_MAX_REQUEST_ID + 1];
  char remote[48];
  char token_name[128];     /* the matched [token NAME], never the token */
  char lease[33];           /* the ?lease= of an upload or lookup, checked (h_leases.c) */
  int lease_job;            /* an upload's attach to its lease is queued (finisher, durable) */
  int sha_done;             /* the body has been hashed (upload_finish ran past the body) */
  uint64_t json_reserved;   /* bytes of max_json_inflight this request holds */
  struct conn_track *track; /* the connection's slow-client record */
};

#define BR_MAX_ROUTES 40 /* per-route counters; a check in routes.c keeps the table within it */

/* The HTTP front's state: its daemons, the finisher threads and their queue, and the request
 * counters. Owned by blobrefd between br_http_start and br_http_stop; srv outlives it. */
struct br_http {
  br_server *srv;
  const struct route *routes; /* the route table (routes.c), for labels and Allow headers */
  size_t nroutes;
  struct proxy_engine *proxy;      /* the curl multi loop behind proxied reads (proxy.c) */
  struct ops *ops;                 /* access log, request ids, auth table, slow clients (ops.c) */
  struct MHD_Daemon *daemon;       /* listen: HTTPS when tls_cert is set */
  struct MHD_Daemon *daemon_plain; /* listen_plain, when set: plain HTTP, same handlers */
  atomic_int ready;
  atomic_int refuse_connections; /* stopping: new connections are closed at once */
  /* finishers: fsync + rename + index commit, and short calls, off the network threads; the
   * slow pool: calls that read whole blobs from stores (JOB_SLOW), so that however long they
   * take, upload acknowledgements never wait for them. job_lock guards both queues and the two
   * flags; it is never held while a job runs. */
  struct job_pool {
    br_http *http;
    pthread_t *threads;
    int nthreads;
    pthread_cond_t cv;
    struct request *head, *tail;
    atomic_int jobs; /* queued or running */
  } finish_pool, slow_pool;
  pthread_mutex_t job_lock;
  int jobs_stopping; /* pool threads exit */
  int stopping;      /* no new jobs: uploads finishing now get 503 */
  atomic_int jobs_in_flight;
  /* uploads paused while their S3 spool drains (request_wait_spool): spool_lock guards the list
   * and the flag; the spool thread resumes them */
  pthread_t spool_thread;
  int spool_thread_started;
  pthread_mutex_t spool_lock;
  pthread_cond_t spool_cv;
  struct request *spool_head;
  int spool_stopping;
  /* requests between their first handler call and completion: SIGTERM waits for these */
  atomic_int requests_in_progress;
  atomic_int draining; /* SIGTERM seen: every answer closes its connection */
  /* metrics */
  atomic_uint_fast64_t requests[BR_MAX_ROUTES][6]; /* [route index][status class 0, 1xx..5xx] */
  atomic_uint_fast64_t latency[BR_MAX_ROUTES]
                              [LATENCY_BUCKETS + 1]; /* [route][bucket], not cumulative */
  atomic_uint_fast64_t latency_sum_ns[BR_MAX_ROUTES];
  atomic_uint_fast64_t upload_step_ns[UPLOAD_STEPS];
  atomic_uint_fast64_t cache_hits, cache_misses;
  atomic_uint_fast64_t json_inflight; /* bytes reserved by buffered JSON bodies */
  atomic_uint_fast64_t json_refused;  /* JSON bodies refused for want of budget */
  atomic_uint_fast64_t slow_cut[2];   /* connections cut: [0] slow head, [1] slow body */
  atomic_uint_fast64_t bytes_in, bytes_out, uploads_created, uploads_dedup;
  atomic_uint_fast64_t read_digest_mismatch; /* store reads whose bytes were not the blob */
  struct rehasher *rehasher;          /* changed big in-place files hashed again (rehash.c) */
  atomic_uint_fast64_t proxy_retries; /* proxied transfers tried again (proxy.c) */
  atomic_uint_fast64_t direct_rehash_bytes, direct_rehash_ns; /* direct uploads re-hashed */
};

/* request.c: services every handler uses. */
/* Remembers an error that is answered on the request's final call. */
void request_fail(struct request *req, enum br_api_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Hands a job (an upload to make durable and index, a dedup touch, or req->job_fn for JOB_CALL)
 * to a finisher thread and suspends the connection until it is done; the route's finish handler
 * then runs again with phase PHASE_RESUMED. Returns -1 (nothing queued) when the front is
 * stopping. */
int request_finish_async(struct request *req, enum job_kind job);
/* The bounded JSON body reader that routes taking JSON use as their body callback. */
int json_body(struct request *req, const char *data, size_t len);
/* Names an upload's type from the first bytes gathered (once; a no-op unless sniff_wanted) and
 * tells the writer, which may start a multipart upload with it as soon as the first part is
 * full. Runs on the network thread once BR_SNIFF_BYTES are in, else on the finisher. */
void request_sniff_finish(struct request *req);
/* Drops an upload's writer and hash context (an upload that is not kept). */
void request_free_upload(struct request *req);
/* Starts and stops the finisher threads (br_http_start, br_http_stop). */
int request_finishers_start(br_http *http, br_err *err);
void request_finishers_stop(br_http *http);
/* Pauses an upload whose writer is backlogged (br_store_write_backlogged): suspends the
 * connection until the spool thread sees the writer take bytes again. Call it from the body
 * callback; does nothing once the front stops. */
void request_wait_spool(struct request *req);
/* The thread that resumes paused uploads; stopping resumes every one of them (before
 * libmicrohttpd stops: it must not stop with a connection suspended). */
int request_spool_start(br_http *http, br_err *err);
void request_spool_stop(br_http *http);

/* reply.c: every response goes through these. Each returns the MHD result of queueing. */
enum MHD_Result reply_json(struct request *req, unsigned status, json_t *body); /* steals body */
enum MHD_Result reply_error(struct request *req, enum br_api_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
enum MHD_Result reply_response(struct request *req, unsigned status, struct MHD_Response *resp);
/* The body of an error reply, {"error":{"code","message"}}, for a reply that adds fields. */
json_t *error_body(enum br_api_error e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The Content-Type a blob is served with: its record's when that passes the header grammar,
 * else application/octet-stream (a record written before the grammar, or by hand). Borrowed
 * from rec or static. */
const char *blob_content_type(const br_record *rec);
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

/* JSON text built in place, for pages of many records (GET /v1/blobs): no jansson object per
 * field. failed: out of memory, or a string that is not UTF-8 (which jansson refuses too). */
struct json_text {
  char *buf;
  size_t len, cap;
  int failed;
};
/* Appends n raw bytes / s as a JSON string (escaped as jansson's JSON_COMPACT dump does). */
void json_text_raw(struct json_text *t, const char *s, size_t n);
void json_text_str(struct json_text *t, const char *s);
/* Appends blob_record_json(digest, rec) as json_dumps(JSON_COMPACT) would write it, byte for
 * byte. 0, or -1 (t->failed). */
int blob_record_text(struct json_text *t, const uint8_t digest[BR_SHA256_LEN],
                     const br_record *rec);
/* Replies with t's text (and a newline) as reply_json does; takes t->buf (also on failure). */
enum MHD_Result reply_json_text(struct request *req, unsigned status, struct json_text *t);

#endif
