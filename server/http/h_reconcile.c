/* Reconcile inside blobrefd: the run thread (every `interval`, with jitter, and on demand; one run
 * at a time), POST /v1/reconcile, GET /v1/reconcile/runs[/{id}], and the admin's quarantine and
 * restore of single blobs (DELETE /v1/blobs/{hash}, POST /v1/blobs/{hash}/restore). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/blobcache.h"
#include "blobref/reconcile.h"
#include "core/cdn_purge.h"
#include "http/httpd.h"

struct reconcile_runner {
  br_reconciler *rec;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  int stopping, started;
  /* the run asked for, or in progress */
  int requested;
  br_reconcile_options opt;
  uint64_t running_id; /* 0 = idle */
  char running_started[40];
  /* metrics of the last run */
  uint64_t runs_done, runs_failed;
  json_int_t last_quarantined, last_restored, last_deleted, last_marked, last_reclaimed;
  double last_seconds;
};

void br_server_blob_gone(br_server *srv, const uint8_t digest[BR_SHA256_LEN]) {
  if (srv->cache) blobcache_remove(srv->cache, digest);
  br_err err;
  if (cdn_purge_enqueue(srv->purger, digest, &err) < 0) br_error("%s", err.msg);
}

static void on_gone(void *ud, const uint8_t digest[BR_SHA256_LEN]) {
  br_server_blob_gone(ud, digest);
}

static void lock_blob(void *ud, const uint8_t digest[BR_SHA256_LEN], int lock) {
  br_server_lock_blob(ud, digest, lock);
}

static json_int_t blobs_field(json_t *rep, const char *name) {
  return json_integer_value(json_object_get(json_object_get(rep, "blobs"), name));
}

static void *runner_main(void *arg) {
  br_server *srv = arg;
  struct reconcile_runner *rr = srv->reconcile;
  const br_config *cfg = srv->cfg;
  uint64_t next_due = 0;
  if (cfg->reconcile_interval_ms) /* first periodic run after one interval, with jitter */
    next_due = br_now_ms() + cfg->reconcile_interval_ms / 2 +
               (uint64_t)random() % (cfg->reconcile_interval_ms / 2 + 1);
  pthread_mutex_lock(&rr->lock);
  for (;;) {
    while (!rr->stopping && !rr->requested) {
      if (!next_due) {
        pthread_cond_wait(&rr->cv, &rr->lock);
        continue;
      }
      uint64_t now = br_now_ms();
      if (now >= next_due) {
        rr->requested = 1;
        memset(&rr->opt, 0, sizeof rr->opt);
        br_err err;
        rr->running_id = br_reconciler_next_id(rr->rec, &err);
        break;
      }
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t wait = next_due - now;
      if (wait > 60000) wait = 60000;
      ts.tv_sec += (time_t)(wait / 1000);
      ts.tv_nsec += (long)(wait % 1000) * 1000000L;
      if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&rr->cv, &rr->lock, &ts);
    }
    if (rr->stopping) break;
    br_reconcile_options opt = rr->opt;
    uint64_t id = rr->running_id;
    format_time_ms(br_now_ms(), rr->running_started, sizeof rr->running_started);
    pthread_mutex_unlock(&rr->lock);
    br_info("reconcile: run %" PRIu64 " started%s%s%s", id, opt.dry_run ? " (dry run)" : "",
            opt.force ? " (forced)" : "", opt.full ? " (full)" : "");
    json_t *rep = NULL;
    uint64_t t0 = br_now_ms();
    int rc = br_reconcile_run(rr->rec, id, &opt, &rep);
    double secs = (double)(br_now_ms() - t0) / 1000.0;
    json_t *errs = json_object_get(rep, "errors");
    br_info("reconcile: run %" PRIu64 " %s in %.1f s: %" JSON_INTEGER_FORMAT
            " marked, %" JSON_INTEGER_FORMAT " quarantined, %" JSON_INTEGER_FORMAT
            " restored, %" JSON_INTEGER_FORMAT " deleted%s%s",
            id, rc == 0 ? "done" : "FAILED (nothing changed)", secs, blobs_field(rep, "marked"),
            blobs_field(rep, "quarantined"), blobs_field(rep, "restored"),
            blobs_field(rep, "deleted"), json_array_size(errs) ? ": " : "",
            json_array_size(errs) ? json_string_value(json_array_get(errs, 0)) : "");
    pthread_mutex_lock(&rr->lock);
    if (rc == 0)
      rr->runs_done++;
    else
      rr->runs_failed++;
    if (!opt.dry_run && rc == 0) {
      rr->last_quarantined = blobs_field(rep, "quarantined");
      rr->last_restored = blobs_field(rep, "restored");
      rr->last_deleted = blobs_field(rep, "deleted");
      rr->last_marked = blobs_field(rep, "marked");
      rr->last_reclaimed = json_integer_value(json_object_get(rep, "bytes_reclaimed"));
    }
    rr->last_seconds = secs;
    json_decref(rep);
    rr->requested = 0;
    rr->running_id = 0;
    if (cfg->reconcile_interval_ms)
      next_due = br_now_ms() + cfg->reconcile_interval_ms * 9 / 10 +
                 (uint64_t)random() % (cfg->reconcile_interval_ms / 5 + 1); /* +-10 % */
  }
  pthread_mutex_unlock(&rr->lock);
  return NULL;
}

