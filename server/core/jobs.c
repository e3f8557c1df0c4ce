/* The job engine: migrate and import jobs inside blobrefd, each on its own thread (plus its
 * workers), one per source store at a time, saved after every item under DATA_DIR/jobs/ID.json
 * (written to a temporary file and renamed) so that a restart resumes each from its cursor; on a
 * PostgreSQL index, rows of the database instead, each run under a lease that any node takes
 * over once it expires (a killed node's jobs are finished by another node by themselves). */
#include <errno.h>
#include <dirent.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include "blobref/sniff.h"
#include "core/jobs.h"
#include "core/move.h"
#include "store/internal.h"

enum job_kind { KIND_MIGRATE, KIND_IMPORT };
enum job_state { ST_QUEUED, ST_RUNNING, ST_DONE, ST_FAILED, ST_CANCELLED };
static const char *const state_names[] = {"queued", "running", "done", "failed", "cancelled"};
/* time per step: migrate copy, verify, switch; import hash, copy, index */
enum { STEP_A, STEP_B, STEP_C, STEPS };
static const char *const step_names[2][STEPS] = {{"copy_ms", "verify_ms", "switch_ms"},
                                                 {"hash_ms", "copy_ms", "index_ms"}};

struct job_error {
  char item[BR_MAX_KEY + 1];
  char message[300];
  uint64_t at_ms;
};

struct job {
  uint64_t id;
  enum job_kind kind;
  enum job_state state;
  /* parameters */
  char source[BR_MAX_STORE_NAME + 1]; /* migrate: from; import: the store */
  char target[BR_MAX_STORE_NAME + 1]; /* migrate: to */
  char prefix[BR_MAX_KEY + 1];        /* import: the key prefix listed */
  char source_arg[PATH_MAX];          /* import: source as given */
  int copy;                           /* import: mode copy (else in-place) */
  int verify_sha, concurrency, dry_run;
  double rate_mb; /* 0 = no limit */
  uint64_t limit; /* 0 = no limit */
  /* progress (under the engine's lock) */
  uint64_t created_ms, started_ms, ended_ms;
  uint64_t items_done, items_skipped, items_failed, bytes_done, items_total, bytes_total;
  uint64_t at_target, elsewhere; /* migrate: blobs whose primary was in TO, or in neither */
  uint64_t step_ms[STEPS];
  uint64_t errors_total;
  struct job_error errors[JOB_ERRORS_KEPT]; /* a ring: errors_total % JOB_ERRORS_KEPT is next */
  char message[300];                        /* why it failed */
  /* the resume cursor: migrate, the last index key done; import, the last object key done */
  uint8_t cursor_digest[BR_SHA256_LEN];
  int has_cursor;
  char cursor_key[BR_MAX_KEY + 1];
  /* run-time only */
  int cancel, thread_started, thread_ended;
  int dirty;         /* shared: progress not written to its row yet */
  int lost;          /* shared: another node holds it now: it stops, its row is left alone */
  int releasing;     /* shared: the last write hands it back (the server stopping) */
  uint64_t saved_ms; /* shared: when its row was last written (monotonic) */
  uint64_t claimed;  /* migrate: items done, failed or in flight (the limit counts them) */
  pthread_t thread;
  uint64_t run_t0_ms, run_bytes0;
  double rate_next_s; /* the rate limiter: when the next copy may start */
};

struct job_engine {
  br_server *srv;
  pthread_mutex_t lock;
  pthread_cond_t cv; /* rate waits, woken on cancel and stop */
  int stopping;
  char dir[PATH_MAX];
  struct job *jobs[JOBS_KEPT]; /* shared: only the jobs this node runs */
  int njobs;
  uint64_t next_id;
  /* shared (a PostgreSQL index): the jobs are rows, leased by owner */
  int shared;
  char owner[160];             /* this process: host/pid/random */
  uint64_t lease_ms, renew_ms; /* renew_ms: how often a running job's lease is renewed */
  pthread_t lease_thread;      /* renews this node's leases and claims the jobs nobody holds */
  int lease_started;
};

static int active(const struct job *j) { return j->state == ST_QUEUED || j->state == ST_RUNNING; }

static double mono_s(void) { return (double)br_mono_ns() / 1e9; }
static uint64_t mono_ms(void) { return br_mono_ns() / 1000000u; }

/* ---- JSON -------------------------------------------------------------------------------- */

/* The job as the API shows it (and as it is saved, with its cursor when saving). Lock held. */
static json_t *job_json(const struct job *j, int saving) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_integer((json_int_t)j->id));
  json_object_set_new(o, "kind", json_string(j->kind == KIND_MIGRATE ? "migrate" : "import"));
  json_object_set_new(o, "state", json_string(state_names[j->state]));
  json_t *p = json_object();
  if (j->kind == KIND_MIGRATE) {
    json_object_set_new(p, "from", json_string(j->source));
    json_object_set_new(p, "to", json_string(j->target));
    json_object_set_new(p, "verify", json_string(j->verify_sha ? "sha256" : "size"));
    json_object_set_new(p, "concurrency", json_integer(j->concurrency));
    if (j->rate_mb > 0) json_object_set_new(p, "rate", json_real(j->rate_mb));
    if (j->limit) json_object_set_new(p, "limit", json_integer((json_int_t)j->limit));
    json_object_set_new(p, "dry_run", json_boolean(j->dry_run));
  } else {
    json_object_set_new(p, "store", json_string(j->source));
    json_object_set_new(p, "source", json_string(j->source_arg));
    json_object_set_new(p, "prefix", json_string(j->prefix));
    json_object_set_new(p, "mode", json_string(j->copy ? "copy" : "in-place"));
    json_object_set_new(p, "concurrency", json_integer(j->concurrency));
  }
  json_object_set_new(o, "params", p);
  json_object_set_new(o, "created_ms", json_integer((json_int_t)j->created_ms));
  if (j->started_ms) json_object_set_new(o, "started_ms", json_integer((json_int_t)j->started_ms));
  if (j->ended_ms) json_object_set_new(o, "ended_ms", json_integer((json_int_t)j->ended_ms));
  json_object_set_new(o, "items_total", json_integer((json_int_t)j->items_total));
  json_object_set_new(o, "items_done", json_integer((json_int_t)j->items_done));
  json_object_set_new(o, "items_skipped", json_integer((json_int_t)j->items_skipped));
  json_object_set_new(o, "items_failed", json_integer((json_int_t)j->items_failed));
  json_object_set_new(o, "bytes_total", json_integer((json_int_t)j->bytes_total));
  json_object_set_new(o, "bytes_done", json_integer((json_int_t)j->bytes_done));
  if (j->kind == KIND_MIGRATE) {
    json_object_set_new(o, "items_at_target", json_integer((json_int_t)j->at_target));
    json_object_set_new(o, "items_elsewhere", json_integer((json_int_t)j->elsewhere));
  }
  if (!saving) {
    uint64_t now = br_now_ms();
    double el = j->run_t0_ms && now > j->run_t0_ms ? (double)(now - j->run_t0_ms) / 1000.0 : 0;
    double rate = el > 0 ? (double)(j->bytes_done - j->run_bytes0) / el : 0;
    if (j->state != ST_RUNNING && j->ended_ms > j->run_t0_ms && j->run_t0_ms)
      rate = (double)(j->bytes_done - j->run_bytes0) / ((double)(j->ended_ms - j->run_t0_ms) / 1e3);
    json_object_set_new(o, "rate_bytes_per_s", json_real(rate));
    if (j->state == ST_RUNNING && rate > 0 && j->bytes_total >= j->bytes_done)
      json_object_set_new(o, "eta_s", json_real((double)(j->bytes_total - j->bytes_done) / rate));
    else
      json_object_set_new(o, "eta_s", json_null());
  }
  json_t *steps = json_object();
  for (int s = 0; s < STEPS; s++)
    json_object_set_new(steps, step_names[j->kind][s], json_integer((json_int_t)j->step_ms[s]));
  json_object_set_new(o, "steps", steps);
  json_t *errs = json_array();
  uint64_t kept = j->errors_total < JOB_ERRORS_KEPT ? j->errors_total : JOB_ERRORS_KEPT;
  for (uint64_t k = 0; k < kept; k++) { /* newest first */
    const struct job_error *e = &j->errors[(j->errors_total - 1 - k) % JOB_ERRORS_KEPT];
    json_array_append_new(errs, json_pack("{s:s,s:s,s:I}", "item", e->item, "message", e->message,
                                          "at_ms", (json_int_t)e->at_ms));
  }
  json_object_set_new(o, "errors", errs);
  json_object_set_new(o, "errors_total", json_integer((json_int_t)j->errors_total));
  if (j->message[0]) json_object_set_new(o, "message", json_string(j->message));
  if (saving) {
    char hex[BR_HEX_LEN + 1] = "";
    if (j->has_cursor) br_hex_encode(j->cursor_digest, hex);
    json_object_set_new(o, "cursor_digest", json_string(hex));
    json_object_set_new(o, "cursor_key", json_string(j->cursor_key));
    json_object_set_new(o, "rate_mb", json_real(j->rate_mb));
    json_object_set_new(o, "run_t0_ms", json_integer((json_int_t)j->run_t0_ms));
    json_object_set_new(o, "run_bytes0", json_integer((json_int_t)j->run_bytes0));
  }
  return o;
}

