/* `blobref import SOURCE --store NAME [--in-place | --copy]`: brings existing files under blobref.
 * Without -c it is an import job in the server (POST /v1/jobs): SOURCE is a folder under the
 * store's root or a key prefix, and the command needs only the server URL and a token. With -c
 * CONFIG it runs here, as before (for files on this machine outside the store, --copy): a walker
 * lists SOURCE (never following symlinks), hashing threads read each regular file (checking that
 * its size and mtime did not change while it was read) and send batches to POST /v1/import, where
 * the server checks each key in its store and inserts the records in its single batched index
 * writer. --in-place: the record points at the file's own key (its path under the fs store's root).
 * --copy: the bytes are first written into the store's content-addressed layout. Resumable: a rerun
 * hashes again, and what is indexed already is reported as such and left alone. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blobref/config.h"
#include "blobref/header.h"
#include "blobref/index.h"
#include "blobref/store.h"
#include "commands.h"
#include "http_client.h"
#include "store/internal.h"

static const char import_usage[] =
    "usage: blobref import SOURCE --store NAME [--in-place | --copy] [--detach]\n"
    "       blobref import SOURCE -c CONFIG --store NAME [--in-place | --copy] [--threads N]\n"
    "                      [--batch N]\n"
    "  without -c: an import job in the server (SOURCE: a folder under the store's root or a\n"
    "               key prefix); --detach prints its id and returns, Ctrl-C detaches\n"
    "  SOURCE       a directory (or one file); in place in an s3 store: a key prefix there\n"
    "  -c CONFIG    the server's config file: hash and copy here (files outside the store)\n"
    "  --store      the store the records point at\n"
    "  --in-place   index the files where they are: SOURCE must be under the fs store's root and\n"
    "               each record's key is the file's path under it (the default); or, for an\n"
    "               s3 store, every object under the prefix SOURCE, read and hashed there\n"
    "  --copy       copy each file into the store's content-addressed layout first\n"
    "  --threads N  hashing threads (default: the number of cores)\n"
    "  --batch N    records per POST /v1/import (default 500, at most 1000)\n";

struct file_item {
  char *path; /* as opened */
  char *key;  /* in-place key, or NULL for --copy */
};

struct pending {
  char hex[BR_HEX_LEN + 1];
  uint64_t size;
  char *key;
  char *path;
  const char *type;
};

