/* The blob index: SHA-256 -> record (size, type, times, state, locations) in LMDB (one node) or
 * PostgreSQL (shared by several nodes), with one group-committing writer thread so that many
 * uploads share one durable transaction. */
#ifndef BLOBREF_INDEX_H
#define BLOBREF_INDEX_H

#include "blobref/common.h"

#define BR_MAX_LOCATIONS 8
#define BR_MAX_STORE_NAME 63
#define BR_MAX_KEY 1024
#define BR_MAX_CONTENT_TYPE 255
#define BR_MAX_REASON 255
#define BR_RECORD_MAX_ENCODED 16384

enum br_role { BR_ROLE_PRIMARY = 0, BR_ROLE_COPY = 1, BR_ROLE_DRAINING = 2 };
/* QUARANTINED: by reconcile (no retained snapshot references it; restored automatically when
 * one does again). HELD: quarantined by an admin (DELETE /v1/blobs/{hash}); stays so, referenced
 * or not, until an admin restores it. DELETING: reconcile decided to delete it for good and may
 * have deleted some of its bytes already; the record goes once they are all gone (a crash in
 * between is finished later: br_reconcile_finish_deletes). Never restored. None is served (410). */
enum br_state {
  BR_STATE_LIVE = 0,
  BR_STATE_QUARANTINED = 1,
  BR_STATE_HELD = 2,
  BR_STATE_DELETING = 3
};

typedef struct br_location {
  char store[BR_MAX_STORE_NAME + 1];
  char key[BR_MAX_KEY + 1];
  enum br_role role;
  uint64_t verified_at_ms; /* when its bytes were last checked against the hash (0 = never) */
  /* the file's identity (fs: st_dev, st_ino) when it was verified: a read that opens another
   * inode there (a file renamed into place) does not serve it. Both 0: unknown, not compared */
  uint64_t dev, ino;
} br_location;

typedef struct br_record {
  uint64_t size;
  uint64_t created_ms;
  uint64_t last_upload_ms; /* last acknowledged upload, dedup hits included */
  enum br_state state;
  uint64_t state_ms; /* when the state last changed */
  char reason[BR_MAX_REASON + 1];
  char content_type[BR_MAX_CONTENT_TYPE + 1];
  int nlocations;
  br_location locations[BR_MAX_LOCATIONS];
} br_record;

/* Errors beyond -1 that callers map to specific replies. */
#define BR_INDEX_FULL (-2)     /* the LMDB map is full: raise index_map_size */
#define BR_INDEX_NO_SPACE (-3) /* the index's file system is full (ENOSPC, EDQUOT) */
/* br_index_record_upload: the location's (store, key) is another record's (invariant 10). */
#define BR_INDEX_KEY_TAKEN (-4)
#define BR_INDEX_UNAVAILABLE (-5) /* the database cannot be reached (nothing was written) */

/* Serialises rec (format version 1, little-endian, length-prefixed strings) into buf.
 * Returns the encoded length, or 0 if it does not fit in cap or rec is invalid. */
size_t br_record_encode(const br_record *rec, uint8_t *buf, size_t cap);

/* Parses an encoded record. Returns 0, or -1 with err filled on any malformed input. */
int br_record_decode(const uint8_t *buf, size_t len, br_record *rec, br_err *err);

/* Fills rec as a new live blob of size and content_type, created (and its state set) at
 * created_ms, with one primary location (store, key) whose bytes were verified at verified_ms. */
void br_record_init(br_record *rec, uint64_t size, const char *content_type, const char *store,
                    const char *key, uint64_t created_ms, uint64_t verified_ms);

/* The location with role primary (or the first one), or NULL if there is none. */
const br_location *br_record_primary(const br_record *rec);

typedef struct br_index br_index;

/* Told that another node changed the record of digest (NULL: any record may have changed), on
 * the index's listener thread; must be cheap and thread-safe (a cache eviction). */
