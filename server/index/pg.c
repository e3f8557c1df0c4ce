/* The index's PostgreSQL backend (libpq): the schema (created and migrated under an advisory
 * lock), a pool of reader connections, and the writer's connection, whose transactions lock the
 * rows they read (FOR UPDATE) so that the shared decision code sees them as they are. */
#include "backend.h"
#include "index/pg_listen.h"

#include <libpq-events.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SCHEMA_LOCK 0x626c6f6272656631ll /* pg_advisory_xact_lock key for schema changes */
#define POOL_MAX 32                      /* reader connections at most */
#define SCAN_PAGE 1000                   /* rows per query of a scan */
#define RECONNECT_MS 200                 /* the writer tries to reconnect at most this often */
#define MAX_CONFLICT_RETRIES 8           /* a batch run again after conflicts with other nodes */
#define PIPE_MAX 256                     /* the writer's statements sent and not read, at most */

#define OWNER_KEY_MAX (BR_MAX_STORE_NAME + BR_MAX_KEY + 2) /* store '\0' key */

/* A statement of the writer's pipeline whose result is not read yet: the status it must have,
 * check (non-empty: it must touch a row, else a conflict with this message), and memo (>= 0:
 * its answer is the memo's (memo, key)). */
struct pending {
  ExecStatusType want;
  int memo;
  size_t klen;
  char check[128];
  char key[OWNER_KEY_MAX];
};

/* A held blob lock: the connection that holds it. */
struct held_lock {
  int32_t cls, key;
  int wait; /* taken with LOCK_WAIT (a blob's lock): released without waiting */
  PGconn *conn;
  struct held_lock *next;
};

struct idx_backend {
  char *dsn;
  char node[300];          /* host/pid: who holds a purge claim (shown, never compared) */
  uint64_t purge_claim_ms; /* how long a purge claim holds */
  int schema_ok;           /* set once at open: new connections prepare the hot reads */
  char count_node[24];     /* this process's rows of blobref_counts (random at open) */
  /* the writer's (writer thread only) */
  PGconn *wconn;
  PGresult *wres;       /* holds the value purge_get returned */
  struct pending *pend; /* PIPE_MAX: the statements sent whose results are not read yet */
  size_t npend;
  int prc;           /* the first failure in this transaction's pipeline (0: none) */
  struct memo *memo; /* the rows this transaction has locked or written */
  size_t nmemo, memo_cap;
  atomic_uint_fast64_t round_trips; /* the writer's waits for the database */
  uint64_t last_connect_ms;
  char werr[512];
  int wconflict;
  /* the readers' pool */
  pthread_mutex_t lock;
  pthread_cond_t cv;
  PGconn *idle[POOL_MAX];
  size_t nidle, nopen;
  atomic_int up;          /* the last contact with the database worked */
  struct held_lock *held; /* blob locks held (lock_blob), each on its own connection */
};

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* libpq's message, first line only (never the conninfo: no password ends up in a log). */
static void pq_message(PGconn *c, const PGresult *r, char *out, size_t cap) {
  const char *m = r ? PQresultErrorMessage(r) : "";
  if (!m || !*m) m = c ? PQerrorMessage(c) : "no connection";
  snprintf(out, cap, "%s", m && *m ? m : "unknown error");
  out[strcspn(out, "\n")] = '\0';
}

static int exec_ok(PGconn *c, const char *sql, char *why, size_t cap);

/* The hot reads, prepared on every connection and planned once per connection: a generic plan,
 * which prunes the 16 partitions at run time (PostgreSQL's default would plan each call anew, its
 * custom plans looking cheaper than the generic one, and planning costs more than the lookup).
 * plan_cache_mode, read at each execution, is force_generic_plan while they run and the default
 * while an ad hoc query with parameters runs (see reader_mode). */
#define STMT_GET "br_get"
#define SQL_GET "SELECT record FROM blobref_blobs WHERE digest = $1"
#define STMT_GET_MANY "br_get_many"
#define SQL_GET_MANY                                                                          \
  "SELECT (q.i - 1)::int4, b.record FROM unnest($1::bytea[]) WITH ORDINALITY AS q(digest, i)" \
  " JOIN blobref_blobs b ON b.digest = q.digest"

/* The blob locks (advisory, held by a pooled connection's session), prepared with the reads. */
#define STMT_LOCK "br_lock"
#define SQL_LOCK "SELECT pg_advisory_lock($1::int4, $2::int4)"
#define STMT_UNLOCK "br_unlock"
#define SQL_UNLOCK "SELECT pg_advisory_unlock($1::int4, $2::int4)"

/* The writer's statements of every upload (and of most changes), prepared on its connection,
 * which plans them once (plan_cache_mode = force_generic_plan: PostgreSQL would otherwise keep
 * planning each call anew over the 16 partitions, its custom plans looking cheaper than the
 * generic one). wsend finds a statement here by its text. */
#define SQL_LOCK_RECORD "SELECT record FROM blobref_blobs WHERE digest = $1 FOR UPDATE"
#define SQL_LOCK_OWNER "SELECT owner FROM blobref_owners WHERE store = $1 AND key = $2 FOR UPDATE"
#define SQL_INSERT_RECORD "INSERT INTO blobref_blobs (digest, record) VALUES ($1, $2)"
#define SQL_UPDATE_RECORD "UPDATE blobref_blobs SET record = $2 WHERE digest = $1"
#define SQL_DELETE_RECORD "DELETE FROM blobref_blobs WHERE digest = $1"
#define SQL_PUT_OWNER                                                  \
  "INSERT INTO blobref_owners (store, key, owner) VALUES ($1, $2, $3)" \
  " ON CONFLICT (store, key) DO UPDATE SET owner = EXCLUDED.owner"     \
  " WHERE blobref_owners.owner = EXCLUDED.owner"
#define SQL_NOTIFY "SELECT pg_notify('" PGL_CHANNEL "', $1)"
/* The counters' upsert (pg_counts_add), a row of values per (store, state) changed; its one- and
 * two-row texts (a batch of new uploads to one store: its row and the all-stores row) are among
 * the prepared ones. */
#define SQL_COUNTS_HEAD "INSERT INTO blobref_counts (node, store, state, blobs, bytes) VALUES "
#define SQL_COUNTS_ROW "%s($1::int8, $%d, $%d::int2, $%d::int8, $%d::int8)"
#define SQL_COUNTS_TAIL                                                                            \
  " ON CONFLICT (node, store, state) DO UPDATE SET blobs = blobref_counts.blobs + EXCLUDED.blobs," \
  " bytes = blobref_counts.bytes + EXCLUDED.bytes"
#define SQL_COUNTS_ONE \
  SQL_COUNTS_HEAD "($1::int8, $2, $3::int2, $4::int8, $5::int8)" SQL_COUNTS_TAIL
#define SQL_COUNTS_TWO                            \
  SQL_COUNTS_HEAD                                 \
  "($1::int8, $2, $3::int2, $4::int8, $5::int8)," \
  "($1::int8, $6, $7::int2, $8::int8, $9::int8)" SQL_COUNTS_TAIL
static const char *const WRITER_SQL[] = {SQL_LOCK_RECORD,   SQL_LOCK_OWNER,    SQL_INSERT_RECORD,
                                         SQL_UPDATE_RECORD, SQL_DELETE_RECORD, SQL_PUT_OWNER,
                                         SQL_NOTIFY,        SQL_COUNTS_ONE,    SQL_COUNTS_TWO};
#define WRITER_STMTS ((int)(sizeof WRITER_SQL / sizeof WRITER_SQL[0]))

/* The name of sql's prepared statement on the writer's connection ("bw0" ...), or NULL. */
static const char *writer_stmt(const char *sql, char name[16]) {
  for (int i = 0; i < WRITER_STMTS; i++)
    if (!strcmp(sql, WRITER_SQL[i])) {
      snprintf(name, 16, "bw%d", i);
      return name;
    }
  return NULL;
}

/* A reader connection's plan_cache_mode is known by libpq instance data under this event
 * procedure: non-NULL while the session is in force_generic_plan. A new connection (a reconnect)
 * starts in the default mode, as its session does. */
static int plan_mode_event(PGEventId id, void *info, void *arg) {
  if (id == PGEVT_CONNRESET)
    PQsetInstanceData(((PGEventConnReset *)info)->conn, plan_mode_event, NULL);
  (void)arg;
  return 1;
}

static char GENERIC_MODE; /* the instance data of a session in force_generic_plan */

/* Puts reader connection c's session in force_generic_plan (generic: for the hot reads) or back
 * in the default mode (for ad hoc queries with parameters, planned as before), a round trip only
 * when it changes. 0, or -1 with c's error (the caller's query then fails on c as well). */
static int reader_mode(PGconn *c, int generic) {
  if ((PQinstanceData(c, plan_mode_event) != NULL) == generic) return 0;
  PGresult *r = PQexec(
      c, generic ? "SET plan_cache_mode = force_generic_plan" : "SET plan_cache_mode = DEFAULT");
  int ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
  PQclear(r);
  if (ok) PQsetInstanceData(c, plan_mode_event, generic ? &GENERIC_MODE : NULL);
  return ok ? 0 : -1;
}

static int prepare(PGconn *c, const char *name, const char *sql, char *why, size_t cap) {
  PGresult *r = PQprepare(c, name, sql, 0, NULL);
  int ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
  if (!ok) pq_message(c, r, why, cap);
  PQclear(r);
  return ok ? 0 : -1;
}

/* A connection, NULL + why. The statements are prepared once the schema exists (not on the
 * first connection, which creates it). */
static PGconn *connect_db(idx_backend *be, char *why, size_t cap) {
  PGconn *c = PQconnectdb(be->dsn);
  if (c && PQstatus(c) == CONNECTION_OK) {
    PQclear(PQexec(c, "SET application_name = 'blobrefd'"));
    if (!be->schema_ok || (PQregisterEventProc(c, plan_mode_event, "blobref plan mode", NULL) &&
                           prepare(c, STMT_GET, SQL_GET, why, cap) == 0 &&
                           prepare(c, STMT_GET_MANY, SQL_GET_MANY, why, cap) == 0 &&
                           prepare(c, STMT_LOCK, SQL_LOCK, why, cap) == 0 &&
                           prepare(c, STMT_UNLOCK, SQL_UNLOCK, why, cap) == 0))
      return c;
  }
  pq_message(c, NULL, why, cap);
  PQfinish(c);
  return NULL;
}

/* Makes c the writer's connection: its statements prepared, planned once. 0 or -1 with why. */
static int writer_setup(PGconn *c, char *why, size_t cap) {
  if (exec_ok(c, "SET plan_cache_mode = force_generic_plan", why, cap) < 0) return -1;
  for (int i = 0; i < WRITER_STMTS; i++) {
    char name[16];
    snprintf(name, sizeof name, "bw%d", i);
    if (prepare(c, name, WRITER_SQL[i], why, cap) < 0) return -1;
  }
  return 0;
}

/* ---- the schema -------------------------------------------------------------------------------
 * blobref_blobs: one row per blob, the 32-byte digest and its encoded record (the same format as
 * LMDB's, so that every reply is the same whatever the backend), range-partitioned by the
 * digest's first byte into 16 partitions (a scan in key order walks them in order, no merge).
 * blobref_owners: (store, key) -> owner digest, unique (invariant 10). blobref_purges: pending
 * CDN purges, digest -> PURGE_VALUE bytes. */

static const char *const SCHEMA_V1[] = {
    "CREATE TABLE blobref_blobs (digest bytea NOT NULL CHECK (length(digest) = 32),"
    " record bytea NOT NULL, PRIMARY KEY (digest)) PARTITION BY RANGE (digest)",
    "CREATE TABLE blobref_owners (store text NOT NULL, key text NOT NULL,"
    " owner bytea NOT NULL, PRIMARY KEY (store, key))",
    "CREATE TABLE blobref_purges (digest bytea NOT NULL PRIMARY KEY, value bytea NOT NULL)",
};

/* Runs sql on c; 0 or -1 with why. */
static int exec_ok(PGconn *c, const char *sql, char *why, size_t cap) {
  PGresult *r = PQexec(c, sql);
  int ok = r && (PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK);
  if (!ok) pq_message(c, r, why, cap);
  PQclear(r);
  return ok ? 0 : -1;
}

