/* One reconcile run: mark (every retained snapshot's hashes, through the data-file cache, into an
 * external sort), sweep (the sorted references merged against the index in key order, decisions
 * spilled to a file), guards (fail closed, max_fraction, dry run), then the changes, each
 * re-checked by the index writer, deletions serialised with uploads of the same hash. */
#include "blobref/reconcile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "blobref/delta.h"
#include "blobref/iceberg.h"
#include "blobref/iceberg_s3.h"
#include "blobref/leases.h"
#include "reconcile/internal.h"

#define D BR_SHA256_LEN
#define MAX_ERRORS 50
#define MAX_HELD_LISTED 100
#define APPLY_BATCH 4096

struct br_reconciler {
  br_reconcile_env env;
  rstate *state;
  br_leases *leases;
  rprogress *progress; /* the run in progress, for readers here and on other nodes */
  char state_dir[4096];
  atomic_uint_fast64_t deleting_walks; /* finish_deletes' walks of the index */
};

br_reconciler *br_reconciler_open(const br_reconcile_env *env, br_err *err) {
  br_reconciler *r = calloc(1, sizeof *r);
  if (!r) {
    br_fail(err, "out of memory");
    return NULL;
  }
  r->env = *env;
  snprintf(r->state_dir, sizeof r->state_dir, "%s", env->state_dir);
  r->env.state_dir = r->state_dir;
  r->state = rstate_open(r->state_dir, br_index_has_shared(env->index) ? env->index : NULL, err);
  if (!r->state) {
    free(r);
    return NULL;
  }
  r->progress = rprogress_new(r->state, br_index_has_shared(env->index) ? env->index : NULL, err);
  char leases_dir[4200];
  snprintf(leases_dir, sizeof leases_dir, "%s/leases", r->state_dir);
  r->leases = r->progress ? br_leases_open(leases_dir, err) : NULL;
  if (!r->leases) {
    rprogress_free(r->progress);
    rstate_close(r->state);
    free(r);
    return NULL;
  }
  br_err ferr;
  int64_t finished = br_reconcile_finish_deletes(r, &ferr);
  if (finished < 0)
    br_warn("reconcile: finishing deletes cut short: %s (tried again at every run)", ferr.msg);
  else if (finished > 0)
    br_info("reconcile: finished %" PRId64 " delete(s) cut short before", finished);
  return r;
}

void br_reconciler_close(br_reconciler *r) {
  if (!r) return;
  br_leases_close(r->leases);
  rprogress_free(r->progress);
  rstate_close(r->state);
  free(r);
}

void br_reconciler_announce(br_reconciler *r, uint64_t id, const br_reconcile_options *opt) {
  char ts[64];
  br_format_time_ms(br_now_ms(), ts, sizeof ts);
  rprogress_start(r->progress, id, opt->dry_run, opt->force, opt->full, ts, "starting");
}

uint64_t br_reconciler_lease_run(br_reconciler *r) { return rprogress_holder(r->progress); }

json_t *br_reconciler_running(br_reconciler *r, uint64_t id) {
  return rprogress_get(r->progress, id);
}

br_leases *br_reconciler_leases(br_reconciler *r) { return r->leases; }

uint64_t br_reconciler_next_id(br_reconciler *r, br_err *err) {
  return rstate_next_run_id(r->state, err);
}

/* ---- mark ------------------------------------------------------------------------------------ */

struct mark {
  br_reconciler *r;
  const br_reconcile_options *opt;
  const br_iceberg_table_config *tcfg;
  dsort *sorter;
  rstate_entry *entry; /* the cache entry of the file being read */
  uint8_t *kept;       /* ids of every live data file seen (for pruning the cache) */
  size_t nkept, kept_cap;
  uint64_t files, read, cached;
  uint64_t all_files, all_read, all_cached; /* over every table, for the progress */
  br_iceberg_stats fstats;                  /* values, nulls, invalid of the files read */
  br_err err;
  int hash_failed;
};

static int add_ref(void *ud, const uint8_t d[D]) {
  struct mark *m = ud;
  if (dsort_add(m->sorter, d, &m->err) < 0) return m->hash_failed = 1;
  if (m->entry && rstate_entry_add(m->entry, d, &m->err) < 0) return m->hash_failed = 1;
  return 0;
}

static int on_data_file(void *ud, const br_iceberg_data_file *f) {
  struct mark *m = ud;
  rprogress_update(m->r->progress, "mark", m->all_files, m->all_read, m->all_cached, 0);
  uint8_t id[D];
  rstate_file_id(f->path, f->file_size, f->record_count, m->tcfg->column, (int)m->tcfg->form, id);
  if (m->nkept == m->kept_cap) {
    size_t ncap = m->kept_cap ? m->kept_cap * 2 : 1024;
    uint8_t *nk = realloc(m->kept, ncap * D);
    if (!nk) return br_fail(&m->err, "out of memory");
    m->kept = nk;
    m->kept_cap = ncap;
  }
  memcpy(m->kept + m->nkept++ * D, id, D);
  m->files++;
  m->all_files++;
  if (!m->opt->full) {
    m->entry = NULL;
    int rc = rstate_cached(m->r->state, id, add_ref, m, &m->err);
    if (rc < 0) return -1;
    if (rc == 1) {
      m->cached++;
      m->all_cached++;
      return 0;
    }
  }
  m->entry = rstate_entry_begin(m->r->state, id, &m->err);
  if (!m->entry) return -1;
  m->hash_failed = 0;
  if (br_iceberg_read_file_hashes(m->tcfg, f, add_ref, m, &m->fstats, &m->err) < 0) {
    if (m->hash_failed && !strstr(m->err.msg, f->path)) {
      char why[sizeof m->err.msg];
      snprintf(why, sizeof why, "%s", m->err.msg);
      br_fail(&m->err, "%s: %s", f->path, why);
    }
    rstate_entry_abort(m->entry);
    m->entry = NULL;
    return -1;
  }
  int rc = rstate_entry_commit(m->entry, &m->err);
  m->entry = NULL;
  m->read++;
  m->all_read++;
  return rc < 0 ? -1 : 0;
}

/* A configured table opened for reading: its reader config (tc, with its rewrites in rw), its S3
 * reader when its store is an s3 store (s3, else NULL; free with br_iceberg_s3_free), whether its
 * location is in S3 and whether it is a Delta table. */
struct table_open {
  br_iceberg_rewrite rw[BR_MAX_REWRITES];
  br_iceberg_table_config tc;
  br_iceberg_s3 *s3;
  int s3_table, delta;
};

/* Opens table t of cfg into o. Returns 0, or -1 (err) when its S3 reader cannot be made. */
static int table_open(const br_config *cfg, const br_table_config *t, struct table_open *o,
                      br_err *err) {
  memset(o, 0, sizeof *o);
  for (int i = 0; i < t->nrewrites; i++)
    o->rw[i] = (br_iceberg_rewrite){t->rewrite_from[i], t->rewrite_to[i]};
  o->tc = (br_iceberg_table_config){.location = t->location,
                                    .column = t->column,
                                    .form = t->form,
                                    .rewrites = o->rw,
                                    .nrewrites = (size_t)t->nrewrites};
  const br_store_config *sc = *t->store ? br_config_store(cfg, t->store) : NULL;
  if (sc && !strcmp(sc->kind, "s3")) {
    o->s3 = br_iceberg_s3_new(sc, err);
    if (!o->s3) return -1;
    o->tc.open = br_iceberg_open_s3;
    o->tc.open_ud = o->s3;
  }
  o->s3_table = o->s3 && !strncmp(t->location, "s3", 2) && strstr(t->location, "://");
  o->delta =
      t->format == BR_TABLE_DELTA ||
      (t->format == BR_TABLE_AUTO && (br_delta_is_local_table(t->location) ||
                                      (o->s3_table && br_delta_s3_is_table(o->s3, t->location))));
  return 0;
}

