/* Private to the daemon: locations whose bytes a read found not to hash to their blob, listed in
 * DATA_DIR/suspect for `blobrefd --fsck` (suspect.c). */
#ifndef BLOBREF_CORE_SUSPECT_H
#define BLOBREF_CORE_SUSPECT_H

#include <stddef.h>

#include "blobref/index.h"

/* The list stops growing at this size (a store that corrupts everything would fill the disk). */
#define BR_SUSPECT_FILE_MAX (4u << 20)

typedef struct br_suspect {
  uint8_t digest[BR_SHA256_LEN];
  char store[BR_MAX_STORE_NAME + 1];
  char key[BR_MAX_KEY + 1];
  uint64_t at_ms; /* when the read saw the wrong bytes */
} br_suspect;

/* Appends (digest, store, key, now) to DATA_DIR/suspect: one write(2) with O_APPEND, so it is
 * safe from any thread and never blocks on more than a local append (no fsync: a lost line
 * loses a hint, not data). Returns 0, or -1 with err (the list is full or cannot be written). */
int br_suspect_mark(const char *data_dir, const uint8_t digest[BR_SHA256_LEN], const char *store,
                    const char *key, br_err *err);

/* Reads DATA_DIR/suspect into *out (malloc'd, the caller frees; NULL with *n = 0 when there is
 * none). Malformed lines are skipped. Returns 0, or -1 with err when it cannot be read. */
int br_suspect_load(const char *data_dir, br_suspect **out, size_t *n, br_err *err);

/* The newest entry of list for (digest, store, key), or NULL. */
const br_suspect *br_suspect_find(const br_suspect *list, size_t n,
                                  const uint8_t digest[BR_SHA256_LEN], const char *store,
                                  const char *key);

#endif