/* Schema step 1: the blobs (16 range partitions), the owners and the purges. */
static int schema_v1(PGconn *c, char *why, size_t cap) {
  char sql[256];
  int rc = 0;
  for (size_t i = 0; !rc && i < sizeof SCHEMA_V1 / sizeof SCHEMA_V1[0]; i++)
    rc = exec_ok(c, SCHEMA_V1[i], why, cap);
  for (int p = 0; !rc && p < 16; p++) {
    char from[16], to[16];
    snprintf(from, sizeof from, p ? "('\\x%02x')" : "(MINVALUE)", p * 16);
    snprintf(to, sizeof to, p < 15 ? "('\\x%02x')" : "(MAXVALUE)", (p + 1) * 16);
    snprintf(sql, sizeof sql,
             "CREATE TABLE blobref_blobs_%x PARTITION OF blobref_blobs FOR VALUES FROM %s TO %s", p,
             from, to);
    rc = exec_ok(c, sql, why, cap);
  }
  return rc;
}

/* Schema step "purge claims": a purge's due time (its value's next_ms, for the claim's WHERE) and
 * its claim (until, database clock in ms since the epoch, and by whom), so that the nodes share
 * one queue: rows are claimed FOR UPDATE SKIP LOCKED and skipped while a claim lives. */
static int schema_purge_claims(PGconn *c, char *why, size_t cap) {
  int rc = exec_ok(c,
                   "ALTER TABLE blobref_purges ADD COLUMN due_ms bigint NOT NULL DEFAULT 0,"
                   " ADD COLUMN claimed_until bigint NOT NULL DEFAULT 0,"
                   " ADD COLUMN claimed_by text NOT NULL DEFAULT ''",
                   why, cap);
  if (!rc)
    rc = exec_ok(c, "CREATE INDEX blobref_purges_due ON blobref_purges (due_ms, claimed_until)",
                 why, cap);
  return rc;
}

/* Schema step "shared state": what every node answers alike (reconcile's reports and per-run
 * lists) as bytes by key, and the sequence of reconcile run ids. */
static int schema_shared_state(PGconn *c, char *why, size_t cap) {
  int rc = exec_ok(c,
                   "CREATE TABLE blobref_shared (key bytea NOT NULL PRIMARY KEY,"
                   " value bytea NOT NULL)",
                   why, cap);
  if (!rc) rc = exec_ok(c, "CREATE SEQUENCE blobref_run_ids", why, cap);
  return rc;
}

/* Schema step "counters": exact per-state counters, rows (node, store, state) summed at read so
 * that each node's writer adds to rows of its own (no hot row shared by the nodes). The row of
 * state -1 (node 0, store '') says they are complete; created empty, they are recounted at the
 * next writable open (an index migrated from an older schema). */
static int schema_counts(PGconn *c, char *why, size_t cap) {
  return exec_ok(c,
                 "CREATE TABLE blobref_counts (node bigint NOT NULL, store text NOT NULL,"
                 " state smallint NOT NULL, blobs bigint NOT NULL, bytes bigint NOT NULL,"
                 " PRIMARY KEY (node, store, state))",
                 why, cap);
}

/* Schema step "file cache": reconcile's data-file cache, each data file's hashes by file id in
 * chunks of raw digests (chunk 0 written last, with the number of chunks). The hashes are random
 * bytes: stored out of line without trying to compress them. */
static int schema_file_cache(PGconn *c, char *why, size_t cap) {
  int rc = exec_ok(c,
                   "CREATE TABLE blobref_filecache (id bytea NOT NULL CHECK (length(id) = 32),"
                   " chunk integer NOT NULL CHECK (chunk >= 0), chunks integer,"
                   " hashes bytea NOT NULL CHECK (length(hashes) % 32 = 0),"
                   " PRIMARY KEY (id, chunk))",
                   why, cap);
  if (!rc)
    rc = exec_ok(c, "ALTER TABLE blobref_filecache ALTER COLUMN hashes SET STORAGE EXTERNAL", why,
                 cap);
  return rc;
}

/* Schema step "direct plans": the direct-upload plans handed out by every node, one row each,
 * aged on the database's clock (created_ms), with a claim like the purges' (until, by whom) so
 * that whichever node sweeps an expired plan first takes it and the others skip it. */
static int schema_direct_plans(PGconn *c, char *why, size_t cap) {
  int rc = exec_ok(c,
                   "CREATE TABLE blobref_direct_plans (id bigserial PRIMARY KEY,"
                   " digest bytea NOT NULL CHECK (length(digest) = 32), store text NOT NULL,"
                   " key text NOT NULL, upload_id text NOT NULL,"
                   " created_ms bigint NOT NULL"
                   " DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::int8,"
                   " claimed_until bigint NOT NULL DEFAULT 0, claimed_by text NOT NULL DEFAULT '')",
                   why, cap);
  if (!rc)
    rc = exec_ok(c, "CREATE INDEX blobref_direct_plans_digest ON blobref_direct_plans (digest)",
                 why, cap);
  if (!rc)
    rc = exec_ok(c, "CREATE INDEX blobref_direct_plans_age ON blobref_direct_plans (created_ms)",
                 why, cap);
  return rc;
}

/* Schema step "jobs": the job engine's migrate and import jobs, one row each (doc: the job's
 * JSON), with the lease of the node running it (owner, until on the database's clock) and the
 * cancel asked for from any node; one active job per source store, by a unique index. */
static int schema_jobs(PGconn *c, char *why, size_t cap) {
  int rc = exec_ok(c,
                   "CREATE TABLE blobref_jobs (id bigserial PRIMARY KEY, source text NOT NULL,"
                   " active boolean NOT NULL DEFAULT true, cancel boolean NOT NULL DEFAULT false,"
                   " owner text NOT NULL DEFAULT '', lease_until bigint NOT NULL DEFAULT 0,"
                   " doc text NOT NULL)",
                   why, cap);
  if (!rc)
    rc = exec_ok(c,
                 "CREATE UNIQUE INDEX blobref_jobs_one_per_source ON blobref_jobs (source)"
                 " WHERE active",
                 why, cap);
  return rc;
}

/* The migration steps in order: step i brings the schema to version i + 1. */
static int (*const SCHEMA_STEPS[])(PGconn *c, char *why, size_t cap) = {
    schema_v1,         schema_purge_claims, schema_shared_state, schema_counts,
    schema_file_cache, schema_direct_plans, schema_jobs,
};
#define SCHEMA_VERSION ((int)(sizeof SCHEMA_STEPS / sizeof SCHEMA_STEPS[0]))

/* Creates or migrates the schema in one transaction under an advisory lock (nodes starting
 * together wait for each other). 0 or -1 with why. */
