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
 * empty, no database). Thread safe: a pool of handles, each used by one thread at a time. */
int br_sniff_type(const void *buf, size_t len, char *out, size_t outlen);

/* The type of an import that names none, by the rule of uploads: the extension of name
 * (br_content_type_for_name, as the CLI sends), else br_sniff_type on the first head_len bytes
 * (at most BR_SNIFF_BYTES are looked at), else application/octet-stream. Writes it into out
 * (outlen bytes, at least 32), truncated never: a type that does not fit is not adopted. */
void br_sniff_name_or_bytes(const char *name, const void *head, size_t head_len, char *out,
                            size_t outlen);

#endif
