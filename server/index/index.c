/* The blob index, whatever its backend: the record cache, and one writer thread
 * that applies queued operations in group commits, deciding each change the same way on LMDB and
 * PostgreSQL (backend.h). */
#include "backend.h"
#include "index/pg_listen.h"
#include "index/pg_replica.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

/* ---- the record cache and reads ------------------------------------------------------------- */

struct op;

/* The record cache: the encoded records of recently read blobs, so that a hot read takes neither
 * a backend read nor a B-tree search. It is exact, never merely recent: the writer, after
 * each commit and before any writer's caller is told, advances `epoch` and then clears the slots
 * of every key its batch wrote. A reader notes the epoch before its backend read and fills a slot
 * only if no commit came in between (under the slot's lock, which the clearing also takes), so a
 * record read from a snapshot older than a commit can never land in the cache after that
 * commit's clearing has passed. On LMDB only blobrefd's own writer writes the index while it runs
 * (--rebuild-index needs the server stopped). On a shared PostgreSQL index the other nodes' writers
 * announce what they changed (LISTEN/NOTIFY, pg_listen.c) and the listener thread clears those
 * slots the same way (epoch first); the cache is used only while the listener is known to be
 * alive (pgl_fresh), so no node serves an answer more than PGL_BOUND_MS older than a change
 * another node acknowledged, and usually a few milliseconds. */
#define RCACHE_WAYS 4 /* a key lives in one set of RCACHE_WAYS slots (least recently used goes) */
#define RCACHE_LOCKS 1024    /* set i is guarded by lock i % RCACHE_LOCKS */
#define RCACHE_MAX_BYTES 320 /* larger records (many locations, long strings) are not cached */

struct rcache_set {
  uint32_t clock;             /* advanced at each use of a slot of the set */
  uint32_t used[RCACHE_WAYS]; /* the clock at the slot's last use */
  uint16_t len[RCACHE_WAYS];  /* 0: empty */
  uint8_t digest[RCACHE_WAYS][BR_SHA256_LEN];
  uint8_t bytes[RCACHE_WAYS][RCACHE_MAX_BYTES];
};

struct rcache {
  atomic_uint_fast64_t epoch;
  atomic_uint_fast64_t hits, misses;
  size_t nsets; /* a power of two */
  pthread_mutex_t locks[RCACHE_LOCKS];
  struct rcache_set *sets;
};

struct br_index {
  const idx_ops *ops;
  idx_backend *be;
  int queue_purges;       /* changes that make CDN copies stale queue a purge */
  uint64_t last_purge_ns; /* the writer's: the last queued_ns given */
  unsigned batch_max;
  pthread_mutex_t lock;
  pthread_cond_t work_cv, done_cv;
  struct op *head, *tail;
  int stopping, has_writer;
  pthread_t writer;
  struct op **batch;                 /* the writer's scratch: batch_max operations */
  uint8_t (*changed)[BR_SHA256_LEN]; /* the writer's scratch: the digests a batch announces */
  const br_location **places;        /* the writer's scratch: the places a batch may take */
  atomic_uint_fast64_t commits, ops_applied;
  pthread_mutex_t mark_lock; /* a commit and its count in mark (br_index_change_mark) together */
  br_index_mark mark;        /* commits and others (seq is the backend's, read under the lock) */
  br_counts *pending; /* the writer's: the counters' change in its transaction (NULL: none kept) */
  struct rcache
      *rcache;          /* NULL for read-only opens (fsck), which have no writer to keep it exact */
  pgl_listener *listen; /* a shared index: other nodes' changes; NULL on LMDB */
  pgr_pool *replica;    /* [index] read_dsn: point reads there when it is current enough */
  atomic_uint_fast64_t replica_reads, replica_retries;
  atomic_uint_fast64_t full_walks; /* scans of every record from the first (br_index_stats) */
  br_index_change_fn on_change;    /* told about the listener's evictions (the blob cache) */
  void *on_change_ud;
};

static size_t rcache_set_of(const struct rcache *rc, const uint8_t digest[BR_SHA256_LEN]) {
  uint64_t h;
  memcpy(&h, digest, sizeof h); /* uniformly random */
  return (size_t)(h & (rc->nsets - 1));
}

static pthread_mutex_t *rcache_lock_of(struct rcache *rc, size_t set) {
  return &rc->locks[set % RCACHE_LOCKS];
}

/* digest's way in set s, or -1 (under the set's lock). */
static int rcache_way(const struct rcache_set *s, const uint8_t digest[BR_SHA256_LEN]) {
  for (int w = 0; w < RCACHE_WAYS; w++)
    if (s->len[w] && !memcmp(s->digest[w], digest, BR_SHA256_LEN)) return w;
  return -1;
}

/* Copies digest's cached encoded record into buf; its length, or 0 when it is not cached. */
static size_t rcache_get(struct rcache *rc, const uint8_t digest[BR_SHA256_LEN],
                         uint8_t buf[RCACHE_MAX_BYTES]) {
  size_t i = rcache_set_of(rc, digest);
  struct rcache_set *s = &rc->sets[i];
  pthread_mutex_t *lock = rcache_lock_of(rc, i);
  pthread_mutex_lock(lock);
  int w = rcache_way(s, digest);
  size_t len = w < 0 ? 0 : s->len[w];
  if (len) {
    memcpy(buf, s->bytes[w], len);
    s->used[w] = ++s->clock;
  }
  pthread_mutex_unlock(lock);
  return len;
}

/* Caches an encoded record read from a snapshot taken after the epoch was `epoch`, unless a
 * commit has come since (it may have changed the record after that snapshot). It takes digest's
 * own slot, else an empty one of its set, else the set's least recently used. */
static void rcache_fill(struct rcache *rc, const uint8_t digest[BR_SHA256_LEN], const void *bytes,
                        size_t len, uint64_t epoch) {
  if (len == 0 || len > RCACHE_MAX_BYTES) return;
  size_t i = rcache_set_of(rc, digest);
  struct rcache_set *s = &rc->sets[i];
  pthread_mutex_t *lock = rcache_lock_of(rc, i);
  pthread_mutex_lock(lock);
  if (atomic_load(&rc->epoch) == epoch) {
    int w = rcache_way(s, digest);
    for (int k = 0; w < 0 && k < RCACHE_WAYS; k++)
      if (!s->len[k]) w = k;
    if (w < 0) {
      w = 0;
      for (int k = 1; k < RCACHE_WAYS; k++) /* the oldest use, modulo the clock's wrap */
        if ((uint32_t)(s->clock - s->used[k]) > (uint32_t)(s->clock - s->used[w])) w = k;
    }
    memcpy(s->digest[w], digest, BR_SHA256_LEN);
    memcpy(s->bytes[w], bytes, len);
    s->len[w] = (uint16_t)len;
    s->used[w] = ++s->clock;
  }
  pthread_mutex_unlock(lock);
}

/* A record cache of at least `entries` slots (0: BR_RECORD_CACHE_DEFAULT), rounded up to a power
 * of two; NULL + err. */
static struct rcache *rcache_new(size_t entries, br_err *err) {
  if (!entries) entries = BR_RECORD_CACHE_DEFAULT;
  size_t nsets = 1;
  while (nsets * RCACHE_WAYS < entries) nsets *= 2;
  struct rcache *rc = calloc(1, sizeof *rc);
  if (rc) rc->sets = calloc(nsets, sizeof *rc->sets);
  if (!rc || !rc->sets) {
    free(rc);
    br_fail(err, "index: out of memory for a record cache of %zu entries", nsets * RCACHE_WAYS);
    return NULL;
  }
  rc->nsets = nsets;
  for (int i = 0; i < RCACHE_LOCKS; i++) pthread_mutex_init(&rc->locks[i], NULL);
  return rc;
}

static void rcache_free(struct rcache *rc) {
  if (!rc) return;
  for (int i = 0; i < RCACHE_LOCKS; i++) pthread_mutex_destroy(&rc->locks[i]);
  free(rc->sets);
  free(rc);
}

/* The record cache, when it may be used now (on a shared index: while the listener is alive). */
static struct rcache *rcache_usable(br_index *idx) {
  if (!idx->rcache || (idx->listen && !pgl_fresh(idx->listen))) return NULL;
  return idx->rcache;
}

