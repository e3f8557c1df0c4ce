/* The reconcile benchmark's program (tests/bench/reconcile-bench.sh, make bench-reconcile).
 *
 *   reconcile_bench gen DIR   writes the table's Parquet data files (our writer: hex hashes,
 *                             snappy) and metadata.json files into DIR/table, and DIR/job.json:
 *                             the manifests and manifest lists for tests/integration/
 *                             iceberg_write.mjs (avsc) to write
 *   reconcile_bench run DIR [STEP...]
 *                             fills a fresh index in DIR/data with every blob (fill), then runs
 *                             reconcile: a full run (full), a rerun with no table change (rerun),
 *                             a run after one appended snapshot (append), and (SPILL=1) a full dry
 *                             run with a small sort buffer (full_spill); one line of JSON per step
 *                             on stdout. Naming steps runs only those (e.g. under perf record).
 *
 * Sizes (the same environment for both modes): SNAPSHOTS=100 FILES_PER_SNAPSHOT=10
 * HASHES_PER_FILE=1000 (LISTS=0: reconcile runs with [reconcile] lists = false; FILL=bulk: the
 * index filled through br_index_apply_locations, 4 threads by default, as an import would, instead
 * of br_index_record_upload from FILL_THREADS uploaders; index_map_size grows with the index, 8
 * GiB plus 1 KiB a blob). Of each data file's values, 90 % are blobs of its own (so every
 * indexed blob referenced once) and 10 % repeat blobs of the previous file; the index holds the
 * referenced blobs plus 1/9 as many that nothing references (10 % of the index), all uploaded 30
 * days ago. The appended snapshot (v{SNAPSHOTS+1}) adds FILES_PER_SNAPSHOT files whose values are
 * half unreferenced blobs (quarantined by the first run: restored) and half hashes the index lacks.
 *
 * Every step runs in a child process so that its peak RSS and CPU time (the child's rusage from
 * wait4) are its own; a sampler thread also records the peaks of RssAnon (heap, sort buffer) and
 * RssFile (LMDB's mapped pages, which the kernel may drop at will).
 *
 * Blob i's digest is SHA-256("blob" || i as 8 little-endian bytes). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "blobref/config.h"
#include "blobref/index.h"
#include "blobref/parquet.h"
#include "blobref/reconcile.h"
#include "blobref/store.h"

#define D BR_SHA256_LEN
#define DAY_MS (24ull * 3600 * 1000)

static unsigned snapshots = 100, files_per_snapshot = 10, hashes_per_file = 1000;
static unsigned fill_threads = 1024;
static unsigned lists_on = 1; /* LISTS=0: [reconcile] lists = false (counts only) */
static unsigned fill_bulk;    /* FILL=bulk: the index through the batch API, not uploads */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "reconcile_bench: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static unsigned env_uint(const char *name, unsigned def, unsigned lo, unsigned hi) {
  const char *v = getenv(name);
  if (!v || !*v) return def;
  char *end;
  unsigned long x = strtoul(v, &end, 10);
  if (*end || x < lo || x > hi) die("%s=%s: want %u..%u", name, v, lo, hi);
  return (unsigned)x;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the data set ---------------------------------------------------------------------------- */

static unsigned own_per_file(void) { return hashes_per_file - hashes_per_file / 10; }
static uint64_t referenced_blobs(void) {
  return (uint64_t)snapshots * files_per_snapshot * own_per_file();
}
static uint64_t indexed_blobs(void) { return referenced_blobs() + referenced_blobs() / 9; }

static void blob_digest(uint64_t i, uint8_t out[D]) {
  uint8_t msg[12] = {'b', 'l', 'o', 'b'};
  for (int k = 0; k < 8; k++) msg[4 + k] = (uint8_t)(i >> (8 * k));
  unsigned len = 0;
  if (!EVP_Digest(msg, sizeof msg, out, &len, EVP_sha256(), NULL)) die("EVP_Digest failed");
}

/* Value j of data file f (f counts from 0; files past the table's are the appended snapshot's). */
static uint64_t file_value(unsigned f, unsigned j) {
  unsigned own = own_per_file(), nfiles = snapshots * files_per_snapshot;
  uint64_t refd = referenced_blobs();
  if (f < nfiles) {
    if (j < own) return (uint64_t)f * own + j;
    uint64_t prev = f ? (uint64_t)(f - 1) * own : refd - own; /* the previous file's blobs */
    return prev + (j - own) * 7 % own;
  }
  uint64_t k = (uint64_t)(f - nfiles) * hashes_per_file + j;
  if (j % 2 == 0) return refd + k / 2 % (indexed_blobs() - refd); /* unreferenced: restored */
  return indexed_blobs() + k;                                     /* not in the index */
}

