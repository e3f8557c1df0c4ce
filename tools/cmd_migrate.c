/* `blobref migrate -c CONFIG --from STORE --to STORE`: moves every blob whose primary location is
 * in FROM to TO without a failed read: copy (server-side when both stores are on the same S3
 * endpoint, streamed otherwise, with the stores opened from the server's config), then
 * PUT /v1/blobs/{hash}/location, which verifies the copy and switches; the old copy drains and the
 * server deletes it after drain_grace. Resumable: a blob already at TO is skipped, a copy already
 * at TO with the right size is not made again (the server hashes it before the switch). A
 * streamed copy is hashed as it is read and nothing is written if it is not the blob's. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "blobref/config.h"
#include "blobref/index.h"
#include "blobref/store.h"
#include "commands.h"
#include "http_client.h"

static const char migrate_usage[] =
    "usage: blobref migrate -c CONFIG --from STORE --to STORE [--verify sha256|size]\n"
    "                       [--concurrency N] [--rate MB/s] [--limit N] [--dry-run]\n"
    "  -c CONFIG        the server's config file (the stores are opened from it to copy bytes)\n"
    "  --from, --to     store names; blobs whose primary location is in FROM move to TO\n"
    "  --verify         sha256 (default) or size: the copy's SHA-256 is always checked (streamed\n"
    "                   copies as they are read, and by the server before it switches)\n"
    "  --concurrency N  blobs in flight (default 4)\n"
    "  --rate MB/s      at most this many megabytes per second copied (default: no limit)\n"
    "  --limit N        move at most N blobs in this run\n"
    "  --dry-run        list what would move, change nothing\n";

struct item {
  char hex[BR_HEX_LEN + 1];
  uint64_t size;
  char *key; /* its primary key in FROM */
};

