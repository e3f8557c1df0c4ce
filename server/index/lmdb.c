/* The index's LMDB backend: lock-free reads on per-thread reusable read transactions, the
 * writer's transaction, the store-key map (built once for older indexes) and stale-reader checks.
 */
#include "backend.h"

#include <errno.h>
#include <inttypes.h>
#include <lmdb.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

struct idx_backend {
  MDB_env *env;
  MDB_dbi dbi;
  MDB_dbi keys;   /* the reverse map: SHA-256(store NUL key) -> owner digest (see KEYS_*) */
  int has_keys;   /* 0 only in a read-only open of an index not upgraded yet */
  MDB_dbi purges; /* pending CDN purges: digest -> PURGE_VALUE bytes */
  int has_purges; /* 0 only in a read-only open of an index from before it */
  MDB_dbi counts; /* exact per-state counters: store NUL state -> u64 blobs, u64 bytes (LE) */
  int has_counts; /* 0 only in a read-only open of an index from before them */
  MDB_txn *txn;   /* the writer's, between begin and commit/abort */
  unsigned writes_since_check; /* the writer's: write transactions since mdb_reader_check */
  uint64_t last_check_ns;
  atomic_uint_fast64_t stale_readers;
  uint64_t generation; /* distinguishes this index from closed ones in per-thread caches */
  pthread_mutex_t lock;
  /* read transactions cached by threads, aborted at close */
  MDB_txn **readers;
  size_t nreaders, readers_cap;
};

static atomic_uint_fast64_t next_generation = 1;

struct reader_cache {
  uint64_t generation;
  MDB_txn *txn;
};
static __thread struct reader_cache tl_reader;

static int lmdb_fail(br_err *err, const char *what, int rc) {
  br_fail(err, "index: %s: %s", what, mdb_strerror(rc));
  if (rc == MDB_MAP_FULL) return BR_INDEX_FULL;
  return rc == ENOSPC || rc == EDQUOT ? BR_INDEX_NO_SPACE : -1;
}

/* LMDB reports a short write, which is what a file system that fills up in the middle of one
 * gives, as EIO: it is a full volume when next to no space is left there. */
static int volume_full(idx_backend *be) {
  const char *path = NULL;
  struct statvfs vfs;
  return mdb_env_get_path(be->env, &path) == 0 && statvfs(path, &vfs) == 0 &&
         (uint64_t)vfs.f_bavail * vfs.f_frsize < (1u << 20);
}

/* Returns a read transaction ready for use on this thread (renewed from the cache). */
static MDB_txn *reader_begin(idx_backend *be, br_err *err) {
  if (tl_reader.generation == be->generation && tl_reader.txn) {
    int rc = mdb_txn_renew(tl_reader.txn);
    if (rc == 0) return tl_reader.txn;
    lmdb_fail(err, "renew read transaction", rc);
    return NULL;
  }
  MDB_txn *txn = NULL;
  int rc = mdb_txn_begin(be->env, NULL, MDB_RDONLY, &txn);
  if (rc) {
    lmdb_fail(err, "begin read transaction", rc);
    return NULL;
  }
  pthread_mutex_lock(&be->lock);
  if (be->nreaders == be->readers_cap) {
    size_t cap = be->readers_cap ? be->readers_cap * 2 : 16;
    MDB_txn **grown = realloc(be->readers, cap * sizeof *grown);
    if (grown) be->readers = grown, be->readers_cap = cap;
  }
  int cached = be->nreaders < be->readers_cap;
  if (cached) be->readers[be->nreaders++] = txn;
  pthread_mutex_unlock(&be->lock);
  if (cached) {
    tl_reader.generation = be->generation;
    tl_reader.txn = txn;
  }
  return txn;
}

static void reader_end(idx_backend *be, MDB_txn *txn) {
  if (tl_reader.txn == txn && tl_reader.generation == be->generation)
    mdb_txn_reset(txn);
  else
    mdb_txn_abort(txn);
}

