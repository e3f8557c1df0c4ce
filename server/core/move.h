/* Private to the daemon: a verified move of one blob's primary location (the core of
 * PUT /v1/blobs/{hash}/location, shared with the migrate jobs of core/jobs.c). */
#ifndef BLOBREF_CORE_MOVE_H
#define BLOBREF_CORE_MOVE_H

#include "core/server.h"

enum br_move_result {
  BR_MOVE_OK,
  BR_MOVE_NOT_FOUND,     /* no such blob */
  BR_MOVE_CHANGED,       /* the primary is not `expect` */
  BR_MOVE_VERIFY_FAILED, /* `to` is missing or does not hash to the blob */
  BR_MOVE_UNAVAILABLE,   /* the target store failed */
  BR_MOVE_FULL,          /* no room for another location */
  BR_MOVE_KEY_TAKEN,     /* `to` is another blob's location */
  BR_MOVE_INDEX_ERROR    /* the index write failed: index_rc says how */
};

struct br_move {
  br_location expect, to; /* in */
  enum br_move_result result;
  int index_rc; /* BR_MOVE_INDEX_ERROR: the br_index_apply_locations return */
  char message[sizeof(br_err) + 200];
  br_record after; /* the record after the switch (or as found on BR_MOVE_CHANGED) */
  uint64_t verify_ms, switch_ms;
};

/* Hashes mv->to (size and SHA-256 must be the blob's), then under the blob's stripe checks it is
 * still there and switches the primary from mv->expect to mv->to in the index (the old one
 * drains). Blocks (reads the whole copy): never call it on a network thread. Logs refusals of
 * verification and successful moves; forgets cached bytes and queues CDN purges on a move. */
void br_server_move_blob(br_server *srv, const uint8_t digest[BR_SHA256_LEN], struct br_move *mv);

#endif
