/* Private to server/index: cross-node cache invalidation over PostgreSQL LISTEN/NOTIFY. The
 * writer of every node announces the digests its transaction changed (pgl_payload, sent with
 * pg_notify in that transaction); every node's listener (one thread, one connection) hands them
 * to a callback that evicts them, and says whether the caches may be trusted (pgl_fresh). */
#ifndef BLOBREF_INDEX_PG_LISTEN_H
#define BLOBREF_INDEX_PG_LISTEN_H

#include <stddef.h>
#include <stdint.h>

#include "blobref/common.h"

#define PGL_CHANNEL "blobref_changes"
/* Digests per notification: "c1:" + 124 * 64 hex = 7939 bytes, under PostgreSQL's 8000. */
#define PGL_PER_NOTIFY 124
/* A batch needing more notifications than this announces a flush of everything instead. */
#define PGL_MAX_NOTIFIES 8
#define PGL_PAYLOAD_MAX (3 + PGL_PER_NOTIFY * BR_HEX_LEN)
#define PGL_PING_MS 250   /* the listener pings its connection this often */
#define PGL_BOUND_MS 1000 /* caches are trusted this long after a ping sent was answered */

/* Writes into out (PGL_PAYLOAD_MAX + 1 bytes) the payload of notification `part` announcing
 * digests[0..n): part counts from 0 while *parts (out) says how many there are. When n needs more
 * than PGL_MAX_NOTIFIES, there is one part, a flush of everything. Returns the payload's length,
 * or 0 when part >= *parts (n = 0 needs none). Pure. */
size_t pgl_payload(const uint8_t (*digests)[BR_SHA256_LEN], size_t n, size_t part, size_t *parts,
                   char *out);

/* A change announced: one digest (digest non-NULL) or everything (digest NULL). */
typedef void (*pgl_change_fn)(void *ud, const uint8_t *digest);

/* Parses one received payload (untrusted: any bytes, len bytes long, not NUL-terminated) and calls
 * fn for each digest in it, or once with NULL for a flush. A payload that is not exactly one of
 * pgl_payload's forms is a flush too (the caches cannot know what changed). Returns the number of
 * digests, 0 for an announced flush, or -1 for a malformed payload (fn was called with NULL). */
int pgl_parse(const char *payload, size_t len, pgl_change_fn fn, void *ud);

typedef struct pgl_listener pgl_listener;

/* Starts the listener thread on dsn (libpq conninfo): it connects (application_name
 * blobrefd-listen), LISTENs, calls fn(ud, NULL) (everything may have changed while it was not
 * listening) and then fn for every change announced, on its own thread; on a lost connection it
 * reconnects (and flushes again). NULL + err (memory, thread). fn must be cheap and thread-safe. */
pgl_listener *pgl_start(const char *dsn, pgl_change_fn fn, void *ud, br_err *err);

/* 1 while the caches may be served from: the listener's connection answered a ping sent less
 * than PGL_BOUND_MS ago, and it has flushed since it last (re)connected. Any thread. */
int pgl_fresh(pgl_listener *l);

/* A WAL position of the primary (pg_lsn as 64 bits) that a read replica must have replayed for
 * its answers to be as current as this node's caches: the primary's position when a ping was
 * sent after every notification processed so far, so it covers each change announced to this
 * node and each commit acknowledged before that ping (sent at most PGL_PING_MS after it). 0 when
 * there is none (notifications came since, the listener is not fresh): read the primary then. */
uint64_t pgl_safe_lsn(pgl_listener *l);

/* Counters for /metrics: notifications received, flushes, (re)connections. Any thread. */
void pgl_counters(pgl_listener *l, uint64_t *notifies, uint64_t *flushes, uint64_t *connects);

/* Stops the thread (within about 50 ms) and closes its connection. NULL is allowed. */
void pgl_stop(pgl_listener *l);

#endif