/* A read through the cache rc (NULL: none), and the replica unless latest. */
static int get_record(br_index *idx, const uint8_t digest[BR_SHA256_LEN], br_record *rec,
                      br_err *err, struct rcache *rc, int latest) {
  uint64_t epoch = 0;
  if (rc) {
    uint8_t buf[RCACHE_MAX_BYTES];
    size_t len = rcache_get(rc, digest, buf);
    if (len) {
      atomic_fetch_add_explicit(&rc->hits, 1, memory_order_relaxed);
      return br_record_decode(buf, len, rec, err);
    }
    atomic_fetch_add_explicit(&rc->misses, 1, memory_order_relaxed);
    epoch = atomic_load(&rc->epoch); /* before the snapshot is taken */
  }
  const void *val;
  size_t len;
  void *hold;
  /* the replica, once it has replayed what the listener vouches for (read after the epoch, so
   * that a change announced in between either is covered or stops the fill); absent there, or
   * unable to say: the primary answers, so a fresh upload is never reported missing */
  uint64_t lsn = idx->replica && !latest ? pgl_safe_lsn(idx->listen) : 0;
  int on_replica = lsn ? pgr_get(idx->replica, digest, lsn, &val, &len, &hold) : 2;
  if (on_replica == 0) {
    atomic_fetch_add_explicit(&idx->replica_reads, 1, memory_order_relaxed);
    int out = br_record_decode(val, len, rec, err);
    if (out == 0 && rc) rcache_fill(rc, digest, val, len, epoch);
    pgr_done(hold);
    return out;
  }
  if (on_replica == 1) atomic_fetch_add_explicit(&idx->replica_retries, 1, memory_order_relaxed);
  int out = idx->ops->get(idx->be, digest, &val, &len, &hold, err);
  if (out) return out;
  out = br_record_decode(val, len, rec, err); /* copies out of the backend's buffer */
  if (out == 0 && rc) rcache_fill(rc, digest, val, len, epoch);
  idx->ops->get_done(idx->be, hold);
  return out;
}

struct many_state {
  br_index_many_fn fn;
  void *ud;
  const uint8_t *digests; /* the digests asked of the backend */
  const size_t *map;      /* their places in the caller's array */
  size_t n;
  struct rcache *rc; /* fills it (NULL: none), unless a commit came after epoch */
  uint64_t epoch;
  br_err *err;
  int rc_out;
};

static int many_entry(void *arg, const uint8_t *key, size_t i, const void *val, size_t vlen) {
  struct many_state *st = arg;
  (void)key;
  br_record rec;
  if (i >= st->n)
    st->rc_out = br_fail(st->err, "index: batch get: row %zu of %zu", i, st->n);
  else if (br_record_decode(val, vlen, &rec, st->err) < 0)
    st->rc_out = -1;
  else if (st->fn(st->ud, st->map[i], &rec))
    st->rc_out = -1;
  if (!st->rc_out && st->rc)
    rcache_fill(st->rc, st->digests + i * BR_SHA256_LEN, val, vlen, st->epoch);
  return st->rc_out;
}

/* One chunk of at most BR_INDEX_GET_MANY digests (base: the first's place): the records in the
 * record cache from there (kept exact as for br_index_get), the others in one backend call,
 * which fills the cache. miss and map are scratch for BR_INDEX_GET_MANY entries. */
static int many_chunk(br_index *idx, const uint8_t *digests, size_t base, size_t n,
                      br_index_many_fn fn, void *ud, uint8_t *miss, size_t *map, br_err *err) {
  struct rcache *rc = rcache_usable(idx);
  struct many_state st = {.fn = fn, .ud = ud, .digests = miss, .map = map, .rc = rc, .err = err};
  if (rc) st.epoch = atomic_load(&rc->epoch); /* before the backend's snapshot */
  for (size_t i = 0; i < n; i++) {
    const uint8_t *d = digests + (base + i) * BR_SHA256_LEN;
    uint8_t buf[RCACHE_MAX_BYTES];
    size_t len = rc ? rcache_get(rc, d, buf) : 0;
    if (rc) atomic_fetch_add_explicit(len ? &rc->hits : &rc->misses, 1, memory_order_relaxed);
    if (len) {
      br_record rec;
      if (br_record_decode(buf, len, &rec, err) < 0) return -1;
      if (fn(ud, base + i, &rec)) return -1;
      continue;
    }
    memcpy(miss + st.n * BR_SHA256_LEN, d, BR_SHA256_LEN);
    map[st.n++] = base + i;
  }
  if (!st.n) return 0;
  int out = idx->ops->get_many(idx->be, miss, st.n, many_entry, &st, err);
  return out ? out : st.rc_out;
}

int br_index_get_many(br_index *idx, const uint8_t *digests, size_t n, br_index_many_fn fn,
                      void *ud, br_err *err) {
  if (!idx->ops->get_many) { /* LMDB: each from the record cache or a read transaction */
    for (size_t i = 0; i < n; i++) {
      br_record rec;
      int rc = br_index_get(idx, digests + i * BR_SHA256_LEN, &rec, err);
      if (rc < 0) return rc;
      if (rc == 0 && fn(ud, i, &rec)) return -1;
    }
    return 0;
  }
  uint8_t *miss = malloc(BR_INDEX_GET_MANY * BR_SHA256_LEN);
  size_t *map = malloc(BR_INDEX_GET_MANY * sizeof *map);
  int rc = miss && map ? 0 : br_fail(err, "index: out of memory");
  for (size_t base = 0; !rc && base < n; base += BR_INDEX_GET_MANY) {
    size_t m = n - base < BR_INDEX_GET_MANY ? n - base : BR_INDEX_GET_MANY;
    rc = many_chunk(idx, digests, base, m, fn, ud, miss, map, err);
  }
  free(miss);
  free(map);
  return rc;
}

int br_index_get(br_index *idx, const uint8_t digest[BR_SHA256_LEN], br_record *rec, br_err *err) {
  return get_record(idx, digest, rec, err, rcache_usable(idx), 0);
}

int br_index_get_latest(br_index *idx, const uint8_t digest[BR_SHA256_LEN], br_record *rec,
                        br_err *err) {
  /* LMDB's cache is exact (one writer, this one); a shared index's may lag other nodes' commits */
  return get_record(idx, digest, rec, err, idx->listen ? NULL : idx->rcache, 1);
}

/* Decodes a scanned record; an error names the blob. Returns 0 or -1 (err). */
static int decode_at(const uint8_t *key, size_t klen, const void *val, size_t vlen, br_record *rec,
                     br_err *err) {
  if (klen != BR_SHA256_LEN) return br_fail(err, "index: key of %zu bytes", klen);
  if (br_record_decode(val, vlen, rec, err) == 0) return 0;
  char hex[BR_HEX_LEN + 1], why[sizeof err->msg];
  br_hex_encode(key, hex);
  snprintf(why, sizeof why, "%s", err ? err->msg : "");
  return br_fail(err, "%s: %s", hex, why);
}

int br_index_foreach(br_index *idx, br_index_each_fn fn, void *ud, br_err *err) {
  return br_index_foreach_after(idx, NULL, fn, ud, err);
}

struct each_state {
  br_index_each_fn fn;
  void *ud;
  br_record *rec;
  br_err *err;
  int failed;
  /* list_after */
  size_t limit, listed, scanned;
  int state, has_next;
  uint8_t *next;
};

static int each_entry(void *arg, const uint8_t *key, size_t klen, const void *val, size_t vlen) {
  struct each_state *st = arg;
  if (decode_at(key, klen, val, vlen, st->rec, st->err) < 0) {
    st->failed = 1;
    return 1;
  }
  return st->fn(st->ud, key, st->rec);
}

int br_index_foreach_after(br_index *idx, const uint8_t *after, br_index_each_fn fn, void *ud,
                           br_err *err) {
  struct each_state st = {.fn = fn, .ud = ud, .err = err, .rec = malloc(sizeof(br_record))};
  if (!st.rec) return br_fail(err, "out of memory");
  if (!after) atomic_fetch_add_explicit(&idx->full_walks, 1, memory_order_relaxed);
  int out = idx->ops->scan(idx->be, IDX_BLOBS, after, each_entry, &st, err);
  free(st.rec);
  return out ? out : st.failed ? -1 : 0;
}

static int list_entry(void *arg, const uint8_t *key, size_t klen, const void *val, size_t vlen) {
  struct each_state *st = arg;
  if (st->listed == st->limit || st->scanned == BR_INDEX_LIST_MAX_SCAN) {
    /* more follow: the caller goes on after the last key it has seen */
    st->has_next = 1;
    return 1;
  }
  st->scanned++;
  if (decode_at(key, klen, val, vlen, st->rec, st->err) < 0) {
    st->failed = 1;
    return 1;
  }
  memcpy(st->next, key, BR_SHA256_LEN);
  /* "quarantined" covers every kind: by reconcile, held by an admin, being deleted */
  br_record *rec = st->rec;
  int s = rec->state == BR_STATE_HELD || rec->state == BR_STATE_DELETING ? BR_STATE_QUARANTINED
                                                                         : (int)rec->state;
  if (st->state >= 0 && s != st->state) return 0;
  st->listed++;
  if (st->fn(st->ud, key, rec)) {
    br_fail(st->err, "index: listing stopped by its caller");
    st->failed = 1;
    return 1;
  }
  return 0;
}

