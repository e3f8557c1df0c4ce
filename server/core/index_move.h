/* Private to the daemon: `blobrefd --export-index FILE` and `--import-index FILE`, moving an
 * index between kinds (LMDB <-> PostgreSQL) through a checksummed file. */
#ifndef BLOBREF_CORE_INDEX_MOVE_H
#define BLOBREF_CORE_INDEX_MOVE_H

#include "blobref/config.h"

/* Writes every record of the configured index (as br_record_encode stores it) and every pending
 * CDN purge (read after the records) to path (via path.tmp, fsync, rename), with a trailer of
 * counts and SHA-256. Opens the index read-only and takes no DATA_DIR lock (like --fsck: may run
 * beside a server). Returns the exit status: 0, or 2 on failure (nothing at path then). */
int br_index_export(br_config *cfg, const char *path);

/* Checks path's trailer and checksum (refusing a bad file before writing anything), then
 * inserts its records in batches (records present and identical are skipped, present and
 * different are reported) and queues its purges, and checks that every record of the file is
 * in the index as it is in the file. Takes DATA_DIR/lock. Returns 0 complete, 1 conflicts,
 * 2 fatal (bad file, index or lock). */
int br_index_import(br_config *cfg, const char *path);

#endif