/* ---- gen ------------------------------------------------------------------------------------- */

static int64_t write_data_file(const char *path, unsigned f) {
  FILE *fp = fopen(path, "wb");
  if (!fp) die("%s: %s", path, strerror(errno));
  br_parquet_column_spec cols[2] = {
      {.name = "id", .type = BR_PQ_INT64},
      {.name = "image_sha256", .type = BR_PQ_BYTE_ARRAY, .optional = 1, .utf8 = 1}};
  br_parquet_write_options o = {.codec = BR_PQ_SNAPPY};
  br_err err;
  br_parquet_writer *w = br_parquet_writer_new(cols, 2, &o, br_parquet_write_stdio, fp, &err);
  if (!w) die("%s: %s", path, err.msg);
  for (unsigned j = 0; j < hashes_per_file; j++) {
    int64_t id = (int64_t)f * hashes_per_file + j;
    uint8_t d[D];
    char hex[BR_HEX_LEN + 1];
    blob_digest(file_value(f, j), d);
    br_hex_encode(d, hex);
    br_parquet_value v[2] = {{(const uint8_t *)&id, 8, 0}, {(const uint8_t *)hex, BR_HEX_LEN, 0}};
    if (br_parquet_writer_row(w, v, &err) < 0) die("%s: %s", path, err.msg);
  }
  if (br_parquet_writer_finish(w, &err) < 0) die("%s: %s", path, err.msg);
  br_parquet_writer_free(w);
  if (fclose(fp) != 0) die("%s: %s", path, strerror(errno));
  struct stat st;
  if (stat(path, &st) < 0) die("%s: %s", path, strerror(errno));
  return (int64_t)st.st_size;
}

static void write_metadata(const char *table, unsigned nsnap) {
  json_t *snaps = json_array();
  for (unsigned s = 1; s <= nsnap; s++) {
    char ml[4200];
    snprintf(ml, sizeof ml, "%s/metadata/snap-%03u.avro", table, s);
    json_array_append_new(snaps, json_pack("{s:I,s:I,s:I,s:{s:s},s:s}", "snapshot-id",
                                           (json_int_t)s, "sequence-number", (json_int_t)s,
                                           "timestamp-ms", (json_int_t)(1700000000000 + s * 1000),
                                           "summary", "operation", "append", "manifest-list", ml));
  }
  json_t *md = json_pack(
      "{s:i,s:s,s:s,s:I,s:i,s:[{s:s,s:i,s:[{s:i,s:s,s:b,s:s},{s:i,s:s,s:b,s:s}]}],s:i,"
      "s:[{s:i,s:[]}],s:i,s:{},s:I,s:I,s:o}",
      "format-version", 2, "table-uuid", "5f0c1f52-6a5e-4d1e-9a3c-0b2f2b7a9e11", "location", table,
      "last-updated-ms", (json_int_t)(1700000000000 + nsnap * 1000), "last-column-id", 2, "schemas",
      "type", "struct", "schema-id", 0, "fields", "id", 1, "name", "id", "required", 1, "type",
      "long", "id", 2, "name", "image_sha256", "required", 0, "type", "string", "current-schema-id",
      0, "partition-specs", "spec-id", 0, "fields", "default-spec-id", 0, "properties",
      "current-snapshot-id", (json_int_t)nsnap, "last-sequence-number", (json_int_t)nsnap,
      "snapshots", snaps);
  if (!md) die("json_pack failed");
  char path[4200];
  snprintf(path, sizeof path, "%s/metadata/v%u.metadata.json", table, nsnap);
  if (json_dump_file(md, path, JSON_INDENT(1)) < 0) die("%s: cannot write", path);
  json_decref(md);
}

