/* scale_load: the scale benchmark's bulk loader and data set (tests/bench/scale_bench.py). */
/*
 * usage: scale_load load DATA_DIR FROM TO [THREADS [sorted|random]]
 *          inserts blobs FROM..TO-1 into the LMDB index DATA_DIR/index through the index writer's
 *          batch API (br_index_apply_locations, BR_LOC_INSERT: the path of --import-index and
 *          POST /v1/import) from THREADS (16) loaders, up to TXN_MAX records a transaction, in
 *          key order (sorted, the default: a bulk import) or in blob order (random: as uploads
 *          arrive); prints one JSON line
 *        scale_load hashes N K SEED
 *          prints K hex digests of live blobs drawn at random (with SEED) from 0..N-1
 *        scale_load links ROOT FROM TO
 *          gives blobs FROM..TO-1 their fs store file ROOT/sha256/ab/cd/<hex> as a hard link to
 *          ROOT/sizes/<class> (a sparse file of the blob's size): --fsck stats real paths
 *          without one inode or one data block per blob
 *
 * The data set: blob i has digest SHA-256("scale" || i as 8 little-endian bytes), spread over the
 * key space as real digests are (random order; `load` sorts them first). Its other fields come from
 * digest bytes: size one of SIZE_CLASSES values spread log-uniformly over 20 kB..8 MB
 * (photographs), content type image/jpeg (70 %), image/png (20 %) or image/webp, created within the
 * last year, state live (90 %), quarantined by reconcile (8 %) or held by an admin (2 %); one
 * primary location in store "local" under the fs store's default key sha256/ab/cd/<hex>.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blobref/index.h"

#define D BR_SHA256_LEN
#define BATCH 1024        /* records a call (br_index_apply_locations queues 1,024 at a time) */
#define TXN_MAX 16384     /* the writer's batch_max: records a transaction */
#define SIZE_CLASSES 1024 /* a hard link count stays far below ext4's 65,000 up to 100M blobs */
#define MAX_BLOBS 1000000000ull
#define MAX_THREADS 64
#define YEAR_MS (365ull * 24 * 3600 * 1000)

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "scale_load: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static uint64_t arg_u64(const char *s, uint64_t lo, uint64_t hi) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi)
    die("%s: want a number in %" PRIu64 "..%" PRIu64, s, lo, hi);
  return v;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the data set ---------------------------------------------------------------------------- */

static void blob_digest(uint64_t i, uint8_t out[D]) {
  uint8_t msg[13] = {'s', 'c', 'a', 'l', 'e'};
  for (int k = 0; k < 8; k++) msg[5 + k] = (uint8_t)(i >> (8 * k));
  unsigned len = 0;
  if (!EVP_Digest(msg, sizeof msg, out, &len, EVP_sha256(), NULL)) die("EVP_Digest failed");
}

static unsigned size_class(const uint8_t d[D]) {
  return (unsigned)((d[4] << 8 | d[5]) % SIZE_CLASSES);
}

static uint64_t class_size(unsigned c) {
  return (uint64_t)llround(20000.0 * pow(400.0, (double)c / (SIZE_CLASSES - 1)));
}

static void blob_key(const uint8_t d[D], char *key, size_t cap) {
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(d, hex);
  snprintf(key, cap, "sha256/%.2s/%.2s/%s", hex, hex + 2, hex);
}

/* Fills rec as blob d's record (see the top of the file); now is the load's wall time. */
static void blob_record(const uint8_t d[D], uint64_t now, br_record *rec) {
  static const char *const types[] = {"image/jpeg", "image/png", "image/webp"};
  char key[BR_MAX_KEY + 1];
  blob_key(d, key, sizeof key);
  uint64_t age = ((uint64_t)d[8] << 24 | (uint64_t)d[9] << 16 | d[10] << 8 | d[11]) % YEAR_MS;
  const char *type = types[d[7] < 179 ? 0 : d[7] < 230 ? 1 : 2];
  br_record_init(rec, class_size(size_class(d)), type, "local", key, now - age, now - age);
  if (d[6] >= 230) {
    rec->state = d[6] < 251 ? BR_STATE_QUARANTINED : BR_STATE_HELD;
    rec->state_ms = now - age / 2;
    snprintf(rec->reason, sizeof rec->reason, "%s",
             rec->state == BR_STATE_HELD ? "held by an admin (scale bench)"
                                         : "no retained snapshot references it");
  }
}

