/* Reconcile's state between runs, in an LMDB environment of its own (DATA_DIR/reconcile) so that
 * its writes never queue behind or in front of uploads: the data-file cache (each data file's
 * hashes, by file identity, in chunks of at most 65,536), the run reports (JSON by run id) and
 * each run's blob lists (raw digests by run and action, in chunks of at most 16,384). On a shared
 * index (PostgreSQL) the run ids, reports and lists are in the index's shared state instead
 * (keys 'R' + run id, 'L' + list key), so that every node answers the same runs, and the
 * data-file cache is the index's too (br_index_fcache_*), so that any node's run is incremental
 * over any other's. */
#include <errno.h>
#include <lmdb.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "reconcile/internal.h"

#define D BR_SHA256_LEN
#define CHUNK 65536 /* digests per cache value: 2 MiB */
#define KEEP_REPORTS 1000
#define BATCH_ENTRIES 64      /* cache entries per durable commit */
#define LARGE_ENTRY_CHUNKS 16 /* 32 MiB of one entry in a batch at most */

/* Cache entries are written in a nested transaction each (all of an entry or nothing), inside a
 * batch transaction committed every BATCH_ENTRIES entries and before any other write: two syncs
 * per 64 data files instead of four per file. A crash loses at most the uncommitted batch, which
 * the next run reads again. */
struct rstate {
  br_index *shared; /* non-NULL: runs and lists in the index's shared state */
  br_index *fcache; /* non-NULL: the data-file cache in the index (shared), not in env */
  MDB_env *env;
  MDB_dbi files, runs, lists;
  MDB_txn *batch;
  unsigned batch_entries;
};

struct rstate_entry {
  rstate *st;
  MDB_txn *txn; /* nested in st->batch */
  uint8_t id[D];
  uint8_t *buf;
  size_t n;
  uint32_t chunks;
};

static int fail(br_err *err, const char *what, int rc) {
  return br_fail(err, "reconcile state: %s: %s", what, mdb_strerror(rc));
}

rstate *rstate_open(const char *dir, br_index *shared, br_err *err) {
  if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
    br_fail(err, "reconcile state: mkdir %s: %s", dir, strerror(errno));
    return NULL;
  }
  rstate *st = calloc(1, sizeof *st);
  if (!st) {
    br_fail(err, "out of memory");
    return NULL;
  }
  MDB_txn *txn = NULL;
  int rc;
  if ((rc = mdb_env_create(&st->env)) || (rc = mdb_env_set_maxdbs(st->env, 8)) ||
      (rc = mdb_env_set_mapsize(st->env, (size_t)64 << 30)) ||
      (rc = mdb_env_open(st->env, dir, MDB_NOTLS, 0600)) ||
      (rc = mdb_txn_begin(st->env, NULL, 0, &txn)) ||
      (rc = mdb_dbi_open(txn, "files", MDB_CREATE, &st->files)) ||
      (rc = mdb_dbi_open(txn, "runs", MDB_CREATE, &st->runs)) ||
      (rc = mdb_dbi_open(txn, "lists", MDB_CREATE, &st->lists)) || (rc = mdb_txn_commit(txn))) {
    if (txn && rc) mdb_txn_abort(txn);
    fail(err, dir, rc);
    if (st->env) mdb_env_close(st->env);
    free(st);
    return NULL;
  }
  st->shared = shared;
  if (shared && br_index_has_fcache(shared)) st->fcache = shared;
  return st;
}

static int batch_flush(rstate *st, br_err *err) {
  if (!st->batch) return 0;
  int rc = mdb_txn_commit(st->batch);
  st->batch = NULL;
  st->batch_entries = 0;
  return rc ? fail(err, "commit", rc) : 0;
}

void rstate_close(rstate *st) {
  if (!st) return;
  br_err err;
  if (batch_flush(st, &err) < 0) br_warn("%s", err.msg);
  mdb_env_close(st->env);
  free(st);
}

void rstate_file_id(const char *path, int64_t size, int64_t count, const char *column, int form,
                    uint8_t id[D]) {
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  EVP_DigestInit_ex(c, EVP_sha256(), NULL);
  EVP_DigestUpdate(c, path, strlen(path) + 1);
  EVP_DigestUpdate(c, &size, sizeof size);
  EVP_DigestUpdate(c, &count, sizeof count);
  EVP_DigestUpdate(c, column, strlen(column) + 1);
  EVP_DigestUpdate(c, &form, sizeof form);
  EVP_DigestFinal_ex(c, id, NULL);
  EVP_MD_CTX_free(c);
}

