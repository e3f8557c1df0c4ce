/* `blobref extract-parquet`: a Parquet file with inline binaries becomes one with SHA-256
 * references, the binaries uploaded (deduplicated); `blobref export`: the index as Parquet. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blobref/parquet.h"
#include "commands.h"
#include "http_client.h"

#define LOOKUP_BATCH 10000   /* hashes per POST /v1/lookup */
#define KNOWN_MAX (4u << 20) /* digests remembered as present (a cache: then cleared) */
#define DEFAULT_JOBS 8       /* parallel uploads */
#define MAX_JOBS 64
#define EXPORT_PAGE 10000            /* blobs per GET /v1/blobs */
#define EXPORT_ROW_GROUP (64u << 10) /* rows per row group of the export */

/* Flushes, fsyncs and closes f, then renames tmp to path. On failure removes tmp. */
static int commit_temp(FILE *f, const char *tmp, const char *path, br_err *err) {
  int rc = 0;
  if (fflush(f) != 0 || fsync(fileno(f)) != 0)
    rc = br_fail(err, "cannot write %s: %s", tmp, strerror(errno));
  if (fclose(f) != 0 && rc == 0) rc = br_fail(err, "cannot write %s: %s", tmp, strerror(errno));
  if (rc == 0 && rename(tmp, path) != 0)
    rc = br_fail(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
  if (rc) unlink(tmp);
  return rc;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- a set of digests (open addressing) ---- */

typedef struct dset {
  uint8_t (*slots)[BR_SHA256_LEN];
  uint8_t *used;
  size_t cap, n;
} dset;

static uint64_t dhash(const uint8_t *d) {
  uint64_t h;
  memcpy(&h, d, sizeof h); /* SHA-256 bytes are already uniform */
  return h;
}

static void dset_free(dset *s) {
  free(s->slots);
  free(s->used);
  memset(s, 0, sizeof *s);
}

static int dset_has(const dset *s, const uint8_t *d) {
  if (!s->cap) return 0;
  for (size_t i = dhash(d) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
    if (!s->used[i]) return 0;
    if (!memcmp(s->slots[i], d, BR_SHA256_LEN)) return 1;
  }
}

/* Adds d; returns 1 when added, 0 when present, -1 out of memory. */
static int dset_add(dset *s, const uint8_t *d) {
  if ((s->n + 1) * 2 > s->cap) {
    dset bigger = {0};
    bigger.cap = s->cap ? s->cap * 2 : 1024;
    bigger.slots = malloc(bigger.cap * BR_SHA256_LEN);
    bigger.used = calloc(bigger.cap, 1);
    if (!bigger.slots || !bigger.used) {
      dset_free(&bigger);
      return -1;
    }
    for (size_t i = 0; i < s->cap; i++)
      if (s->used[i]) dset_add(&bigger, s->slots[i]);
    dset_free(s);
    *s = bigger;
  }
  size_t i = dhash(d) & (s->cap - 1);
  for (; s->used[i]; i = (i + 1) & (s->cap - 1))
    if (!memcmp(s->slots[i], d, BR_SHA256_LEN)) return 0;
  memcpy(s->slots[i], d, BR_SHA256_LEN);
  s->used[i] = 1;
  s->n++;
  return 1;
}

/* ---- extract-parquet ---- */

static const char extract_help[] =
    "usage: blobref extract-parquet IN OUT --column NAME [--as NEW_NAME] [--form hex|binary]\n"
    "                               [--jobs N] [--quiet]\n"
    "\n"
    "Uploads every distinct value of the BYTE_ARRAY column NAME of the Parquet file IN (values\n"
    "the server already has are not sent: batch lookups first) and writes OUT with that column\n"
    "replaced by the SHA-256 of each value: 64 lowercase hex digits (--form hex, the default)\n"
    "or FIXED_LEN_BYTE_ARRAY(32) (--form binary), named NEW_NAME (default: NAME). Nulls stay\n"
    "null. Every other column chunk is copied byte for byte; row groups, row order and the\n"
    "key/value metadata are kept. OUT is written to a temporary file and renamed only when every\n"
    "upload was acknowledged. IN may be a directory: each *.parquet in it goes to OUT/ (created).\n"
    "\n"
    "  --jobs N   parallel uploads (default 8)\n"
    "  --quiet    no progress and no summary\n";

typedef struct todo {
  uint8_t digest[BR_SHA256_LEN];
  size_t row; /* index within the row group of its first occurrence */
} todo;

typedef struct extract_stats {
  int64_t rows, values, distinct;
  uint64_t value_bytes, uploaded_bytes, in_size, out_size;
  uint64_t uploads;
} extract_stats;

typedef struct extract_ctx {
  const cli_globals *g;
  const char *in_path;
  int jobs, progress;
  dset known; /* present on the server (looked up or uploaded) */
  extract_stats st;
  size_t nrow_groups;
  /* the row group being uploaded */
  const br_parquet_rg_values *rg;
  todo *missing;
  size_t nmissing;
  atomic_size_t next;
  atomic_int failed;
  atomic_uint_fast64_t uploaded_bytes, uploads;
  pthread_mutex_t lock;
  char error[sizeof(br_err)];
} extract_ctx;

static int todo_cmp(const void *a, const void *b) {
  return memcmp(((const todo *)a)->digest, ((const todo *)b)->digest, BR_SHA256_LEN);
}

static void set_error(extract_ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(extract_ctx *x, const char *fmt, ...) {
  pthread_mutex_lock(&x->lock);
  if (!atomic_load(&x->failed)) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->error, sizeof x->error, fmt, ap);
    va_end(ap);
    atomic_store(&x->failed, 1);
  }
  pthread_mutex_unlock(&x->lock);
}

/* Asks the server which of t[0..n) it has; keeps the others in t (compacted), sets *left. */
static int lookup_missing(extract_ctx *x, todo *t, size_t n, size_t *left, br_err *err) {
  json_t *hashes = json_array(), *reply = NULL;
  long status = 0;
  int rc = -1;
  dset missing = {0};
  for (size_t i = 0; i < n; i++) {
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(t[i].digest, hex);
    json_array_append_new(hashes, json_string(hex));
  }
  json_t *body = json_pack("{s:o}", "hashes", hashes);
  if (!body) {
    br_fail(err, "out of memory");
    goto out;
  }
  if (br_http_json(x->g->server, x->g->token, "POST", "/v1/lookup", body, &status, &reply, err))
    goto out;
  json_t *m = json_object_get(reply, "missing");
  if (!json_is_array(m)) {
    br_fail(err, "lookup: the reply has no \"missing\" list");
    goto out;
  }
  for (size_t i = 0; i < json_array_size(m); i++) {
    uint8_t d[BR_SHA256_LEN];
    const char *h = json_string_value(json_array_get(m, i));
    if (!h || br_hex_decode(h, strlen(h), d) || dset_add(&missing, d) < 0) {
      br_fail(err, "lookup: bad hash in the reply");
      goto out;
    }
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (dset_has(&missing, t[i].digest))
      t[k++] = t[i];
    else if (dset_add(&x->known, t[i].digest) < 0) {
      br_fail(err, "out of memory");
      goto out;
    }
  }
  *left = k;
  rc = 0;
out:
  json_decref(body);
  json_decref(reply);
  dset_free(&missing);
  return rc;
}

/* Upload worker: PUTs missing values until none is left or one failed. */
static void *upload_worker(void *arg) {
  extract_ctx *x = arg;
  br_http_req req;
  br_http_buf body = {.max = BR_HTTP_ERROR_BODY_MAX};
  br_err err;
  int have = 0;
  for (;;) {
    size_t i = atomic_fetch_add(&x->next, 1);
    if (i >= x->nmissing || atomic_load(&x->failed)) break;
    const todo *t = &x->missing[i];
    const br_parquet_value *v = &x->rg->vals[t->row];
    int64_t row = x->rg->first_row + (int64_t)t->row;
    char hex[BR_HEX_LEN + 1], path[100];
    br_hex_encode(t->digest, hex);
    snprintf(path, sizeof path, "/v1/blobs/%s", hex);
    if (!have) {
      if (br_http_req_init(&req, x->g->server, x->g->token, path, &err) ||
          br_http_req_header(&req, "Content-Type: application/octet-stream", &err) ||
          br_http_req_header(&req, "Expect:", &err)) {
        set_error(x, "row %lld: %s", (long long)row, err.msg);
        break;
      }
      have = 1;
      curl_easy_setopt(req.curl, CURLOPT_CUSTOMREQUEST, "PUT");
      curl_easy_setopt(req.curl, CURLOPT_WRITEFUNCTION, br_http_buf_write);
      curl_easy_setopt(req.curl, CURLOPT_WRITEDATA, &body);
    } else if (br_http_url(x->g->server, path, req.url, sizeof req.url, &err) != 0) {
      set_error(x, "row %lld: %s", (long long)row, err.msg);
      break;
    } else {
      curl_easy_setopt(req.curl, CURLOPT_URL, req.url); /* same handle: the connection is kept */
    }
    body.len = 0;
    body.toobig = 0;
    curl_easy_setopt(req.curl, CURLOPT_POSTFIELDS, v->data ? (const char *)v->data : "");
    curl_easy_setopt(req.curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)v->len);
    long status = 0;
    if (br_http_req_perform(&req, &status, &err)) {
      set_error(x, "row %lld: upload of %s failed: %s", (long long)row, hex, err.msg);
      break;
    }
    if (status != 200 && status != 201) {
      char text[512];
      br_http_error_text(status, body.data, body.len, text, sizeof text);
      set_error(x, "row %lld: upload of %s failed: %s", (long long)row, hex, text);
      break;
    }
    if (status == 201) atomic_fetch_add(&x->uploaded_bytes, v->len);
    atomic_fetch_add(&x->uploads, 1);
  }
  if (have) br_http_req_free(&req);
  br_http_buf_free(&body);
  return NULL;
}

