/* `blobrefd --fsck` (every index entry has its bytes, optionally with the right SHA-256) and
 * `blobrefd --rebuild-index` (index the stores' content-addressed objects again). */
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsck.h"
#include "core/server.h"
#include "core/suspect.h"

/* ---- fsck ------------------------------------------------------------------------------------ */

struct fsck {
  br_server *srv;
  int verify;
  uint64_t blobs, problems;
  br_suspect *suspects; /* DATA_DIR/suspect: locations always hashed, whatever verify says */
  size_t nsuspects;
  br_counts *found; /* the walk's recount of the per-state counters */
  char *buf;        /* BUF bytes, for verify_digest */
};

/* Hashes the object key of st through buf (BUF bytes, the caller's: several threads hash at
 * once) and compares with want. 0, 1 missing... as br_store_open_read; -1 + err on a mismatch. */
enum { BUF = 1 << 20 };
static int verify_digest(br_store *st, const char *key, const uint8_t want[BR_SHA256_LEN],
                         char *buf, br_err *err) {
  br_store_reader r;
  int rc = br_store_open_read(st, key, &r, err);
  if (rc != 0) return rc > 0 ? br_fail(err, "missing") : -1;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  for (uint64_t off = 0; rc == 0 && off < r.size;) {
    size_t n = r.size - off < BUF ? (size_t)(r.size - off) : BUF;
    rc = r.source->pread(r.source, buf, n, off, err);
    EVP_DigestUpdate(ctx, buf, n);
    off += n;
  }
  uint8_t got[BR_SHA256_LEN];
  EVP_DigestFinal_ex(ctx, got, NULL);
  EVP_MD_CTX_free(ctx);
  br_store_reader_close(&r);
  if (rc == 0 && memcmp(got, want, BR_SHA256_LEN) != 0) rc = br_fail(err, "SHA-256 mismatch");
  return rc;
}

static int fsck_one(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  struct fsck *f = ud;
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(digest, hex);
  f->blobs++;
  br_counts_change(f->found, NULL, rec);
  if (rec->nlocations == 0) {
    printf("%s: no location\n", hex);
    f->problems++;
  }
  for (int i = 0; i < rec->nlocations; i++) {
    const br_location *l = &rec->locations[i];
    br_store *st = br_server_store(f->srv, l->store);
    br_err err;
    uint64_t size = 0;
    int rc = st ? br_store_stat(st, l->key, &size, &err) : 1;
    /* a draining copy (a moved blob's old location) may be gone already: the server deletes
     * the bytes first and drops the location after */
    if (st && rc > 0 && (l->role == BR_ROLE_DRAINING || rec->state == BR_STATE_DELETING)) continue;
    if (!st) {
      printf("%s: store %s is not configured\n", hex, l->store);
    } else if (rc < 0) {
      printf("%s: %s:%s: %s\n", hex, l->store, l->key, err.msg);
    } else if (rc > 0) {
      printf("%s: %s:%s: missing\n", hex, l->store, l->key);
    } else if (size != rec->size) {
      printf("%s: %s:%s: %" PRIu64 " bytes, index says %" PRIu64 "\n", hex, l->store, l->key, size,
             rec->size);
      rc = 1;
    } else {
      const br_suspect *sus = br_suspect_find(f->suspects, f->nsuspects, digest, l->store, l->key);
      char when[40] = "";
      if (sus) br_format_time_ms(sus->at_ms, when, sizeof when);
      if ((f->verify || sus) && verify_digest(st, l->key, digest, f->buf, &err) < 0) {
        printf("%s: %s:%s: %s%s%s%s\n", hex, l->store, l->key, err.msg,
               sus ? " (suspect since a read at " : "", when,
               sus ? " did not hash to the blob)" : "");
        rc = 1;
      } else if (sus) {
        printf(
            "%s: %s:%s: note: suspect since a read at %s did not hash to the blob; its bytes "
            "hash right now\n",
            hex, l->store, l->key, when);
      }
    }
    if (!st || rc) f->problems++;
  }
  return 0;
}