int br_index_list_after(br_index *idx, const uint8_t *after, size_t limit, int state,
                        br_index_each_fn fn, void *ud, uint8_t next[BR_SHA256_LEN], int *has_next,
                        br_err *err) {
  *has_next = 0;
  struct each_state st = {.fn = fn,
                          .ud = ud,
                          .err = err,
                          .limit = limit,
                          .state = state,
                          .next = next,
                          .rec = malloc(sizeof(br_record))};
  if (!st.rec) return br_fail(err, "out of memory");
  int out = idx->ops->scan(idx->be, IDX_BLOBS, after, list_entry, &st, err);
  free(st.rec);
  if (!out && st.failed) out = -1;
  if (!out) *has_next = st.has_next;
  return out;
}

/* ---- the writer: queued operations, group commit ------------------------------------------- */

struct op {
  /* Applies the operation in the writer's transaction. Returns 0; -1 for an error of this
   * operation only (err filled, transaction still usable); or a backend code that spoils the
   * transaction. */
  int (*apply)(br_index *idx, struct op *op);
  const uint8_t *digest;
  const br_record *rec;
  br_record *stored;
  int created;
  int gone;    /* touch: the record was absent or not live */
  int taken;   /* put_record: a new location's key is another record's; nothing was written */
  int fail_rc; /* with apply's -1: the caller's code (BR_INDEX_KEY_TAKEN), else -1 */
  int wrote;   /* an existing record was changed or deleted: other nodes' caches are told */
  size_t seq;  /* its place in the queue (the batch is sorted by digest, then seq) */
  br_change *change;
  br_loc_change *loc;
  const br_purge *purge; /* settle */
  struct recount *recount;
  uint64_t now_ms;
  int rc;
  int done;
  br_err err;
  struct op *next;
};

static int has_place(const br_record *rec, const br_location *l) {
  for (int i = 0; rec && i < rec->nlocations; i++)
    if (!strcmp(rec->locations[i].store, l->store) && !strcmp(rec->locations[i].key, l->key))
      return 1;
  return 0;
}

/* The reverse map follows digest's record from old (NULL: none) to next (NULL: deleted): every
 * place next adds must be free or digest's already, else *taken = 1 and nothing is written.
 * Places old had and next has not are freed (when digest owns them). 0 or a backend code. */
static int sync_places(br_index *idx, const uint8_t digest[BR_SHA256_LEN], const br_record *old,
                       const br_record *next, int *taken) {
  uint8_t owner[BR_SHA256_LEN];
  *taken = 0;
  for (int i = 0; next && i < next->nlocations; i++) {
    const br_location *l = &next->locations[i];
    if (has_place(old, l)) continue;
    int rc = idx->ops->owner_get(idx->be, l, owner);
    if (rc == IDX_ABSENT) continue;
    if (rc) return rc;
    if (memcmp(owner, digest, BR_SHA256_LEN)) {
      *taken = 1;
      return 0;
    }
  }
  for (int i = 0; next && i < next->nlocations; i++) {
    const br_location *l = &next->locations[i];
    if (has_place(old, l)) continue;
    int rc = idx->ops->owner_put(idx->be, l, digest);
    if (rc) return rc;
  }
  for (int i = 0; old && i < old->nlocations; i++) {
    const br_location *l = &old->locations[i];
    if (has_place(next, l)) continue;
    int rc = idx->ops->owner_get(idx->be, l, owner);
    if (rc == IDX_ABSENT) continue;
    if (rc) return rc;
    if (memcmp(owner, digest, BR_SHA256_LEN)) continue; /* shared (upgrade) or not ours */
    rc = idx->ops->owner_del(idx->be, l);
    if (rc && rc != IDX_ABSENT) return rc;
  }
  return 0;
}

/* ---- pending purges: digest -> u64 queued_ns, u64 next_ms, u32 attempts, u32 acked (LE) ---- */

static void purge_encode(const br_purge *p, uint8_t out[PURGE_VALUE]) {
  uint64_t f[2] = {p->queued_ns, p->next_ms};
  for (int j = 0; j < 2; j++)
    for (int i = 0; i < 8; i++) out[8 * j + i] = (uint8_t)(f[j] >> (8 * i));
  uint32_t g[2] = {p->attempts, p->acked};
  for (int j = 0; j < 2; j++)
    for (int i = 0; i < 4; i++) out[16 + 4 * j + i] = (uint8_t)(g[j] >> (8 * i));
}

/* Decodes a stored purge value; 0, or -1 when it is not PURGE_VALUE bytes. */
static int purge_decode(const void *val, size_t len, br_purge *p) {
  if (len != PURGE_VALUE) return -1;
  const uint8_t *b = val;
  uint64_t f[2] = {0, 0};
  uint32_t g[2] = {0, 0};
  for (int j = 0; j < 2; j++)
    for (int i = 7; i >= 0; i--) f[j] = f[j] << 8 | b[8 * j + i];
  for (int j = 0; j < 2; j++)
    for (int i = 3; i >= 0; i--) g[j] = g[j] << 8 | b[16 + 4 * j + i];
  p->queued_ns = f[0], p->next_ms = f[1], p->attempts = g[0], p->acked = g[1];
  p->done = 0;
  return 0;
}

static uint64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Queues (or queues again, from scratch) a purge of digest in the writer's transaction. 0 or a
 * backend code. */
static int put_purge(br_index *idx, const uint8_t *digest) {
  uint64_t now = realtime_ns(); /* each queuing gets a distinct queued_ns */
  idx->last_purge_ns = now > idx->last_purge_ns ? now : idx->last_purge_ns + 1;
  br_purge p = {.queued_ns = idx->last_purge_ns};
  uint8_t buf[PURGE_VALUE];
  purge_encode(&p, buf);
  return idx->ops->purge_put(idx->be, digest, buf, sizeof buf);
}

/* A change that makes CDN copies of digest stale queues a purge when the index does that. */
static int stale_at_cdn(br_index *idx, const uint8_t *digest) {
  return idx->queue_purges && idx->ops->has_purges(idx->be) ? put_purge(idx, digest) : 0;
}

static int apply_queue_purge(br_index *idx, struct op *op) { return put_purge(idx, op->digest); }

static int apply_settle_purge(br_index *idx, struct op *op) {
  const void *val;
  size_t vlen;
  br_purge cur;
  int rc = idx->ops->purge_get(idx->be, op->digest, &val, &vlen);
  if (rc == IDX_ABSENT) return 0;
  if (rc) return rc;
  int malformed = purge_decode(val, vlen, &cur) < 0; /* was read as due from scratch */
  if (!malformed && cur.queued_ns != op->purge->queued_ns) return 0; /* queued again meanwhile */
  if (op->purge->done) {
    rc = idx->ops->purge_del(idx->be, op->digest);
    return rc == IDX_ABSENT ? 0 : rc;
  }
  uint8_t buf[PURGE_VALUE];
  purge_encode(op->purge, buf);
  return idx->ops->purge_put(idx->be, op->digest, buf, sizeof buf);
}

/* The record stored under digest, decoded into out: 0, IDX_ABSENT, -1 (err), or an
 * LMDB code. */
static int current_record(br_index *idx, const uint8_t *digest, br_record *out, br_err *err) {
  const void *val;
  size_t vlen;
  int rc = idx->ops->rec_get(idx->be, digest, &val, &vlen);
  if (rc) return rc;
  return br_record_decode(val, vlen, out, err) < 0 ? -1 : 0;
}

/* Encodes rec and stores it under op's digest, with its places in the reverse map: 0 (op->taken
 * = 1 when a place is another record's: nothing written), -1 (op->err), or an LMDB error code
 * (the transaction is spoiled then). */
static int put_record(br_index *idx, struct op *op, const br_record *rec) {
  uint8_t buf[BR_RECORD_MAX_ENCODED];
  size_t len = br_record_encode(rec, buf, sizeof buf);
  if (!len) {
    br_fail(&op->err, "index: record does not encode");
    return -1;
  }
  br_record old;
  int rc = current_record(idx, op->digest, &old, &op->err);
  if (rc && rc != IDX_ABSENT) return rc;
  int existed = rc == 0; /* a record nobody had cannot be in another node's cache */
  rc = sync_places(idx, op->digest, existed ? &old : NULL, rec, &op->taken);
  if (rc || op->taken) return rc;
  rc = idx->ops->rec_put(idx->be, op->digest, buf, len);
  if (rc == 0 && existed) op->wrote = 1;
  if (rc == 0 && idx->pending) br_counts_change(idx->pending, existed ? &old : NULL, rec);
  return rc;
}

