/* Private to the daemon: the journal of direct-upload plans (core/direct_plans.c) and the sweep
 * that deletes what an unfinished plan left in the store once direct_upload_grace has passed. */
#ifndef BLOBREF_CORE_DIRECT_PLANS_H
#define BLOBREF_CORE_DIRECT_PLANS_H

#include "core/server.h"

#define DIRECT_PLANS_MAX 1000000 /* plans pending at once; past it new blobs go via_server */
#define DIRECT_UPLOAD_ID_MAX 511

/* One plan handed to a client: the blob, where its object lands, and for a multipart plan the
 * store's upload id ("" for a single presigned PUT). */
struct direct_plan {
  uint8_t digest[BR_SHA256_LEN];
  const char *store, *key, *upload_id;
};

/* Opens DATA_DIR/direct-plans.log (creating it), loads the plans still pending, rewrites the
 * file with only those (compaction), and starts the sweep thread; on a shared index (one that
 * keeps the plans, br_index_has_plans) no journal: the plans are the index's rows, and the sweep
 * claims the expired ones of every node. -1 with err. */
int direct_plans_start(br_server *srv, br_err *err);
/* Stops the sweep (a plan being swept is finished first), joins it and frees the journal. */
void direct_plans_stop(br_server *srv);
/* Journals plans[0..n) durably (one append and one fsync, or one INSERT on a shared index)
 * before the caller hands them out.
 * Returns 0; 1 when the journal holds DIRECT_PLANS_MAX plans or a key or upload id cannot be
 * written on a line (nothing journaled: answer via_server); -1 with err (nothing journaled). */
int direct_plans_add(br_server *srv, const struct direct_plan *plans, size_t n, br_err *err);
/* The plan is over (committed, refused and deleted, or aborted): forgets the plans of digest
 * with upload_id (""; every single-part plan of digest). Appended without fsync: a plan a crash
 * keeps is swept later, and the sweep never deletes an object a record owns. */
void direct_plans_forget(br_server *srv, const uint8_t digest[BR_SHA256_LEN],
                         const char *upload_id);
/* Plans journaled and neither forgotten nor swept (blobref_direct_plans_pending); on a shared
 * index, every node's. */
uint64_t direct_plans_pending(br_server *srv);
/* Objects and multipart uploads the sweep removed (blobref_direct_plans_swept_total). */
uint64_t direct_plans_swept(br_server *srv);

#endif