static uint64_t get_u64(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
}

static void copy_str(char *dst, size_t n, json_t *o, const char *k) {
  const char *s = json_string_value(json_object_get(o, k));
  snprintf(dst, n, "%s", s ? s : "");
}

/* A saved job back (NULL when the file is not one). */
static struct job *job_from_json(json_t *o) {
  const char *kind = json_string_value(json_object_get(o, "kind"));
  const char *state = json_string_value(json_object_get(o, "state"));
  json_t *p = json_object_get(o, "params");
  if (!kind || !state || !json_is_object(p) || !get_u64(o, "id")) return NULL;
  struct job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->id = get_u64(o, "id");
  j->kind = !strcmp(kind, "import") ? KIND_IMPORT : KIND_MIGRATE;
  j->state = ST_FAILED;
  for (int s = 0; s < 5; s++)
    if (!strcmp(state, state_names[s])) j->state = (enum job_state)s;
  if (j->kind == KIND_MIGRATE) {
    copy_str(j->source, sizeof j->source, p, "from");
    copy_str(j->target, sizeof j->target, p, "to");
    const char *v = json_string_value(json_object_get(p, "verify"));
    j->verify_sha = !v || strcmp(v, "size");
    j->limit = get_u64(p, "limit");
    j->dry_run = json_is_true(json_object_get(p, "dry_run"));
  } else {
    copy_str(j->source, sizeof j->source, p, "store");
    copy_str(j->source_arg, sizeof j->source_arg, p, "source");
    copy_str(j->prefix, sizeof j->prefix, p, "prefix");
    const char *m = json_string_value(json_object_get(p, "mode"));
    j->copy = m && !strcmp(m, "copy");
  }
  j->concurrency = (int)get_u64(p, "concurrency");
  if (j->concurrency < 1 || j->concurrency > JOB_MAX_CONCURRENCY) j->concurrency = 4;
  j->rate_mb = json_number_value(json_object_get(o, "rate_mb"));
  j->created_ms = get_u64(o, "created_ms");
  j->started_ms = get_u64(o, "started_ms");
  j->ended_ms = get_u64(o, "ended_ms");
  j->items_total = get_u64(o, "items_total");
  j->items_done = get_u64(o, "items_done");
  j->items_skipped = get_u64(o, "items_skipped");
  j->items_failed = get_u64(o, "items_failed");
  j->bytes_total = get_u64(o, "bytes_total");
  j->bytes_done = get_u64(o, "bytes_done");
  j->at_target = get_u64(o, "items_at_target");
  j->elsewhere = get_u64(o, "items_elsewhere");
  json_t *steps = json_object_get(o, "steps");
  for (int s = 0; s < STEPS; s++) j->step_ms[s] = get_u64(steps, step_names[j->kind][s]);
  json_t *errs = json_object_get(o, "errors");
  size_t ne = json_array_size(errs);
  if (ne > JOB_ERRORS_KEPT) ne = JOB_ERRORS_KEPT;
  j->errors_total = get_u64(o, "errors_total");
  if (j->errors_total < ne) j->errors_total = ne;
  for (size_t k = 0; k < ne; k++) { /* saved newest first, each back at its place in the ring */
    json_t *e = json_array_get(errs, k);
    struct job_error *d = &j->errors[(j->errors_total - 1 - k) % JOB_ERRORS_KEPT];
    copy_str(d->item, sizeof d->item, e, "item");
    copy_str(d->message, sizeof d->message, e, "message");
    d->at_ms = get_u64(e, "at_ms");
  }
  copy_str(j->message, sizeof j->message, o, "message");
  const char *hex = json_string_value(json_object_get(o, "cursor_digest"));
  if (hex && strlen(hex) == BR_HEX_LEN && br_hex_decode(hex, BR_HEX_LEN, j->cursor_digest) == 0)
    j->has_cursor = 1;
  copy_str(j->cursor_key, sizeof j->cursor_key, o, "cursor_key");
  j->run_t0_ms = get_u64(o, "run_t0_ms");
  j->run_bytes0 = get_u64(o, "run_bytes0");
  if (j->run_bytes0 > j->bytes_done) j->run_bytes0 = j->bytes_done;
  return j;
}

/* A job's row back (NULL when its doc is not a job): its id and cancel from the row's columns. */
static struct job *job_from_row(const br_index_job *row) {
  json_t *o = json_loads(row->doc, 0, NULL);
  if (!json_is_object(o)) {
    json_decref(o);
    return NULL;
  }
  json_object_set_new(o, "id", json_integer((json_int_t)row->id));
  struct job *j = job_from_json(o);
  json_decref(o);
  if (j) j->cancel = row->cancel && row->active;
  return j;
}

/* A job's row as the API shows it (NULL when its doc is not a job): node names the node whose
 * lease runs, cancel_requested says a cancel is on its way to it. */
static json_t *row_json(const br_index_job *row) {
  struct job *j = job_from_row(row);
  if (!j) return NULL;
  json_t *o = job_json(j, 0);
  if (active(j) && row->leased) json_object_set_new(o, "node", json_string(row->owner));
  if (active(j) && row->cancel) json_object_set_new(o, "cancel_requested", json_true());
  free(j);
  return o;
}

/* br_index_job_fn: the first row as API JSON into *(json_t **)ud. */
static int row_one_cb(void *ud, const br_index_job *row) {
  json_t **out = ud;
  if (!*out) *out = row_json(row);
  return 1;
}

/* br_index_job_fn: each row as API JSON appended to the array ud. */
static int row_list_cb(void *ud, const br_index_job *row) {
  json_t *o = row_json(row);
  if (o) json_array_append_new(ud, o);
  return 0;
}

/* Writes job j's row (shared): its doc, and its lease renewed (handed back when releasing; ended
 * when no longer active). A lost lease halts the job; a cancel asked for on any node is seen
 * here. A failed write leaves it dirty, for the next renewal. Lock held. */
static void job_write(struct job_engine *en, struct job *j) {
  if (j->lost) return;
  json_t *o = job_json(j, 1);
  char *doc = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  br_err err;
  int cancel = 0;
  int rc = doc ? br_index_job_save(en->srv->index, j->id, en->owner, doc, active(j),
                                   j->releasing ? 0 : en->lease_ms, &cancel, &err)
               : br_fail(&err, "out of memory");
  free(doc);
  if (rc < 0) {
    j->dirty = 1;
    br_warn("job %" PRIu64 ": saving: %s", j->id, err.msg);
    return;
  }
  j->dirty = 0;
  j->saved_ms = mono_ms();
  if (rc == 1) {
    j->lost = 1;
    pthread_cond_broadcast(&en->cv);
    br_warn("job %" PRIu64 ": its lease was lost (another node holds it): stopping", j->id);
  } else if (cancel && !j->cancel) {
    j->cancel = 1;
    pthread_cond_broadcast(&en->cv);
    br_info("job %" PRIu64 ": cancel asked for (on another node)", j->id);
  }
}