/* ---- load ------------------------------------------------------------------------------------ */

struct loader {
  br_index *idx;
  const uint8_t *sorted; /* the digests of blobs from..to-1 in key order, or NULL: blob order */
  uint64_t from, to, now;
  unsigned thread, threads;
  uint64_t applied, other;
  br_loc_change *ch;
  br_record *recs;
};

/* One thread's share: the BATCH-sized chunks k with k % threads == thread. */
static void *load_main(void *arg) {
  struct loader *l = arg;
  for (uint64_t lo = l->from + (uint64_t)l->thread * BATCH; lo < l->to;
       lo += (uint64_t)l->threads * BATCH) {
    size_t n = l->to - lo < BATCH ? (size_t)(l->to - lo) : BATCH;
    for (size_t j = 0; j < n; j++) {
      br_loc_change *c = &l->ch[j];
      memset(c, 0, sizeof *c);
      if (l->sorted)
        memcpy(c->digest, l->sorted + (lo - l->from + j) * D, D);
      else
        blob_digest(lo + j, c->digest);
      blob_record(c->digest, l->now, &l->recs[j]);
      c->kind = BR_LOC_INSERT;
      c->rec = &l->recs[j];
    }
    br_err err;
    int rc = br_index_apply_locations(l->idx, l->ch, n, l->now, &err);
    if (rc != 0) die("apply_locations at blob %" PRIu64 ": %d %s", lo, rc, err.msg);
    for (size_t j = 0; j < n; j++) l->ch[j].outcome == BR_LOC_APPLIED ? l->applied++ : l->other++;
  }
  return NULL;
}

static int by_key(const void *a, const void *b) { return memcmp(a, b, D); }

/* Loads blobs from..to-1; sorted: in key order (each transaction then writes a few neighbouring
 * pages instead of one page per record, as a bulk import would), else in blob (random) order. */
static int cmd_load(const char *data, uint64_t from, uint64_t to, unsigned threads, int sorted) {
  char dir[4096], file[4200];
  snprintf(dir, sizeof dir, "%s/index", data);
  if (mkdir(dir, 0755) < 0 && errno != EEXIST) die("%s: %s", dir, strerror(errno));
  br_index_options opt = {.map_size = 1ull << 40, .batch_max = TXN_MAX};
  br_err err;
  double t0 = now_s();
  uint8_t *keys = NULL;
  if (sorted && to > from) {
    keys = malloc((to - from) * D);
    if (!keys) die("out of memory for %" PRIu64 " digests", to - from);
    for (uint64_t i = from; i < to; i++) blob_digest(i, keys + (i - from) * D);
    qsort(keys, to - from, D, by_key);
  }
  double t_sort = now_s() - t0;
  br_index *idx = br_index_open(dir, &opt, &err);
  if (!idx) die("%s: %s", dir, err.msg);
  struct loader l[MAX_THREADS];
  pthread_t tid[MAX_THREADS];
  uint64_t now = wall_ms();
  for (unsigned t = 0; t < threads; t++) {
    l[t] = (struct loader){.idx = idx,
                           .sorted = keys,
                           .from = from,
                           .to = to,
                           .now = now,
                           .thread = t,
                           .threads = threads};
    l[t].ch = malloc(BATCH * sizeof *l[t].ch);
    l[t].recs = malloc(BATCH * sizeof *l[t].recs);
    if (!l[t].ch || !l[t].recs) die("out of memory");
    if (pthread_create(&tid[t], NULL, load_main, &l[t])) die("pthread_create failed");
  }
  uint64_t applied = 0, other = 0;
  for (unsigned t = 0; t < threads; t++) {
    pthread_join(tid[t], NULL);
    applied += l[t].applied;
    other += l[t].other;
    free(l[t].ch);
    free(l[t].recs);
  }
  br_index_stats st;
  br_index_get_stats(idx, &st);
  br_index_close(idx);
  free(keys);
  double secs = now_s() - t0;
  snprintf(file, sizeof file, "%s/data.mdb", dir);
  struct stat sb;
  if (stat(file, &sb) < 0) die("%s: %s", file, strerror(errno));
  printf("{\"step\":\"load\",\"from\":%" PRIu64 ",\"to\":%" PRIu64 ",\"applied\":%" PRIu64
         ",\"other\":%" PRIu64
         ",\"sorted\":%d,\"sort_seconds\":%.3f,\"seconds\":%.3f,\"commits\":%" PRIu64
         ",\"entries\":%" PRIu64 ",\"map_used\":%" PRIu64
         ",\"file_bytes\":%lld,\"file_alloc_bytes\":%lld}\n",
         from, to, applied, other, sorted, t_sort, secs, st.commits, st.entries, st.map_used,
         (long long)sb.st_size, (long long)sb.st_blocks * 512);
  return other ? 1 : 0;
}