static MDB_val key_of(const uint8_t digest[BR_SHA256_LEN]) {
  MDB_val k = {BR_SHA256_LEN, (void *)digest};
  return k;
}

static int lm_get(idx_backend *be, const uint8_t digest[BR_SHA256_LEN], const void **val,
                  size_t *len, void **hold, br_err *err) {
  MDB_txn *txn = reader_begin(be, err);
  if (!txn) return -1;
  MDB_val k = key_of(digest), v;
  int rc = mdb_get(txn, be->dbi, &k, &v);
  if (rc) {
    reader_end(be, txn);
    return rc == MDB_NOTFOUND ? 1 : lmdb_fail(err, "get", rc);
  }
  *val = v.mv_data; /* in the map: valid until the read transaction ends */
  *len = v.mv_size;
  *hold = txn;
  return 0;
}

static void lm_get_done(idx_backend *be, void *hold) { reader_end(be, hold); }

/* Positions cur on the first key after `after` (NULL: the first key). Returns LMDB's code. */
static int cursor_seek_after(MDB_cursor *cur, const uint8_t *after, MDB_val *k, MDB_val *v) {
  if (!after) return mdb_cursor_get(cur, k, v, MDB_FIRST);
  *k = key_of(after);
  int rc = mdb_cursor_get(cur, k, v, MDB_SET_RANGE);
  if (rc == 0 && k->mv_size == BR_SHA256_LEN && !memcmp(k->mv_data, after, BR_SHA256_LEN))
    rc = mdb_cursor_get(cur, k, v, MDB_NEXT);
  return rc;
}