static void cmd_gen(const char *dir) {
  char table[4096], path[4200];
  snprintf(table, sizeof table, "%s/table", dir);
  snprintf(path, sizeof path, "%s/data", table);
  if (mkdir(table, 0755) < 0 || mkdir(path, 0755) < 0) die("mkdir %s: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s/metadata", table);
  if (mkdir(path, 0755) < 0) die("mkdir %s: %s", path, strerror(errno));
  json_t *avro = json_array();
  json_t *listed = json_array(); /* manifest list records so far */
  double t0 = now_s();
  for (unsigned s = 1; s <= snapshots + 1; s++) {
    json_t *entries = json_array();
    for (unsigned k = 0; k < files_per_snapshot; k++) {
      unsigned f = (s - 1) * files_per_snapshot + k;
      snprintf(path, sizeof path, "%s/data/%05u-%u.parquet", table, f, s);
      int64_t size = write_data_file(path, f);
      json_array_append_new(
          entries, json_pack("{s:i,s:I,s:{s:i,s:s,s:s,s:I,s:I}}", "status", 1, "snapshot_id",
                             (json_int_t)s, "data_file", "content", 0, "file_path", path,
                             "file_format", "PARQUET", "record_count", (json_int_t)hashes_per_file,
                             "file_size_in_bytes", (json_int_t)size));
    }
    snprintf(path, sizeof path, "%s/metadata/m%03u.avro", table, s);
    json_array_append_new(avro, json_pack("{s:s,s:s,s:i,s:s,s:{s:s},s:o}", "path", path, "kind",
                                          "manifest", "version", 2, "codec", "deflate", "meta",
                                          "format-version", "2", "records", entries));
    json_array_append_new(
        listed,
        json_pack("{s:s,s:i,s:I,s:I,s:I,s:i,s:i,s:i}", "manifest_path", path, "content", 0,
                  "sequence_number", (json_int_t)s, "min_sequence_number", (json_int_t)s,
                  "added_snapshot_id", (json_int_t)s, "added_files_count", (int)files_per_snapshot,
                  "existing_files_count", 0, "deleted_files_count", 0));
    snprintf(path, sizeof path, "%s/metadata/snap-%03u.avro", table, s);
    json_array_append_new(avro, json_pack("{s:s,s:s,s:i,s:s,s:O}", "path", path, "kind", "list",
                                          "version", 2, "codec", "deflate", "records", listed));
    /* the next list starts from a copy: this one is shared with the job until it is dumped */
    json_t *next = json_copy(listed);
    json_decref(listed);
    listed = next;
  }
  json_decref(listed);
  write_metadata(table, snapshots);
  write_metadata(table, snapshots + 1);
  json_t *job = json_pack("{s:[],s:o}", "parquet", "avro", avro);
  snprintf(path, sizeof path, "%s/job.json", dir);
  if (json_dump_file(job, path, JSON_COMPACT) < 0) die("%s: cannot write", path);
  json_decref(job);
  printf("{\"step\":\"gen\",\"data_files\":%u,\"values\":%" PRIu64 ",\"seconds\":%.2f}\n",
         (snapshots + 1) * files_per_snapshot,
         (uint64_t)(snapshots + 1) * files_per_snapshot * hashes_per_file, now_s() - t0);
}

/* ---- run: the steps, each in a child ------------------------------------------------------- */

struct sampler {
  pthread_t thread;
  atomic_int stop;
  long anon_kb, file_kb; /* peaks */
};

static void sample_once(struct sampler *s) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return;
  char line[256];
  long v;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "RssAnon: %ld", &v) == 1 && v > s->anon_kb) s->anon_kb = v;
    if (sscanf(line, "RssFile: %ld", &v) == 1 && v > s->file_kb) s->file_kb = v;
  }
  fclose(f);
}

static void *sampler_main(void *arg) {
  struct sampler *s = arg;
  while (!atomic_load(&s->stop)) {
    sample_once(s);
    nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
  }
  sample_once(s);
  return NULL;
}

/* This thread's time waiting for a CPU (run queue), in seconds: on a busy machine the wall time
 * is CPU + this + I/O waits. */
static double runq_wait_s(void) {
  FILE *f = fopen("/proc/thread-self/schedstat", "r");
  unsigned long long run = 0, wait = 0;
  if (f) {
    if (fscanf(f, "%llu %llu", &run, &wait) != 2) wait = 0;
    fclose(f);
  }
  return (double)wait / 1e9;
}

