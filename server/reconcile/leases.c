/* Upload leases (blobref/leases.h) in an LMDB environment of their own: "leases" (id -> the
 * br_lease record), "by_blob" (digest + id) for reconcile's question and "by_lease" (id + digest)
 * for a release; each change is one durable transaction. */
#include "blobref/leases.h"

#include <errno.h>
#include <lmdb.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define D BR_SHA256_LEN
#define L BR_LEASE_ID_LEN

struct br_leases {
  MDB_env *env;
  MDB_dbi leases, by_blob, by_lease;
  pthread_mutex_t gate; /* held by br_lease_attach and by a br_leases_block caller */
};

static int fail(br_err *err, const char *what, int rc) {
  return br_fail(err, "leases: %s: %s", what, mdb_strerror(rc));
}

br_leases *br_leases_open(const char *dir, br_err *err) {
  if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
    br_fail(err, "leases: mkdir %s: %s", dir, strerror(errno));
    return NULL;
  }
  br_leases *l = calloc(1, sizeof *l);
  if (!l) {
    br_fail(err, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&l->gate, NULL);
  MDB_txn *txn = NULL;
  int rc;
  if ((rc = mdb_env_create(&l->env)) || (rc = mdb_env_set_maxdbs(l->env, 4)) ||
      (rc = mdb_env_set_mapsize(l->env, (size_t)4 << 30)) ||
      (rc = mdb_env_open(l->env, dir, MDB_NOTLS, 0600)) ||
      (rc = mdb_txn_begin(l->env, NULL, 0, &txn)) ||
      (rc = mdb_dbi_open(txn, "leases", MDB_CREATE, &l->leases)) ||
      (rc = mdb_dbi_open(txn, "by_blob", MDB_CREATE, &l->by_blob)) ||
      (rc = mdb_dbi_open(txn, "by_lease", MDB_CREATE, &l->by_lease)) ||
      (rc = mdb_txn_commit(txn))) {
    if (txn && rc) mdb_txn_abort(txn);
    fail(err, dir, rc);
    if (l->env) mdb_env_close(l->env);
    pthread_mutex_destroy(&l->gate);
    free(l);
    return NULL;
  }
  return l;
}

void br_leases_close(br_leases *l) {
  if (!l) return;
  mdb_env_close(l->env);
  pthread_mutex_destroy(&l->gate);
  free(l);
}

void br_leases_block(br_leases *l) { pthread_mutex_lock(&l->gate); }

void br_leases_unblock(br_leases *l) { pthread_mutex_unlock(&l->gate); }

static int valid_id(const char *id) {
  return id && strlen(id) == L && strspn(id, "0123456789abcdef") == L;
}

/* The record of id in txn: 1 found (any expiry), 0 not, -1 + err. */
static int read_lease(br_leases *l, MDB_txn *txn, const char *id, br_lease *out, br_err *err) {
  if (!valid_id(id)) return 0;
  MDB_val k = {L, (void *)id}, v;
  int rc = mdb_get(txn, l->leases, &k, &v);
  if (rc == MDB_NOTFOUND) return 0;
  if (rc) return fail(err, "read", rc);
  if (v.mv_size != sizeof *out) return br_fail(err, "leases: a damaged record");
  memcpy(out, v.mv_data, sizeof *out);
  return 1;
}

int br_lease_create(br_leases *l, const char *name, const char *owner, uint64_t ttl_ms,
                    uint64_t now, br_lease *out, br_err *err) {
  memset(out, 0, sizeof *out);
  uint8_t raw[L / 2];
  if (RAND_bytes(raw, sizeof raw) != 1) return br_fail(err, "leases: no random bytes");
  for (size_t i = 0; i < sizeof raw; i++) snprintf(out->id + 2 * i, 3, "%02x", raw[i]);
  snprintf(out->name, sizeof out->name, "%s", name);
  snprintf(out->owner, sizeof out->owner, "%s", owner ? owner : "");
  out->created_ms = now;
  out->expires_ms = now + ttl_ms;
  MDB_txn *txn;
  int rc = mdb_txn_begin(l->env, NULL, 0, &txn);
  if (rc) return fail(err, "write", rc);
  MDB_val k = {L, out->id}, v = {sizeof *out, out};
  rc = mdb_put(txn, l->leases, &k, &v, MDB_NOOVERWRITE);
  if (rc) {
    mdb_txn_abort(txn);
    return fail(err, "write", rc);
  }
  rc = mdb_txn_commit(txn);
  return rc ? fail(err, "commit", rc) : 0;
}

int br_lease_get(br_leases *l, const char *id, uint64_t now, br_lease *out, br_err *err) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(l->env, NULL, MDB_RDONLY, &txn);
  if (rc) return fail(err, "read", rc);
  int found = read_lease(l, txn, id, out, err);
  mdb_txn_abort(txn);
  return found == 1 && out->expires_ms <= now ? 0 : found;
}