/* Marks one table's references; fills its report entry. Returns 0 or -1 (err). */
static int mark_table(struct mark *m, const br_table_config *t, json_t *tables, br_err *err) {
  struct table_open o;
  if (table_open(m->r->env.cfg, t, &o, err) < 0) return -1;
  br_iceberg_table_config tc = o.tc;
  br_iceberg_s3 *s3 = o.s3;
  int s3_table = o.s3_table, delta = o.delta;
  m->tcfg = &tc;
  m->files = m->read = m->cached = 0;
  memset(&m->fstats, 0, sizeof m->fstats);
  br_iceberg_stats ws;
  /* Delta: the data files are read under the column's physical name (column mapping) */
  char physical[BR_DELTA_MAX_COLUMN];
  br_iceberg_table_config delta_read = tc;
  delta_read.column = physical;
  if (delta) m->tcfg = &delta_read;
  int rc = delta ? br_delta_walk_data_files_mapped(&tc, s3_table ? br_delta_list_s3 : NULL, s3,
                                                   on_data_file, m, physical, &ws, &m->err)
                 : br_iceberg_walk_data_files(&tc, on_data_file, m, &ws, &m->err);
  br_iceberg_s3_free(s3);
  json_array_append_new(
      tables, json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "name", t->name, "snapshots",
                        (json_int_t)ws.snapshots, "manifests", (json_int_t)ws.manifests,
                        "data_files", (json_int_t)m->files, "data_files_read", (json_int_t)m->read,
                        "data_files_cached", (json_int_t)m->cached, "values",
                        (json_int_t)m->fstats.values, "invalid", (json_int_t)m->fstats.invalid));
  if (rc != 0) {
    if (err != &m->err) *err = m->err;
    return -1;
  }
  return 0;
}

/* A test hook, inert unless the variable var names a FIFO: every run opens it for reading at that
 * point (BLOBREF_TEST_RECONCILE_PAUSE: between mark and sweep; BLOBREF_TEST_RECONCILE_PAUSE_APPLY:
 * between sweep and apply; the open returns once a test opens it for writing: the run is there)
 * and waits for its end of file (the test closes it: the run goes on). */
static void test_pause(const char *var, const char *where) {
  const char *fifo = getenv(var);
  if (!fifo || !*fifo) return;
  int fd = open(fifo, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    br_warn("reconcile: test pause %s: %s", fifo, strerror(errno));
    return;
  }
  br_info("reconcile: paused %s (test hook %s)", where, fifo);
  char buf[64];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    break;
  }
  close(fd);
}

/* ---- sweep ----------------------------------------------------------------------------------- */

enum decision { DO_QUARANTINE, DO_RESTORE, DO_DELETE };
struct candidate {
  uint8_t digest[D];
  uint8_t kind;
  uint64_t state_ms, size;
};

struct sweep {
  br_reconciler *r;
  dsort *sorter;
  uint8_t next[D];
  int have_next, sorter_done;
  uint64_t now, grace_cutoff, retention_cutoff, retention_ms;
  uint64_t next_deadline; /* the earliest time a record seen undecided can become decided */
  uint64_t live, marked, missing, n[3], bytes_delete;
  uint64_t marked_deleting; /* referenced records found deleting (their delete goes on) */
  uint64_t held_referenced, pending, protect;
  json_t *held_list;
  uint64_t swept, files, read, cached; /* records seen; the mark's data files (progress) */
  rstate_lists *lists; /* the run's blob lists (held and pending are listed here); NULL:
                        * [reconcile] lists = false */
  FILE *out;
  br_err err;
  int failed;
};

/* Moves the reference stream to the first digest >= d. */
static int refs_seek(struct sweep *s, const uint8_t d[D]) {
  while (!s->sorter_done) {
    if (!s->have_next) {
      int rc = dsort_next(s->sorter, s->next, &s->err);
      if (rc < 0) return -1;
      if (rc == 0) {
        s->sorter_done = 1;
        break;
      }
      s->have_next = 1;
    }
    int c = memcmp(s->next, d, D);
    if (c >= 0) break;
    s->missing++; /* referenced, but not in the index */
    s->have_next = 0;
  }
  return 0;
}

static int on_record(void *ud, const uint8_t digest[D], const br_record *rec) {
  struct sweep *s = ud;
  if ((++s->swept & 4095) == 0)
    rprogress_update(s->r->progress, "sweep", s->files, s->read, s->cached, s->swept);
  if (refs_seek(s, digest) < 0) return s->failed = 1;
  int marked = s->have_next && memcmp(s->next, digest, D) == 0;
  if (marked) s->have_next = 0;
  if (rec->state == BR_STATE_LIVE) s->live++;
  if (marked) s->marked++;
  int kind = -1;
  if (rec->state == BR_STATE_DELETING) {
    kind = DO_DELETE; /* decided before: finished, referenced or not (its bytes may be gone) */
    if (marked) s->marked_deleting++;
  } else if (rec->state == BR_STATE_LIVE) {
    /* unreferenced: quarantined once past grace (and the touch slack) and every lease */
    /* leases as they were at the run's start, when the tables were marked: a lease ending
     * mid-run still held the blob when its table commit could have been missed */
    uint64_t leased = marked ? 0 : br_leased_until(s->r->leases, digest, s->now, NULL);
    uint64_t eligible = rec->last_upload_ms + s->protect;
    if (!marked && rec->last_upload_ms < s->grace_cutoff && !leased) {
      kind = DO_QUARANTINE;
    } else if (!marked) {
      if (eligible < s->next_deadline) s->next_deadline = eligible; /* leases aside: see README */
      s->pending++;
      if (s->lists && rstate_lists_add(s->lists, RL_PENDING, digest,
                                       leased > eligible ? leased : eligible, &s->err) < 0)
        return s->failed = 1;
    }
  } else if (marked) {
    if (rec->state == BR_STATE_QUARANTINED) {
      kind = DO_RESTORE;
    } else {
      s->held_referenced++;
      if (s->lists && rstate_lists_add(s->lists, RL_HELD, digest, 0, &s->err) < 0)
        return s->failed = 1;
      if (json_array_size(s->held_list) < MAX_HELD_LISTED) {
        char hex[BR_HEX_LEN + 1];
        br_hex_encode(digest, hex);
        json_array_append_new(s->held_list, json_string(hex));
      }
    }
  } else if (rec->state_ms < s->retention_cutoff) {
    kind = DO_DELETE;
  } else if (rec->state_ms + s->retention_ms < s->next_deadline) {
    s->next_deadline = rec->state_ms + s->retention_ms;
  }
  if (kind < 0) return 0;
  struct candidate c = {.kind = (uint8_t)kind, .state_ms = rec->state_ms, .size = rec->size};
  memcpy(c.digest, digest, D);
  if (fwrite(&c, sizeof c, 1, s->out) != 1) {
    br_fail(&s->err, "reconcile: writing the decisions: %s", strerror(errno));
    return s->failed = 1;
  }
  s->n[kind]++;
  if (kind == DO_DELETE) s->bytes_delete += rec->size;
  return 0;
}

static br_store *store_named(br_reconciler *r, const char *name) {
  for (int i = 0; i < r->env.nstores; i++)
    if (!strcmp(br_store_name(r->env.stores[i]), name)) return r->env.stores[i];
  return NULL;
}