/* Called per row group before its new chunk is written: every distinct value the server lacks
 * is uploaded and acknowledged, or the rewrite stops. */
static int extract_row_group(void *ud, const br_parquet_rg_values *rg, br_err *err) {
  extract_ctx *x = ud;
  todo *t = malloc((rg->n ? rg->n : 1) * sizeof *t);
  size_t nt = 0, left = 0;
  int rc = 1;
  if (!t) {
    br_fail(err, "out of memory");
    return 1;
  }
  if (x->known.n > KNOWN_MAX) dset_free(&x->known);
  x->st.rows += (int64_t)rg->n;
  for (size_t i = 0; i < rg->n; i++) {
    if (rg->vals[i].is_null) continue;
    x->st.values++;
    x->st.value_bytes += rg->vals[i].len;
    if (dset_has(&x->known, rg->digests[i])) continue;
    memcpy(t[nt].digest, rg->digests[i], BR_SHA256_LEN);
    t[nt++].row = i;
  }
  /* distinct within the row group (the first occurrence stays: qsort is not stable, so keep the
   * smallest row among equal digests) */
  qsort(t, nt, sizeof *t, todo_cmp);
  size_t u = 0;
  for (size_t i = 0; i < nt; i++) {
    if (u && !memcmp(t[u - 1].digest, t[i].digest, BR_SHA256_LEN)) {
      if (t[i].row < t[u - 1].row) t[u - 1].row = t[i].row;
      continue;
    }
    t[u++] = t[i];
  }
  nt = u;
  x->st.distinct += (int64_t)nt;
  for (size_t first = 0; first < nt; first += LOOKUP_BATCH) {
    size_t n = nt - first < LOOKUP_BATCH ? nt - first : LOOKUP_BATCH, k = 0;
    br_err lerr;
    if (lookup_missing(x, t + first, n, &k, &lerr)) {
      br_fail(err, "row %lld: lookup failed: %s",
              (long long)rg->first_row + (long long)t[first].row, lerr.msg);
      goto out;
    }
    memmove(t + left, t + first, k * sizeof *t);
    left += k;
  }
  /* upload the missing ones in parallel */
  x->rg = rg;
  x->missing = t;
  x->nmissing = left;
  atomic_store(&x->next, 0);
  pthread_t th[MAX_JOBS];
  int started = 0;
  int jobs = x->jobs < (int)left ? x->jobs : (int)left;
  for (; started < jobs; started++)
    if (pthread_create(&th[started], NULL, upload_worker, x) != 0) break;
  if (left && started == 0) upload_worker(x);
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  if (atomic_load(&x->failed)) {
    br_fail(err, "%s", x->error);
    goto out;
  }
  for (size_t i = 0; i < left; i++)
    if (dset_add(&x->known, t[i].digest) < 0) {
      br_fail(err, "out of memory");
      goto out;
    }
  if (x->progress)
    fprintf(stderr, "\r%s: row group %u/%zu, %lld rows, %llu uploaded (%.1f MiB)   ", x->in_path,
            rg->row_group + 1, x->nrow_groups, (long long)x->st.rows,
            (unsigned long long)atomic_load(&x->uploads),
            (double)atomic_load(&x->uploaded_bytes) / (1 << 20));
  rc = 0;
out:
  free(t);
  return rc;
}