/* Saves job j to DIR/ID.json: a temporary file renamed over the old one (fsync'd when durable:
 * on state changes; progress after each item survives a kill of the process without it). Lock
 * held. */
static void job_save(struct job_engine *en, struct job *j, int durable) {
  if (en->shared) { /* progress goes with the next renewal; state changes and cursors at once */
    if (durable)
      job_write(en, j);
    else
      j->dirty = 1;
    return;
  }
  char path[PATH_MAX + 32], tmp[PATH_MAX + 40];
  snprintf(path, sizeof path, "%s/%" PRIu64 ".json", en->dir, j->id);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  json_t *o = job_json(j, 1);
  int ok = json_dump_file(o, tmp, JSON_COMPACT) == 0;
  json_decref(o);
  if (ok && durable) {
    FILE *f = fopen(tmp, "r+");
    ok = f && fsync(fileno(f)) == 0;
    if (f) fclose(f);
  }
  if (!ok || rename(tmp, path) < 0) {
    br_warn("job %" PRIu64 ": saving %s: %s", j->id, path, strerror(errno));
    unlink(tmp);
  }
}

/* ---- progress ---------------------------------------------------------------------------- */

static void job_error(struct job_engine *en, struct job *j, const char *item, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void job_error(struct job_engine *en, struct job *j, const char *item, const char *fmt,
                      ...) {
  pthread_mutex_lock(&en->lock);
  struct job_error *e = &j->errors[j->errors_total++ % JOB_ERRORS_KEPT];
  snprintf(e->item, sizeof e->item, "%s", item);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  e->at_ms = br_now_ms();
  j->items_failed++;
  br_warn("job %" PRIu64 ": %s: %s", j->id, item, e->message);
  pthread_mutex_unlock(&en->lock);
}

/* Should the job stop now (cancelled, or the server stopping)? */
static int job_halted(struct job_engine *en, struct job *j) {
  pthread_mutex_lock(&en->lock);
  int h = j->cancel || en->stopping || j->lost;
  pthread_mutex_unlock(&en->lock);
  return h;
}

/* Waits until bytes more may be copied under the job's rate; 0, or -1 when halted meanwhile. */
static int rate_wait(struct job_engine *en, struct job *j, uint64_t bytes) {
  if (j->rate_mb <= 0) return job_halted(en, j) ? -1 : 0;
  pthread_mutex_lock(&en->lock);
  double now = mono_s();
  double start = j->rate_next_s > now ? j->rate_next_s : now;
  j->rate_next_s = start + (double)bytes / (j->rate_mb * 1e6);
  while (!j->cancel && !en->stopping && mono_s() < start) {
    double left = start - mono_s();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)(left * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_cond_timedwait(&en->cv, &en->lock, &ts);
  }
  int h = j->cancel || en->stopping;
  pthread_mutex_unlock(&en->lock);
  return h ? -1 : 0;
}

/* Runs fn(ud, i) for i in [0, n) on up to concurrency threads (the caller's included). */
struct pool {
  void (*fn)(void *ud, size_t i);
  void *ud;
  size_t n, next;
  pthread_mutex_t lock;
};

static void *pool_main(void *arg) {
  struct pool *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->lock);
    size_t i = p->next < p->n ? p->next++ : SIZE_MAX;
    pthread_mutex_unlock(&p->lock);
    if (i == SIZE_MAX) return NULL;
    p->fn(p->ud, i);
  }
}

static void pool_run(int concurrency, size_t n, void (*fn)(void *, size_t), void *ud) {
  struct pool p = {.fn = fn, .ud = ud, .n = n};
  pthread_mutex_init(&p.lock, NULL);
  pthread_t th[JOB_MAX_CONCURRENCY];
  int started = 0;
  for (int k = 1; k < concurrency && (size_t)k < n; k++)
    if (pthread_create(&th[started], NULL, pool_main, &p) == 0) started++;
  pool_main(&p);
  for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
  pthread_mutex_destroy(&p.lock);
}

/* ---- migrate ----------------------------------------------------------------------------- */

enum { MIGRATE_BATCH = 64 };

struct mig_item {
  uint8_t digest[BR_SHA256_LEN];
  uint64_t size;
  br_location from;
};

struct mig_scan {
  const char *from, *to;
  struct mig_item *items;
  size_t n, cap;
  uint8_t last[BR_SHA256_LEN]; /* the last key looked at */
  int any;
  uint64_t count, bytes, at_target, elsewhere; /* counting only (items == NULL) */
};

static int mig_scan_cb(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  struct mig_scan *s = ud;
  const br_location *p = br_record_primary(rec);
  /* quarantined blobs move too: a store being emptied must end empty */
  int match = p && p->role == BR_ROLE_PRIMARY && !strcmp(p->store, s->from);
  if (!s->items) {
    if (match)
      s->count++, s->bytes += rec->size;
    else if (p && !strcmp(p->store, s->to))
      s->at_target++;
    else
      s->elsewhere++;
    return 0;
  }
  if (match) {
    if (s->n == s->cap) return 1;
    struct mig_item *it = &s->items[s->n++];
    memcpy(it->digest, digest, BR_SHA256_LEN);
    it->size = rec->size;
    it->from = *p;
  }
  memcpy(s->last, digest, BR_SHA256_LEN);
  s->any = 1;
  return 0;
}

struct mig_batch {
  struct job_engine *en;
  struct job *j;
  br_store *from, *to;
  struct mig_item *items;
};

static void migrate_one(void *ud, size_t i) {
  struct mig_batch *b = ud;
  struct job_engine *en = b->en;
  struct job *j = b->j;
  struct mig_item *it = &b->items[i];
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(it->digest, hex);
  pthread_mutex_lock(&en->lock);
  int over = j->limit && j->claimed >= j->limit;
  if (!over) j->claimed++; /* given back if the blob turns out moved or gone already */
  pthread_mutex_unlock(&en->lock);
  if (over || job_halted(en, j)) return;
  struct br_move mv = {.expect = it->from};
  snprintf(mv.to.store, sizeof mv.to.store, "%s", j->target);
  if (!br_store_default_key(b->to, it->digest, mv.to.key, sizeof mv.to.key)) {
    job_error(en, j, hex, "the target key is too long");
    return;
  }
  uint64_t copy_ms = 0;
  br_err err;
  for (int attempt = 0; attempt < 2; attempt++) {
    uint64_t have = 0;
    /* a copy left by an interrupted run is not made again: the move hashes it before the switch
     * and refuses other bytes, and then it is copied once more */
    if (!(attempt == 0 && br_store_stat(b->to, mv.to.key, &have, &err) == 0 && have == it->size)) {
      if (rate_wait(en, j, it->size) < 0) return;
      uint64_t t = br_now_ms();
      if (br_store_copy_blob(b->from, it->from.key, b->to, mv.to.key, it->digest, &err) < 0) {
        job_error(en, j, hex, "copy %s:%s -> %s:%s: %s", it->from.store, it->from.key, mv.to.store,
                  mv.to.key, err.msg);
        return;
      }
      copy_ms += br_now_ms() - t;
    }
    br_server_move_blob(en->srv, it->digest, &mv);
    if (mv.result != BR_MOVE_VERIFY_FAILED) break;
  }
  pthread_mutex_lock(&en->lock);
  j->step_ms[STEP_A] += copy_ms;
  j->step_ms[STEP_B] += mv.verify_ms;
  j->step_ms[STEP_C] += mv.switch_ms;
  pthread_mutex_unlock(&en->lock);
  if (mv.result == BR_MOVE_CHANGED || mv.result == BR_MOVE_NOT_FOUND) { /* moved or gone since */
    pthread_mutex_lock(&en->lock);
    j->items_skipped++;
    j->claimed--;
    job_save(en, j, 0);
    pthread_mutex_unlock(&en->lock);
    return;
  }
  if (mv.result != BR_MOVE_OK) {
    job_error(en, j, hex, "%s", mv.message);
    return;
  }
  pthread_mutex_lock(&en->lock);
  j->items_done++;
  j->bytes_done += it->size;
  job_save(en, j, 0);
  pthread_mutex_unlock(&en->lock);
}