/* Prints the first entry that differs between the counters and a recount. */
static void print_count_diff(const br_counts *stored, const br_counts *found) {
  static const char *const names[] = {"live", "quarantined", "held", "deleting"};
  for (size_t i = 0; i < found->n; i++) {
    const br_count *x = &found->c[i], *y = br_counts_find(stored, x->store, x->state);
    int64_t blobs = y ? y->blobs : 0, bytes = y ? y->bytes : 0;
    if (x->blobs == blobs && x->bytes == bytes) continue;
    printf("index counters: %s blobs%s%s: stored %" PRId64 " (%" PRId64 " bytes), counted %" PRId64
           " (%" PRId64 " bytes)\n",
           x->state >= 0 && x->state < 4 ? names[x->state] : "?", x->store[0] ? " in " : "",
           x->store, blobs, bytes, x->blobs, x->bytes);
    return;
  }
  printf("index counters: missing or incomplete\n");
}

/* The counters differed from fsck's walk (which a running server's writes may also explain), or
 * the index is PostgreSQL's (whose nodes may write while fsck walks, so that only a recount in
 * one transaction can tell): recounts them in a writable open's writer transaction, which on
 * PostgreSQL holds off every node's change of the counters until it commits, replacing them.
 * Returns the number of entries that differed there, or -1 (printed). */
static int repair_counts(br_config *cfg) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/index", cfg->data_dir);
  br_index_options opt = {.map_size = cfg->index_map_size,
                          .batch_max = 1,
                          .dsn = !strcmp(cfg->index_kind, "postgres") ? cfg->index_dsn : NULL};
  br_err err;
  br_index *idx = br_index_open(dir, &opt, &err);
  br_counts *found = malloc(sizeof *found), *stored = malloc(sizeof *stored);
  int rc = -1;
  if (!idx)
    printf("index counters: cannot open the index to repair them: %s\n", err.msg);
  else if (!found || !stored)
    printf("index counters: out of memory\n");
  else if ((rc = br_index_recount(idx, 1, found, stored, &err)) < 0)
    printf("index counters: %s\n", err.msg);
  else if (rc > 0) {
    print_count_diff(stored, found);
    printf("index counters: %d entries differed from a recount: repaired\n", rc);
  }
  br_index_close(idx);
  free(found);
  free(stored);
  return rc;
}

int br_fsck(br_config *cfg, int verify) {
  br_server server = {0}, *srv = &server;
  br_err err;
  if (br_server_open(srv, cfg, BR_OPEN_CHECK, &err) < 0) {
    fprintf(stderr, "blobrefd: %s\n", err.msg);
    br_server_close(srv);
    return 2;
  }
  struct fsck f = {
      .srv = srv, .verify = verify, .found = malloc(sizeof(br_counts)), .buf = malloc(BUF)};
  br_counts *stored = malloc(sizeof *stored);
  if (!f.found || !stored || !f.buf) {
    fprintf(stderr, "blobrefd: out of memory\n");
    free(f.found);
    free(f.buf);
    free(stored);
    br_server_close(srv);
    return 2;
  }
  br_counts_clear(f.found);
  if (br_suspect_load(cfg->data_dir, &f.suspects, &f.nsuspects, &err) < 0) {
    printf("suspect list: %s\n", err.msg);
    f.problems++;
  }
  int rc = br_index_foreach(srv->index, fsck_one, &f, &err);
  free(f.suspects);
  if (rc < 0) {
    printf("index: %s\n", err.msg);
    f.problems++;
  }
  /* LMDB's counters are compared with the walk's; a PostgreSQL index changes under running nodes
   * while fsck walks, so its counters are recounted in one transaction (repair_counts) */
  int shared = strcmp(br_index_kind(srv->index), "lmdb") != 0;
  int kept = shared ? 0 : br_index_counts(srv->index, stored, &err);
  int differ = rc == 0 && (shared || kept != 0 || br_counts_diff(f.found, stored) > 0);
  br_server_close(srv);
  if (differ && repair_counts(cfg) != 0) f.problems++;
  free(f.found);
  free(f.buf);
  free(stored);
  printf("fsck: %" PRIu64 " blobs, %" PRIu64 " problems\n", f.blobs, f.problems);
  return f.problems ? 1 : 0;
}

