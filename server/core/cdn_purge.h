/* Private to the daemon: purges at the configured CDNs ([cdn NAME]) when a blob stops being
 * servable (quarantined, deleted), from a durable queue (LMDB under DATA_DIR/purge) that a
 * sender thread drains with retries, so that a restart never forgets a pending purge. */
#ifndef BLOBREF_CDN_PURGE_H
#define BLOBREF_CDN_PURGE_H

#include "blobref/config.h"

typedef struct cdn_purger cdn_purger;

/* Opens the queue under dir and starts the sender; NULL with err on failure. With no [cdn]
 * configured it returns a purger that queues nothing. */
cdn_purger *cdn_purger_open(const br_config *cfg, const char *dir, br_err *err);
void cdn_purger_close(cdn_purger *p); /* NULL allowed; pending purges stay queued */

/* Queues a purge of digest at every CDN, durably. Returns 0 or -1 + err. */
int cdn_purge_enqueue(cdn_purger *p, const uint8_t digest[BR_SHA256_LEN], br_err *err);

typedef struct cdn_purge_stats {
  uint64_t sent, failed, pending;
} cdn_purge_stats;
void cdn_purger_stats(cdn_purger *p, cdn_purge_stats *out);

#endif
