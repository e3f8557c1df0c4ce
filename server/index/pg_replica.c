/* Point reads on a read replica: a small pool of connections, each read preceded by a check that
 * the replica has replayed the primary's position the caller needs (else the primary answers). */
#include "index/pg_replica.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PGR_MAX 32        /* connections at most; with none free the primary answers */
#define PGR_RETRY_MS 1000 /* a replica that could not be reached is tried again after this */

struct pgr_pool {
  char *dsn;
  pthread_mutex_t lock;
  PGconn *idle[PGR_MAX];
  size_t nidle, nopen;
  uint64_t down_until_ms; /* monotonic: not tried before */
  int down_logged;
};

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

pgr_pool *pgr_open(const char *dsn, br_err *err) {
  pgr_pool *p = calloc(1, sizeof *p);
  if (!p || !(p->dsn = strdup(dsn))) {
    free(p);
    br_fail(err, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&p->lock, NULL);
  return p;
}

/* An idle or new connection, or NULL (down, or all in use). */
static PGconn *take(pgr_pool *p) {
  pthread_mutex_lock(&p->lock);
  PGconn *c = p->nidle ? p->idle[--p->nidle] : NULL;
  int may_open = !c && p->nopen < PGR_MAX && mono_ms() >= p->down_until_ms;
  if (may_open) p->nopen++;
  pthread_mutex_unlock(&p->lock);
  if (!may_open) return c;
  const char *const keys[] = {"dbname", "application_name", NULL};
  const char *const vals[] = {p->dsn, "blobrefd-replica", NULL};
  c = PQconnectdbParams(keys, vals, 1);
  if (c && PQstatus(c) == CONNECTION_OK) {
    pthread_mutex_lock(&p->lock);
    if (p->down_logged) br_info("index: the read replica is reachable again");
    p->down_logged = 0;
    pthread_mutex_unlock(&p->lock);
    return c;
  }
  char why[256];
  snprintf(why, sizeof why, "%s", c ? PQerrorMessage(c) : "out of memory");
  why[strcspn(why, "\n")] = '\0';
  PQfinish(c);
  pthread_mutex_lock(&p->lock);
  p->nopen--;
  p->down_until_ms = mono_ms() + PGR_RETRY_MS;
  if (!p->down_logged) br_warn("index: read replica unavailable (the primary answers): %s", why);
  p->down_logged = 1;
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

static void give(pgr_pool *p, PGconn *c) {
  int broken = PQstatus(c) != CONNECTION_OK || PQtransactionStatus(c) != PQTRANS_IDLE;
  if (broken) PQfinish(c);
  pthread_mutex_lock(&p->lock);
  if (broken)
    p->nopen--;
  else
    p->idle[p->nidle++] = c; /* nidle < nopen <= PGR_MAX */
  pthread_mutex_unlock(&p->lock);
}

int pgr_get(pgr_pool *p, const uint8_t digest[BR_SHA256_LEN], uint64_t min_lsn, const void **val,
            size_t *len, void **hold) {
  PGconn *c = take(p);
  if (!c) return 2;
  char lsn[32];
  snprintf(lsn, sizeof lsn, "%X/%X", (unsigned)(min_lsn >> 32), (unsigned)(min_lsn & 0xffffffffu));
  const char *v1[1] = {lsn};
  /* replayed far enough (a replica that is a primary now has no replay position: current) */
  PGresult *r = PQexecParams(c, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, true)", 1,
                             NULL, v1, NULL, NULL, 0);
  int ok = r && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 &&
           !strcmp(PQgetvalue(r, 0, 0), "t");
  PQclear(r);
  int out = 2;
  if (ok) { /* a later statement's snapshot has at least what was replayed then */
    const char *v[1] = {(const char *)digest};
    int l[1] = {BR_SHA256_LEN}, f[1] = {1};
    r = PQexecParams(c, "SELECT record FROM blobref_blobs WHERE digest = $1", 1, NULL, v, l, f, 1);
    if (r && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
      *val = PQgetvalue(r, 0, 0);
      *len = (size_t)PQgetlength(r, 0, 0);
      *hold = r;
      out = 0;
    } else {
      out = r && PQresultStatus(r) == PGRES_TUPLES_OK ? 1 : 2;
      PQclear(r);
    }
  }
  give(p, c);
  return out;
}

void pgr_done(void *hold) { PQclear(hold); }

void pgr_close(pgr_pool *p) {
  if (!p) return;
  for (size_t i = 0; i < p->nidle; i++) PQfinish(p->idle[i]);
  pthread_mutex_destroy(&p->lock);
  free(p->dsn);
  free(p);
}