/* Returns 0 when the job went through (or halted), -1 with msg when it cannot run. */
static int migrate_run(struct job_engine *en, struct job *j, char *msg, size_t msglen) {
  br_server *srv = en->srv;
  br_store *from = br_server_store(srv, j->source), *to = br_server_store(srv, j->target);
  if (!from || !to) {
    snprintf(msg, msglen, "no store named %s", from ? j->target : j->source);
    return -1;
  }
  br_err err;
  struct mig_scan count = {.from = j->source, .to = j->target};
  if (br_index_foreach(srv->index, mig_scan_cb, &count, &err) < 0) {
    snprintf(msg, msglen, "scanning the index: %.200s", err.msg);
    return -1;
  }
  pthread_mutex_lock(&en->lock);
  j->claimed = j->items_done + j->items_failed;
  uint64_t todo = count.count;
  if (j->limit) {
    uint64_t left = j->limit > j->items_done ? j->limit - j->items_done : 0;
    if (todo > left) todo = left;
  }
  j->items_total = j->items_done + j->items_failed + todo;
  if (!j->items_done && !j->items_failed) { /* the first run: what was there before it */
    j->at_target = count.at_target;
    j->elsewhere = count.elsewhere;
  }
  j->bytes_total = j->bytes_done + count.bytes; /* with a limit: an upper bound */
  job_save(en, j, 1);
  pthread_mutex_unlock(&en->lock);
  if (j->dry_run) return 0;
  struct mig_item *items = calloc(MIGRATE_BATCH, sizeof *items);
  if (!items) {
    snprintf(msg, msglen, "out of memory");
    return -1;
  }
  for (;;) {
    if (job_halted(en, j)) break;
    pthread_mutex_lock(&en->lock);
    int over = j->limit && j->claimed >= j->limit;
    pthread_mutex_unlock(&en->lock);
    if (over) break;
    struct mig_scan s = {.from = j->source, .items = items, .cap = MIGRATE_BATCH};
    if (br_index_foreach_after(srv->index, j->has_cursor ? j->cursor_digest : NULL, mig_scan_cb, &s,
                               &err) < 0) {
      free(items);
      snprintf(msg, msglen, "scanning the index: %.200s", err.msg);
      return -1;
    }
    if (!s.any) break; /* the end of the index */
    struct mig_batch b = {.en = en, .j = j, .from = from, .to = to, .items = items};
    pool_run(j->concurrency, s.n, migrate_one, &b);
    if (job_halted(en, j)) break; /* the batch may be unfinished: its cursor is not advanced */
    pthread_mutex_lock(&en->lock);
    memcpy(j->cursor_digest, s.last, BR_SHA256_LEN);
    j->has_cursor = 1;
    job_save(en, j, 1);
    pthread_mutex_unlock(&en->lock);
  }
  free(items);
  return 0;
}

/* ---- import ------------------------------------------------------------------------------ */

enum { IMPORT_BATCH = 64 };

struct key_list {
  char **keys;
  uint64_t *sizes;
  size_t n, cap;
  int too_many;
};

static int list_cb(void *ud, const char *key, uint64_t size) {
  struct key_list *l = ud;
  if (l->n == JOB_IMPORT_MAX_KEYS) {
    l->too_many = 1;
    return 1;
  }
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 1024;
    char **k = realloc(l->keys, cap * sizeof *k);
    if (k) l->keys = k;
    uint64_t *s = k ? realloc(l->sizes, cap * sizeof *s) : NULL;
    if (!k || !s) return 1;
    l->sizes = s;
    l->cap = cap;
  }
  if (!(l->keys[l->n] = strdup(key))) return 1;
  l->sizes[l->n++] = size;
  return 0;
}

static int key_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

struct imp_item {
  const char *key;
  int ok; /* hashed (and copied): goes to the index */
  int skip;
  br_record rec;
  uint8_t digest[BR_SHA256_LEN];
};

struct imp_batch {
  struct job_engine *en;
  struct job *j;
  br_store *st;
  struct imp_item *items;
};

static void import_one(void *ud, size_t i) {
  struct imp_batch *b = ud;
  struct job_engine *en = b->en;
  struct job *j = b->j;
  struct imp_item *it = &b->items[i];
  br_server *srv = en->srv;
  if (job_halted(en, j)) return;
  br_err err;
  uint8_t owner[BR_SHA256_LEN];
  int orc = br_index_key_owner(srv->index, j->source, it->key, owner, &err);
  if (orc == 0 || orc == 2) { /* indexed already: left alone */
    it->skip = 1;
    return;
  }
  if (orc < 0) {
    job_error(en, j, it->key, "%s", err.msg);
    return;
  }
  uint64_t size = 0, t0 = br_now_ms();
  uint64_t hashed_from = t0; /* a later write moves the file's ctime past it */
  if (rate_wait(en, j, 0) < 0) return;
  unsigned char head[BR_SNIFF_BYTES]; /* the bytes detection looks at, read on the way */
  size_t head_len = 0;
  int rc =
      br_store_hash_head(b->st, it->key, it->digest, &size, head, sizeof head, &head_len, &err);
  uint64_t t1 = br_now_ms();
  if (rc != 0) {
    if (rc > 0)
      it->skip = 1; /* gone since the listing */
    else
      job_error(en, j, it->key, "%s", err.msg);
    return;
  }
  if (size > srv->cfg->max_blob_size) {
    job_error(en, j, it->key, "%" PRIu64 " bytes: over max_blob_size", size);
    return;
  }
  br_location *l = &it->rec.locations[0];
  snprintf(l->store, sizeof l->store, "%s", j->source);
  uint8_t named[BR_SHA256_LEN];
  if (j->copy) {
    if (!br_store_default_key(b->st, it->digest, l->key, sizeof l->key)) {
      job_error(en, j, it->key, "the target key is too long");
      return;
    }
    br_record known;
    if (br_index_get(srv->index, it->digest, &known, &err) == 0) {
      it->skip = 1; /* the blob is indexed already (another copy of the same bytes) */
      return;
    }
    if (strcmp(l->key, it->key)) {
      if (br_store_copy_blob(b->st, it->key, b->st, l->key, it->digest, &err) < 0) {
        job_error(en, j, it->key, "copy to %s: %s", l->key, err.msg);
        return;
      }
      uint8_t got[BR_SHA256_LEN]; /* a server-side copy is not hashed on the way */
      uint64_t got_size = 0;
      hashed_from = br_now_ms();
      if (br_store_hash(b->st, l->key, got, &got_size, &err) != 0 || got_size != size ||
          memcmp(got, it->digest, BR_SHA256_LEN)) {
        job_error(en, j, it->key, "the copy at %s does not verify", l->key);
        return;
      }
    }
  } else {
    snprintf(l->key, sizeof l->key, "%s", it->key);
    if (br_store_default_key_digest(b->st, it->key, named) == 0 &&
        memcmp(named, it->digest, BR_SHA256_LEN)) {
      /* the place an upload of that other blob writes to: its bytes would replace these */
      job_error(en, j, it->key, "key_in_use: the default key of another blob");
      return;
    }
  }
  it->rec.size = size;
  it->rec.state = BR_STATE_LIVE;
  it->rec.nlocations = 1;
  br_sniff_name_or_bytes(it->key, head, head_len, it->rec.content_type,
                         sizeof it->rec.content_type);
  l->role = BR_ROLE_PRIMARY;
  l->verified_at_ms = hashed_from;
  it->ok = 1;
  pthread_mutex_lock(&en->lock);
  j->step_ms[STEP_A] += t1 - t0;
  j->step_ms[STEP_B] += br_now_ms() - t1;
  pthread_mutex_unlock(&en->lock);
}