/* ---- hashes, links --------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int cmd_hashes(uint64_t n, uint64_t k, uint64_t seed) {
  for (uint64_t j = 0; j < k;) {
    uint8_t d[D];
    char hex[BR_HEX_LEN + 1];
    blob_digest(rng_next(&seed) % n, d);
    if (d[6] >= 230) continue; /* quarantined or held: answered 410 */
    j++;
    br_hex_encode(d, hex);
    puts(hex);
  }
  return 0;
}

static void mkdirs(const char *path) { /* every parent of path */
  char p[4096];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0755) < 0 && errno != EEXIST) die("%s: %s", p, strerror(errno));
    *s = '/';
  }
}

static int cmd_links(const char *root, uint64_t from, uint64_t to) {
  char base[4096], path[4096], key[BR_MAX_KEY + 1];
  for (unsigned c = 0; c < SIZE_CLASSES; c++) {
    snprintf(base, sizeof base, "%s/sizes/%u", root, c);
    mkdirs(base);
    int fd = open(base, O_WRONLY | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)class_size(c)) < 0 || close(fd) < 0)
      die("%s: %s", base, strerror(errno));
  }
  double t0 = now_s();
  uint64_t made = 0;
  for (uint64_t i = from; i < to; i++) {
    uint8_t d[D];
    blob_digest(i, d);
    blob_key(d, key, sizeof key);
    snprintf(base, sizeof base, "%s/sizes/%u", root, size_class(d));
    snprintf(path, sizeof path, "%s/%s", root, key);
    if (link(base, path) < 0) {
      if (errno == ENOENT) {
        mkdirs(path);
        if (link(base, path) == 0) {
          made++;
          continue;
        }
      }
      if (errno != EEXIST) die("%s: %s", path, strerror(errno));
    } else {
      made++;
    }
  }
  printf("{\"step\":\"links\",\"from\":%" PRIu64 ",\"to\":%" PRIu64 ",\"made\":%" PRIu64
         ",\"seconds\":%.3f}\n",
         from, to, made, now_s() - t0);
  return 0;
}

int main(int argc, char **argv) {
  if (argc >= 5 && argc <= 7 && !strcmp(argv[1], "load"))
    return cmd_load(argv[2], arg_u64(argv[3], 0, MAX_BLOBS), arg_u64(argv[4], 1, MAX_BLOBS),
                    argc >= 6 ? (unsigned)arg_u64(argv[5], 1, MAX_THREADS) : 16,
                    argc == 7 ? strcmp(argv[6], "random") != 0 : 1);
  if (argc == 5 && !strcmp(argv[1], "hashes"))
    return cmd_hashes(arg_u64(argv[2], 1, MAX_BLOBS), arg_u64(argv[3], 1, 10000000),
                      arg_u64(argv[4], 0, UINT64_MAX));
  if (argc == 5 && !strcmp(argv[1], "links"))
    return cmd_links(argv[2], arg_u64(argv[3], 0, MAX_BLOBS), arg_u64(argv[4], 1, MAX_BLOBS));
  fprintf(stderr,
          "usage: scale_load load DATA_DIR FROM TO [THREADS] | hashes N K SEED | "
          "links ROOT FROM TO\n");
  return 2;
}