struct importer {
  const cli_globals *g;
  br_store *store; /* --copy: the store written into */
  br_store *src;   /* in place in an S3 store: SOURCE is a key prefix there */
  const char *store_name;
  int copy;
  size_t batch;
  /* the queue from the walker to the hashers */
  pthread_mutex_t lock;
  pthread_cond_t cv_items, cv_space;
  struct file_item *q;
  size_t qcap, qhead, qlen;
  int walk_done;
  /* counters (under lock) */
  uint64_t files, bytes, created, exists, duplicates, skipped, errors;
  int tty, finished;
  double t0;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A report line about one file (stdout), under the lock. */
static void report(struct importer *im, const char *what, const char *path, const char *why) {
  pthread_mutex_lock(&im->lock);
  if (im->tty) fputs("\r\033[K", stderr);
  printf("%s: %s: %s\n", what, path, why);
  fflush(stdout);
  pthread_mutex_unlock(&im->lock);
}

/* The type import records: the extension's (as `blobref put` sends), else octet-stream. */
static const char *content_type_of(const char *path) {
  const char *type = br_content_type_for_name(path);
  return type ? type : "application/octet-stream";
}

/* ---- the walker ---------------------------------------------------------------------------- */

static void enqueue(struct importer *im, char *path, char *key) {
  pthread_mutex_lock(&im->lock);
  while (im->qlen == im->qcap) pthread_cond_wait(&im->cv_space, &im->lock);
  im->q[(im->qhead + im->qlen++) % im->qcap] = (struct file_item){path, key};
  pthread_cond_signal(&im->cv_items);
  pthread_mutex_unlock(&im->lock);
}

static void count(struct importer *im, uint64_t *field) {
  pthread_mutex_lock(&im->lock);
  ++*field;
  pthread_mutex_unlock(&im->lock);
}

/* Walks path (a directory or file); key is its key under the store root (in place) or NULL. */
static void walk(struct importer *im, const char *path, const char *key) {
  struct stat st;
  if (lstat(path, &st) < 0) {
    report(im, "error", path, strerror(errno));
    count(im, &im->errors);
    return;
  }
  if (S_ISLNK(st.st_mode)) {
    report(im, "skipped", path, "symbolic link (not followed)");
    count(im, &im->skipped);
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (!d) {
      report(im, "error", path, strerror(errno));
      count(im, &im->errors);
      return;
    }
    /* sorted, so that runs and reports are repeatable */
    struct dirent **names = NULL;
    int n = scandir(path, &names, NULL, alphasort);
    closedir(d);
    for (int i = 0; i < n; i++) {
      const char *nm = names[i]->d_name;
      /* the fs store's own temp files (its root's tmp/) are never blobs */
      int store_tmp = key && !*key && !strcmp(nm, "tmp");
      if (strcmp(nm, ".") && strcmp(nm, "..") && !store_tmp) {
        size_t pl = strlen(path) + strlen(nm) + 2;
        char *child = malloc(pl);
        snprintf(child, pl, "%s/%s", path, nm);
        char *ckey = NULL;
        if (key) {
          size_t kl = strlen(key) + strlen(nm) + 2;
          ckey = malloc(kl);
          snprintf(ckey, kl, "%s%s%s", key, *key ? "/" : "", nm);
        }
        walk(im, child, ckey);
        free(child);
        free(ckey);
      }
      free(names[i]);
    }
    free(names);
    if (n < 0) {
      report(im, "error", path, strerror(errno));
      count(im, &im->errors);
    }
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    report(im, "skipped", path, "not a regular file");
    count(im, &im->skipped);
    return;
  }
  if (key && (strlen(key) > BR_MAX_KEY || br_store_key_valid(key) < 0)) {
    report(im, "skipped", path, "the name is not a valid object key");
    count(im, &im->skipped);
    return;
  }
  enqueue(im, strdup(path), key ? strdup(key) : NULL);
}

/* In place in an S3 store: every object under the prefix. */
static int list_cb(void *ud, const char *key, uint64_t size) {
  struct importer *im = ud;
  (void)size;
  size_t pl = strlen(im->store_name) + strlen(key) + 2;
  char *path = malloc(pl);
  snprintf(path, pl, "%s:%s", im->store_name, key);
  if (strlen(key) > BR_MAX_KEY || br_store_key_valid(key) < 0) {
    report(im, "skipped", path, "the name is not a valid object key");
    count(im, &im->skipped);
    free(path);
    return 0;
  }
  enqueue(im, path, strdup(key));
  return 0;
}

/* Hashes an object of the S3 store in place (size checked before and after). */
static int hash_object(struct importer *im, struct file_item *fi, char *buf, size_t bufsize,
                       struct pending *p) {
  br_err err = {{0}};
  br_store_reader r;
  int rc = br_store_open_read(im->src, fi->key, &r, &err);
  if (rc != 0) {
    report(im, "error", fi->path, rc > 0 ? "no such object (deleted meanwhile?)" : err.msg);
    count(im, &im->errors);
    return -1;
  }
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  for (uint64_t off = 0; rc == 0 && off < r.size;) {
    size_t n = r.size - off < bufsize ? (size_t)(r.size - off) : bufsize;
    rc = r.source->pread(r.source, buf, n, off, &err);
    if (rc == 0) EVP_DigestUpdate(ctx, buf, n);
    off += n;
  }
  uint8_t digest[BR_SHA256_LEN];
  EVP_DigestFinal_ex(ctx, digest, NULL);
  EVP_MD_CTX_free(ctx);
  uint64_t size = r.size, after = 0;
  br_store_reader_close(&r);
  if (rc < 0) {
    report(im, "error", fi->path, err.msg);
    count(im, &im->errors);
    return -1;
  }
  if (br_store_stat(im->src, fi->key, &after, &err) != 0 || after != size) {
    report(im, "skipped", fi->path, "changed while it was read (size): nothing indexed");
    count(im, &im->skipped);
    return -1;
  }
  br_hex_encode(digest, p->hex);
  p->size = size;
  p->type = content_type_of(fi->key);
  p->path = fi->path;
  p->key = fi->key;
  pthread_mutex_lock(&im->lock);
  im->files++;
  im->bytes += size;
  pthread_mutex_unlock(&im->lock);
  return 0;
}

/* ---- hashers --------------------------------------------------------------------------------- */

/* Sends items[0..n) and counts the answers. */
static void send_batch(struct importer *im, struct pending *items, size_t n) {
  if (!n) return;
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, json_pack("{s:s,s:I,s:s,s:s,s:s}", "sha256", items[i].hex, "size",
                                         (json_int_t)items[i].size, "store", im->store_name, "key",
                                         items[i].key, "content_type", items[i].type));
  json_t *body = json_pack("{s:o}", "blobs", arr);
  long status = 0;
  json_t *reply = NULL;
  br_err err;
  int rc = -1;
  for (int attempt = 0; attempt < 3 && rc < 0; attempt++) {
    rc = br_http_json(im->g->server, im->g->token, "POST", "/v1/import", body, &status, &reply,
                      &err);
    if (rc < 0 && status && status < 500) break;
    if (rc < 0) usleep(200000 << attempt);
  }
  json_decref(body);
  json_t *res = json_object_get(reply, "results");
  for (size_t i = 0; i < n; i++) {
    json_t *r = json_array_get(res, i);
    const char *what = rc == 0 ? json_string_value(json_object_get(r, "result")) : NULL;
    const char *msg = json_string_value(json_object_get(r, "message"));
    if (what && !strcmp(what, "created")) {
      count(im, &im->created);
    } else if (what && !strcmp(what, "exists")) {
      count(im, &im->exists);
    } else if (what && !strcmp(what, "duplicate")) {
      report(im, "duplicate", items[i].path, msg ? msg : "already indexed");
      count(im, &im->duplicates);
    } else {
      report(im, "error", items[i].path, rc < 0 ? err.msg : msg ? msg : "no answer");
      count(im, &im->errors);
    }
  }
  json_decref(reply);
  for (size_t i = 0; i < n; i++) free(items[i].key), free(items[i].path);
}

