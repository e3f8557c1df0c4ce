/* Private to server/index: the small storage interface the shared index code (record cache,
 * writer, decisions) runs on, implemented by LMDB (lmdb.c) and PostgreSQL (pg.c). */
#ifndef BLOBREF_INDEX_BACKEND_H
#define BLOBREF_INDEX_BACKEND_H

#include "blobref/index.h"

/* A writer primitive found nothing (distinct from LMDB codes, errno values and index codes). */
#define IDX_ABSENT 1000000
/* A PostgreSQL failure that spoils the transaction (the message is kept by the backend). */
#define IDX_PG_FAILED 1000001
/* A PostgreSQL conflict with another node's transaction (unique violation, deadlock): the batch
 * is run again. */
#define IDX_PG_CONFLICT 1000002

#define PURGE_VALUE 24 /* encoded br_purge: u64 queued_ns, u64 next_ms, u32 attempts, u32 acked */

typedef struct idx_backend idx_backend;

enum idx_table { IDX_BLOBS, IDX_PURGES };

/* A scanned entry: key (32 bytes for both tables) and its encoded value, valid during the call.
 * Returns non-zero to stop the scan. */
typedef int (*idx_scan_fn)(void *ud, const uint8_t *key, size_t klen, const void *val, size_t vlen);

/* Read entry points (any thread) answer like the public API: 0, 1 absent, or a negative index
 * code with err. Writer primitives (the writer thread only, between begin and commit or abort)
 * answer 0, IDX_ABSENT, or a code that spoils the transaction (for `fail` to explain). */
