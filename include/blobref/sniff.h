/* Content types detected from a blob's first bytes (libmagic), for uploads and imports that
 * name none. */
#ifndef BLOBREF_SNIFF_H
#define BLOBREF_SNIFF_H

#include <stddef.h>

#include "blobref/common.h"

#define BR_SNIFF_BYTES 4096 /* only this many first bytes are ever looked at */

/* Loads the magic database once for the process (libmagic's default, or $MAGIC). Returns 0, or
 * -1 with err saying which database could not be loaded. Later calls are no-ops until
 * br_sniff_close. */
int br_sniff_open(br_err *err);
void br_sniff_close(void);

/* Does ct ask for detection: NULL, empty, or application/octet-stream (case and parameters
 * ignored)? */
int br_sniff_wanted(const char *ct);

/* Writes into out (outlen bytes) the media type libmagic names for the first min(len,
 * BR_SNIFF_BYTES) bytes of buf. Returns 1 when it is a specific type that
 * br_content_type_is_passive admits (an image, PDF, plain text...): never an active type such as
 * HTML or SVG, which would then be rendered; 0 when there is no such answer (active, unknown,
 * empty, no database). Thread safe (one handle under a lock). */
int br_sniff_type(const void *buf, size_t len, char *out, size_t outlen);

#endif