/* Hashes one file (and writes it into the store with --copy). Returns 0 with p filled, or -1
 * after reporting. */
static int hash_file(struct importer *im, struct file_item *fi, char *buf, size_t bufsize,
                     struct pending *p) {
  int fd = open(fi->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    report(im, errno == ELOOP ? "skipped" : "error", fi->path,
           errno == ELOOP ? "symbolic link (not followed)" : strerror(errno));
    count(im, errno == ELOOP ? &im->skipped : &im->errors);
    return -1;
  }
  struct stat before, after;
  fstat(fd, &before);
  if (!S_ISREG(before.st_mode)) {
    close(fd);
    report(im, "skipped", fi->path, "not a regular file");
    count(im, &im->skipped);
    return -1;
  }
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  br_err err = {{0}};
  br_store_writer *w = im->copy ? br_store_write_begin(im->store, &err) : NULL;
  int bad = im->copy && !w;
  uint64_t total = 0;
  while (!bad) {
    ssize_t n = read(fd, buf, bufsize);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      snprintf(err.msg, sizeof err.msg, "%s", strerror(errno));
      bad = 1;
      break;
    }
    if (n == 0) break;
    EVP_DigestUpdate(ctx, buf, (size_t)n);
    if (w && br_store_write(w, buf, (size_t)n, &err) < 0) bad = 1;
    total += (uint64_t)n;
  }
  uint8_t digest[BR_SHA256_LEN];
  EVP_DigestFinal_ex(ctx, digest, NULL);
  EVP_MD_CTX_free(ctx);
  fstat(fd, &after);
  close(fd);
  if (bad) {
    br_store_write_abort(w);
    report(im, "error", fi->path, err.msg);
    count(im, &im->errors);
    return -1;
  }
  if (before.st_size != after.st_size || (uint64_t)after.st_size != total ||
      before.st_mtim.tv_sec != after.st_mtim.tv_sec ||
      before.st_mtim.tv_nsec != after.st_mtim.tv_nsec) {
    br_store_write_abort(w);
    report(im, "skipped", fi->path, "changed while it was read (size or mtime): nothing indexed");
    count(im, &im->skipped);
    return -1;
  }
  br_hex_encode(digest, p->hex);
  p->size = total;
  p->type = content_type_of(fi->path);
  p->path = fi->path;
  if (w) {
    char key[BR_MAX_KEY + 1];
    br_store_write_set_digest(w, digest);
    if (!br_store_default_key(im->store, digest, key, sizeof key) ||
        br_store_write_commit(w, key, &err) < 0) {
      report(im, "error", fi->path, err.msg);
      count(im, &im->errors);
      return -1;
    }
    p->key = strdup(key);
    free(fi->key);
  } else {
    p->key = fi->key;
  }
  pthread_mutex_lock(&im->lock);
  im->files++;
  im->bytes += total;
  pthread_mutex_unlock(&im->lock);
  return 0;
}

