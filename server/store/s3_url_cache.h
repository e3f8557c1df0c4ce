/* Private to the S3 store: a bounded, thread-safe cache of presigned GET URLs, so that redirects
 * to the same object reuse one URL while it stays valid for at least half of its lifetime. */
#ifndef BLOBREF_S3_URL_CACHE_H
#define BLOBREF_S3_URL_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "store/s3_client.h"

typedef struct s3_url_cache s3_url_cache;

/* A cache of at most `entries` URLs (rounded up to a power of two, at least 2). Returns NULL when
 * out of memory. Free with s3_url_cache_free once no thread uses it. */
s3_url_cache *s3_url_cache_new(size_t entries);
void s3_url_cache_free(s3_url_cache *c);

/* A presigned GET of key on t, with query among its signed parameters ("" for none; URLs are
 * cached per key and query, so an inline and an attachment URL never stand in for each other),
 * valid for ttl_s seconds from when it was signed, into url: the
 * cached one while it is still valid for at least half of ttl_s at now_ms (wall clock, ms since
 * the epoch), else a fresh one signed at now_ms, which then replaces the cached one. *valid_ms is
 * how long the returned URL still works from now_ms (its X-Amz-Date + X-Amz-Expires - now_ms): at
 * least half of ttl_s for a cached one, ttl_s less the part of the current second already gone
 * for a fresh one. c NULL: always a fresh one. Returns 0, or -1 with err. */
int s3_url_cache_presign(s3_url_cache *c, s3_target *t, const char *key, const char *query,
                         uint64_t now_ms, uint64_t ttl_s, char *url, size_t urllen,
                         uint64_t *valid_ms, br_err *err);

/* Counters since creation, for tests: lookups answered from the cache, and URLs signed. */
void s3_url_cache_stats(s3_url_cache *c, uint64_t *hits, uint64_t *signs);

#endif