typedef void (*br_index_change_fn)(void *ud, const uint8_t *digest);

/* The record cache's default size in entries: a slot is about 360 bytes (23 MiB for 65,536). */
#define BR_RECORD_CACHE_DEFAULT 65536

typedef struct br_index_options {
  uint64_t map_size;  /* bytes */
  unsigned batch_max; /* most operations per transaction (1 = no group commit) */
  int read_only;      /* open without the writer thread (fsck, tools) */
  int queue_purges;   /* state and location changes that make CDN copies stale queue a purge */
  const char *dsn;    /* non-empty: a PostgreSQL index (libpq conninfo or URI), not LMDB in dir */
  uint64_t purge_claim_ms; /* PostgreSQL: how long a claim on due purges holds (0: 60 s) */
  const char *read_dsn;    /* with dsn, optional: a read replica for point reads (br_index_get) */
  size_t record_cache;     /* the record cache's entries (0: BR_RECORD_CACHE_DEFAULT) */
  br_index_change_fn on_change; /* a shared index: called until br_index_close returns */
  void *on_change_ud;
} br_index_options;

/* Opens (creating) the index in directory dir and starts the writer thread. NULL + err. */
br_index *br_index_open(const char *dir, const br_index_options *opt, br_err *err);

/* "lmdb" or "postgres". */
const char *br_index_kind(br_index *idx);

/* 1 when the index can serve: always for LMDB; for PostgreSQL, while the database answers. */
int br_index_ready(br_index *idx);

/* The per-blob lock across nodes: on PostgreSQL a session advisory lock on the pair
 * (BR_INDEX_LOCK_CLASS, the digest's first 4 bytes, big-endian, as int4), held on a connection of
 * its own until unlocked, so that an upload's commit on one node and a final delete on another
 * are serialised; on LMDB (one node) nothing (the caller's own mutex suffices). The caller holds
 * its node-local lock for digest around both calls. Returns 0, or a negative code + err. */
#define BR_INDEX_LOCK_CLASS 0x62726c6b /* "brlk" */
int br_index_lock_blob(br_index *idx, const uint8_t digest[BR_SHA256_LEN], int lock, br_err *err);

/* Work that runs once cluster-wide: take (1) or give back (0) the lease `which` (a
 * BR_INDEX_LEASE_*). On PostgreSQL a session advisory lock on (BR_INDEX_LEASE_CLASS, which) held
 * on a connection of its own (a node that dies loses it with its session); on LMDB always had.
 * take: 1 taken, 0 another node holds it, or a negative code + err. Give back: 0. */
#define BR_INDEX_LEASE_CLASS 0x62726c73 /* "brls" */
#define BR_INDEX_LEASE_RECONCILE 1
#define BR_INDEX_LEASE_DRAIN 2 /* a pass of the drain of old copies */
int br_index_lease(br_index *idx, int which, int take, br_err *err);
/* Whether any node (this one included) holds the lease `which` now, without taking it: 1 held,
 * 0 not (always on LMDB), or a negative code + err. */
int br_index_lease_held(br_index *idx, int which, br_err *err);

/* Where the index's writes stand. seq is a number every committed write changes (any write:
 * records, purges, counters), so that equal numbers read at two moments mean no write committed in
 * between; commits counts the transactions this process's writer committed, and others is the
 * value commits had after the last of them holding a write other than changes flagged
 * by_reconcile and CDN purge bookkeeping. */
typedef struct br_index_mark {
  uint64_t seq, commits, others;
} br_index_mark;

/* Reads the mark (all three at one moment: never between a commit and its count): 0, 1 when the
 * backend keeps no change number (PostgreSQL), or a negative code + err. */
int br_index_change_mark(br_index *idx, br_index_mark *out, br_err *err);

/* 1 when every transaction committed between marks a and b (read in that order) was this
 * process's writer's and held nothing but changes flagged by_reconcile and CDN purge bookkeeping;
 * else 0. */