/* Key: id, then the chunk number big-endian; chunk 0 is the header (u32 number of chunks). */
static void chunk_key(const uint8_t id[D], uint32_t chunk, uint8_t key[D + 4]) {
  memcpy(key, id, D);
  key[D] = (uint8_t)(chunk >> 24), key[D + 1] = (uint8_t)(chunk >> 16);
  key[D + 2] = (uint8_t)(chunk >> 8), key[D + 3] = (uint8_t)chunk;
}

/* The shared cache's entry of id: fn (non-zero stops) over the hashes of each chunk, chunk 0
 * first. 1 cached (fn called), 0 not, -1 + err (a chunk missing behind its header too). */
static int shared_entry_each(rstate *st, const uint8_t id[D],
                             int (*fn)(void *ud, const uint8_t *hashes, size_t n), void *ud,
                             br_err *err) {
  uint32_t chunks = 0, ignored;
  for (uint32_t c = 0; c == 0 || c < chunks; c++) {
    void *val = NULL;
    size_t len = 0;
    int rc = br_index_fcache_get(st->fcache, id, c, &val, &len, c ? &ignored : &chunks, err);
    if (rc < 0) return -1;
    if (rc == 1) return c ? br_fail(err, "reconcile state: damaged cache entry (chunk %u)", c) : 0;
    int stop =
        len % D ? br_fail(err, "reconcile state: damaged cache chunk") : fn(ud, val, len / D);
    free(val);
    if (stop) return -1;
  }
  return 1;
}

struct each_hash {
  int (*fn)(void *ud, const uint8_t d[D]);
  void *ud;
};

static int each_hash(void *arg, const uint8_t *hashes, size_t n) {
  struct each_hash *e = arg;
  for (size_t i = 0; i < n; i++)
    if (e->fn(e->ud, hashes + i * D) != 0) return 1;
  return 0;
}

int rstate_cached(rstate *st, const uint8_t id[D], int (*fn)(void *ud, const uint8_t d[D]),
                  void *ud, br_err *err) {
  if (st->fcache) {
    struct each_hash e = {fn, ud};
    return shared_entry_each(st, id, each_hash, &e, err);
  }
  MDB_txn *txn = st->batch; /* sees the entries not committed yet */
  int rc = txn ? 0 : mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
  if (rc) return fail(err, "read", rc);
  uint8_t key[D + 4];
  chunk_key(id, 0, key);
  MDB_val k = {sizeof key, key}, v;
  rc = mdb_get(txn, st->files, &k, &v);
  int out = 0;
  if (rc == MDB_NOTFOUND) {
    out = 0;
  } else if (rc) {
    out = fail(err, "read", rc);
  } else if (v.mv_size != 4) {
    out = br_fail(err, "reconcile state: damaged cache header");
  } else {
    const uint8_t *h = v.mv_data;
    uint32_t chunks = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    out = 1;
    for (uint32_t c = 1; c <= chunks && out == 1; c++) {
      chunk_key(id, c, key);
      rc = mdb_get(txn, st->files, &k, &v);
      if (rc || v.mv_size % D) {
        out = rc ? fail(err, "read", rc) : br_fail(err, "reconcile state: damaged cache chunk");
        break;
      }
      for (size_t i = 0; i < v.mv_size / D; i++)
        if (fn(ud, (const uint8_t *)v.mv_data + i * D) != 0) {
          out = -1;
          break;
        }
    }
  }
  if (txn != st->batch) mdb_txn_abort(txn);
  return out;
}

struct holds {
  const uint8_t *want;
  int found;
};

static int holds_chunk(void *arg, const uint8_t *hashes, size_t n) {
  struct holds *h = arg;
  for (size_t i = 0; i < n && !h->found; i++)
    if (!memcmp(hashes + i * D, h->want, D)) h->found = 1;
  return 0; /* whole entry read: a missing chunk is an error, not "without it" */
}