/* Deletes op's record (as found: rec) and frees its places. 0 or an LMDB code. */
static int del_record(br_index *idx, struct op *op, const br_record *rec) {
  int taken = 0;
  int rc = sync_places(idx, op->digest, rec, NULL, &taken);
  if (rc) return rc;
  rc = idx->ops->rec_del(idx->be, op->digest);
  if (rc == 0) op->wrote = 1;
  if (rc == 0 && idx->pending) br_counts_change(idx->pending, rec, NULL);
  return rc == IDX_ABSENT ? 0 : rc;
}

static int apply_upload(br_index *idx, struct op *op) {
  const void *val;
  size_t vlen;
  int rc = idx->ops->rec_get(idx->be, op->digest, &val, &vlen);
  br_record *merged = op->stored;
  if (rc == IDX_ABSENT) {
    *merged = *op->rec;
    op->created = 1;
  } else if (rc) {
    return rc;
  } else if (br_record_decode(val, vlen, merged, &op->err) < 0) {
    return -1;
  } else if (merged->state == BR_STATE_DELETING) {
    /* its bytes are gone or going: the upload has just written them again, under the lock that
     * serialises it with the delete, so the blob starts afresh (other stores' copies, if the
     * delete had not reached them, are forgotten) */
    *merged = *op->rec;
    op->created = 1;
  } else {
    op->created = 0;
    if (op->rec->last_upload_ms > merged->last_upload_ms)
      merged->last_upload_ms = op->rec->last_upload_ms;
    if (merged->state == BR_STATE_QUARANTINED) { /* held blobs stay held: an admin said so */
      merged->state = BR_STATE_LIVE;
      merged->state_ms = op->rec->last_upload_ms;
      merged->reason[0] = '\0';
    }
    const br_location *want = br_record_primary(op->rec);
    int have = 0;
    for (int i = 0; want && i < merged->nlocations; i++)
      have |= !strcmp(merged->locations[i].store, want->store);
    if (want && !have && merged->nlocations < BR_MAX_LOCATIONS) {
      merged->locations[merged->nlocations] = *want;
      merged->locations[merged->nlocations].role =
          merged->nlocations ? BR_ROLE_COPY : BR_ROLE_PRIMARY;
      merged->nlocations++;
    }
  }
  rc = put_record(idx, op, merged);
  if (rc == 0 && op->taken) {
    const br_location *l = br_record_primary(op->rec);
    br_fail(&op->err, "index: %s:%s is the location of another blob", l ? l->store : "",
            l ? l->key : "");
    op->fail_rc = BR_INDEX_KEY_TAKEN;
    return -1;
  }
  return rc;
}

static int apply_touch(br_index *idx, struct op *op) {
  const void *val;
  size_t vlen;
  int rc = idx->ops->rec_get(idx->be, op->digest, &val, &vlen);
  op->created = 0;
  if (rc == IDX_ABSENT) {
    op->gone = 1;
    return 0;
  }
  if (rc) return rc;
  br_record *rec = op->stored;
  if (br_record_decode(val, vlen, rec, &op->err) < 0) return -1;
  if (rec->state != BR_STATE_LIVE) {
    op->gone = 1;
    return 0;
  }
  if (op->rec->last_upload_ms <= rec->last_upload_ms) return 0;
  rec->last_upload_ms = op->rec->last_upload_ms;
  return put_record(idx, op, rec);
}

static int apply_change(br_index *idx, struct op *op) {
  br_change *c = op->change;
  const void *val;
  size_t vlen;
  c->applied = 0;
  int rc = idx->ops->rec_get(idx->be, op->digest, &val, &vlen);
  if (rc == IDX_ABSENT) return 0;
  if (rc) return rc;
  br_record *rec = &c->before;
  if (br_record_decode(val, vlen, rec, &op->err) < 0) return -1;
  br_record next = *rec;
  switch (c->kind) {
    case BR_CHANGE_QUARANTINE:
      if (rec->state != BR_STATE_LIVE || rec->last_upload_ms >= c->cutoff_ms) return 0;
      next.state = BR_STATE_QUARANTINED;
      break;
    case BR_CHANGE_RESTORE:
      if (rec->state != BR_STATE_QUARANTINED) return 0;
      next.state = BR_STATE_LIVE;
      break;
    case BR_CHANGE_HOLD:
      if (rec->state == BR_STATE_HELD || rec->state == BR_STATE_DELETING) return 0;
      next.state = BR_STATE_HELD;
      break;
    case BR_CHANGE_RELEASE:
      if (rec->state == BR_STATE_LIVE || rec->state == BR_STATE_DELETING) return 0;
      next.state = BR_STATE_LIVE;
      if (op->now_ms > next.last_upload_ms) next.last_upload_ms = op->now_ms;
      break;
    case BR_CHANGE_REMOVE:
      if (rec->state == BR_STATE_LIVE || rec->state_ms != c->expect_state_ms ||
          rec->state_ms >= c->cutoff_ms)
        return 0;
      rc = del_record(idx, op, rec);
      if (!rc) rc = stale_at_cdn(idx, op->digest);
      if (rc) return rc;
      c->applied = 1;
      return 0;
    case BR_CHANGE_MARK_DELETE:
      if ((rec->state != BR_STATE_QUARANTINED && rec->state != BR_STATE_HELD) ||
          rec->state_ms != c->expect_state_ms || rec->state_ms >= c->cutoff_ms)
        return 0;
      next.state = BR_STATE_DELETING;
      break;
  }
  next.state_ms = op->now_ms;
  snprintf(next.reason, sizeof next.reason, "%s",
           next.state == BR_STATE_LIVE       ? ""
           : c->reason                       ? c->reason
           : next.state == BR_STATE_DELETING ? "being deleted for good"
                                             : "");
  rc = put_record(idx, op, &next);
  if (rc == 0 && (c->kind == BR_CHANGE_QUARANTINE || c->kind == BR_CHANGE_HOLD))
    rc = stale_at_cdn(idx, op->digest);
  if (rc == 0) c->applied = 1;
  return rc;
}

static int same_place(const br_location *a, const br_location *b) {
  return !strcmp(a->store, b->store) && !strcmp(a->key, b->key);
}

static int apply_location(br_index *idx, struct op *op) {
  br_loc_change *c = op->loc;
  const void *val;
  size_t vlen;
  int rc = idx->ops->rec_get(idx->be, op->digest, &val, &vlen);
  if (rc && rc != IDX_ABSENT) return rc;
  br_record *rec = &c->after;
  if (rc == IDX_ABSENT) {
    memset(rec, 0, sizeof *rec);
    if (c->kind != BR_LOC_INSERT) {
      c->outcome = BR_LOC_ABSENT;
      return 0;
    }
    rc = put_record(idx, op, c->rec);
    c->outcome = op->taken ? BR_LOC_KEY_TAKEN : BR_LOC_APPLIED;
    if (rc == 0 && !op->taken) *rec = *c->rec;
    return rc;
  }
  if (br_record_decode(val, vlen, rec, &op->err) < 0) return -1;
  if (c->kind == BR_LOC_INSERT) {
    const br_location *want = br_record_primary(c->rec);
    c->outcome = BR_LOC_DUPLICATE;
    for (int i = 0; want && i < rec->nlocations; i++)
      if (same_place(&rec->locations[i], want)) c->outcome = BR_LOC_EXISTS;
    return 0;
  }
  if (c->kind == BR_LOC_DROP) {
    c->outcome = BR_LOC_CONFLICT;
    for (int i = 0; i < rec->nlocations; i++) {
      br_location *l = &rec->locations[i];
      if (!same_place(l, &c->expect) || l->role != BR_ROLE_DRAINING ||
          l->verified_at_ms != c->expect.verified_at_ms || l->verified_at_ms >= c->cutoff_ms)
        continue;
      memmove(l, l + 1, (size_t)(rec->nlocations - i - 1) * sizeof *l);
      rec->nlocations--;
      c->outcome = BR_LOC_APPLIED;
      return put_record(idx, op, rec);
    }
    return 0;
  }
  /* SWITCH */
  br_location *primary = NULL;
  for (int i = 0; i < rec->nlocations; i++)
    if (rec->locations[i].role == BR_ROLE_PRIMARY) primary = &rec->locations[i];
  if (!primary || !same_place(primary, &c->expect)) {
    c->outcome = BR_LOC_CONFLICT;
    return 0;
  }
  if (same_place(primary, &c->to)) {
    primary->verified_at_ms = c->to.verified_at_ms;
    primary->dev = c->to.dev; /* the file as it was verified now */
    primary->ino = c->to.ino;
    c->outcome = BR_LOC_APPLIED;
    return put_record(idx, op, rec);
  }
  br_record next = *rec;
  next.nlocations = 0;
  for (int i = 0; i < rec->nlocations; i++) {
    br_location l = rec->locations[i];
    if (same_place(&l, &c->to)) continue; /* replaced by the new primary */
    if (l.role == BR_ROLE_PRIMARY) {
      l.role = BR_ROLE_DRAINING;
      l.verified_at_ms = op->now_ms; /* draining since */
    }
    next.locations[next.nlocations++] = l;
  }
  if (next.nlocations >= BR_MAX_LOCATIONS) {
    c->outcome = BR_LOC_FULL;
    return 0;
  }
  /* the primary goes first: readers that take the first location find it at once */
  memmove(&next.locations[1], &next.locations[0],
          (size_t)next.nlocations * sizeof next.locations[0]);
  next.locations[0] = c->to;
  next.locations[0].role = BR_ROLE_PRIMARY;
  next.nlocations++;
  rc = put_record(idx, op, &next);
  if (rc) return rc;
  if (op->taken) {
    c->outcome = BR_LOC_KEY_TAKEN; /* `after` stays the record as found */
    return 0;
  }
  rc = stale_at_cdn(idx, op->digest); /* cached redirects point at the old place */
  if (rc) return rc;
  *rec = next;
  c->outcome = BR_LOC_APPLIED;
  return 0;
}

