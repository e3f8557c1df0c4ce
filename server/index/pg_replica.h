/* Private to server/index: point reads on a PostgreSQL read replica ([index] read_dsn), used only
 * when the replica has replayed the position the change listener vouches for (pgl_safe_lsn), so
 * that its answers are as current as the node's caches; anything else is for the primary. */
#ifndef BLOBREF_INDEX_PG_REPLICA_H
#define BLOBREF_INDEX_PG_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "blobref/common.h"

typedef struct pgr_pool pgr_pool;

/* A pool of connections to dsn, made when first needed (a replica that is down never delays
 * start-up). NULL + err (memory). */
pgr_pool *pgr_open(const char *dsn, br_err *err);

/* The encoded record of digest, read on the replica once it has replayed min_lsn: 0 found (*val,
 * *len valid until pgr_done(*hold)), 1 absent there, 2 the replica cannot say (behind min_lsn,
 * unreachable, an error, no connection free): ask the primary in both of the last cases. Any
 * thread. */
int pgr_get(pgr_pool *p, const uint8_t digest[BR_SHA256_LEN], uint64_t min_lsn, const void **val,
            size_t *len, void **hold);
void pgr_done(void *hold);

/* Closes every connection (none may be in use). NULL is allowed. */
void pgr_close(pgr_pool *p);

#endif