int reconcile_start(br_server *srv, br_err *err) {
  char pdir[4200];
  snprintf(pdir, sizeof pdir, "%s/purge", srv->cfg->data_dir);
  srv->purger = cdn_purger_open(srv->cfg, pdir, err);
  if (!srv->purger) return -1;
  struct reconcile_runner *rr = calloc(1, sizeof *rr);
  if (!rr) return br_fail(err, "out of memory");
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/reconcile", srv->cfg->data_dir);
  br_reconcile_env env = {.cfg = srv->cfg,
                          .index = srv->index,
                          .stores = srv->stores,
                          .nstores = srv->nstores,
                          .state_dir = dir,
                          .lock_blob = lock_blob,
                          .on_gone = on_gone,
                          .ud = srv};
  rr->rec = br_reconciler_open(&env, err);
  if (!rr->rec) {
    free(rr);
    return -1;
  }
  pthread_mutex_init(&rr->lock, NULL);
  pthread_cond_init(&rr->cv, NULL);
  srv->reconcile = rr;
  if (pthread_create(&rr->thread, NULL, runner_main, srv)) {
    br_reconciler_close(rr->rec);
    free(rr);
    srv->reconcile = NULL;
    return br_fail(err, "cannot start the reconcile thread");
  }
  rr->started = 1;
  return 0;
}

void reconcile_stop(br_server *srv) {
  struct reconcile_runner *rr = srv->reconcile;
  cdn_purger_close(srv->purger);
  srv->purger = NULL;
  if (!rr) return;
  pthread_mutex_lock(&rr->lock);
  rr->stopping = 1;
  pthread_cond_broadcast(&rr->cv);
  pthread_mutex_unlock(&rr->lock);
  if (rr->started) pthread_join(rr->thread, NULL); /* a run in progress finishes first */
  br_reconciler_close(rr->rec);
  free(rr);
  srv->reconcile = NULL;
}

void reconcile_metrics(br_server *srv, void (*emit)(void *ud, const char *line), void *ud) {
  struct reconcile_runner *rr = srv->reconcile;
  if (!rr) return;
  char line[1024];
  cdn_purge_stats ps;
  cdn_purger_stats(srv->purger, &ps);
  snprintf(line, sizeof line,
           "# HELP blobref_cdn_purges_total CDN purges sent, by result (failures are retried).\n"
           "# TYPE blobref_cdn_purges_total counter\n"
           "blobref_cdn_purges_total{result=\"sent\"} %" PRIu64
           "\n"
           "blobref_cdn_purges_total{result=\"failed\"} %" PRIu64
           "\n"
           "# HELP blobref_cdn_purges_pending CDN purges queued and not yet accepted.\n"
           "# TYPE blobref_cdn_purges_pending gauge\nblobref_cdn_purges_pending %" PRIu64 "\n",
           ps.sent, ps.failed, ps.pending);
  emit(ud, line);
  pthread_mutex_lock(&rr->lock);
  emit(ud,
       "# HELP blobref_reconcile_runs_total Reconcile runs ended, by result.\n"
       "# TYPE blobref_reconcile_runs_total counter\n");
  snprintf(line, sizeof line, "blobref_reconcile_runs_total{result=\"done\"} %" PRIu64 "\n",
           rr->runs_done);
  emit(ud, line);
  snprintf(line, sizeof line, "blobref_reconcile_runs_total{result=\"failed\"} %" PRIu64 "\n",
           rr->runs_failed);
  emit(ud, line);
  static const char *const names[] = {"quarantined", "restored", "deleted", "marked",
                                      "reclaimed_bytes"};
  json_int_t vals[] = {rr->last_quarantined, rr->last_restored, rr->last_deleted, rr->last_marked,
                       rr->last_reclaimed};
  for (size_t i = 0; i < 5; i++) {
    snprintf(
        line, sizeof line,
        "# HELP blobref_reconcile_last_%s Of the last completed run.\n"
        "# TYPE blobref_reconcile_last_%s gauge\nblobref_reconcile_last_%s %" JSON_INTEGER_FORMAT
        "\n",
        names[i], names[i], names[i], vals[i]);
    emit(ud, line);
  }
  snprintf(line, sizeof line,
           "# HELP blobref_reconcile_last_duration_seconds Of the last run.\n"
           "# TYPE blobref_reconcile_last_duration_seconds gauge\n"
           "blobref_reconcile_last_duration_seconds %.3f\n"
           "# HELP blobref_reconcile_running 1 while a run is in progress.\n"
           "# TYPE blobref_reconcile_running gauge\nblobref_reconcile_running %d\n",
           rr->last_seconds, rr->running_id ? 1 : 0);
  emit(ud, line);
  pthread_mutex_unlock(&rr->lock);
}

