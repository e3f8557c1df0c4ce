/* Cross-node cache invalidation: the NOTIFY payloads the writers send, their parser, and the
 * listener thread (one per node, the only user of its connection) that evicts what other nodes
 * changed and pings its connection so that the caches stop being trusted when it falls silent. */
#include "index/pg_listen.h"

#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RECONNECT_MS 200     /* a lost connection is tried again at most this often */
#define PING_GIVE_UP_MS 5000 /* a ping unanswered this long: the connection is taken as lost */
#define POLL_MS 50           /* the longest the thread sleeps (so that stop is quick) */
#define CHANGES_PREFIX "c1:" /* then 64 lower-case hex digits per digest */
#define FLUSH_PAYLOAD "f1"   /* everything may have changed */

static const char HEX[] = "0123456789abcdef";

size_t pgl_payload(const uint8_t (*digests)[BR_SHA256_LEN], size_t n, size_t part, size_t *parts,
                   char *out) {
  size_t need = (n + PGL_PER_NOTIFY - 1) / PGL_PER_NOTIFY;
  *parts = need > PGL_MAX_NOTIFIES ? 1 : need;
  if (part >= *parts) return 0;
  if (need > PGL_MAX_NOTIFIES) {
    memcpy(out, FLUSH_PAYLOAD, sizeof FLUSH_PAYLOAD);
    return sizeof FLUSH_PAYLOAD - 1;
  }
  size_t first = part * PGL_PER_NOTIFY,
         last = first + PGL_PER_NOTIFY < n ? first + PGL_PER_NOTIFY : n;
  size_t len = sizeof CHANGES_PREFIX - 1;
  memcpy(out, CHANGES_PREFIX, len);
  for (size_t i = first; i < last; i++)
    for (size_t j = 0; j < BR_SHA256_LEN; j++) {
      out[len++] = HEX[digests[i][j] >> 4];
      out[len++] = HEX[digests[i][j] & 15];
    }
  out[len] = '\0';
  return len;
}

static int nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

int pgl_parse(const char *payload, size_t len, pgl_change_fn fn, void *ud) {
  size_t plen = sizeof CHANGES_PREFIX - 1;
  if (len == sizeof FLUSH_PAYLOAD - 1 && !memcmp(payload, FLUSH_PAYLOAD, len)) {
    fn(ud, NULL);
    return 0;
  }
  size_t body = len > plen ? len - plen : 0;
  if (len <= plen || len > PGL_PAYLOAD_MAX || memcmp(payload, CHANGES_PREFIX, plen) ||
      body % BR_HEX_LEN) {
    fn(ud, NULL);
    return -1;
  }
  for (size_t i = plen; i < len; i++) /* all of it checked before anything is evicted */
    if (nibble(payload[i]) < 0) {
      fn(ud, NULL);
      return -1;
    }
  int n = 0;
  for (size_t at = plen; at < len; at += BR_HEX_LEN, n++) {
    uint8_t d[BR_SHA256_LEN];
    for (size_t j = 0; j < BR_SHA256_LEN; j++)
      d[j] = (uint8_t)(nibble(payload[at + 2 * j]) << 4 | nibble(payload[at + 2 * j + 1]));
    fn(ud, d);
  }
  return n;
}

/* ---- the listener thread ------------------------------------------------------------------ */

struct pgl_listener {
  char *dsn;
  pgl_change_fn fn;
  void *ud;
  pthread_t thread;
  atomic_int stopping;
  atomic_uint_fast64_t fresh_until_ms; /* monotonic; 0: not trusted */
  atomic_uint_fast64_t safe_lsn;       /* see pgl_safe_lsn; 0: none */
  atomic_uint_fast64_t notifies, flushes, connects;
};

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* libpq's message, first line only (never the conninfo). */
static void first_line(const char *m, char *out, size_t cap) {
  snprintf(out, cap, "%s", m && *m ? m : "unknown error");
  out[strcspn(out, "\n")] = '\0';
}

/* A connection that LISTENs on the channel, or NULL with why. */
static PGconn *listen_connect(pgl_listener *l, char *why, size_t cap) {
  const char *const keys[] = {"dbname", "application_name", NULL};
  const char *const vals[] = {l->dsn, "blobrefd-listen", NULL};
  PGconn *c = PQconnectdbParams(keys, vals, 1); /* the dsn first, our name over its own */
  if (!c || PQstatus(c) != CONNECTION_OK) {
    first_line(c ? PQerrorMessage(c) : "out of memory", why, cap);
    PQfinish(c);
    return NULL;
  }
  PGresult *r = PQexec(c, "LISTEN " PGL_CHANNEL);
  int ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
  if (!ok) first_line(r ? PQresultErrorMessage(r) : PQerrorMessage(c), why, cap);
  PQclear(r);
  if (ok && PQsetnonblocking(c, 1) == 0) return c;
  if (ok) first_line(PQerrorMessage(c), why, cap);
  PQfinish(c);
  return NULL;
}

static void flush_all(pgl_listener *l) {
  atomic_fetch_add(&l->flushes, 1);
  l->fn(l->ud, NULL);
}

/* Parses "X/Y" (pg_lsn's text) into a 64-bit position; 0 when it is not one. */
static uint64_t parse_lsn(const char *s) {
  char *end;
  unsigned long long hi = strtoull(s, &end, 16), lo;
  if (end == s || *end != '/') return 0;
  s = end + 1;
  lo = strtoull(s, &end, 16);
  if (end == s || *end || hi > 0xffffffffull || lo > 0xffffffffull) return 0;
  return hi << 32 | lo;
}