/* Tells the other nodes, in the batch's transaction (so that they hear of it if and only if it
 * commits), which records it changed. 0 or a code that spoils the transaction. */
static int announce(br_index *idx, struct op **ops, size_t n) {
  if (!idx->ops->announce) return 0;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) /* sorted: the same digest twice is adjacent */
    if (ops[i]->wrote && !ops[i]->rc &&
        (!m || memcmp(idx->changed[m - 1], ops[i]->digest, BR_SHA256_LEN)))
      memcpy(idx->changed[m++], ops[i]->digest, BR_SHA256_LEN);
  return m ? idx->ops->announce(idx->be, (const uint8_t(*)[BR_SHA256_LEN])idx->changed, m) : 0;
}

/* ---- exact per-state counters ------------------------------------------------------------- */

struct recount {
  br_counts *found, *stored;
  int repair;
  uint64_t malformed;
};

static int count_entry(void *ud, const uint8_t *key, size_t klen, const void *val, size_t vlen) {
  struct recount *r = ud;
  br_record rec;
  if (klen != BR_SHA256_LEN || br_record_decode(val, vlen, &rec, NULL) < 0) {
    r->malformed++; /* fsck names it */
    return 0;
  }
  br_counts_change(r->found, NULL, &rec);
  return 0;
}

/* Recounts every record in the writer's transaction (earlier operations of the batch included)
 * and, with repair, stores the recount in place of the counters: the batch's change so far is in
 * the recount, so it starts again from nothing. op->rc stays 0; the recount's figures are in
 * op->recount. */
static int apply_recount(br_index *idx, struct op *op) {
  struct recount *r = op->recount;
  br_counts_clear(r->found);
  r->malformed = 0;
  atomic_fetch_add_explicit(&idx->full_walks, 1, memory_order_relaxed);
  int rc = idx->ops->txn_scan(idx->be, count_entry, r);
  if (rc) return rc;
  br_err err;
  op->created = idx->ops->counts_read(idx->be, r->stored, &err); /* 1: none complete */
  if (op->created < 0) return -1;
  if (idx->pending) br_counts_merge(r->stored, idx->pending);
  if (!r->repair) return 0;
  if (idx->pending) br_counts_clear(idx->pending);
  return idx->ops->counts_set(idx->be, r->found);
}

/* Before a commit: the batch's change of the counters joins its transaction. An overflowing
 * change (more stores than a br_counts holds) marks the counters incomplete instead. */
static int flush_counts(br_index *idx) {
  if (!idx->pending) return 0;
  if (idx->pending->overflow) {
    br_warn("index: more stores than the counters hold: they are recounted at the next start");
    return idx->ops->counts_set(idx->be, NULL);
  }
  return idx->pending->n ? idx->ops->counts_add(idx->be, idx->pending) : 0;
}

/* Before the operations run (a backend with prefetch): the rows that the batch's reads of records
 * and an upload's new place will lock, read together, in the order the operations take them.
 * 0 or a code that spoils the transaction. */
static int prefetch(br_index *idx, struct op **ops, size_t n) {
  if (!idx->ops->prefetch) return 0;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    struct op *op = ops[i];
    if (op->apply != apply_upload && op->apply != apply_change && op->apply != apply_touch &&
        op->apply != apply_location)
      continue;
    memcpy(idx->changed[m], op->digest, BR_SHA256_LEN);
    idx->places[m++] = op->apply == apply_upload ? br_record_primary(op->rec) : NULL;
  }
  if (!m) return 0;
  return idx->ops->prefetch(idx->be, (const uint8_t(*)[BR_SHA256_LEN])idx->changed, idx->places, m);
}

/* Whether op writes only what reconcile decided or CDN purge bookkeeping (the purge queue, which
 * no sweep reads). */
static int reconcile_only(const struct op *op) {
  return op->apply == apply_queue_purge || op->apply == apply_settle_purge ||
         (op->apply == apply_change && op->change->by_reconcile);
}

/* Commits the writer's transaction holding ops[0..n), counted in the mark under mark_lock, so
 * that a reader of the mark never sees the backend's change number moved without its count. */
static int commit_marked(br_index *idx, struct op **ops, size_t n) {
  if (!idx->ops->change_seq) return idx->ops->commit(idx->be);
  int others = 0;
  for (size_t i = 0; i < n && !others; i++) others = !reconcile_only(ops[i]);
  pthread_mutex_lock(&idx->mark_lock);
  int rc = idx->ops->commit(idx->be);
  if (!rc) {
    idx->mark.commits++;
    if (others) idx->mark.others = idx->mark.commits;
  }
  pthread_mutex_unlock(&idx->mark_lock);
  return rc;
}

/* Runs ops[0..n) in one transaction. An operation's apply returning -1 failed alone (nothing of
 * it was written); any other non-zero code spoils the transaction, which is then aborted, never
 * used again. The backend may ask for the batch to run again (LMDB: a full map after stale readers
 * were cleared; PostgreSQL: a conflict with another node). If the transaction fails as a whole
 * and holds several operations, each is retried alone so that one bad operation cannot fail its
 * neighbours. */
static void run_batch(br_index *idx, struct op **ops, size_t n) {
  int spoiled = 0;
  for (int attempt = 0;; attempt++) {
    spoiled = idx->ops->begin(idx->be);
    if (!spoiled) spoiled = prefetch(idx, ops, n);
    if (idx->pending) br_counts_clear(idx->pending);
    for (size_t i = 0; i < n && !spoiled; i++) {
      ops[i]->rc = 0;
      ops[i]->taken = 0;
      ops[i]->fail_rc = 0;
      ops[i]->wrote = 0;
      int r = ops[i]->apply(idx, ops[i]);
      if (r == -1)
        ops[i]->rc = ops[i]->fail_rc ? ops[i]->fail_rc : -1;
      else if (r != 0)
        spoiled = r;
    }
    if (!spoiled) spoiled = flush_counts(idx);
    if (!spoiled) spoiled = announce(idx, ops, n);
    if (!spoiled)
      spoiled = commit_marked(idx, ops, n);
    else
      idx->ops->abort(idx->be);
    if (!spoiled) {
      atomic_fetch_add(&idx->commits, 1);
      atomic_fetch_add(&idx->ops_applied, n);
      return;
    }
    if (!idx->ops->retry(idx->be, spoiled, attempt)) break;
  }
  if (n > 1) {
    for (size_t i = 0; i < n; i++) run_batch(idx, &ops[i], 1);
    return;
  }
  ops[0]->rc = idx->ops->fail(idx->be, spoiled, "write", &ops[0]->err);
}

/* The writer's side, after a batch: no reader may fill from an older snapshot any more, and
 * whatever is cached for the keys the batch wrote is gone. */
static void rcache_clear(struct rcache *rc, const uint8_t digest[BR_SHA256_LEN]) {
  size_t i = rcache_set_of(rc, digest);
  struct rcache_set *s = &rc->sets[i];
  pthread_mutex_t *lock = rcache_lock_of(rc, i);
  pthread_mutex_lock(lock);
  int w = rcache_way(s, digest);
  if (w >= 0) s->len[w] = 0;
  pthread_mutex_unlock(lock);
}