/* Inserts the batch's hashed items in one index write; counts the outcomes. */
static int import_commit(struct job_engine *en, struct job *j, struct imp_item *items, size_t n,
                         char *msg, size_t msglen) {
  br_loc_change ch[IMPORT_BATCH];
  size_t of[IMPORT_BATCH], m = 0;
  uint64_t now = br_now_ms();
  for (size_t i = 0; i < n; i++) {
    if (!items[i].ok) continue;
    items[i].rec.created_ms = items[i].rec.last_upload_ms = items[i].rec.state_ms = now;
    memset(&ch[m], 0, sizeof ch[m]);
    ch[m].kind = BR_LOC_INSERT;
    ch[m].rec = &items[i].rec;
    memcpy(ch[m].digest, items[i].digest, BR_SHA256_LEN);
    of[m++] = i;
  }
  br_err err;
  uint64_t t = br_now_ms();
  if (m && br_index_apply_locations(en->srv->index, ch, m, now, &err) < 0) {
    snprintf(msg, msglen, "indexing: %.200s", err.msg);
    return -1;
  }
  pthread_mutex_lock(&en->lock);
  j->step_ms[STEP_C] += br_now_ms() - t;
  for (size_t i = 0; i < n; i++)
    if (items[i].skip) j->items_skipped++;
  pthread_mutex_unlock(&en->lock);
  for (size_t k = 0; k < m; k++) {
    struct imp_item *it = &items[of[k]];
    if (ch[k].outcome == BR_LOC_KEY_TAKEN) {
      job_error(en, j, it->key, "key_in_use: the key is another blob's location");
      continue;
    }
    pthread_mutex_lock(&en->lock);
    if (ch[k].outcome == BR_LOC_APPLIED) {
      j->items_done++;
      j->bytes_done += it->rec.size;
    } else {
      j->items_skipped++; /* exists, or a duplicate of a blob indexed elsewhere */
    }
    pthread_mutex_unlock(&en->lock);
  }
  return 0;
}

static int import_run(struct job_engine *en, struct job *j, char *msg, size_t msglen) {
  br_store *st = br_server_store(en->srv, j->source);
  if (!st) {
    snprintf(msg, msglen, "no store named %s", j->source);
    return -1;
  }
  struct key_list l = {0};
  br_err err;
  int rc = 0;
  if (br_store_list(st, j->prefix, list_cb, &l, &err) < 0) {
    snprintf(msg, msglen, "listing %s:%.100s: %.100s", j->source, j->prefix, err.msg);
    rc = -1;
    goto out;
  }
  if (l.too_many) {
    snprintf(msg, msglen, "more than %d objects under %s:%.100s: import it in parts",
             JOB_IMPORT_MAX_KEYS, j->source, j->prefix);
    rc = -1;
    goto out;
  }
  if (l.n) /* sorted, so that the cursor means the same next time */
    qsort(l.keys, l.n, sizeof *l.keys, key_cmp);
  size_t first = 0;
  uint64_t bytes_left = 0;
  while (j->cursor_key[0] && first < l.n && strcmp(l.keys[first], j->cursor_key) <= 0) first++;
  for (size_t i = first; i < l.n; i++) bytes_left += l.sizes[i];
  pthread_mutex_lock(&en->lock);
  j->items_total = j->items_done + j->items_skipped + j->items_failed + (l.n - first);
  j->bytes_total = j->bytes_done + bytes_left;
  job_save(en, j, 1);
  pthread_mutex_unlock(&en->lock);
  struct imp_item *items = calloc(IMPORT_BATCH, sizeof *items);
  if (!items) {
    snprintf(msg, msglen, "out of memory");
    rc = -1;
    goto out;
  }
  for (size_t at = first; at < l.n && !job_halted(en, j); at += IMPORT_BATCH) {
    size_t n = l.n - at < IMPORT_BATCH ? l.n - at : IMPORT_BATCH;
    memset(items, 0, n * sizeof *items);
    for (size_t i = 0; i < n; i++) items[i].key = l.keys[at + i];
    struct imp_batch b = {.en = en, .j = j, .st = st, .items = items};
    pool_run(j->concurrency, n, import_one, &b);
    if (job_halted(en, j)) break; /* unfinished: done again next time (indexed keys skipped) */
    if (import_commit(en, j, items, n, msg, msglen) < 0) {
      rc = -1;
      break;
    }
    pthread_mutex_lock(&en->lock);
    snprintf(j->cursor_key, sizeof j->cursor_key, "%s", l.keys[at + n - 1]);
    job_save(en, j, 1);
    pthread_mutex_unlock(&en->lock);
  }
  free(items);
out:
  for (size_t i = 0; i < l.n; i++) free(l.keys[i]);
  free(l.keys);
  free(l.sizes);
  return rc;
}

/* ---- the job thread ---------------------------------------------------------------------- */

struct job_arg {
  struct job_engine *en;
  struct job *j;
};

static void *job_main(void *arg) {
  struct job_arg *a = arg;
  struct job_engine *en = a->en;
  struct job *j = a->j;
  free(a);
  pthread_mutex_lock(&en->lock);
  j->state = ST_RUNNING;
  if (!j->started_ms) j->started_ms = br_now_ms();
  j->run_t0_ms = br_now_ms();
  j->run_bytes0 = j->bytes_done;
  job_save(en, j, 1);
  pthread_mutex_unlock(&en->lock);
  br_info("job %" PRIu64 ": %s %s%s%s running", j->id,
          j->kind == KIND_MIGRATE ? "migrate" : "import", j->source,
          j->kind == KIND_MIGRATE ? " -> " : ":", j->kind == KIND_MIGRATE ? j->target : j->prefix);
  char msg[300] = "";
  int rc = j->kind == KIND_MIGRATE ? migrate_run(en, j, msg, sizeof msg)
                                   : import_run(en, j, msg, sizeof msg);
  pthread_mutex_lock(&en->lock);
  if (j->lost) {
    /* another node holds it: its row is that node's */
    br_info("job %" PRIu64 ": stopped here (another node holds it)", j->id);
  } else if (en->stopping && !j->cancel) {
    /* left running on disk: the next start resumes it; shared: handed back, for any node */
    if (en->shared) {
      j->state = ST_QUEUED;
      j->releasing = 1;
      job_write(en, j);
      br_info("job %" PRIu64 ": handed back (%" PRIu64 " items done)", j->id, j->items_done);
    }
  } else {
    j->state = rc < 0 ? ST_FAILED : j->cancel ? ST_CANCELLED : ST_DONE;
    if (rc < 0) snprintf(j->message, sizeof j->message, "%s", msg);
    j->ended_ms = br_now_ms();
    job_save(en, j, 1);
    br_info("job %" PRIu64 ": %s: %" PRIu64 " items (%" PRIu64 " bytes) done, %" PRIu64
            " skipped, %" PRIu64 " failed%s%s",
            j->id, state_names[j->state], j->items_done, j->bytes_done, j->items_skipped,
            j->items_failed, msg[0] ? ": " : "", msg);
  }
  j->thread_ended = 1;
  pthread_mutex_unlock(&en->lock);
  return NULL;
}

/* Starts j's thread. Lock held. */
static int job_launch(struct job_engine *en, struct job *j) {
  struct job_arg *a = malloc(sizeof *a);
  if (!a) return -1;
  a->en = en, a->j = j;
  if (pthread_create(&j->thread, NULL, job_main, a)) {
    free(a);
    return -1;
  }
  j->thread_started = 1;
  return 0;
}

