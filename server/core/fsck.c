/* `blobrefd --fsck` (every index entry has its bytes, optionally with the right SHA-256) and
 * `blobrefd --rebuild-index` (index the stores' content-addressed objects again). */
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
};

static int verify_digest(br_store *st, const char *key, const uint8_t want[BR_SHA256_LEN],
                         br_err *err) {
  br_store_reader r;
  int rc = br_store_open_read(st, key, &r, err);
  if (rc != 0) return rc > 0 ? br_fail(err, "missing") : -1;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  static char buf[1 << 20];
  for (uint64_t off = 0; rc == 0 && off < r.size;) {
    size_t n = r.size - off < sizeof buf ? (size_t)(r.size - off) : sizeof buf;
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
      if ((f->verify || sus) && verify_digest(st, l->key, digest, &err) < 0) {
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
  struct fsck f = {.srv = srv, .verify = verify, .found = malloc(sizeof(br_counts))};
  br_counts *stored = malloc(sizeof *stored);
  if (!f.found || !stored) {
    fprintf(stderr, "blobrefd: out of memory\n");
    free(f.found);
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
  free(stored);
  printf("fsck: %" PRIu64 " blobs, %" PRIu64 " problems\n", f.blobs, f.problems);
  return f.problems ? 1 : 0;
}

/* ---- rebuild-index ---------------------------------------------------------------------------
 * Indexes every object a store holds under a content-addressed key "<prefix>sha256/ab/cd/<hex>"
 * whose bytes hash to <hex>, for an index that was lost or damaged (move a damaged one away
 * first). Objects whose bytes do not match their key are reported and left out. The content type
 * is not known any more: application/octet-stream. */

struct rebuild {
  br_server *srv;
  br_store *store;
  const br_store_config *sc;
  size_t prefix_len; /* strlen(<prefix>sha256/) */
  uint64_t indexed, present, problems;
  int fatal;
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

static int rebuild_one(void *ud, const char *key, uint64_t size) {
  struct rebuild *rb = ud;
  const char *store = br_store_name(rb->store);
  uint8_t digest[BR_SHA256_LEN];
  br_err err;
  if (key_digest(key + rb->prefix_len, digest) < 0) {
    printf("%s:%s: not a content-addressed key; left out\n", store, key);
    rb->problems++;
    return 0;
  }
  br_record rec;
  int rc = br_index_get(rb->srv->index, digest, &rec, &err);
  if (rc < 0) {
    printf("index: %s\n", err.msg);
    rb->fatal = 1;
    return 1;
  }
  int have = 0;
  for (int i = 0; rc == 0 && i < rec.nlocations; i++)
    have |= !strcmp(rec.locations[i].store, store);
  if (rc == 0 && (have || rec.state != BR_STATE_LIVE)) { /* indexed already: left as it is */
    rb->present++;
    return 0;
  }
  if (verify_digest(rb->store, key, digest, &err) < 0) {
    printf("%s:%s: %s; left out\n", store, key, err.msg);
    rb->problems++;
    return 0;
  }
  uint64_t t = object_time_ms(rb, key);
  br_record add;
  br_record_init(&add, size, "application/octet-stream", store, key, t, br_now_ms());
  int created = 0;
  if (br_index_record_upload(rb->srv->index, digest, &add, &created, NULL, &err) < 0) {
    printf("index: %s\n", err.msg);
    rb->fatal = 1;
    return 1;
  }
  rb->indexed++;
  return 0;
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
  struct rebuild rb = {.srv = srv};
  for (int i = 0; i < srv->nstores && !rb.fatal; i++) {
    char prefix[BR_MAX_KEY + 1];
    rb.store = srv->stores[i];
    rb.sc = &srv->cfg->stores[i];
    snprintf(prefix, sizeof prefix, "%ssha256/", rb.sc->prefix ? rb.sc->prefix : "");
    rb.prefix_len = strlen(prefix);
    uint64_t before = rb.indexed;
    if (br_store_list(rb.store, prefix, rebuild_one, &rb, &err) < 0) {
      printf("store %s: %s\n", br_store_name(rb.store), err.msg);
      rb.fatal = 1;
    }
    printf("store %s: %" PRIu64 " blobs indexed\n", br_store_name(rb.store), rb.indexed - before);
  }
  printf("rebuild-index: %" PRIu64 " blobs indexed, %" PRIu64 " already there, %" PRIu64
         " problems\n",
         rb.indexed, rb.present, rb.problems);
  br_server_close(srv);
  return rb.fatal ? 2 : rb.problems ? 1 : 0;
}