typedef struct idx_ops {
  const char *name;
  /* The encoded record of digest in *val (valid until get_done(hold)). */
  int (*get)(idx_backend *be, const uint8_t digest[BR_SHA256_LEN], const void **val, size_t *len,
             void **hold, br_err *err);
  void (*get_done)(idx_backend *be, void *hold);
  /* Optional: the records of up to BR_INDEX_GET_MANY digests (n * 32 bytes) in one round trip,
   * fn(ud, i, val, len) for each present (the klen argument carries i; any order). */
  int (*get_many)(idx_backend *be, const uint8_t *digests, size_t n, idx_scan_fn fn, void *ud,
                  br_err *err);
  /* Entries of table after `after` (NULL: from the first) in key order, from one snapshot. */
  int (*scan)(idx_backend *be, enum idx_table table, const uint8_t *after, idx_scan_fn fn, void *ud,
              br_err *err);
  int (*key_owner)(idx_backend *be, const char *store, const char *key,
                   uint8_t owner[BR_SHA256_LEN], br_err *err);
  /* Cheap figures only (no statement on a shared index: /metrics runs it at each scrape). */
  void (*stats)(idx_backend *be, br_index_stats *out);
  /* Optional: the purges pending, when stats cannot say them cheaply (any thread). */
  uint64_t (*purges_pending)(idx_backend *be);
  int (*has_purges)(idx_backend *be);
  int (*ready)(idx_backend *be); /* 1 when it can serve (the database is reachable) */
  int (*lock_blob)(idx_backend *be, const uint8_t digest[BR_SHA256_LEN], int lock, br_err *err);
  int (*lease)(idx_backend *be, int which, int take, br_err *err);
  /* Optional: 1 when any session holds the lease which, 0 not, a negative code + err. */
  int (*lease_held)(idx_backend *be, int which, br_err *err);

  int (*begin)(idx_backend *be);
  int (*commit)(idx_backend *be);
  void (*abort)(idx_backend *be);
  /* After a spoiled transaction: 1 to run the batch again (attempt counts from 0). */
  int (*retry)(idx_backend *be, int code, int attempt);
  /* Fills err for a spoiled transaction and returns the public code (BR_INDEX_FULL, ...). */
  int (*fail)(idx_backend *be, int code, const char *what, br_err *err);
  /* Tells the other nodes, in the writer's transaction, that the records of digests[0..n)
   * changed (NULL on LMDB: nobody else has a cache). 0 or a code that spoils the transaction. */
  int (*announce)(idx_backend *be, const uint8_t (*digests)[BR_SHA256_LEN], size_t n);
  /* Optional (a backend whose reads cost a round trip): after begin, reads ahead and locks, in
   * this order, the record of each digests[i] and, when places[i] is not NULL, the owner of that
   * place, so that the rec_get and owner_get that follow are answered without waiting. 0 or a
   * code that spoils the transaction. */
  int (*prefetch)(idx_backend *be, const uint8_t (*digests)[BR_SHA256_LEN],
                  const br_location *const *places, size_t n);
  int (*rec_get)(idx_backend *be, const uint8_t digest[BR_SHA256_LEN], const void **val,
                 size_t *len);
  int (*rec_put)(idx_backend *be, const uint8_t digest[BR_SHA256_LEN], const void *val, size_t len);
  int (*rec_del)(idx_backend *be, const uint8_t digest[BR_SHA256_LEN]);
  /* The reverse map (store, key) -> owner digest (invariant 10). */
  int (*owner_get)(idx_backend *be, const br_location *l, uint8_t owner[BR_SHA256_LEN]);
  int (*owner_put)(idx_backend *be, const br_location *l, const uint8_t digest[BR_SHA256_LEN]);
  int (*owner_del)(idx_backend *be, const br_location *l);
  /* Pending purges, their values encoded as PURGE_VALUE bytes. */
  int (*purge_get)(idx_backend *be, const uint8_t digest[BR_SHA256_LEN], const void **val,
                   size_t *len);
  int (*purge_put)(idx_backend *be, const uint8_t digest[BR_SHA256_LEN], const void *val,
                   size_t len);
  int (*purge_del)(idx_backend *be, const uint8_t digest[BR_SHA256_LEN]);
  /* Optional (shared backends; any thread, its own transaction): claims up to max purges due at
   * now_ms that no live claim holds, for claim_ms, and passes each to fn (as scan does). Returns
   * how many, or a negative code + err. A put or a delete of a purge ends its claim. */
  int (*purge_claim)(idx_backend *be, uint64_t now_ms, size_t max, idx_scan_fn fn, void *ud,
                     br_err *err);
  /* Optional (shared backends; any thread, each call its own transaction): state that every
   * node must see, keys and values as bytes. kv_get: 0 with *val malloc'd (NUL-terminated), 1
   * absent. kv_scan: the keys in [from, to) ascending (desc: descending) until fn returns
   * non-zero. kv_del: removes the keys in [from, to). next_id: the next of a cluster-wide
   * sequence (never given twice). 0 or a negative code + err. */
  int (*kv_put)(idx_backend *be, const void *key, size_t klen, const void *val, size_t vlen,
                br_err *err);
  int (*kv_get)(idx_backend *be, const void *key, size_t klen, char **val, size_t *vlen,
                br_err *err);
  int (*kv_scan)(idx_backend *be, const void *from, size_t flen, const void *to, size_t tlen,
                 int desc, idx_scan_fn fn, void *ud, br_err *err);
  int (*kv_del)(idx_backend *be, const void *from, size_t flen, const void *to, size_t tlen,
                br_err *err);
  int (*next_id)(idx_backend *be, uint64_t *id, br_err *err);
  /* Optional (shared backends; any thread): reconcile's data-file cache, as index.h's
   * br_index_fcache_* say. */
  int (*fcache_put)(idx_backend *be, const uint8_t id[BR_SHA256_LEN], uint32_t chunk,
                    uint32_t chunks, const void *hashes, size_t len, br_err *err);
  int (*fcache_get)(idx_backend *be, const uint8_t id[BR_SHA256_LEN], uint32_t chunk, void **val,
                    size_t *len, uint32_t *chunks, br_err *err);
  int (*fcache_prune)(idx_backend *be, const uint8_t *keep, size_t n, br_err *err);
  /* Optional (shared backends; any thread): the direct-upload plans, as index.h's
   * br_index_plans_* say. */
  int (*plans_add)(idx_backend *be, const br_index_plan *plans, size_t n, br_err *err);
  int (*plans_forget)(idx_backend *be, const uint8_t digest[BR_SHA256_LEN], const char *upload_id,
                      uint64_t id, br_err *err);
  int (*plans_claim)(idx_backend *be, uint64_t grace_ms, uint64_t claim_ms, size_t max,
                     br_index_plan_fn fn, void *ud, br_err *err);
  int (*plans_count)(idx_backend *be, uint64_t *n, br_err *err);
  /* Optional (shared backends; any thread): the job engine's jobs, as index.h's br_index_job_*
   * say. */
  int (*job_add)(idx_backend *be, const char *source, const char *doc, const char *owner,
                 uint64_t lease_ms, size_t keep, uint64_t *id, br_index_job_fn fn, void *ud,
                 br_err *err);
  int (*job_claim)(idx_backend *be, const char *owner, uint64_t lease_ms, int mine,
                   br_index_job_fn fn, void *ud, br_err *err);
  int (*job_save)(idx_backend *be, uint64_t id, const char *owner, const char *doc, int active,
                  uint64_t lease_ms, int *cancel, br_err *err);
  int (*job_list)(idx_backend *be, uint64_t id, size_t max, br_index_job_fn fn, void *ud,
                  br_err *err);
  int (*job_cancel)(idx_backend *be, uint64_t id, br_index_job_fn fn, void *ud, br_err *err);
  /* Exact per-state counters (NULL on a backend without them). counts_read (any thread): 0 and
   * the stored counters, 1 when none are kept or they are not complete, or -1 + err. */
  int (*counts_read)(idx_backend *be, br_counts *out, br_err *err);
  /* Writer primitives: add delta to the stored counters; replace them all with exact and mark
   * them complete (exact NULL: mark them incomplete, to be recounted at the next start). */
  int (*counts_add)(idx_backend *be, const br_counts *delta);
  int (*counts_set)(idx_backend *be, const br_counts *exact);
  /* Optional: a number that every committed write transaction changes (LMDB: the last
   * transaction id), for reconcile's unchanged-rerun check. 0, or a negative code + err. */
  int (*change_seq)(idx_backend *be, uint64_t *seq, br_err *err);
  /* Every record as the writer's transaction sees it (fn returns non-zero to stop). */
  int (*txn_scan)(idx_backend *be, idx_scan_fn fn, void *ud);
  void (*close)(idx_backend *be);
} idx_ops;

/* Opens the LMDB backend in dir. NULL + err. */
idx_backend *idx_lmdb_open(const char *dir, const br_index_options *opt, const idx_ops **ops,
                           br_err *err);
/* Opens the PostgreSQL backend on opt->dsn (creating or migrating the schema). NULL + err. */
idx_backend *idx_pg_open(const br_index_options *opt, const idx_ops **ops, br_err *err);

#endif