static void *hasher_main(void *arg) {
  struct importer *im = arg;
  size_t bufsize = 1 << 20;
  char *buf = malloc(bufsize);
  struct pending *batch = calloc(im->batch, sizeof *batch);
  size_t nb = 0;
  for (;;) {
    pthread_mutex_lock(&im->lock);
    while (!im->qlen && !im->walk_done) pthread_cond_wait(&im->cv_items, &im->lock);
    if (!im->qlen) {
      pthread_mutex_unlock(&im->lock);
      break;
    }
    struct file_item fi = im->q[im->qhead];
    im->qhead = (im->qhead + 1) % im->qcap;
    im->qlen--;
    pthread_cond_signal(&im->cv_space);
    pthread_mutex_unlock(&im->lock);
    if ((im->src ? hash_object : hash_file)(im, &fi, buf, bufsize, &batch[nb]) == 0) {
      nb++;
    } else {
      free(fi.path);
      free(fi.key);
    }
    if (nb == im->batch) {
      send_batch(im, batch, nb);
      nb = 0;
    }
  }
  send_batch(im, batch, nb);
  free(batch);
  free(buf);
  return NULL;
}

static void progress(struct importer *im, int final) {
  double el = now_s() - im->t0;
  double mb = (double)im->bytes / 1e6;
  if (im->tty)
    fprintf(stderr, "\r%llu files, %.1f MB, %.1f MB/s, %llu files/s, %llu errors%s",
            (unsigned long long)im->files, mb, el > 0 ? mb / el : 0,
            (unsigned long long)(el > 0 ? (double)im->files / el : 0),
            (unsigned long long)im->errors, final ? "\n" : "\033[K");
  else if (!final)
    fprintf(stderr, "import: %llu files, %.1f MB, %.1f MB/s, %llu errors\n",
            (unsigned long long)im->files, mb, el > 0 ? mb / el : 0,
            (unsigned long long)im->errors);
  fflush(stderr);
}

static void *progress_main(void *arg) {
  struct importer *im = arg;
  int ticks = 0;
  pthread_mutex_lock(&im->lock);
  while (!im->finished) {
    pthread_mutex_unlock(&im->lock);
    usleep(200000);
    pthread_mutex_lock(&im->lock);
    if (!im->finished && (im->tty || ++ticks % 10 == 0)) progress(im, 0);
  }
  pthread_mutex_unlock(&im->lock);
  return NULL;
}

static json_int_t geti(json_t *j, const char *k) {
  return json_integer_value(json_object_get(j, k));
}

