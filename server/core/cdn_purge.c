/* CDN purges: a durable queue (one LMDB record per CDN and blob: attempts, next try) and a sender
 * thread that sends each purge (PURGE, BAN, ... to the [cdn]'s purge_url with {hash} replaced),
 * retrying failures with exponential backoff up to 5 minutes apart. */
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

#define D BR_SHA256_LEN
#define BATCH 64
#define MAX_BACKOFF_MS 300000u

struct cdn_purger {
  const br_config *cfg;
  MDB_env *env;
  MDB_dbi dbi;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  int stopping, started, kick;
  atomic_uint_fast64_t sent, failed, pending;
};

struct entry_val {
  uint32_t attempts;
  uint64_t next_ms;
};

static int lmdb_err(br_err *err, const char *what, int rc) {
  return br_fail(err, "cdn purge queue: %s: %s", what, mdb_strerror(rc));
}

static uint64_t count_pending(cdn_purger *p) {
  MDB_txn *txn;
  MDB_stat st;
  if (mdb_txn_begin(p->env, NULL, MDB_RDONLY, &txn)) return 0;
  uint64_t n = mdb_stat(txn, p->dbi, &st) == 0 ? st.ms_entries : 0;
  mdb_txn_abort(txn);
  return n;
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

/* One pass over the due entries (at most BATCH). Returns how many were due. */
static int drain_once(cdn_purger *p) {
  struct {
    uint8_t key[1 + D];
    struct entry_val v;
  } due[BATCH];
  int n = 0;
  uint64_t now = br_now_ms();
  MDB_txn *txn;
  if (mdb_txn_begin(p->env, NULL, MDB_RDONLY, &txn)) return 0;
  MDB_cursor *cur;
  if (mdb_cursor_open(txn, p->dbi, &cur) == 0) {
    MDB_val k, v;
    int op = MDB_FIRST;
    while (n < BATCH && mdb_cursor_get(cur, &k, &v, op) == 0) {
      op = MDB_NEXT;
      if (k.mv_size != 1 + D || v.mv_size != sizeof(struct entry_val)) continue;
      struct entry_val ev;
      memcpy(&ev, v.mv_data, sizeof ev);
      if (ev.next_ms > now) continue;
      memcpy(due[n].key, k.mv_data, 1 + D);
      due[n].v = ev;
      n++;
    }
    mdb_cursor_close(cur);
  }
  mdb_txn_abort(txn);
  for (int i = 0; i < n; i++) {
    int ci = due[i].key[0];
    char why[256] = "";
    int ok =
        ci < p->cfg->ncdns && send_purge(&p->cfg->cdns[ci], due[i].key + 1, why, sizeof why) == 0;
    if (ci >= p->cfg->ncdns) ok = 1; /* a [cdn] removed from the config: drop its purges */
    if (mdb_txn_begin(p->env, NULL, 0, &txn)) continue;
    MDB_val k = {1 + D, due[i].key};
    if (ok) {
      mdb_del(txn, p->dbi, &k, NULL);
      atomic_fetch_add(&p->sent, 1);
    } else {
      struct entry_val ev = due[i].v;
      ev.attempts++;
      uint64_t backoff = 1000ull << (ev.attempts < 9 ? ev.attempts : 9);
      ev.next_ms = br_now_ms() + (backoff > MAX_BACKOFF_MS ? MAX_BACKOFF_MS : backoff);
      MDB_val v = {sizeof ev, &ev};
      mdb_put(txn, p->dbi, &k, &v, 0);
      atomic_fetch_add(&p->failed, 1);
      char hex[BR_HEX_LEN + 1];
      br_hex_encode(due[i].key + 1, hex);
      br_warn("cdn %s: purge of %s failed (%s); attempt %u, retrying", p->cfg->cdns[ci].name, hex,
              why, ev.attempts);
    }
    mdb_txn_commit(txn);
  }
  atomic_store(&p->pending, count_pending(p));
  return n;
}

static void *sender_main(void *arg) {
  cdn_purger *p = arg;
  pthread_mutex_lock(&p->lock);
  while (!p->stopping) {
    p->kick = 0;
    pthread_mutex_unlock(&p->lock);
    int n = drain_once(p);
    pthread_mutex_lock(&p->lock);
    if (n == BATCH || p->kick || p->stopping) continue;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&p->cv, &p->lock, &ts);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

cdn_purger *cdn_purger_open(const br_config *cfg, const char *dir, br_err *err) {
  cdn_purger *p = calloc(1, sizeof *p);
  if (!p) {
    br_fail(err, "out of memory");
    return NULL;
  }
  p->cfg = cfg;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cv, NULL);
  if (cfg->ncdns == 0) return p; /* nothing to purge */
  MDB_txn *txn = NULL;
  int rc;
  if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
    br_fail(err, "cdn purge queue: mkdir %s: %s", dir, strerror(errno));
    free(p);
    return NULL;
  }
  if ((rc = mdb_env_create(&p->env)) || (rc = mdb_env_set_mapsize(p->env, (size_t)1 << 30)) ||
      (rc = mdb_env_open(p->env, dir, MDB_NOTLS, 0600)) ||
      (rc = mdb_txn_begin(p->env, NULL, 0, &txn)) || (rc = mdb_dbi_open(txn, NULL, 0, &p->dbi)) ||
      (rc = mdb_txn_commit(txn))) {
    if (txn && rc) mdb_txn_abort(txn);
    lmdb_err(err, dir, rc);
    if (p->env) mdb_env_close(p->env);
    free(p);
    return NULL;
  }
  atomic_store(&p->pending, count_pending(p));
  if (pthread_create(&p->thread, NULL, sender_main, p)) {
    mdb_env_close(p->env);
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
  if (p->env) mdb_env_close(p->env);
  free(p);
}

int cdn_purge_enqueue(cdn_purger *p, const uint8_t digest[D], br_err *err) {
  if (!p || !p->env) return 0;
  MDB_txn *txn;
  int rc = mdb_txn_begin(p->env, NULL, 0, &txn);
  if (rc) return lmdb_err(err, "begin", rc);
  for (int i = 0; i < p->cfg->ncdns && rc == 0; i++) {
    uint8_t key[1 + D];
    key[0] = (uint8_t)i;
    memcpy(key + 1, digest, D);
    struct entry_val ev = {0, 0};
    MDB_val k = {sizeof key, key}, v = {sizeof ev, &ev};
    rc = mdb_put(txn, p->dbi, &k, &v, 0);
  }
  if (rc) {
    mdb_txn_abort(txn);
    return lmdb_err(err, "put", rc);
  }
  if ((rc = mdb_txn_commit(txn))) return lmdb_err(err, "commit", rc);
  pthread_mutex_lock(&p->lock);
  p->kick = 1;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->lock);
  return 0;
}

void cdn_purger_stats(cdn_purger *p, cdn_purge_stats *out) {
  memset(out, 0, sizeof *out);
  if (!p) return;
  out->sent = atomic_load(&p->sent);
  out->failed = atomic_load(&p->failed);
  out->pending = atomic_load(&p->pending);
}