static int write_file(void *ud, const void *buf, size_t len, br_err *err) {
  FILE *f = ud;
  if (len && fwrite(buf, 1, len, f) != len)
    return br_fail(err, "write failed: %s", strerror(errno));
  return 0;
}

typedef struct extract_opts {
  const char *column, *as;
  int binary;
} extract_opts;

/* One file IN -> OUT. Returns 0 or 1 (error printed). */
static int extract_one(extract_ctx *x, const extract_opts *o, const char *in, const char *out) {
  br_err err = {{0}};
  br_source *src = NULL;
  br_parquet_file *f = NULL;
  FILE *tmpf = NULL;
  char tmp[PATH_MAX + 64] = "";
  int rc = 1;
  x->in_path = in;
  src = br_source_open_file(in, &err);
  if (!src) goto fail;
  f = br_parquet_open(src, &err);
  if (!f) goto fail;
  int col = br_parquet_find_column(f, o->column);
  if (col < 0) {
    br_fail(&err, "no column named %s", o->column);
    goto fail;
  }
  x->nrow_groups = br_parquet_num_row_groups(f);
  tmpf = br_cli_open_temp_next_to(out, tmp, sizeof tmp, &err);
  if (!tmpf) goto fail;
  br_parquet_replace_options ro = {(size_t)col, o->as, o->binary, extract_row_group, x};
  int r = br_parquet_replace_column(f, &ro, write_file, tmpf, &err);
  if (x->progress) fputc('\n', stderr);
  if (r) goto fail;
  x->st.in_size += src->size;
  FILE *done = tmpf;
  tmpf = NULL;
  if (commit_temp(done, tmp, out, &err)) goto fail;
  tmp[0] = '\0';
  struct stat st;
  if (stat(out, &st) == 0) x->st.out_size += (uint64_t)st.st_size;
  rc = 0;
fail:
  if (rc) fprintf(stderr, "blobref: extract-parquet %s: %s\n", in, err.msg);
  if (tmpf) fclose(tmpf);
  if (tmp[0]) unlink(tmp);
  br_parquet_close(f);
  if (src) br_source_close(src);
  return rc;
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int cmd_extract_parquet(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {{"column", required_argument, NULL, 'c'},
                                           {"as", required_argument, NULL, 'a'},
                                           {"form", required_argument, NULL, 'f'},
                                           {"jobs", required_argument, NULL, 'j'},
                                           {"quiet", no_argument, NULL, 'q'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  extract_opts o = {0};
  extract_ctx x = {.g = g, .jobs = DEFAULT_JOBS};
  int opt, quiet = 0, rc = 0;
  optind = 0;
  opterr = 0;
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (opt) {
      case 'c':
        o.column = optarg;
        break;
      case 'a':
        o.as = optarg;
        break;
      case 'f':
        if (!strcmp(optarg, "hex"))
          o.binary = 0;
        else if (!strcmp(optarg, "binary"))
          o.binary = 1;
        else
          return br_cli_usage_error("extract-parquet", "--form must be hex or binary");
        break;
      case 'j': {
        char *end;
        long j = strtol(optarg, &end, 10);
        if (*end || j < 1 || j > MAX_JOBS)
          return br_cli_usage_error("extract-parquet", "--jobs must be 1 to %d", MAX_JOBS);
        x.jobs = (int)j;
        break;
      }
      case 'q':
        quiet = 1;
        break;
      case 'h':
        fputs(extract_help, stdout);
        return 0;
      default:
        return br_cli_bad_option("extract-parquet", argv, longopts);
    }
  }
  if (argc - optind != 2) return br_cli_usage_error("extract-parquet", "expected IN and OUT");
  if (!o.column || !*o.column)
    return br_cli_usage_error("extract-parquet", "--column NAME is required");
  const char *in = argv[optind], *out = argv[optind + 1];
  x.progress = !quiet && isatty(2);
  pthread_mutex_init(&x.lock, NULL);
  double t0 = now_s();
  struct stat st;
  if (stat(in, &st) != 0) {
    fprintf(stderr, "blobref: extract-parquet %s: %s\n", in, strerror(errno));
    return 1;
  }
  size_t nfiles = 0;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(in);
    char **names = NULL;
    size_t cap = 0;
    struct dirent *e;
    if (!d) {
      fprintf(stderr, "blobref: extract-parquet %s: %s\n", in, strerror(errno));
      return 1;
    }
    while ((e = readdir(d))) {
      size_t l = strlen(e->d_name);
      if (l <= 8 || strcmp(e->d_name + l - 8, ".parquet") || e->d_name[0] == '.') continue;
      if (nfiles == cap) {
        cap = cap ? cap * 2 : 64;
        char **p = realloc(names, cap * sizeof *p);
        if (!p) break;
        names = p;
      }
      names[nfiles++] = strdup(e->d_name);
    }
    closedir(d);
    if (nfiles) qsort(names, nfiles, sizeof *names, name_cmp);
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
      fprintf(stderr, "blobref: extract-parquet: cannot create %s: %s\n", out, strerror(errno));
      rc = 1;
    }
    for (size_t i = 0; i < nfiles && rc == 0; i++) {
      char ip[PATH_MAX], op[PATH_MAX];
      if (!names[i] || snprintf(ip, sizeof ip, "%s/%s", in, names[i]) >= (int)sizeof ip ||
          snprintf(op, sizeof op, "%s/%s", out, names[i]) >= (int)sizeof op) {
        fprintf(stderr, "blobref: extract-parquet: path too long\n");
        rc = 1;
        break;
      }
      rc = extract_one(&x, &o, ip, op);
    }
    for (size_t i = 0; i < nfiles; i++) free(names[i]);
    free(names);
  } else {
    nfiles = 1;
    rc = extract_one(&x, &o, in, out);
  }
  double secs = now_s() - t0;
  uint64_t up = atomic_load(&x.uploaded_bytes);
  if (rc == 0 && !quiet)
    fprintf(stderr,
            "%zu file(s): %lld rows, %lld values, %lld distinct, %llu uploaded (%llu bytes), "
            "%llu bytes deduplicated; input %llu bytes, output %llu bytes; %.2f s\n",
            nfiles, (long long)x.st.rows, (long long)x.st.values, (long long)x.st.distinct,
            (unsigned long long)atomic_load(&x.uploads), (unsigned long long)up,
            (unsigned long long)(x.st.value_bytes - up), (unsigned long long)x.st.in_size,
            (unsigned long long)x.st.out_size, secs);
  dset_free(&x.known);
  pthread_mutex_destroy(&x.lock);
  return rc;
}

