/* Private to reconcile: the external sorter of digests (memory-bounded mark) and the state kept
 * between runs (the data-file cache and the reports), in an LMDB environment of their own or in
 * a shared index. */
#ifndef BLOBREF_RECONCILE_INTERNAL_H
#define BLOBREF_RECONCILE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "blobref/common.h"
#include "blobref/index.h"

#include <jansson.h>

/* --- external sort: digests in, ascending unique digests out ------------------------------- */

typedef struct dsort dsort;

/* A sorter holding at most mem_digests digests in memory; full buffers are sorted and spilled as
 * runs into files under dir (removed by dsort_free). */
dsort *dsort_new(const char *dir, size_t mem_digests, br_err *err);
int dsort_add(dsort *s, const uint8_t d[BR_SHA256_LEN], br_err *err);
/* Ends the input and prepares the merge. */
int dsort_finish(dsort *s, br_err *err);
/* The next digest in ascending order, duplicates removed: 1, 0 at the end, -1 + err. */
int dsort_next(dsort *s, uint8_t out[BR_SHA256_LEN], br_err *err);
size_t dsort_runs(const dsort *s); /* runs spilled to disk */
uint64_t dsort_added(const dsort *s);
void dsort_free(dsort *s);

/* --- state between runs ---------------------------------------------------------------------- */

typedef struct rstate rstate;

/* Opens (creating) the state environment in directory dir. With shared (an index with shared
 * state: PostgreSQL), the run ids, reports, per-run lists and the data-file cache live there
 * instead, so that every node answers the same runs and any node's run is incremental over
 * another's; dir then keeps nothing a run needs. */
rstate *rstate_open(const char *dir, br_index *shared, br_err *err);
void rstate_close(rstate *st);

/* The identity of a data file read for one column: SHA-256 over its path, size and record count
 * as the manifest records them, and the column and form its hashes were read as (two [table]
 * sections over one table, or a changed column, must not share entries). Immutable files keep
 * their identity; a rewritten one gets another. */
void rstate_file_id(const char *path, int64_t size, int64_t count, const char *column, int form,
                    uint8_t id[BR_SHA256_LEN]);

/* Calls fn for every hash cached for the file id. Returns 1 if cached (fn called), 0 if not, -1
 * + err. A non-zero fn result stops with -1 (fn's reason is the caller's). */
int rstate_cached(rstate *st, const uint8_t id[BR_SHA256_LEN],
                  int (*fn)(void *ud, const uint8_t d[BR_SHA256_LEN]), void *ud, br_err *err);

/* Whether the cached entry of file id holds the digest want, read in a read-only transaction of
 * its own (any thread; never the running batch, so entries a run has not committed are not seen):
 * 1 it does, 0 cached without it, 2 not cached, -1 + err. */
int rstate_cache_holds(rstate *st, const uint8_t id[BR_SHA256_LEN],
                       const uint8_t want[BR_SHA256_LEN], br_err *err);

/* Writing one file's hashes into the cache: chunks as they come, the entry becomes visible only
 * when rstate_entry_commit wrote its header. */
typedef struct rstate_entry rstate_entry;
rstate_entry *rstate_entry_begin(rstate *st, const uint8_t id[BR_SHA256_LEN], br_err *err);
int rstate_entry_add(rstate_entry *e, const uint8_t d[BR_SHA256_LEN], br_err *err);
int rstate_entry_commit(rstate_entry *e, br_err *err); /* frees e */
void rstate_entry_abort(rstate_entry *e);              /* frees e; NULL allowed */

/* Drops cache entries whose id is not among keep[0..n) (sorted ascending, 32 bytes each). */
int rstate_prune(rstate *st, const uint8_t *keep, size_t n, br_err *err);

/* Reports: JSON text under a run id. */
uint64_t rstate_next_run_id(rstate *st, br_err *err); /* 0 on error */
int rstate_put_report(rstate *st, uint64_t id, const char *json, br_err *err);
/* The report of id (malloc'd text) or NULL with *found = 0. */
char *rstate_get_report(rstate *st, uint64_t id, int *found, br_err *err);
/* Calls fn with up to limit reports, newest first. */
int rstate_each_report(rstate *st, size_t limit, int (*fn)(void *ud, uint64_t id, const char *json),
                       void *ud, br_err *err);

