/* /healthz, /readyz and /metrics (Prometheus text format). */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blobref/version.h"
#include "core/cdn_purge.h"
#include "core/direct_plans.h"
#include "core/reconcile_runner.h"
#include "http/handlers.h"
#include "http/ops.h"

enum MHD_Result health_get(struct request *req) {
  return reply_json(req, MHD_HTTP_OK,
                    json_pack("{s:s, s:s}", "status", "ok", "version", BLOBREF_VERSION));
}

enum MHD_Result ready_get(struct request *req) {
  if (!atomic_load(&req->http->ready)) return reply_error(req, E_NOT_READY, "starting or stopping");
  if (!br_index_ready(req->srv->index))
    return reply_error(req, E_NOT_READY, "the index database is unavailable");
  char msg[sizeof(br_err)];
  if (br_server_store_health(req->srv, msg, sizeof msg) < 0) {
    /* which store failed and why is a detail for /metrics' readers (private_metrics) */
    if (ops_metrics_access(req) != E__COUNT)
      return reply_error(req, E_NOT_READY, "a store is unavailable");
    return reply_error(req, E_NOT_READY, "%s", msg);
  }
  return reply_json(req, MHD_HTTP_OK, json_pack("{s:s}", "status", "ready"));
}

struct text {
  char *buf;
  size_t len, cap;
};

static void appendf(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void appendf(struct text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->buf && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap ? t->cap * 2 : 8192;
    while (cap < t->len + (size_t)n + 1) cap *= 2;
    char *grown = realloc(t->buf, cap);
    if (!grown) return;
    t->buf = grown;
    t->cap = cap;
  }
}

static void emit_line(void *ud, const char *line) { appendf(ud, "%s", line); }

/* Blobs and bytes by state, for the operator console's overview, from the index's exact
 * counters (kept by its writer: reading them never walks the index). An index without counters
 * (PostgreSQL) is walked instead, at most every CENSUS_MAX_AGE_MS, on a finisher thread (a walk
 * of millions of records never holds a network thread); /metrics requests in between get the
 * last figures, and each walk counts in blobref_index_census_walks_total. */
#define CENSUS_MAX_AGE_MS 10000
enum { CENSUS_LIVE, CENSUS_QUARANTINED, CENSUS_HELD, CENSUS_DELETING, CENSUS_STATES };
static const char *const census_names[CENSUS_STATES] = {"live", "quarantined", "held", "deleting"};
struct census {
  uint64_t blobs[CENSUS_STATES], bytes[CENSUS_STATES];
  /* live blobs with a location in srv->stores[i] (a blob in two stores counts in both) */
  uint64_t store_blobs[BR_MAX_STORES], store_bytes[BR_MAX_STORES];
};
struct census_walk_state {
  br_counts *c;
};
static pthread_mutex_t census_lock = PTHREAD_MUTEX_INITIALIZER; /* guards census_last, _at */
static pthread_mutex_t census_walk = PTHREAD_MUTEX_INITIALIZER; /* one walk at a time */
static br_counts census_last;
static uint64_t census_at_ms;
static atomic_uint_fast64_t census_walks;

static int census_add(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  br_counts_change(ud, NULL, rec);
  return 0;
}

static uint64_t nonneg(int64_t v) { return v > 0 ? (uint64_t)v : 0; }

/* The figures of counts for srv's stores. */
static void census_of(br_server *srv, const br_counts *counts, struct census *c) {
  memset(c, 0, sizeof *c);
  for (int s = 0; s < CENSUS_STATES; s++) {
    const br_count *e = br_counts_find(counts, "", s);
    if (e) c->blobs[s] = nonneg(e->blobs), c->bytes[s] = nonneg(e->bytes);
  }
  for (int i = 0; i < srv->nstores && i < BR_MAX_STORES; i++) {
    const br_count *e = br_counts_find(counts, br_store_name(srv->stores[i]), BR_STATE_LIVE);
    if (e) c->store_blobs[i] = nonneg(e->blobs), c->store_bytes[i] = nonneg(e->bytes);
  }
}

