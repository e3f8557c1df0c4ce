/* Request services below the handlers: errors remembered for the final call, the JSON body
 * reader, and the finisher threads that make uploads durable (fsync, rename, index commit) and
 * run other slow calls without blocking the network threads. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/httpd.h"
#include "http/ops.h"

#define FINISHER_THREADS 32
/* the slow pool: whole-blob store reads (move checks, import checks, upload commits, refs) */
#define SLOW_THREADS 8

void request_fail(struct request *req, enum br_api_error e, const char *fmt, ...) {
  if (req->has_pending) return; /* the first error is the one that counts */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(req->pending_message, sizeof req->pending_message, fmt, ap);
  va_end(ap);
  req->has_pending = 1;
  req->pending = e;
}

/* Accumulates a JSON request body up to max_json_size. */
int json_body(struct request *req, const char *data, size_t len) {
  uint64_t max = req->srv->cfg->max_json_size;
  if (req->body_len + len > max) {
    request_fail(req, E_BODY_TOO_LARGE, "the JSON body is over %" PRIu64 " bytes", max);
    return -1;
  }
  if (req->body_len + len + 1 > req->body_cap) {
    size_t cap = req->body_cap ? req->body_cap : 4096;
    while (cap < req->body_len + len + 1) cap *= 2;
    if (cap > max + 1) cap = (size_t)max + 1;
    /* the buffer counts against max_json_inflight, the bound on all JSON bodies together */
    if (cap > req->json_reserved && ops_json_reserve(req, cap - req->json_reserved) < 0) {
      request_fail(req, E_TRY_AGAIN, "too many JSON request bodies in flight; retry");
      return -1;
    }
    char *grown = realloc(req->body, cap);
    if (!grown) {
      request_fail(req, E_INTERNAL, "out of memory");
      return -1;
    }
    req->body = grown;
    req->body_cap = cap;
  }
  memcpy(req->body + req->body_len, data, len);
  req->body_len += len;
  return 0;
}

void request_free_upload(struct request *req) {
  if (req->writer) br_store_write_abort(req->writer);
  req->writer = NULL;
  if (req->sha) EVP_MD_CTX_free(req->sha);
  req->sha = NULL;
}

void request_sniff_finish(struct request *req) {
  if (!req->sniff_wanted) return;
  req->sniff_wanted = 0;
  char found[BR_MAX_CONTENT_TYPE + 1];
  if (br_sniff_type(req->sniff_buf, req->sniff_len, found, sizeof found))
    memcpy(req->content_type, found, strlen(found) + 1);
  if (req->writer) br_store_write_content_type(req->writer, req->content_type);
  free(req->sniff_buf);
  req->sniff_buf = NULL;
}

/* Commits the upload's bytes under its key (the default one, or a fresh one when fresh: a
 * delete of the blob's bytes is in flight). 0 with key, or -1 with finish_error set. */
static int commit_bytes(struct request *req, int fresh, char *key, size_t keylen) {
  br_server *srv = req->srv;
  br_err err;
  br_store_writer *w = req->writer;
  req->writer = NULL;
  size_t made = fresh ? br_server_fresh_key(req->store, req->digest, key, keylen)
                      : br_store_default_key(req->store, req->digest, key, keylen);
  if (!made) {
    br_store_write_abort(w);
    req->finish_error = E_INTERNAL;
    snprintf(req->finish_message, sizeof req->finish_message, "object key too long");
    return -1;
  }
  uint64_t t0 = br_mono_ns();
  int committed = br_store_write_commit(w, key, &err);
  atomic_fetch_add(&req->http->upload_step_ns[STEP_STORE_COMMIT], br_mono_ns() - t0);
  if (committed < 0) {
    br_server_store_error(srv, req->store, STORE_OP_WRITE);
    req->finish_error = store_error_code(errno);
    snprintf(req->finish_message, sizeof req->finish_message, "%s", err.msg);
    return -1;
  }
  return 0;
}

/* The index decision of an upload whose bytes are at key: called under the blob's stripe. */
static void record_upload(struct request *req, const char *key) {
  br_err err;
  uint64_t t1 = br_mono_ns(), now = br_now_ms();
  br_record rec;
  br_record_init(&rec, req->received, req->content_type, br_store_name(req->store), key, now, now);
  int rc = br_index_record_upload(req->srv->index, req->digest, &rec, &req->created, NULL, &err);
  atomic_fetch_add(&req->http->upload_step_ns[STEP_INDEX_COMMIT], br_mono_ns() - t1);
  if (rc < 0) {
    req->finish_error = index_error(rc);
    snprintf(req->finish_message, sizeof req->finish_message, "%s", err.msg);
    return;
  }
  req->finish_rc = 0;
}