int rstate_cache_holds(rstate *st, const uint8_t id[D], const uint8_t want[D], br_err *err) {
  if (st->fcache) {
    struct holds h = {want, 0};
    int rc = shared_entry_each(st, id, holds_chunk, &h, err);
    return rc < 0 ? -1 : rc == 0 ? 2 : h.found;
  }
  MDB_txn *txn; /* a read transaction of its own: never the run's batch (another thread's) */
  int rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
  if (rc) return fail(err, "read", rc);
  uint8_t key[D + 4];
  chunk_key(id, 0, key);
  MDB_val k = {sizeof key, key}, v;
  rc = mdb_get(txn, st->files, &k, &v);
  int out;
  if (rc == MDB_NOTFOUND) {
    out = 2;
  } else if (rc) {
    out = fail(err, "read", rc);
  } else if (v.mv_size != 4) {
    out = br_fail(err, "reconcile state: damaged cache header");
  } else {
    const uint8_t *h = v.mv_data;
    uint32_t chunks = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    out = 0;
    for (uint32_t c = 1; c <= chunks && out == 0; c++) {
      chunk_key(id, c, key);
      rc = mdb_get(txn, st->files, &k, &v);
      if (rc || v.mv_size % D) {
        out = rc ? fail(err, "read", rc) : br_fail(err, "reconcile state: damaged cache chunk");
        break;
      }
      for (size_t i = 0; i < v.mv_size / D && out == 0; i++)
        if (!memcmp((const uint8_t *)v.mv_data + i * D, want, D)) out = 1;
    }
  }
  mdb_txn_abort(txn);
  return out;
}

static int put_one(rstate *st, MDB_dbi dbi, const void *key, size_t klen, const void *val,
                   size_t vlen, br_err *err) {
  if (batch_flush(st, err) < 0) return -1;
  MDB_txn *txn;
  int rc = mdb_txn_begin(st->env, NULL, 0, &txn);
  if (rc) return fail(err, "write", rc);
  MDB_val k = {klen, (void *)key}, v = {vlen, (void *)val};
  rc = mdb_put(txn, dbi, &k, &v, 0);
  if (rc) {
    mdb_txn_abort(txn);
    return fail(err, "write", rc);
  }
  rc = mdb_txn_commit(txn);
  return rc ? fail(err, "commit", rc) : 0;
}

rstate_entry *rstate_entry_begin(rstate *st, const uint8_t id[D], br_err *err) {
  rstate_entry *e = calloc(1, sizeof *e);
  if (e) e->buf = malloc((size_t)CHUNK * D);
  if (!e || !e->buf) {
    if (e) free(e);
    br_fail(err, "out of memory");
    return NULL;
  }
  e->st = st;
  memcpy(e->id, id, D);
  if (st->fcache) return e; /* chunks written as they fill, chunk 0 (the header) at the commit */
  int rc = st->batch ? 0 : mdb_txn_begin(st->env, NULL, 0, &st->batch);
  if (!rc) rc = mdb_txn_begin(st->env, st->batch, 0, &e->txn);
  if (rc) {
    fail(err, "write", rc);
    free(e->buf);
    free(e);
    return NULL;
  }
  return e;
}

static int flush_chunk(rstate_entry *e, br_err *err) {
  if (!e->n) return 0;
  if (e->st->fcache) { /* chunks 1.. as they fill: invisible until chunk 0 is written */
    int rc = br_index_fcache_put(e->st->fcache, e->id, ++e->chunks, 0, e->buf, e->n * D, err);
    e->n = 0;
    return rc < 0 ? -1 : 0;
  }
  uint8_t key[D + 4];
  chunk_key(e->id, ++e->chunks, key);
  if (!e->txn) { /* a large entry: chunk by chunk, each durable (see below) */
    int rc = put_one(e->st, e->st->files, key, sizeof key, e->buf, e->n * D, err);
    e->n = 0;
    return rc;
  }
  MDB_val k = {sizeof key, key}, v = {e->n * D, e->buf};
  int rc = mdb_put(e->txn, e->st->files, &k, &v, 0);
  e->n = 0;
  if (rc) return fail(err, "write", rc);
  /* An LMDB transaction holds at most 512 MiB of dirty pages: a data file with millions of
   * hashes leaves the batch (what it wrote so far goes in now, still without its header, so
   * still invisible) and writes the rest of its chunks one durable commit each. */
  if (e->chunks >= LARGE_ENTRY_CHUNKS) {
    rc = mdb_txn_commit(e->txn);
    e->txn = NULL;
    if (rc) return fail(err, "write", rc);
    return batch_flush(e->st, err);
  }
  return 0;
}

int rstate_entry_add(rstate_entry *e, const uint8_t d[D], br_err *err) {
  if (e->n == CHUNK && flush_chunk(e, err) < 0) return -1;
  memcpy(e->buf + e->n * D, d, D);
  e->n++;
  return 0;
}