static int ensure_schema(PGconn *c, char *why, size_t cap) {
  char sql[256];
  if (exec_ok(c, "BEGIN", why, cap) < 0) return -1;
  snprintf(sql, sizeof sql, "SELECT pg_advisory_xact_lock(%lld)", SCHEMA_LOCK);
  int rc = exec_ok(c, sql, why, cap);
  if (!rc)
    rc = exec_ok(c, "CREATE TABLE IF NOT EXISTS blobref_schema (version integer NOT NULL)", why,
                 cap);
  int version = 0;
  if (!rc) {
    PGresult *r = PQexec(c, "SELECT coalesce(max(version), 0) FROM blobref_schema");
    if (r && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
      version = atoi(PQgetvalue(r, 0, 0));
    else
      rc = -1, pq_message(c, r, why, cap);
    PQclear(r);
  }
  if (!rc && version > SCHEMA_VERSION) {
    snprintf(why, cap, "schema version %d is newer than this blobrefd's (%d)", version,
             SCHEMA_VERSION);
    rc = -1;
  }
  if (!rc && version < SCHEMA_VERSION)
    br_info("index: %s the PostgreSQL schema (version %d -> %d)",
            version ? "migrating" : "creating", version, SCHEMA_VERSION);
  for (int v = version; !rc && v < SCHEMA_VERSION; v++) {
    rc = SCHEMA_STEPS[v](c, why, cap);
    snprintf(sql, sizeof sql, "INSERT INTO blobref_schema VALUES (%d)", v + 1);
    if (!rc) rc = exec_ok(c, sql, why, cap);
  }
  if (!rc) return exec_ok(c, "COMMIT", why, cap);
  PQclear(PQexec(c, "ROLLBACK"));
  return -1;
}

/* ---- the readers' pool ------------------------------------------------------------------------
 */

/* A connection for one query or scan; NULL with err (BR_INDEX_UNAVAILABLE) when none can be had. */
static PGconn *pool_take(idx_backend *be, int unbounded, br_err *err) {
  pthread_mutex_lock(&be->lock);
  while (!unbounded && !be->nidle && be->nopen >= POOL_MAX) pthread_cond_wait(&be->cv, &be->lock);
  if (be->nidle) {
    PGconn *c = be->idle[--be->nidle];
    pthread_mutex_unlock(&be->lock);
    return c;
  }
  be->nopen++;
  pthread_mutex_unlock(&be->lock);
  char why[256];
  PGconn *c = connect_db(be, why, sizeof why);
  if (c) return c;
  atomic_store(&be->up, 0);
  br_fail(err, "index: PostgreSQL unavailable: %s", why);
  pthread_mutex_lock(&be->lock);
  be->nopen--;
  pthread_cond_signal(&be->cv);
  pthread_mutex_unlock(&be->lock);
  return NULL;
}

/* Gives c back (a broken one is closed). With sent, c's last statement may still be running
 * (a blob lock's release, sent and not waited for): the next PQexec* on c reads and drops its
 * result first, as libpq does with any result not consumed. */
static void pool_give_as(idx_backend *be, PGconn *c, int sent) {
  PGTransactionStatusType ts = PQtransactionStatus(c);
  int broken =
      PQstatus(c) != CONNECTION_OK || (ts != PQTRANS_IDLE && !(sent && ts == PQTRANS_ACTIVE));
  if (broken) PQfinish(c);
  pthread_mutex_lock(&be->lock);
  if (broken)
    be->nopen--;
  else if (be->nidle < POOL_MAX)
    be->idle[be->nidle++] = c;
  else
    PQfinish(c), be->nopen--;
  pthread_cond_signal(&be->cv);
  pthread_mutex_unlock(&be->lock);
}

static void pool_give(idx_backend *be, PGconn *c) { pool_give_as(be, c, 0); }

/* The failure of a query on c as a public code: BR_INDEX_UNAVAILABLE when the connection is gone.
 */
static int read_fail(idx_backend *be, PGconn *c, PGresult *r, const char *what, br_err *err) {
  char why[256];
  pq_message(c, r, why, sizeof why);
  int gone = PQstatus(c) != CONNECTION_OK;
  if (gone) atomic_store(&be->up, 0);
  br_fail(err, "index: %s: %s", what, why);
  return gone ? BR_INDEX_UNAVAILABLE : -1;
}

/* Runs a read query with binary parameters and results on a pooled connection, once more on a
 * fresh connection when the pooled one had been cut (a database restart). The result (tuples)
 * or NULL with *rc set. */
static PGresult *run_read(idx_backend *be, const char *stmt, const char *sql, int n,
                          const char *const *vals, const int *lens, const int *fmts,
                          const char *what, int *rc, br_err *err) {
  for (int attempt = 0; attempt < 2; attempt++) {
    PGconn *c = pool_take(be, 0, err);
    if (!c) {
      *rc = BR_INDEX_UNAVAILABLE;
      return NULL;
    }
    /* a statement without parameters is planned alike in either mode */
    PGresult *r = NULL;
    if (!stmt && n == 0)
      r = PQexecParams(c, sql, n, NULL, vals, lens, fmts, 1);
    else if (reader_mode(c, stmt != NULL) == 0)
      r = stmt ? PQexecPrepared(c, stmt, n, vals, lens, fmts, 1)
               : PQexecParams(c, sql, n, NULL, vals, lens, fmts, 1);
    if (r && (PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK)) {
      atomic_store(&be->up, 1);
      pool_give(be, c);
      return r;
    }
    *rc = read_fail(be, c, r, what, err);
    PQclear(r);
    pool_give(be, c);
    if (*rc != BR_INDEX_UNAVAILABLE) break;
  }
  return NULL;
}

static PGresult *read_query(idx_backend *be, const char *sql, int n, const char *const *vals,
                            const int *lens, const int *fmts, const char *what, int *rc,
                            br_err *err) {
  return run_read(be, NULL, sql, n, vals, lens, fmts, what, rc, err);
}

static int pg_get(idx_backend *be, const uint8_t digest[BR_SHA256_LEN], const void **val,
                  size_t *len, void **hold, br_err *err) {
  const char *v[1] = {(const char *)digest};
  int l[1] = {BR_SHA256_LEN}, f[1] = {1}, rc = 0;
  PGresult *r = run_read(be, STMT_GET, NULL, 1, v, l, f, "get", &rc, err);
  if (!r) return rc;
  if (PQntuples(r) == 0) {
    PQclear(r);
    return 1;
  }
  *val = PQgetvalue(r, 0, 0);
  *len = (size_t)PQgetlength(r, 0, 0);
  *hold = r;
  return 0;
}

static void pg_get_done(idx_backend *be, void *hold) {
  (void)be;
  PQclear(hold);
}

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* One statement for up to BR_INDEX_GET_MANY digests, sent as one binary bytea[] (ndim, flags,
 * element type, length and lower bound, then each element's length and bytes). */
static int pg_get_many(idx_backend *be, const uint8_t *digests, size_t n, idx_scan_fn fn, void *ud,
                       br_err *err) {
  if (n > BR_INDEX_GET_MANY) return br_fail(err, "index: batch get of %zu digests", n);
  size_t len = 20 + n * (4 + BR_SHA256_LEN);
  uint8_t *arr = malloc(len), *p = arr;
  if (!arr) return br_fail(err, "out of memory");
  put_be32(p, 1), put_be32(p + 4, 0), put_be32(p + 8, 17 /* bytea */);
  put_be32(p + 12, (uint32_t)n), put_be32(p + 16, 1);
  p += 20;
  for (size_t i = 0; i < n; i++, p += 4 + BR_SHA256_LEN) {
    put_be32(p, BR_SHA256_LEN);
    memcpy(p + 4, digests + i * BR_SHA256_LEN, BR_SHA256_LEN);
  }
  const char *v[1] = {(const char *)arr};
  int l[1] = {(int)len}, f[1] = {1}, rc = 0;
  PGresult *r = run_read(be, STMT_GET_MANY, NULL, 1, v, l, f, "batch get", &rc, err);
  free(arr);
  if (!r) return rc;
  int rows = PQntuples(r), out = 0;
  for (int k = 0; k < rows && !out; k++) {
    const uint8_t *ip = (const uint8_t *)PQgetvalue(r, k, 0);
    if (PQgetlength(r, k, 0) != 4) {
      out = br_fail(err, "index: batch get: a row number of %d bytes", PQgetlength(r, k, 0));
      break;
    }
    size_t i = (size_t)ip[0] << 24 | (size_t)ip[1] << 16 | (size_t)ip[2] << 8 | ip[3];
    if (fn(ud, NULL, i, PQgetvalue(r, k, 1), (size_t)PQgetlength(r, k, 1))) out = -1;
  }
  PQclear(r);
  return out;
}

/* Pages through table in key order inside one REPEATABLE READ transaction (one snapshot). */
static int pg_scan(idx_backend *be, enum idx_table table, const uint8_t *after, idx_scan_fn fn,
                   void *ud, br_err *err) {
  PGconn *c = pool_take(be, 0, err);
  if (!c) return BR_INDEX_UNAVAILABLE;
  char sql[160];
  snprintf(sql, sizeof sql, "SELECT digest, %s FROM %s WHERE digest > $1 ORDER BY digest LIMIT %d",
           table == IDX_BLOBS ? "record" : "value",
           table == IDX_BLOBS ? "blobref_blobs" : "blobref_purges", SCAN_PAGE);
  int out = 0;
  PGresult *r =
      reader_mode(c, 0) == 0 ? PQexec(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") : NULL;
  if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) out = read_fail(be, c, r, "scan", err);
  PQclear(r);
  uint8_t from[BR_SHA256_LEN];
  int from_len = 0; /* the empty bytea sorts before every digest */
  if (after) memcpy(from, after, BR_SHA256_LEN), from_len = BR_SHA256_LEN;
  for (int more = 1; !out && more;) {
    const char *v[1] = {(const char *)from};
    int l[1] = {from_len}, f[1] = {1};
    r = PQexecParams(c, sql, 1, NULL, v, l, f, 1);
    if (!r || PQresultStatus(r) != PGRES_TUPLES_OK) {
      out = read_fail(be, c, r, "scan", err);
      PQclear(r);
      break;
    }
    int n = PQntuples(r);
    more = n == SCAN_PAGE;
    for (int i = 0; i < n; i++) {
      const uint8_t *k = (const uint8_t *)PQgetvalue(r, i, 0);
      size_t klen = (size_t)PQgetlength(r, i, 0);
      if (fn(ud, k, klen, PQgetvalue(r, i, 1), (size_t)PQgetlength(r, i, 1))) {
        more = 0;
        break;
      }
      if (klen == BR_SHA256_LEN) memcpy(from, k, BR_SHA256_LEN), from_len = BR_SHA256_LEN;
    }
    PQclear(r);
  }
  PQclear(PQexec(c, "ROLLBACK"));
  if (!out) atomic_store(&be->up, 1);
  pool_give(be, c);
  return out;
}

static const uint8_t SHARED_OWNER[BR_SHA256_LEN] = {0};

static int pg_key_owner(idx_backend *be, const char *store, const char *key,
                        uint8_t owner[BR_SHA256_LEN], br_err *err) {
  const char *v[2] = {store, key};
  int rc = 0;
  PGresult *r = read_query(be, "SELECT owner FROM blobref_owners WHERE store = $1 AND key = $2", 2,
                           v, NULL, NULL, "store-key map", &rc, err);
  if (!r) return rc;
  int out = 1;
  if (PQntuples(r) == 1 && PQgetlength(r, 0, 0) == BR_SHA256_LEN) {
    memcpy(owner, PQgetvalue(r, 0, 0), BR_SHA256_LEN);
    out = memcmp(owner, SHARED_OWNER, BR_SHA256_LEN) ? 0 : 2;
  } else if (PQntuples(r) == 1) {
    out = br_fail(err, "index: store-key map: owner of %d bytes", PQgetlength(r, 0, 0));
  }
  PQclear(r);
  return out;
}

static uint64_t count_rows(idx_backend *be, const char *table) {
  char sql[96];
  snprintf(sql, sizeof sql, "SELECT count(*)::text FROM %s", table);
  int rc = 0;
  br_err err;
  PGresult *r = read_query(be, sql, 0, NULL, NULL, NULL, "count", &rc, &err);
  if (!r) return 0;
  uint64_t n = PQntuples(r) == 1 ? strtoull(PQgetvalue(r, 0, 0), NULL, 10) : 0;
  PQclear(r);
  return n;
}

/* No statement: /metrics takes the entries from the counters (blobref_counts), and the purges
 * pending are counted by pg_purges_pending, asked only where CDN purges are configured. */
static void pg_stats(idx_backend *be, br_index_stats *out) {
  out->round_trips = atomic_load(&be->round_trips);
}

static uint64_t pg_purges_pending(idx_backend *be) { return count_rows(be, "blobref_purges"); }

static int pg_has_purges(idx_backend *be) {
  (void)be;
  return 1;
}

/* Asks the database (one round trip on a pooled connection). */
static int pg_ready(idx_backend *be) {
  br_err err;
  int rc = 0;
  PGresult *r = read_query(be, "SELECT 1", 0, NULL, NULL, NULL, "ready", &rc, &err);
  PQclear(r);
  return r != NULL;
}

/* ---- the writer -------------------------------------------------------------------------------
 * A batch is one transaction on the writer's connection in libpq pipeline mode: the statements
 * whose answer the decision code does not wait for (BEGIN, inserts, updates, the counters, the
 * notifications) are sent without waiting, and their results are read (and checked) when the
 * next read needs its answer, or at the commit's one sync. Rows read under a lock (FOR UPDATE)
 * or written by the transaction are remembered (the memo), so that a second read of a row is
 * answered without a round trip; prefetch reads a batch's rows in one round trip. */

/* ---- the memo: the transaction's rows, as it has locked or written them ---------------------
 */

enum { MEMO_RECORD, MEMO_OWNER };

struct memo {
  int kind;
  size_t klen, len;
  char *key; /* the digest, or store '\0' key */
  void *val; /* NULL: absent */
};

static void memo_clear(idx_backend *be) {
  for (size_t i = 0; i < be->nmemo; i++) {
    free(be->memo[i].key);
    free(be->memo[i].val);
  }
  be->nmemo = 0;
}

/* The entry of (kind, key), or NULL. The latest entries first: a batch's operations come one
 * after another. */
static struct memo *memo_find(idx_backend *be, int kind, const void *key, size_t klen) {
  for (size_t i = be->nmemo; i-- > 0;) {
    struct memo *m = &be->memo[i];
    if (m->kind == kind && m->klen == klen && !memcmp(m->key, key, klen)) return m;
  }
  return NULL;
}

/* Remembers (kind, key) as holding val (NULL: absent). The entry, or NULL (out of memory, the
 * transaction spoiled). A value returned earlier for the key stays valid until the next writer
 * primitive. */
static struct memo *memo_set(idx_backend *be, int kind, const void *key, size_t klen,
                             const void *val, size_t len) {
  void *copy = NULL;
  if (val && !(copy = malloc(len ? len : 1))) goto oom;
  if (val) memcpy(copy, val, len);
  struct memo *m = memo_find(be, kind, key, klen);
  if (!m) {
    if (be->nmemo == be->memo_cap) {
      size_t cap = be->memo_cap ? be->memo_cap * 2 : 64;
      struct memo *grown = realloc(be->memo, cap * sizeof *grown);
      if (!grown) goto oom;
      be->memo = grown, be->memo_cap = cap;
    }
    char *k = malloc(klen);
    if (!k) goto oom;
    memcpy(k, key, klen);
    m = &be->memo[be->nmemo++];
    *m = (struct memo){.kind = kind, .klen = klen, .key = k};
  }
  free(m->val);
  m->val = copy, m->len = len;
  return m;
oom:
  free(copy);
  snprintf(be->werr, sizeof be->werr, "out of memory");
  be->prc = IDX_PG_FAILED;
  return NULL;
}

/* Takes a locking read's result into the memo (its first column the value, no row absent). */
static struct memo *memo_take(idx_backend *be, int kind, const void *key, size_t klen,
                              PGresult *r) {
  int present = PQntuples(r) > 0;
  struct memo *m = memo_set(be, kind, key, klen, present ? PQgetvalue(r, 0, 0) : NULL,
                            present ? (size_t)PQgetlength(r, 0, 0) : 0);
  PQclear(r);
  return m;
}

/* An owner's memo key: store '\0' key, in out (OWNER_KEY_MAX bytes); its length, 0 if too long. */
static size_t owner_key(const br_location *loc, char *out, size_t cap) {
  int n = snprintf(out, cap, "%s%c%s", loc->store, 0, loc->key);
  return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

/* Remembers a failed statement (err kept for `fail`); IDX_PG_CONFLICT for another node's
 * transaction in the way, IDX_PG_FAILED otherwise. */
static int writer_fail(idx_backend *be, PGresult *r) {
  const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
  pq_message(be->wconn, r, be->werr, sizeof be->werr);
  /* unique_violation, serialization_failure, deadlock_detected */
  int conflict =
      state && (!strcmp(state, "23505") || !strcmp(state, "40001") || !strcmp(state, "40P01"));
  return conflict ? IDX_PG_CONFLICT : IDX_PG_FAILED;
}

/* The connection is unusable or out of step with the pipeline: closed (begin reconnects), the
 * transaction spoiled. */
static int writer_lost(idx_backend *be) {
  if (be->wconn) pq_message(be->wconn, NULL, be->werr, sizeof be->werr);
  if (!be->werr[0]) snprintf(be->werr, sizeof be->werr, "connection lost");
  PQfinish(be->wconn);
  be->wconn = NULL;
  be->npend = 0;
  be->prc = IDX_PG_FAILED;
  return IDX_PG_FAILED;
}

/* Reads the results of the statements sent and not yet read (asking the server to send them,
 * unless a sync just did), checking each; the first failure is kept in be->prc (the statements
 * after it were skipped by the server). last (optional) receives the result of the last
 * statement when all went well. Returns be->prc. */
static int wread(idx_backend *be, PGresult **last, int synced) {
  if (!be->npend) return be->prc;
  if (!synced) {
    if (!be->wconn || !PQsendFlushRequest(be->wconn) || PQflush(be->wconn) != 0)
      return writer_lost(be);
    atomic_fetch_add_explicit(&be->round_trips, 1, memory_order_relaxed);
  }
  size_t n = be->npend;
  be->npend = 0;
  for (size_t i = 0; i < n; i++) {
    PGresult *r = PQgetResult(be->wconn);
    if (!r) return writer_lost(be);
    const struct pending *p = &be->pend[i];
    if (!be->prc && PQresultStatus(r) != p->want) {
      be->prc = writer_fail(be, r);
    } else if (!be->prc && p->check[0] && atoi(PQcmdTuples(r)) == 0) {
      snprintf(be->werr, sizeof be->werr, "%s", p->check);
      be->prc = IDX_PG_CONFLICT;
    }
    if (!be->prc && p->memo >= 0) {
      memo_take(be, p->memo, p->key, p->klen, r); /* clears r; out of memory sets be->prc */
    } else if (last && i == n - 1 && !be->prc) {
      *last = r;
    } else {
      PQclear(r);
    }
    PGresult *end = PQgetResult(be->wconn); /* each statement's results end with NULL */
    if (end) {
      PQclear(end);
      if (last && *last) PQclear(*last), *last = NULL;
      return writer_lost(be);
    }
  }
  return be->prc;
}

static int wdrain(idx_backend *be, PGresult **last) { return wread(be, last, 0); }

/* Sends one statement of the transaction without waiting (binary parameters and results); its
 * result must have status want and, with check (a message, else ""), touch a row: none means
 * another node's transaction changed it first (a conflict). 0, or the code that spoiled the
 * transaction (nothing is sent after a failure: the server would skip it). */
static int wsend(idx_backend *be, const char *sql, int n, const char *const *vals, const int *lens,
                 const int *fmts, ExecStatusType want, const char *check) {
  if (be->prc) return be->prc;
  if (be->npend == PIPE_MAX && wdrain(be, NULL)) return be->prc;
  char name[16];
  const char *stmt = writer_stmt(sql, name);
  if (!be->wconn || !(stmt ? PQsendQueryPrepared(be->wconn, stmt, n, vals, lens, fmts, 1)
                           : PQsendQueryParams(be->wconn, sql, n, NULL, vals, lens, fmts, 1)))
    return writer_lost(be);
  struct pending *p = &be->pend[be->npend++];
  p->want = want;
  p->memo = -1;
  snprintf(p->check, sizeof p->check, "%s", check ? check : "");
  return 0;
}

/* Sends a locking read whose answer (its first column; no row: absent) goes into the memo as
 * (kind, key) when it is read. 0 or the code that spoiled the transaction. */
static int wsend_read(idx_backend *be, const char *sql, int n, const char *const *vals,
                      const int *lens, const int *fmts, int kind, const void *key, size_t klen) {
  int rc = wsend(be, sql, n, vals, lens, fmts, PGRES_TUPLES_OK, NULL);
  if (rc) return rc;
  struct pending *p = &be->pend[be->npend - 1];
  p->memo = kind;
  p->klen = klen;
  memcpy(p->key, key, klen);
  return 0;
}

/* Runs one statement and waits for it (and for every statement sent before it). The result, or
 * NULL and *rc set. */
static PGresult *wquery(idx_backend *be, const char *sql, int n, const char *const *vals,
                        const int *lens, const int *fmts, ExecStatusType want, int *rc) {
  PGresult *r = NULL;
  int out = wsend(be, sql, n, vals, lens, fmts, want, NULL);
  if (!out) out = wdrain(be, &r);
  if (out || !r) {
    PQclear(r);
    *rc = out ? out : IDX_PG_FAILED;
    return NULL;
  }
  return r;
}

static int wcommand(idx_backend *be, const char *sql, int n, const char *const *vals,
                    const int *lens, const int *fmts, int *rows) {
  int rc = 0;
  PGresult *r = wquery(be, sql, n, vals, lens, fmts, PGRES_COMMAND_OK, &rc);
  if (!r) return rc;
  if (rows) *rows = atoi(PQcmdTuples(r));
  PQclear(r);
  return 0;
}

/* Ends the pipeline's current segment: a sync, every result read, then the sync's. Returns
 * be->prc, or IDX_PG_FAILED when the connection was lost. */
static int wsync(idx_backend *be) {
  if (!be->wconn || !PQpipelineSync(be->wconn)) return writer_lost(be);
  int rc = wread(be, NULL, 1);
  if (!be->wconn) return rc;
  PGresult *r = PQgetResult(be->wconn);
  int ok = r && PQresultStatus(r) == PGRES_PIPELINE_SYNC;
  PQclear(r);
  if (!ok) return writer_lost(be);
  atomic_fetch_add_explicit(&be->round_trips, 1, memory_order_relaxed);
  return rc;
}

/* After a failure: whatever is left of the transaction is rolled back. */
static void wrollback(idx_backend *be) {
  if (!be->wconn) return;
  be->prc = 0;
  if (PQtransactionStatus(be->wconn) == PQTRANS_IDLE) return;
  if (wsend(be, "ROLLBACK", 0, NULL, NULL, NULL, PGRES_COMMAND_OK, NULL) == 0) wsync(be);
  if (be->wconn && PQtransactionStatus(be->wconn) != PQTRANS_IDLE) writer_lost(be);
}

static void release_wres(idx_backend *be) {
  PQclear(be->wres);
  be->wres = NULL;
}

static int pg_begin(idx_backend *be) {
  memo_clear(be);
  be->wconflict = 0;
  be->prc = 0;
  be->npend = 0;
  be->werr[0] = '\0';
  if (!be->wconn || PQstatus(be->wconn) != CONNECTION_OK) {
    uint64_t now = mono_ms();
    if (now - be->last_connect_ms < RECONNECT_MS) { /* answers fail fast meanwhile */
      snprintf(be->werr, sizeof be->werr, "reconnecting");
      return IDX_PG_FAILED;
    }
    be->last_connect_ms = now;
    PQfinish(be->wconn);
    be->wconn = connect_db(be, be->werr, sizeof be->werr);
    if (be->wconn && writer_setup(be->wconn, be->werr, sizeof be->werr) < 0) {
      PQfinish(be->wconn);
      be->wconn = NULL;
    }
    if (!be->wconn) {
      atomic_store(&be->up, 0);
      return IDX_PG_FAILED;
    }
  }
  if (PQpipelineStatus(be->wconn) == PQ_PIPELINE_OFF && !PQenterPipelineMode(be->wconn))
    return writer_lost(be);
  return wsend(be, "BEGIN", 0, NULL, NULL, NULL, PGRES_COMMAND_OK, NULL);
}

static int pg_commit(idx_backend *be) {
  release_wres(be);
  int rc = wsend(be, "COMMIT", 0, NULL, NULL, NULL, PGRES_COMMAND_OK, NULL);
  int sync = be->wconn ? wsync(be) : IDX_PG_FAILED;
  if (!rc) rc = sync;
  if (rc)
    wrollback(be);
  else
    atomic_store(&be->up, 1);
  memo_clear(be);
  return rc;
}

static void pg_abort(idx_backend *be) {
  release_wres(be);
  memo_clear(be);
  if (!be->wconn || PQstatus(be->wconn) != CONNECTION_OK) return;
  wsync(be);
  wrollback(be);
}

static int pg_retry(idx_backend *be, int code, int attempt) {
  (void)be;
  return code == IDX_PG_CONFLICT && attempt < MAX_CONFLICT_RETRIES;
}

static int pg_fail(idx_backend *be, int code, const char *what, br_err *err) {
  int gone = !be->wconn || PQstatus(be->wconn) != CONNECTION_OK;
  if (gone) atomic_store(&be->up, 0);
  br_fail(err, "index: %s: %s%s", what, gone ? "PostgreSQL unavailable: " : "", be->werr);
  (void)code;
  return gone ? BR_INDEX_UNAVAILABLE : -1;
}

/* The memo entry of digest's record, read under a row lock when not known yet. NULL + a code. */
static struct memo *record_memo(idx_backend *be, const uint8_t *digest, int *rc) {
  struct memo *m = memo_find(be, MEMO_RECORD, digest, BR_SHA256_LEN);
  if (m) return m;
  const char *v[1] = {(const char *)digest};
  int l[1] = {BR_SHA256_LEN}, f[1] = {1};
  *rc = wsend_read(be, SQL_LOCK_RECORD, 1, v, l, f, MEMO_RECORD, digest, BR_SHA256_LEN);
  if (!*rc) *rc = wdrain(be, NULL);
  return *rc ? NULL : memo_find(be, MEMO_RECORD, digest, BR_SHA256_LEN);
}

static int pg_rec_get(idx_backend *be, const uint8_t *digest, const void **val, size_t *len) {
  int rc = 0;
  struct memo *m = record_memo(be, digest, &rc);
  if (!m) return rc;
  if (!m->val) return IDX_ABSENT;
  *val = m->val;
  *len = m->len;
  return 0;
}

/* A record seen absent in this transaction is inserted (which fails with a conflict if another
 * node inserted it meanwhile); any other is updated, under the row lock its read took. */
static int pg_rec_put(idx_backend *be, const uint8_t *digest, const void *val, size_t len) {
  const char *v[2] = {(const char *)digest, val};
  int l[2] = {BR_SHA256_LEN, (int)len}, f[2] = {1, 1};
  struct memo *m = memo_find(be, MEMO_RECORD, digest, BR_SHA256_LEN);
  int rc = m && !m->val ? wsend(be, SQL_INSERT_RECORD, 2, v, l, f, PGRES_COMMAND_OK, NULL)
                        : wsend(be, SQL_UPDATE_RECORD, 2, v, l, f, PGRES_COMMAND_OK,
                                "record vanished under its row lock");
  if (rc) return rc;
  return memo_set(be, MEMO_RECORD, digest, BR_SHA256_LEN, val, len) ? 0 : IDX_PG_FAILED;
}

static int pg_rec_del(idx_backend *be, const uint8_t *digest) {
  const char *v[1] = {(const char *)digest};
  int l[1] = {BR_SHA256_LEN}, f[1] = {1}, rows = 0, rc = 0;
  struct memo *m = memo_find(be, MEMO_RECORD, digest, BR_SHA256_LEN);
  if (m && !m->val) return IDX_ABSENT;
  if (m) /* read (and locked) present in this transaction */
    rc = wsend(be, SQL_DELETE_RECORD, 1, v, l, f, PGRES_COMMAND_OK,
               "record vanished under its row lock");
  else
    rc = wcommand(be, SQL_DELETE_RECORD, 1, v, l, f, &rows);
  if (rc) return rc;
  if (!memo_set(be, MEMO_RECORD, digest, BR_SHA256_LEN, NULL, 0)) return IDX_PG_FAILED;
  return m || rows ? 0 : IDX_ABSENT;
}

/* The memo entry of loc's owner, read under a row lock when not known yet. NULL + a code. */
static struct memo *owner_memo(idx_backend *be, const br_location *loc, int *rc) {
  char k[OWNER_KEY_MAX];
  size_t klen = owner_key(loc, k, sizeof k);
  struct memo *m = klen ? memo_find(be, MEMO_OWNER, k, klen) : NULL;
  if (m || !klen) {
    if (!klen) *rc = IDX_ABSENT;
    return m;
  }
  const char *v[2] = {loc->store, loc->key};
  *rc = wsend_read(be, SQL_LOCK_OWNER, 2, v, NULL, NULL, MEMO_OWNER, k, klen);
  if (!*rc) *rc = wdrain(be, NULL);
  return *rc ? NULL : memo_find(be, MEMO_OWNER, k, klen);
}

static int pg_owner_get(idx_backend *be, const br_location *loc, uint8_t owner[BR_SHA256_LEN]) {
  int rc = 0;
  struct memo *m = owner_memo(be, loc, &rc);
  if (!m) return rc;
  if (!m->val || m->len != BR_SHA256_LEN) return IDX_ABSENT;
  memcpy(owner, m->val, BR_SHA256_LEN);
  return 0;
}

/* Makes digest the owner of loc's place, which sync_places found free or digest's: if another
 * node's transaction took it meanwhile, nothing is written and the batch runs again (a conflict),
 * when sync_places finds it taken. */
static int pg_owner_put(idx_backend *be, const br_location *loc, const uint8_t *digest) {
  const char *v[3] = {loc->store, loc->key, (const char *)digest};
  int l[3] = {0, 0, BR_SHA256_LEN}, f[3] = {0, 0, 1};
  char check[128], k[OWNER_KEY_MAX];
  snprintf(check, sizeof check, "%.40s:%.60s was taken by another node", loc->store, loc->key);
  int rc = wsend(be, SQL_PUT_OWNER, 3, v, l, f, PGRES_COMMAND_OK, check);
  if (rc) return rc;
  size_t klen = owner_key(loc, k, sizeof k);
  return !klen || memo_set(be, MEMO_OWNER, k, klen, digest, BR_SHA256_LEN) ? 0 : IDX_PG_FAILED;
}

static int pg_owner_del(idx_backend *be, const br_location *loc) {
  const char *v[2] = {loc->store, loc->key};
  char k[OWNER_KEY_MAX];
  size_t klen = owner_key(loc, k, sizeof k);
  struct memo *m = klen ? memo_find(be, MEMO_OWNER, k, klen) : NULL;
  int rows = 0, rc = 0;
  if (m && !m->val) return IDX_ABSENT;
  if (m) /* read (and locked) in this transaction */
    rc = wsend(be, "DELETE FROM blobref_owners WHERE store = $1 AND key = $2", 2, v, NULL, NULL,
               PGRES_COMMAND_OK, NULL);
  else
    rc = wcommand(be, "DELETE FROM blobref_owners WHERE store = $1 AND key = $2", 2, v, NULL, NULL,
                  &rows);
  if (rc) return rc;
  if (klen && !memo_set(be, MEMO_OWNER, k, klen, NULL, 0)) return IDX_PG_FAILED;
  return m || rows ? 0 : IDX_ABSENT;
}

/* Sends the locking reads of the records of digests[0..n) and of the owners of locs[0..n) (a
 * NULL entry: none), one pair after another as the batch's operations would take them, and reads
 * every answer into the memo: one round trip for the batch (one more per PIPE_MAX statements).
 * Rows already in the memo are not read again. 0 or a code that spoils the transaction. */
static int pg_prefetch(idx_backend *be, const uint8_t (*digests)[BR_SHA256_LEN],
                       const br_location *const *locs, size_t n) {
  char k[OWNER_KEY_MAX];
  for (size_t i = 0; i < n && !be->prc; i++) {
    if (!memo_find(be, MEMO_RECORD, digests[i], BR_SHA256_LEN)) {
      const char *v[1] = {(const char *)digests[i]};
      int l[1] = {BR_SHA256_LEN}, f[1] = {1};
      wsend_read(be, SQL_LOCK_RECORD, 1, v, l, f, MEMO_RECORD, digests[i], BR_SHA256_LEN);
    }
    size_t klen = locs[i] ? owner_key(locs[i], k, sizeof k) : 0;
    if (klen && !memo_find(be, MEMO_OWNER, k, klen)) {
      const char *v[2] = {locs[i]->store, locs[i]->key};
      wsend_read(be, SQL_LOCK_OWNER, 2, v, NULL, NULL, MEMO_OWNER, k, klen);
    }
  }
  return wdrain(be, NULL);
}

static int pg_purge_get(idx_backend *be, const uint8_t *digest, const void **val, size_t *len) {
  release_wres(be);
  const char *v[1] = {(const char *)digest};
  int l[1] = {BR_SHA256_LEN}, f[1] = {1}, rc = 0;
  PGresult *r = wquery(be, "SELECT value FROM blobref_purges WHERE digest = $1 FOR UPDATE", 1, v, l,
                       f, PGRES_TUPLES_OK, &rc);
  if (!r) return rc;
  if (PQntuples(r) == 0) {
    PQclear(r);
    return IDX_ABSENT;
  }
  be->wres = r;
  *val = PQgetvalue(r, 0, 0);
  *len = (size_t)PQgetlength(r, 0, 0);
  return 0;
}

/* Stores a purge, due at its value's next_ms, and ends any claim on it (a settle gives it back,
 * a new queuing is due anew). */
static int pg_purge_put(idx_backend *be, const uint8_t *digest, const void *val, size_t len) {
  uint64_t due = 0;
  for (int i = 7; len == PURGE_VALUE && i >= 0; i--) due = due << 8 | ((const uint8_t *)val)[8 + i];
  char due_s[24];
  snprintf(due_s, sizeof due_s, "%lld", (long long)(due > INT64_MAX ? INT64_MAX : due));
  const char *v[3] = {(const char *)digest, val, due_s};
  int l[3] = {BR_SHA256_LEN, (int)len, 0}, f[3] = {1, 1, 0};
  return wsend(be,
               "INSERT INTO blobref_purges (digest, value, due_ms) VALUES ($1, $2, $3::int8)"
               " ON CONFLICT (digest) DO UPDATE SET value = EXCLUDED.value,"
               " due_ms = EXCLUDED.due_ms, claimed_until = 0, claimed_by = ''",
               3, v, l, f, PGRES_COMMAND_OK, NULL);
}

/* One statement, its own transaction: the due rows no live claim holds (rows another node is
 * claiming or settling right now are skipped, not waited for) get this node's claim. */
static int pg_purge_claim(idx_backend *be, uint64_t now_ms, size_t max, idx_scan_fn fn, void *ud,
                          br_err *err) {
  char now_s[24], max_s[24], claim_s[24];
  snprintf(now_s, sizeof now_s, "%lld", (long long)(now_ms > INT64_MAX ? INT64_MAX : now_ms));
  snprintf(max_s, sizeof max_s, "%zu", max);
  snprintf(claim_s, sizeof claim_s, "%llu", (unsigned long long)be->purge_claim_ms);
  const char *v[4] = {now_s, max_s, claim_s, be->node};
  int rc = 0;
  PGresult *r =
      read_query(be,
                 "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 AS ms),"
                 " c AS (SELECT digest FROM blobref_purges, now WHERE due_ms <= $1::int8"
                 " AND claimed_until <= now.ms ORDER BY due_ms, digest LIMIT $2::int8"
                 " FOR UPDATE OF blobref_purges SKIP LOCKED)"
                 " UPDATE blobref_purges p SET claimed_until = now.ms + $3::int8, claimed_by = $4"
                 " FROM c, now WHERE p.digest = c.digest RETURNING p.digest, p.value",
                 4, v, NULL, NULL, "claim purges", &rc, err);
  if (!r) return rc;
  int n = PQntuples(r);
  for (int i = 0; i < n; i++)
    if (fn(ud, (const uint8_t *)PQgetvalue(r, i, 0), (size_t)PQgetlength(r, i, 0),
           PQgetvalue(r, i, 1), (size_t)PQgetlength(r, i, 1)))
      break;
  PQclear(r);
  return n;
}

static int pg_purge_del(idx_backend *be, const uint8_t *digest) {
  const char *v[1] = {(const char *)digest};
  int l[1] = {BR_SHA256_LEN}, f[1] = {1}, rows = 0;
  int rc = wcommand(be, "DELETE FROM blobref_purges WHERE digest = $1", 1, v, l, f, &rows);
  return rc ? rc : rows ? 0 : IDX_ABSENT;
}

/* ---- exact per-state counters -----------------------------------------------------------------
 * blobref_counts (schema_counts): each writer adds its batch's change to its own rows (node =
 * count_node), a read sums them. A recount (txn_scan, then counts_set) holds the table in SHARE
 * ROW EXCLUSIVE mode from before its scan to its commit: a batch of another node that changed
 * records adds to the counters either before the scan (which then sees its records) or after the
 * recount commits (which then did not see them), never in between. */

#define COUNTS_DONE_STATE (-1) /* the row (node 0, store '') saying the counters are complete */

static int pg_counts_read(idx_backend *be, br_counts *out, br_err *err) {
  br_counts_clear(out);
  int rc = 0;
  PGresult *r = read_query(be,
                           "SELECT store, state::text, sum(blobs)::text, sum(bytes)::text"
                           " FROM blobref_counts GROUP BY store, state",
                           0, NULL, NULL, NULL, "counters", &rc, err);
  if (!r) return rc < 0 ? rc : -1;
  int complete = 0;
  for (int i = 0; i < PQntuples(r); i++) {
    int state = atoi(PQgetvalue(r, i, 1));
    if (state == COUNTS_DONE_STATE) {
      complete = 1;
      continue;
    }
    if (state < 0 || state >= BR_COUNTS_STATES || PQgetlength(r, i, 0) > BR_MAX_STORE_NAME)
      continue; /* not one of ours */
    br_counts_add(out, PQgetvalue(r, i, 0), state, strtoll(PQgetvalue(r, i, 2), NULL, 10),
                  strtoll(PQgetvalue(r, i, 3), NULL, 10));
  }
  PQclear(r);
  if (!complete) br_counts_clear(out);
  return complete ? 0 : 1;
}

/* One statement for the whole change: a VALUES row per non-zero entry, each added to this node's
 * row (inserted when it has none). */
static int pg_counts_add(idx_backend *be, const br_counts *delta) {
  size_t n = 0;
  for (size_t i = 0; i < delta->n; i++) n += delta->c[i].blobs || delta->c[i].bytes;
  if (!n) return 0;
  enum { ROW_SQL = 64, NUM = 24 };
  const char **v = malloc((1 + 4 * n) * sizeof *v);
  char *nums = malloc(n * 3 * NUM), *sql = malloc(256 + n * ROW_SQL);
  int rc = IDX_PG_FAILED;
  if (!v || !nums || !sql) {
    snprintf(be->werr, sizeof be->werr, "out of memory");
    goto done;
  }
  v[0] = be->count_node;
  size_t len = (size_t)snprintf(sql, 256, "%s", SQL_COUNTS_HEAD);
  size_t k = 0;
  for (size_t i = 0; i < delta->n; i++) {
    const br_count *d = &delta->c[i];
    if (!d->blobs && !d->bytes) continue;
    char *num = nums + k * 3 * NUM;
    snprintf(num, NUM, "%d", d->state);
    snprintf(num + NUM, NUM, "%lld", (long long)d->blobs);
    snprintf(num + 2 * NUM, NUM, "%lld", (long long)d->bytes);
    int p = 2 + 4 * (int)k;
    v[p - 1] = d->store, v[p] = num, v[p + 1] = num + NUM, v[p + 2] = num + 2 * NUM;
    len +=
        (size_t)snprintf(sql + len, ROW_SQL, SQL_COUNTS_ROW, k ? "," : "", p, p + 1, p + 2, p + 3);
    k++;
  }
  snprintf(sql + len, 256 + n * ROW_SQL - len, "%s", SQL_COUNTS_TAIL);
  rc = wsend(be, sql, 1 + 4 * (int)n, v, NULL, NULL, PGRES_COMMAND_OK, NULL);
done:
  free(v);
  free(nums);
  free(sql);
  return rc;
}

static int pg_counts_set(idx_backend *be, const br_counts *exact) {
  if (!exact)
    return wcommand(be, "DELETE FROM blobref_counts WHERE state = -1", 0, NULL, NULL, NULL, NULL);
  int rc = wcommand(be, "DELETE FROM blobref_counts", 0, NULL, NULL, NULL, NULL);
  if (!rc) rc = pg_counts_add(be, exact);
  if (!rc)
    rc = wcommand(be, "INSERT INTO blobref_counts VALUES (0, '', -1, 0, 0)", 0, NULL, NULL, NULL,
                  NULL);
  return rc;
}

/* The recount's walk: takes the counters' table (see above), then reads every record through a
 * cursor in the writer's transaction (its own earlier writes included). */
static int pg_txn_scan(idx_backend *be, idx_scan_fn fn, void *ud) {
  release_wres(be);
  int rc = wcommand(be, "LOCK TABLE blobref_counts IN SHARE ROW EXCLUSIVE MODE", 0, NULL, NULL,
                    NULL, NULL);
  if (!rc)
    rc = wcommand(be,
                  "DECLARE br_recount BINARY NO SCROLL CURSOR FOR"
                  " SELECT digest, record FROM blobref_blobs",
                  0, NULL, NULL, NULL, NULL);
  char fetch[48];
  snprintf(fetch, sizeof fetch, "FETCH %d FROM br_recount", SCAN_PAGE);
  for (int more = 1; !rc && more;) {
    PGresult *r = wquery(be, fetch, 0, NULL, NULL, NULL, PGRES_TUPLES_OK, &rc);
    if (!r) break;
    int n = PQntuples(r), stop = 0;
    for (int i = 0; i < n && !stop; i++)
      stop = fn(ud, (const uint8_t *)PQgetvalue(r, i, 0), (size_t)PQgetlength(r, i, 0),
                PQgetvalue(r, i, 1), (size_t)PQgetlength(r, i, 1));
    more = n == SCAN_PAGE && !stop;
    PQclear(r);
  }
  if (!rc) rc = wcommand(be, "CLOSE br_recount", 0, NULL, NULL, NULL, NULL);
  return rc;
}

/* ---- shared state ---------------------------------------------------------------------------
 */

static int pg_kv_put(idx_backend *be, const void *key, size_t klen, const void *val, size_t vlen,
                     br_err *err) {
  const char *v[2] = {key, val};
  int l[2] = {(int)klen, (int)vlen}, f[2] = {1, 1}, rc = 0;
  PGresult *r = read_query(be,
                           "INSERT INTO blobref_shared (key, value) VALUES ($1, $2)"
                           " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                           2, v, l, f, "shared state", &rc, err);
  PQclear(r);
  return r ? 0 : rc;
}

static int pg_kv_get(idx_backend *be, const void *key, size_t klen, char **val, size_t *vlen,
                     br_err *err) {
  const char *v[1] = {key};
  int l[1] = {(int)klen}, f[1] = {1}, rc = 0;
  PGresult *r = read_query(be, "SELECT value FROM blobref_shared WHERE key = $1", 1, v, l, f,
                           "shared state", &rc, err);
  if (!r) return rc;
  int out = 1;
  if (PQntuples(r) == 1) {
    size_t n = (size_t)PQgetlength(r, 0, 0);
    *val = malloc(n + 1);
    if (!*val) {
      out = br_fail(err, "out of memory");
    } else {
      memcpy(*val, PQgetvalue(r, 0, 0), n);
      (*val)[n] = '\0';
      *vlen = n;
      out = 0;
    }
  }
  PQclear(r);
  return out;
}

#define KV_PAGE 16 /* rows per query of a shared-state scan (list chunks are up to 640 KiB) */

static int pg_kv_scan(idx_backend *be, const void *from, size_t flen, const void *to, size_t tlen,
                      int desc, idx_scan_fn fn, void *ud, br_err *err) {
  uint8_t *last = NULL; /* the last key given: the next page starts past it */
  size_t last_len = 0;
  int out = 0;
  for (int more = 1; more && !out;) {
    char sql[256];
    /* ascending: [from, to), then (last, to); descending: [from, to), then [from, last) */
    snprintf(sql, sizeof sql,
             "SELECT key, value FROM blobref_shared WHERE key %s $1 AND key %s $2"
             " ORDER BY key %s LIMIT %d",
             desc || !last ? ">=" : ">", "<", desc ? "DESC" : "ASC", KV_PAGE);
    const char *v[2] = {desc   ? from
                        : last ? (const char *)last
                               : from,
                        desc && last ? (const char *)last : to};
    int l[2] = {(int)(desc ? flen : last ? last_len : flen), (int)(desc && last ? last_len : tlen)};
    int f[2] = {1, 1}, rc = 0;
    PGresult *r = read_query(be, sql, 2, v, l, f, "shared state", &rc, err);
    if (!r) {
      out = rc;
      break;
    }
    int n = PQntuples(r);
    more = n == KV_PAGE;
    for (int i = 0; i < n; i++) {
      const uint8_t *k = (const uint8_t *)PQgetvalue(r, i, 0);
      size_t kl = (size_t)PQgetlength(r, i, 0);
      if (fn(ud, k, kl, PQgetvalue(r, i, 1), (size_t)PQgetlength(r, i, 1))) {
        more = 0;
        break;
      }
      uint8_t *grown = realloc(last, kl ? kl : 1);
      if (!grown) {
        out = br_fail(err, "out of memory");
        break;
      }
      memcpy(grown, k, kl);
      last = grown, last_len = kl;
    }
    PQclear(r);
  }
  free(last);
  return out;
}

static int pg_kv_del(idx_backend *be, const void *from, size_t flen, const void *to, size_t tlen,
                     br_err *err) {
  const char *v[2] = {from, to};
  int l[2] = {(int)flen, (int)tlen}, f[2] = {1, 1}, rc = 0;
  PGresult *r = read_query(be, "DELETE FROM blobref_shared WHERE key >= $1 AND key < $2", 2, v, l,
                           f, "shared state", &rc, err);
  PQclear(r);
  return r ? 0 : rc;
}

static int pg_next_id(idx_backend *be, uint64_t *id, br_err *err) {
  int rc = 0;
  PGresult *r = read_query(be, "SELECT nextval('blobref_run_ids')::text", 0, NULL, NULL, NULL,
                           "run id", &rc, err);
  if (!r) return rc;
  /* binary results: the text cast comes back as its characters */
  char buf[32];
  int n = PQgetlength(r, 0, 0);
  snprintf(buf, sizeof buf, "%.*s", n < 31 ? n : 31, PQgetvalue(r, 0, 0));
  PQclear(r);
  *id = strtoull(buf, NULL, 10);
  return *id ? 0 : br_fail(err, "index: run id: '%s'", buf);
}

/* ---- reconcile's data-file cache ---------------------------------------------------------------
 */

static void u32_text(uint32_t v, char out[12]) { snprintf(out, 12, "%u", v); }

static int pg_fcache_put(idx_backend *be, const uint8_t id[BR_SHA256_LEN], uint32_t chunk,
                         uint32_t chunks, const void *hashes, size_t len, br_err *err) {
  if (len > (size_t)INT32_MAX / 2 || len % BR_SHA256_LEN || chunk > INT32_MAX || chunks > INT32_MAX)
    return br_fail(err, "index: file cache: chunk too large");
  char c[12], n[12];
  u32_text(chunk, c), u32_text(chunks, n);
  const char *v[4] = {(const char *)id, c, chunk ? NULL : n, hashes ? hashes : ""};
  int l[4] = {BR_SHA256_LEN, 0, 0, (int)len}, f[4] = {1, 0, 0, 1}, rc = 0;
  PGresult *r = read_query(be,
                           "INSERT INTO blobref_filecache (id, chunk, chunks, hashes)"
                           " VALUES ($1, $2::int4, $3::int4, $4) ON CONFLICT (id, chunk)"
                           " DO UPDATE SET chunks = EXCLUDED.chunks, hashes = EXCLUDED.hashes",
                           4, v, l, f, "file cache", &rc, err);
  PQclear(r);
  return r ? 0 : rc;
}

static int pg_fcache_get(idx_backend *be, const uint8_t id[BR_SHA256_LEN], uint32_t chunk,
                         void **val, size_t *len, uint32_t *chunks, br_err *err) {
  char c[12];
  u32_text(chunk, c);
  const char *v[2] = {(const char *)id, c};
  int l[2] = {BR_SHA256_LEN, 0}, f[2] = {1, 0}, rc = 0;
  PGresult *r = read_query(be,
                           "SELECT hashes, coalesce(chunks, 0)::text FROM blobref_filecache"
                           " WHERE id = $1 AND chunk = $2::int4",
                           2, v, l, f, "file cache", &rc, err);
  if (!r) return rc;
  int out = 1;
  if (PQntuples(r) == 1) {
    size_t n = (size_t)PQgetlength(r, 0, 0);
    char num[16]; /* binary results: the text cast comes back as its characters */
    int nl = PQgetlength(r, 0, 1);
    snprintf(num, sizeof num, "%.*s", nl < 15 ? nl : 15, PQgetvalue(r, 0, 1));
    *val = malloc(n ? n : 1);
    if (!*val) {
      out = br_fail(err, "out of memory");
    } else {
      memcpy(*val, PQgetvalue(r, 0, 0), n);
      *len = n;
      *chunks = (uint32_t)strtoul(num, NULL, 10);
      out = 0;
    }
  }
  PQclear(r);
  return out;
}

static int pg_fcache_prune(idx_backend *be, const uint8_t *keep, size_t n, br_err *err) {
  if (n > (size_t)INT32_MAX / BR_SHA256_LEN) return br_fail(err, "index: file cache: too many");
  /* the kept ids as one parameter, split in the statement (an anti-join, one round trip) */
  const char *v[1] = {n ? (const char *)keep : ""};
  int l[1] = {(int)(n * BR_SHA256_LEN)}, f[1] = {1}, rc = 0;
  PGresult *r = read_query(be,
                           "WITH k AS MATERIALIZED (SELECT substring($1::bytea FROM i * 32 + 1"
                           " FOR 32) AS id FROM generate_series(0, length($1::bytea) / 32 - 1) i)"
                           " DELETE FROM blobref_filecache c"
                           " WHERE NOT EXISTS (SELECT 1 FROM k WHERE k.id = c.id)",
                           1, v, l, f, "file cache", &rc, err);
  PQclear(r);
  return r ? 0 : rc;
}

/* ---- direct-upload plans ----------------------------------------------------------------------
 */

/* Appends s to the text-array literal *buf as a quoted element ('"' and '\\' escaped). */
static int array_add(char **buf, size_t *len, size_t *cap, const char *s) {
  size_t need = *len + 2 * strlen(s) + 4;
  if (need > *cap) {
    size_t ncap = need > 2 * *cap ? need : 2 * *cap;
    char *grown = realloc(*buf, ncap);
    if (!grown) return -1;
    *buf = grown, *cap = ncap;
  }
  char *o = *buf + *len; /* after "{" and the elements so far */
  if (*len > 1) *o++ = ',';
  *o++ = '"';
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') *o++ = '\\';
    *o++ = *s;
  }
  *o++ = '"';
  *len = (size_t)(o - *buf);
  return 0;
}

/* One INSERT of every plan (unnest of four text arrays): all are recorded or none. */
static int pg_plans_add(idx_backend *be, const br_index_plan *plans, size_t n, br_err *err) {
  char *arr[4] = {0};
  size_t len[4], cap[4];
  int rc = 0;
  for (int a = 0; a < 4; a++) {
    cap[a] = 64, len[a] = 1;
    arr[a] = malloc(cap[a]);
    if (!arr[a])
      rc = br_fail(err, "out of memory");
    else
      arr[a][0] = '{';
  }
  for (size_t i = 0; rc == 0 && i < n; i++) {
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(plans[i].digest, hex);
    const char *f[4] = {hex, plans[i].store, plans[i].key, plans[i].upload_id};
    for (int a = 0; rc == 0 && a < 4; a++)
      if (array_add(&arr[a], &len[a], &cap[a], f[a]) < 0) rc = br_fail(err, "out of memory");
  }
  for (int a = 0; rc == 0 && a < 4; a++) {
    char *grown = realloc(arr[a], len[a] + 2);
    if (!grown) {
      rc = br_fail(err, "out of memory");
      break;
    }
    arr[a] = grown;
    arr[a][len[a]++] = '}';
    arr[a][len[a]] = '\0';
  }
  if (rc == 0) {
    const char *v[4] = {arr[0], arr[1], arr[2], arr[3]};
    PGresult *r = read_query(be,
                             "INSERT INTO blobref_direct_plans (digest, store, key, upload_id)"
                             " SELECT decode(d, 'hex'), s, k, u FROM unnest($1::text[],"
                             " $2::text[], $3::text[], $4::text[]) AS t(d, s, k, u)",
                             4, v, NULL, NULL, "direct-upload plans", &rc, err);
    PQclear(r);
    if (r) rc = 0;
  }
  for (int a = 0; a < 4; a++) free(arr[a]);
  return rc;
}

static int pg_plans_forget(idx_backend *be, const uint8_t digest[BR_SHA256_LEN],
                           const char *upload_id, uint64_t id, br_err *err) {
  char hex[BR_HEX_LEN + 1], id_s[24];
  br_hex_encode(digest, hex);
  snprintf(id_s, sizeof id_s, "%llu", (unsigned long long)id);
  const char *v[3] = {hex, upload_id, id_s};
  int rc = 0;
  PGresult *r = read_query(be,
                           "DELETE FROM blobref_direct_plans WHERE digest = decode($1, 'hex')"
                           " AND upload_id = $2 AND ($3::int8 = 0 OR id = $3::int8)",
                           3, v, NULL, NULL, "direct-upload plans", &rc, err);
  PQclear(r);
  return r ? 0 : rc;
}

/* One statement, its own transaction: the expired plans no live claim holds get this node's
 * claim, each answered with whether a younger plan of its blob exists (on any node). */
static int pg_plans_claim(idx_backend *be, uint64_t grace_ms, uint64_t claim_ms, size_t max,
                          br_index_plan_fn fn, void *ud, br_err *err) {
  char grace_s[24], max_s[24], claim_s[24];
  snprintf(grace_s, sizeof grace_s, "%llu", (unsigned long long)grace_ms);
  snprintf(max_s, sizeof max_s, "%zu", max);
  snprintf(claim_s, sizeof claim_s, "%llu", (unsigned long long)claim_ms);
  const char *v[4] = {grace_s, max_s, claim_s, be->node};
  int rc = 0;
  PGresult *r = read_query(
      be,
      "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 AS ms),"
      " c AS (SELECT id FROM blobref_direct_plans, now WHERE created_ms <= now.ms - $1::int8"
      " AND claimed_until <= now.ms ORDER BY created_ms, id LIMIT $2::int8"
      " FOR UPDATE OF blobref_direct_plans SKIP LOCKED)"
      " UPDATE blobref_direct_plans p SET claimed_until = now.ms + $3::int8, claimed_by = $4"
      " FROM c, now WHERE p.id = c.id RETURNING p.id::text, p.digest, p.store, p.key,"
      " p.upload_id, CASE WHEN EXISTS (SELECT 1 FROM blobref_direct_plans q"
      " WHERE q.digest = p.digest AND q.created_ms > now.ms - $1::int8) THEN '1' ELSE '0' END",
      4, v, NULL, NULL, "claim direct-upload plans", &rc, err);
  if (!r) return rc;
  int n = PQntuples(r), out = n;
  for (int i = 0; i < n; i++) {
    char id_s[24], store[BR_MAX_STORE_NAME + 1], key[BR_MAX_KEY + 1], uid[512];
    int idl = PQgetlength(r, i, 0), sl = PQgetlength(r, i, 2), kl = PQgetlength(r, i, 3),
        ul = PQgetlength(r, i, 4);
    if (PQgetlength(r, i, 1) != BR_SHA256_LEN || idl >= (int)sizeof id_s ||
        sl >= (int)sizeof store || kl >= (int)sizeof key || ul >= (int)sizeof uid)
      continue; /* not a row this code wrote: its claim expires, nobody sweeps it */
    snprintf(id_s, sizeof id_s, "%.*s", idl, PQgetvalue(r, i, 0));
    snprintf(store, sizeof store, "%.*s", sl, PQgetvalue(r, i, 2));
    snprintf(key, sizeof key, "%.*s", kl, PQgetvalue(r, i, 3));
    snprintf(uid, sizeof uid, "%.*s", ul, PQgetvalue(r, i, 4));
    br_index_plan p = {.id = strtoull(id_s, NULL, 10),
                       .store = store,
                       .key = key,
                       .upload_id = uid,
                       .younger = PQgetvalue(r, i, 5)[0] == '1'};
    memcpy(p.digest, PQgetvalue(r, i, 1), BR_SHA256_LEN);
    if (fn(ud, &p)) break;
  }
  PQclear(r);
  return out;
}

static int pg_plans_count(idx_backend *be, uint64_t *n, br_err *err) {
  int rc = 0;
  PGresult *r = read_query(be, "SELECT count(*)::text FROM blobref_direct_plans", 0, NULL, NULL,
                           NULL, "direct-upload plans", &rc, err);
  if (!r) return rc;
  char buf[32];
  int l = PQgetlength(r, 0, 0);
  snprintf(buf, sizeof buf, "%.*s", l < 31 ? l : 31, PQgetvalue(r, 0, 0));
  PQclear(r);
  *n = strtoull(buf, NULL, 10);
  return 0;
}

/* ---- jobs ------------------------------------------------------------------------------------
 * Every statement reads the database's clock (now.ms) and returns the rows as JOB_COLS (text,
 * NUL-terminated by libpq in binary results too). */

#define NOW_MS "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 AS ms)"
#define JOB_COLS                                                                                  \
  "j.id::text, j.doc, j.owner, (j.owner <> '' AND j.lease_until > now.ms)::text, j.active::text," \
  " j.cancel::text"

/* Passes each row of r (JOB_COLS) to fn until it returns non-zero; how many rows r has. */
static int job_rows(PGresult *r, br_index_job_fn fn, void *ud) {
  int n = PQntuples(r);
  for (int i = 0; i < n; i++) {
    br_index_job j = {.id = strtoull(PQgetvalue(r, i, 0), NULL, 10),
                      .doc = PQgetvalue(r, i, 1),
                      .owner = PQgetvalue(r, i, 2),
                      .leased = PQgetvalue(r, i, 3)[0] == 't',
                      .active = PQgetvalue(r, i, 4)[0] == 't',
                      .cancel = PQgetvalue(r, i, 5)[0] == 't'};
    if (fn && fn(ud, &j)) break;
  }
  return n;
}

static void u64_text(uint64_t v, char out[24]) { snprintf(out, 24, "%llu", (unsigned long long)v); }

/* The insert skips a source with an active job (the unique index); then that job is read. A job
 * that ends between the two is tried again. */
static int pg_job_add(idx_backend *be, const char *source, const char *doc, const char *owner,
                      uint64_t lease_ms, size_t keep, uint64_t *id, br_index_job_fn fn, void *ud,
                      br_err *err) {
  char lease_s[24], keep_s[24];
  u64_text(lease_ms, lease_s), u64_text(keep, keep_s);
  for (int attempt = 0; attempt < 3; attempt++) {
    const char *v[4] = {source, doc, owner, lease_s};
    int rc = 0;
    PGresult *r = read_query(be,
                             NOW_MS
                             " INSERT INTO blobref_jobs (source, doc, owner, lease_until)"
                             " SELECT $1, $2, $3, now.ms + $4::int8 FROM now"
                             " ON CONFLICT (source) WHERE active DO NOTHING RETURNING id::text",
                             4, v, NULL, NULL, "add a job", &rc, err);
    if (!r) return rc;
    int added = PQntuples(r) == 1;
    if (added) *id = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    if (added) {
      const char *k[1] = {keep_s};
      r = read_query(be,
                     "DELETE FROM blobref_jobs WHERE NOT active AND id < (SELECT min(id) FROM"
                     " (SELECT id FROM blobref_jobs ORDER BY id DESC LIMIT $1::int8) t)",
                     1, k, NULL, NULL, "forget old jobs", &rc, err);
      PQclear(r); /* a failure leaves old rows for the next add */
      return 0;
    }
    const char *s[1] = {source};
    r = read_query(be,
                   NOW_MS " SELECT " JOB_COLS
                          " FROM blobref_jobs j, now"
                          " WHERE j.source = $1 AND j.active",
                   1, s, NULL, NULL, "read a job", &rc, err);
    if (!r) return rc;
    int n = job_rows(r, fn, ud);
    PQclear(r);
    if (n) return 1;
  }
  return br_fail(err, "index: add a job: the active job of %s keeps changing", source);
}

static int pg_job_claim(idx_backend *be, const char *owner, uint64_t lease_ms, int mine,
                        br_index_job_fn fn, void *ud, br_err *err) {
  char lease_s[24];
  u64_text(lease_ms, lease_s);
  const char *v[2] = {owner, lease_s};
  int rc = 0;
  if (mine) { /* a previous run of this node is gone: what it held is free */
    PGresult *h =
        read_query(be, "UPDATE blobref_jobs SET lease_until = 0 WHERE active AND owner = $1", 1, v,
                   NULL, NULL, "hand back jobs", &rc, err);
    if (!h) return rc;
    PQclear(h);
  }
  PGresult *r = read_query(be,
                           NOW_MS
                           ", c AS (SELECT id, owner AS prev FROM blobref_jobs, now WHERE active"
                           " AND lease_until <= now.ms ORDER BY id LIMIT 1"
                           " FOR UPDATE OF blobref_jobs SKIP LOCKED)"
                           " UPDATE blobref_jobs j SET owner = $1,"
                           " lease_until = now.ms + $2::int8 FROM c, now WHERE j.id = c.id"
                           " RETURNING j.id::text, j.doc, c.prev, 'false', j.active::text,"
                           " j.cancel::text",
                           2, v, NULL, NULL, "claim a job", &rc, err);
  if (!r) return rc;
  int n = job_rows(r, fn, ud);
  PQclear(r);
  return n ? 0 : 1;
}

/* The owner is compared, not the expiry: a claim by another node changes it under the row's
 * lock, so exactly one node holds a job at any time on the database's clock. */
static int pg_job_save(idx_backend *be, uint64_t id, const char *owner, const char *doc, int active,
                       uint64_t lease_ms, int *cancel, br_err *err) {
  char id_s[24], lease_s[24];
  u64_text(id, id_s), u64_text(lease_ms, lease_s);
  const char *v[5] = {id_s, owner, doc, active ? "true" : "false", lease_s};
  int rc = 0;
  PGresult *r = read_query(
      be,
      NOW_MS
      " UPDATE blobref_jobs j SET doc = $3, active = $4::bool,"
      " owner = CASE WHEN $4::bool THEN j.owner ELSE '' END,"
      " lease_until = CASE WHEN $4::bool AND $5::int8 > 0 THEN now.ms + $5::int8 ELSE 0 END"
      " FROM now WHERE j.id = $1::int8 AND j.owner = $2 AND j.owner <> '' AND j.active"
      " RETURNING j.cancel::text",
      5, v, NULL, NULL, "save a job", &rc, err);
  if (!r) return rc;
  int held = PQntuples(r) == 1;
  if (held) *cancel = PQgetvalue(r, 0, 0)[0] == 't';
  PQclear(r);
  return held ? 0 : 1;
}

static int pg_job_list(idx_backend *be, uint64_t id, size_t max, br_index_job_fn fn, void *ud,
                       br_err *err) {
  char id_s[24], max_s[24];
  u64_text(id, id_s), u64_text(max, max_s);
  const char *v[2] = {id_s, max_s};
  int rc = 0;
  PGresult *r = read_query(be,
                           NOW_MS " SELECT " JOB_COLS
                                  " FROM blobref_jobs j, now"
                                  " WHERE $1::int8 = 0 OR j.id = $1::int8"
                                  " ORDER BY j.id DESC LIMIT $2::int8",
                           2, v, NULL, NULL, "list jobs", &rc, err);
  if (!r) return rc;
  int n = job_rows(r, fn, ud);
  PQclear(r);
  return n;
}

static int pg_job_cancel(idx_backend *be, uint64_t id, br_index_job_fn fn, void *ud, br_err *err) {
  char id_s[24];
  u64_text(id, id_s);
  const char *v[1] = {id_s};
  int rc = 0;
  PGresult *r = read_query(be,
                           NOW_MS
                           " UPDATE blobref_jobs j SET cancel = j.cancel OR j.active"
                           " FROM now WHERE j.id = $1::int8 RETURNING " JOB_COLS,
                           1, v, NULL, NULL, "cancel a job", &rc, err);
  if (!r) return rc;
  int n = job_rows(r, fn, ud);
  PQclear(r);
  return n ? 0 : 1;
}

static void pg_close(idx_backend *be) {
  release_wres(be);
  PQfinish(be->wconn);
  for (size_t i = 0; i < be->nidle; i++) PQfinish(be->idle[i]);
  for (struct held_lock *h = be->held, *next; h; h = next) {
    next = h->next;
    PQfinish(h->conn);
    free(h);
  }
  pthread_mutex_destroy(&be->lock);
  pthread_cond_destroy(&be->cv);
  memo_clear(be);
  free(be->memo);
  free(be->pend);
  free(be->dsn);
  free(be);
}

enum lock_mode { LOCK_WAIT, LOCK_TRY, LOCK_RELEASE };

/* A session advisory lock on (cls, key), each held on a connection of its own (not from the
 * readers' budget: a holder may read while it holds it). Returns 1 held (LOCK_TRY: 0 when another
 * session has it), 0 released, or a negative code + err. A blob lock's release (LOCK_RELEASE of
 * one taken with LOCK_WAIT) is sent and not waited for: the server runs it as soon as it arrives,
 * in the session's order, and whoever waits for the lock has it then; its answer is read by the
 * connection's next user (a failed release is a lost session, which releases the lock anyway).
 * A lease's release (taken with LOCK_TRY) is waited for: a try right after it, on another
 * connection, must not find the lease still held. */
static int advisory(idx_backend *be, int32_t cls, int32_t key, enum lock_mode mode, br_err *err) {
  char k[16], c[16];
  snprintf(k, sizeof k, "%d", key);
  snprintf(c, sizeof c, "%d", cls);
  const char *v[2] = {c, k};
  if (mode != LOCK_RELEASE) {
    struct held_lock *h = calloc(1, sizeof *h);
    if (!h) return br_fail(err, "out of memory");
    h->conn = pool_take(be, 1, err);
    if (!h->conn) {
      free(h);
      return BR_INDEX_UNAVAILABLE;
    }
    PGresult *r = mode == LOCK_TRY
                      ? PQexecParams(h->conn, "SELECT pg_try_advisory_lock($1::int4, $2::int4)", 2,
                                     NULL, v, NULL, NULL, 0)
                      : PQexecPrepared(h->conn, STMT_LOCK, 2, v, NULL, NULL, 0);
    int ok = r && PQresultStatus(r) == PGRES_TUPLES_OK;
    int rc = ok ? 1 : read_fail(be, h->conn, r, "advisory lock", err);
    if (ok && mode == LOCK_TRY && strcmp(PQgetvalue(r, 0, 0), "t")) rc = 0;
    PQclear(r);
    if (rc != 1) {
      pool_give(be, h->conn);
      free(h);
      return rc;
    }
    h->cls = cls, h->key = key, h->wait = mode == LOCK_WAIT;
    pthread_mutex_lock(&be->lock);
    h->next = be->held;
    be->held = h;
    pthread_mutex_unlock(&be->lock);
    return 1;
  }
  pthread_mutex_lock(&be->lock);
  struct held_lock **p = &be->held;
  while (*p && ((*p)->cls != cls || (*p)->key != key)) p = &(*p)->next;
  struct held_lock *h = *p;
  if (h) *p = h->next;
  pthread_mutex_unlock(&be->lock);
  if (!h) return 0; /* never taken (the database was down) */
  int sent = 0, ok = 0;
  if (h->wait) {
    sent = PQsendQueryPrepared(h->conn, STMT_UNLOCK, 2, v, NULL, NULL, 0) && PQflush(h->conn) == 0;
    ok = sent;
  } else {
    PGresult *r = PQexecPrepared(h->conn, STMT_UNLOCK, 2, v, NULL, NULL, 0);
    ok = r && PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok) read_fail(be, h->conn, r, "advisory unlock", err);
    PQclear(r);
  }
  if (!ok) {
    if (h->wait) br_fail(err, "index: advisory unlock: %s", PQerrorMessage(h->conn));
    PQfinish(h->conn); /* the session's end releases it */
    h->conn = NULL;
    pthread_mutex_lock(&be->lock);
    be->nopen--;
    pthread_cond_signal(&be->cv);
    pthread_mutex_unlock(&be->lock);
  }
  if (h->conn) pool_give_as(be, h->conn, sent);
  free(h);
  return 0;
}

static int pg_lock_blob(idx_backend *be, const uint8_t digest[BR_SHA256_LEN], int lock,
                        br_err *err) {
  int32_t key = (int32_t)((uint32_t)digest[0] << 24 | (uint32_t)digest[1] << 16 |
                          (uint32_t)digest[2] << 8 | digest[3]);
  int rc = advisory(be, BR_INDEX_LOCK_CLASS, key, lock ? LOCK_WAIT : LOCK_RELEASE, err);
  return rc < 0 ? rc : 0;
}

static int pg_lease(idx_backend *be, int which, int take, br_err *err) {
  return advisory(be, BR_INDEX_LEASE_CLASS, which, take ? LOCK_TRY : LOCK_RELEASE, err);
}

/* Whether a session holds the advisory lock of lease which in this database (pg_locks shows a
 * two-key advisory lock as classid, objid with objsubid 2). */
static int pg_lease_held(idx_backend *be, int which, br_err *err) {
  char c[16], k[16];
  snprintf(c, sizeof c, "%d", BR_INDEX_LEASE_CLASS);
  snprintf(k, sizeof k, "%d", which);
  const char *v[2] = {c, k};
  int rc = 0;
  PGresult *r = read_query(be,
                           "SELECT count(*)::text FROM pg_locks l JOIN pg_database d"
                           " ON d.oid = l.database WHERE d.datname = current_database()"
                           " AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 2"
                           " AND l.classid = $1::int8::oid AND l.objid = $2::int8::oid",
                           2, v, NULL, NULL, "lease", &rc, err);
  if (!r) return rc;
  /* binary results: the text cast comes back as its characters */
  int held = PQgetlength(r, 0, 0) > 0 && PQgetvalue(r, 0, 0)[0] != '0';
  PQclear(r);
  return held;
}

/* pg_notify on the writer's connection: the other nodes' listeners (pg_listen.c) hear of it when
 * the transaction commits, and only then. */
static int pg_announce(idx_backend *be, const uint8_t (*digests)[BR_SHA256_LEN], size_t n) {
  char payload[PGL_PAYLOAD_MAX + 1];
  size_t parts = 1;
  for (size_t part = 0; part < parts; part++) {
    size_t len = pgl_payload(digests, n, part, &parts, payload);
    if (!len) break;
    const char *v[1] = {payload};
    int rc = wsend(be, SQL_NOTIFY, 1, v, NULL, NULL, PGRES_TUPLES_OK, NULL);
    if (rc) return rc;
  }
  return 0;
}

static const idx_ops pg_ops = {
    .name = "postgres",
    .get = pg_get,
    .get_done = pg_get_done,
    .get_many = pg_get_many,
    .scan = pg_scan,
    .key_owner = pg_key_owner,
    .stats = pg_stats,
    .has_purges = pg_has_purges,
    .ready = pg_ready,
    .lock_blob = pg_lock_blob,
    .lease = pg_lease,
    .lease_held = pg_lease_held,
    .begin = pg_begin,
    .commit = pg_commit,
    .abort = pg_abort,
    .retry = pg_retry,
    .fail = pg_fail,
    .announce = pg_announce,
    .prefetch = pg_prefetch,
    .rec_get = pg_rec_get,
    .rec_put = pg_rec_put,
    .rec_del = pg_rec_del,
    .owner_get = pg_owner_get,
    .owner_put = pg_owner_put,
    .owner_del = pg_owner_del,
    .purge_get = pg_purge_get,
    .purge_put = pg_purge_put,
    .purge_del = pg_purge_del,
    .purge_claim = pg_purge_claim,
    .kv_put = pg_kv_put,
    .kv_get = pg_kv_get,
    .kv_scan = pg_kv_scan,
    .kv_del = pg_kv_del,
    .next_id = pg_next_id,
    .fcache_put = pg_fcache_put,
    .fcache_get = pg_fcache_get,
    .fcache_prune = pg_fcache_prune,
    .plans_add = pg_plans_add,
    .plans_forget = pg_plans_forget,
    .plans_claim = pg_plans_claim,
    .plans_count = pg_plans_count,
    .job_add = pg_job_add,
    .job_claim = pg_job_claim,
    .job_save = pg_job_save,
    .job_list = pg_job_list,
    .job_cancel = pg_job_cancel,
    .counts_read = pg_counts_read,
    .purges_pending = pg_purges_pending,
    .counts_add = pg_counts_add,
    .counts_set = pg_counts_set,
    .txn_scan = pg_txn_scan,
    .close = pg_close,
};

/* This process's key in blobref_counts: random, never 0 (the completeness row's). */
static void pick_count_node(idx_backend *be) {
  uint64_t k = 0;
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f || fread(&k, sizeof k, 1, f) != 1) k = (uint64_t)time(NULL) << 20 ^ (uint64_t)getpid();
  if (f) fclose(f);
  k &= INT64_MAX;
  snprintf(be->count_node, sizeof be->count_node, "%lld", (long long)(k ? k : 1));
}

/* At a writable open: the rows of earlier processes (one set per start) are summed into this
 * one's, so that the table stays as small as the nodes running. 0 or -1 with why. */
static int fold_counts(idx_backend *be, PGconn *c, char *why, size_t cap) {
  if (exec_ok(c, "BEGIN", why, cap) < 0) return -1;
  int rc = exec_ok(c, "LOCK TABLE blobref_counts IN SHARE ROW EXCLUSIVE MODE", why, cap);
  if (!rc) {
    const char *v[1] = {be->count_node};
    PGresult *r =
        PQexecParams(c,
                     "WITH old AS (DELETE FROM blobref_counts WHERE state >= 0"
                     " RETURNING store, state, blobs, bytes)"
                     " INSERT INTO blobref_counts (node, store, state, blobs, bytes)"
                     " SELECT $1::int8, store, state, sum(blobs)::int8, sum(bytes)::int8 FROM old"
                     " GROUP BY store, state",
                     1, NULL, v, NULL, NULL, 0);
    if (!r || PQresultStatus(r) != PGRES_COMMAND_OK) rc = -1, pq_message(c, r, why, cap);
    PQclear(r);
  }
  if (!rc) return exec_ok(c, "COMMIT", why, cap);
  PQclear(PQexec(c, "ROLLBACK"));
  return -1;
}

idx_backend *idx_pg_open(const br_index_options *opt, const idx_ops **ops, br_err *err) {
  idx_backend *be = calloc(1, sizeof *be);
  if (!be || !(be->dsn = strdup(opt->dsn)) || !(be->pend = calloc(PIPE_MAX, sizeof *be->pend))) {
    if (be) free(be->dsn);
    free(be);
    br_fail(err, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&be->lock, NULL);
  pthread_cond_init(&be->cv, NULL);
  be->purge_claim_ms = opt->purge_claim_ms ? opt->purge_claim_ms : 60000;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  snprintf(be->node, sizeof be->node, "%s/%ld", host, (long)getpid());
  char why[512];
  PGconn *c = connect_db(be, why, sizeof why);
  if (!c || ensure_schema(c, why, sizeof why) < 0) {
    br_fail(err, "index: PostgreSQL: %s", why);
    PQfinish(c);
    pg_close(be);
    return NULL;
  }
  be->schema_ok = 1;
  if (prepare(c, STMT_GET, SQL_GET, why, sizeof why) < 0 ||
      prepare(c, STMT_GET_MANY, SQL_GET_MANY, why, sizeof why) < 0 ||
      prepare(c, STMT_LOCK, SQL_LOCK, why, sizeof why) < 0 ||
      prepare(c, STMT_UNLOCK, SQL_UNLOCK, why, sizeof why) < 0 ||
      writer_setup(c, why, sizeof why) < 0) {
    br_fail(err, "index: PostgreSQL: %s", why);
    PQfinish(c);
    pg_close(be);
    return NULL;
  }
  pick_count_node(be);
  if (!opt->read_only && fold_counts(be, c, why, sizeof why) < 0) {
    br_fail(err, "index: PostgreSQL: counters: %s", why);
    PQfinish(c);
    pg_close(be);
    return NULL;
  }
  atomic_store(&be->up, 1);
  be->wconn = c; /* the writer's from now on */
  be->last_connect_ms = mono_ms();
  *ops = &pg_ops;
  return be;
}