/* The bytes and the record of an upload. On LMDB the bytes are committed (fsync and rename, or
 * S3's PutObject / CompleteMultipartUpload and copy) outside the blob's stripe, registered with
 * br_server_commit_begin, and only the index decision takes the stripe. How it meets a delete of
 * the same hash (reconcile's or the drain's, two-phase: marked `deleting` under the stripe, bytes
 * deleted outside it, the record removed under it if still marked since then):
 *  - the upload registered first: the delete sees it and leaves the blob for a later run; the
 *    upload's bytes are at the key and its record makes (or keeps) the blob live;
 *  - the delete registered first, bytes still going or gone: the upload writes under a fresh key
 *    no delete names; under the stripe its record replaces a `deleting` one (the delete's removal,
 *    conditional on its mark, then changes nothing) or is created anew after the removal;
 *  - the delete ended before the upload registered: its bytes are gone before ours are written.
 * In no order does the record end live on bytes a delete removes. On a shared index (another
 * node's delete is not seen here) the commit runs under the stripe, as the delete does. */
static void finish_upload(struct request *req) {
  request_sniff_finish(req); /* a body shorter than BR_SNIFF_BYTES: not detected yet */
  br_server *srv = req->srv;
  char key[BR_MAX_KEY + 1];
  req->finish_rc = -1;
  int off = br_server_off_stripe(srv), fresh = 0;
  if (off && (fresh = br_server_commit_begin(srv, req->digest)) < 0) {
    req->finish_error = E_INTERNAL; /* the writer is aborted with the request */
    snprintf(req->finish_message, sizeof req->finish_message, "out of memory");
    return;
  }
  if (off && commit_bytes(req, fresh, key, sizeof key) < 0) goto out;
  if (br_server_lock_blob(srv, req->digest, 1) < 0) {
    req->finish_error = E_INDEX_UNAVAILABLE; /* the writer is aborted with the request */
    snprintf(req->finish_message, sizeof req->finish_message,
             "the blob's lock cannot be had: the index database is unavailable");
    goto out;
  }
  if (off || commit_bytes(req, 0, key, sizeof key) == 0) record_upload(req, key);
  br_server_lock_blob(srv, req->digest, 0);
out:
  if (off) br_server_commit_end(srv, req->digest);
}

/* One thread of a pool (finish_pool or slow_pool): runs its queue's jobs until stopping. */
static void *pool_main(void *arg) {
  struct job_pool *pool = arg;
  br_http *http = pool->http;
  pthread_mutex_lock(&http->job_lock);
  for (;;) {
    while (!pool->head && !http->jobs_stopping) pthread_cond_wait(&pool->cv, &http->job_lock);
    if (!pool->head) break;
    struct request *req = pool->head;
    pool->head = req->next_job;
    if (!pool->head) pool->tail = NULL;
    pthread_mutex_unlock(&http->job_lock);
    if (req->job == JOB_UPLOAD) {
      finish_upload(req);
    } else if (req->job == JOB_CALL || req->job == JOB_SLOW) {
      req->job_fn(req);
    } else {
      br_err err;
      int rc = br_index_touch(http->srv->index, req->digest, br_now_ms(), &err);
      req->finish_rc = rc < 0 ? -1 : 0;
      req->gone = rc == 1;
      req->created = 0;
      if (rc < 0) {
        req->finish_error = index_error(rc);
        snprintf(req->finish_message, sizeof req->finish_message, "%s", err.msg);
      }
    }
    req->phase = PHASE_RESUMED;
    atomic_fetch_sub(&pool->jobs, 1);
    MHD_resume_connection(req->conn);
    atomic_fetch_sub(&http->jobs_in_flight, 1);
    pthread_mutex_lock(&http->job_lock);
  }
  pthread_mutex_unlock(&http->job_lock);
  return NULL;
}

int request_finish_async(struct request *req, enum job_kind job) {
  br_http *http = req->http;
  pthread_mutex_lock(&http->job_lock);
  if (http->stopping) {
    pthread_mutex_unlock(&http->job_lock);
    return -1;
  }
  req->job = job;
  req->phase = PHASE_SUSPENDED;
  atomic_fetch_add(&http->jobs_in_flight, 1);
  MHD_suspend_connection(req->conn);
  struct job_pool *pool = job == JOB_SLOW ? &http->slow_pool : &http->finish_pool;
  req->next_job = NULL;
  if (pool->tail)
    pool->tail->next_job = req;
  else
    pool->head = req;
  pool->tail = req;
  atomic_fetch_add(&pool->jobs, 1);
  pthread_cond_signal(&pool->cv);
  pthread_mutex_unlock(&http->job_lock);
  return 0;
}