static void load_config(br_config *cfg, const char *dir, unsigned version) {
  char text[16384];
  snprintf(text, sizeof text,
           "[server]\n"
           "data_dir = %s/data\n"
           "index_map_size = %" PRIu64
           "GiB\n"
           "[reconcile]\n"
           "grace = 72h\n"
           "retention = 36500d\n"
           "max_fraction = 1.0\n"
           "lists = %s\n"
           "[table bench]\n"
           "location = %s/table/metadata/v%u.metadata.json\n"
           "column = image_sha256\n"
           "form = hex\n",
           dir, 8 + indexed_blobs() / (1u << 20), lists_on ? "true" : "false", dir, version);
  br_err err;
  br_config_init(cfg);
  if (br_config_load_string(cfg, text, "bench", &err) < 0 || br_config_finish(cfg, &err) < 0)
    die("config: %s", err.msg);
}

static br_index *open_index(const br_config *cfg) {
  char path[4200];
  snprintf(path, sizeof path, "%s/index", cfg->data_dir);
  mkdir(cfg->data_dir, 0755);
  mkdir(path, 0755);
  br_index_options o = {.map_size = cfg->index_map_size,
                        .batch_max = (unsigned)cfg->index_batch_max};
  br_err err;
  br_index *idx = br_index_open(path, &o, &err);
  if (!idx) die("index: %s", err.msg);
  return idx;
}

/* fill: fill_threads uploaders take the blobs in digest order (so that each group commit touches
 * neighbouring pages) through br_index_record_upload, as the server's finishers do. */
struct fill {
  br_index *idx;
  uint8_t *digests;
  uint64_t n;
  atomic_uint_fast64_t next;
  uint64_t uploaded_ms;
  atomic_int failed;
};

static int cmp_digest(const void *a, const void *b) { return memcmp(a, b, D); }

static void *fill_main(void *arg) {
  struct fill *fl = arg;
  br_record rec = {.size = 4096,
                   .created_ms = fl->uploaded_ms,
                   .last_upload_ms = fl->uploaded_ms,
                   .state = BR_STATE_LIVE,
                   .state_ms = fl->uploaded_ms,
                   .content_type = "application/octet-stream",
                   .nlocations = 1};
  snprintf(rec.locations[0].store, sizeof rec.locations[0].store, "local");
  rec.locations[0].role = BR_ROLE_PRIMARY;
  for (;;) {
    uint64_t i = atomic_fetch_add(&fl->next, 1);
    if (i >= fl->n || atomic_load(&fl->failed)) break;
    const uint8_t *d = fl->digests + i * D;
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(d, hex);
    snprintf(rec.locations[0].key, sizeof rec.locations[0].key, "sha256/%.2s/%.2s/%s", hex, hex + 2,
             hex);
    br_err err;
    int created = 0;
    if (br_index_record_upload(fl->idx, d, &rec, &created, NULL, &err) != 0 || !created) {
      fprintf(stderr, "reconcile_bench: fill: %s\n", created ? err.msg : "not created");
      atomic_store(&fl->failed, 1);
      break;
    }
  }
  return NULL;
}

/* FILL=bulk: each thread takes BULK_CHUNK blobs at a time, in digest order, through the writer's
 * batch API (br_index_apply_locations, BR_LOC_INSERT: the path of --import-index and POST
 * /v1/import, as tests/bench/scale_load.c loads), BULK_TXN records a transaction. The records are
 * the same as fill_main's. */
#define BULK_CHUNK 1024
#define BULK_TXN 16384
static void *bulk_main(void *arg) {
  struct fill *fl = arg;
  br_loc_change *ch = calloc(BULK_CHUNK, sizeof *ch);
  br_record *recs = calloc(BULK_CHUNK, sizeof *recs);
  if (!ch || !recs) die("out of memory");
  for (;;) {
    uint64_t lo = atomic_fetch_add(&fl->next, BULK_CHUNK);
    if (lo >= fl->n || atomic_load(&fl->failed)) break;
    size_t n = fl->n - lo < BULK_CHUNK ? (size_t)(fl->n - lo) : BULK_CHUNK;
    for (size_t j = 0; j < n; j++) {
      const uint8_t *d = fl->digests + (lo + j) * D;
      char hex[BR_HEX_LEN + 1], key[BR_MAX_KEY + 1];
      br_hex_encode(d, hex);
      snprintf(key, sizeof key, "sha256/%.2s/%.2s/%s", hex, hex + 2, hex);
      br_record_init(&recs[j], 4096, "application/octet-stream", "local", key, fl->uploaded_ms,
                     fl->uploaded_ms);
      memset(&ch[j], 0, sizeof ch[j]);
      memcpy(ch[j].digest, d, D);
      ch[j].kind = BR_LOC_INSERT;
      ch[j].rec = &recs[j];
    }
    br_err err;
    int rc = br_index_apply_locations(fl->idx, ch, n, br_now_ms(), &err);
    for (size_t j = 0; rc == 0 && j < n; j++)
      if (ch[j].outcome != BR_LOC_APPLIED) rc = 1;
    if (rc != 0) {
      fprintf(stderr, "reconcile_bench: bulk fill at %" PRIu64 ": %d %s\n", lo, rc,
              rc == 1 ? "not inserted" : err.msg);
      atomic_store(&fl->failed, 1);
      break;
    }
  }
  free(ch);
  free(recs);
  return NULL;
}