/* ---- rebuild-index ---------------------------------------------------------------------------
 * Indexes every object a store holds under a content-addressed key "<prefix>sha256/ab/cd/<hex>"
 * whose bytes hash to <hex>, for an index that was lost or damaged (move a damaged one away
 * first). Objects whose bytes do not match their key are reported and left out. The content type
 * is not known any more: application/octet-stream.
 * The listing (this thread) skips what is indexed already and queues the rest (QUEUE at most);
 * HASHERS threads hash them and gather the records in batches of BATCH (two batches at most),
 * each inserted in one index transaction (br_index_apply_locations, BR_LOC_INSERT), so that a
 * rebuild cut short leaves whole records only and the next run goes on from them. A line
 * "N blobs indexed so far" follows the first commit, then one every PROGRESS_MS at most. */

enum { QUEUE = 1024, BATCH = 1024, HASHERS_MAX = 8, PROGRESS_MS = 10000 };

struct rebuild_job {
  char key[BR_MAX_KEY + 1];
  uint8_t digest[BR_SHA256_LEN];
  uint64_t size;
};

struct rebuild_batch {
  size_t n;
  br_record recs[BATCH];
  br_loc_change changes[BATCH];
};

struct rebuild {
  br_server *srv;
  br_store *store;
  const br_store_config *sc;
  size_t prefix_len; /* strlen(<prefix>sha256/) */
  uint64_t indexed, present, problems;
  int fatal;            /* set under lock: an index write failed (every thread stops) */
  uint64_t progress_ms; /* the last "so far" line (the first batch's always) */
  /* the pipeline of one store, all under lock */
  pthread_mutex_t lock;
  pthread_cond_t cv; /* a job queued or taken, a batch back, the listing over */
  struct rebuild_job *queue;
  size_t head, len;
  int listed;                        /* the listing is over: the hashers end once the queue is */
  struct rebuild_batch *cur, *spare; /* cur: being filled (NULL while both are written) */
};

/* The digest a content-addressed key names: "<prefix>sha256/ab/cd/<64 hex>" after the prefix
 * (already matched), with ab and cd the hex's first digits. Returns 0, or -1 for another key. */
static int key_digest(const char *rest, uint8_t digest[BR_SHA256_LEN]) {
  if (strlen(rest) != 6 + BR_HEX_LEN || rest[2] != '/' || rest[5] != '/') return -1;
  const char *hex = rest + 6;
  if (strncmp(rest, hex, 2) != 0 || strncmp(rest + 3, hex + 2, 2) != 0) return -1;
  return br_blob_id_parse(hex, BR_HEX_LEN, digest);
}

/* When the object was written: its file's mtime for fs stores, else now. */
static uint64_t object_time_ms(const struct rebuild *rb, const char *key) {
  char path[4096];
  struct stat sb;
  if (strcmp(rb->sc->kind, "fs") != 0 || !rb->sc->root) return br_now_ms();
  snprintf(path, sizeof path, "%s/%s", rb->sc->root, key);
  if (stat(path, &sb) != 0) return br_now_ms();
  return (uint64_t)sb.st_mtim.tv_sec * 1000 + (uint64_t)sb.st_mtim.tv_nsec / 1000000;
}

/* Inserts b's records in one call (no lock held), counts the outcomes and empties b. A record
 * found meanwhile with other locations, or whose key is another's, goes through
 * br_index_record_upload as one upload would (its answer is the rebuild's, as before batching).
 * 0, or -1 when the index failed (printed, fatal set). */
static int rebuild_flush(struct rebuild *rb, struct rebuild_batch *b) {
  br_err err;
  uint64_t indexed = 0, present = 0;
  int rc = b->n ? br_index_apply_locations(rb->srv->index, b->changes, b->n, br_now_ms(), &err) : 0;
  for (size_t i = 0; rc == 0 && i < b->n; i++) {
    br_loc_change *c = &b->changes[i];
    if (c->outcome == BR_LOC_APPLIED) {
      indexed++;
    } else if (c->outcome == BR_LOC_EXISTS) {
      present++;
    } else {
      int created = 0;
      rc = br_index_record_upload(rb->srv->index, c->digest, c->rec, &created, NULL, &err);
      if (rc == 0) indexed++;
    }
  }
  if (rc != 0) printf("index: %s\n", err.msg);
  pthread_mutex_lock(&rb->lock);
  rb->indexed += indexed;
  rb->present += present;
  if (rc != 0) rb->fatal = 1;
  uint64_t now = br_now_ms();
  if (rc == 0 && (!rb->progress_ms || now - rb->progress_ms >= PROGRESS_MS)) {
    rb->progress_ms = now; /* committed: a rebuild cut short from here on keeps these */
    printf("rebuild-index: %" PRIu64 " blobs indexed so far\n", rb->indexed);
    fflush(stdout);
  }
  b->n = 0;
  if (!rb->cur)
    rb->cur = b;
  else
    rb->spare = b;
  pthread_cond_broadcast(&rb->cv);
  pthread_mutex_unlock(&rb->lock);
  return rc ? -1 : 0;
}