static int pool_start(br_http *http, struct job_pool *pool, int n, br_err *err) {
  pool->http = http;
  pthread_cond_init(&pool->cv, NULL);
  pool->threads = calloc((size_t)n, sizeof *pool->threads);
  if (!pool->threads) return br_fail(err, "out of memory");
  for (; pool->nthreads < n; pool->nthreads++)
    if (pthread_create(&pool->threads[pool->nthreads], NULL, pool_main, pool))
      return br_fail(err, "cannot start finisher threads");
  return 0;
}

int request_finishers_start(br_http *http, br_err *err) {
  pthread_mutex_init(&http->job_lock, NULL);
  if (pool_start(http, &http->finish_pool, FINISHER_THREADS, err) < 0) return -1;
  return pool_start(http, &http->slow_pool, SLOW_THREADS, err);
}

void request_wait_spool(struct request *req) {
  br_http *http = req->http;
  pthread_mutex_lock(&http->spool_lock);
  /* libmicrohttpd 0.9.75 may hand over the rest of its buffer before the suspension takes
   * effect: a request already paused is not listed (nor suspended) twice */
  if (!http->spool_stopping && http->spool_thread_started && !req->spool_paused) {
    req->spool_paused = 1;
    req->next_spool = http->spool_head;
    http->spool_head = req;
    MHD_suspend_connection(req->conn);
    pthread_cond_signal(&http->spool_cv);
  }
  pthread_mutex_unlock(&http->spool_lock);
}

/* Resumes the paused uploads whose writer takes bytes again (all of them when stopping); looks
 * every SPOOL_POLL_MS while any is paused, sleeps otherwise. A paused request is not freed
 * (libmicrohttpd completes no suspended connection), so the list never holds a dangling one. */
#define SPOOL_POLL_MS 20
static void *spool_main(void *arg) {
  br_http *http = arg;
  pthread_mutex_lock(&http->spool_lock);
  for (;;) {
    int stopping = http->spool_stopping;
    for (struct request **p = &http->spool_head; *p;) {
      struct request *req = *p;
      if (stopping || !br_store_write_backlogged(req->writer, 0)) {
        *p = req->next_spool;
        req->spool_paused = 0;
        MHD_resume_connection(req->conn);
      } else {
        p = &req->next_spool;
      }
    }
    if (stopping) break;
    if (http->spool_head) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += SPOOL_POLL_MS * 1000000L;
      if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&http->spool_cv, &http->spool_lock, &ts);
    } else {
      pthread_cond_wait(&http->spool_cv, &http->spool_lock);
    }
  }
  pthread_mutex_unlock(&http->spool_lock);
  return NULL;
}

int request_spool_start(br_http *http, br_err *err) {
  pthread_mutex_init(&http->spool_lock, NULL);
  pthread_cond_init(&http->spool_cv, NULL);
  if (pthread_create(&http->spool_thread, NULL, spool_main, http))
    return br_fail(err, "cannot start the upload spool thread");
  http->spool_thread_started = 1;
  return 0;
}

void request_spool_stop(br_http *http) {
  if (!http->spool_thread_started) return;
  pthread_mutex_lock(&http->spool_lock);
  http->spool_stopping = 1;
  pthread_cond_broadcast(&http->spool_cv);
  pthread_mutex_unlock(&http->spool_lock);
  pthread_join(http->spool_thread, NULL);
  http->spool_thread_started = 0;
}

void request_finishers_stop(br_http *http) {
  if (!http->finish_pool.threads) return;
  pthread_mutex_lock(&http->job_lock);
  http->jobs_stopping = 1;
  pthread_cond_broadcast(&http->finish_pool.cv);
  pthread_cond_broadcast(&http->slow_pool.cv);
  pthread_mutex_unlock(&http->job_lock);
  struct job_pool *pools[] = {&http->finish_pool, &http->slow_pool};
  for (int p = 0; p < 2; p++) {
    for (int i = 0; i < pools[p]->nthreads; i++) pthread_join(pools[p]->threads[i], NULL);
    free(pools[p]->threads);
    pools[p]->threads = NULL;
    pools[p]->nthreads = 0;
  }
}