static void add_error(json_t *errors, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_error(json_t *errors, const char *fmt, ...) {
  if (json_array_size(errors) >= MAX_ERRORS) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_array_append_new(errors, json_string(msg));
}

/* In-place objects (imported under a key of their own) at most this large are hashed again before
 * they are deleted; larger ones are checked by size only. */
#define INPLACE_HASH_MAX ((uint64_t)16 << 20)

/* Are the bytes at l still the blob's? Under its default (content-addressed) key they are (uploads
 * and moves verify them). An in-place key may have been rewritten since it was imported: its size
 * must still be the record's and, up to INPLACE_HASH_MAX, its SHA-256 the digest. Returns 1 yes,
 * 0 changed, 2 absent, -1 + err (the store could not tell). */
static int still_the_blob(br_store *st, const uint8_t digest[D], const br_record *rec,
                          const br_location *l, br_err *err) {
  char def[BR_MAX_KEY + 81];
  if (br_store_default_key(st, digest, def, sizeof def) && !strcmp(def, l->key)) return 1;
  uint64_t size = 0;
  int rc = br_store_stat(st, l->key, &size, err);
  if (rc < 0) return -1;
  if (rc > 0) return 2;
  if (size != rec->size) return 0;
  if (size > INPLACE_HASH_MAX) return 1;
  br_store_reader rd;
  rc = br_store_open_read(st, l->key, &rd, err);
  if (rc < 0) return -1;
  if (rc > 0) return 2;
  if (rd.size != rec->size) {
    br_store_reader_close(&rd);
    return 0;
  }
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  enum { CHUNK = 1 << 20 };
  char *buf = malloc(CHUNK);
  rc = ctx && buf && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ? 0 : br_fail(err, "out of memory");
  for (uint64_t off = 0; rc == 0 && off < rd.size;) {
    size_t n = rd.size - off < CHUNK ? (size_t)(rd.size - off) : CHUNK;
    rc = rd.source->pread(rd.source, buf, n, off, err);
    if (rc == 0) EVP_DigestUpdate(ctx, buf, n);
    off += n;
  }
  uint8_t got[D];
  if (rc == 0) EVP_DigestFinal_ex(ctx, got, NULL);
  free(buf);
  EVP_MD_CTX_free(ctx);
  br_store_reader_close(&rd);
  if (rc < 0) return -1;
  return memcmp(got, digest, D) == 0;
}

/* Should the bytes of one location of a blob being deleted go? Only when they are its own: never
 * a key another record owns (invariant 10: only the location goes, with the record), never an
 * in-place object that was rewritten since it was imported (logged, left alone). Returns 1 (delete
 * l->key in *st), 0 (nothing to delete there, on purpose), -1 on a store or index error (the record
 * is kept for a later try). */
static int location_to_delete(br_reconciler *r, const uint8_t digest[D], const br_record *rec,
                              const br_location *l, br_store **st, json_t *errors) {
  const br_reconcile_env *env = &r->env;
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(digest, hex);
  *st = store_named(r, l->store);
  if (!*st) return 0; /* a store no longer configured: nothing we can delete there */
  br_err err;
  uint8_t owner[D];
  int rc = br_index_key_owner(env->index, l->store, l->key, owner, &err);
  if (rc < 0) {
    add_error(errors, "index: %s", err.msg);
    return -1;
  }
  if (rc == 2 || (rc == 0 && memcmp(owner, digest, D))) {
    char ohex[BR_HEX_LEN + 1];
    br_hex_encode(owner, ohex);
    br_warn("reconcile: blob %s: %s:%s belongs to %s: its bytes are kept, only the location goes",
            hex, l->store, l->key, rc == 2 ? "several blobs" : ohex);
    return 0;
  }
  rc = still_the_blob(*st, digest, rec, l, &err);
  if (rc < 0) {
    add_error(errors, "check %s at %s:%s: %s", hex, l->store, l->key, err.msg);
    return -1;
  }
  if (rc == 2) return 0; /* gone already (a delete cut short) */
  if (rc == 0) {
    br_warn(
        "reconcile: blob %s: %s:%s no longer holds its bytes (rewritten since it was "
        "imported): the file is kept, only the record goes",
        hex, l->store, l->key);
    return 0;
  }
  return 1;
}

/* Blobs deleted together: the marks in one index transaction, the bytes in one DeleteObjects per
 * store (S3's limit), the records (and their CDN purges) in one more transaction. */
#define DELETE_BATCH 1000

/* One key to delete, of candidate `who`. */
struct doomed {
  br_store *st;
  const char *key;
  size_t who;
};

/* Deletes the bytes of every doomed key, store by store, in batches; a key that fails makes its
 * blob's out -1 (it stays deleting: finished later). */
static void delete_keys(struct doomed *dk, size_t nk, const struct candidate *c, int *out,
                        json_t *errors) {
  const char **keys = malloc((nk ? nk : 1) * sizeof *keys);
  size_t *who = malloc((nk ? nk : 1) * sizeof *who);
  uint8_t *failed = malloc(nk ? nk : 1);
  if (!keys || !who || !failed) {
    add_error(errors, "out of memory");
    for (size_t i = 0; i < nk; i++) out[dk[i].who] = -1;
    nk = 0;
  }
  for (size_t i = 0; i < nk; i++) {
    if (!dk[i].st) continue; /* done with an earlier store */
    br_store *st = dk[i].st;
    size_t n = 0;
    for (size_t j = i; j < nk; j++)
      if (dk[j].st == st) {
        keys[n] = dk[j].key;
        who[n++] = dk[j].who;
        dk[j].st = NULL;
      }
    br_err err;
    if (n == 1) /* a plain DELETE: the lighter request */
      failed[0] = br_store_delete(st, keys[0], &err) < 0;
    else if (br_store_delete_many(st, keys, n, failed, &err) == 0)
      continue;
    for (size_t j = 0; j < n; j++) {
      if (!failed[j]) continue;
      char hex[BR_HEX_LEN + 1];
      br_hex_encode(c[who[j]].digest, hex);
      add_error(errors, "delete %s from %s: %s", hex, br_store_name(st), err.msg);
      out[who[j]] = -1;
    }
  }
  free(keys);
  free(who);
  free(failed);
}

/* Takes the locks of c[0..n) (digests: their hashes): one blob's, or all at once. 0, or -1 when
 * they cannot be had (nothing held). */
static int lock_all(const br_reconcile_env *env, const struct candidate *c, uint8_t (*digests)[D],
                    size_t n) {
  if (n == 1) return env->lock_blob(env->ud, c->digest, 1) < 0 ? -1 : 0;
  return !env->lock_blobs || env->lock_blobs(env->ud, (const uint8_t(*)[D])digests, n, 1) ? -1 : 0;
}

static void unlock_all(const br_reconcile_env *env, const struct candidate *c,
                       uint8_t (*digests)[D], size_t n) {
  if (n == 1)
    env->lock_blob(env->ud, c->digest, 0);
  else
    env->lock_blobs(env->ud, (const uint8_t(*)[D])digests, n, 0);
}

/* Deletes the blobs c[0..n) for good, in steps that survive a crash: each record is marked
 * deleting first (from then on it is never restored nor served), then the bytes of every
 * location go (location_to_delete, delete_keys), then the record. A crash, a failed delete or a
 * failed index write in between leaves it deleting, and br_reconcile_finish_deletes takes it from
 * there. c->state_ms is the state time the decision saw (the deleting mark's time for a delete
 * being finished); a record changed since is left alone. The locks are held for the index
 * decisions only when env->delete_begin is set: the marks (each delete registered under them),
 * then, released, the store deletes (a batched DeleteObjects may take seconds), then, taken
 * again, the removals, each only if the record is still marked as it was (an upload that came in
 * meanwhile replaced it and wrote its bytes under a key of its own). Without delete_begin the
 * locks are held throughout, so that an upload of the same hash either finished before (and the
 * record is live again: nothing deleted) or starts after (and writes anew). When the locks
 * cannot be taken together (a shared index locks each blob in the database), the blobs go one by
 * one.
 * out[i]: 1 deleted, 0 skipped, -1 on an error (record kept). Returns how many were deleted. */
static size_t delete_blobs(br_reconciler *r, const struct candidate *c, size_t n, int *out,
                           json_t *errors) {
  const br_reconcile_env *env = &r->env;
  if (!n) return 0;
  uint8_t(*digests)[D] = malloc(n * sizeof *digests);
  br_record *recs = malloc(n * sizeof *recs);
  br_change *chs = malloc(n * sizeof *chs);
  size_t *at = malloc(n * sizeof *at);
  struct doomed *dk = malloc(n * BR_MAX_LOCATIONS * sizeof *dk);
  uint8_t *registered = calloc(n, 1); /* delete_begin said 0: delete_end is owed */
  int locked = 0;
  size_t done = 0;
  if (!digests || !recs || !chs || !at || !dk || !registered) {
    add_error(errors, "out of memory");
    for (size_t i = 0; i < n; i++) out[i] = -1;
    goto out;
  }
  for (size_t i = 0; i < n; i++) memcpy(digests[i], c[i].digest, D);
  if (env->lock_blob && n == 1) {
    if (lock_all(env, c, digests, n) < 0) {
      add_error(errors, "index: the blob's lock cannot be had (the database is unavailable)");
      out[0] = -1;
      goto out;
    }
  } else if (env->lock_blob && lock_all(env, c, digests, n) < 0) {
    for (size_t i = 0; i < n; i++) done += delete_blobs(r, &c[i], 1, &out[i], errors);
    goto out;
  }
  locked = env->lock_blob != NULL;
  /* the marks */
  br_err err;
  size_t nm = 0;
  uint64_t now = br_now_ms();
  for (size_t i = 0; i < n; i++) {
    out[i] = 0;
    int rc = br_index_get_latest(env->index, c[i].digest, &recs[i], &err); /* deletes go on it */
    if (rc < 0) {
      add_error(errors, "index: %s", err.msg);
      out[i] = -1;
      continue;
    }
    int mark = rc == 0 && recs[i].state_ms == c[i].state_ms &&
               (recs[i].state == BR_STATE_QUARANTINED || recs[i].state == BR_STATE_HELD);
    int finish = rc == 0 && recs[i].state == BR_STATE_DELETING && recs[i].state_ms == c[i].state_ms;
    if (!mark && !finish) continue;
    if (env->delete_begin) {
      int b = env->delete_begin(env->ud, c[i].digest);
      if (b != 0) { /* an upload of it is committing (or no memory): not this time */
        if (b < 0) add_error(errors, "out of memory");
        out[i] = b < 0 ? -1 : 0;
        continue;
      }
      registered[i] = 1;
    }
    if (finish) {
      out[i] = 1;
      continue;
    }
    if (now <= recs[i].state_ms) now = recs[i].state_ms + 1; /* the mark's time tells it apart */
    br_change *ch = &chs[nm];
    memset(ch, 0, sizeof *ch);
    ch->kind = BR_CHANGE_MARK_DELETE;
    ch->by_reconcile = 1;
    ch->cutoff_ms = UINT64_MAX;
    ch->expect_state_ms = c[i].state_ms;
    ch->reason = "being deleted for good";
    memcpy(ch->digest, c[i].digest, D);
    at[nm++] = i;
  }
  if (nm && br_index_apply_changes(env->index, chs, nm, now, &err) < 0) {
    add_error(errors, "index: %s", err.msg);
    for (size_t j = 0; j < nm; j++) out[at[j]] = -1;
  } else {
    for (size_t j = 0; j < nm; j++)
      if (chs[j].applied) {
        recs[at[j]].state = BR_STATE_DELETING;
        recs[at[j]].state_ms = now;
        out[at[j]] = 1;
      }
  }
  /* the bytes */
  size_t nk = 0;
  for (size_t i = 0; i < n; i++) {
    size_t first = nk;
    for (int l = 0; l < recs[i].nlocations && out[i] == 1; l++) {
      br_store *st;
      int rc = location_to_delete(r, c[i].digest, &recs[i], &recs[i].locations[l], &st, errors);
      if (rc < 0) out[i] = -1;
      if (rc == 1) dk[nk++] = (struct doomed){st, recs[i].locations[l].key, i};
    }
    if (out[i] != 1) nk = first; /* none of its bytes go before all can be checked */
  }
  if (env->delete_begin && locked) { /* the store calls without the locks (see above) */
    unlock_all(env, c, digests, n);
    locked = 0;
  }
  delete_keys(dk, nk, c, out, errors);
  if (env->delete_begin) {
    for (size_t i = 0; i < n; i++)
      if (registered[i]) env->delete_end(env->ud, c[i].digest);
    if (!env->lock_blob) {
      /* nothing to take again */
    } else if (lock_all(env, c, digests, n) == 0) {
      locked = 1;
    } else {
      add_error(errors, "index: the blobs' locks cannot be had (they stay marked deleting)");
      for (size_t i = 0; i < n; i++)
        if (out[i] == 1) out[i] = -1;
    }
  }
  /* the records, and their CDN purges */
  size_t nr = 0;
  for (size_t i = 0; i < n; i++) {
    if (out[i] != 1) continue;
    br_change *ch = &chs[nr];
    memset(ch, 0, sizeof *ch);
    ch->kind = BR_CHANGE_REMOVE;
    ch->by_reconcile = 1;
    ch->cutoff_ms = UINT64_MAX;
    ch->expect_state_ms = recs[i].state_ms;
    memcpy(ch->digest, c[i].digest, D);
    at[nr++] = i;
  }
  if (nr && br_index_apply_changes(env->index, chs, nr, br_now_ms(), &err) < 0) {
    add_error(errors, "index: %s (the blobs stay marked deleting: finished later)", err.msg);
    for (size_t j = 0; j < nr; j++) out[at[j]] = -1;
  } else {
    for (size_t j = 0; j < nr; j++) out[at[j]] = chs[j].applied ? 1 : 0;
  }
  if (locked) unlock_all(env, c, digests, n);
  for (size_t i = 0; i < n; i++)
    if (out[i] == 1) {
      done++;
      if (env->on_gone) env->on_gone(env->ud, c[i].digest);
    }
out:
  free(digests);
  free(recs);
  free(chs);
  free(at);
  free(dk);
  free(registered);
  return done;
}

struct deleting {
  struct candidate *c;
  size_t n, cap;
  size_t want; /* the counters' number of deleting blobs: the walk stops there (0: no limit) */
  int oom;
};

static int collect_deleting(void *ud, const uint8_t digest[D], const br_record *rec) {
  struct deleting *dl = ud;
  if (rec->state != BR_STATE_DELETING) return 0;
  if (dl->n == dl->cap) {
    size_t cap = dl->cap ? dl->cap * 2 : 64;
    struct candidate *grown = realloc(dl->c, cap * sizeof *grown);
    if (!grown) return dl->oom = 1;
    dl->c = grown;
    dl->cap = cap;
  }
  struct candidate *c = &dl->c[dl->n++];
  memset(c, 0, sizeof *c);
  memcpy(c->digest, digest, D);
  c->kind = DO_DELETE;
  c->state_ms = rec->state_ms;
  c->size = rec->size;
  return dl->want && dl->n == dl->want; /* every one the counters know of is found: stop */
}

/* Finishes every delete marked in the index (see delete_blobs). The exact counters decide whether
 * the index is walked at all (0 deleting: not), and the walk stops once it found as many as they
 * count. Returns how many, or -1 + err (errors also lists each blob's failure). */
/* How many blobs the index's exact counters say are deleting: >= 0, or -1 when it keeps no exact
 * counters (or they cannot be read), and only a walk can tell. */
static int64_t deleting_counted(br_index *idx) {
  br_counts *counts = malloc(sizeof *counts);
  br_err err;
  int64_t n = -1;
  if (counts && br_index_counts(idx, counts, &err) == 0 && !counts->overflow) {
    const br_count *c = br_counts_find(counts, "", BR_STATE_DELETING);
    n = c && c->blobs > 0 ? c->blobs : 0;
  }
  free(counts);
  return n;
}

static int64_t finish_deletes(br_reconciler *r, json_t *errors, br_err *err) {
  struct deleting dl = {0};
  int64_t counted = deleting_counted(r->env.index);
  if (counted == 0) return 0; /* the usual case: no walk of the whole index */
  if (counted > 0) dl.want = (size_t)counted;
  atomic_fetch_add_explicit(&r->deleting_walks, 1, memory_order_relaxed);
  if (br_index_foreach(r->env.index, collect_deleting, &dl, err) < 0 || dl.oom) {
    if (dl.oom) br_fail(err, "out of memory");
    free(dl.c);
    return -1;
  }
  int64_t done = 0;
  int *out = malloc(DELETE_BATCH * sizeof *out);
  if (!out) {
    free(dl.c);
    return br_fail(err, "out of memory");
  }
  for (size_t i = 0; i < dl.n; i += DELETE_BATCH)
    done += (int64_t)delete_blobs(r, &dl.c[i], dl.n - i < DELETE_BATCH ? dl.n - i : DELETE_BATCH,
                                  out, errors);
  free(out);
  free(dl.c);
  return done;
}

uint64_t br_reconciler_deleting_walks(br_reconciler *r) {
  return atomic_load_explicit(&r->deleting_walks, memory_order_relaxed);
}

int64_t br_reconcile_finish_deletes(br_reconciler *r, br_err *err) {
  json_t *errors = json_array();
  int64_t done = finish_deletes(r, errors, err);
  if (done >= 0 && json_array_size(errors)) {
    br_fail(err, "%s", json_string_value(json_array_get(errors, 0)));
    done = -1;
  }
  json_decref(errors);
  return done;
}

/* Applies the decisions of one kind from the file, in batches. Returns the number applied. */
static const int list_of_kind[] = {
    [DO_QUARANTINE] = RL_QUARANTINED, [DO_RESTORE] = RL_RESTORED, [DO_DELETE] = RL_DELETED};

/* Lists one applied (or, in a dry run, decided) blob; a failure is the report's, once. lists
 * NULL (lists = false): nothing. */
static void list_blob(rstate_lists *lists, enum decision kind, const uint8_t d[D], json_t *errors,
                      int *list_failed) {
  br_err err;
  if (!lists || *list_failed || rstate_lists_add(lists, list_of_kind[kind], d, 0, &err) == 0)
    return;
  *list_failed = 1;
  add_error(errors, "lists: %s", err.msg);
}

/* A dry run's lists: the decisions of one kind from the file, as they would be applied. */
static void list_decided(FILE *f, enum decision kind, rstate_lists *lists, json_t *errors,
                         int *list_failed) {
  rewind(f);
  struct candidate c;
  while (fread(&c, sizeof c, 1, f) == 1)
    if (c.kind == kind) list_blob(lists, kind, c.digest, errors, list_failed);
}

/* Commits a batch of n changes; a quarantine batch is first cleared of the blobs a lease holds
 * now, with attaches blocked until it committed: an upload, dedup hit or lookup with ?lease=
 * attaches the blob before it reads the record, so either this check sees the lease (the blob
 * stays live) or the attach and that read come after the commit (a lookup reports the blob
 * missing, an upload makes it live again). A blob found under a live lease is never quarantined,
 * not even for a moment. Returns how many changes remain in batch (all of them applied or not). */
static size_t commit_batch(br_reconciler *r, br_change *batch, size_t n, enum decision kind,
                           uint64_t now, json_t *errors) {
  if (kind == DO_QUARANTINE) br_leases_block(r->leases);
  size_t kept = 0;
  for (size_t i = 0; i < n; i++)
    if (kind != DO_QUARANTINE || !br_leased_until(r->leases, batch[i].digest, br_now_ms(), NULL))
      batch[kept++] = batch[i];
  br_err err;
  if (kept && br_index_apply_changes(r->env.index, batch, kept, now, &err) < 0)
    add_error(errors, "index: %s", err.msg);
  if (kind == DO_QUARANTINE) br_leases_unblock(r->leases);
  return kept;
}

/* Applies the decisions of one kind from the file, in batches, listing each one applied. Returns
 * the number applied. */
static uint64_t apply_kind(br_reconciler *r, FILE *f, enum decision kind, uint64_t now,
                           uint64_t grace_cutoff, uint64_t *bytes, json_t *errors,
                           rstate_lists *lists, int *list_failed) {
  const br_reconcile_env *env = &r->env;
  br_change *batch = kind == DO_DELETE ? NULL : calloc(APPLY_BATCH, sizeof *batch);
  struct candidate *dels = kind == DO_DELETE ? malloc(DELETE_BATCH * sizeof *dels) : NULL;
  int *out = kind == DO_DELETE ? malloc(DELETE_BATCH * sizeof *out) : NULL;
  size_t nd = 0;
  if (kind == DO_DELETE ? !dels || !out : !batch) {
    add_error(errors, "out of memory");
    free(dels);
    free(out);
    return 0;
  }
  uint64_t applied = 0;
  rewind(f);
  struct candidate c;
  size_t n = 0;
  int more = 1;
  while (more) {
    more = fread(&c, sizeof c, 1, f) == 1;
    if (more && c.kind != kind) continue;
    if (kind == DO_DELETE) {
      if (more) dels[nd++] = c;
      if (nd == DELETE_BATCH || (!more && nd)) {
        applied += delete_blobs(r, dels, nd, out, errors);
        for (size_t i = 0; i < nd; i++)
          if (out[i] == 1) {
            *bytes += dels[i].size;
            list_blob(lists, kind, dels[i].digest, errors, list_failed);
          }
        nd = 0;
      }
      continue;
    }
    if (more) {
      br_change *ch = &batch[n++];
      memset(ch, 0, sizeof *ch);
      memcpy(ch->digest, c.digest, D);
      ch->kind = kind == DO_QUARANTINE ? BR_CHANGE_QUARANTINE : BR_CHANGE_RESTORE;
      ch->by_reconcile = 1;
      ch->cutoff_ms = grace_cutoff;
      ch->reason = "unreferenced";
    }
    if (n == APPLY_BATCH || (!more && n)) {
      n = commit_batch(r, batch, n, kind, now, errors); /* a lease attached since the sweep wins */
      for (size_t i = 0; i < n; i++)
        if (batch[i].applied) {
          applied++;
          list_blob(lists, kind, batch[i].digest, errors, list_failed);
          if (kind == DO_QUARANTINE && env->on_gone) env->on_gone(env->ud, batch[i].digest);
        }
      n = 0;
    }
  }
  free(batch);
  free(dels);
  free(out);
  return applied;
}

static int cmp_id(const void *a, const void *b) { return memcmp(a, b, D); }

/* ---- the unchanged rerun ------------------------------------------------------------------------
 * A run whose sweep decided nothing records a basis in its report (rerun_basis): the inputs
 * digest, the index's change number read before its sweep, the earliest time an undecided record
 * can become decided, and its counts. So does a run whose decisions were all applied while no
 * other write reached the index (br_index_only_reconcile_since): its basis holds the change number
 * after its changes, the counts as they make them, and ends by the time what it quarantined
 * reaches its retention. The next run skips its sweep only when its mark came wholly from the
 * cache with the same inputs digest, the index's change number is the same, and it started before
 * that time: then every record, reference and cutoff the sweep would compare is the one the last
 * sweep left, so its decisions (none) and counts are the basis's. Anything else: a full sweep.
 * The README's "Unchanged reruns" section has the argument. */

/* The inputs digest: SHA-256 over the mark's data-file ids (sorted in place, duplicates once) and
 * the settings the decisions depend on. */
static void inputs_digest(const br_config *cfg, uint8_t *kept, size_t n, char hex[BR_HEX_LEN + 1]) {
  if (n) qsort(kept, n, D, cmp_id);
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  EVP_DigestInit_ex(c, EVP_sha256(), NULL);
  char set[256];
  int len =
      snprintf(set, sizeof set,
               "v1 grace %" PRIu64 " touch %" PRIu64 " retention %" PRIu64 " lists %d tables %d",
               (uint64_t)cfg->grace_ms, (uint64_t)cfg->dedup_touch_interval_ms,
               (uint64_t)cfg->retention_ms, cfg->reconcile_lists, cfg->ntables);
  EVP_DigestUpdate(c, set, (size_t)len);
  for (size_t i = 0; i < n; i++)
    if (i == 0 || memcmp(kept + i * D, kept + (i - 1) * D, D)) EVP_DigestUpdate(c, kept + i * D, D);
  uint8_t d[D];
  EVP_DigestFinal_ex(c, d, NULL);
  EVP_MD_CTX_free(c);
  br_hex_encode(d, hex);
}

static uint64_t json_u64(json_t *o, const char *k) {
  json_int_t v = json_integer_value(json_object_get(o, k));
  return v > 0 ? (uint64_t)v : 0;
}

static int newest_report(void *ud, uint64_t id, const char *json) {
  (void)id;
  json_t **out = ud;
  *out = json_loads(json, 0, NULL);
  return 1;
}

/* The newest report when it holds a basis this run may skip its sweep on (the mark's inputs
 * digest, the index's change number now, started), else NULL. */
static json_t *skip_basis(br_reconciler *r, const char *inputs, uint64_t seq, uint64_t started) {
  json_t *last = NULL;
  br_err err = {{0}};
  rstate_each_report(r->state, 1, newest_report, &last, &err);
  json_t *b = last ? json_object_get(last, "rerun_basis") : NULL;
  const char *in = json_string_value(json_object_get(b, "inputs"));
  json_t *seqv = json_object_get(b, "index_seq"), *until = json_object_get(b, "until_ms");
  json_t *blobs = json_object_get(last, "blobs");
  if (!in || strcmp(in, inputs) || !json_is_integer(seqv) || !json_is_integer(until) ||
      /* a basis from before the counts after a run's changes were kept: sweep once */
      !json_is_integer(json_object_get(b, "live")) ||
      !json_is_integer(json_object_get(b, "marked")) ||
      !json_is_integer(json_object_get(b, "references_missing")) ||
      (uint64_t)json_integer_value(seqv) != seq || started < json_u64(b, "started_ms") ||
      /* a clock stepped back: leases may decide */ started >=
          (uint64_t)json_integer_value(until) ||
      !json_is_object(blobs) ||
      strcmp(json_string_value(json_object_get(last, "state")) ?: "", "done") ||
      json_array_size(json_object_get(last, "errors"))) {
    json_decref(last);
    return NULL;
  }
  return last;
}

struct copy_list {
  rstate_lists *to;
  int action;
  uint8_t last[D];
  size_t n;
  br_err *err;
};

static int copy_entry(void *ud, const uint8_t d[D], uint64_t t_ms) {
  struct copy_list *c = ud;
  memcpy(c->last, d, D);
  c->n++;
  return rstate_lists_add(c->to, c->action, d, t_ms, c->err) < 0;
}

/* The run last's held and pending lists, copied into to. 0 or -1 + err. */
static int copy_lists(br_reconciler *r, uint64_t last, rstate_lists *to, br_err *err) {
  int actions[] = {RL_HELD, RL_PENDING};
  for (size_t a = 0; a < 2; a++) {
    struct copy_list c = {.to = to, .action = actions[a], .err = err};
    int more = 1, first = 1;
    while (more) {
      c.n = 0;
      if (rstate_list_page(r->state, last, actions[a], first ? NULL : c.last, 4096, copy_entry, &c,
                           &more, err) < 0)
        return -1;
      first = 0;
      if (c.n == 0) break;
    }
  }
  return 0;
}

int br_reconcile_run(br_reconciler *r, uint64_t id, const br_reconcile_options *opt,
                     json_t **report_out) {
  const br_config *cfg = r->env.cfg;
  uint64_t started = br_now_ms();
  char ts[64];
  br_format_time_ms(started, ts, sizeof ts);
  json_t *rep = json_object();
  json_t *tables = json_array(), *errors = json_array(), *held = json_array();
  json_object_set_new(rep, "id", json_integer((json_int_t)id));
  json_object_set_new(rep, "dry_run", json_boolean(opt->dry_run));
  json_object_set_new(rep, "force", json_boolean(opt->force));
  json_object_set_new(rep, "full", json_boolean(opt->full));
  json_object_set_new(rep, "started_at", json_string(ts));
  br_err err = {{0}};
  int failed = 0;
  rprogress_start(r->progress, id, opt->dry_run, opt->force, opt->full, ts, "mark");

  if (!opt->dry_run && br_leases_prune(r->leases, started, &err) < 0)
    add_error(errors, "%s", err.msg); /* expired leases hold nothing anyway */

  /* mark */
  struct mark m = {.r = r, .opt = opt};
  m.sorter = dsort_new(r->state_dir, r->env.mem_digests ? r->env.mem_digests : (1u << 20), &err);
  if (!m.sorter) {
    add_error(errors, "%s", err.msg);
    failed = 1;
  }
  if (!failed && cfg->ntables == 0) {
    add_error(errors,
              "no [table] is configured: with nothing to mark, every blob would look "
              "unreferenced, so reconcile does nothing");
    failed = 1;
  }
  for (int i = 0; i < cfg->ntables && !failed; i++) {
    br_err terr = {{0}};
    if (mark_table(&m, &cfg->tables[i], tables, &terr) < 0) {
      add_error(errors, "table %s: %s", cfg->tables[i].name, terr.msg);
      failed = 1; /* fail closed; the other tables are still read, for the report */
      for (int j = i + 1; j < cfg->ntables; j++) {
        br_err e2 = {{0}};
        if (mark_table(&m, &cfg->tables[j], tables, &e2) < 0)
          add_error(errors, "table %s: %s", cfg->tables[j].name, e2.msg);
      }
    }
  }
  uint64_t mark_end = br_now_ms();
  rprogress_update(r->progress, "mark", m.all_files, m.all_read, m.all_cached, 0);
  rprogress_publish(r->progress); /* the mark's totals, whatever the last publication was */

  /* the unchanged rerun: the index's change mark before the sweep reads it, and the inputs */
  char inputs[BR_HEX_LEN + 1] = "";
  br_index_mark mark0 = {0};
  int seq_ok = !failed && br_index_change_mark(r->env.index, &mark0, &err) == 0;
  uint64_t seq = mark0.seq;
  if (seq_ok) inputs_digest(cfg, m.kept, m.nkept, inputs);
  test_pause("BLOBREF_TEST_RECONCILE_PAUSE", "between mark and sweep");
  json_t *basis =
      seq_ok && !opt->full && m.all_read == 0 ? skip_basis(r, inputs, seq, started) : NULL;

  /* sweep: the decisions, against the index in key order */
  struct sweep s = {.r = r,
                    .sorter = m.sorter,
                    .now = started,
                    .held_list = held,
                    .files = m.all_files,
                    .read = m.all_read,
                    .cached = m.all_cached};
  rprogress_update(r->progress, "sweep", s.files, s.read, s.cached, 0);
  int list_failed = 0;
  int want_lists = cfg->reconcile_lists;
  s.lists = failed || !want_lists ? NULL : rstate_lists_begin(r->state, id, &err);
  if (!failed && want_lists && !s.lists) {
    add_error(errors, "%s", err.msg);
    failed = 1;
  }
  /* A dedup hit refreshes last_upload_ms only once it is dedup_touch_interval old, so a blob
   * deduplicated within grace may carry a last_upload_ms up to that much older: protect it too
   * (invariant 6), or a grace shorter than the touch interval would not protect dedup hits. */
  uint64_t protect = cfg->grace_ms + cfg->dedup_touch_interval_ms;
  s.grace_cutoff = started > protect ? started - protect : 0;
  s.protect = protect;
  s.retention_cutoff = started > cfg->retention_ms ? started - cfg->retention_ms : 0;
  s.retention_ms = cfg->retention_ms;
  s.next_deadline = UINT64_MAX;
  uint64_t references = 0;
  char skipped[512] = "";
  if (!failed && basis) {
    /* the last run's sweep, unchanged: its counts and lists, no decisions */
    uint64_t last_id = json_u64(basis, "id");
    json_t *b = json_object_get(basis, "blobs"), *rb = json_object_get(basis, "rerun_basis");
    s.live = json_u64(rb, "live"); /* the counts after the last run's changes */
    s.marked = json_u64(rb, "marked");
    s.missing = json_u64(rb, "references_missing");
    s.held_referenced = json_u64(b, "held_referenced");
    s.pending = json_u64(b, "pending");
    references = json_u64(basis, "references");
    s.next_deadline = json_u64(rb, "until_ms");
    size_t i;
    json_t *h;
    json_array_foreach(json_object_get(basis, "held_referenced_blobs"), i, h)
        json_array_append(held, h);
    if (s.lists && copy_lists(r, last_id, s.lists, &err) < 0) {
      add_error(errors, "lists: %s", err.msg);
      failed = 1;
    }
    snprintf(skipped, sizeof skipped,
             "inputs unchanged since run %" PRIu64
             ": every data file from the cache, the same "
             "files and settings, no index write since (change %" PRIu64
             "), before the earliest grace or retention end (%" PRIu64 " ms)",
             last_id, seq, s.next_deadline);
    br_info("reconcile: run %" PRIu64 ": sweep skipped: %s", id, skipped);
  } else if (!failed) {
    char tmpl[4200];
    snprintf(tmpl, sizeof tmpl, "%s/decisions-XXXXXX", r->state_dir);
    int fd = mkstemp(tmpl);
    if (fd >= 0) unlink(tmpl);
    s.out = fd >= 0 ? fdopen(fd, "w+") : NULL;
    if (!s.out) {
      if (fd >= 0) close(fd);
      add_error(errors, "reconcile: decisions file: %s", strerror(errno));
      failed = 1;
    } else if (dsort_finish(m.sorter, &err) < 0) {
      add_error(errors, "%s", err.msg);
      failed = 1;
    } else if (br_index_foreach(r->env.index, on_record, &s, &err) < 0 || s.failed) {
      add_error(errors, "%s", s.failed ? s.err.msg : err.msg);
      failed = 1;
    } else {
      uint8_t rest[D]; /* references past the last indexed blob */
      if (s.have_next) s.missing++;
      int rc;
      while (!s.sorter_done && (rc = dsort_next(m.sorter, rest, &err)) == 1) s.missing++;
      references = s.marked + s.missing;
    }
  }
  uint64_t sweep_end = br_now_ms();
  rprogress_update(r->progress, "apply", s.files, s.read, s.cached, s.swept);
  test_pause("BLOBREF_TEST_RECONCILE_PAUSE_APPLY", "between sweep and apply");

  /* guards, then the changes */
  const char *refused = NULL;
  char refused_msg[256];
  uint64_t quarantined = 0, restored = 0, deleted = 0, reclaimed = 0;
  if (!failed) {
    uint64_t q = s.n[DO_QUARANTINE];
    if (!opt->force && q > 0 && (double)q > cfg->max_fraction * (double)s.live) {
      snprintf(refused_msg, sizeof refused_msg,
               "quarantining %" PRIu64 " of %" PRIu64
               " live blobs is over max_fraction %.2f: "
               "nothing quarantined (force to proceed)",
               q, s.live, cfg->max_fraction);
      refused = refused_msg;
    }
    if (basis) {
      /* nothing decided: nothing to apply or list */
    } else if (opt->dry_run) {
      quarantined = refused ? 0 : q;
      restored = s.n[DO_RESTORE];
      deleted = s.n[DO_DELETE];
      reclaimed = s.bytes_delete;
      if (s.lists) {
        list_decided(s.out, DO_RESTORE, s.lists, errors, &list_failed);
        if (!refused) list_decided(s.out, DO_QUARANTINE, s.lists, errors, &list_failed);
        list_decided(s.out, DO_DELETE, s.lists, errors, &list_failed);
      }
    } else {
      restored = apply_kind(r, s.out, DO_RESTORE, started, s.grace_cutoff, &reclaimed, errors,
                            s.lists, &list_failed);
      if (!refused)
        quarantined = apply_kind(r, s.out, DO_QUARANTINE, started, s.grace_cutoff, &reclaimed,
                                 errors, s.lists, &list_failed);
      reclaimed = 0;
      deleted = apply_kind(r, s.out, DO_DELETE, started, s.grace_cutoff, &reclaimed, errors,
                           s.lists, &list_failed);
    }
    /* the cache keeps only files of retained snapshots */
    if (!opt->dry_run && m.nkept) {
      qsort(m.kept, m.nkept, D, cmp_id);
      if (rstate_prune(r->state, m.kept, m.nkept, &err) < 0) add_error(errors, "%s", err.msg);
    }
  }
  if (s.out) fclose(s.out);
  uint64_t listed[RL_NACTIONS] = {0}, list_bytes = 0;
  if (s.lists && !list_failed && rstate_lists_flush(s.lists, listed, &list_bytes, &err) < 0)
    add_error(errors, "lists: %s", err.msg);
  rstate_lists_free(s.lists);
  /* deletes decided before and cut short (a crash, a full index) are decided already, whatever
   * the tables say now: the sweep finishes them (deleting records are always DO_DELETE); a run
   * that failed before its changes finishes them here */
  int64_t finished = 0;
  if (failed && !opt->dry_run) {
    finished = finish_deletes(r, errors, &err);
    if (finished < 0) {
      add_error(errors, "finishing deletes: %s", err.msg);
      finished = 0;
    }
  }
  uint64_t end = br_now_ms();
  br_format_time_ms(end, ts, sizeof ts);
  json_object_set_new(rep, "state", json_string(failed ? "failed" : "done"));
  json_object_set_new(rep, "finished_at", json_string(ts));
  json_object_set_new(rep, "tables", tables);
  json_object_set_new(rep, "references", json_integer((json_int_t)references));
  json_object_set_new(rep, "references_missing", json_integer((json_int_t)s.missing));
  json_object_set_new(
      rep, "blobs",
      json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "live", (json_int_t)s.live, "marked",
                (json_int_t)s.marked, "quarantined", (json_int_t)quarantined, "restored",
                (json_int_t)restored, "deleted", (json_int_t)deleted, "held_referenced",
                (json_int_t)s.held_referenced, "pending", (json_int_t)s.pending));
  /* null: the run recorded no lists (lists = false), so /blobs has none to page */
  json_t *lists = want_lists ? json_object() : json_null();
  for (int a = 0; want_lists && a < RL_NACTIONS; a++)
    json_object_set_new(lists, rstate_action_name(a), json_integer((json_int_t)listed[a]));
  if (want_lists) json_object_set_new(lists, "bytes", json_integer((json_int_t)list_bytes));
  json_object_set_new(rep, "lists", lists);
  json_object_set_new(rep, "bytes_reclaimed", json_integer((json_int_t)reclaimed));
  json_object_set_new(rep, "deletes_finished", json_integer((json_int_t)finished));
  json_object_set_new(rep, "refused", refused ? json_string(refused) : json_null());
  json_object_set_new(
      rep, "phases",
      json_pack("{s:I,s:I,s:I}", "mark_ms", (json_int_t)(mark_end - started), "sweep_ms",
                (json_int_t)(sweep_end - mark_end), "delete_ms", (json_int_t)(end - sweep_end)));
  json_object_set_new(rep, "spill_runs",
                      json_integer((json_int_t)(m.sorter ? dsort_runs(m.sorter) : 0)));
  json_object_set_new(rep, "sweep_skipped", *skipped ? json_string(skipped) : json_null());
  /* a basis for the next run, with nothing going wrong: a sweep that decided nothing, or one whose
   * decisions were all applied with no other write to the index since mark0 (the index is then
   * the swept one with exactly those changes: the next sweep would decide nothing before the
   * retention of what this run quarantined ends) */
  uint64_t decided = s.n[DO_QUARANTINE] + s.n[DO_RESTORE] + s.n[DO_DELETE];
  br_index_mark mark1 = mark0;
  int changes_alone = decided == 0;
  if (!changes_alone && !failed && seq_ok && !opt->dry_run && !basis &&
      quarantined == s.n[DO_QUARANTINE] && restored == s.n[DO_RESTORE] &&
      deleted == s.n[DO_DELETE] && br_index_change_mark(r->env.index, &mark1, &err) == 0)
    changes_alone = br_index_only_reconcile_since(&mark0, &mark1);
  int qualifies = !failed && seq_ok && !refused && !list_failed && finished == 0 && changes_alone &&
                  json_array_size(errors) == 0;
  uint64_t until = s.next_deadline;
  if (quarantined && started + cfg->retention_ms < until) until = started + cfg->retention_ms;
  json_object_set_new(
      rep, "rerun_basis",
      qualifies ? json_pack("{s:s,s:I,s:I,s:I,s:I,s:I,s:I}", "inputs", inputs, "index_seq",
                            (json_int_t)mark1.seq, "started_ms", (json_int_t)started, "until_ms",
                            (json_int_t)(until > INT64_MAX ? INT64_MAX : until), "live",
                            (json_int_t)(s.live - quarantined + restored), "marked",
                            (json_int_t)(s.marked - s.marked_deleting), "references_missing",
                            (json_int_t)(s.missing + s.marked_deleting))
                : json_null());
  json_decref(basis);
  json_object_set_new(rep, "errors", errors);
  json_object_set_new(rep, "held_referenced_blobs", held);
  dsort_free(m.sorter);
  free(m.kept);
  char *text = json_dumps(rep, JSON_COMPACT);
  if (!text || rstate_put_report(r->state, id, text, &err) < 0)
    br_error("reconcile: run %" PRIu64 ": the report could not be stored: %s", id,
             text ? err.msg : "out of memory");
  free(text);
  rprogress_end(r->progress); /* after the report: a reader finds one or the other */
  *report_out = rep;
  return failed ? -1 : 0;
}