/* A hasher: takes queued objects, checks their bytes, and adds their records to the batch being
 * filled, writing it when full. Ends when the listing is over and the queue empty, or on fatal. */
static void *rebuild_hasher(void *arg) {
  struct rebuild *rb = arg;
  const char *store = br_store_name(rb->store);
  char *buf = malloc(BUF);
  struct rebuild_job job;
  br_err err;
  pthread_mutex_lock(&rb->lock);
  if (!buf) {
    printf("rebuild-index: out of memory\n");
    rb->fatal = 1;
    pthread_cond_broadcast(&rb->cv);
  }
  for (;;) {
    while (!rb->fatal && !rb->len && !rb->listed) pthread_cond_wait(&rb->cv, &rb->lock);
    if (rb->fatal || !rb->len) break;
    job = rb->queue[rb->head];
    rb->head = (rb->head + 1) % QUEUE;
    rb->len--;
    pthread_cond_broadcast(&rb->cv);
    pthread_mutex_unlock(&rb->lock);
    int bad = verify_digest(rb->store, job.key, job.digest, buf, &err) < 0;
    br_record add;
    if (bad)
      printf("%s:%s: %s; left out\n", store, job.key, err.msg);
    else
      br_record_init(&add, job.size, "application/octet-stream", store, job.key,
                     object_time_ms(rb, job.key), br_now_ms());
    pthread_mutex_lock(&rb->lock);
    if (bad) {
      rb->problems++;
      continue;
    }
    while (!rb->fatal && !rb->cur) pthread_cond_wait(&rb->cv, &rb->lock);
    if (rb->fatal) break;
    struct rebuild_batch *b = rb->cur;
    b->recs[b->n] = add;
    br_loc_change *c = &b->changes[b->n];
    memset(c, 0, sizeof *c);
    memcpy(c->digest, job.digest, BR_SHA256_LEN);
    c->kind = BR_LOC_INSERT;
    c->rec = &b->recs[b->n];
    if (++b->n < BATCH) continue;
    rb->cur = rb->spare;
    rb->spare = NULL;
    pthread_mutex_unlock(&rb->lock);
    rebuild_flush(rb, b);
    pthread_mutex_lock(&rb->lock);
  }
  pthread_mutex_unlock(&rb->lock);
  free(buf);
  return NULL;
}

/* The listing's callback: an object not indexed yet is queued for the hashers (waiting for room).
 * Non-zero stops the listing (fatal). */
static int rebuild_one(void *ud, const char *key, uint64_t size) {
  struct rebuild *rb = ud;
  const char *store = br_store_name(rb->store);
  uint8_t digest[BR_SHA256_LEN];
  br_err err;
  if (key_digest(key + rb->prefix_len, digest) < 0) {
    printf("%s:%s: not a content-addressed key; left out\n", store, key);
    pthread_mutex_lock(&rb->lock);
    rb->problems++;
    pthread_mutex_unlock(&rb->lock);
    return 0;
  }
  br_record rec;
  int rc = br_index_get(rb->srv->index, digest, &rec, &err);
  if (rc < 0) {
    printf("index: %s\n", err.msg);
    pthread_mutex_lock(&rb->lock);
    rb->fatal = 1;
    pthread_cond_broadcast(&rb->cv);
    pthread_mutex_unlock(&rb->lock);
    return 1;
  }
  int have = 0;
  for (int i = 0; rc == 0 && i < rec.nlocations; i++)
    have |= !strcmp(rec.locations[i].store, store);
  pthread_mutex_lock(&rb->lock);
  if (rc == 0 && (have || rec.state != BR_STATE_LIVE)) { /* indexed already: left as it is */
    rb->present++;
    pthread_mutex_unlock(&rb->lock);
    return 0;
  }
  while (!rb->fatal && rb->len == QUEUE) pthread_cond_wait(&rb->cv, &rb->lock);
  int fatal = rb->fatal;
  if (!fatal) {
    struct rebuild_job *j = &rb->queue[(rb->head + rb->len) % QUEUE];
    snprintf(j->key, sizeof j->key, "%s", key);
    memcpy(j->digest, digest, BR_SHA256_LEN);
    j->size = size;
    rb->len++;
    pthread_cond_broadcast(&rb->cv);
  }
  pthread_mutex_unlock(&rb->lock);
  return fatal;
}

