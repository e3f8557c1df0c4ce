/* The delete benchmark's program (tests/bench/delete-bench.sh, make bench-deletes).
 *
 *   delete_bench CONF MODE N THREADS
 *
 * CONF is a config whose [server] data_dir holds a fresh index and whose one store, lake, is an s3
 * store over radosgw. Seeds N blobs of 4 KiB (SHA-256("delete-bench" MODE i) as the bytes' seed),
 * their objects PUT by THREADS writers and their records written by as many uploaders (group
 * commit), then marks them quarantined and then deleting, as reconcile does before it deletes a
 * blob's bytes. The timed step is what reconcile does next: br_reconciler_open finishes every
 * marked delete. MODE batch: the blobs' locks are taken together (lock_blobs, as the daemon on an
 * LMDB index), so they go 1,000 a DeleteObjects with one index transaction per batch; MODE single:
 * no lock_blobs (as on a shared index), one DELETE and one index transaction per blob, the way
 * every delete went before. MODE store1k and store time the store layer alone (no index):
 * br_store_delete_many called 1,000 keys at a time (one DeleteObjects in flight, as reconcile calls
 * it) against one call with all N keys (up to four in flight). Prints one line of JSON; checks that
 * the bucket (and, for batch and single, the index) is empty afterwards. */
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blobref/config.h"
#include "blobref/index.h"
#include "blobref/reconcile.h"
#include "blobref/store.h"

#define D BR_SHA256_LEN
#define SIZE 4096