/* Hands every notification received so far to fn; returns how many. */
static size_t drain_notifies(pgl_listener *l, PGconn *c) {
  PGnotify *n;
  size_t got = 0;
  while ((n = PQnotifies(c)) != NULL) {
    if (!got++) atomic_store(&l->safe_lsn, 0); /* before the eviction: see pgl_safe_lsn */
    atomic_fetch_add(&l->notifies, 1);
    if (pgl_parse(n->extra, strlen(n->extra), l->fn, l->ud) <= 0) atomic_fetch_add(&l->flushes, 1);
    PQfreemem(n);
  }
  return got;
}

/* The thread: (re)connect and flush, then ping every PGL_PING_MS while evicting what is
 * announced; a ping answered makes the caches trusted until PGL_BOUND_MS after it was sent. */
static void *listen_main(void *arg) {
  pgl_listener *l = arg;
  PGconn *c = NULL;
  uint64_t last_try = 0, next_ping = 0, ping_sent = 0, lsn = 0;
  uint64_t heard = 0, heard_at_ping = 0; /* notifications processed: in all, when the ping left */
  int pinging = 0, ping_ok = 0, was_down = 0;
  char why[256];
  while (!atomic_load(&l->stopping)) {
    uint64_t now = mono_ms();
    if (!c) {
      if (last_try && now - last_try < RECONNECT_MS) {
        sleep_ms(POLL_MS);
        continue;
      }
      last_try = now;
      c = listen_connect(l, why, sizeof why);
      if (!c) {
        if (!was_down) br_warn("index: change listener cannot connect: %s", why);
        was_down = 1;
        continue;
      }
      atomic_fetch_add(&l->connects, 1);
      atomic_store(&l->safe_lsn, 0);
      flush_all(l); /* changes made while nobody listened are not announced again */
      if (was_down) br_info("index: change listener reconnected: caches flushed");
      was_down = 0, pinging = 0, next_ping = now;
    }
    int lost = 0;
    /* every PGL_PING_MS, and at once after notifications (to cover them with a position) */
    if (!pinging && (now >= next_ping || heard != heard_at_ping)) {
      lost = !PQsendQuery(c, "SELECT pg_current_wal_lsn()::text") || PQflush(c) < 0;
      ping_sent = now, pinging = 1, ping_ok = 0, next_ping = now + PGL_PING_MS;
      heard_at_ping = heard;
    }
    if (!lost) {
      struct pollfd pfd = {.fd = PQsocket(c), .events = POLLIN};
      uint64_t wait = next_ping > now ? next_ping - now : 0;
      poll(&pfd, 1, (int)(wait < POLL_MS ? wait : POLL_MS));
      lost = !PQconsumeInput(c) || PQstatus(c) != CONNECTION_OK;
    }
    int answered = 0;
    while (!lost && pinging && !PQisBusy(c)) {
      PGresult *r = PQgetResult(c);
      if (!r) {
        pinging = 0, answered = ping_ok;
        break;
      }
      ping_ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
      /* a standby (a dsn without target_session_attrs=read-write) has no current position */
      lsn = ping_ok && !PQgetisnull(r, 0, 0) ? parse_lsn(PQgetvalue(r, 0, 0)) : 0;
      PQclear(r);
    }
    if (!lost) heard += drain_notifies(l, c); /* those sent before the answer, before trusting it */
    if (answered) {
      atomic_store(&l->fresh_until_ms, ping_sent + PGL_BOUND_MS);
      /* the position covers every notification processed before the ping left, and every commit
       * acknowledged before that: with none processed since, reads at it are current enough */
      if (heard == heard_at_ping) atomic_store(&l->safe_lsn, lsn);
    }
    if (!lost && pinging && mono_ms() - ping_sent > PING_GIVE_UP_MS) {
      first_line("a ping went unanswered", why, sizeof why);
      lost = 1;
    } else if (lost) {
      first_line(PQerrorMessage(c), why, sizeof why);
    }
    if (lost) {
      atomic_store(&l->fresh_until_ms, 0);
      br_warn("index: change listener lost its connection (caches off until it is back): %s", why);
      PQfinish(c);
      c = NULL, was_down = 1, last_try = 0;
    }
  }
  atomic_store(&l->fresh_until_ms, 0);
  PQfinish(c);
  return NULL;
}

pgl_listener *pgl_start(const char *dsn, pgl_change_fn fn, void *ud, br_err *err) {
  pgl_listener *l = calloc(1, sizeof *l);
  if (!l || !(l->dsn = strdup(dsn))) {
    free(l);
    br_fail(err, "out of memory");
    return NULL;
  }
  l->fn = fn, l->ud = ud;
  if (pthread_create(&l->thread, NULL, listen_main, l)) {
    free(l->dsn);
    free(l);
    br_fail(err, "index: cannot start the change listener thread");
    return NULL;
  }
  return l;
}

int pgl_fresh(pgl_listener *l) { return mono_ms() < atomic_load(&l->fresh_until_ms); }

uint64_t pgl_safe_lsn(pgl_listener *l) { return pgl_fresh(l) ? atomic_load(&l->safe_lsn) : 0; }

void pgl_counters(pgl_listener *l, uint64_t *notifies, uint64_t *flushes, uint64_t *connects) {
  *notifies = atomic_load(&l->notifies);
  *flushes = atomic_load(&l->flushes);
  *connects = atomic_load(&l->connects);
}

void pgl_stop(pgl_listener *l) {
  if (!l) return;
  atomic_store(&l->stopping, 1);
  pthread_join(l->thread, NULL);
  free(l->dsn);
  free(l);
}