int br_index_only_reconcile_since(const br_index_mark *a, const br_index_mark *b);

/* ---- shared state (PostgreSQL only) -----------------------------------------------------------
 * What every node must answer alike (reconcile's reports and per-run lists): bytes by key in one
 * table, each call its own durable transaction, beside the index rather than in its writer's
 * batches. br_index_has_shared: 1 when the index offers it (never on LMDB: the caller keeps its
 * own). The others as backend.h's kv_* and next_id: 0 (get: 1 absent) or a negative code + err;
 * a scan's fn gets each key and value (valid during the call) and stops it returning non-zero. */
int br_index_has_shared(br_index *idx);
int br_index_shared_put(br_index *idx, const void *key, size_t klen, const void *val, size_t vlen,
                        br_err *err);
int br_index_shared_get(br_index *idx, const void *key, size_t klen, char **val, size_t *vlen,
                        br_err *err);
typedef int (*br_index_kv_fn)(void *ud, const uint8_t *key, size_t klen, const void *val,
                              size_t vlen);
int br_index_shared_scan(br_index *idx, const void *from, size_t flen, const void *to, size_t tlen,
                         int desc, br_index_kv_fn fn, void *ud, br_err *err);
int br_index_shared_del(br_index *idx, const void *from, size_t flen, const void *to, size_t tlen,
                        br_err *err);
int br_index_next_id(br_index *idx, uint64_t *id, br_err *err);

/* ---- reconcile's data-file cache (PostgreSQL only) ---------------------------------------------
 * Each data file's hashes by file id (32 bytes), as chunks of raw digests, so that whichever node
 * runs the next reconcile (or answers why-alive) finds what another node read. Chunk 0 is written
 * last and carries the number of chunks: an entry without it is not there. br_index_has_fcache:
 * 1 when the index keeps it (never on LMDB: the caller keeps its own). fcache_put: writes chunk
 * (chunks: the entry's chunk count, chunk 0 only). fcache_get: 0 with *val malloc'd (*len bytes;
 * *chunks for chunk 0), 1 absent. fcache_prune: drops the entries whose id is not among
 * keep[0..n) (32 bytes each). Each call its own transaction; 0 or a negative code + err. */
int br_index_has_fcache(br_index *idx);
int br_index_fcache_put(br_index *idx, const uint8_t id[BR_SHA256_LEN], uint32_t chunk,
                        uint32_t chunks, const void *hashes, size_t len, br_err *err);
int br_index_fcache_get(br_index *idx, const uint8_t id[BR_SHA256_LEN], uint32_t chunk, void **val,
                        size_t *len, uint32_t *chunks, br_err *err);
int br_index_fcache_prune(br_index *idx, const uint8_t *keep, size_t n, br_err *err);

/* ---- direct-upload plans (PostgreSQL only) ---------------------------------------------------
 * The plans handed to clients (POST /v1/uploads), one row each in the database, so that any node
 * sweeps what a node that never came back left: a plan's age is counted on the database's clock.
 * br_index_has_plans: 1 when the index keeps them (never on LMDB: core/direct_plans.c journals
 * them). plans_add: records plans[0..n) in one statement (all or none; id and younger unused).
 * plans_forget: removes the plans of digest with upload_id ("" single part), only row id when id
 * is not 0. plans_claim: claims up to max plans older than grace_ms that no live claim holds,
 * for claim_ms (rows another node is claiming are skipped, not waited for), and passes each to
 * fn (valid during the call; younger: another plan of the blob is within the grace). Returns how
 * many. plans_count: the plans recorded. Each call its own transaction; else a negative code +
 * err. */