static void die(const char *fmt, const char *msg) {
  fprintf(stderr, "delete_bench: ");
  fprintf(stderr, fmt, msg);
  fputc('\n', stderr);
  exit(1);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct seed {
  br_store *st;
  br_index *idx;
  const char *mode;
  uint64_t n;
  uint8_t *digests;
  atomic_uint_fast64_t next;
  atomic_int failed;
};

/* Blob i's bytes (SIZE of them, from a seed) and digest. */
static void blob_bytes(const char *mode, uint64_t i, uint8_t *out, uint8_t digest[D]) {
  uint8_t seed[D];
  char name[64];
  int n = snprintf(name, sizeof name, "delete-bench %s %" PRIu64, mode, i);
  EVP_Digest(name, (size_t)n, seed, NULL, EVP_sha256(), NULL);
  for (size_t k = 0; k < SIZE; k++) out[k] = seed[k % D] ^ (uint8_t)(k * 131);
  EVP_Digest(out, SIZE, digest, NULL, EVP_sha256(), NULL);
}

static void *seed_main(void *arg) {
  struct seed *sd = arg;
  uint8_t buf[SIZE];
  for (;;) {
    uint64_t i = atomic_fetch_add(&sd->next, 1);
    if (i >= sd->n || atomic_load(&sd->failed)) return NULL;
    uint8_t *d = sd->digests + i * D;
    blob_bytes(sd->mode, i, buf, d);
    br_err err;
    char key[BR_MAX_KEY + 1];
    br_store_default_key(sd->st, d, key, sizeof key);
    br_store_writer *w = br_store_write_begin(sd->st, &err);
    if (!w || br_store_write(w, buf, SIZE, &err) < 0 || br_store_write_commit(w, key, &err) < 0) {
      fprintf(stderr, "delete_bench: put: %s\n", err.msg);
      atomic_store(&sd->failed, 1);
      return NULL;
    }
    uint64_t t = br_now_ms() - 86400000;
    br_record rec;
    br_record_init(&rec, SIZE, "application/octet-stream", "lake", key, t, t);
    int created = 0;
    if (br_index_record_upload(sd->idx, d, &rec, &created, NULL, &err) != 0) {
      fprintf(stderr, "delete_bench: record: %s\n", err.msg);
      atomic_store(&sd->failed, 1);
      return NULL;
    }
  }
}

/* Applies kind to every seeded blob, 4,096 a transaction, at now_ms (expecting state time
 * expect_ms). */
static void change_all(struct seed *sd, enum br_change_kind kind, uint64_t expect_ms,
                       uint64_t now_ms) {
  enum { B = 4096 };
  br_change *chs = calloc(B, sizeof *chs);
  if (!chs) die("%s", "out of memory");
  for (uint64_t base = 0; base < sd->n; base += B) {
    size_t n = sd->n - base < B ? (size_t)(sd->n - base) : B;
    for (size_t i = 0; i < n; i++) {
      memset(&chs[i], 0, sizeof chs[i]);
      memcpy(chs[i].digest, sd->digests + (base + i) * D, D);
      chs[i].kind = kind;
      chs[i].cutoff_ms = UINT64_MAX;
      chs[i].expect_state_ms = expect_ms;
      chs[i].reason = "bench";
    }
    br_err err;
    if (br_index_apply_changes(sd->idx, chs, n, now_ms, &err) < 0) die("change: %s", err.msg);
    for (size_t i = 0; i < n; i++)
      if (!chs[i].applied) die("%s", "a change was not applied");
  }
  free(chs);
}

static int count_key(void *ud, const char *key, uint64_t size) {
  ++*(uint64_t *)ud;
  return 0;
}

static int no_lock(void *ud, const uint8_t digest[D], int lock) { return 0; }
static int no_locks(void *ud, const uint8_t (*digests)[D], size_t n, int lock) { return 0; }

/* CPU seconds (user + system) of the processes listed in $RGW_PIDS (radosgw and its Ceph
 * daemons), 0 when it is not set: what the store spent on the timed step. */
static double rgw_cpu_s(void) {
  const char *list = getenv("RGW_PIDS");
  double total = 0;
  long hz = sysconf(_SC_CLK_TCK);
  for (const char *p = list ? list : ""; *p;) {
    char *end;
    long pid = strtol(p, &end, 10);
    if (end == p) {
      p++;
      continue;
    }
    p = end;
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *q = strrchr(buf, ')'); /* fields after the command name: 3 is the state */
    unsigned long long ut = 0, st = 0;
    if (q && sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2)
      total += (double)(ut + st) / (double)hz;
  }
  return total;
}

/* This process's CPU seconds so far. */
static double self_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double seed_s_since(double t0) { return now_s() - t0; }

/* The store modes' timed step: br_store_delete_many of every seeded key, in one call (all) or
 * 1,000 keys a call; prints the JSON line. Returns the exit status. */
static int store_bench(struct seed *sd, double seed_s, int all) {
  char(*names)[BR_MAX_KEY + 1] = malloc(sd->n * sizeof *names);
  const char **keys = malloc(sd->n * sizeof *keys);
  uint8_t *failed = malloc(sd->n ? sd->n : 1);
  if (!names || !keys || !failed) die("%s", "out of memory");
  for (uint64_t i = 0; i < sd->n; i++) {
    br_store_default_key(sd->st, sd->digests + i * D, names[i], sizeof names[i]);
    keys[i] = names[i];
  }
  br_err err;
  double g0 = rgw_cpu_s(), c0 = self_cpu_s(), t1 = now_s();
  size_t step = all ? sd->n : 1000;
  for (uint64_t base = 0; base < sd->n; base += step) {
    size_t n = sd->n - base < step ? (size_t)(sd->n - base) : step;
    if (br_store_delete_many(sd->st, keys + base, n, failed + base, &err) < 0)
      die("delete_many: %s", err.msg);
  }
  double secs = now_s() - t1, rgw_s = rgw_cpu_s() - g0, own_s = self_cpu_s() - c0;
  uint64_t left = 0;
  if (br_store_list(sd->st, "", count_key, &left, &err) < 0) die("list: %s", err.msg);
  printf("{\"mode\":\"%s\",\"blobs\":%" PRIu64
         ",\"seed_seconds\":%.1f,\"seconds\":%.3f,"
         "\"ms_per_blob\":%.3f,\"blobs_per_s\":%.0f,\"index_commits\":0,\"objects_left\":%" PRIu64
         ",\"rgw_cpu_ms_per_blob\":%.3f,\"own_cpu_ms_per_blob\":%.3f}\n",
         sd->mode, sd->n, seed_s, secs, secs * 1000.0 / (double)(sd->n ? sd->n : 1),
         (double)sd->n / secs, left, rgw_s * 1000.0 / (double)(sd->n ? sd->n : 1),
         own_s * 1000.0 / (double)(sd->n ? sd->n : 1));
  free(names);
  free(keys);
  free(failed);
  return left != 0 ? 2 : 0;
}

int main(int argc, char **argv) {
  if (argc != 5) die("%s", "usage: delete_bench CONF batch|single|store1k|store N THREADS");
  const char *mode = argv[2];
  int batch = !strcmp(mode, "batch");
  int store_only = !strcmp(mode, "store1k") || !strcmp(mode, "store");
  if (!batch && !store_only && strcmp(mode, "single")) die("unknown mode %s", mode);
  uint64_t n = strtoull(argv[3], NULL, 10);
  unsigned threads = (unsigned)atoi(argv[4]);
  br_config cfg;
  br_err err;
  br_config_init(&cfg);
  if (br_config_load(&cfg, argv[1], &err) < 0 || br_config_finish(&cfg, &err) < 0)
    die("config: %s", err.msg);
  if (cfg.nstores != 1) die("%s", "the config needs one store (lake)");
  br_store *st = br_store_open(&cfg.stores[0], &err);
  if (!st) die("store: %s", err.msg);
  char path[4200];
  snprintf(path, sizeof path, "%s/index", cfg.data_dir);
  mkdir(cfg.data_dir, 0755);
  mkdir(path, 0755);
  br_index_options o = {.map_size = cfg.index_map_size, .batch_max = (unsigned)cfg.index_batch_max};
  br_index *idx = br_index_open(path, &o, &err);
  if (!idx) die("index: %s", err.msg);

  struct seed sd = {.st = st, .idx = idx, .mode = mode, .n = n, .digests = malloc(n * D)};
  if (!sd.digests) die("%s", "out of memory");
  double t0 = now_s();
  pthread_t *th = calloc(threads, sizeof *th);
  for (unsigned i = 0; i < threads; i++) pthread_create(&th[i], NULL, seed_main, &sd);
  for (unsigned i = 0; i < threads; i++) pthread_join(th[i], NULL);
  if (atomic_load(&sd.failed)) die("%s", "seeding failed");
  if (store_only) return store_bench(&sd, seed_s_since(t0), !strcmp(mode, "store"));
  uint64_t q_ms = br_now_ms(), d_ms = q_ms + 1;
  change_all(&sd, BR_CHANGE_QUARANTINE, 0, q_ms);
  change_all(&sd, BR_CHANGE_MARK_DELETE, q_ms, d_ms);
  double seed_s = now_s() - t0;

  char state[4300];
  snprintf(state, sizeof state, "%s/reconcile", cfg.data_dir);
  br_store *stores[1] = {st};
  br_reconcile_env env = {.cfg = &cfg,
                          .index = idx,
                          .stores = stores,
                          .nstores = 1,
                          .state_dir = state,
                          .lock_blob = no_lock,
                          .lock_blobs = batch ? no_locks : NULL};
  br_index_stats before, after;
  br_index_get_stats(idx, &before);
  double g0 = rgw_cpu_s(), c0 = self_cpu_s(), t1 = now_s();
  br_reconciler *r = br_reconciler_open(&env, &err); /* finishes the marked deletes */
  double secs = now_s() - t1, rgw_s = rgw_cpu_s() - g0, own_s = self_cpu_s() - c0;
  if (!r) die("reconciler: %s", err.msg);
  br_index_get_stats(idx, &after);
  uint64_t left = 0;
  if (br_store_list(st, "", count_key, &left, &err) < 0) die("list: %s", err.msg);
  printf("{\"mode\":\"%s\",\"blobs\":%" PRIu64
         ",\"seed_seconds\":%.1f,\"seconds\":%.3f,"
         "\"ms_per_blob\":%.3f,\"blobs_per_s\":%.0f,\"index_commits\":%" PRIu64
         ",\"records_left\":%" PRIu64 ",\"objects_left\":%" PRIu64
         ",\"rgw_cpu_ms_per_blob\":%.3f,\"own_cpu_ms_per_blob\":%.3f}\n",
         mode, n, seed_s, secs, secs * 1000.0 / (double)(n ? n : 1), (double)n / secs,
         after.commits - before.commits, after.entries, left, rgw_s * 1000.0 / (double)(n ? n : 1),
         own_s * 1000.0 / (double)(n ? n : 1));
  int bad = after.entries != 0 || left != 0;
  br_reconciler_close(r);
  br_index_close(idx);
  br_store_close(st);
  br_config_free(&cfg);
  free(sd.digests);
  free(th);
  return bad ? 2 : 0;
}