/* The walk's last figures into out; *stale: they are missing or older than CENSUS_MAX_AGE_MS. */
static void census_now(br_counts *out, int *stale) {
  uint64_t now = br_now_ms();
  pthread_mutex_lock(&census_lock);
  *stale = !census_at_ms || now - census_at_ms >= CENSUS_MAX_AGE_MS;
  if (out) *out = census_last;
  pthread_mutex_unlock(&census_lock);
}

/* A finisher job (JOB_CALL): walks the index unless a walk that ended meanwhile made the figures
 * fresh. A failed walk is logged and leaves the previous figures. */
static void census_refresh(struct request *req) {
  pthread_mutex_lock(&census_walk);
  int stale;
  census_now(NULL, &stale);
  br_counts *fresh = stale ? malloc(sizeof *fresh) : NULL;
  if (fresh) {
    br_counts_clear(fresh);
    br_err err;
    atomic_fetch_add(&census_walks, 1);
    if (br_index_foreach(req->srv->index, census_add, fresh, &err) == 0) {
      pthread_mutex_lock(&census_lock);
      census_last = *fresh;
      census_at_ms = br_now_ms();
      pthread_mutex_unlock(&census_lock);
    } else {
      br_error("metrics: index census: %s", err.msg);
    }
  }
  free(fresh);
  pthread_mutex_unlock(&census_walk);
}

/* Prometheus text format 0.0.4; every family has HELP and TYPE, so that `promtool check metrics`
 * (tests/integration/test_metrics.py) finds nothing to say. */
