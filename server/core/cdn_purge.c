/* CDN purges: a sender thread that sends the purges pending in the index (PURGE, BAN, ... to the
 * [cdn]'s purge_url with {hash} replaced), retrying failures with exponential backoff up to 5
 * minutes apart, and the one-time move of the old DATA_DIR/purge queue into the index. */
#include "core/cdn_purge.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define D BR_SHA256_LEN
#define BATCH 64
#define MAX_BACKOFF_MS 300000u

struct cdn_purger {
  const br_config *cfg;
  br_index *index;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  int stopping, started, kick;
  uint8_t cursor[D]; /* where the next scan of the pending purges starts */
  int has_cursor;
  atomic_uint_fast64_t sent, failed;
};

static int lmdb_err(br_err *err, const char *what, int rc) {
  return br_fail(err, "cdn purge queue: %s: %s", what, mdb_strerror(rc));
}

/* Sends one purge. Returns 0 when the CDN accepted it (2xx, or 404: nothing cached). */
static int send_purge(const br_cdn_config *c, const uint8_t digest[D], char *why, size_t whylen) {
  char hex[BR_HEX_LEN + 1], url[4096];
  br_hex_encode(digest, hex);
  const char *at = strstr(c->purge_url, "{hash}");
  snprintf(url, sizeof url, "%.*s%s%s", (int)(at - c->purge_url), c->purge_url, hex, at + 6);
  CURL *h = curl_easy_init();
  if (!h) return snprintf(why, whylen, "no curl handle"), -1;
  struct curl_slist *hdrs = NULL;
  for (int i = 0; i < c->nheaders; i++) hdrs = curl_slist_append(hdrs, c->headers[i]);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, c->method);
  curl_easy_setopt(h, CURLOPT_NOBODY, 0L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, NULL);
  FILE *sink = fopen("/dev/null", "w");
  if (sink) curl_easy_setopt(h, CURLOPT_WRITEDATA, sink);
  CURLcode rc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (sink) fclose(sink);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(h);
  if (rc != CURLE_OK) return snprintf(why, whylen, "%s", curl_easy_strerror(rc)), -1;
  if ((status >= 200 && status < 300) || status == 404) return 0;
  snprintf(why, whylen, "HTTP %ld", status);
  return -1;
}

/* One pass over the due purges (at most BATCH): sends each to every CDN that has not
 * acknowledged it yet and settles them in the index (removed once all did, else retried later
 * with backoff). Returns 1 when more may be due at once, else 0. */
static int drain_once(cdn_purger *p) {
  br_purge due[BATCH];
  uint8_t next[D];
  int wrapped = 1;
  br_err err;
  int n = br_index_purges_due(p->index, p->has_cursor ? p->cursor : NULL, br_now_ms(), due, BATCH,
                              next, &wrapped, &err);
  if (n < 0) {
    br_error("cdn purge: %s", err.msg);
    return 0;
  }
  p->has_cursor = !wrapped;
  if (!wrapped) memcpy(p->cursor, next, D);
  int ncdns = p->cfg->ncdns < BR_MAX_PURGE_CDNS ? p->cfg->ncdns : BR_MAX_PURGE_CDNS;
  uint32_t all = ncdns == 32 ? UINT32_MAX : ((uint32_t)1 << ncdns) - 1;
  uint64_t sent = 0, failed = 0; /* counted once settled: the metrics never run ahead */
  for (int i = 0; i < n; i++) {
    br_purge *pg = &due[i];
    pg->acked &= all; /* a [cdn] removed from the config: its purges are dropped */
    for (int ci = 0; ci < ncdns; ci++) {
      if (pg->acked & (uint32_t)1 << ci) continue;
      char why[256] = "";
      if (send_purge(&p->cfg->cdns[ci], pg->digest, why, sizeof why) == 0) {
        pg->acked |= (uint32_t)1 << ci;
        sent++;
        continue;
      }
      failed++;
      char hex[BR_HEX_LEN + 1];
      br_hex_encode(pg->digest, hex);
      br_warn("cdn %s: purge of %s failed (%s); attempt %u, retrying", p->cfg->cdns[ci].name, hex,
              why, pg->attempts + 1);
    }
    pg->done = pg->acked == all;
    if (!pg->done) {
      pg->attempts++;
      uint64_t backoff = 1000ull << (pg->attempts < 9 ? pg->attempts : 9);
      pg->next_ms = br_now_ms() + (backoff > MAX_BACKOFF_MS ? MAX_BACKOFF_MS : backoff);
    }
  }
  if (n && br_index_settle_purges(p->index, due, (size_t)n, &err) < 0) {
    br_error("cdn purge: %s (the purges are sent again)", err.msg);
    return 0; /* not at once: they are still due */
  }
  atomic_fetch_add(&p->sent, sent);
  atomic_fetch_add(&p->failed, failed);
  return n == BATCH || !wrapped;
}

