/* Private to the daemon: the offline checks of `blobrefd --fsck` and `--rebuild-index`. */
#ifndef BLOBREF_CORE_FSCK_H
#define BLOBREF_CORE_FSCK_H

#include "blobref/config.h"

/* Checks that every index entry's bytes are there with the indexed size (verify: and SHA-256),
 * printing one line per problem and a summary. Returns the exit status: 0 clean, 1 problems,
 * 2 the index or a store could not be opened. */
int br_fsck(br_config *cfg, int verify);
/* Indexes every content-addressed object of every store whose bytes match its key. Returns the
 * exit status: 0, 1 problems (objects left out), 2 fatal. */
int br_rebuild_index(br_config *cfg);

#endif
