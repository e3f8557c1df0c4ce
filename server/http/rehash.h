/* Private to the HTTP front: changed in-place files too large to hash on a read (issue 19),
 * hashed again by a thread of their own while reads answer 503 with Retry-After. */
#ifndef BLOBREF_HTTP_REHASH_H
#define BLOBREF_HTTP_REHASH_H

#include "http/httpd.h"

/* At most this many files queued or being hashed at once, and remembered as wrong. */
#define REHASH_SLOTS 8

/* Starts (and stops: joins) the re-hash thread; stop drops what is queued (the next read of such
 * a file queues it again) and waits for the file being hashed, if any. */
int rehash_start(br_http *http, br_err *err);
void rehash_stop(br_http *http);

/* Queues the location store:key of blob digest, whose file moved (mtime/ctime changed_ms) after
 * it was verified, to be verified again as `PUT .../location` onto itself does: from then on it
 * is served if its bytes are the blob's, else it is counted, logged and listed as suspect, and
 * not queued again until the file moves. Once per location at a time; nothing when all slots
 * are busy (a later read tries again). Never blocks on the store. */
void rehash_later(br_http *http, const uint8_t digest[BR_SHA256_LEN], br_store *store,
                  const char *key, uint64_t changed_ms);

#endif