typedef struct br_index_plan {
  uint64_t id; /* the row (claims) */
  uint8_t digest[BR_SHA256_LEN];
  const char *store, *key, *upload_id; /* upload_id "" for a single presigned PUT */
  int younger;
} br_index_plan;
typedef int (*br_index_plan_fn)(void *ud, const br_index_plan *plan);
int br_index_has_plans(br_index *idx);
int br_index_plans_add(br_index *idx, const br_index_plan *plans, size_t n, br_err *err);
int br_index_plans_forget(br_index *idx, const uint8_t digest[BR_SHA256_LEN], const char *upload_id,
                          uint64_t id, br_err *err);
int br_index_plans_claim(br_index *idx, uint64_t grace_ms, uint64_t claim_ms, size_t max,
                         br_index_plan_fn fn, void *ud, br_err *err);
int br_index_plans_count(br_index *idx, uint64_t *n, br_err *err);

/* ---- jobs (PostgreSQL only) -------------------------------------------------------------------
 * The job engine's migrate and import jobs (core/jobs.c), one row each, so that every node shows
 * the same jobs and any node takes over a job whose runner is gone. A row is active (queued or
 * running) until it ends; at most one active row per source store (a unique index). The node
 * running a job holds its lease: owner + expiry on the database's clock, renewed with each save;
 * a job no live lease holds is claimed by the first node that asks (rows being claimed are
 * skipped, not waited for). doc is the job's JSON (without its id). br_index_has_jobs: 1 when the
 * index keeps them (never on LMDB: core/jobs.c keeps them under DATA_DIR/jobs).
 * job_add: records an active job of source for owner, leased for lease_ms; 0 with *id, 1 when an
 * active job of source is there (fn gets it), and forgets the ended jobs older than the newest
 * keep. job_claim: takes one active job that no live lease holds, for owner and lease_ms (mine:
 * first frees every job owner holds, left by a previous run of the same node); 0 (fn gets it,
 * with its owner before the claim), 1 none. job_save: replaces the doc of job id if owner holds it;
 * active: its lease runs lease_ms more (0: handed back, any node may claim it; owner stays, as the
 * last runner); not active: it has ended. 0 with *cancel (someone asked to cancel it), 1 when owner
 * does not hold it (lost: stop). job_list: the newest jobs first, at most max (id not 0: that one
 * only); returns how many. job_cancel: marks job id as asked to cancel (if active); 0 (fn gets it),
 * 1 no such job. Each call its own transaction; else a negative code + err. Rows given to fn are
 * valid during the call only. */
typedef struct br_index_job {
  uint64_t id;
  const char *doc;   /* the job's JSON as saved */
  const char *owner; /* its last runner ("" when ended or never run) */
  int leased;        /* the owner's lease has not expired */
  int active, cancel;
} br_index_job;
typedef int (*br_index_job_fn)(void *ud, const br_index_job *job);
int br_index_has_jobs(br_index *idx);
int br_index_job_add(br_index *idx, const char *source, const char *doc, const char *owner,
                     uint64_t lease_ms, size_t keep, uint64_t *id, br_index_job_fn fn, void *ud,
                     br_err *err);
int br_index_job_claim(br_index *idx, const char *owner, uint64_t lease_ms, int mine,
                       br_index_job_fn fn, void *ud, br_err *err);
int br_index_job_save(br_index *idx, uint64_t id, const char *owner, const char *doc, int active,
                      uint64_t lease_ms, int *cancel, br_err *err);
int br_index_job_list(br_index *idx, uint64_t id, size_t max, br_index_job_fn fn, void *ud,
                      br_err *err);
int br_index_job_cancel(br_index *idx, uint64_t id, br_index_job_fn fn, void *ud, br_err *err);

/* Stops the writer (after finishing queued operations) and closes the environment. */
void br_index_close(br_index *idx);

/* Looks a blob up. Returns 0 and fills rec; 1 if absent; -1 (or BR_INDEX_UNAVAILABLE) with err
 * on failure. Safe from any thread; readers never wait for the writer. On a shared index the
 * answer may come from the record cache, at most about a second behind another node's commit
 * (usually milliseconds: its change is announced, see br_index_get_latest). */