static void rcache_written(struct rcache *rc, struct op **ops, size_t n) {
  atomic_fetch_add(&rc->epoch, 1);
  for (size_t j = 0; j < n; j++) rcache_clear(rc, ops[j]->digest);
}

/* The listener's side (another node changed digest; NULL: anything may have changed): the same
 * order as the writer's, the epoch first, so that no read from before the change fills a slot. */
static void on_announced(void *arg, const uint8_t *digest) {
  br_index *idx = arg;
  struct rcache *rc = idx->rcache;
  if (rc) {
    atomic_fetch_add(&rc->epoch, 1);
    if (digest) {
      rcache_clear(rc, digest);
    } else {
      for (size_t l = 0; l < RCACHE_LOCKS; l++) {
        pthread_mutex_lock(&rc->locks[l]);
        for (size_t i = l; i < rc->nsets; i += RCACHE_LOCKS)
          memset(rc->sets[i].len, 0, sizeof rc->sets[i].len);
        pthread_mutex_unlock(&rc->locks[l]);
      }
    }
  }
  if (idx->on_change) idx->on_change(idx->on_change_ud, digest);
}

/* Batch order: by digest, then queue order (two nodes' batches lock the rows they share in the
 * same order, so that they cannot deadlock; one blob's operations keep their order). */
