/* Private to the daemon: the server's state below HTTP (stores by name, blob locks, store health,
 * the reconcile runner, the drain, the CDN purge queue, the small-blob cache) and their start and
 * stop order. Nothing here knows about HTTP: server/http/ sits on top of it. */
#ifndef BLOBREF_CORE_SERVER_H
#define BLOBREF_CORE_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "blobref/config.h"
#include "blobref/index.h"
#include "blobref/store.h"

/* 4096 stripes by the hash's first 12 bits: two blobs share one 1 time in 4096 (with 256 by its
 * first byte alone, an upload waited for an unrelated blob's slow move or delete 1 time in 256) */
#define BLOB_LOCKS 4096

/* Store failures counted by operation (blobref_store_errors_total). */
enum store_op { STORE_OP_READ, STORE_OP_WRITE, STORE_OP_CHECK, STORE_OPS };

typedef struct br_server br_server;

/* Lock order. A blob's stripe (blob_locks, br_server_lock_blob) is taken first and only one at a
 * time: nobody holds two stripes. Under a stripe the holder may take the index writer (every
 * br_index_* write), the store's own locks and the cache's; it never takes health_lock nor the
 * runner's or the drain's lock. Those three guard only their own thread's state and are never
 * held while a stripe, the index writer or a store call is waited for, except health_lock, which
 * br_server_store_health holds for a read of the figures only. The purge queue (cdn_purge) has
 * its own lock taken last, after the stripe has been released. */
struct br_server {
  br_config *cfg;   /* borrowed from the daemon: lives as long as the process */
  br_index *index;  /* owned: br_server_open ... br_server_close */
  int data_lock_fd; /* DATA_DIR/lock under flock(LOCK_EX) when data_locked, else unused */
  int data_locked;
  br_store *stores[BR_MAX_STORES];
  int nstores;
  br_store *upload_store;  /* one of stores[] */
  struct blobcache *cache; /* small blobs' bytes; NULL when cache_size = 0 */
  /* store health, refreshed by the health thread: 1 ok, 0 failing (message in store_error),
   * -1 not checked yet */
  atomic_int store_ok[BR_MAX_STORES];
  char store_error[BR_MAX_STORES][sizeof(br_err)];
  pthread_mutex_t health_lock;
  pthread_cond_t health_cv;
  pthread_t health_thread;
  int health_running;
  pthread_mutex_t blob_locks[BLOB_LOCKS]; /* uploads, moves, admin changes vs deletes, by hash */
  /* the slow store calls that run outside the stripes, by exact hash (br_server_commit_begin);
   * busy_lock is taken last, after a stripe when one is held, and never held over a call */
  pthread_mutex_t busy_lock;
  struct blob_busy *busy[BLOB_LOCKS];
  struct reconcile_runner *reconcile; /* core/reconcile_runner.c */
  struct drainer *drain;              /* core/drain.c: deletes draining copies */
  struct cdn_purger *purger;          /* core/cdn_purge.c: purges when blobs go */
  struct job_engine *jobs;            /* core/jobs.c: migrate and import jobs */
  struct direct_plans *plans;         /* core/direct_plans.c: direct-upload plans, sweep */
  atomic_uint_fast64_t store_errors[BR_MAX_STORES][STORE_OPS];
  uint64_t started_ms;
};

/* core/lifecycle.c */

/* How br_server_open opens things: to serve; for --fsck (index and stores read-only); for
 * --rebuild-index (stores read-only, the index written one record per commit); for
 * --import-index (like rebuild, but with the configured group commit). */
enum br_open_mode { BR_OPEN_SERVE, BR_OPEN_CHECK, BR_OPEN_REBUILD, BR_OPEN_IMPORT };
/* Opens the index (DATA_DIR/index) and the stores of cfg and, to serve, allocates the small-blob
 * cache. To serve and to rebuild it first takes flock(LOCK_EX | LOCK_NB) on DATA_DIR/lock (held
 * until br_server_close), so that only one process ever writes a data directory: -1 with err
 * naming the holder's pid when another has it (srv->data_locked stays 0). --fsck takes no lock:
 * it only reads, beside a running server. Returns -1 with err; br_server_close undoes what was
 * done. */
int br_server_open(br_server *srv, br_config *cfg, enum br_open_mode mode, br_err *err);
void br_server_close(br_server *srv);
/* SIGHUP: opens the [store] sections of fresh whose names srv does not know and appends them
 * (stores are only ever added while serving: readers of srv->stores and cfg->stores see the old
 * count or the new one, each entry complete before it is counted). Their config strings move
 * from fresh into srv->cfg. Returns how many were added, or -1 with err (those before it stay). */