/* ---- export ---- */

static const char export_help[] =
    "usage: blobref export -o FILE.parquet [--state live|quarantined] [--page N]\n"
    "\n"
    "Writes the server's index as Parquet, page by page from GET /v1/blobs (memory: one row\n"
    "group of 65536 rows): sha256 (64 hex), size, content_type, created_at and last_upload_at\n"
    "(TIMESTAMP, UTC, milliseconds), state (live|quarantined), reason (null unless quarantined),\n"
    "store and key (the primary location) and locations (how many). FILE is written to a\n"
    "temporary file and renamed when complete.\n"
    "\n"
    "  --page N   blobs per listing request (1..10000, default 10000)\n";

/* "2026-12-01T03:41:19.123Z" -> milliseconds since the epoch. */
static int parse_time_ms(const char *s, int64_t *ms) {
  struct tm tm = {0};
  unsigned frac = 0;
  int n = 0;
  if (!s ||
      sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3uZ%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
             &tm.tm_min, &tm.tm_sec, &frac, &n) != 7 ||
      s[n] != '\0')
    return -1;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  *ms = (int64_t)timegm(&tm) * 1000 + frac;
  return 0;
}

static br_parquet_value str_val(const char *s) {
  br_parquet_value v = {(const uint8_t *)s, s ? strlen(s) : 0, s == NULL};
  return v;
}

