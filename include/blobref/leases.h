/* Upload leases: a pipeline's promise that the blobs it uploads are about to be referenced. Every
 * blob attached to a live lease is never quarantined by reconcile, whatever its age; a lease ends
 * when released or when its ttl passes. Kept durably in an LMDB environment of their own
 * (DATA_DIR/reconcile/leases), apart from the index and from reconcile's cache. */
#ifndef BLOBREF_LEASES_H
#define BLOBREF_LEASES_H

#include <stddef.h>
#include <stdint.h>

#include "blobref/common.h"

#define BR_LEASE_ID_LEN 32                            /* hex digits: 16 random bytes */
#define BR_LEASE_NAME_MAX 128                         /* bytes, printable ASCII */
#define BR_LEASE_TTL_MAX_MS (7ull * 24 * 3600 * 1000) /* 7 days */
#define BR_LEASE_MAX_BLOBS 100000                     /* blobs attached to one lease */

typedef struct br_leases br_leases;

typedef struct br_lease {
  char id[BR_LEASE_ID_LEN + 1];
  char name[BR_LEASE_NAME_MAX + 1];
  char owner[BR_LEASE_NAME_MAX + 1]; /* the [token NAME] that created it ("" without auth) */
  uint64_t created_ms, expires_ms, blobs;
} br_lease;

br_leases *br_leases_open(const char *dir, br_err *err);
void br_leases_close(br_leases *l); /* NULL allowed */

/* A new lease (name checked by the caller) ending at now + ttl_ms. Returns 0 or -1 + err. */
int br_lease_create(br_leases *l, const char *name, const char *owner, uint64_t ttl_ms,
                    uint64_t now, br_lease *out, br_err *err);
/* The live lease id (not expired at now): 1 found, 0 not (or expired), -1 + err. */
int br_lease_get(br_leases *l, const char *id, uint64_t now, br_lease *out, br_err *err);
/* Ends lease id and drops its blobs: 1 done, 0 no such lease, -1 + err. */
int br_lease_release(br_leases *l, const char *id, br_err *err);
/* Attaches the n blobs at digests (32 bytes each) to the live lease id, durably, in one
 * transaction, when owner is NULL or the lease's owner: 1 attached (or were), 0 no such live lease
 * of that owner, 2 over BR_LEASE_MAX_BLOBS (none attached), -1 + err. Callers attach before they
 * read the blob's record; waits while another thread holds br_leases_block. */
int br_lease_attach(br_leases *l, const char *id, const char *owner, const uint8_t *digests,
                    size_t n, uint64_t now, br_err *err);
/* Holds off every br_lease_attach until br_leases_unblock (same thread, not nested). Reconcile
 * checks the leases of a quarantine batch and commits it while blocked: an attach is then either
 * seen by the check or committed after the quarantine, so the read that follows it sees the
 * blob quarantined (never "present" and then quarantined under the lease). */
void br_leases_block(br_leases *l);
void br_leases_unblock(br_leases *l);
/* Calls fn for every live lease (of owner, or all with NULL), by id. Returns 0 or -1 + err. */
int br_leases_each(br_leases *l, const char *owner, uint64_t now,
                   int (*fn)(void *ud, const br_lease *lease), void *ud, br_err *err);
/* The latest end among the live leases holding d (0: none) and, when not NULL, that lease's id. */
uint64_t br_leased_until(br_leases *l, const uint8_t d[BR_SHA256_LEN], uint64_t now,
                         char id[BR_LEASE_ID_LEN + 1]);
/* Drops leases expired at now (and their blobs). Returns how many, or -1 + err. */
int64_t br_leases_prune(br_leases *l, uint64_t now, br_err *err);
/* Live leases and the blobs attached to them, for the metrics. */
void br_leases_stats(br_leases *l, uint64_t now, uint64_t *leases, uint64_t *blobs);

#endif