static void step_fill(const char *dir) {
  br_config cfg;
  load_config(&cfg, dir, snapshots);
  struct fill fl = {.n = indexed_blobs(), .uploaded_ms = br_now_ms() - 30 * DAY_MS};
  double t0 = now_s();
  fl.digests = malloc(fl.n * D);
  if (!fl.digests) die("out of memory");
  for (uint64_t i = 0; i < fl.n; i++) blob_digest(i, fl.digests + i * D);
  qsort(fl.digests, fl.n, D, cmp_digest);
  double t1 = now_s();
  if (fill_bulk) cfg.index_batch_max = BULK_TXN;
  fl.idx = open_index(&cfg);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 128 * 1024);
  pthread_t *th = calloc(fill_threads, sizeof *th);
  for (unsigned i = 0; i < fill_threads; i++)
    if (pthread_create(&th[i], &attr, fill_bulk ? bulk_main : fill_main, &fl))
      die("pthread_create failed");
  for (unsigned i = 0; i < fill_threads; i++) pthread_join(th[i], NULL);
  if (atomic_load(&fl.failed)) die("fill failed");
  br_index_stats st;
  br_index_get_stats(fl.idx, &st);
  br_index_close(fl.idx);
  double t2 = now_s();
  printf("{\"step\":\"fill\",\"mode\":\"%s\",\"blobs\":%" PRIu64
         ",\"threads\":%u,\"commits\":%" PRIu64
         ",\"digest_seconds\":%.2f,\"seconds\":%.2f,\"index_mib\":%.1f",
         fill_bulk ? "bulk" : "upload", st.entries, fill_threads, st.commits, t1 - t0, t2 - t1,
         (double)st.map_used / 1048576.0);
  free(fl.digests);
  free(th);
  br_config_free(&cfg);
}

static void step_reconcile(const char *dir, const char *name, unsigned version,
                           const br_reconcile_options *opt, size_t mem_digests) {
  br_config cfg;
  load_config(&cfg, dir, version);
  br_index *idx = open_index(&cfg);
  br_store *stores[BR_MAX_STORES];
  br_err err;
  for (int i = 0; i < cfg.nstores; i++)
    if (!(stores[i] = br_store_open(&cfg.stores[i], &err))) die("store: %s", err.msg);
  char state[4200];
  snprintf(state, sizeof state, "%s/reconcile", cfg.data_dir);
  br_reconcile_env env = {.cfg = &cfg,
                          .index = idx,
                          .stores = stores,
                          .nstores = cfg.nstores,
                          .state_dir = state,
                          .mem_digests = mem_digests};
  br_reconciler *r = br_reconciler_open(&env, &err);
  if (!r) die("reconciler: %s", err.msg);
  uint64_t id = br_reconciler_next_id(r, &err);
  if (!id) die("run id: %s", err.msg);
  struct sampler smp = {0};
  sample_once(&smp);
  pthread_create(&smp.thread, NULL, sampler_main, &smp);
  json_t *rep = NULL;
  double w0 = runq_wait_s(), t0 = now_s();
  int rc = br_reconcile_run(r, id, opt, &rep);
  double secs = now_s() - t0, runq = runq_wait_s() - w0;
  atomic_store(&smp.stop, 1);
  pthread_join(smp.thread, NULL);
  char *text = json_dumps(rep, JSON_COMPACT);
  size_t text_len = text ? strlen(text) : 0;
  printf(
      "{\"step\":\"%s\",\"rc\":%d,\"seconds\":%.3f,\"runq_wait_s\":%.3f,\"peak_anon_kib\":%ld,"
      "\"peak_file_kib\":%ld,\"report\":%s",
      name, rc, secs, runq, smp.anon_kb, smp.file_kb, text ? text : "null");
  free(text);
  json_decref(rep);
  br_reconciler_close(r);
  for (int i = 0; i < cfg.nstores; i++) br_store_close(stores[i]);
  br_index_close(idx);
  /* what the reconcile state holds after the run (data-file cache, reports, lists) */
  char path[4300];
  snprintf(path, sizeof path, "%s/data.mdb", state);
  struct stat sb;
  printf(",\"lists_on\":%u,\"report_bytes\":%zu,\"state_file_bytes\":%lld", lists_on, text_len,
         stat(path, &sb) == 0 ? (long long)sb.st_size : -1LL);
  br_config_free(&cfg);
  if (rc != 0) {
    fflush(stdout);
    _exit(3);
  }
}