/* --- per-run blob lists ------------------------------------------------------------------------
 * Each run's blobs per action, in chunks of raw digests (32 bytes a blob; pending ones carry the
 * u64 time they become eligible: 40 bytes), keyed by (run, action, chunk). Added in ascending
 * digest order per action; pruned with the run's report. */

enum rstate_action {
  RL_QUARANTINED,
  RL_RESTORED,
  RL_DELETED,
  RL_HELD,    /* held by an admin while referenced */
  RL_PENDING, /* unreferenced, left because inside grace or leased: with its eligibility time */
  RL_NACTIONS
};
const char *rstate_action_name(int action);
int rstate_action_parse(const char *name); /* -1 when unknown */

typedef struct rstate_lists rstate_lists;
/* Starts the lists of run (dropping any a crashed run left under the same id). */
rstate_lists *rstate_lists_begin(rstate *st, uint64_t run, br_err *err);
/* Appends one blob (t_ms: the eligibility time, pending only). Digests ascending per action. */
int rstate_lists_add(rstate_lists *l, int action, const uint8_t d[BR_SHA256_LEN], uint64_t t_ms,
                     br_err *err);
/* Writes what is buffered; counts[action] and *bytes (the values stored) as written so far. */
int rstate_lists_flush(rstate_lists *l, uint64_t counts[RL_NACTIONS], uint64_t *bytes, br_err *err);
void rstate_lists_free(rstate_lists *l); /* NULL allowed; does not flush */

/* Calls fn for up to limit blobs of (run, action) after the digest after (NULL: from the start),
 * ascending; *more = 1 when blobs follow. Returns 0 or -1 + err (a fn result != 0 stops). */
int rstate_list_page(rstate *st, uint64_t run, int action, const uint8_t *after, size_t limit,
                     int (*fn)(void *ud, const uint8_t d[BR_SHA256_LEN], uint64_t t_ms), void *ud,
                     int *more, br_err *err);

/* The in-progress run as others see it (shared: key 'C' of the index's shared state, one run
 * cluster-wide at a time), so that every node answers the run another node is executing. */
int rstate_put_current(rstate *st, const char *json, br_err *err);
/* The published running report (malloc'd) or NULL with *found = 0 (always on a local state). */
char *rstate_get_current(rstate *st, int *found, br_err *err);

/* --- the run in progress: phase and progress (progress.c) ----------------------------------
 * The running run's report ({id, state "running", dry_run, force, full, started_at, phase,
 * progress}), kept for this node's readers and, on a shared index, published (at each phase and
 * at most once a second in between) for the other nodes'. The run's thread writes; any thread
 * reads. */
typedef struct rprogress rprogress;
/* index: the shared index whose reconcile lease says whether a published run is alive, or NULL. */
rprogress *rprogress_new(rstate *st, br_index *index, br_err *err);
void rprogress_free(rprogress *p);
void rprogress_start(rprogress *p, uint64_t id, int dry_run, int force, int full,
                     const char *started_at, const char *phase);
/* The run is in phase ("mark", "sweep", "apply"), with data files seen, read and taken from the
 * cache so far and index records swept; published when the phase changed or a second passed. */
void rprogress_update(rprogress *p, const char *phase, uint64_t files, uint64_t read,
                      uint64_t cached, uint64_t swept);
/* Publishes what the last update said now (the end of a phase). */
void rprogress_publish(rprogress *p);
void rprogress_end(rprogress *p);
/* The running report of run id (0: whichever runs): this node's own run, else the one another
 * node published while it still holds the reconcile lease. A new json_t, or NULL. */
json_t *rprogress_get(rprogress *p, uint64_t id);
/* The id of the run that holds the reconcile lease, as published (its report may be stored
 * already: the lease is given back after it), or 0 when none is known. */
uint64_t rprogress_holder(rprogress *p);

#endif