static int lm_scan(idx_backend *be, enum idx_table table, const uint8_t *after, idx_scan_fn fn,
                   void *ud, br_err *err) {
  if (table == IDX_PURGES && !be->has_purges) return 0;
  MDB_txn *txn = reader_begin(be, err);
  if (!txn) return -1;
  MDB_cursor *cur = NULL;
  int rc = mdb_cursor_open(txn, table == IDX_BLOBS ? be->dbi : be->purges, &cur);
  if (rc) {
    reader_end(be, txn);
    return lmdb_fail(err, "open cursor", rc);
  }
  MDB_val k, v;
  for (rc = cursor_seek_after(cur, after, &k, &v); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    if (fn(ud, k.mv_data, k.mv_size, v.mv_data, v.mv_size)) break;
  int out = rc == 0 || rc == MDB_NOTFOUND ? 0 : lmdb_fail(err, "cursor", rc);
  mdb_cursor_close(cur);
  reader_end(be, txn);
  return out;
}

/* ---- the reverse map (store, key) -> digest ---------------------------------------------------
 * Keys are SHA-256(store NUL key) (an object key may be longer than LMDB's 511-byte keys); values
 * the owner's 32-byte digest, or 32 zero bytes for a key that several records had when an older
 * index was upgraded (it is never deleted then). KEYS_DONE, a key of another length, says the
 * map is complete (it is built once, in chunks, when an index without it is opened). */

static const char KEYS_DONE[] = "keys-complete-v1";
static const uint8_t SHARED_OWNER[BR_SHA256_LEN] = {0};

static void place_id(const char *store, const char *key, uint8_t id[BR_SHA256_LEN]) {
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  EVP_DigestInit_ex(c, EVP_sha256(), NULL);
  EVP_DigestUpdate(c, store, strlen(store) + 1);
  EVP_DigestUpdate(c, key, strlen(key));
  EVP_DigestFinal_ex(c, id, NULL);
  EVP_MD_CTX_free(c);
}

/* The owner of l's place in txn: 0 (owner filled), MDB_NOTFOUND, or another LMDB code. */
static int place_owner(idx_backend *be, MDB_txn *txn, const br_location *l,
                       uint8_t owner[BR_SHA256_LEN]) {
  uint8_t id[BR_SHA256_LEN];
  place_id(l->store, l->key, id);
  MDB_val k = {sizeof id, id}, v;
  int rc = mdb_get(txn, be->keys, &k, &v);
  if (rc) return rc;
  if (v.mv_size != BR_SHA256_LEN) return MDB_CORRUPTED;
  memcpy(owner, v.mv_data, BR_SHA256_LEN);
  return 0;
}

static int lm_key_owner(idx_backend *be, const char *store, const char *key,
                        uint8_t owner[BR_SHA256_LEN], br_err *err) {
  if (!be->has_keys) return br_fail(err, "index: no store-key map (open it for writing once)");
  br_location l;
  snprintf(l.store, sizeof l.store, "%s", store);
  snprintf(l.key, sizeof l.key, "%s", key);
  MDB_txn *txn = reader_begin(be, err);
  if (!txn) return -1;
  int rc = place_owner(be, txn, &l, owner);
  reader_end(be, txn);
  if (rc == MDB_NOTFOUND) return 1;
  if (rc) return lmdb_fail(err, "store-key map", rc);
  return memcmp(owner, SHARED_OWNER, BR_SHA256_LEN) ? 0 : 2;
}

/* ---- the writer's primitives ------------------------------------------------------------------
 */

static int absent(int rc) { return rc == MDB_NOTFOUND ? IDX_ABSENT : rc; }

static int lm_rec_get(idx_backend *be, const uint8_t *digest, const void **val, size_t *len) {
  MDB_val k = key_of(digest), v;
  int rc = mdb_get(be->txn, be->dbi, &k, &v);
  if (rc) return absent(rc);
  *val = v.mv_data;
  *len = v.mv_size;
  return 0;
}

static int lm_rec_put(idx_backend *be, const uint8_t *digest, const void *val, size_t len) {
  MDB_val k = key_of(digest), v = {len, (void *)val};
  return mdb_put(be->txn, be->dbi, &k, &v, 0);
}

static int lm_rec_del(idx_backend *be, const uint8_t *digest) {
  MDB_val k = key_of(digest);
  return absent(mdb_del(be->txn, be->dbi, &k, NULL));
}

static int lm_owner_get(idx_backend *be, const br_location *l, uint8_t owner[BR_SHA256_LEN]) {
  return absent(place_owner(be, be->txn, l, owner));
}

static int lm_owner_put(idx_backend *be, const br_location *l, const uint8_t *digest) {
  uint8_t id[BR_SHA256_LEN];
  place_id(l->store, l->key, id);
  MDB_val k = {sizeof id, id}, v = {BR_SHA256_LEN, (void *)digest};
  return mdb_put(be->txn, be->keys, &k, &v, 0);
}

static int lm_owner_del(idx_backend *be, const br_location *l) {
  uint8_t id[BR_SHA256_LEN];
  place_id(l->store, l->key, id);
  MDB_val k = {sizeof id, id};
  return absent(mdb_del(be->txn, be->keys, &k, NULL));
}

static int lm_purge_get(idx_backend *be, const uint8_t *digest, const void **val, size_t *len) {
  MDB_val k = key_of(digest), v;
  int rc = mdb_get(be->txn, be->purges, &k, &v);
  if (rc) return absent(rc);
  *val = v.mv_data;
  *len = v.mv_size;
  return 0;
}

static int lm_purge_put(idx_backend *be, const uint8_t *digest, const void *val, size_t len) {
  MDB_val k = key_of(digest), v = {len, (void *)val};
  return mdb_put(be->txn, be->purges, &k, &v, 0);
}

static int lm_purge_del(idx_backend *be, const uint8_t *digest) {
  MDB_val k = key_of(digest);
  return absent(mdb_del(be->txn, be->purges, &k, NULL));
}

/* ---- exact per-state counters ----------------------------------------------------------------
 * Keys: the store's name (empty for all stores), NUL, the state as one byte; values two u64 (LE),
 * blobs and bytes. COUNTS_DONE, a key without NUL, says they are complete (set by a recount). */

static const char COUNTS_DONE[] = "counts-complete-v1";
#define COUNT_VALUE 16

static size_t count_key(const char *store, int state, uint8_t key[BR_MAX_STORE_NAME + 2]) {
  size_t len = strlen(store);
  memcpy(key, store, len);
  key[len] = 0;
  key[len + 1] = (uint8_t)state;
  return len + 2;
}

static void put_u64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

static int lm_counts_read(idx_backend *be, br_counts *out, br_err *err) {
  br_counts_clear(out);
  if (!be->has_counts) return 1;
  MDB_txn *txn = reader_begin(be, err);
  if (!txn) return -1;
  MDB_val k = {sizeof COUNTS_DONE - 1, (void *)COUNTS_DONE}, v;
  int rc = mdb_get(txn, be->counts, &k, &v);
  MDB_cursor *cur = NULL;
  if (rc == 0) rc = mdb_cursor_open(txn, be->counts, &cur);
  for (int c = rc ? rc : mdb_cursor_get(cur, &k, &v, MDB_FIRST); c == 0;
       c = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    const uint8_t *kb = k.mv_data;
    if (k.mv_size < 2 || k.mv_size > BR_MAX_STORE_NAME + 2 || kb[k.mv_size - 2] != 0 ||
        v.mv_size != COUNT_VALUE)
      continue; /* the marker */
    char store[BR_MAX_STORE_NAME + 1];
    memcpy(store, kb, k.mv_size - 2);
    store[k.mv_size - 2] = 0;
    br_counts_add(out, store, kb[k.mv_size - 1], (int64_t)get_u64(v.mv_data),
                  (int64_t)get_u64((const uint8_t *)v.mv_data + 8));
  }
  if (cur) mdb_cursor_close(cur);
  reader_end(be, txn);
  if (rc == MDB_NOTFOUND) return 1;
  return rc ? lmdb_fail(err, "counters", rc) : 0;
}

static int lm_counts_add(idx_backend *be, const br_counts *delta) {
  for (size_t i = 0; i < delta->n; i++) {
    const br_count *d = &delta->c[i];
    if (!d->blobs && !d->bytes) continue;
    uint8_t key[BR_MAX_STORE_NAME + 2], val[COUNT_VALUE] = {0};
    MDB_val k = {count_key(d->store, d->state, key), key}, v;
    int rc = mdb_get(be->txn, be->counts, &k, &v);
    if (rc == 0 && v.mv_size == COUNT_VALUE) memcpy(val, v.mv_data, COUNT_VALUE);
    if (rc && rc != MDB_NOTFOUND) return rc;
    put_u64(val, get_u64(val) + (uint64_t)d->blobs);
    put_u64(val + 8, get_u64(val + 8) + (uint64_t)d->bytes);
    v = (MDB_val){COUNT_VALUE, val};
    rc = mdb_put(be->txn, be->counts, &k, &v, 0);
    if (rc) return rc;
  }
  return 0;
}

static int lm_counts_set(idx_backend *be, const br_counts *exact) {
  MDB_val done = {sizeof COUNTS_DONE - 1, (void *)COUNTS_DONE};
  int rc;
  if (!exact) {
    rc = mdb_del(be->txn, be->counts, &done, NULL);
    return rc == MDB_NOTFOUND ? 0 : rc;
  }
  rc = mdb_drop(be->txn, be->counts, 0);
  if (!rc) rc = lm_counts_add(be, exact);
  MDB_val empty = {0, (void *)""};
  if (!rc) rc = mdb_put(be->txn, be->counts, &done, &empty, 0);
  return rc;
}

static int lm_txn_scan(idx_backend *be, idx_scan_fn fn, void *ud) {
  MDB_cursor *cur = NULL;
  int rc = mdb_cursor_open(be->txn, be->dbi, &cur);
  if (rc) return rc;
  MDB_val k, v;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
    if (fn(ud, k.mv_data, k.mv_size, v.mv_data, v.mv_size)) break;
  mdb_cursor_close(cur);
  return rc == MDB_NOTFOUND ? 0 : rc;
}

/* Frees the reader slots of dead processes (a killed `blobrefd --fsck` leaves one, pinning its
 * snapshot: no page freed since could be reused, and the map would fill). Returns how many. */
static int clear_stale_readers(idx_backend *be) {
  int dead = 0;
  if (mdb_reader_check(be->env, &dead) != 0 || dead <= 0) return 0;
  atomic_fetch_add(&be->stale_readers, (uint64_t)dead);
  br_warn("index: cleared %d reader slot(s) left by dead processes", dead);
  return dead;
}

#define READER_CHECK_WRITES 64                      /* write transactions between checks */
#define READER_CHECK_NS (2ull * 1000 * 1000 * 1000) /* or this long */

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The writer's periodic check, before a write transaction. */
static void maybe_check_readers(idx_backend *be) {
  uint64_t now = mono_ns();
  if (++be->writes_since_check < READER_CHECK_WRITES && now - be->last_check_ns < READER_CHECK_NS)
    return;
  be->writes_since_check = 0;
  be->last_check_ns = now;
  clear_stale_readers(be);
}

static int lm_begin(idx_backend *be) {
  maybe_check_readers(be);
  be->txn = NULL;
  return mdb_txn_begin(be->env, NULL, 0, &be->txn);
}

static int lm_commit(idx_backend *be) {
  int rc = mdb_txn_commit(be->txn);
  be->txn = NULL;
  return rc;
}

static void lm_abort(idx_backend *be) {
  if (be->txn) mdb_txn_abort(be->txn);
  be->txn = NULL;
}

/* A full map is retried once after stale readers were cleared (their snapshots may hold the
 * pages it lacks). */
static int lm_retry(idx_backend *be, int code, int attempt) {
  return attempt == 0 && code == MDB_MAP_FULL && clear_stale_readers(be) > 0;
}

static int lm_fail(idx_backend *be, int code, const char *what, br_err *err) {
  if (code == EIO && volume_full(be)) code = ENOSPC;
  return lmdb_fail(err, what, code);
}

static int lm_has_purges(idx_backend *be) { return be->has_purges; }

static int lm_ready(idx_backend *be) {
  (void)be;
  return 1;
}

static void lm_stats(idx_backend *be, br_index_stats *out) {
  out->stale_readers = atomic_load(&be->stale_readers);
  MDB_envinfo info;
  MDB_stat st;
  if (mdb_env_info(be->env, &info) == 0 && mdb_env_stat(be->env, &st) == 0) {
    out->map_size = info.me_mapsize;
    out->map_used = (uint64_t)(info.me_last_pgno + 1) * st.ms_psize;
  }
  MDB_txn *txn = NULL;
  if (mdb_txn_begin(be->env, NULL, MDB_RDONLY, &txn) == 0) {
    MDB_stat dst;
    if (mdb_stat(txn, be->dbi, &dst) == 0) out->entries = dst.ms_entries;
    if (be->has_purges && mdb_stat(txn, be->purges, &dst) == 0)
      out->purges_pending = dst.ms_entries;
    mdb_txn_abort(txn);
  }
}

#define BUILD_CHUNK 50000 /* records per transaction while the reverse map is built */

/* Decodes the record at the cursor; an error names the blob. Returns 0 or -1 (err). */
static int decode_at(const MDB_val *k, const MDB_val *v, br_record *rec, br_err *err) {
  if (k->mv_size != BR_SHA256_LEN) return br_fail(err, "index: key of %zu bytes", k->mv_size);
  if (br_record_decode(v->mv_data, v->mv_size, rec, err) == 0) return 0;
  char hex[BR_HEX_LEN + 1], why[sizeof err->msg];
  br_hex_encode(k->mv_data, hex);
  snprintf(why, sizeof why, "%s", err ? err->msg : "");
  return br_fail(err, "%s: %s", hex, why);
}

/* Builds the reverse map once, for an index written before it existed (or whose build was cut
 * short): from scratch, in transactions of BUILD_CHUNK records, then KEYS_DONE. A place several
 * records have gets the shared owner (its bytes are never deleted) and a warning. 0 or -1 + err. */
static int build_places(idx_backend *idx, br_err *err) {
  MDB_txn *txn = NULL;
  MDB_cursor *cur = NULL;
  MDB_val done = {sizeof KEYS_DONE - 1, (void *)KEYS_DONE}, k, v;
  uint8_t last[BR_SHA256_LEN];
  uint64_t records = 0, shared = 0;
  int have_last = 0, out = 0;
  br_record *rec = malloc(sizeof *rec);
  int rc = rec ? mdb_txn_begin(idx->env, NULL, 0, &txn) : ENOMEM;
  if (!rc) rc = mdb_get(txn, idx->keys, &done, &v);
  if (rc == 0) { /* complete already */
    mdb_txn_abort(txn);
    free(rec);
    return 0;
  }
  if (rc == MDB_NOTFOUND) rc = mdb_drop(txn, idx->keys, 0);
  if (!rc) br_info("index: building the store-key map (once, for an index from before it)");
  for (int more = 1; !rc && more;) {
    size_t n = 0;
    if (!txn) rc = mdb_txn_begin(idx->env, NULL, 0, &txn);
    if (!rc) rc = mdb_cursor_open(txn, idx->dbi, &cur);
    if (!rc) rc = cursor_seek_after(cur, have_last ? last : NULL, &k, &v);
    for (; !rc && n < BUILD_CHUNK; n++) {
      if (decode_at(&k, &v, rec, err) < 0) {
        out = -1;
        break;
      }
      memcpy(last, k.mv_data, BR_SHA256_LEN);
      have_last = 1;
      records++;
      for (int i = 0; i < rec->nlocations && !rc; i++) {
        uint8_t owner[BR_SHA256_LEN], id[BR_SHA256_LEN];
        const br_location *l = &rec->locations[i];
        int o = place_owner(idx, txn, l, owner);
        if (o == 0 && !memcmp(owner, last, BR_SHA256_LEN)) continue;
        if (o && o != MDB_NOTFOUND) {
          rc = o;
          break;
        }
        if (o == 0 && memcmp(owner, SHARED_OWNER, BR_SHA256_LEN)) {
          char hex[BR_HEX_LEN + 1];
          br_hex_encode(last, hex);
          br_warn(
              "index: %s:%s is the location of several blobs (%s among them): its bytes will "
              "never be deleted",
              l->store, l->key, hex);
          shared++;
        }
        place_id(l->store, l->key, id);
        MDB_val pk = {sizeof id, id};
        MDB_val pv = {BR_SHA256_LEN, o == 0 ? (void *)SHARED_OWNER : (void *)last};
        rc = mdb_put(txn, idx->keys, &pk, &pv, 0);
      }
      if (!rc) rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    more = rc == 0; /* stopped at BUILD_CHUNK with records left */
    if (rc == MDB_NOTFOUND) rc = 0;
    if (cur) mdb_cursor_close(cur);
    cur = NULL;
    if (out) break;
    if (!rc && !more) {
      MDB_val empty = {0, (void *)""};
      rc = mdb_put(txn, idx->keys, &done, &empty, 0);
    }
    if (!rc) {
      rc = mdb_txn_commit(txn);
      txn = NULL;
    }
  }
  if (txn) mdb_txn_abort(txn);
  free(rec);
  if (out) return -1;
  if (rc) {
    lmdb_fail(err, "building the store-key map", rc);
    return -1;
  }
  br_info("index: store-key map ready (%" PRIu64 " records, %" PRIu64 " shared keys)", records,
          shared);
  return 0;
}

static void lm_close(idx_backend *be) {
  for (size_t i = 0; i < be->nreaders; i++) mdb_txn_abort(be->readers[i]);
  free(be->readers);
  if (be->env) mdb_env_close(be->env);
  pthread_mutex_destroy(&be->lock);
  free(be);
}

static int lm_change_seq(idx_backend *be, uint64_t *seq, br_err *err) {
  MDB_envinfo info;
  int rc = mdb_env_info(be->env, &info);
  if (rc) return br_fail(err, "index: env info: %s", mdb_strerror(rc));
  *seq = (uint64_t)info.me_last_txnid;
  return 0;
}

static const idx_ops lmdb_ops = {
    .name = "lmdb",
    .get = lm_get,
    .get_done = lm_get_done,
    .scan = lm_scan,
    .key_owner = lm_key_owner,
    .stats = lm_stats,
    .change_seq = lm_change_seq,
    .has_purges = lm_has_purges,
    .ready = lm_ready,
    .begin = lm_begin,
    .commit = lm_commit,
    .abort = lm_abort,
    .retry = lm_retry,
    .fail = lm_fail,
    .rec_get = lm_rec_get,
    .rec_put = lm_rec_put,
    .rec_del = lm_rec_del,
    .owner_get = lm_owner_get,
    .owner_put = lm_owner_put,
    .owner_del = lm_owner_del,
    .purge_get = lm_purge_get,
    .purge_put = lm_purge_put,
    .purge_del = lm_purge_del,
    .counts_read = lm_counts_read,
    .counts_add = lm_counts_add,
    .counts_set = lm_counts_set,
    .txn_scan = lm_txn_scan,
    .close = lm_close,
};

idx_backend *idx_lmdb_open(const char *dir, const br_index_options *opt, const idx_ops **ops,
                           br_err *err) {
  idx_backend *be = calloc(1, sizeof *be);
  if (!be) {
    br_fail(err, "out of memory");
    return NULL;
  }
  be->generation = atomic_fetch_add(&next_generation, 1);
  pthread_mutex_init(&be->lock, NULL);
  MDB_txn *txn = NULL;
  int rc;
  if (!opt->read_only && mkdir(dir, 0755) < 0 && errno != EEXIST) {
    br_fail(err, "index: cannot create %s: %s", dir, strerror(errno));
    goto fail;
  }
  if ((rc = mdb_env_create(&be->env)) || (rc = mdb_env_set_maxdbs(be->env, 8)) ||
      (rc = mdb_env_set_maxreaders(be->env, 4096)) ||
      (rc = mdb_env_set_mapsize(be->env, (size_t)opt->map_size))) {
    lmdb_fail(err, "create environment", rc);
    goto fail;
  }
  rc = mdb_env_open(be->env, dir, MDB_NOTLS | (opt->read_only ? MDB_RDONLY : 0), 0644);
  if (rc) {
    br_fail(err, "index: open %s: %s", dir, mdb_strerror(rc));
    goto fail;
  }
  if (!opt->read_only) clear_stale_readers(be);
  rc = mdb_txn_begin(be->env, NULL, opt->read_only ? MDB_RDONLY : 0, &txn);
  if (!rc) rc = mdb_dbi_open(txn, "blobs", opt->read_only ? 0 : MDB_CREATE, &be->dbi);
  if (!rc) {
    int krc = mdb_dbi_open(txn, "keys", opt->read_only ? 0 : MDB_CREATE, &be->keys);
    if (krc == 0)
      be->has_keys = 1;
    else if (krc != MDB_NOTFOUND || !opt->read_only)
      rc = krc;
  }
  if (!rc) {
    int prc = mdb_dbi_open(txn, "purges", opt->read_only ? 0 : MDB_CREATE, &be->purges);
    if (prc == 0)
      be->has_purges = 1;
    else if (prc != MDB_NOTFOUND || !opt->read_only)
      rc = prc;
  }
  if (!rc) {
    int crc = mdb_dbi_open(txn, "counts", opt->read_only ? 0 : MDB_CREATE, &be->counts);
    if (crc == 0)
      be->has_counts = 1;
    else if (crc != MDB_NOTFOUND || !opt->read_only)
      rc = crc;
  }
  if (!rc) {
    rc = mdb_txn_commit(txn);
    txn = NULL;
  }
  if (rc) {
    if (txn) mdb_txn_abort(txn);
    lmdb_fail(err, "open databases 'blobs', 'keys', 'purges' and 'counts'", rc);
    goto fail;
  }
  if (!opt->read_only && build_places(be, err) < 0) goto fail;
  *ops = &lmdb_ops;
  return be;
fail:
  lm_close(be);
  return NULL;
}