int rstate_entry_commit(rstate_entry *e, br_err *err) {
  if (e->st->fcache) { /* the rest as chunk 0, which makes the entry visible */
    int rc = br_index_fcache_put(e->st->fcache, e->id, 0, e->chunks + 1, e->buf, e->n * D, err);
    free(e->buf);
    free(e);
    return rc < 0 ? -1 : 0;
  }
  int rc = flush_chunk(e, err);
  if (rc == 0) {
    uint8_t key[D + 4], h[4] = {(uint8_t)(e->chunks >> 24), (uint8_t)(e->chunks >> 16),
                                (uint8_t)(e->chunks >> 8), (uint8_t)e->chunks};
    chunk_key(e->id, 0, key);
    if (!e->txn) {
      rc = put_one(e->st, e->st->files, key, sizeof key, h, sizeof h, err);
    } else {
      MDB_val k = {sizeof key, key}, v = {sizeof h, h};
      int mrc = mdb_put(e->txn, e->st->files, &k, &v, 0);
      if (!mrc) {
        mrc = mdb_txn_commit(e->txn); /* into the batch */
        e->txn = NULL;
      }
      if (mrc) rc = fail(err, "write", mrc);
    }
  }
  if (e->txn) mdb_txn_abort(e->txn);
  rstate *st = e->st;
  free(e->buf);
  free(e);
  if (rc == 0 && ++st->batch_entries >= BATCH_ENTRIES) rc = batch_flush(st, err);
  return rc;
}

void rstate_entry_abort(rstate_entry *e) {
  if (!e) return;
  if (e->txn) mdb_txn_abort(e->txn);
  free(e->buf);
  free(e);
}

static int id_kept(const uint8_t *keep, size_t n, const uint8_t *id) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = memcmp(keep + mid * D, id, D);
    if (c == 0) return 1;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return 0;
}

int rstate_prune(rstate *st, const uint8_t *keep, size_t n, br_err *err) {
  if (st->fcache) return br_index_fcache_prune(st->fcache, keep, n, err) < 0 ? -1 : 0;
  if (batch_flush(st, err) < 0) return -1;
  MDB_txn *txn;
  int rc = mdb_txn_begin(st->env, NULL, 0, &txn);
  if (rc) return fail(err, "prune", rc);
  MDB_cursor *cur;
  rc = mdb_cursor_open(txn, st->files, &cur);
  MDB_val k, v;
  int op = MDB_FIRST;
  while (rc == 0 && (rc = mdb_cursor_get(cur, &k, &v, op)) == 0) {
    op = MDB_NEXT;
    if (k.mv_size == D + 4 && !id_kept(keep, n, k.mv_data)) rc = mdb_cursor_del(cur, 0);
  }
  if (rc == MDB_NOTFOUND) rc = 0;
  mdb_cursor_close(cur);
  if (rc) {
    mdb_txn_abort(txn);
    return fail(err, "prune", rc);
  }
  rc = mdb_txn_commit(txn);
  return rc ? fail(err, "prune", rc) : 0;
}

static void id_key(uint64_t id, uint8_t key[8]) {
  for (int i = 0; i < 8; i++) key[i] = (uint8_t)(id >> (56 - 8 * i));
}

/* Shared keys: a tag byte, then the LMDB key. */
#define SHARED_KEY_MAX 16
static size_t shared_key(char tag, const uint8_t *key, size_t len, uint8_t out[SHARED_KEY_MAX]) {
  out[0] = (uint8_t)tag;
  memcpy(out + 1, key, len);
  return len + 1;
}

static uint64_t key_id(const uint8_t *p, size_t len) {
  uint64_t id = 0;
  for (size_t i = 0; i < 8 && i < len; i++) id = id << 8 | p[i];
  return id;
}

/* Drops the shared reports and lists of the runs before `below`. */
static int shared_prune(rstate *st, uint64_t below, br_err *err) {
  uint8_t lo[8] = {0}, hi[8], from[SHARED_KEY_MAX], to[SHARED_KEY_MAX];
  id_key(below, hi);
  size_t fl = shared_key('R', lo, 8, from), tl = shared_key('R', hi, 8, to);
  int rc = br_index_shared_del(st->shared, from, fl, to, tl, err);
  fl = shared_key('L', lo, 8, from), tl = shared_key('L', hi, 8, to);
  return rc ? rc : br_index_shared_del(st->shared, from, fl, to, tl, err);
}