struct migrate {
  const cli_globals *g;
  br_store *from, *to;
  const char *verify;
  double rate; /* bytes per second, 0 = no limit */
  struct item *items;
  size_t nitems, next;
  uint64_t total_bytes;
  pthread_mutex_t lock;
  double rate_next; /* rate limiter: when the next copy may start */
  /* progress and results (under lock) */
  size_t done, moved, copies_skipped, errors;
  uint64_t done_bytes;
  double copy_s, verify_s, switch_s, request_s;
  int finished;
  int tty;
  double t0;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void human_bytes(double b, char *out, size_t n) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  snprintf(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void human_duration(double s, char *out, size_t n) {
  if (s < 0 || s > 1e7) {
    snprintf(out, n, "?");
    return;
  }
  unsigned long t = (unsigned long)(s + 0.5);
  if (t >= 3600)
    snprintf(out, n, "%lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(out, n, "%lu:%02lu", t / 60, t % 60);
}

/* One progress line: a bar on a terminal, plain text in a pipe. Lock held. */
static void progress_line(struct migrate *m, int final) {
  double el = now_s() - m->t0;
  double rate = el > 0 ? (double)m->done_bytes / el : 0;
  double frac = m->total_bytes ? (double)m->done_bytes / (double)m->total_bytes
                : m->nitems    ? (double)m->done / (double)m->nitems
                               : 1;
  double eta = rate > 0 ? (double)(m->total_bytes - m->done_bytes) / rate : -1;
  char done_b[32], total_b[32], rate_b[32], eta_s[32];
  human_bytes((double)m->done_bytes, done_b, sizeof done_b);
  human_bytes((double)m->total_bytes, total_b, sizeof total_b);
  human_bytes(rate, rate_b, sizeof rate_b);
  human_duration(eta, eta_s, sizeof eta_s);
  if (m->tty) {
    char bar[31];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %3d%% %zu/%zu blobs %s/%s %s/s ETA %s %s", bar, (int)(frac * 100),
            m->done, m->nitems, done_b, total_b, rate_b, eta_s, final ? "\n" : "\033[K");
  } else {
    fprintf(stderr, "migrate: %zu/%zu blobs, %s of %s, %s/s, ETA %s, %zu errors\n", m->done,
            m->nitems, done_b, total_b, rate_b, eta_s, m->errors);
  }
  fflush(stderr);
}

static void *progress_main(void *arg) {
  struct migrate *m = arg;
  int ticks = 0;
  pthread_mutex_lock(&m->lock);
  while (!m->finished) {
    pthread_mutex_unlock(&m->lock);
    usleep(200000);
    pthread_mutex_lock(&m->lock);
    if (!m->finished && (m->tty || ++ticks % 10 == 0)) progress_line(m, 0);
  }
  pthread_mutex_unlock(&m->lock);
  return NULL;
}

static void rate_wait(struct migrate *m, uint64_t bytes) {
  if (m->rate <= 0) return;
  pthread_mutex_lock(&m->lock);
  double now = now_s();
  double start = m->rate_next > now ? m->rate_next : now;
  m->rate_next = start + (double)bytes / m->rate;
  pthread_mutex_unlock(&m->lock);
  if (start > now) usleep((useconds_t)((start - now) * 1e6));
}

/* PUT location; returns 0, 1 on a 409 (location changed) or 422 (verify failed), -1. */
static int switch_location(struct migrate *m, const struct item *it, const char *dst_key,
                           double *verify_s, double *switch_s, br_err *err) {
  json_t *body =
      json_pack("{s:{s:s,s:s},s:{s:s,s:s},s:s}", "expect", "store", br_store_name(m->from), "key",
                it->key, "to", "store", br_store_name(m->to), "key", dst_key, "verify", m->verify);
  char path[160];
  snprintf(path, sizeof path, "/v1/blobs/%s/location", it->hex);
  long status = 0;
  json_t *reply = NULL;
  int rc = br_http_json(m->g->server, m->g->token, "PUT", path, body, &status, &reply, err);
  json_decref(body);
  if (rc < 0) return status == 409 || status == 422 ? 1 : -1;
  json_t *t = json_object_get(reply, "timings");
  *verify_s = (double)json_integer_value(json_object_get(t, "verify_ms")) / 1000.0;
  *switch_s = (double)json_integer_value(json_object_get(t, "switch_ms")) / 1000.0;
  json_decref(reply);
  return 0;
}

/* The blob's primary store now (after a 409): 1 if it is TO already. */
static int already_at_target(struct migrate *m, const struct item *it) {
  char path[160];
  snprintf(path, sizeof path, "/v1/blobs/%s/meta", it->hex);
  long status = 0;
  json_t *reply = NULL;
  br_err err;
  if (br_http_json(m->g->server, m->g->token, "GET", path, NULL, &status, &reply, &err) < 0)
    return 0;
  int yes = 0;
  json_t *locs = json_object_get(reply, "locations");
  for (size_t i = 0; i < json_array_size(locs); i++) {
    json_t *l = json_array_get(locs, i);
    const char *role = json_string_value(json_object_get(l, "role"));
    const char *store = json_string_value(json_object_get(l, "store"));
    if (role && store && !strcmp(role, "primary") && !strcmp(store, br_store_name(m->to))) yes = 1;
  }
  json_decref(reply);
  return yes;
}

static void move_one(struct migrate *m, struct item *it) {
  uint8_t digest[BR_SHA256_LEN];
  br_hex_decode(it->hex, BR_HEX_LEN, digest);
  char dst_key[BR_MAX_KEY + 1];
  br_err err;
  double copy_s = 0, verify_s = 0, switch_s = 0, req_s = 0;
  int ok = 0, copied_before = 0;
  if (!br_store_default_key(m->to, digest, dst_key, sizeof dst_key)) {
    snprintf(err.msg, sizeof err.msg, "key too long");
    goto done;
  }
  for (int attempt = 0; attempt < 2; attempt++) {
    uint64_t have = 0;
    /* a copy left by an earlier, interrupted run is not made again: the server hashes it before
     * the switch (whatever --verify says) and refuses other bytes, and then it is copied again */
    if (attempt == 0 && br_store_stat(m->to, dst_key, &have, &err) == 0 && have == it->size) {
      copied_before = 1;
    } else {
      rate_wait(m, it->size);
      double t = now_s();
      if (br_store_copy_blob(m->from, it->key, m->to, dst_key, digest, &err) < 0) goto done;
      copy_s += now_s() - t;
      copied_before = 0;
    }
    double t = now_s();
    double v = 0, s = 0;
    int rc = switch_location(m, it, dst_key, &v, &s, &err);
    req_s += now_s() - t;
    verify_s += v, switch_s += s;
    if (rc == 0) {
      ok = 1;
      break;
    }
    if (rc < 0) goto done;
    if (already_at_target(m, it)) { /* another run moved it meanwhile */
      ok = 1;
      break;
    }
    /* a copy that did not verify (a stale one from an earlier run, or one the server's drain of
     * an older draining copy at the same key removed meanwhile): copy once more */
  }
done:
  pthread_mutex_lock(&m->lock);
  m->done++;
  m->done_bytes += it->size;
  m->copy_s += copy_s, m->verify_s += verify_s, m->switch_s += switch_s, m->request_s += req_s;
  if (ok) {
    m->moved++;
    if (copied_before) m->copies_skipped++;
  } else {
    m->errors++;
    if (m->tty) fputc('\n', stderr);
    fprintf(stderr, "migrate: %s: %s\n", it->hex, err.msg);
  }
  pthread_mutex_unlock(&m->lock);
}

static void *worker_main(void *arg) {
  struct migrate *m = arg;
  for (;;) {
    pthread_mutex_lock(&m->lock);
    size_t i = m->next < m->nitems ? m->next++ : SIZE_MAX;
    pthread_mutex_unlock(&m->lock);
    if (i == SIZE_MAX) break;
    move_one(m, &m->items[i]);
  }
  return NULL;
}

/* Lists every blob through GET /v1/blobs and keeps those whose primary is in FROM. */
static int list_blobs(struct migrate *m, const char *from, const char *to, uint64_t limit,
                      size_t *at_target, size_t *elsewhere, br_err *err) {
  char after[BR_HEX_LEN + 1] = "";
  size_t cap = 0;
  for (;;) {
    char path[200];
    snprintf(path, sizeof path, "/v1/blobs?limit=1000%s%s", *after ? "&after=" : "", after);
    long status = 0;
    json_t *reply = NULL;
    if (br_http_json(m->g->server, m->g->token, "GET", path, NULL, &status, &reply, err) < 0)
      return -1;
    json_t *blobs = json_object_get(reply, "blobs");
    for (size_t i = 0; i < json_array_size(blobs); i++) {
      json_t *b = json_array_get(blobs, i);
      const char *hex = json_string_value(json_object_get(b, "sha256"));
      json_t *locs = json_object_get(b, "locations");
      const char *pstore = NULL, *pkey = NULL;
      for (size_t j = 0; j < json_array_size(locs); j++) {
        json_t *l = json_array_get(locs, j);
        if (!strcmp(json_string_value(json_object_get(l, "role")) ?: "", "primary")) {
          pstore = json_string_value(json_object_get(l, "store"));
          pkey = json_string_value(json_object_get(l, "key"));
        }
      }
      if (!hex || !pstore || !pkey || strlen(hex) != BR_HEX_LEN) continue;
      if (!strcmp(pstore, to)) {
        ++*at_target;
        continue;
      }
      /* quarantined blobs move too: a store being emptied must end empty */
      if (strcmp(pstore, from)) {
        ++*elsewhere;
        continue;
      }
      if (limit && m->nitems >= limit) continue;
      if (m->nitems == cap) {
        cap = cap ? cap * 2 : 1024;
        struct item *grown = realloc(m->items, cap * sizeof *grown);
        if (!grown) {
          json_decref(reply);
          return br_fail(err, "out of memory");
        }
        m->items = grown;
      }
      struct item *it = &m->items[m->nitems++];
      memcpy(it->hex, hex, BR_HEX_LEN + 1);
      it->size = (uint64_t)json_integer_value(json_object_get(b, "size"));
      it->key = strdup(pkey);
      m->total_bytes += it->size;
    }
    const char *next = json_string_value(json_object_get(reply, "next"));
    int more = next && strlen(next) == BR_HEX_LEN;
    if (more) memcpy(after, next, BR_HEX_LEN + 1);
    json_decref(reply);
    if (!more) return 0;
  }
}

static br_store *open_store(br_config *cfg, const char *name, int read_only, br_err *err) {
  br_store_config *sc = (br_store_config *)br_config_store(cfg, name);
  if (!sc) {
    br_fail(err, "%s: no [store %s]", cfg->path ? cfg->path : "config", name);
    return NULL;
  }
  sc->read_only = read_only;
  return br_store_open(sc, err);
}

int cmd_migrate(const cli_globals *g, int argc, char **argv) {
  const char *conf = NULL, *from = NULL, *to = NULL, *verify = "sha256";
  long concurrency = 4;
  double rate_mb = 0;
  unsigned long long limit = 0;
  int dry = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(migrate_usage, stdout);
      return 0;
    } else if (!strcmp(a, "--dry-run")) {
      dry = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "blobref migrate: %s needs a value\n%s", a, migrate_usage);
      return 2;
    }
    i++;
    if (!strcmp(a, "-c") || !strcmp(a, "--config"))
      conf = v;
    else if (!strcmp(a, "--from"))
      from = v;
    else if (!strcmp(a, "--to"))
      to = v;
    else if (!strcmp(a, "--verify") && (!strcmp(v, "sha256") || !strcmp(v, "size")))
      verify = v;
    else if (!strcmp(a, "--concurrency") && (concurrency = strtol(v, &end, 10)) >= 1 &&
             concurrency <= 256 && !*end)
      ;
    else if (!strcmp(a, "--rate") && (rate_mb = strtod(v, &end)) > 0 && !*end)
      ;
    else if (!strcmp(a, "--limit") && (limit = strtoull(v, &end, 10)) > 0 && !*end)
      ;
    else {
      fprintf(stderr, "blobref migrate: bad option %s %s\n%s", a, v, migrate_usage);
      return 2;
    }
  }
  if (!conf || !from || !to) {
    fprintf(stderr, "blobref migrate: -c, --from and --to are required\n%s", migrate_usage);
    return 2;
  }
  if (!strcmp(from, to)) {
    fprintf(stderr, "blobref migrate: --from and --to are the same store\n");
    return 2;
  }
  br_config cfg;
  br_config_init(&cfg);
  br_err err;
  if (br_config_load(&cfg, conf, &err) < 0 || br_config_finish(&cfg, &err) < 0) {
    fprintf(stderr, "blobref migrate: %s\n", err.msg);
    br_config_free(&cfg);
    return 1;
  }
  struct migrate m = {.g = g, .verify = verify, .rate = rate_mb * 1e6, .tty = isatty(2)};
  pthread_mutex_init(&m.lock, NULL);
  int rc = 1;
  size_t at_target = 0, elsewhere = 0;
  m.from = open_store(&cfg, from, 1, &err);
  if (m.from) m.to = open_store(&cfg, to, 0, &err);
  if (!m.from || !m.to) {
    fprintf(stderr, "blobref migrate: %s\n", err.msg);
    goto out;
  }
  if (list_blobs(&m, from, to, limit, &at_target, &elsewhere, &err) < 0) {
    fprintf(stderr, "blobref migrate: listing blobs: %s\n", err.msg);
    goto out;
  }
  char total_b[32];
  human_bytes((double)m.total_bytes, total_b, sizeof total_b);
  if (dry) {
    printf("dry run: %zu blobs (%s) would move from %s to %s; %zu already in %s; %zu elsewhere\n",
           m.nitems, total_b, from, to, at_target, to, elsewhere);
    rc = 0;
    goto out;
  }
  fprintf(stderr, "migrate: %zu blobs (%s) to move from %s to %s; %zu already in %s\n", m.nitems,
          total_b, from, to, at_target, to);
  m.t0 = now_s();
  pthread_t prog, *workers = calloc((size_t)concurrency, sizeof *workers);
  pthread_create(&prog, NULL, progress_main, &m);
  long started = 0;
  for (; workers && started < concurrency; started++)
    if (pthread_create(&workers[started], NULL, worker_main, &m)) break;
  if (started == 0) worker_main(&m);
  for (long i = 0; i < started; i++) pthread_join(workers[i], NULL);
  free(workers);
  pthread_mutex_lock(&m.lock);
  m.finished = 1;
  progress_line(&m, 1);
  pthread_mutex_unlock(&m.lock);
  pthread_join(prog, NULL);
  double el = now_s() - m.t0;
  char moved_b[32];
  human_bytes((double)m.done_bytes, moved_b, sizeof moved_b);
  printf(
      "moved %zu of %zu blobs (%s) from %s to %s in %.1f s; %zu already in %s; %zu copies "
      "reused from an earlier run; %zu errors\n",
      m.moved, m.nitems, moved_b, from, to, el, at_target, to, m.copies_skipped, m.errors);
  printf(
      "time per step (summed over %ld workers): read+write (copy) %.2f s, verify %.2f s, "
      "switch %.2f s, location requests %.2f s\n",
      concurrency, m.copy_s, m.verify_s, m.switch_s, m.request_s);
  rc = m.errors ? 1 : 0;
out:
  for (size_t i = 0; i < m.nitems; i++) free(m.items[i].key);
  free(m.items);
  if (m.from) br_store_close(m.from);
  if (m.to) br_store_close(m.to);
  br_config_free(&cfg);
  pthread_mutex_destroy(&m.lock);
  return rc;
}