/* ---- routes -----------------------------------------------------------------------------------
 */

/* The options of POST /v1/reconcile: only dry_run, force and full, each bare or =, =1, =true,
 * =0, =false. Anything else is an error: a misspelt option (dryrun=1, dry_run=yes) must never
 * turn what the caller meant as a dry run into a real one. */
struct query_opts {
  br_reconcile_options opt;
  char msg[200];
};
static enum MHD_Result parse_query_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value) {
  (void)kind;
  struct query_opts *q = cls;
  int *flag = !strcmp(key, "dry_run") ? &q->opt.dry_run
              : !strcmp(key, "force") ? &q->opt.force
              : !strcmp(key, "full")  ? &q->opt.full
                                      : NULL;
  if (!flag) {
    snprintf(q->msg, sizeof q->msg, "unknown parameter '%.60s' (dry_run, force, full)", key);
    return MHD_NO;
  }
  if (!value || !*value || !strcmp(value, "1") || !strcmp(value, "true")) {
    *flag = 1; /* libmicrohttpd gives a bare "?dry_run" a NULL value */
  } else if (!strcmp(value, "0") || !strcmp(value, "false")) {
    *flag = 0;
  } else {
    snprintf(q->msg, sizeof q->msg, "%s=%.60s: expected 1, true, 0 or false", key, value);
    return MHD_NO;
  }
  return MHD_YES;
}

enum MHD_Result reconcile_post(struct request *req) {
  struct reconcile_runner *rr = req->srv->reconcile;
  if (!rr) return reply_error(req, E_NOT_READY, "reconcile is not running");
  struct query_opts qo;
  memset(&qo, 0, sizeof qo);
  MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, parse_query_arg, &qo);
  if (qo.msg[0]) return reply_error(req, E_BAD_REQUEST, "%s", qo.msg);
  br_err err;
  pthread_mutex_lock(&rr->lock);
  if (rr->requested || rr->running_id) {
    uint64_t id = rr->running_id;
    pthread_mutex_unlock(&rr->lock);
    char msg[64];
    snprintf(msg, sizeof msg, "run %" PRIu64 " is running", id);
    json_t *body = json_pack("{s:{s:s,s:s},s:I}", "error", "code", "reconcile_running", "message",
                             msg, "id", (json_int_t)id);
    return reply_json(req, 409, body);
  }
  uint64_t id = br_reconciler_next_id(rr->rec, &err);
  if (!id) {
    pthread_mutex_unlock(&rr->lock);
    return reply_error(req, E_INTERNAL, "%s", err.msg);
  }
  rr->opt = qo.opt;
  rr->requested = 1;
  rr->running_id = id;
  pthread_cond_signal(&rr->cv);
  pthread_mutex_unlock(&rr->lock);
  return reply_json(req, 202, json_pack("{s:I,s:s}", "id", (json_int_t)id, "state", "running"));
}

/* The in-progress run, as a small report. Lock held. */
static json_t *running_report(struct reconcile_runner *rr) {
  return json_pack("{s:I,s:s,s:b,s:b,s:b,s:s}", "id", (json_int_t)rr->running_id, "state",
                   "running", "dry_run", rr->opt.dry_run, "force", rr->opt.force, "full",
                   rr->opt.full, "started_at", rr->running_started);
}