uint64_t rstate_next_run_id(rstate *st, br_err *err) {
  if (st->shared) {
    uint64_t id = 0;
    return br_index_next_id(st->shared, &id, err) < 0 ? 0 : id;
  }
  MDB_txn *txn;
  int rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
  if (rc) {
    fail(err, "read", rc);
    return 0;
  }
  MDB_cursor *cur;
  uint64_t next = 1;
  if (mdb_cursor_open(txn, st->runs, &cur) == 0) {
    MDB_val k, v;
    if (mdb_cursor_get(cur, &k, &v, MDB_LAST) == 0 && k.mv_size == 8) {
      const uint8_t *p = k.mv_data;
      uint64_t last = 0;
      for (int i = 0; i < 8; i++) last = last << 8 | p[i];
      next = last + 1;
    }
    mdb_cursor_close(cur);
  }
  mdb_txn_abort(txn);
  return next;
}

int rstate_put_report(rstate *st, uint64_t id, const char *json, br_err *err) {
  uint8_t key[8];
  id_key(id, key);
  if (st->shared) {
    uint8_t sk[SHARED_KEY_MAX];
    size_t kl = shared_key('R', key, 8, sk);
    int rc = br_index_shared_put(st->shared, sk, kl, json, strlen(json), err);
    if (rc == 0 && id > KEEP_REPORTS) { /* keep the newest ones (ids have gaps: a bound) */
      br_err perr;
      if (shared_prune(st, id - KEEP_REPORTS + 1, &perr) < 0)
        br_warn("reconcile state: pruning old reports: %s", perr.msg);
    }
    return rc < 0 ? -1 : 0;
  }
  int rc = put_one(st, st->runs, key, sizeof key, json, strlen(json), err);
  if (rc == 0 && id > KEEP_REPORTS) { /* keep the newest ones */
    MDB_txn *txn;
    if (mdb_txn_begin(st->env, NULL, 0, &txn) == 0) {
      MDB_cursor *cur;
      if (mdb_cursor_open(txn, st->runs, &cur) == 0) {
        MDB_val k, v;
        int op = MDB_FIRST;
        while (mdb_cursor_get(cur, &k, &v, op) == 0) {
          op = MDB_NEXT;
          const uint8_t *p = k.mv_data;
          uint64_t kid = 0;
          for (int i = 0; i < 8 && k.mv_size == 8; i++) kid = kid << 8 | p[i];
          if (kid + KEEP_REPORTS > id) break;
          mdb_cursor_del(cur, 0);
        }
        mdb_cursor_close(cur);
      }
      if (mdb_cursor_open(txn, st->lists, &cur) == 0) { /* and their lists */
        MDB_val k, v;
        int op = MDB_FIRST;
        while (mdb_cursor_get(cur, &k, &v, op) == 0) {
          op = MDB_NEXT;
          const uint8_t *p = k.mv_data;
          uint64_t kid = 0;
          for (int i = 0; i < 8 && k.mv_size >= 8; i++) kid = kid << 8 | p[i];
          if (kid + KEEP_REPORTS > id) break;
          mdb_cursor_del(cur, 0);
        }
        mdb_cursor_close(cur);
      }
      mdb_txn_commit(txn);
    }
  }
  return rc;
}

char *rstate_get_report(rstate *st, uint64_t id, int *found, br_err *err) {
  *found = 0;
  if (st->shared) {
    uint8_t key[8], sk[SHARED_KEY_MAX];
    id_key(id, key);
    size_t kl = shared_key('R', key, 8, sk), len = 0;
    char *out = NULL;
    int rc = br_index_shared_get(st->shared, sk, kl, &out, &len, err);
    *found = rc == 0;
    return rc == 0 ? out : NULL;
  }
  MDB_txn *txn;
  int rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
  if (rc) {
    fail(err, "read", rc);
    return NULL;
  }
  uint8_t key[8];
  id_key(id, key);
  MDB_val k = {sizeof key, key}, v;
  char *out = NULL;
  rc = mdb_get(txn, st->runs, &k, &v);
  if (rc == 0) {
    out = malloc(v.mv_size + 1);
    if (out) {
      memcpy(out, v.mv_data, v.mv_size);
      out[v.mv_size] = '\0';
      *found = 1;
    } else {
      br_fail(err, "out of memory");
    }
  } else if (rc != MDB_NOTFOUND) {
    fail(err, "read", rc);
  }
  mdb_txn_abort(txn);
  return out;
}

struct each_shared {
  int (*fn)(void *ud, uint64_t id, const char *json);
  void *ud;
  size_t limit, n;
  int oom;
};