int br_server_add_stores(br_server *srv, br_config *fresh, br_err *err);

/* Starts the core services in their order: the purge queue first (the others queue purges),
 * then the store health thread, the reconcile runner and the drain thread. Returns -1 with err
 * (br_server_stop then stops what did start). */
int br_server_start(br_server *srv, br_err *err);
/* Stops them in reverse: the drain and reconcile threads are joined (a run in progress ends
 * first), then the health thread, and the purge queue closes last, so that no purge a sweep
 * queues is ever dropped or sent to a freed queue. Safe after a failed or partial start. */
void br_server_stop(br_server *srv);

/* core/server.c */

/* The store named name, or NULL. */
br_store *br_server_store(br_server *srv, const char *name);
/* Locks (lock = 1) or unlocks the stripe of digest: held by an upload's commit, reconcile's final
 * delete of the same hash, moves, the drain's deletes and admin state changes. On a shared index
 * it takes the database's lock too: when that fails (database down, lock_timeout) nothing is held
 * and BR_INDEX_UNAVAILABLE is returned (logged; the caller answers 503 index_unavailable and
 * changes nothing). Unlocking, and locking on LMDB, always return 0. */
int br_server_lock_blob(br_server *srv, const uint8_t digest[BR_SHA256_LEN], int lock);
/* The same for n blobs at once (reconcile's batched deletes): their distinct stripes in one order,
 * so that it never deadlocks with another holder. Returns 0, or -1 (nothing locked) when the index
 * is shared and each blob's lock is a database session of its own. */
int br_server_lock_blobs(br_server *srv, const uint8_t (*digests)[BR_SHA256_LEN], size_t n,
                         int lock);
/* Slow store calls outside the stripe (LMDB only: br_server_off_stripe). The stripe is held
 * only for index decisions; the store calls around them (an upload's commit of its bytes,
 * CompleteMultipartUpload and the copy from a staging key; the deletes of reconcile and the
 * drain) run without it, registered here by exact hash so that the two kinds on one blob see
 * each other:
 *  - an upload calls br_server_commit_begin before it commits its bytes and _end after its index
 *    decision; a 1 tells it a delete of the blob's bytes is in flight: it writes under a fresh
 *    key of its own (br_store_fresh_key), which no delete in flight can name;
 *  - a delete calls br_server_delete_begin under the stripe, after its decision and before it
 *    releases the stripe to delete bytes, and _end once they are gone; a 1 says an upload of the
 *    blob is committing (its bytes may be at the key): the delete leaves the blob alone for now.
 * Either the upload registered first (the delete skips the blob, which the upload makes live) or
 * the delete did (the upload's bytes go elsewhere), because both check and register under
 * busy_lock. Both return -1 when out of memory (nothing registered). */
int br_server_off_stripe(const br_server *srv);
int br_server_commit_begin(br_server *srv, const uint8_t digest[BR_SHA256_LEN]);
void br_server_commit_end(br_server *srv, const uint8_t digest[BR_SHA256_LEN]);
int br_server_delete_begin(br_server *srv, const uint8_t digest[BR_SHA256_LEN]);
void br_server_delete_end(br_server *srv, const uint8_t digest[BR_SHA256_LEN]);
/* A key of digest in st that nothing else names: its default key and a unique suffix. Returns
 * its length, or 0 when it does not fit in outlen. */
size_t br_server_fresh_key(const br_store *st, const uint8_t digest[BR_SHA256_LEN], char *out,
                           size_t outlen);
/* 1 when a delete of the blob's bytes is in flight (a move must not make them its primary). */
int br_server_delete_busy(br_server *srv, const uint8_t digest[BR_SHA256_LEN]);
/* A blob stopped being servable (quarantined, held, deleted, moved): forget its cached bytes and
 * queue its purge at the CDNs. Call it without holding the blob's stripe. */
void br_server_blob_gone(br_server *srv, const uint8_t digest[BR_SHA256_LEN]);
/* 0 when every store passed its last health check, else -1 with the first problem in msg. */
int br_server_store_health(br_server *srv, char *msg, size_t msglen);
/* Counts a failure of store (by pointer) for blobref_store_errors_total. */
void br_server_store_error(br_server *srv, const br_store *store, enum store_op op);
/* The health thread (br_server_start and br_server_stop call these). */
int br_server_health_start(br_server *srv, br_err *err);
void br_server_health_stop(br_server *srv);

/* Monotonic nanoseconds, for step timings. */
static inline uint64_t br_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