/* How many hashers: one per online CPU, 1 to HASHERS_MAX. */
static int hashers(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > HASHERS_MAX ? HASHERS_MAX : (int)n;
}

/* Rebuilds from one store: the listing here, the hashers beside it, then the last batch. */
static void rebuild_store(struct rebuild *rb, const char *prefix) {
  pthread_t th[HASHERS_MAX];
  int nth = 0, want = hashers();
  br_err err;
  rb->head = rb->len = 0;
  rb->listed = 0;
  for (; nth < want; nth++)
    if (pthread_create(&th[nth], NULL, rebuild_hasher, rb) != 0) break;
  if (!nth) {
    printf("rebuild-index: cannot start a thread\n");
    rb->fatal = 1;
    return;
  }
  if (br_store_list(rb->store, prefix, rebuild_one, rb, &err) < 0) {
    printf("store %s: %s\n", br_store_name(rb->store), err.msg);
    pthread_mutex_lock(&rb->lock);
    rb->fatal = 1;
    pthread_mutex_unlock(&rb->lock);
  }
  pthread_mutex_lock(&rb->lock);
  rb->listed = 1;
  pthread_cond_broadcast(&rb->cv);
  pthread_mutex_unlock(&rb->lock);
  for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
  /* the hashers are gone: the batch being filled is the last (the other one is back) */
  if (!rb->fatal && rb->cur && rb->cur->n) {
    struct rebuild_batch *b = rb->cur;
    rb->cur = NULL;
    rebuild_flush(rb, b);
  }
}

int br_rebuild_index(br_config *cfg) {
  br_server server = {0}, *srv = &server;
  br_err err;
  if (mkdir(cfg->data_dir, 0755) < 0 && errno != EEXIST) {
    fprintf(stderr, "blobrefd: cannot create %s: %s\n", cfg->data_dir, strerror(errno));
    return 2;
  }
  if (br_server_open(srv, cfg, BR_OPEN_REBUILD, &err) < 0) {
    fprintf(stderr, "blobrefd: %s%s\n", err.msg,
            srv->data_locked && !srv->index ? " (move a damaged index away and run again)" : "");
    br_server_close(srv);
    return 2;
  }
  struct rebuild rb = {.srv = srv,
                       .queue = malloc(QUEUE * sizeof(struct rebuild_job)),
                       .cur = malloc(sizeof(struct rebuild_batch)),
                       .spare = malloc(sizeof(struct rebuild_batch))};
  if (!rb.queue || !rb.cur || !rb.spare) {
    fprintf(stderr, "blobrefd: out of memory\n");
    rb.fatal = 1;
  } else {
    rb.cur->n = rb.spare->n = 0;
  }
  pthread_mutex_init(&rb.lock, NULL);
  pthread_cond_init(&rb.cv, NULL);
  for (int i = 0; i < srv->nstores && !rb.fatal; i++) {
    char prefix[BR_MAX_KEY + 1];
    rb.store = srv->stores[i];
    rb.sc = &srv->cfg->stores[i];
    snprintf(prefix, sizeof prefix, "%ssha256/", rb.sc->prefix ? rb.sc->prefix : "");
    rb.prefix_len = strlen(prefix);
    uint64_t before = rb.indexed;
    rebuild_store(&rb, prefix);
    printf("store %s: %" PRIu64 " blobs indexed\n", br_store_name(rb.store), rb.indexed - before);
  }
  printf("rebuild-index: %" PRIu64 " blobs indexed, %" PRIu64 " already there, %" PRIu64
         " problems\n",
         rb.indexed, rb.present, rb.problems);
  pthread_cond_destroy(&rb.cv);
  pthread_mutex_destroy(&rb.lock);
  free(rb.queue);
  free(rb.cur);
  free(rb.spare);
  br_server_close(srv);
  return rb.fatal ? 2 : rb.problems ? 1 : 0;
}