/* Makes room for one more job: forgets the oldest ended one (its thread joined, its file
 * deleted). 0, or -1 when all JOBS_KEPT are active. Lock held. */
static int make_room(struct job_engine *en) {
  if (en->njobs < JOBS_KEPT) return 0;
  for (int i = 0; i < en->njobs; i++) { /* oldest first */
    struct job *j = en->jobs[i];
    if (active(j)) continue;
    if (j->thread_started) pthread_join(j->thread, NULL); /* it has ended: at once */
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%" PRIu64 ".json", en->dir, j->id);
    unlink(path);
    free(j);
    memmove(&en->jobs[i], &en->jobs[i + 1], (size_t)(en->njobs - i - 1) * sizeof en->jobs[0]);
    en->njobs--;
    return 0;
  }
  return -1;
}

/* ---- the shared engine (a PostgreSQL index) ---------------------------------------------- */

/* Forgets the jobs whose thread has ended (joined at once). Lock held. */
static void reap_ended(struct job_engine *en) {
  for (int i = 0; i < en->njobs;) {
    struct job *j = en->jobs[i];
    if (!j->thread_ended) {
      i++;
      continue;
    }
    pthread_join(j->thread, NULL);
    free(j);
    memmove(&en->jobs[i], &en->jobs[i + 1], (size_t)(en->njobs - i - 1) * sizeof en->jobs[0]);
    en->njobs--;
  }
}

/* Takes a job claimed (or added) by this node: runs it, or hands it back when the engine stops
 * or is full. Lock held; j is the engine's or freed. */
static void take_job(struct job_engine *en, struct job *j) {
  j->saved_ms = mono_ms();
  if (en->stopping || en->njobs == JOBS_KEPT || job_launch(en, j) < 0) {
    j->releasing = 1;
    if (j->state == ST_RUNNING) j->state = ST_QUEUED;
    job_write(en, j);
    free(j);
    return;
  }
  en->jobs[en->njobs++] = j;
}

struct claim {
  struct job_engine *en;
  struct job *j;
  uint64_t id;
  int mine; /* its last runner was this node (before a restart) */
};

static int claim_cb(void *ud, const br_index_job *row) {
  struct claim *c = ud;
  c->id = row->id;
  c->mine = !strcmp(row->owner, c->en->owner);
  c->j = job_from_row(row);
  return 1;
}

/* Claims the jobs that no live lease holds (queued ones, a killed or stopped node's), a few per
 * call, and runs them: each resumes from the progress saved in its row. */
static void claim_jobs(struct job_engine *en, int mine) {
  for (int k = 0; k < 8; k++) {
    struct claim c = {.en = en};
    br_err err;
    int rc = br_index_job_claim(en->srv->index, en->owner, en->lease_ms, mine && k == 0, claim_cb,
                                &c, &err);
    if (rc < 0) br_warn("jobs: claiming: %s", err.msg);
    if (rc != 0) return;
    pthread_mutex_lock(&en->lock);
    if (!c.j) { /* not a job's doc: ended, so that no node claims it again */
      struct job bad = {.id = c.id, .state = ST_FAILED, .ended_ms = br_now_ms()};
      snprintf(bad.message, sizeof bad.message, "its saved state cannot be read");
      job_write(en, &bad);
    } else {
      br_info("job %" PRIu64 ": %s (%s, %" PRIu64 " items done)", c.j->id,
              c.mine ? "resumed after a restart" : "taken over", state_names[c.j->state],
              c.j->items_done);
      take_job(en, c.j);
    }
    pthread_mutex_unlock(&en->lock);
  }
}

/* The lease thread: every poll, writes the running jobs' progress and renews their leases (every
 * renew_ms at least), forgets the ended ones, and claims what nobody holds. */
static void *lease_main(void *arg) {
  struct job_engine *en = arg;
  uint64_t poll_ms = en->renew_ms < 1000 ? en->renew_ms : 1000;
  pthread_mutex_lock(&en->lock);
  while (!en->stopping) {
    uint64_t now = mono_ms();
    for (int i = 0; i < en->njobs; i++) {
      struct job *j = en->jobs[i];
      if (!j->thread_ended && !j->lost && active(j) &&
          (j->dirty || now - j->saved_ms >= en->renew_ms))
        job_write(en, j);
    }
    reap_ended(en);
    pthread_mutex_unlock(&en->lock);
    claim_jobs(en, 0);
    pthread_mutex_lock(&en->lock);
    if (en->stopping) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + poll_ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_cond_timedwait(&en->cv, &en->lock, &ts);
  }
  pthread_mutex_unlock(&en->lock);
  return NULL;
}

/* This node's name on its leases: host and a random id kept in DATA_DIR/jobs/lease-owner, made
 * at the first start. The data directory's lock makes one process at a time its owner, so that
 * what a killed run held is this node's again at once when it restarts. The file also names the
 * directory it was made in (device and inode): a data directory copied elsewhere (a cloned
 * image, a restored backup) makes an id of its own, never sharing another node's leases. */
static void pick_owner(struct job_engine *en) {
  char host[64] = "", line[96] = "", id[17] = "", path[PATH_MAX + 16];
  if (gethostname(host, sizeof host) < 0) host[0] = '\0';
  host[sizeof host - 1] = '\0';
  struct stat sd;
  uint64_t dev = 0, ino = 0;
  if (stat(en->dir, &sd) == 0) dev = (uint64_t)sd.st_dev, ino = (uint64_t)sd.st_ino;
  snprintf(path, sizeof path, "%s/lease-owner", en->dir);
  FILE *f = fopen(path, "r");
  if (f) {
    uint64_t fdev = 0, fino = 0;
    if (fgets(line, sizeof line, f) &&
        sscanf(line, "%16[0-9a-f] %" SCNu64 ":%" SCNu64, id, &fdev, &fino) == 3 &&
        (fdev != dev || fino != ino || !ino))
      id[0] = '\0'; /* made in another directory: this copy's own id */
    fclose(f);
  }
  if (strlen(id) != 16) {
    uint64_t r = 0;
    FILE *u = fopen("/dev/urandom", "rb");
    if (!u || fread(&r, sizeof r, 1, u) != 1) r = br_mono_ns() ^ (uint64_t)getpid() << 32;
    if (u) fclose(u);
    snprintf(id, sizeof id, "%016" PRIx64, r);
    f = fopen(path, "w");
    int ok = f && fprintf(f, "%s %" PRIu64 ":%" PRIu64 "\n", id, dev, ino) > 0;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok)
      br_warn("jobs: %s: %s (a restart waits for its leases to expire)", path, strerror(errno));
  }
  snprintf(en->owner, sizeof en->owner, "%s/%s", host, id);
}

/* ---- the API ----------------------------------------------------------------------------- */

static int job_id_cmp(const void *a, const void *b) {
  const struct job *x = *(struct job *const *)a, *y = *(struct job *const *)b;
  return x->id < y->id ? -1 : x->id > y->id;
}

