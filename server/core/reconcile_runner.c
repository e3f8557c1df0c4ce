/* The reconcile runner: the thread that runs reconcile every `interval` (with jitter) and on
 * demand, one run at a time, and the figures of the last run. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blobref/leases.h"
#include "core/reconcile_runner.h"
#include "core/server.h"

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
  uint64_t next_due_ms; /* when the next periodic run starts (0: none: interval = 0) */
};

static void on_gone(void *ud, const uint8_t digest[BR_SHA256_LEN]) {
  br_server_blob_gone(ud, digest);
}

static int lock_blob(void *ud, const uint8_t digest[BR_SHA256_LEN], int lock) {
  return br_server_lock_blob(ud, digest, lock);
}

static int lock_blobs(void *ud, const uint8_t (*digests)[BR_SHA256_LEN], size_t n, int lock) {
  return br_server_lock_blobs(ud, digests, n, lock);
}

static int delete_begin(void *ud, const uint8_t digest[BR_SHA256_LEN]) {
  return br_server_delete_begin(ud, digest);
}

static void delete_end(void *ud, const uint8_t digest[BR_SHA256_LEN]) {
  br_server_delete_end(ud, digest);
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
    rr->next_due_ms = next_due;
    while (!rr->stopping && !rr->requested) {
      if (!next_due) {
        pthread_cond_wait(&rr->cv, &rr->lock);
        continue;
      }
      uint64_t now = br_now_ms();
      if (now >= next_due) {
        br_err lerr;
        int lease = br_index_lease(srv->index, BR_INDEX_LEASE_RECONCILE, 1, &lerr);
        if (lease != 1) { /* another node runs it (or the index is unreachable): next time */
          if (lease < 0) br_warn("reconcile: %s", lerr.msg);
          br_info("reconcile: periodic run skipped: %s",
                  lease ? "the index is unavailable" : "a run is in progress on another node");
          next_due = now + cfg->reconcile_interval_ms;
          continue;
        }
        rr->requested = 1;
        memset(&rr->opt, 0, sizeof rr->opt);
        br_err err;
        rr->running_id = br_reconciler_next_id(rr->rec, &err);
        if (rr->running_id) br_reconciler_announce(rr->rec, rr->running_id, &rr->opt);
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
    br_format_time_ms(br_now_ms(), rr->running_started, sizeof rr->running_started);
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
    br_err lerr;
    br_index_lease(srv->index, BR_INDEX_LEASE_RECONCILE, 0, &lerr); /* cluster-wide: done */
    rr->requested = 0;
    rr->running_id = 0;
    if (cfg->reconcile_interval_ms)
      next_due = br_now_ms() + cfg->reconcile_interval_ms * 9 / 10 +
                 (uint64_t)random() % (cfg->reconcile_interval_ms / 5 + 1); /* +-10 % */
  }
  pthread_mutex_unlock(&rr->lock);
  return NULL;
}

uint64_t reconcile_runner_next_ms(br_server *srv) {
  struct reconcile_runner *rr = srv->reconcile;
  pthread_mutex_lock(&rr->lock);
  uint64_t next = rr->requested ? 0 : rr->next_due_ms;
  pthread_mutex_unlock(&rr->lock);
  return next;
}

int reconcile_runner_start(br_server *srv, br_err *err) {
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
                          .lock_blobs = lock_blobs,
                          .on_gone = on_gone,
                          .ud = srv};
  if (br_server_off_stripe(srv)) { /* on a shared index the deletes hold the locks throughout */
    env.delete_begin = delete_begin;
    env.delete_end = delete_end;
  }
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

void reconcile_runner_stop(br_server *srv) {
  struct reconcile_runner *rr = srv->reconcile;
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

void reconcile_runner_metrics(br_server *srv, void (*emit)(void *ud, const char *line), void *ud) {
  struct reconcile_runner *rr = srv->reconcile;
  if (!rr) return;
  char line[1024];
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
  snprintf(line, sizeof line,
           "# HELP blobref_reconcile_deleting_walks_total Walks of the index for blobs left "
           "deleting by a cut-short run (at start, and after a failed run), made only when the "
           "per-state counters count some or keep none.\n"
           "# TYPE blobref_reconcile_deleting_walks_total counter\n"
           "blobref_reconcile_deleting_walks_total %" PRIu64 "\n",
           br_reconciler_deleting_walks(rr->rec));
  emit(ud, line);
  uint64_t nleases = 0, nleased = 0;
  br_leases_stats(br_reconciler_leases(rr->rec), br_now_ms(), &nleases, &nleased);
  snprintf(line, sizeof line,
           "# HELP blobref_leases Live upload leases.\n# TYPE blobref_leases gauge\n"
           "blobref_leases %" PRIu64
           "\n"
           "# HELP blobref_leased_blobs Blobs attached to live leases (counted once per lease).\n"
           "# TYPE blobref_leased_blobs gauge\nblobref_leased_blobs %" PRIu64 "\n",
           nleases, nleased);
  emit(ud, line);
}

int reconcile_runner_request(br_server *srv, const br_reconcile_options *opt, uint64_t *id,
                             br_err *err) {
  struct reconcile_runner *rr = srv->reconcile;
  int rc = 0;
  pthread_mutex_lock(&rr->lock);
  int lease = 0;
  if (rr->requested || rr->running_id) {
    *id = rr->running_id;
    rc = 1;
  } else if ((lease = br_index_lease(srv->index, BR_INDEX_LEASE_RECONCILE, 1, err)) != 1) {
    *id = 0; /* a run is in progress on another node sharing the index */
    rc = lease < 0 ? -1 : 1;
  } else {
    *id = br_reconciler_next_id(rr->rec, err);
    if (!*id) {
      br_err lerr;
      br_index_lease(srv->index, BR_INDEX_LEASE_RECONCILE, 0, &lerr);
      rc = -1;
    } else {
      rr->opt = *opt;
      rr->requested = 1;
      rr->running_id = *id;
      br_reconciler_announce(rr->rec, *id, opt); /* shown on every node before the 202 */
      pthread_cond_signal(&rr->cv);
    }
  }
  pthread_mutex_unlock(&rr->lock);
  return rc;
}

/* The in-progress run, as a small report. Lock held. */
static json_t *running_report(struct reconcile_runner *rr) {
  return json_pack("{s:I,s:s,s:b,s:b,s:b,s:s}", "id", (json_int_t)rr->running_id, "state",
                   "running", "dry_run", rr->opt.dry_run, "force", rr->opt.force, "full",
                   rr->opt.full, "started_at", rr->running_started);
}

json_t *reconcile_runner_current(br_server *srv, uint64_t id) {
  struct reconcile_runner *rr = srv->reconcile;
  json_t *r = NULL;
  pthread_mutex_lock(&rr->lock);
  uint64_t mine = rr->running_id;
  if (mine && (!id || mine == id)) r = running_report(rr);
  pthread_mutex_unlock(&rr->lock);
  if (mine && !r) return NULL; /* one run cluster-wide: this node's, not id */
  /* this node's run as the reconciler reports it (phase, progress), or another node's */
  json_t *run = br_reconciler_running(rr->rec, mine ? mine : id);
  if (!r) return run;
  if (run) {
    json_object_set(r, "phase", json_object_get(run, "phase"));
    json_object_set(r, "progress", json_object_get(run, "progress"));
    json_decref(run);
  } else { /* asked for, not started yet */
    json_object_set_new(r, "phase", json_string("starting"));
  }
  return r;
}

json_t *reconcile_runner_reports(br_server *srv, size_t max, br_err *err) {
  return br_reconciler_reports(srv->reconcile->rec, max, err);
}

char *reconcile_runner_report(br_server *srv, uint64_t id, int *found, br_err *err) {
  return br_reconciler_report(srv->reconcile->rec, id, found, err);
}

br_reconciler *reconcile_runner_reconciler(br_server *srv) { return srv->reconcile->rec; }
