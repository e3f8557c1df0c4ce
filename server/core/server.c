/* The server's core state below HTTP: stores by name, blob locks by hash, the blob-gone hook
 * (cache and CDN purge) and every store's health (its thread and the figures /readyz reads). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blobcache.h"
#include "core/cdn_purge.h"
#include "core/server.h"

static unsigned stripe_of(const uint8_t digest[BR_SHA256_LEN]) {
  return (digest[0] | (unsigned)digest[1] << 8) % BLOB_LOCKS;
}

br_store *br_server_store(br_server *srv, const char *name) {
  for (int i = 0; i < srv->nstores; i++)
    if (!strcmp(br_store_name(srv->stores[i]), name)) return srv->stores[i];
  return NULL;
}

int br_server_lock_blob(br_server *srv, const uint8_t digest[BR_SHA256_LEN], int lock) {
  pthread_mutex_t *m = &srv->blob_locks[stripe_of(digest)];
  br_err err;
  int rc = 0;
  if (lock) {
    pthread_mutex_lock(m);
    /* a shared index: the other nodes' holders too; without it nothing may go on */
    rc = br_index_lock_blob(srv->index, digest, 1, &err);
    if (rc < 0) {
      char hex[BR_HEX_LEN + 1];
      br_hex_encode(digest, hex);
      br_warn("blob %s: cannot take its lock in the database: %s", hex, err.msg);
      pthread_mutex_unlock(m);
    }
  } else {
    br_index_lock_blob(srv->index, digest, 0, &err);
    pthread_mutex_unlock(m);
  }
  return rc;
}

int br_server_lock_blobs(br_server *srv, const uint8_t (*digests)[BR_SHA256_LEN], size_t n,
                         int lock) {
  /* a shared index holds each blob's lock in a database session of its own: not n at once */
  if (strcmp(br_index_kind(srv->index), "lmdb")) return -1;
  uint8_t want[BLOB_LOCKS] = {0};
  for (size_t i = 0; i < n; i++) want[stripe_of(digests[i])] = 1;
  for (int i = 0; i < BLOB_LOCKS; i++) /* in one order: two of these can never deadlock */
    if (want[i]) (lock ? pthread_mutex_lock : pthread_mutex_unlock)(&srv->blob_locks[i]);
  return 0;
}

/* ---- slow calls outside the stripes ----------------------------------------------------------
 */

/* One blob with store calls in flight outside its stripe. */
struct blob_busy {
  struct blob_busy *next;
  uint8_t digest[BR_SHA256_LEN];
  int commits, deletes;
};

int br_server_off_stripe(const br_server *srv) {
  /* a shared index: another node's upload or delete would not be seen here */
  return strcmp(br_index_kind(srv->index), "lmdb") == 0;
}

/* The entry of digest under busy_lock; created (zeroed) when create, else NULL if none. */
static struct blob_busy *busy_find(br_server *srv, const uint8_t digest[BR_SHA256_LEN],
                                   int create) {
  struct blob_busy **head = &srv->busy[stripe_of(digest)];
  for (struct blob_busy *b = *head; b; b = b->next)
    if (!memcmp(b->digest, digest, BR_SHA256_LEN)) return b;
  if (!create) return NULL;
  struct blob_busy *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  memcpy(b->digest, digest, BR_SHA256_LEN);
  b->next = *head;
  *head = b;
  return b;
}

/* Frees digest's entry when nothing is in flight on it any more (under busy_lock). */
static void busy_drop(br_server *srv, struct blob_busy *gone) {
  if (gone->commits || gone->deletes) return;
  for (struct blob_busy **p = &srv->busy[stripe_of(gone->digest)]; *p; p = &(*p)->next)
    if (*p == gone) {
      *p = gone->next;
      free(gone);
      return;
    }
}

int br_server_commit_begin(br_server *srv, const uint8_t digest[BR_SHA256_LEN]) {
  pthread_mutex_lock(&srv->busy_lock);
  struct blob_busy *b = busy_find(srv, digest, 1);
  int rc = -1;
  if (b) {
    b->commits++;
    rc = b->deletes > 0;
  }
  pthread_mutex_unlock(&srv->busy_lock);
  return rc;
}

void br_server_commit_end(br_server *srv, const uint8_t digest[BR_SHA256_LEN]) {
  pthread_mutex_lock(&srv->busy_lock);
  struct blob_busy *b = busy_find(srv, digest, 0);
  if (b && b->commits > 0) {
    b->commits--;
    busy_drop(srv, b);
  }
  pthread_mutex_unlock(&srv->busy_lock);
}

int br_server_delete_begin(br_server *srv, const uint8_t digest[BR_SHA256_LEN]) {
  pthread_mutex_lock(&srv->busy_lock);
  struct blob_busy *b = busy_find(srv, digest, 1);
  int rc = -1;
  if (b && b->commits > 0) {
    rc = 1;
  } else if (b) {
    b->deletes++;
    rc = 0;
  }
  pthread_mutex_unlock(&srv->busy_lock);
  return rc;
}