int jobs_start(br_server *srv, br_err *err) {
  struct job_engine *en = calloc(1, sizeof *en);
  if (!en) return br_fail(err, "out of memory");
  pthread_mutex_init(&en->lock, NULL);
  pthread_cond_init(&en->cv, NULL);
  en->srv = srv;
  en->next_id = 1;
  srv->jobs = en;
  snprintf(en->dir, sizeof en->dir, "%s/jobs", srv->cfg->data_dir);
  if (mkdir(en->dir, 0700) < 0 && errno != EEXIST)
    return br_fail(err, "%s: %s", en->dir, strerror(errno));
  if (br_index_has_jobs(srv->index)) { /* the rows of the database: no job file is read */
    en->shared = 1;
    en->lease_ms = srv->cfg->job_lease_ms ? srv->cfg->job_lease_ms : 30000;
    en->renew_ms = en->lease_ms / 6 ? en->lease_ms / 6 : 1;
    pick_owner(en);
    br_info("jobs: kept in PostgreSQL, leased for %" PRIu64 " ms as %s", en->lease_ms, en->owner);
    claim_jobs(en, 1); /* this node's killed run's jobs first, at once */
    if (pthread_create(&en->lease_thread, NULL, lease_main, en))
      return br_fail(err, "jobs: cannot start the lease thread");
    en->lease_started = 1;
    return 0;
  }
  DIR *d = opendir(en->dir);
  if (!d) return br_fail(err, "%s: %s", en->dir, strerror(errno));
  struct job *loaded[JOBS_KEPT * 2];
  int nl = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t len = strlen(de->d_name);
    if (len < 6 || strcmp(de->d_name + len - 5, ".json")) continue;
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", en->dir, de->d_name);
    json_t *o = json_load_file(path, 0, NULL);
    struct job *j = o ? job_from_json(o) : NULL;
    json_decref(o);
    if (!j) {
      br_warn("jobs: %s is not a saved job: ignored", path);
      continue;
    }
    if (nl == JOBS_KEPT * 2) {
      free(j);
      continue;
    }
    loaded[nl++] = j;
  }
  closedir(d);
  qsort(loaded, (size_t)nl, sizeof *loaded, job_id_cmp);
  pthread_mutex_lock(&en->lock);
  for (int i = 0; i < nl; i++) {
    struct job *j = loaded[i];
    if (j->id >= en->next_id) en->next_id = j->id + 1;
    if (make_room(en) < 0) { /* more active jobs saved than kept: the oldest ones are left */
      free(j);
      continue;
    }
    en->jobs[en->njobs++] = j;
  }
  for (int i = 0; i < en->njobs; i++) {
    struct job *j = en->jobs[i];
    if (!active(j)) continue;
    br_info("job %" PRIu64 ": resumed after a restart (%" PRIu64 " items done)", j->id,
            j->items_done);
    if (job_launch(en, j) < 0) {
      j->state = ST_FAILED;
      snprintf(j->message, sizeof j->message, "cannot start its thread");
    }
  }
  pthread_mutex_unlock(&en->lock);
  return 0;
}

void jobs_stop(br_server *srv) {
  struct job_engine *en = srv->jobs;
  if (!en) return;
  pthread_mutex_lock(&en->lock);
  en->stopping = 1;
  pthread_cond_broadcast(&en->cv);
  pthread_mutex_unlock(&en->lock);
  if (en->lease_started) pthread_join(en->lease_thread, NULL); /* claims no more */
  for (int i = 0; i < en->njobs; i++) /* each hands its job back (shared) */
    if (en->jobs[i]->thread_started) pthread_join(en->jobs[i]->thread, NULL);
  for (int i = 0; i < en->njobs; i++) free(en->jobs[i]);
  pthread_mutex_destroy(&en->lock);
  pthread_cond_destroy(&en->cv);
  free(en);
  srv->jobs = NULL;
}

/* Field checks of jobs_submit: each sets *field and msg on failure. */
#define BAD(f, ...)                     \
  do {                                  \
    *field = f;                         \
    snprintf(msg, msglen, __VA_ARGS__); \
    free(j);                            \
    return JOBS_BAD;                    \
  } while (0)

static const char *const migrate_fields[] = {"kind", "from",  "to",      "verify", "concurrency",
                                             "rate", "limit", "dry_run", NULL};
static const char *const import_fields[] = {"kind", "store", "source", "mode", "concurrency", NULL};

static int known_field(const char *const *fields, const char *k) {
  for (int i = 0; fields[i]; i++)
    if (!strcmp(fields[i], k)) return 1;
  return 0;
}

/* An fs store's root as a real path (for a source given as a folder), or "" if none. */
static void store_root(br_server *srv, const char *store, char *out, size_t n) {
  const br_store_config *sc = br_config_store(srv->cfg, store);
  out[0] = '\0';
  if (sc && sc->kind && !strcmp(sc->kind, "fs") && sc->root && n >= PATH_MAX) {
    if (!realpath(sc->root, out)) out[0] = '\0';
  }
}

/* jobs_submit on a shared index: the row is added leased by this node (the unique index refuses
 * a second active job of the store on any node), then run here. */
static enum jobs_rc submit_shared(struct job_engine *en, struct job *j, json_t **out, char *msg,
                                  size_t msglen) {
  j->state = ST_QUEUED;
  j->created_ms = br_now_ms();
  json_t *o = job_json(j, 1);
  char *doc = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  json_t *other = NULL;
  br_err err;
  int rc = doc ? br_index_job_add(en->srv->index, j->source, doc, en->owner, en->lease_ms,
                                  JOBS_KEPT, &j->id, row_one_cb, &other, &err)
               : br_fail(&err, "out of memory");
  free(doc);
  if (rc != 0) {
    if (rc == 1 && other) {
      snprintf(msg, msglen, "job %" JSON_INTEGER_FORMAT " is %s on store %s",
               json_integer_value(json_object_get(other, "id")),
               json_string_value(json_object_get(other, "state")), j->source);
      *out = other;
    } else {
      snprintf(msg, msglen, "%s", rc == 1 ? "another job holds the store" : err.msg);
      json_decref(other);
    }
    free(j);
    return rc == 1 && other ? JOBS_CONFLICT : JOBS_FAILED;
  }
  pthread_mutex_lock(&en->lock);
  *out = job_json(j, 0);
  json_object_set_new(*out, "node", json_string(en->owner));
  uint64_t id = j->id;
  take_job(en, j);
  pthread_mutex_unlock(&en->lock);
  br_info("job %" PRIu64 ": %s queued", id, json_string_value(json_object_get(*out, "kind")));
  return JOBS_OK;
}