static void *sender_main(void *arg) {
  cdn_purger *p = arg;
  pthread_mutex_lock(&p->lock);
  while (!p->stopping) {
    p->kick = 0;
    pthread_mutex_unlock(&p->lock);
    int more = drain_once(p);
    pthread_mutex_lock(&p->lock);
    if (more || p->kick || p->stopping) continue;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&p->cv, &p->lock, &ts);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

/* Moves the purges of the old queue in dir (an LMDB environment: key = CDN number + digest)
 * into the index, then removes it. Nothing there: nothing done. 0, or -1 + err (it stays). */
static int import_old_queue(cdn_purger *p, const char *dir, br_err *err) {
  enum { CHUNK = 1024 };
  char path[4200];
  struct stat st;
  snprintf(path, sizeof path, "%s/data.mdb", dir);
  if (stat(path, &st) < 0) return 0;
  MDB_env *env = NULL;
  MDB_txn *txn = NULL;
  MDB_cursor *cur = NULL;
  MDB_dbi dbi;
  uint8_t(*chunk)[D] = malloc(CHUNK * sizeof *chunk);
  size_t n = 0, total = 0;
  int out = 0, rc = chunk ? 0 : ENOMEM;
  if (!rc) rc = mdb_env_create(&env);
  if (!rc) rc = mdb_env_set_mapsize(env, (size_t)1 << 30);
  if (!rc) rc = mdb_env_open(env, dir, MDB_NOTLS, 0600);
  if (!rc) rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn);
  if (!rc) rc = mdb_dbi_open(txn, NULL, 0, &dbi);
  if (!rc) rc = mdb_cursor_open(txn, dbi, &cur);
  MDB_val k, v;
  for (int op = MDB_FIRST; !rc && !out; op = MDB_NEXT) {
    rc = mdb_cursor_get(cur, &k, &v, op);
    if (!rc && k.mv_size == 1 + D) memcpy(chunk[n++], (uint8_t *)k.mv_data + 1, D);
    if (n && (n == CHUNK || rc)) {
      out = br_index_queue_purges(p->index, (const uint8_t(*)[D])chunk, n, err) < 0 ? -1 : 0;
      total += n;
      n = 0;
    }
  }
  if (rc == MDB_NOTFOUND) rc = 0;
  if (cur) mdb_cursor_close(cur);
  if (txn) mdb_txn_abort(txn);
  if (env) mdb_env_close(env);
  free(chunk);
  if (rc && !out) out = lmdb_err(err, dir, rc);
  if (out) return -1;
  if (unlink(path) < 0 && errno != ENOENT)
    return br_fail(err, "cdn purge queue: remove %s: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s/lock.mdb", dir);
  unlink(path);
  rmdir(dir);
  br_info("cdn purge: %zu pending purge(s) moved from %s into the index", total, dir);
  return 0;
}

cdn_purger *cdn_purger_open(const br_config *cfg, br_index *index, const char *old_dir,
                            br_err *err) {
  cdn_purger *p = calloc(1, sizeof *p);
  if (!p) {
    br_fail(err, "out of memory");
    return NULL;
  }
  p->cfg = cfg;
  p->index = index;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cv, NULL);
  br_err ierr;
  if (import_old_queue(p, old_dir, &ierr) < 0)
    br_error("%s (the old queue stays; moved at the next start)", ierr.msg);
  if (pthread_create(&p->thread, NULL, sender_main, p)) {
    free(p);
    br_fail(err, "cannot start the cdn purge thread");
    return NULL;
  }
  p->started = 1;
  return p;
}

void cdn_purger_close(cdn_purger *p) {
  if (!p) return;
  if (p->started) {
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
  }
  free(p);
}

void cdn_purger_kick(cdn_purger *p) {
  if (!p) return;
  pthread_mutex_lock(&p->lock);
  p->kick = 1;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->lock);
}

void cdn_purger_stats(cdn_purger *p, cdn_purge_stats *out) {
  memset(out, 0, sizeof *out);
  if (!p) return;
  out->sent = atomic_load(&p->sent);
  out->failed = atomic_load(&p->failed);
  /* without a CDN none are queued: no count (one statement on a shared index) at each scrape */
  out->pending = p->cfg->ncdns > 0 ? br_index_purges_pending(p->index) : 0;
}