static int by_digest(const void *a, const void *b) {
  const struct op *x = *(struct op *const *)a, *y = *(struct op *const *)b;
  int c = memcmp(x->digest, y->digest, BR_SHA256_LEN);
  return c ? c : x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void *writer_main(void *arg) {
  br_index *idx = arg;
  struct op **batch = idx->batch;
  pthread_mutex_lock(&idx->lock);
  for (;;) {
    while (!idx->head && !idx->stopping) pthread_cond_wait(&idx->work_cv, &idx->lock);
    if (!idx->head) break;
    size_t n = 0;
    while (idx->head && n < idx->batch_max) {
      batch[n] = idx->head;
      batch[n]->seq = n;
      n++;
      idx->head = idx->head->next;
    }
    if (!idx->head) idx->tail = NULL;
    pthread_mutex_unlock(&idx->lock);
    if (n > 1) qsort(batch, n, sizeof *batch, by_digest);
    run_batch(idx, batch, n);
    if (idx->rcache) rcache_written(idx->rcache, batch, n); /* committed or not: clearing is safe */
    pthread_mutex_lock(&idx->lock);
    for (size_t i = 0; i < n; i++) batch[i]->done = 1;
    pthread_cond_broadcast(&idx->done_cv);
  }
  pthread_mutex_unlock(&idx->lock);
  return NULL;
}

/* Queues ops[0..n) together (so that the writer can commit them in few transactions) and waits
 * until the writer has committed (or failed) each. Returns 0, or the first failure (err). */
static int submit_many(br_index *idx, struct op *ops, size_t n, br_err *err) {
  pthread_mutex_lock(&idx->lock);
  if (idx->stopping || !idx->has_writer) {
    pthread_mutex_unlock(&idx->lock);
    return br_fail(err, "index: not accepting writes (read-only or stopping)");
  }
  for (size_t i = 0; i < n; i++) {
    ops[i].next = NULL;
    ops[i].done = 0;
    if (idx->tail)
      idx->tail->next = &ops[i];
    else
      idx->head = &ops[i];
    idx->tail = &ops[i];
  }
  pthread_cond_signal(&idx->work_cv);
  for (size_t i = 0; i < n; i++)
    while (!ops[i].done) pthread_cond_wait(&idx->done_cv, &idx->lock);
  pthread_mutex_unlock(&idx->lock);
  for (size_t i = 0; i < n; i++)
    if (ops[i].rc) {
      if (err) *err = ops[i].err;
      return ops[i].rc;
    }
  return 0;
}

static int submit(br_index *idx, struct op *op, br_err *err) {
  return submit_many(idx, op, 1, err);
}

int br_index_record_upload(br_index *idx, const uint8_t digest[BR_SHA256_LEN], const br_record *rec,
                           int *created, br_record *stored, br_err *err) {
  br_record scratch;
  struct op op = {
      .apply = apply_upload, .digest = digest, .rec = rec, .stored = stored ? stored : &scratch};
  int rc = submit(idx, &op, err);
  if (rc == 0 && created) *created = op.created;
  return rc;
}

int br_index_apply_changes(br_index *idx, br_change *changes, size_t n, uint64_t now_ms,
                           br_err *err) {
  enum { CHUNK = 1024 };
  struct op *ops = calloc(n < CHUNK ? (n ? n : 1) : CHUNK, sizeof *ops);
  if (!ops) return br_fail(err, "out of memory");
  int out = 0;
  for (size_t base = 0; base < n && out == 0; base += CHUNK) {
    size_t m = n - base < CHUNK ? n - base : CHUNK;
    for (size_t i = 0; i < m; i++)
      ops[i] = (struct op){.apply = apply_change,
                           .change = &changes[base + i],
                           .digest = changes[base + i].digest,
                           .now_ms = now_ms};
    out = submit_many(idx, ops, m, err);
  }
  free(ops);
  return out;
}

int br_index_apply_locations(br_index *idx, br_loc_change *changes, size_t n, uint64_t now_ms,
                             br_err *err) {
  enum { CHUNK = 1024 };
  struct op *ops = calloc(n < CHUNK ? (n ? n : 1) : CHUNK, sizeof *ops);
  if (!ops) return br_fail(err, "out of memory");
  int out = 0;
  for (size_t base = 0; base < n && out == 0; base += CHUNK) {
    size_t m = n - base < CHUNK ? n - base : CHUNK;
    pthread_mutex_lock(&idx->lock);
    if (idx->stopping || !idx->has_writer) {
      pthread_mutex_unlock(&idx->lock);
      out = br_fail(err, "index: not accepting writes (read-only or stopping)");
      break;
    }
    for (size_t i = 0; i < m; i++) {
      struct op *op = &ops[i];
      memset(op, 0, sizeof *op);
      op->apply = apply_location;
      op->loc = &changes[base + i];
      op->digest = changes[base + i].digest;
      op->now_ms = now_ms;
      if (idx->tail)
        idx->tail->next = op;
      else
        idx->head = op;
      idx->tail = op;
    }
    pthread_cond_signal(&idx->work_cv);
    for (size_t i = 0; i < m; i++)
      while (!ops[i].done) pthread_cond_wait(&idx->done_cv, &idx->lock);
    pthread_mutex_unlock(&idx->lock);
    for (size_t i = 0; i < m && out == 0; i++)
      if (ops[i].rc) {
        out = ops[i].rc;
        if (err) *err = ops[i].err;
      }
  }
  free(ops);
  return out;
}

int br_index_touch(br_index *idx, const uint8_t digest[BR_SHA256_LEN], uint64_t now_ms,
                   br_err *err) {
  br_record scratch, want = {.last_upload_ms = now_ms};
  struct op op = {.apply = apply_touch, .digest = digest, .rec = &want, .stored = &scratch};
  int rc = submit(idx, &op, err);
  return rc == 0 && op.gone ? 1 : rc;
}

int br_index_queue_purges(br_index *idx, const uint8_t (*digests)[BR_SHA256_LEN], size_t n,
                          br_err *err) {
  enum { CHUNK = 1024 };
  if (!idx->ops->has_purges(idx->be)) return br_fail(err, "index: no purges database (read-only)");
  struct op *ops = calloc(n < CHUNK ? (n ? n : 1) : CHUNK, sizeof *ops);
  if (!ops) return br_fail(err, "out of memory");
  int out = 0;
  for (size_t base = 0; base < n && out == 0; base += CHUNK) {
    size_t m = n - base < CHUNK ? n - base : CHUNK;
    for (size_t i = 0; i < m; i++)
      ops[i] = (struct op){.apply = apply_queue_purge, .digest = digests[base + i]};
    out = submit_many(idx, ops, m, err);
  }
  free(ops);
  return out;
}

struct due_state {
  uint64_t now_ms;
  br_purge *out;
  size_t max, n, scanned;
  uint8_t *next;
  int stopped;
};

static int due_entry(void *arg, const uint8_t *key, size_t klen, const void *val, size_t vlen) {
  struct due_state *st = arg;
  if (st->n == st->max || st->scanned++ == BR_INDEX_PURGE_SCAN) {
    st->stopped = 1; /* entries remain after next */
    return 1;
  }
  if (klen != BR_SHA256_LEN) return 0;
  memcpy(st->next, key, BR_SHA256_LEN);
  br_purge p;
  if (purge_decode(val, vlen, &p) < 0) p = (br_purge){0}; /* malformed: due, settled anew */
  if (p.next_ms > st->now_ms) return 0;
  memcpy(p.digest, key, BR_SHA256_LEN);
  st->out[st->n++] = p;
  return 0;
}

int br_index_purges_due(br_index *idx, const uint8_t *after, uint64_t now_ms, br_purge *out,
                        size_t max, uint8_t next[BR_SHA256_LEN], int *wrapped, br_err *err) {
  *wrapped = 1;
  if (!idx->ops->has_purges(idx->be)) return 0;
  struct due_state st = {.now_ms = now_ms, .out = out, .max = max, .next = next};
  if (idx->ops->purge_claim) { /* shared: what this node claimed, all due */
    int n = idx->ops->purge_claim(idx->be, now_ms, max, due_entry, &st, err);
    return n < 0 ? n : (int)st.n;
  }
  int rc = idx->ops->scan(idx->be, IDX_PURGES, after, due_entry, &st, err);
  if (rc) return rc;
  if (st.stopped) *wrapped = 0;
  return (int)st.n;
}

int br_index_settle_purges(br_index *idx, const br_purge *purges, size_t n, br_err *err) {
  enum { CHUNK = 1024 };
  struct op *ops = calloc(n < CHUNK ? (n ? n : 1) : CHUNK, sizeof *ops);
  if (!ops) return br_fail(err, "out of memory");
  int out = 0;
  for (size_t base = 0; base < n && out == 0; base += CHUNK) {
    size_t m = n - base < CHUNK ? n - base : CHUNK;
    for (size_t i = 0; i < m; i++)
      ops[i] = (struct op){.apply = apply_settle_purge,
                           .digest = purges[base + i].digest,
                           .purge = &purges[base + i]};
    out = submit_many(idx, ops, m, err);
  }
  free(ops);
  return out;
}

int br_index_counts(br_index *idx, br_counts *out, br_err *err) {
  if (!idx->ops->counts_read) {
    br_counts_clear(out);
    return 1;
  }
  return idx->ops->counts_read(idx->be, out, err);
}

/* The recount's digest, for the record cache's clearing after its batch (it writes no record). */
static const uint8_t NO_DIGEST[BR_SHA256_LEN];

int br_index_recount(br_index *idx, int repair, br_counts *found, br_counts *stored, br_err *err) {
  struct recount r = {.found = found, .stored = stored, .repair = repair};
  int none;
  br_counts_clear(found);
  br_counts_clear(stored);
  if (!idx->ops->counts_read) return br_fail(err, "index: %s keeps no counters", idx->ops->name);
  if (repair) {
    struct op op = {.apply = apply_recount, .digest = NO_DIGEST, .recount = &r};
    int rc = submit(idx, &op, err);
    if (rc) return rc;
    none = op.created;
  } else {
    atomic_fetch_add_explicit(&idx->full_walks, 1, memory_order_relaxed);
    int rc = idx->ops->scan(idx->be, IDX_BLOBS, NULL, count_entry, &r, err);
    if (rc) return rc;
    none = br_index_counts(idx, stored, err);
    if (none < 0) return -1;
  }
  return (int)br_counts_diff(found, stored) + (none ? 1 : 0);
}

/* At a writable open, before the writer starts: counters missing or incomplete (an index from
 * before them, or one whose change overflowed) are recounted once. 0 or -1 + err. */
static int counts_startup(br_index *idx, br_err *err) {
  br_counts *stored = malloc(sizeof *stored), *found = malloc(sizeof *found);
  int out = -1;
  if (!stored || !found) {
    br_fail(err, "index: out of memory");
    goto done;
  }
  out = idx->ops->counts_read(idx->be, stored, err);
  if (out <= 0) goto done;
  br_info("index: counting blobs by state (once: the counters are missing or incomplete)");
  uint64_t t0 = br_now_ms();
  struct recount r = {.found = found, .stored = stored, .repair = 1};
  struct op op = {.apply = apply_recount, .digest = NO_DIGEST, .recount = &r};
  run_batch(idx, (struct op *[]){&op}, 1);
  out = op.rc;
  if (out) {
    *err = op.err;
    goto done;
  }
  const br_count *all = NULL;
  int64_t blobs = 0;
  for (int s = 0; s < BR_COUNTS_STATES; s++)
    if ((all = br_counts_find(found, "", s))) blobs += all->blobs;
  br_info("index: counters ready (%" PRId64 " blobs counted in %" PRIu64 " ms)", blobs,
          br_now_ms() - t0);
done:
  free(stored);
  free(found);
  return out;
}

int br_index_key_owner(br_index *idx, const char *store, const char *key,
                       uint8_t owner[BR_SHA256_LEN], br_err *err) {
  return idx->ops->key_owner(idx->be, store, key, owner, err);
}

int br_index_ready(br_index *idx) { return idx->ops->ready(idx->be); }

int br_index_lease(br_index *idx, int which, int take, br_err *err) {
  return idx->ops->lease ? idx->ops->lease(idx->be, which, take, err) : take ? 1 : 0;
}

int br_index_lease_held(br_index *idx, int which, br_err *err) {
  return idx->ops->lease_held ? idx->ops->lease_held(idx->be, which, err) : 0;
}

int br_index_lock_blob(br_index *idx, const uint8_t digest[BR_SHA256_LEN], int lock, br_err *err) {
  int rc = idx->ops->lock_blob ? idx->ops->lock_blob(idx->be, digest, lock, err) : 0;
  return rc < 0 ? BR_INDEX_UNAVAILABLE : 0; /* whatever the cause (lock_timeout too) */
}

const char *br_index_kind(br_index *idx) { return idx->ops->name; }

int br_index_change_mark(br_index *idx, br_index_mark *out, br_err *err) {
  if (!idx->ops->change_seq) return 1;
  pthread_mutex_lock(&idx->mark_lock);
  *out = idx->mark;
  int rc = idx->ops->change_seq(idx->be, &out->seq, err) < 0 ? -1 : 0;
  pthread_mutex_unlock(&idx->mark_lock);
  return rc;
}

/* Every transaction between a and b was the writer's when the change number moved by as much as
 * its count of commits did (LMDB's transaction id grows by one a committed write; another
 * process's commit, or a commit that wrote nothing, breaks the equality: the answer is then no). */
int br_index_only_reconcile_since(const br_index_mark *a, const br_index_mark *b) {
  return b->seq >= a->seq && b->commits >= a->commits &&
         b->seq - a->seq == b->commits - a->commits && b->others <= a->commits;
}

int br_index_has_shared(br_index *idx) { return idx->ops->kv_put != NULL; }

int br_index_shared_put(br_index *idx, const void *key, size_t klen, const void *val, size_t vlen,
                        br_err *err) {
  if (!idx->ops->kv_put) return br_fail(err, "index: no shared state on %s", idx->ops->name);
  return idx->ops->kv_put(idx->be, key, klen, val, vlen, err);
}

int br_index_shared_get(br_index *idx, const void *key, size_t klen, char **val, size_t *vlen,
                        br_err *err) {
  if (!idx->ops->kv_get) return br_fail(err, "index: no shared state on %s", idx->ops->name);
  return idx->ops->kv_get(idx->be, key, klen, val, vlen, err);
}

int br_index_shared_scan(br_index *idx, const void *from, size_t flen, const void *to, size_t tlen,
                         int desc, br_index_kv_fn fn, void *ud, br_err *err) {
  if (!idx->ops->kv_scan) return br_fail(err, "index: no shared state on %s", idx->ops->name);
  return idx->ops->kv_scan(idx->be, from, flen, to, tlen, desc, fn, ud, err);
}

int br_index_shared_del(br_index *idx, const void *from, size_t flen, const void *to, size_t tlen,
                        br_err *err) {
  if (!idx->ops->kv_del) return br_fail(err, "index: no shared state on %s", idx->ops->name);
  return idx->ops->kv_del(idx->be, from, flen, to, tlen, err);
}

int br_index_next_id(br_index *idx, uint64_t *id, br_err *err) {
  if (!idx->ops->next_id) return br_fail(err, "index: no shared sequence on %s", idx->ops->name);
  return idx->ops->next_id(idx->be, id, err);
}

int br_index_has_fcache(br_index *idx) { return idx->ops->fcache_put != NULL; }

int br_index_fcache_put(br_index *idx, const uint8_t id[BR_SHA256_LEN], uint32_t chunk,
                        uint32_t chunks, const void *hashes, size_t len, br_err *err) {
  if (!idx->ops->fcache_put) return br_fail(err, "index: no file cache on %s", idx->ops->name);
  return idx->ops->fcache_put(idx->be, id, chunk, chunks, hashes, len, err);
}

int br_index_fcache_get(br_index *idx, const uint8_t id[BR_SHA256_LEN], uint32_t chunk, void **val,
                        size_t *len, uint32_t *chunks, br_err *err) {
  if (!idx->ops->fcache_get) return br_fail(err, "index: no file cache on %s", idx->ops->name);
  return idx->ops->fcache_get(idx->be, id, chunk, val, len, chunks, err);
}

int br_index_fcache_prune(br_index *idx, const uint8_t *keep, size_t n, br_err *err) {
  if (!idx->ops->fcache_prune) return br_fail(err, "index: no file cache on %s", idx->ops->name);
  return idx->ops->fcache_prune(idx->be, keep, n, err);
}

int br_index_has_plans(br_index *idx) { return idx->ops->plans_add != NULL; }

int br_index_plans_add(br_index *idx, const br_index_plan *plans, size_t n, br_err *err) {
  if (!idx->ops->plans_add)
    return br_fail(err, "index: no direct-upload plans on %s", idx->ops->name);
  return n ? idx->ops->plans_add(idx->be, plans, n, err) : 0;
}

int br_index_plans_forget(br_index *idx, const uint8_t digest[BR_SHA256_LEN], const char *upload_id,
                          uint64_t id, br_err *err) {
  if (!idx->ops->plans_forget)
    return br_fail(err, "index: no direct-upload plans on %s", idx->ops->name);
  return idx->ops->plans_forget(idx->be, digest, upload_id, id, err);
}

int br_index_plans_claim(br_index *idx, uint64_t grace_ms, uint64_t claim_ms, size_t max,
                         br_index_plan_fn fn, void *ud, br_err *err) {
  if (!idx->ops->plans_claim)
    return br_fail(err, "index: no direct-upload plans on %s", idx->ops->name);
  return idx->ops->plans_claim(idx->be, grace_ms, claim_ms, max, fn, ud, err);
}

int br_index_plans_count(br_index *idx, uint64_t *n, br_err *err) {
  if (!idx->ops->plans_count)
    return br_fail(err, "index: no direct-upload plans on %s", idx->ops->name);
  return idx->ops->plans_count(idx->be, n, err);
}

int br_index_has_jobs(br_index *idx) { return idx->ops->job_add != NULL; }

int br_index_job_add(br_index *idx, const char *source, const char *doc, const char *owner,
                     uint64_t lease_ms, size_t keep, uint64_t *id, br_index_job_fn fn, void *ud,
                     br_err *err) {
  if (!idx->ops->job_add) return br_fail(err, "index: no jobs on %s", idx->ops->name);
  return idx->ops->job_add(idx->be, source, doc, owner, lease_ms, keep, id, fn, ud, err);
}

int br_index_job_claim(br_index *idx, const char *owner, uint64_t lease_ms, int mine,
                       br_index_job_fn fn, void *ud, br_err *err) {
  if (!idx->ops->job_claim) return br_fail(err, "index: no jobs on %s", idx->ops->name);
  return idx->ops->job_claim(idx->be, owner, lease_ms, mine, fn, ud, err);
}

int br_index_job_save(br_index *idx, uint64_t id, const char *owner, const char *doc, int active,
                      uint64_t lease_ms, int *cancel, br_err *err) {
  if (!idx->ops->job_save) return br_fail(err, "index: no jobs on %s", idx->ops->name);
  return idx->ops->job_save(idx->be, id, owner, doc, active, lease_ms, cancel, err);
}

int br_index_job_list(br_index *idx, uint64_t id, size_t max, br_index_job_fn fn, void *ud,
                      br_err *err) {
  if (!idx->ops->job_list) return br_fail(err, "index: no jobs on %s", idx->ops->name);
  return idx->ops->job_list(idx->be, id, max, fn, ud, err);
}

int br_index_job_cancel(br_index *idx, uint64_t id, br_index_job_fn fn, void *ud, br_err *err) {
  if (!idx->ops->job_cancel) return br_fail(err, "index: no jobs on %s", idx->ops->name);
  return idx->ops->job_cancel(idx->be, id, fn, ud, err);
}

br_index *br_index_open(const char *dir, const br_index_options *opt, br_err *err) {
  br_index *idx = calloc(1, sizeof *idx);
  if (!idx) {
    br_fail(err, "out of memory");
    return NULL;
  }
  idx->batch_max = opt->batch_max ? opt->batch_max : 1;
  idx->queue_purges = opt->queue_purges;
  idx->on_change = opt->on_change;
  idx->on_change_ud = opt->on_change_ud;
  pthread_mutex_init(&idx->lock, NULL);
  pthread_mutex_init(&idx->mark_lock, NULL);
  pthread_cond_init(&idx->work_cv, NULL);
  pthread_cond_init(&idx->done_cv, NULL);
  int shared = opt->dsn && opt->dsn[0];
  idx->be = shared ? idx_pg_open(opt, &idx->ops, err) : idx_lmdb_open(dir, opt, &idx->ops, err);
  if (!idx->be) goto fail;
  if (!opt->read_only) {
    idx->batch = calloc(idx->batch_max, sizeof *idx->batch);
    idx->changed = calloc(idx->batch_max, sizeof *idx->changed);
    idx->places = calloc(idx->batch_max, sizeof *idx->places);
    if (!idx->batch || !idx->changed || !idx->places) {
      br_fail(err, "index: out of memory");
      goto fail;
    }
    if (!(idx->rcache = rcache_new(opt->record_cache, err))) goto fail;
    /* other nodes write a shared index: their changes are announced, the listener evicts them */
    if (shared && !(idx->listen = pgl_start(opt->dsn, on_announced, idx, err))) goto fail;
    if (shared && opt->read_dsn && opt->read_dsn[0] &&
        !(idx->replica = pgr_open(opt->read_dsn, err)))
      goto fail;
    if (idx->ops->counts_add) {
      idx->pending = malloc(sizeof *idx->pending);
      if (!idx->pending) {
        br_fail(err, "index: out of memory");
        goto fail;
      }
      br_counts_clear(idx->pending);
      if (counts_startup(idx, err) < 0) goto fail;
    }
    if (pthread_create(&idx->writer, NULL, writer_main, idx)) {
      br_fail(err, "index: cannot start the writer thread");
      goto fail;
    }
    idx->has_writer = 1;
  }
  return idx;
fail:
  pgl_stop(idx->listen);
  pgr_close(idx->replica);
  free(idx->pending);
  rcache_free(idx->rcache);
  free(idx->batch);
  free(idx->changed);
  free(idx->places);
  if (idx->be) idx->ops->close(idx->be);
  pthread_mutex_destroy(&idx->lock);
  pthread_mutex_destroy(&idx->mark_lock);
  pthread_cond_destroy(&idx->work_cv);
  pthread_cond_destroy(&idx->done_cv);
  free(idx);
  return NULL;
}

void br_index_close(br_index *idx) {
  if (!idx) return;
  pthread_mutex_lock(&idx->lock);
  idx->stopping = 1;
  pthread_cond_broadcast(&idx->work_cv);
  pthread_mutex_unlock(&idx->lock);
  if (idx->has_writer) pthread_join(idx->writer, NULL);
  pgl_stop(idx->listen);
  pgr_close(idx->replica);
  idx->ops->close(idx->be);
  free(idx->batch);
  free(idx->changed);
  free(idx->places);
  free(idx->pending);
  rcache_free(idx->rcache);
  pthread_mutex_destroy(&idx->lock);
  pthread_mutex_destroy(&idx->mark_lock);
  pthread_cond_destroy(&idx->work_cv);
  pthread_cond_destroy(&idx->done_cv);
  free(idx);
}

uint64_t br_index_purges_pending(br_index *idx) {
  if (idx->ops->purges_pending) return idx->ops->purges_pending(idx->be);
  br_index_stats st;
  br_index_get_stats(idx, &st);
  return st.purges_pending;
}

void br_index_get_stats(br_index *idx, br_index_stats *out) {
  memset(out, 0, sizeof *out);
  out->commits = atomic_load(&idx->commits);
  out->ops = atomic_load(&idx->ops_applied);
  if (idx->rcache) {
    out->cache_hits = atomic_load(&idx->rcache->hits);
    out->cache_misses = atomic_load(&idx->rcache->misses);
    out->cache_entries = idx->rcache->nsets * RCACHE_WAYS;
  }
  out->replica_reads = atomic_load(&idx->replica_reads);
  out->replica_retries = atomic_load(&idx->replica_retries);
  out->full_walks = atomic_load(&idx->full_walks);
  if (idx->listen) pgl_counters(idx->listen, &out->notifies, &out->flushes, &out->listens);
  idx->ops->stats(idx->be, out);
}