static int each_shared_report(void *arg, const uint8_t *key, size_t klen, const void *val,
                              size_t vlen) {
  struct each_shared *e = arg;
  if (e->n == e->limit) return 1;
  char *text = malloc(vlen + 1);
  if (!text) return e->oom = 1;
  memcpy(text, val, vlen);
  text[vlen] = '\0';
  int stop = e->fn(e->ud, key_id(key + 1, klen - 1), text);
  free(text);
  e->n++;
  return stop;
}

int rstate_each_report(rstate *st, size_t limit, int (*fn)(void *ud, uint64_t id, const char *json),
                       void *ud, br_err *err) {
  if (st->shared) {
    uint8_t from[1] = {'R'}, to[1] = {'R' + 1};
    struct each_shared e = {.fn = fn, .ud = ud, .limit = limit};
    int rc = br_index_shared_scan(st->shared, from, 1, to, 1, 1, each_shared_report, &e, err);
    if (rc < 0) return -1;
    return e.oom ? br_fail(err, "out of memory") : 0;
  }
  MDB_txn *txn;
  int rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
  if (rc) return fail(err, "read", rc);
  MDB_cursor *cur;
  rc = mdb_cursor_open(txn, st->runs, &cur);
  MDB_val k, v;
  int op = MDB_LAST;
  size_t n = 0;
  int out = 0;
  while (rc == 0 && n < limit && mdb_cursor_get(cur, &k, &v, op) == 0) {
    op = MDB_PREV;
    char *text = malloc(v.mv_size + 1);
    if (!text) {
      out = br_fail(err, "out of memory");
      break;
    }
    memcpy(text, v.mv_data, v.mv_size);
    text[v.mv_size] = '\0';
    const uint8_t *p = k.mv_data;
    uint64_t id = 0;
    for (int i = 0; i < 8 && k.mv_size == 8; i++) id = id << 8 | p[i];
    int stop = fn(ud, id, text);
    free(text);
    n++;
    if (stop) break;
  }
  if (rc == 0) mdb_cursor_close(cur);
  mdb_txn_abort(txn);
  return out;
}

/* ---- per-run blob lists ---------------------------------------------------------------------- */

#define LIST_CHUNK 16384 /* blobs per list value: 512 KiB (640 KiB pending) */
#define LIST_KEY 13      /* run (u64 BE), action (u8), chunk number (u32 BE, from 1) */

static const char *const action_names[RL_NACTIONS] = {"quarantined", "restored", "deleted", "held",
                                                      "pending"};

const char *rstate_action_name(int action) {
  return action >= 0 && action < RL_NACTIONS ? action_names[action] : "?";
}

int rstate_action_parse(const char *name) {
  for (int i = 0; i < RL_NACTIONS; i++)
    if (name && !strcmp(name, action_names[i])) return i;
  return -1;
}

static size_t list_stride(int action) { return action == RL_PENDING ? D + 8 : D; }

static void list_key(uint64_t run, int action, uint32_t chunk, uint8_t key[LIST_KEY]) {
  id_key(run, key);
  key[8] = (uint8_t)action;
  key[9] = (uint8_t)(chunk >> 24), key[10] = (uint8_t)(chunk >> 16);
  key[11] = (uint8_t)(chunk >> 8), key[12] = (uint8_t)chunk;
}

struct rstate_lists {
  rstate *st;
  uint64_t run;
  uint8_t *buf[RL_NACTIONS];
  size_t n[RL_NACTIONS];
  uint32_t chunks[RL_NACTIONS];
  uint64_t count[RL_NACTIONS], bytes;
};