/* Runs fn in a child; the child prints a JSON object without its closing brace, the parent adds
 * the child's peak RSS and closes it. */
static void in_child(void (*fn)(void *), void *arg) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", strerror(errno));
  if (pid == 0) {
    fn(arg);
    fflush(stdout);
    _exit(0);
  }
  int status;
  struct rusage ru;
  if (wait4(pid, &status, 0, &ru) < 0) die("wait4: %s", strerror(errno));
  printf(",\"max_rss_kib\":%ld,\"cpu_user_s\":%.2f,\"cpu_sys_s\":%.2f}\n", ru.ru_maxrss,
         (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6,
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6);
  fflush(stdout);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("a step failed (status %d)", status);
}

struct step {
  const char *dir, *name;
  unsigned version;
  br_reconcile_options opt;
  size_t mem;
};
static void run_fill(void *a) { step_fill(((struct step *)a)->dir); }
static void run_reconcile(void *a) {
  struct step *s = a;
  step_reconcile(s->dir, s->name, s->version, &s->opt, s->mem);
}

/* Runs the named steps (all of them when names is empty), in the order given. */
static void cmd_run(const char *dir, char **names, int nnames) {
  struct step steps[] = {
      {dir, "fill", 0, {0}, 0},
      {dir, "full", snapshots, {.full = 1}, 0},
      {dir, "rerun", snapshots, {0}, 0},
      {dir, "rerun2", snapshots, {0}, 0}, /* after a rerun that decided nothing */
      {dir, "append", snapshots + 1, {0}, 0},
      {dir, "rerun_append", snapshots + 1, {0}, 0},
      {dir, "rerun_append2", snapshots + 1, {0}, 0},
      {dir, "full_spill", snapshots + 1, {.full = 1, .dry_run = 1}, 1u << 18},
  };
  size_t n = sizeof steps / sizeof *steps;
  if (nnames == 0) {
    if (!env_uint("SPILL", 1, 0, 1)) n--;
    for (size_t i = 0; i < n; i++) in_child(i ? run_reconcile : run_fill, &steps[i]);
    return;
  }
  for (int k = 0; k < nnames; k++) {
    size_t i = 0;
    while (i < n && strcmp(steps[i].name, names[k])) i++;
    if (i == n)
      die("no step %s (fill, full, rerun, rerun2, append, rerun_append, rerun_append2, full_spill)",
          names[k]);
    in_child(i ? run_reconcile : run_fill, &steps[i]);
  }
}

int main(int argc, char **argv) {
  if (argc < 3 || (strcmp(argv[1], "gen") && strcmp(argv[1], "run")) ||
      (!strcmp(argv[1], "gen") && argc != 3)) {
    fprintf(stderr, "usage: reconcile_bench gen DIR | run DIR [STEP...]\n");
    return 2;
  }
  snapshots = env_uint("SNAPSHOTS", snapshots, 1, 10000);
  files_per_snapshot = env_uint("FILES_PER_SNAPSHOT", files_per_snapshot, 1, 10000);
  hashes_per_file = env_uint("HASHES_PER_FILE", hashes_per_file, 10, 10000000);
  fill_threads = env_uint("FILL_THREADS", fill_threads, 1, 4096);
  lists_on = env_uint("LISTS", lists_on, 0, 1);
  const char *fill = getenv("FILL");
  if (fill && *fill && strcmp(fill, "upload") && strcmp(fill, "bulk"))
    die("FILL=%s: want upload or bulk", fill);
  fill_bulk = fill && !strcmp(fill, "bulk");
  if (fill_bulk && !getenv("FILL_THREADS")) fill_threads = 4;
  br_log_min_level = BR_LOG_WARN;
  if (!strcmp(argv[1], "gen"))
    cmd_gen(argv[2]);
  else
    cmd_run(argv[2], argv + 3, argc - 3);
  return 0;
}