int br_index_get(br_index *idx, const uint8_t digest[BR_SHA256_LEN], br_record *rec, br_err *err);

/* Looks up the n digests at digests (n * 32 bytes): fn(ud, i, rec) for each i present (in any
 * order; rec valid during the call; non-zero stops with -1). On PostgreSQL one statement per
 * BR_INDEX_GET_MANY digests; on LMDB br_index_get each. Returns 0, or a negative code + err. */
#define BR_INDEX_GET_MANY 1000
typedef int (*br_index_many_fn)(void *ud, size_t i, const br_record *rec);
int br_index_get_many(br_index *idx, const uint8_t *digests, size_t n, br_index_many_fn fn,
                      void *ud, br_err *err);
/* Like br_index_get, but never from a cache that may lag another node's commit (on a shared
 * index the record cache is at most PGL_BOUND_MS behind): for decisions taken under the blob's
 * lock (br_index_lock_blob) that delete bytes or change locations. */
int br_index_get_latest(br_index *idx, const uint8_t digest[BR_SHA256_LEN], br_record *rec,
                        br_err *err);

/* Records an acknowledged upload, durably, before returning. If the blob is absent (or being
 * deleted: its record is replaced, its bytes were written again), rec is
 * inserted and *created = 1. If present, last_upload_ms is set to rec->last_upload_ms, a
 * quarantined blob is restored to live, rec's primary location is added when the record has none
 * in that store, and *created = 0; *stored receives the resulting record if non-NULL.
 * Returns 0, BR_INDEX_FULL, BR_INDEX_NO_SPACE, BR_INDEX_KEY_TAKEN, or -1 with err. Blocks until
 * the batch holding it is committed. */
int br_index_record_upload(br_index *idx, const uint8_t digest[BR_SHA256_LEN], const br_record *rec,
                           int *created, br_record *stored, br_err *err);

/* Records a dedup hit: sets last_upload_ms to now_ms (never backwards) on a record that exists
 * and is live, durably, before returning. Returns 0; 1 if the blob is absent or quarantined
 * (nothing changed: the caller must take the bytes as a new upload); BR_INDEX_FULL;
 * BR_INDEX_NO_SPACE; -1 + err. */
int br_index_touch(br_index *idx, const uint8_t digest[BR_SHA256_LEN], uint64_t now_ms,
                   br_err *err);

/* State changes decided elsewhere (reconcile, admin) and re-checked inside the writer's
 * transaction against the record as it is then, so that an upload or dedup hit that came in
 * meanwhile always wins. */
enum br_change_kind {
  BR_CHANGE_QUARANTINE, /* live and last_upload_ms < cutoff_ms -> quarantined(reason) */
  BR_CHANGE_RESTORE,    /* quarantined (by reconcile) -> live */
  BR_CHANGE_HOLD,       /* live or quarantined -> held(reason) */
  BR_CHANGE_RELEASE,    /* quarantined or held -> live, last_upload_ms = now (a fresh grace) */
  BR_CHANGE_REMOVE,     /* quarantined, held or deleting, state_ms == expect_state_ms,
                           state_ms < cutoff_ms -> the record is deleted */
  BR_CHANGE_MARK_DELETE /* quarantined or held, state_ms == expect_state_ms, state_ms < cutoff_ms
                           -> deleting (state_ms = now): the first step of a delete for good */
};
typedef struct br_change {
  uint8_t digest[BR_SHA256_LEN];
  enum br_change_kind kind;
  uint64_t cutoff_ms;
  uint64_t expect_state_ms;
  const char *reason; /* QUARANTINE, HOLD */
  int by_reconcile;   /* a decision of the reconcile run (see br_index_only_reconcile_since) */
  int applied;        /* out: 1 changed, 0 not eligible any more (or absent) */
  br_record before;   /* out: the record as the writer found it (when present) */
} br_change;