rstate_lists *rstate_lists_begin(rstate *st, uint64_t run, br_err *err) {
  if (batch_flush(st, err) < 0) return NULL;
  rstate_lists *l = calloc(1, sizeof *l);
  if (!l) {
    br_fail(err, "out of memory");
    return NULL;
  }
  l->st = st;
  l->run = run;
  if (st->shared) { /* what a crashed run of this id left (ids are not reused: nothing) */
    uint8_t lo[8], hi[8], from[SHARED_KEY_MAX], to[SHARED_KEY_MAX];
    id_key(run, lo), id_key(run + 1, hi);
    size_t fl = shared_key('L', lo, 8, from), tl = shared_key('L', hi, 8, to);
    if (br_index_shared_del(st->shared, from, fl, to, tl, err) < 0) {
      free(l);
      return NULL;
    }
    return l;
  }
  MDB_txn *txn;
  int rc = mdb_txn_begin(st->env, NULL, 0, &txn);
  if (rc) {
    free(l);
    fail(err, "lists", rc);
    return NULL;
  }
  MDB_cursor *cur = NULL;
  rc = mdb_cursor_open(txn, st->lists, &cur);
  uint8_t prefix[LIST_KEY];
  list_key(run, 0, 0, prefix);
  MDB_val k = {sizeof prefix, prefix}, v;
  int op = MDB_SET_RANGE, dropped = 0;
  while (rc == 0 && (rc = mdb_cursor_get(cur, &k, &v, op)) == 0) {
    op = MDB_NEXT;
    if (k.mv_size < 8 || memcmp(k.mv_data, prefix, 8)) break;
    rc = mdb_cursor_del(cur, 0);
    dropped++;
  }
  if (rc == MDB_NOTFOUND) rc = 0;
  if (cur) mdb_cursor_close(cur);
  if (rc || !dropped) /* nothing left by a crashed run (the usual case): no commit, no sync */
    mdb_txn_abort(txn);
  else
    rc = mdb_txn_commit(txn);
  if (rc) {
    free(l);
    fail(err, "lists", rc);
    return NULL;
  }
  return l;
}

static int lists_flush_one(rstate_lists *l, int a, br_err *err) {
  if (!l->n[a]) return 0;
  uint8_t key[LIST_KEY];
  list_key(l->run, a, ++l->chunks[a], key);
  size_t len = l->n[a] * list_stride(a);
  int rc;
  if (l->st->shared) {
    uint8_t sk[SHARED_KEY_MAX];
    size_t kl = shared_key('L', key, sizeof key, sk);
    rc = br_index_shared_put(l->st->shared, sk, kl, l->buf[a], len, err) < 0 ? -1 : 0;
  } else {
    rc = put_one(l->st, l->st->lists, key, sizeof key, l->buf[a], len, err);
  }
  l->n[a] = 0;
  if (rc == 0) l->bytes += len;
  return rc;
}

int rstate_lists_add(rstate_lists *l, int a, const uint8_t d[D], uint64_t t_ms, br_err *err) {
  if (!l->buf[a] && !(l->buf[a] = malloc(LIST_CHUNK * list_stride(a))))
    return br_fail(err, "out of memory");
  if (l->n[a] == LIST_CHUNK && lists_flush_one(l, a, err) < 0) return -1;
  uint8_t *p = l->buf[a] + l->n[a]++ * list_stride(a);
  memcpy(p, d, D);
  if (a == RL_PENDING)
    for (int i = 0; i < 8; i++) p[D + i] = (uint8_t)(t_ms >> (56 - 8 * i));
  l->count[a]++;
  return 0;
}

int rstate_lists_flush(rstate_lists *l, uint64_t counts[RL_NACTIONS], uint64_t *bytes,
                       br_err *err) {
  if (l->st->shared) { /* each last chunk its own statement */
    int rc = 0;
    for (int a = 0; a < RL_NACTIONS && rc == 0; a++) rc = lists_flush_one(l, a, err);
    for (int a = 0; a < RL_NACTIONS; a++) counts[a] = l->count[a];
    *bytes = l->bytes;
    return rc;
  }
  /* the last chunks of every action in one commit (one sync per run for a small run) */
  int rc = batch_flush(l->st, err);
  MDB_txn *txn = NULL;
  if (rc == 0 && (rc = mdb_txn_begin(l->st->env, NULL, 0, &txn))) rc = fail(err, "lists", rc);
  size_t written = 0;
  for (int a = 0; a < RL_NACTIONS && rc == 0; a++) {
    if (!l->n[a]) continue;
    uint8_t key[LIST_KEY];
    list_key(l->run, a, ++l->chunks[a], key);
    MDB_val k = {sizeof key, key}, v = {l->n[a] * list_stride(a), l->buf[a]};
    int mrc = mdb_put(txn, l->st->lists, &k, &v, 0);
    if (mrc) rc = fail(err, "lists", mrc);
    written += v.mv_size;
    l->n[a] = 0;
  }
  if (txn && rc) mdb_txn_abort(txn);
  if (txn && !rc) {
    int mrc = mdb_txn_commit(txn);
    if (mrc)
      rc = fail(err, "lists", mrc);
    else
      l->bytes += written;
  }
  for (int a = 0; a < RL_NACTIONS; a++) counts[a] = l->count[a];
  *bytes = l->bytes;
  return rc;
}