/* The import as a job in the server, followed until it ends (or detached). */
static int import_job(const cli_globals *g, const char *source, const char *store, int copy,
                      int detach) {
  char real[PATH_MAX];
  /* a local folder (the server checks it is under the store's root), else a key prefix */
  const char *src = realpath(source, real) ? real : source;
  json_t *spec = json_pack("{s:s,s:s,s:s,s:s}", "kind", "import", "store", store, "source", src,
                           "mode", copy ? "copy" : "in-place");
  long status = 0;
  json_t *reply = NULL;
  br_err err;
  int rc = br_http_json(g->server, g->token, "POST", "/v1/jobs", spec, &status, &reply, &err);
  json_decref(spec);
  if (rc < 0) {
    fprintf(stderr, "blobref import: %s\n", err.msg);
    if (status == 400 && strstr(err.msg, "not under the store's root"))
      fprintf(stderr,
              "blobref import: files outside the store: -c CONFIG --copy copies them "
              "from here\n");
    return CLI_EXIT_FAILURE;
  }
  long long id = (long long)geti(reply, "id");
  json_decref(reply);
  if (detach) {
    printf("%lld\n", id);
    return CLI_EXIT_OK;
  }
  json_t *j = NULL;
  if (cli_job_follow(g, id, &j) < 0 || !j) return CLI_EXIT_FAILURE;
  const char *state = json_string_value(json_object_get(j, "state")) ?: "?";
  json_t *p = json_object_get(j, "params");
  printf("job %lld %s: %" JSON_INTEGER_FORMAT " created, %" JSON_INTEGER_FORMAT
         " already indexed, %" JSON_INTEGER_FORMAT " errors (%s:%s, %s)\n",
         id, state, geti(j, "items_done"), geti(j, "items_skipped"), geti(j, "items_failed"), store,
         json_string_value(json_object_get(p, "prefix")) ?: "",
         json_string_value(json_object_get(p, "mode")) ?: "");
  json_t *errs = json_object_get(j, "errors");
  for (size_t i = 0; i < json_array_size(errs); i++) {
    json_t *e = json_array_get(errs, i);
    fprintf(stderr, "import: %s: %s\n", json_string_value(json_object_get(e, "item")) ?: "",
            json_string_value(json_object_get(e, "message")) ?: "");
  }
  if (json_object_get(j, "message"))
    fprintf(stderr, "blobref import: %s\n", json_string_value(json_object_get(j, "message")));
  rc = !strcmp(state, "done") && geti(j, "items_failed") == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
  json_decref(j);
  return rc;
}