enum jobs_rc jobs_submit(br_server *srv, json_t *spec, json_t **out, const char **field, char *msg,
                         size_t msglen) {
  struct job_engine *en = srv->jobs;
  struct job *j = calloc(1, sizeof *j);
  *field = NULL;
  if (!j) {
    snprintf(msg, msglen, "out of memory");
    return JOBS_FAILED;
  }
  const char *kind = json_string_value(json_object_get(spec, "kind"));
  if (!kind || (strcmp(kind, "migrate") && strcmp(kind, "import")))
    BAD("kind", "\"kind\" must be \"migrate\" or \"import\"");
  j->kind = !strcmp(kind, "migrate") ? KIND_MIGRATE : KIND_IMPORT;
  const char *k;
  json_t *v;
  json_object_foreach(spec, k, v) {
    if (!known_field(j->kind == KIND_MIGRATE ? migrate_fields : import_fields, k))
      BAD(k, "unknown field \"%.60s\" for a %s job", k, kind);
  }
  j->concurrency = 4;
  j->verify_sha = 1;
  v = json_object_get(spec, "concurrency");
  if (v && (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > JOB_MAX_CONCURRENCY))
    BAD("concurrency", "\"concurrency\" must be an integer from 1 to %d", JOB_MAX_CONCURRENCY);
  if (v) j->concurrency = (int)json_integer_value(v);
  if (j->kind == KIND_MIGRATE) {
    const char *from = json_string_value(json_object_get(spec, "from"));
    const char *to = json_string_value(json_object_get(spec, "to"));
    if (!from || !br_server_store(srv, from)) BAD("from", "\"from\" must name a configured store");
    if (!to || !br_server_store(srv, to)) BAD("to", "\"to\" must name a configured store");
    if (!strcmp(from, to)) BAD("to", "\"from\" and \"to\" are the same store");
    if (!strcmp(br_store_kind(br_server_store(srv, to)), "http"))
      BAD("to", "\"to\": %s is a read-only http store", to);
    snprintf(j->source, sizeof j->source, "%s", from);
    snprintf(j->target, sizeof j->target, "%s", to);
    v = json_object_get(spec, "verify");
    if (v && (!json_is_string(v) ||
              (strcmp(json_string_value(v), "sha256") && strcmp(json_string_value(v), "size"))))
      BAD("verify", "\"verify\" must be \"sha256\" or \"size\"");
    j->verify_sha = !v || !strcmp(json_string_value(v), "sha256");
    v = json_object_get(spec, "rate");
    if (v && (!json_is_number(v) || json_number_value(v) <= 0 || json_number_value(v) > 1e6))
      BAD("rate", "\"rate\" must be a number of MB/s above 0");
    j->rate_mb = v ? json_number_value(v) : 0;
    v = json_object_get(spec, "limit");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 1))
      BAD("limit", "\"limit\" must be a positive integer");
    j->limit = v ? (uint64_t)json_integer_value(v) : 0;
    v = json_object_get(spec, "dry_run");
    if (v && !json_is_boolean(v)) BAD("dry_run", "\"dry_run\" must be true or false");
    j->dry_run = json_is_true(v);
  } else {
    const char *store = json_string_value(json_object_get(spec, "store"));
    br_store *st = store ? br_server_store(srv, store) : NULL;
    if (!st) BAD("store", "\"store\" must name a configured store");
    if (!strcmp(br_store_kind(st), "http"))
      BAD("store", "\"store\": an http store cannot be listed");
    snprintf(j->source, sizeof j->source, "%s", store);
    v = json_object_get(spec, "source");
    if (v && !json_is_string(v)) BAD("source", "\"source\" must be a key prefix or a folder");
    const char *src = v ? json_string_value(v) : "";
    if (strlen(src) > BR_MAX_KEY) BAD("source", "\"source\" is longer than %d bytes", BR_MAX_KEY);
    snprintf(j->source_arg, sizeof j->source_arg, "%s", src);
    if (src[0] == '/') { /* a folder under the fs store's root */
      char root[PATH_MAX], real[PATH_MAX];
      store_root(srv, store, root, sizeof root);
      if (!root[0]) BAD("source", "\"source\": a folder needs an fs store (give a key prefix)");
      if (!realpath(src, real)) BAD("source", "\"source\": %.200s: %s", src, strerror(errno));
      size_t rl = strlen(root);
      if (strcmp(real, root) && (strncmp(real, root, rl) || real[rl] != '/'))
        BAD("source", "\"source\": %.200s is not under the store's root %.200s", src, root);
      const char *rel = real[rl] ? real + rl + 1 : "";
      struct stat sb;
      int dir = stat(real, &sb) == 0 && S_ISDIR(sb.st_mode);
      snprintf(j->prefix, sizeof j->prefix, "%s%s", rel, dir && *rel ? "/" : "");
    } else {
      char probe[BR_MAX_KEY + 2]; /* a prefix may end in "/": valid if a key below it is */
      snprintf(probe, sizeof probe, "%sx", src);
      if (*src && br_store_key_valid(probe) < 0)
        BAD("source", "\"source\": not a valid key prefix");
      snprintf(j->prefix, sizeof j->prefix, "%s", src);
    }
    v = json_object_get(spec, "mode");
    if (v && (!json_is_string(v) ||
              (strcmp(json_string_value(v), "in-place") && strcmp(json_string_value(v), "copy"))))
      BAD("mode", "\"mode\" must be \"in-place\" or \"copy\"");
    j->copy = v && !strcmp(json_string_value(v), "copy");
  }
  if (en->shared) return submit_shared(en, j, out, msg, msglen);
  pthread_mutex_lock(&en->lock);
  for (int i = 0; i < en->njobs; i++) {
    struct job *o = en->jobs[i];
    if (active(o) && !strcmp(o->source, j->source)) {
      snprintf(msg, msglen, "job %" PRIu64 " is %s on store %s", o->id, state_names[o->state],
               o->source);
      *out = job_json(o, 0);
      pthread_mutex_unlock(&en->lock);
      free(j);
      return JOBS_CONFLICT;
    }
  }
  if (en->stopping || make_room(en) < 0) {
    snprintf(msg, msglen, "%d jobs are active already", JOBS_KEPT);
    pthread_mutex_unlock(&en->lock);
    free(j);
    return JOBS_FULL;
  }
  j->id = en->next_id++;
  j->state = ST_QUEUED;
  j->created_ms = br_now_ms();
  en->jobs[en->njobs++] = j;
  job_save(en, j, 1);
  if (job_launch(en, j) < 0) {
    j->state = ST_FAILED;
    snprintf(j->message, sizeof j->message, "cannot start its thread");
    j->ended_ms = br_now_ms();
    job_save(en, j, 1);
  }
  *out = job_json(j, 0);
  pthread_mutex_unlock(&en->lock);
  br_info("job %" PRIu64 ": %s queued", j->id, kind);
  return JOBS_OK;
}

json_t *jobs_list(br_server *srv) {
  struct job_engine *en = srv->jobs;
  json_t *arr = json_array();
  if (en->shared) {
    br_err err;
    if (br_index_job_list(srv->index, 0, JOBS_KEPT, row_list_cb, arr, &err) < 0) {
      br_warn("jobs: listing: %s", err.msg);
      json_decref(arr);
      return NULL;
    }
    return json_pack("{s:o}", "jobs", arr);
  }
  pthread_mutex_lock(&en->lock);
  for (int i = en->njobs; i-- > 0;) json_array_append_new(arr, job_json(en->jobs[i], 0));
  pthread_mutex_unlock(&en->lock);
  return json_pack("{s:o}", "jobs", arr);
}

enum jobs_rc jobs_get(br_server *srv, uint64_t id, json_t **out) {
  struct job_engine *en = srv->jobs;
  json_t *o = NULL;
  *out = NULL;
  if (en->shared) {
    br_err err;
    if (br_index_job_list(srv->index, id, 1, row_one_cb, out, &err) < 0) {
      br_warn("jobs: reading job %" PRIu64 ": %s", id, err.msg);
      return JOBS_FAILED;
    }
    return *out ? JOBS_OK : JOBS_NOT_FOUND;
  }
  pthread_mutex_lock(&en->lock);
  for (int i = 0; i < en->njobs; i++)
    if (en->jobs[i]->id == id) o = job_json(en->jobs[i], 0);
  pthread_mutex_unlock(&en->lock);
  *out = o;
  return o ? JOBS_OK : JOBS_NOT_FOUND;
}

enum jobs_rc jobs_cancel(br_server *srv, uint64_t id, json_t **out) {
  struct job_engine *en = srv->jobs;
  enum jobs_rc rc = JOBS_NOT_FOUND;
  if (en->shared) { /* the flag in its row: its runner sees it at its next renewal */
    br_err err;
    *out = NULL;
    int r = br_index_job_cancel(srv->index, id, row_one_cb, out, &err);
    if (r < 0) br_warn("jobs: cancelling job %" PRIu64 ": %s", id, err.msg);
    if (r != 0 || !*out) return r < 0 ? JOBS_FAILED : JOBS_NOT_FOUND;
    pthread_mutex_lock(&en->lock);
    for (int i = 0; i < en->njobs; i++) /* run here: it stops at once */
      if (en->jobs[i]->id == id && active(en->jobs[i]) && !en->jobs[i]->cancel) {
        en->jobs[i]->cancel = 1;
        pthread_cond_broadcast(&en->cv);
      }
    pthread_mutex_unlock(&en->lock);
    br_info("job %" PRIu64 ": cancel asked for", id);
    return JOBS_OK;
  }
  pthread_mutex_lock(&en->lock);
  for (int i = 0; i < en->njobs; i++) {
    struct job *j = en->jobs[i];
    if (j->id != id) continue;
    if (active(j) && !j->cancel) {
      j->cancel = 1;
      pthread_cond_broadcast(&en->cv);
      br_info("job %" PRIu64 ": cancel asked for", id);
    }
    *out = job_json(j, 0);
    if (active(j)) json_object_set_new(*out, "cancel_requested", json_true());
    rc = JOBS_OK;
  }
  pthread_mutex_unlock(&en->lock);
  return rc;
}