void rstate_lists_free(rstate_lists *l) {
  if (!l) return;
  for (int a = 0; a < RL_NACTIONS; a++) free(l->buf[a]);
  free(l);
}

struct page_state {
  int action;
  const uint8_t *after;
  size_t limit, given;
  int (*fn)(void *ud, const uint8_t d[D], uint64_t t_ms);
  void *ud;
  int more, out;
  br_err *err;
};

/* Gives the entries of one list chunk past `after`, up to the limit. Non-zero: stop. */
static int page_chunk(struct page_state *ps, const uint8_t *p, size_t len) {
  size_t stride = list_stride(ps->action);
  if (len % stride) {
    ps->out = br_fail(ps->err, "reconcile state: damaged list chunk");
    return 1;
  }
  size_t n = len / stride, i = 0;
  if (ps->after) { /* the first entry past after (entries ascend) */
    size_t lo = 0, hi = n;
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (memcmp(p + mid * stride, ps->after, D) <= 0)
        lo = mid + 1;
      else
        hi = mid;
    }
    i = lo;
  }
  for (; i < n; i++) {
    if (ps->given == ps->limit) {
      ps->more = 1;
      return 1;
    }
    const uint8_t *e = p + i * stride;
    uint64_t t = 0;
    if (ps->action == RL_PENDING)
      for (int j = 0; j < 8; j++) t = t << 8 | e[D + j];
    if (ps->fn(ps->ud, e, t) != 0) {
      ps->out = -1;
      return 1;
    }
    ps->given++;
  }
  return 0;
}

static int page_shared_chunk(void *arg, const uint8_t *key, size_t klen, const void *val,
                             size_t vlen) {
  (void)key, (void)klen;
  return page_chunk(arg, val, vlen);
}

int rstate_list_page(rstate *st, uint64_t run, int action, const uint8_t *after, size_t limit,
                     int (*fn)(void *ud, const uint8_t d[D], uint64_t t_ms), void *ud, int *more,
                     br_err *err) {
  *more = 0;
  if (action < 0 || action >= RL_NACTIONS) return br_fail(err, "no such action");
  struct page_state ps = {
      .action = action, .after = after, .limit = limit, .fn = fn, .ud = ud, .err = err};
  uint8_t key[LIST_KEY];
  list_key(run, action, 1, key);
  if (st->shared) { /* the chunks of (run, action), in order */
    uint8_t end[LIST_KEY], from[SHARED_KEY_MAX], to[SHARED_KEY_MAX];
    list_key(run, action + 1, 0, end);
    size_t fl = shared_key('L', key, sizeof key, from), tl = shared_key('L', end, 9, to);
    if (br_index_shared_scan(st->shared, from, fl, to, tl, 0, page_shared_chunk, &ps, err) < 0)
      return -1;
    *more = ps.more;
    return ps.out;
  }
  MDB_txn *txn;
  int rc = mdb_txn_begin(st->env, NULL, MDB_RDONLY, &txn);
  if (rc) return fail(err, "read", rc);
  MDB_cursor *cur;
  rc = mdb_cursor_open(txn, st->lists, &cur);
  if (rc) {
    mdb_txn_abort(txn);
    return fail(err, "read", rc);
  }
  MDB_val k = {sizeof key, key}, v;
  int op = MDB_SET_RANGE;
  while ((rc = mdb_cursor_get(cur, &k, &v, op)) == 0) {
    op = MDB_NEXT;
    if (k.mv_size != LIST_KEY || memcmp(k.mv_data, key, 9)) break; /* another run or action */
    if (page_chunk(&ps, v.mv_data, v.mv_size)) break;
  }
  int out = ps.out;
  if (rc && rc != MDB_NOTFOUND) out = fail(err, "read", rc);
  *more = ps.more;
  mdb_cursor_close(cur);
  mdb_txn_abort(txn);
  return out;
}

/* ---- the run in progress, for the other nodes ------------------------------------------------ */

int rstate_put_current(rstate *st, const char *json, br_err *err) {
  if (!st->shared) return 0;
  uint8_t k = 'C';
  return br_index_shared_put(st->shared, &k, 1, json, strlen(json), err) < 0 ? -1 : 0;
}

char *rstate_get_current(rstate *st, int *found, br_err *err) {
  *found = 0;
  if (!st->shared) return NULL;
  uint8_t k = 'C';
  char *out = NULL;
  size_t len = 0;
  int rc = br_index_shared_get(st->shared, &k, 1, &out, &len, err);
  *found = rc == 0;
  return rc == 0 ? out : NULL;
}