int cmd_import(const cli_globals *g, int argc, char **argv) {
  const char *source = NULL, *conf = NULL, *store = NULL;
  int copy = 0, detach = 0;
  long threads = sysconf(_SC_NPROCESSORS_ONLN), batch = 500;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(import_usage, stdout);
      return 0;
    } else if (!strcmp(a, "--in-place")) {
      copy = 0;
    } else if (!strcmp(a, "--copy")) {
      copy = 1;
    } else if (!strcmp(a, "--detach")) {
      detach = 1;
    } else if (a[0] != '-') {
      if (source) {
        fprintf(stderr, "blobref import: one SOURCE only\n%s", import_usage);
        return 2;
      }
      source = a;
    } else if (!v) {
      fprintf(stderr, "blobref import: %s needs a value\n%s", a, import_usage);
      return 2;
    } else if (i++, !strcmp(a, "-c") || !strcmp(a, "--config")) {
      conf = v;
    } else if (!strcmp(a, "--store")) {
      store = v;
    } else if (!strcmp(a, "--threads") && (threads = strtol(v, &end, 10)) >= 1 && threads <= 256 &&
               !*end) {
    } else if (!strcmp(a, "--batch") && (batch = strtol(v, &end, 10)) >= 1 && batch <= 1000 &&
               !*end) {
    } else {
      fprintf(stderr, "blobref import: bad option %s %s\n%s", a, v, import_usage);
      return 2;
    }
  }
  if (!source || !store) {
    fprintf(stderr, "blobref import: SOURCE and --store are required\n%s", import_usage);
    return 2;
  }
  if (!conf) return import_job(g, source, store, copy, detach);
  if (threads < 1) threads = 1;
  br_config cfg;
  br_config_init(&cfg);
  br_err err;
  if (br_config_load(&cfg, conf, &err) < 0 || br_config_finish(&cfg, &err) < 0) {
    fprintf(stderr, "blobref import: %s\n", err.msg);
    br_config_free(&cfg);
    return 1;
  }
  int rc = 1;
  struct importer im = {.g = g,
                        .store_name = store,
                        .copy = copy,
                        .batch = (size_t)batch,
                        .tty = isatty(2),
                        .qcap = 4096};
  pthread_mutex_init(&im.lock, NULL);
  pthread_cond_init(&im.cv_items, NULL);
  pthread_cond_init(&im.cv_space, NULL);
  im.q = calloc(im.qcap, sizeof *im.q);
  br_store_config *sc = (br_store_config *)br_config_store(&cfg, store);
  char root[PATH_MAX], src[PATH_MAX], *key = NULL;
  if (!sc) {
    fprintf(stderr, "blobref import: %s: no [store %s]\n", conf, store);
    goto out;
  }
  int s3_in_place = !copy && !strcmp(sc->kind, "s3");
  if (!s3_in_place && !realpath(source, src)) {
    fprintf(stderr, "blobref import: %s: %s\n", source, strerror(errno));
    goto out;
  }
  if (s3_in_place) {
    sc->read_only = 1;
    im.src = br_store_open(sc, &err);
    if (!im.src) {
      fprintf(stderr, "blobref import: %s\n", err.msg);
      goto out;
    }
  } else if (copy) {
    im.store = br_store_open(sc, &err);
    if (!im.store) {
      fprintf(stderr, "blobref import: %s\n", err.msg);
      goto out;
    }
  } else {
    if (strcmp(sc->kind, "fs")) {
      fprintf(stderr, "blobref import: --in-place needs an fs store (%s is %s); use --copy\n",
              store, sc->kind);
      goto out;
    }
    if (!realpath(sc->root, root)) {
      fprintf(stderr, "blobref import: store root %s: %s\n", sc->root, strerror(errno));
      goto out;
    }
    size_t rl = strlen(root);
    if (strncmp(src, root, rl) || (src[rl] && src[rl] != '/')) {
      fprintf(stderr, "blobref import: %s is not under store %s's root %s\n", src, store, root);
      goto out;
    }
    key = strdup(src[rl] ? src + rl + 1 : "");
  }
  im.t0 = now_s();
  pthread_t prog, *hashers = calloc((size_t)threads, sizeof *hashers);
  pthread_create(&prog, NULL, progress_main, &im);
  long started = 0;
  for (; started < threads; started++)
    if (pthread_create(&hashers[started], NULL, hasher_main, &im)) break;
  if (im.src) {
    if (br_store_list(im.src, source, list_cb, &im, &err) < 0) {
      report(&im, "error", source, err.msg);
      count(&im, &im.errors);
    }
  } else {
    walk(&im, src, key);
  }
  pthread_mutex_lock(&im.lock);
  im.walk_done = 1;
  pthread_cond_broadcast(&im.cv_items);
  pthread_mutex_unlock(&im.lock);
  if (started == 0) hasher_main(&im);
  for (long i = 0; i < started; i++) pthread_join(hashers[i], NULL);
  free(hashers);
  pthread_mutex_lock(&im.lock);
  im.finished = 1;
  if (im.tty) progress(&im, 1);
  pthread_mutex_unlock(&im.lock);
  pthread_join(prog, NULL);
  double el = now_s() - im.t0;
  printf(
      "imported %llu files (%.1f MB hashed in %.2f s, %.1f MB/s): %llu new, %llu already "
      "imported, %llu duplicates, %llu skipped, %llu errors\n",
      (unsigned long long)im.files, (double)im.bytes / 1e6, el,
      el > 0 ? (double)im.bytes / 1e6 / el : 0, (unsigned long long)im.created,
      (unsigned long long)im.exists, (unsigned long long)im.duplicates,
      (unsigned long long)im.skipped, (unsigned long long)im.errors);
  rc = im.errors ? 1 : 0;
out:
  free(key);
  free(im.q);
  if (im.store) br_store_close(im.store);
  if (im.src) br_store_close(im.src);
  br_config_free(&cfg);
  return rc;
}
