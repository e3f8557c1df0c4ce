/* Reconcile: quarantine and later delete blobs that no retained snapshot of any configured table
 * references, restore quarantined ones that are referenced again. Mark is exact and
 * memory-bounded (an external sort of every referenced hash, merged against the index in key
 * order) and incremental (each immutable data file's hashes are cached); sweep decisions are
 * re-checked inside the index writer's transaction; the whole run fails closed. */
#ifndef BLOBREF_RECONCILE_H
#define BLOBREF_RECONCILE_H

#include <jansson.h>

#include "blobref/config.h"
#include "blobref/index.h"
#include "blobref/store.h"

typedef struct br_reconciler br_reconciler;

/* What a run may touch. stores/nstores are the daemon's open stores (by name in locations). */
typedef struct br_reconcile_env {
  const br_config *cfg;
  br_index *index;
  br_store *const *stores;
  int nstores;
  const char *state_dir; /* LMDB of the cache and reports, and spill files (DATA_DIR/reconcile) */
  /* Serialises the deletion of a blob with uploads of the same hash (lock = 1 / 0). Locking
   * returns 0, or a negative index code when the lock cannot be had (then nothing is held and the
   * blob is left alone). */
  int (*lock_blob)(void *ud, const uint8_t digest[BR_SHA256_LEN], int lock);
  /* The same for n blobs at once (deletes go in batches). Returns 0 when it locked (unlocked)
   * them all, -1 when it cannot take them together (then the blobs go one by one). Optional. */
  int (*lock_blobs)(void *ud, const uint8_t (*digests)[BR_SHA256_LEN], size_t n, int lock);
  /* Optional (both or neither): the store deletes run outside the locks. delete_begin is called
   * under the blob's lock once it is to go (marked deleting): 0 registers the delete (bytes may
   * go: an upload of the same hash from then on writes elsewhere), 1 says an upload of it is
   * committing (the blob is left alone: the upload makes it live; a later run finishes it), -1
   * on an error (left alone too). delete_end follows once its bytes are deleted or failed; the
   * lock is then taken again to remove the record, only if it is still marked as it was. When
   * NULL, the locks are held throughout. */
  int (*delete_begin)(void *ud, const uint8_t digest[BR_SHA256_LEN]);
  void (*delete_end)(void *ud, const uint8_t digest[BR_SHA256_LEN]);
  /* Told about each blob that was quarantined, held or deleted (caches, CDN purges). */
  void (*on_gone)(void *ud, const uint8_t digest[BR_SHA256_LEN]);
  void *ud;
  size_t mem_digests; /* the mark's in-memory buffer (0 = 1M digests, 32 MiB) */
} br_reconcile_env;

typedef struct br_reconcile_options {
  int dry_run; /* decide and report, change nothing */
  int force;   /* quarantine even over max_fraction */
  int full;    /* ignore the data-file cache: read every data file again */
} br_reconcile_options;

br_reconciler *br_reconciler_open(const br_reconcile_env *env, br_err *err);
void br_reconciler_close(br_reconciler *r);

/* The upload leases reconcile honours (blobref/leases.h), kept beside its state. */
struct br_leases *br_reconciler_leases(br_reconciler *r);

/* A new run id (monotonic, kept across restarts); 0 on error. */
uint64_t br_reconciler_next_id(br_reconciler *r, br_err *err);

/* Runs reconcile once as run id. *report receives the report (a JSON object the caller owns),
 * also when the run fails (state "failed", errors listed); the report is stored under id.
 * progress, if set, is updated with the report as the run goes (state "running"). Returns 0
 * when the run completed, -1 when it failed (nothing was changed then). */
int br_reconcile_run(br_reconciler *r, uint64_t id, const br_reconcile_options *opt,
                     json_t **report);

/* The running report of run id (0: whichever runs): {id, state "running", dry_run, force, full,
 * started_at, phase "mark" | "sweep" | "apply", progress {data_files, data_files_read,
 * data_files_cached, records_swept}}, of this node's run or, on a shared index, of the run
 * another node is executing (while it holds the reconcile lease). A new json_t or NULL. Any
 * thread. */
json_t *br_reconciler_running(br_reconciler *r, uint64_t id);
/* Says that run id is asked for (phase "starting"), before br_reconcile_run starts it: the run
 * shows on every node from the moment its lease is taken. */
/* The id of the run holding the cluster-wide reconcile lease (this node's or another's, as it
 * published it), or 0 when none is known. */
uint64_t br_reconciler_lease_run(br_reconciler *r);
void br_reconciler_announce(br_reconciler *r, uint64_t id, const br_reconcile_options *opt);

/* Finishes the deletes that a crash or a failed index write cut short: every record marked
 * deleting loses the bytes it still owns (never another record's key, never an in-place object
 * rewritten since) and then its record. br_reconciler_open calls it, and a run that failed
 * closed (a run's sweep finishes them otherwise); a startup hook may too. Returns how many were
 * finished, or -1 + err (the first failure; the rest go on). */
int64_t br_reconcile_finish_deletes(br_reconciler *r, br_err *err);
/* How many times finish_deletes walked the index for deleting records (the per-state counters
 * skip the walk when they count none, and end it once it found as many as they count). */
uint64_t br_reconciler_deleting_walks(br_reconciler *r);

/* Stored reports: JSON text (malloc'd) of run id, or NULL with *found = 0. */
char *br_reconciler_report(br_reconciler *r, uint64_t id, int *found, br_err *err);
/* A page of run id's blob list action ("quarantined", "restored", "deleted", "held" or "pending"):
 * fn gets up to limit blobs past after (NULL: from the first), ascending, with t_ms the time a
 * pending blob becomes eligible (0 for the others); *more = 1 when more follow. A run without
 * lists gives none. Returns 0, or -1 + err. */
int br_reconciler_list_page(br_reconciler *r, uint64_t id, const char *action, const uint8_t *after,
                            size_t limit,
                            int (*fn)(void *ud, const uint8_t d[BR_SHA256_LEN], uint64_t t_ms),
                            void *ud, int *more, br_err *err);
/* Which configured tables (Iceberg and Delta) reference the blob: their metadata read now (every
 * live data file of every retained snapshot or version), each data file's hashes from the last
 * runs' cache (a read-only transaction, any thread) or, for a file not cached yet, a targeted
 * read. A JSON array of {"name","format","data_files":[{"path","snapshots":[ids]}],
 * "snapshots":[{"id","timestamp"}] (those referencing it; Delta: versions and commit times),
 * "data_files_cached","data_files_read"} or {"name","format","error"}. NULL + err when a table's
 * store cannot be opened. Bounded by the tables' metadata and the files not cached. */
json_t *br_reconciler_refs(br_reconciler *r, const uint8_t digest[BR_SHA256_LEN], br_err *err);
/* Up to limit reports, newest first, as a JSON array (new reference). */
json_t *br_reconciler_reports(br_reconciler *r, size_t limit, br_err *err);

#endif