/* Deletes lease id, its blob entries and, in txn. Returns 0 or an LMDB code. */
static int drop_lease(br_leases *l, MDB_txn *txn, const char *id) {
  MDB_cursor *cur;
  int rc = mdb_cursor_open(txn, l->by_lease, &cur);
  if (rc) return rc;
  MDB_val k = {L, (void *)id}, v;
  int op = MDB_SET_RANGE;
  while ((rc = mdb_cursor_get(cur, &k, &v, op)) == 0) {
    op = MDB_NEXT;
    if (k.mv_size != L + D || memcmp(k.mv_data, id, L)) break;
    uint8_t bk[D + L];
    memcpy(bk, (const uint8_t *)k.mv_data + L, D);
    memcpy(bk + D, id, L);
    MDB_val b = {sizeof bk, bk};
    rc = mdb_del(txn, l->by_blob, &b, NULL);
    if (rc && rc != MDB_NOTFOUND) break;
    if ((rc = mdb_cursor_del(cur, 0))) break;
  }
  mdb_cursor_close(cur);
  if (rc && rc != MDB_NOTFOUND) return rc;
  MDB_val lk = {L, (void *)id};
  rc = mdb_del(txn, l->leases, &lk, NULL);
  return rc == MDB_NOTFOUND ? 0 : rc;
}

int br_lease_release(br_leases *l, const char *id, br_err *err) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(l->env, NULL, 0, &txn);
  if (rc) return fail(err, "write", rc);
  br_lease rec;
  int found = read_lease(l, txn, id, &rec, err);
  if (found <= 0) {
    mdb_txn_abort(txn);
    return found;
  }
  rc = drop_lease(l, txn, id);
  if (rc) {
    mdb_txn_abort(txn);
    return fail(err, "release", rc);
  }
  rc = mdb_txn_commit(txn);
  return rc ? fail(err, "commit", rc) : 1;
}

/* br_lease_attach's transaction, under the gate. */
static int attach_locked(br_leases *l, const char *id, const char *owner, const uint8_t *digests,
                         size_t n, uint64_t now, br_err *err) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(l->env, NULL, 0, &txn);
  if (rc) return fail(err, "write", rc);
  br_lease rec;
  int out = read_lease(l, txn, id, &rec, err);
  if (out == 1 && (rec.expires_ms <= now || (owner && strcmp(owner, rec.owner)))) out = 0;
  for (size_t i = 0; i < n && out == 1; i++) {
    const uint8_t *d = digests + i * D;
    uint8_t lk[L + D], bk[D + L];
    memcpy(lk, id, L);
    memcpy(lk + L, d, D);
    memcpy(bk, d, D);
    memcpy(bk + D, id, L);
    MDB_val k = {sizeof lk, lk}, b = {sizeof bk, bk}, e = {0, NULL};
    rc = mdb_get(txn, l->by_lease, &k, &e);
    if (rc == 0) continue; /* attached before */
    if (rc != MDB_NOTFOUND) {
      out = fail(err, "read", rc);
    } else if (rec.blobs >= BR_LEASE_MAX_BLOBS) {
      out = 2;
    } else {
      e = (MDB_val){0, NULL};
      if ((rc = mdb_put(txn, l->by_lease, &k, &e, 0)) || (rc = mdb_put(txn, l->by_blob, &b, &e, 0)))
        out = fail(err, "write", rc);
      rec.blobs++;
    }
  }
  MDB_val rk = {L, (void *)id}, rv = {sizeof rec, &rec};
  if (out == 1 && (rc = mdb_put(txn, l->leases, &rk, &rv, 0))) out = fail(err, "write", rc);
  if (out != 1) {
    mdb_txn_abort(txn);
    return out;
  }
  rc = mdb_txn_commit(txn);
  return rc ? fail(err, "commit", rc) : 1;
}

int br_lease_attach(br_leases *l, const char *id, const char *owner, const uint8_t *digests,
                    size_t n, uint64_t now, br_err *err) {
  pthread_mutex_lock(&l->gate);
  int rc = attach_locked(l, id, owner, digests, n, now, err);
  pthread_mutex_unlock(&l->gate);
  return rc;
}