/* Applies n changes, each in the writer's transaction (batched with other writes), durably,
 * before returning. Each change's outcome is in its `applied`. now_ms is the state change time.
 * Returns 0, BR_INDEX_FULL, BR_INDEX_NO_SPACE, or -1 + err (the first failure). */
int br_index_apply_changes(br_index *idx, br_change *changes, size_t n, uint64_t now_ms,
                           br_err *err);

/* Location changes (moves, drains, imports), re-checked inside the writer's transaction against
 * the record as it is then. For a location with role draining, verified_at_ms holds when it
 * started draining (its bytes were verified when it was primary; the record format is unchanged).
 */
enum br_loc_kind {
  BR_LOC_SWITCH, /* primary is expect (store, key) -> `to` becomes the primary (replacing any
                    location with the same store and key), the old primary becomes draining since
                    now_ms; to == expect: only its verified_at_ms is refreshed */
  BR_LOC_DROP,   /* a location equal to expect (store, key) with role draining and verified_at_ms
                    == expect.verified_at_ms < cutoff_ms -> removed from the record */
  BR_LOC_INSERT  /* absent -> rec is inserted (an import) */
};
enum br_loc_outcome {
  BR_LOC_APPLIED = 0,
  BR_LOC_ABSENT,    /* no such record (SWITCH, DROP) */
  BR_LOC_CONFLICT,  /* SWITCH: the primary is not expect; DROP: no longer draining as expected */
  BR_LOC_EXISTS,    /* INSERT: the record exists and already has rec's primary (store, key) */
  BR_LOC_DUPLICATE, /* INSERT: the record exists with other locations (nothing changed) */
  BR_LOC_FULL,      /* SWITCH: no room for another location */
  BR_LOC_KEY_TAKEN  /* INSERT, SWITCH: the new (store, key) is another record's (invariant 10) */
};
typedef struct br_loc_change {
  uint8_t digest[BR_SHA256_LEN];
  enum br_loc_kind kind;
  br_location expect;          /* SWITCH, DROP */
  br_location to;              /* SWITCH (its role is ignored: primary) */
  const br_record *rec;        /* INSERT */
  uint64_t cutoff_ms;          /* DROP */
  enum br_loc_outcome outcome; /* out */
  br_record after;             /* out: the record after the change (or as found, when present) */
} br_loc_change;

/* Applies n location changes, each in the writer's transaction (batched), durably, before
 * returning. Returns 0 (outcomes in each change), BR_INDEX_FULL, BR_INDEX_NO_SPACE, or -1 + err. */
int br_index_apply_locations(br_index *idx, br_loc_change *changes, size_t n, uint64_t now_ms,
                             br_err *err);

/* Who owns (store, key): each store key belongs to at most one record (invariant 10), kept in a
 * reverse map written in the same transactions as the records. Returns 0 and the owner's digest
 * in owner; 1 if no record has that location; 2 if several records had it when an older index was
 * upgraded (owner zeroed: such bytes must never be deleted); -1 + err (also when a read-only open
 * finds an index not upgraded yet). Before deleting bytes, check that the owner is the blob. */
int br_index_key_owner(br_index *idx, const char *store, const char *key,
                       uint8_t owner[BR_SHA256_LEN], br_err *err);

/* Calls fn for every record in key order, inside one read transaction; fn returns non-zero to
 * stop. Returns 0, or -1 with err. */
typedef int (*br_index_each_fn)(void *ud, const uint8_t digest[BR_SHA256_LEN],
                                const br_record *rec);
int br_index_foreach(br_index *idx, br_index_each_fn fn, void *ud, br_err *err);
/* Like br_index_foreach, but starting after the key `after` (NULL: from the first). */
int br_index_foreach_after(br_index *idx, const uint8_t *after, br_index_each_fn fn, void *ud,
                           br_err *err);