void br_server_delete_end(br_server *srv, const uint8_t digest[BR_SHA256_LEN]) {
  pthread_mutex_lock(&srv->busy_lock);
  struct blob_busy *b = busy_find(srv, digest, 0);
  if (b && b->deletes > 0) {
    b->deletes--;
    busy_drop(srv, b);
  }
  pthread_mutex_unlock(&srv->busy_lock);
}

size_t br_server_fresh_key(const br_store *st, const uint8_t digest[BR_SHA256_LEN], char *out,
                           size_t outlen) {
  static atomic_uint_fast64_t seq;
  size_t n = br_store_default_key(st, digest, out, outlen);
  if (!n) return 0;
  int m = snprintf(out + n, outlen - n, ".u%" PRIx64 "-%" PRIu64, br_now_ms(),
                   (uint64_t)atomic_fetch_add(&seq, 1));
  return m < 0 || (size_t)m >= outlen - n ? 0 : n + (size_t)m;
}

int br_server_delete_busy(br_server *srv, const uint8_t digest[BR_SHA256_LEN]) {
  pthread_mutex_lock(&srv->busy_lock);
  struct blob_busy *b = busy_find(srv, digest, 0);
  int rc = b && b->deletes > 0;
  pthread_mutex_unlock(&srv->busy_lock);
  return rc;
}

void br_server_blob_gone(br_server *srv, const uint8_t digest[BR_SHA256_LEN]) {
  if (srv->cache) blobcache_remove(srv->cache, digest);
  cdn_purger_kick(srv->purger); /* the change queued the purge in its own transaction */
}

void br_server_store_error(br_server *srv, const br_store *store, enum store_op op) {
  for (int i = 0; i < srv->nstores; i++)
    if (srv->stores[i] == store) atomic_fetch_add(&srv->store_errors[i][op], 1);
}

/* ---- store health ------------------------------------------------------------------------- */

/* Checks every store that can fail (S3, http origins) every few seconds, more often while one is
 * failing, so that /readyz can answer from memory and say which store is wrong and why. */
static void *health_main(void *arg) {
  br_server *srv = arg;
  pthread_mutex_lock(&srv->health_lock);
  while (srv->health_running) {
    int all_ok = 1;
    for (int i = 0; i < srv->nstores; i++) {
      pthread_mutex_unlock(&srv->health_lock);
      br_err err;
      int rc = br_store_check(srv->stores[i], &err);
      pthread_mutex_lock(&srv->health_lock);
      int was = atomic_load(&srv->store_ok[i]);
      if (rc < 0) {
        br_server_store_error(srv, srv->stores[i], STORE_OP_CHECK);
        snprintf(srv->store_error[i], sizeof srv->store_error[i], "%s", err.msg);
        if (was != 0) br_warn("not ready: %s", err.msg);
        all_ok = 0;
      } else if (was == 0) {
        br_info("store %s is reachable again", br_store_name(srv->stores[i]));
      }
      atomic_store(&srv->store_ok[i], rc < 0 ? 0 : 1);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += all_ok ? 5 : 1;
    if (srv->health_running) pthread_cond_timedwait(&srv->health_cv, &srv->health_lock, &ts);
  }
  pthread_mutex_unlock(&srv->health_lock);
  return NULL;
}

int br_server_store_health(br_server *srv, char *msg, size_t msglen) {
  int ok = 1;
  pthread_mutex_lock(&srv->health_lock);
  for (int i = 0; i < srv->nstores && ok; i++) {
    int v = atomic_load(&srv->store_ok[i]);
    if (v < 0) {
      snprintf(msg, msglen, "store %s: not checked yet", br_store_name(srv->stores[i]));
      ok = 0;
    } else if (v == 0) {
      snprintf(msg, msglen, "%s", srv->store_error[i]);
      ok = 0;
    } else if (br_store_unavailable(srv->stores[i])) {
      /* the circuit breaker fails requests fast after a connection failure, between checks */
      snprintf(msg, msglen, "store %s: unreachable a moment ago; requests fail fast for now",
               br_store_name(srv->stores[i]));
      ok = 0;
    }
  }
  pthread_mutex_unlock(&srv->health_lock);
  return ok ? 0 : -1;
}

int br_server_health_start(br_server *srv, br_err *err) {
  pthread_mutex_init(&srv->health_lock, NULL);
  pthread_cond_init(&srv->health_cv, NULL);
  for (int i = 0; i < srv->nstores; i++)
    atomic_store(&srv->store_ok[i], strcmp(br_store_kind(srv->stores[i]), "fs") ? -1 : 1);
  srv->health_running = 1;
  if (pthread_create(&srv->health_thread, NULL, health_main, srv)) {
    srv->health_running = 0;
    return br_fail(err, "cannot start the health thread");
  }
  return 0;
}

void br_server_health_stop(br_server *srv) {
  if (!srv->health_running) return;
  pthread_mutex_lock(&srv->health_lock);
  srv->health_running = 0;
  pthread_cond_broadcast(&srv->health_cv);
  pthread_mutex_unlock(&srv->health_lock);
  pthread_join(srv->health_thread, NULL);
}