/* Appends one listed blob to the writer. */
static int export_row(br_parquet_writer *w, json_t *b, br_err *err) {
  const char *hex = json_string_value(json_object_get(b, "sha256"));
  const char *ctype = json_string_value(json_object_get(b, "content_type"));
  const char *state = json_string_value(json_object_get(b, "state"));
  json_t *size_j = json_object_get(b, "size"), *locs = json_object_get(b, "locations");
  json_t *q = json_object_get(b, "quarantine");
  int64_t created, uploaded, size;
  if (!hex || strlen(hex) != BR_HEX_LEN || !ctype || !state || !json_is_integer(size_j) ||
      !json_is_array(locs) ||
      parse_time_ms(json_string_value(json_object_get(b, "created_at")), &created) ||
      parse_time_ms(json_string_value(json_object_get(b, "last_upload_at")), &uploaded))
    return br_fail(err, "the listing has a malformed entry");
  size = json_integer_value(size_j);
  const char *store = NULL, *key = NULL;
  for (size_t i = 0; i < json_array_size(locs); i++) {
    json_t *l = json_array_get(locs, i);
    const char *role = json_string_value(json_object_get(l, "role"));
    if (i == 0 || (role && !strcmp(role, "primary"))) {
      store = json_string_value(json_object_get(l, "store"));
      key = json_string_value(json_object_get(l, "key"));
      if (role && !strcmp(role, "primary")) break;
    }
  }
  int32_t nloc = (int32_t)json_array_size(locs);
  br_parquet_value v[10] = {
      str_val(hex),
      {(const uint8_t *)&size, 8, 0},
      str_val(ctype),
      {(const uint8_t *)&created, 8, 0},
      {(const uint8_t *)&uploaded, 8, 0},
      str_val(state),
      str_val(q ? json_string_value(json_object_get(q, "reason")) : NULL),
      str_val(store),
      str_val(key),
      {(const uint8_t *)&nloc, 4, 0},
  };
  return br_parquet_writer_row(w, v, err);
}