enum MHD_Result reconcile_runs_get(struct request *req) {
  struct reconcile_runner *rr = req->srv->reconcile;
  if (!rr) return reply_error(req, E_NOT_READY, "reconcile is not running");
  br_err err;
  json_t *runs = br_reconciler_reports(rr->rec, 100, &err);
  if (!runs) return reply_error(req, E_INTERNAL, "%s", err.msg);
  pthread_mutex_lock(&rr->lock);
  if (rr->running_id) json_array_insert_new(runs, 0, running_report(rr));
  pthread_mutex_unlock(&rr->lock);
  return reply_json(req, MHD_HTTP_OK, json_pack("{s:o}", "runs", runs));
}

enum MHD_Result reconcile_run_get(struct request *req) {
  struct reconcile_runner *rr = req->srv->reconcile;
  if (!rr) return reply_error(req, E_NOT_READY, "reconcile is not running");
  pthread_mutex_lock(&rr->lock);
  if (rr->running_id && rr->running_id == req->run_id) {
    json_t *r = running_report(rr);
    pthread_mutex_unlock(&rr->lock);
    return reply_json(req, MHD_HTTP_OK, r);
  }
  pthread_mutex_unlock(&rr->lock);
  br_err err;
  int found = 0;
  char *text = br_reconciler_report(rr->rec, req->run_id, &found, &err);
  if (!found) return reply_error(req, E_NOT_FOUND, "no run %" PRIu64, req->run_id);
  json_t *j = json_loads(text, 0, NULL);
  free(text);
  if (!j) return reply_error(req, E_INTERNAL, "a stored report does not parse");
  return reply_json(req, MHD_HTTP_OK, j);
}


/* DELETE /v1/blobs/{hash} (HOLD) and POST /v1/blobs/{hash}/restore (RELEASE), under the blob's
 * lock so that they cannot interleave with reconcile's final delete. */
static enum MHD_Result change_state(struct request *req, enum br_change_kind kind) {
  const char *reason = NULL;
  if (kind == BR_CHANGE_HOLD) {
    reason = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "reason");
    if (!reason || !*reason) reason = "quarantined by an admin";
    if (strlen(reason) > BR_MAX_REASON)
      return reply_error(req, E_BAD_REQUEST, "reason is over %d bytes", BR_MAX_REASON);
    for (const char *p = reason; *p; p++)
      if ((unsigned char)*p < 0x20 || *p == 0x7f)
        return reply_error(req, E_BAD_REQUEST, "reason must not contain control characters");
  }
  br_change ch = {.kind = kind, .reason = reason};
  memcpy(ch.digest, req->digest, BR_SHA256_LEN);
  br_err err;
  br_server_lock_blob(req->srv, req->digest, 1);
  int rc = br_index_apply_changes(req->srv->index, &ch, 1, br_now_ms(), &err);
  br_record rec;
  int grc = rc == 0 ? br_index_get(req->srv->index, req->digest, &rec, &err) : -1;
  br_server_lock_blob(req->srv, req->digest, 0);
  if (rc < 0) return reply_error(req, E_INTERNAL, "%s", err.msg);
  if (grc > 0) return reply_error(req, E_NOT_FOUND, "no such blob");
  if (grc < 0) return reply_error(req, E_INTERNAL, "%s", err.msg);
  if (rec.state == BR_STATE_DELETING)
    return reply_json(
        req, 409,
        json_pack(
            "{s:{s:s,s:s}}", "error", "code", "blob_deleting", "message",
            "the blob is being deleted for good: its bytes are gone or going; upload it again"));
  if (kind == BR_CHANGE_HOLD && ch.applied) br_server_blob_gone(req->srv, req->digest);
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(req->digest, hex);
  br_info("blob %s: %s by an admin%s%s", hex, kind == BR_CHANGE_HOLD ? "quarantined" : "restored",
          reason ? ": " : "", reason ? reason : "");
  return reply_json(req, MHD_HTTP_OK, blob_record_json(req->digest, &rec));
}

enum MHD_Result blob_hold(struct request *req) { return change_state(req, BR_CHANGE_HOLD); }
enum MHD_Result blob_release(struct request *req) { return change_state(req, BR_CHANGE_RELEASE); }