int br_leases_each(br_leases *l, const char *owner, uint64_t now,
                   int (*fn)(void *ud, const br_lease *lease), void *ud, br_err *err) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(l->env, NULL, MDB_RDONLY, &txn);
  if (rc) return fail(err, "read", rc);
  MDB_cursor *cur;
  rc = mdb_cursor_open(txn, l->leases, &cur);
  if (rc) {
    mdb_txn_abort(txn);
    return fail(err, "read", rc);
  }
  MDB_val k, v;
  int op = MDB_FIRST;
  while (mdb_cursor_get(cur, &k, &v, op) == 0) {
    op = MDB_NEXT;
    br_lease rec;
    if (v.mv_size != sizeof rec) continue;
    memcpy(&rec, v.mv_data, sizeof rec);
    if (rec.expires_ms <= now || (owner && strcmp(owner, rec.owner))) continue;
    if (fn(ud, &rec)) break;
  }
  mdb_cursor_close(cur);
  mdb_txn_abort(txn);
  return 0;
}

uint64_t br_leased_until(br_leases *l, const uint8_t d[D], uint64_t now, char id[L + 1]) {
  MDB_txn *txn;
  if (mdb_txn_begin(l->env, NULL, MDB_RDONLY, &txn)) return 0;
  MDB_cursor *cur;
  uint64_t until = 0;
  if (mdb_cursor_open(txn, l->by_blob, &cur) == 0) {
    MDB_val k = {D, (void *)d}, v;
    int op = MDB_SET_RANGE;
    while (mdb_cursor_get(cur, &k, &v, op) == 0) {
      op = MDB_NEXT;
      if (k.mv_size != D + L || memcmp(k.mv_data, d, D)) break;
      char lid[L + 1];
      memcpy(lid, (const uint8_t *)k.mv_data + D, L);
      lid[L] = '\0';
      br_lease rec;
      br_err err;
      if (read_lease(l, txn, lid, &rec, &err) == 1 && rec.expires_ms > now &&
          rec.expires_ms > until) {
        until = rec.expires_ms;
        if (id) memcpy(id, lid, L + 1);
      }
    }
    mdb_cursor_close(cur);
  }
  mdb_txn_abort(txn);
  return until;
}

int64_t br_leases_prune(br_leases *l, uint64_t now, br_err *err) {
  int live_only = 1; /* no write (and no sync) when nothing expired */
  MDB_txn *txn;
  int rc = mdb_txn_begin(l->env, NULL, MDB_RDONLY, &txn);
  if (rc) return fail(err, "read", rc);
  MDB_cursor *c;
  if (mdb_cursor_open(txn, l->leases, &c) == 0) {
    MDB_val k, v;
    int op = MDB_FIRST;
    while (live_only && mdb_cursor_get(c, &k, &v, op) == 0) {
      op = MDB_NEXT;
      br_lease rec;
      if (v.mv_size != sizeof rec) continue;
      memcpy(&rec, v.mv_data, sizeof rec);
      if (rec.expires_ms <= now) live_only = 0;
    }
    mdb_cursor_close(c);
  }
  mdb_txn_abort(txn);
  if (live_only) return 0;
  rc = mdb_txn_begin(l->env, NULL, 0, &txn);
  if (rc) return fail(err, "write", rc);
  MDB_cursor *cur;
  rc = mdb_cursor_open(txn, l->leases, &cur);
  if (rc) {
    mdb_txn_abort(txn);
    return fail(err, "prune", rc);
  }
  int64_t n = 0;
  char(*expired)[L + 1] = NULL;
  size_t cap = 0;
  MDB_val k, v;
  int op = MDB_FIRST;
  while (rc == 0 && mdb_cursor_get(cur, &k, &v, op) == 0) {
    op = MDB_NEXT;
    br_lease rec;
    if (v.mv_size != sizeof rec) continue;
    memcpy(&rec, v.mv_data, sizeof rec);
    if (rec.expires_ms > now) continue;
    if ((size_t)n == cap) {
      cap = cap ? cap * 2 : 16;
      void *grown = realloc(expired, cap * sizeof *expired);
      if (!grown) {
        rc = ENOMEM;
        break;
      }
      expired = grown;
    }
    memcpy(expired[n++], rec.id, L + 1);
  }
  mdb_cursor_close(cur);
  for (int64_t i = 0; rc == 0 && i < n; i++) rc = drop_lease(l, txn, expired[i]);
  free(expired);
  if (rc) {
    mdb_txn_abort(txn);
    return fail(err, "prune", rc);
  }
  rc = mdb_txn_commit(txn);
  return rc ? fail(err, "commit", rc) : n;
}

static int count_lease(void *ud, const br_lease *lease) {
  uint64_t *c = ud;
  c[0]++;
  c[1] += lease->blobs;
  return 0;
}

void br_leases_stats(br_leases *l, uint64_t now, uint64_t *leases, uint64_t *blobs) {
  uint64_t c[2] = {0, 0};
  br_err err;
  if (br_leases_each(l, NULL, now, count_lease, c, &err) < 0) br_warn("%s", err.msg);
  *leases = c[0];
  *blobs = c[1];
}