int br_reconciler_list_page(br_reconciler *r, uint64_t id, const char *action, const uint8_t *after,
                            size_t limit, int (*fn)(void *ud, const uint8_t d[D], uint64_t t_ms),
                            void *ud, int *more, br_err *err) {
  int a = rstate_action_parse(action);
  if (a < 0) return br_fail(err, "no such list");
  return rstate_list_page(r->state, id, a, after, limit, fn, ud, more, err);
}

/* ---- refs: which tables, snapshots and data files reference one blob ----------------------
 * The tables' metadata is walked now (retained snapshots or versions, their data files); each
 * data file's hashes come from the cache the last run left (a read-only transaction: the runner
 * is never waited for), and a file no run has cached yet is read. */

struct refs_ctx {
  br_reconciler *r;
  const br_iceberg_table_config *tcfg; /* as the mark reads the files (Delta: physical column) */
  const uint8_t *want;
  int hit;
  json_t *files;  /* path -> [snapshot ids] */
  json_t *snaps;  /* decimal id -> null: the snapshots that reference the blob */
  json_t *listed; /* [{id, timestamp}] of those, in the table's order */
  uint64_t cached, read;
  br_err err;
};

static int refs_hash(void *ud, const uint8_t d[D]) {
  struct refs_ctx *c = ud;
  if (!memcmp(d, c->want, D)) c->hit = 1;
  return 0;
}