/* Most records one br_index_list_after call looks at (a state filter may skip many). */
#define BR_INDEX_LIST_MAX_SCAN 100000

/* One page of the index in key order: calls fn for at most limit records whose key is greater
 * than after (NULL: from the first key) and whose state is `state` (-1: any; BR_STATE_QUARANTINED
 * includes BR_STATE_HELD), all inside one read
 * transaction (a consistent snapshot of the page). At most BR_INDEX_LIST_MAX_SCAN records are
 * looked at, so a filtered page may hold fewer than limit records. When records remain after the
 * page, *has_next = 1 and next holds the last key looked at: the next page starts after it.
 * The digest and record passed to fn are valid only during the call; fn returning non-zero is an
 * error. Returns 0, or -1 with err (*has_next = 0). */
int br_index_list_after(br_index *idx, const uint8_t *after, size_t limit, int state,
                        br_index_each_fn fn, void *ud, uint8_t next[BR_SHA256_LEN], int *has_next,
                        br_err *err);

/* ---- pending CDN purges ---------------------------------------------------------------------
 * With queue_purges, every change that makes a CDN's copy of a blob stale (QUARANTINE, HOLD and
 * REMOVE applied; SWITCH to another place) writes a pending purge of the blob in the same write
 * transaction (a `purges` sub-database), so that a crash cannot lose it. The purger reads them
 * and settles each once every CDN acknowledged it. Queuing a blob again resets its entry. */
#define BR_MAX_PURGE_CDNS 32 /* bits of br_purge.acked */

typedef struct br_purge {
  uint8_t digest[BR_SHA256_LEN];
  uint64_t queued_ns; /* when it was queued (identifies this queuing) */
  uint64_t next_ms;   /* not to be tried before (backoff) */
  uint32_t attempts;  /* failed tries so far */
  uint32_t acked;     /* bit i: CDN i (in config order) acknowledged it */
  int done;           /* br_index_settle_purges' input: 1 = remove it, 0 = store the fields */
} br_purge;

/* Queues a purge of each of the n digests, durably, before returning (also without
 * queue_purges: the upgrade from the old purge queue uses it). Returns 0, BR_INDEX_FULL,
 * BR_INDEX_NO_SPACE, or -1 + err. */
int br_index_queue_purges(br_index *idx, const uint8_t (*digests)[BR_SHA256_LEN], size_t n,
                          br_err *err);

/* Copies up to max pending purges that are due at now_ms into out, in digest order starting
 * after `after` (NULL: the first), looking at no more than BR_INDEX_PURGE_SCAN entries. *next
 * receives the last digest looked at and *wrapped = 1 when the scan reached the end (start from
 * NULL next time). On PostgreSQL the purges returned are claimed for this node (other nodes skip
 * them, FOR UPDATE SKIP LOCKED) until settled or until purge_claim_ms passes (a killed node's
 * claims then go to another node); `after` is unused there and *wrapped is 1. Returns how many
 * were copied, or -1 + err. */
#define BR_INDEX_PURGE_SCAN 10000
int br_index_purges_due(br_index *idx, const uint8_t *after, uint64_t now_ms, br_purge *out,
                        size_t max, uint8_t next[BR_SHA256_LEN], int *wrapped, br_err *err);

/* Settles n purges as read by br_index_purges_due, in one durable transaction: an entry still
 * holding the same queuing (queued_ns) is removed (done) or gets attempts, next_ms and acked;
 * one queued again meanwhile is left alone. Returns 0, BR_INDEX_FULL, BR_INDEX_NO_SPACE, -1. */
int br_index_settle_purges(br_index *idx, const br_purge *purges, size_t n, br_err *err);

/* ---- exact per-state counters ----------------------------------------------------------------
 * Blobs and bytes by state, in all (store "") and per store (a blob with a location in a store
 * counts once there, whatever its role), kept by the writer in the same transactions that change
 * the records (a `counts` sub-database on LMDB), so that reading them never walks the index.
 * The arithmetic is in server/index/counts.c. */
