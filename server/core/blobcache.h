/* Private to the daemon: an in-memory cache of small blobs' bytes, so that hot small reads cost
 * no file system calls. Blobs are immutable (named by their hash), so entries never go stale. */
#ifndef BLOBREF_BLOBCACHE_H
#define BLOBREF_BLOBCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct blobcache blobcache;
typedef struct cached_blob cached_blob;

/* A cache holding at most budget bytes of blobs of at most max_blob bytes each. NULL when
 * budget is 0 (caching off) or out of memory. */
blobcache *blobcache_new(uint64_t budget, uint64_t max_blob);
void blobcache_free(blobcache *c); /* entries still referenced are freed by their release */

/* The largest blob the cache takes (0 when c is NULL). */
uint64_t blobcache_max_blob(const blobcache *c);

/* Looks a blob up; on a hit returns an entry the caller must blobcache_release(). */
cached_blob *blobcache_get(blobcache *c, const uint8_t digest[32]);

/* Copies len bytes in under digest (replacing nothing if present) and returns a referenced entry
 * for them, or NULL (too big, out of memory). Old entries are evicted to stay within budget. */
cached_blob *blobcache_put(blobcache *c, const uint8_t digest[32], const void *data, size_t len);

/* Forgets a blob (it was deleted). */
void blobcache_remove(blobcache *c, const uint8_t digest[32]);
/* Forgets every blob (another node's changes may have been missed). */
void blobcache_clear(blobcache *c);

const uint8_t *cached_blob_data(const cached_blob *e);
size_t cached_blob_size(const cached_blob *e);
/* Drops a reference; usable as a libmicrohttpd free callback (takes void *). */
void blobcache_release(void *entry);

#endif