static int refs_file(void *ud, const br_iceberg_data_file *f) {
  struct refs_ctx *c = ud;
  uint8_t id[D];
  rstate_file_id(f->path, f->file_size, f->record_count, c->tcfg->column, (int)c->tcfg->form, id);
  c->hit = 0;
  int rc = rstate_cache_holds(c->r->state, id, c->want, &c->err);
  if (rc < 0) return -1;
  if (rc == 2) { /* not cached yet: a targeted read of this file */
    br_iceberg_stats st = {0};
    if (br_iceberg_read_file_hashes(c->tcfg, f, refs_hash, c, &st, &c->err) < 0) return -1;
    c->read++;
  } else {
    c->hit = rc == 1;
    c->cached++;
  }
  if (c->hit && !json_object_get(c->files, f->path))
    json_object_set_new(c->files, f->path, json_array());
  return 0;
}

static int refs_snapshot(void *ud, int64_t snapshot_id, const char *path) {
  struct refs_ctx *c = ud;
  json_t *a = json_object_get(c->files, path);
  if (!a) return 0;
  json_array_append_new(a, json_integer((json_int_t)snapshot_id));
  char key[32];
  snprintf(key, sizeof key, "%" PRId64, snapshot_id);
  json_object_set_new(c->snaps, key, json_null());
  return 0;
}