#define BR_COUNTS_STATES 4
#define BR_COUNTS_MAX (4 * (1 + 2 * 32)) /* (all + twice BR_MAX_STORES stores) x states */

typedef struct br_count {
  char store[BR_MAX_STORE_NAME + 1]; /* "" for all stores */
  int state;                         /* an enum br_state */
  int64_t blobs, bytes;
} br_count;

typedef struct br_counts {
  size_t n;
  int overflow; /* an entry did not fit (more stores than BR_COUNTS_MAX allows): inexact */
  br_count c[BR_COUNTS_MAX];
} br_counts;

void br_counts_clear(br_counts *c);
/* Adds (blobs, bytes) to the entry (store, state), creating it. 0, or -1 (overflow set) when the
 * table is full. */
int br_counts_add(br_counts *c, const char *store, int state, int64_t blobs, int64_t bytes);
/* The entry (store, state), or NULL. */
const br_count *br_counts_find(const br_counts *c, const char *store, int state);
/* Adds the change of a record from old (NULL: absent) to next (NULL: deleted). */
void br_counts_change(br_counts *c, const br_record *old, const br_record *next);
/* Adds every entry of d to c. */
void br_counts_merge(br_counts *c, const br_counts *d);
/* How many entries differ between a and b (an entry missing on one side counts as zero). */
size_t br_counts_diff(const br_counts *a, const br_counts *b);

/* The stored counters in out (read from one snapshot, any thread). Returns 0; 1 when the index
 * keeps none (PostgreSQL, or a read-only open of an index from before them, not recounted yet);
 * -1 + err. */
int br_index_counts(br_index *idx, br_counts *out, br_err *err);

/* Recounts every record by state and compares with the stored counters: found receives the
 * recount, stored the counters as they were. With repair (a writable index), the recount replaces
 * them in the writer's transaction, so that no write is lost between the walk and the repair.
 * Returns the number of entries that differed (a missing set of counters differs by one at
 * least), or -1 + err. */
int br_index_recount(br_index *idx, int repair, br_counts *found, br_counts *stored, br_err *err);

/* Counters for /metrics and the benchmark. */
typedef struct br_index_stats {
  uint64_t commits;  /* write transactions committed */
  uint64_t ops;      /* operations applied */
  uint64_t entries;  /* records in the index (LMDB; 0 on PostgreSQL: see the counters) */
  uint64_t map_size; /* bytes */
  uint64_t map_used; /* bytes in use (last page number * page size) */
  uint64_t cache_hits, cache_misses; /* reads (br_index_get, each hash of br_index_get_many)
                                        answered from the record cache or not */
  uint64_t cache_entries;            /* the record cache's size in entries (0: none) */
  uint64_t stale_readers;            /* reader slots of dead processes cleared (mdb_reader_check) */
  uint64_t purges_pending; /* blobs with a CDN purge not yet acknowledged (LMDB; else 0) */
  /* a shared index: other nodes' change notifications heard, cache flushes (listener
   * (re)connections, big batches, bad payloads), listener connections made; point reads answered
   * by the read replica, and those absent there and asked of the primary */
  uint64_t notifies, flushes, listens;
  uint64_t replica_reads, replica_retries;
  uint64_t round_trips; /* PostgreSQL: the writer's waits for the database (0 on LMDB) */
  uint64_t full_walks;  /* scans of every record from the first key (foreach, recounts) */
} br_index_stats;
/* Cheap counters: on PostgreSQL no statement runs (entries and purges_pending stay 0). */
void br_index_get_stats(br_index *idx, br_index_stats *out);
/* Blobs with a CDN purge not yet acknowledged everywhere (on PostgreSQL one count(*) statement). */
uint64_t br_index_purges_pending(br_index *idx);

#endif