enum MHD_Result metrics_get(struct request *req) {
  br_server *srv = req->srv;
  br_http *http = req->http;
  if (req->phase != PHASE_RESUMED) {
    enum br_api_error denied = ops_metrics_access(req);
    if (denied != E__COUNT)
      return reply_error(req, denied,
                         denied == E_FORBIDDEN ? "/metrics needs the metrics or admin scope"
                                               : "/metrics needs a bearer token (private_metrics)");
  }
  br_counts *counts = malloc(sizeof *counts);
  if (!counts) return reply_error(req, E_INTERNAL, "out of memory");
  br_err cerr;
  int kept = br_index_counts(srv->index, counts, &cerr);
  if (kept < 0) br_error("metrics: index counters: %s", cerr.msg);
  if (kept != 0) { /* no counters: the walk's figures */
    int stale;
    census_now(NULL, &stale);
    if (stale && req->phase != PHASE_RESUMED) {
      free(counts);
      req->job_fn = census_refresh; /* answered when it is done (or now, when stopping) */
      if (request_finish_async(req, JOB_CALL) == 0) return MHD_YES;
      counts = malloc(sizeof *counts);
      if (!counts) return reply_error(req, E_INTERNAL, "out of memory");
    }
    census_now(counts, &stale);
  }
  struct census census;
  census_of(srv, counts, &census);
  free(counts);
  struct text t = {0};
  appendf(&t,
          "# HELP blobref_build_info The running version (always 1).\n"
          "# TYPE blobref_build_info gauge\nblobref_build_info{version=\"%s\"} 1\n",
          BLOBREF_VERSION);
  appendf(&t,
          "# HELP blobref_http_requests_total HTTP requests answered, by route and status "
          "class.\n# TYPE blobref_http_requests_total counter\n");
  for (size_t r = 0; r < http->nroutes && r < BR_MAX_ROUTES; r++)
    for (int c = 1; c <= 5; c++) {
      uint64_t v = atomic_load(&http->requests[r][c]);
      if (v)
        appendf(&t,
                "blobref_http_requests_total{route=\"%s\",method=\"%s\",code=\"%dxx\"} %" PRIu64
                "\n",
                http->routes[r].pattern, http->routes[r].method, c, v);
    }
  appendf(&t,
          "# HELP blobref_http_request_duration_seconds Time from a request's complete head to "
          "its completion, by route.\n"
          "# TYPE blobref_http_request_duration_seconds histogram\n");
  for (size_t r = 0; r < http->nroutes && r < BR_MAX_ROUTES; r++) {
    uint64_t cum = 0;
    const char *pat = http->routes[r].pattern, *m = http->routes[r].method;
    for (int b = 0; b <= LATENCY_BUCKETS; b++) {
      cum += atomic_load(&http->latency[r][b]);
      if (b < LATENCY_BUCKETS)
        appendf(&t,
                "blobref_http_request_duration_seconds_bucket{route=\"%s\",method=\"%s\","
                "le=\"%g\"} %" PRIu64 "\n",
                pat, m, br_latency_bounds[b], cum);
      else
        appendf(&t,
                "blobref_http_request_duration_seconds_bucket{route=\"%s\",method=\"%s\","
                "le=\"+Inf\"} %" PRIu64 "\n",
                pat, m, cum);
    }
    appendf(&t,
            "blobref_http_request_duration_seconds_sum{route=\"%s\",method=\"%s\"} %.9f\n"
            "blobref_http_request_duration_seconds_count{route=\"%s\",method=\"%s\"} %" PRIu64 "\n",
            pat, m, (double)atomic_load(&http->latency_sum_ns[r]) / 1e9, pat, m, cum);
  }
  appendf(&t,
          "# HELP blobref_upload_step_seconds_total Time uploads spent in each step, summed "
          "over all uploads.\n# TYPE blobref_upload_step_seconds_total counter\n");
  for (int s = 0; s < UPLOAD_STEPS; s++)
    appendf(&t, "blobref_upload_step_seconds_total{step=\"%s\"} %.9f\n", br_upload_step_names[s],
            (double)atomic_load(&http->upload_step_ns[s]) / 1e9);
  appendf(&t,
          "# HELP blobref_store_errors_total Failed store operations, by store and operation.\n"
          "# TYPE blobref_store_errors_total counter\n");
  static const char *const ops[STORE_OPS] = {"read", "write", "check"};
  for (int i = 0; i < srv->nstores; i++)
    for (int o = 0; o < STORE_OPS; o++)
      appendf(&t, "blobref_store_errors_total{store=\"%s\",op=\"%s\"} %" PRIu64 "\n",
              br_store_name(srv->stores[i]), ops[o], atomic_load(&srv->store_errors[i][o]));
  unsigned conns = 0;
  struct MHD_Daemon *daemons[2] = {http->daemon, http->daemon_plain};
  for (int d = 0; d < 2; d++) {
    const union MHD_DaemonInfo *di =
        daemons[d] ? MHD_get_daemon_info(daemons[d], MHD_DAEMON_INFO_CURRENT_CONNECTIONS) : NULL;
    if (di) conns += di->num_connections;
  }
  br_index_stats is;
  br_index_get_stats(srv->index, &is);
  if (strcmp(br_index_kind(srv->index), "lmdb")) /* a shared index: its counters, no count(*) */
    for (int s = 0; s < CENSUS_STATES; s++) is.entries += census.blobs[s];
  appendf(&t,
          "# HELP blobref_uploads_total Uploads acknowledged, by result.\n"
          "# TYPE blobref_uploads_total counter\n"
          "blobref_uploads_total{result=\"created\"} %" PRIu64
          "\n"
          "blobref_uploads_total{result=\"dedup\"} %" PRIu64
          "\n"
          "# HELP blobref_cache_requests_total Lookups in the small-blob cache, by result.\n"
          "# TYPE blobref_cache_requests_total counter\n"
          "blobref_cache_requests_total{result=\"hit\"} %" PRIu64
          "\n"
          "blobref_cache_requests_total{result=\"miss\"} %" PRIu64
          "\n"
          "# HELP blobref_read_digest_mismatch_total Reads from a store whose bytes were not the "
          "blob (proxied: cut before the end; fetched for the cache: 503).\n"
          "# TYPE blobref_read_digest_mismatch_total counter\nblobref_read_digest_mismatch_total "
          "%" PRIu64
          "\n"
          "# HELP blobref_proxy_retries_total Proxied reads from a store tried again after a 5xx "
          "or a broken connection, before any byte of them went out.\n"
          "# TYPE blobref_proxy_retries_total counter\nblobref_proxy_retries_total %" PRIu64
          "\n"
          "# HELP blobref_connections_open Client connections open now.\n"
          "# TYPE blobref_connections_open gauge\nblobref_connections_open %u\n"
          "# HELP blobref_json_inflight_bytes Bytes of JSON request bodies buffered now.\n"
          "# TYPE blobref_json_inflight_bytes gauge\nblobref_json_inflight_bytes %" PRIu64
          "\n"
          "# HELP blobref_json_refused_total JSON bodies refused: max_json_inflight was reached.\n"
          "# TYPE blobref_json_refused_total counter\nblobref_json_refused_total %" PRIu64
          "\n"
          "# HELP blobref_slow_clients_cut_total Connections cut for a slow request head or "
          "body.\n# TYPE blobref_slow_clients_cut_total counter\n"
          "blobref_slow_clients_cut_total{phase=\"head\"} %" PRIu64
          "\n"
          "blobref_slow_clients_cut_total{phase=\"body\"} %" PRIu64 "\n",
          atomic_load(&http->uploads_created), atomic_load(&http->uploads_dedup),
          atomic_load(&http->cache_hits), atomic_load(&http->cache_misses),
          atomic_load(&http->read_digest_mismatch), atomic_load(&http->proxy_retries), conns,
          atomic_load(&http->json_inflight), atomic_load(&http->json_refused),
          atomic_load(&http->slow_cut[0]), atomic_load(&http->slow_cut[1]));
  appendf(&t,
          "# HELP blobref_pool_jobs Requests handed to a pool, queued or running: finish (upload "
          "acknowledgements, short calls), slow (move and import checks, commits, refs).\n"
          "# TYPE blobref_pool_jobs gauge\nblobref_pool_jobs{pool=\"finish\"} %d\n"
          "blobref_pool_jobs{pool=\"slow\"} %d\n",
          atomic_load(&http->finish_pool.jobs), atomic_load(&http->slow_pool.jobs));
  appendf(&t,
          "# HELP blobref_direct_rehash_bytes_total Bytes of direct uploads read back and hashed "
          "on commit (stores that do not check the signed checksum).\n"
          "# TYPE blobref_direct_rehash_bytes_total counter\nblobref_direct_rehash_bytes_total "
          "%" PRIu64
          "\n"
          "# HELP blobref_direct_rehash_seconds_total Time spent re-hashing them.\n"
          "# TYPE blobref_direct_rehash_seconds_total counter\n"
          "blobref_direct_rehash_seconds_total %.9f\n"
          "# HELP blobref_store_direct_uploads Direct uploads per store: 0 none, 1 checked by the "
          "store (trusted), 2 re-hashed on commit.\n# TYPE blobref_store_direct_uploads gauge\n",
          atomic_load(&http->direct_rehash_bytes),
          (double)atomic_load(&http->direct_rehash_ns) / 1e9);
  for (int i = 0; i < srv->nstores; i++)
    appendf(&t, "blobref_store_direct_uploads{store=\"%s\"} %d\n", br_store_name(srv->stores[i]),
            (int)br_store_direct_mode(srv->stores[i]));
  appendf(&t,
          "# HELP blobref_direct_plans_pending Direct-upload plans handed out and neither "
          "committed, aborted nor swept yet (DATA_DIR/direct-plans.log; on PostgreSQL every "
          "node's, and 0 on a node none of whose stores offers direct uploads).\n"
          "# TYPE blobref_direct_plans_pending gauge\nblobref_direct_plans_pending %" PRIu64
          "\n"
          "# HELP blobref_direct_plans_swept_total Objects and multipart uploads of expired "
          "plans removed by the sweep.\n"
          "# TYPE blobref_direct_plans_swept_total counter\nblobref_direct_plans_swept_total "
          "%" PRIu64 "\n",
          direct_plans_pending(srv), direct_plans_swept(srv));
  appendf(&t,
          "# HELP blobref_spool_bytes Upload bytes spooled for S3 and not yet sent.\n"
          "# TYPE blobref_spool_bytes gauge\nblobref_spool_bytes %" PRIu64 "\n",
          br_store_spooled_bytes());
  appendf(&t,
          "# HELP blobref_received_bytes_total Upload body bytes received.\n"
          "# TYPE blobref_received_bytes_total counter\nblobref_received_bytes_total %" PRIu64
          "\n"
          "# HELP blobref_served_bytes_total Blob body bytes served.\n"
          "# TYPE blobref_served_bytes_total counter\nblobref_served_bytes_total %" PRIu64
          "\n"
          "# HELP blobref_index_commits_total LMDB write transactions committed.\n"
          "# TYPE blobref_index_commits_total counter\nblobref_index_commits_total %" PRIu64
          "\n"
          "# HELP blobref_index_operations_total Index writes batched into those commits.\n"
          "# TYPE blobref_index_operations_total counter\nblobref_index_operations_total %" PRIu64
          "\n"
          "# HELP blobref_index_entries Blobs in the index.\n"
          "# TYPE blobref_index_entries gauge\nblobref_index_entries %" PRIu64
          "\n"
          "# HELP blobref_index_map_bytes Size of the index's memory map.\n"
          "# TYPE blobref_index_map_bytes gauge\nblobref_index_map_bytes %" PRIu64
          "\n"
          "# HELP blobref_index_used_bytes Bytes of the map in use.\n"
          "# TYPE blobref_index_used_bytes gauge\nblobref_index_used_bytes %" PRIu64
          "\n"
          "# HELP blobref_index_record_cache_total Index reads answered from the record cache "
          "or not.\n# TYPE blobref_index_record_cache_total counter\n"
          "blobref_index_record_cache_total{result=\"hit\"} %" PRIu64
          "\nblobref_index_record_cache_total{result=\"miss\"} %" PRIu64
          "\n"
          "# HELP blobref_index_record_cache_entries Records the record cache can hold "
          "([index] record_cache, rounded up to a power of two).\n"
          "# TYPE blobref_index_record_cache_entries gauge\n"
          "blobref_index_record_cache_entries %" PRIu64
          "\n"
          "# HELP blobref_index_stale_readers_total Index reader slots of dead processes cleared "
          "(mdb_reader_check).\n# TYPE blobref_index_stale_readers_total counter\n"
          "blobref_index_stale_readers_total %" PRIu64
          "\n"
          "# HELP blobref_start_time_seconds When the server started, in seconds since the "
          "epoch.\n"
          "# TYPE blobref_start_time_seconds gauge\nblobref_start_time_seconds %" PRIu64 "\n",
          atomic_load(&http->bytes_in), atomic_load(&http->bytes_out), is.commits, is.ops,
          is.entries, is.map_size, is.map_used, is.cache_hits, is.cache_misses, is.cache_entries,
          is.stale_readers, srv->started_ms / 1000);
  appendf(&t,
          "# HELP blobref_index_change_notifications_total Change notifications heard from the "
          "nodes sharing the index (PostgreSQL).\n"
          "# TYPE blobref_index_change_notifications_total counter\n"
          "blobref_index_change_notifications_total %" PRIu64
          "\n"
          "# HELP blobref_index_cache_flushes_total Whole flushes of the record and blob caches "
          "(change listener connected again, big batches, bad payloads).\n"
          "# TYPE blobref_index_cache_flushes_total counter\n"
          "blobref_index_cache_flushes_total %" PRIu64
          "\n"
          "# HELP blobref_index_replica_reads_total Point reads answered by the read replica, "
          "or absent there and asked of the primary.\n"
          "# TYPE blobref_index_replica_reads_total counter\n"
          "blobref_index_replica_reads_total{result=\"found\"} %" PRIu64
          "\n"
          "blobref_index_replica_reads_total{result=\"retried_on_primary\"} %" PRIu64
          "\n"
          "# HELP blobref_index_writer_round_trips_total Times the index writer waited for "
          "PostgreSQL (a batch: its reads together, then its writes and commit; 0 on LMDB).\n"
          "# TYPE blobref_index_writer_round_trips_total counter\n"
          "blobref_index_writer_round_trips_total %" PRIu64 "\n",
          is.notifies, is.flushes, is.replica_reads, is.replica_retries, is.round_trips);
  appendf(&t,
          "# HELP blobref_index_map_nearly_full 1 when 80%% or more of the index's map is in use "
          "(raise index_map_size before uploads fail with index_full).\n"
          "# TYPE blobref_index_map_nearly_full gauge\nblobref_index_map_nearly_full %d\n"
          "# HELP blobref_index_census_walks_total Walks of the whole index for the per-state "
          "figures (only an index without counters is walked).\n"
          "# TYPE blobref_index_census_walks_total counter\n"
          "blobref_index_census_walks_total %" PRIu64
          "\n"
          "# HELP blobref_index_full_walks_total Scans of the index from its first record (the "
          "drain pass, a census or recount, a finish of deletes the counters cannot skip).\n"
          "# TYPE blobref_index_full_walks_total counter\nblobref_index_full_walks_total %" PRIu64
          "\n",
          is.map_size && is.map_used >= is.map_size / 5 * 4 ? 1 : 0,
          (uint64_t)atomic_load(&census_walks), is.full_walks);
  appendf(&t,
          "# HELP blobref_index_blobs Blobs in the index by state (exact counters; a PostgreSQL "
          "index: a walk at most every 10 s).\n# TYPE blobref_index_blobs gauge\n");
  for (int i = 0; i < CENSUS_STATES; i++)
    appendf(&t, "blobref_index_blobs{state=\"%s\"} %" PRIu64 "\n", census_names[i],
            census.blobs[i]);
  appendf(&t,
          "# HELP blobref_index_blob_bytes Bytes of the blobs in the index by state "
          "(exact counters).\n# TYPE blobref_index_blob_bytes gauge\n");
  for (int i = 0; i < CENSUS_STATES; i++)
    appendf(&t, "blobref_index_blob_bytes{state=\"%s\"} %" PRIu64 "\n", census_names[i],
            census.bytes[i]);
  appendf(&t,
          "# HELP blobref_store_up 1 when the store passed its last health check, 0 when it failed "
          "or was not checked yet.\n"
          "# TYPE blobref_store_up gauge\n");
  for (int i = 0; i < srv->nstores; i++)
    appendf(&t, "blobref_store_up{store=\"%s\"} %d\n", br_store_name(srv->stores[i]),
            atomic_load(&srv->store_ok[i]) == 1 ? 1 : 0);
  appendf(&t,
          "# HELP blobref_store_blobs Live blobs with a location in the store (exact "
          "counters).\n# TYPE blobref_store_blobs gauge\n");
  for (int i = 0; i < srv->nstores; i++)
    appendf(&t, "blobref_store_blobs{store=\"%s\"} %" PRIu64 "\n", br_store_name(srv->stores[i]),
            census.store_blobs[i]);
  appendf(&t,
          "# HELP blobref_store_blob_bytes Bytes of the live blobs with a location in the store "
          "(exact counters).\n# TYPE blobref_store_blob_bytes gauge\n");
  for (int i = 0; i < srv->nstores; i++)
    appendf(&t, "blobref_store_blob_bytes{store=\"%s\"} %" PRIu64 "\n",
            br_store_name(srv->stores[i]), census.store_bytes[i]);
  cdn_purge_stats ps;
  cdn_purger_stats(srv->purger, &ps);
  appendf(&t,
          "# HELP blobref_cdn_purges_total CDN purges sent, by result (failures are retried).\n"
          "# TYPE blobref_cdn_purges_total counter\n"
          "blobref_cdn_purges_total{result=\"sent\"} %" PRIu64
          "\n"
          "blobref_cdn_purges_total{result=\"failed\"} %" PRIu64
          "\n"
          "# HELP blobref_cdn_purges_pending CDN purges queued and not yet accepted.\n"
          "# TYPE blobref_cdn_purges_pending gauge\nblobref_cdn_purges_pending %" PRIu64 "\n",
          ps.sent, ps.failed, ps.pending);
  reconcile_runner_metrics(srv, emit_line, &t);
  if (!t.buf) return reply_error(req, E_INTERNAL, "out of memory");
  req->bytes_out = t.len;
  struct MHD_Response *resp = MHD_create_response_from_buffer(t.len, t.buf, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(t.buf);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
  return reply_response(req, MHD_HTTP_OK, resp);
}