int cmd_export(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {{"output", required_argument, NULL, 'o'},
                                           {"state", required_argument, NULL, 's'},
                                           {"page", required_argument, NULL, 'p'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  static const br_parquet_column_spec cols[] = {
      {"sha256", BR_PQ_BYTE_ARRAY, 0, 0, 1, 0},       {"size", BR_PQ_INT64, 0, 0, 0, 0},
      {"content_type", BR_PQ_BYTE_ARRAY, 0, 0, 1, 0}, {"created_at", BR_PQ_INT64, 0, 0, 0, 1},
      {"last_upload_at", BR_PQ_INT64, 0, 0, 0, 1},    {"state", BR_PQ_BYTE_ARRAY, 0, 0, 1, 0},
      {"reason", BR_PQ_BYTE_ARRAY, 0, 1, 1, 0},       {"store", BR_PQ_BYTE_ARRAY, 0, 1, 1, 0},
      {"key", BR_PQ_BYTE_ARRAY, 0, 1, 1, 0},          {"locations", BR_PQ_INT32, 0, 0, 0, 0},
  };
  const char *out = NULL, *state = NULL;
  int opt, rc = 1;
  long page = EXPORT_PAGE;
  optind = 0;
  opterr = 0;
  while ((opt = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
    switch (opt) {
      case 'o':
        out = optarg;
        break;
      case 's':
        if (strcmp(optarg, "live") && strcmp(optarg, "quarantined"))
          return br_cli_usage_error("export", "--state must be live or quarantined");
        state = optarg;
        break;
      case 'p': {
        char *end;
        page = strtol(optarg, &end, 10);
        if (*end || page < 1 || page > EXPORT_PAGE)
          return br_cli_usage_error("export", "--page must be 1 to %d", EXPORT_PAGE);
        break;
      }
      case 'h':
        fputs(export_help, stdout);
        return 0;
      default:
        return br_cli_bad_option("export", argv, longopts);
    }
  }
  if (!out || !*out) return br_cli_usage_error("export", "-o FILE.parquet is required");
  if (argc != optind) return br_cli_usage_error("export", "unexpected argument '%s'", argv[optind]);
  br_err err = {{0}};
  char tmp[PATH_MAX + 64] = "";
  br_parquet_writer *w = NULL;
  json_t *reply = NULL;
  char after[BR_HEX_LEN + 1] = "";
  int64_t rows = 0;
  FILE *f = br_cli_open_temp_next_to(out, tmp, sizeof tmp, &err);
  if (!f) goto fail;
  br_parquet_write_options wo = {BR_PQ_ZSTD, EXPORT_ROW_GROUP, 0};
  w = br_parquet_writer_new(cols, sizeof cols / sizeof cols[0], &wo, write_file, f, &err);
  if (!w) goto fail;
  for (;;) {
    char path[256];
    long status = 0;
    snprintf(path, sizeof path, "/v1/blobs?limit=%ld%s%s%s%s", page, after[0] ? "&after=" : "",
             after, state ? "&state=" : "", state ? state : "");
    if (br_http_json(g->server, g->token, "GET", path, NULL, &status, &reply, &err)) goto fail;
    json_t *blobs = json_object_get(reply, "blobs"), *next = json_object_get(reply, "next");
    if (!json_is_array(blobs) || (!json_is_null(next) && !json_is_string(next))) {
      br_fail(&err, "the listing reply is not {\"blobs\": [...], \"next\": ...}");
      goto fail;
    }
    for (size_t i = 0; i < json_array_size(blobs); i++, rows++)
      if (export_row(w, json_array_get(blobs, i), &err)) goto fail;
    if (json_is_null(next)) break;
    const char *n = json_string_value(next);
    if (strlen(n) != BR_HEX_LEN || strcmp(n, after) <= 0) {
      br_fail(&err, "the listing's next key does not move forward");
      goto fail;
    }
    memcpy(after, n, BR_HEX_LEN + 1);
    json_decref(reply);
    reply = NULL;
  }
  if (br_parquet_writer_finish(w, &err)) goto fail;
  FILE *done = f;
  f = NULL;
  if (commit_temp(done, tmp, out, &err)) goto fail;
  tmp[0] = '\0';
  fprintf(stderr, "exported %lld blobs to %s\n", (long long)rows, out);
  rc = 0;
fail:
  if (rc) fprintf(stderr, "blobref: export: %s\n", err.msg);
  json_decref(reply);
  br_parquet_writer_free(w);
  if (f) fclose(f);
  if (tmp[0]) unlink(tmp);
  return rc;
}