static int refs_time(void *ud, int64_t snapshot_id, int64_t timestamp_ms) {
  struct refs_ctx *c = ud;
  char key[32], ts[64];
  snprintf(key, sizeof key, "%" PRId64, snapshot_id);
  if (!json_object_get(c->snaps, key)) return 0;
  if (timestamp_ms >= 0) br_format_time_ms((uint64_t)timestamp_ms, ts, sizeof ts);
  json_array_append_new(c->listed,
                        json_pack("{s:I,s:o}", "id", (json_int_t)snapshot_id, "timestamp",
                                  timestamp_ms >= 0 ? json_string(ts) : json_null()));
  return 0;
}

/* One table's entry: its data files holding digest, the snapshots (ids and times) listing them. */
static json_t *refs_table(br_reconciler *r, const br_table_config *t, struct table_open *o,
                          const uint8_t digest[D]) {
  br_iceberg_table_config tc = o->tc;
  char physical[BR_DELTA_MAX_COLUMN];
  br_iceberg_table_config delta_read = tc;
  delta_read.column = physical;
  br_delta_list_fn lister = o->s3_table ? br_delta_list_s3 : NULL;
  struct refs_ctx c = {.r = r,
                       .tcfg = o->delta ? &delta_read : &tc,
                       .want = digest,
                       .files = json_object(),
                       .snaps = json_object(),
                       .listed = json_array()};
  br_iceberg_stats ws;
  int rc = o->delta ? br_delta_walk_data_files_mapped(&tc, lister, o->s3, refs_file, &c, physical,
                                                      &ws, &c.err)
                    : br_iceberg_walk_data_files(&tc, refs_file, &c, &ws, &c.err);
  if (rc == 0 && json_object_size(c.files))
    rc = o->delta ? br_delta_list_files(&tc, lister, o->s3, refs_snapshot, &c, &ws, &c.err)
                  : br_iceberg_list_files(&tc, refs_snapshot, &c, &ws, &c.err);
  if (rc == 0 && json_object_size(c.snaps))
    rc = o->delta ? br_delta_list_versions(&tc, lister, o->s3, refs_time, &c, &c.err)
                  : br_iceberg_list_snapshots(&tc, refs_time, &c, &c.err);
  json_t *entry = json_pack("{s:s,s:s}", "name", t->name, "format", o->delta ? "delta" : "iceberg");
  if (rc != 0) {
    json_object_set_new(entry, "error", json_string(c.err.msg));
  } else {
    json_t *files = json_array();
    const char *path;
    json_t *snaps;
    json_object_foreach(c.files, path, snaps)
        json_array_append_new(files, json_pack("{s:s,s:O}", "path", path, "snapshots", snaps));
    json_object_set_new(entry, "data_files", files);
    json_object_set(entry, "snapshots", c.listed);
    json_object_set_new(entry, "data_files_cached", json_integer((json_int_t)c.cached));
    json_object_set_new(entry, "data_files_read", json_integer((json_int_t)c.read));
  }
  json_decref(c.files);
  json_decref(c.snaps);
  json_decref(c.listed);
  return entry;
}

json_t *br_reconciler_refs(br_reconciler *r, const uint8_t digest[D], br_err *err) {
  const br_config *cfg = r->env.cfg;
  json_t *tables = json_array();
  for (int i = 0; i < cfg->ntables; i++) {
    struct table_open o;
    if (table_open(cfg, &cfg->tables[i], &o, err) < 0) {
      json_decref(tables);
      return NULL;
    }
    json_array_append_new(tables, refs_table(r, &cfg->tables[i], &o, digest));
    br_iceberg_s3_free(o.s3);
  }
  return tables;
}

char *br_reconciler_report(br_reconciler *r, uint64_t id, int *found, br_err *err) {
  return rstate_get_report(r->state, id, found, err);
}

static int collect_report(void *ud, uint64_t id, const char *json) {
  (void)id;
  json_t *v = json_loads(json, 0, NULL);
  if (v) json_array_append_new(ud, v);
  return 0;
}

json_t *br_reconciler_reports(br_reconciler *r, size_t limit, br_err *err) {
  json_t *a = json_array();
  if (rstate_each_report(r->state, limit, collect_report, a, err) < 0) {
    json_decref(a);
    return NULL;
  }
  return a;
}
