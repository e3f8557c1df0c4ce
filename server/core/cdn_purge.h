/* Private to the daemon: purges at the configured CDNs ([cdn NAME]) when a blob stops being
 * servable (quarantined, held, deleted, moved). The purges are pending in the index (written in
 * the same transaction as the change that made them due), and a sender thread sends them with
 * retries, so that neither a crash nor a restart ever loses one. */
#ifndef BLOBREF_CDN_PURGE_H
#define BLOBREF_CDN_PURGE_H

#include "blobref/config.h"
#include "blobref/index.h"

typedef struct cdn_purger cdn_purger;

/* Starts the sender over index's pending purges (borrowed: it must outlive the purger). An old
 * purge queue (an LMDB environment in old_dir, from before the index held them) is moved into
 * the index first, once, and removed. NULL with err on failure. */
cdn_purger *cdn_purger_open(const br_config *cfg, br_index *index, const char *old_dir,
                            br_err *err);
void cdn_purger_close(cdn_purger *p); /* NULL allowed; pending purges stay in the index */

/* Wakes the sender: a change has just queued a purge. NULL allowed. */
void cdn_purger_kick(cdn_purger *p);

typedef struct cdn_purge_stats {
  uint64_t sent, failed, pending;
} cdn_purge_stats;
void cdn_purger_stats(cdn_purger *p, cdn_purge_stats *out);

#endif
