/* The small-blob cache: hits, misses, the size bound, eviction within budget, references that
 * outlive eviction, removal, and concurrent use. */
#include <pthread.h>
#include <stdlib.h>

#include "core/blobcache.h"
#include "unit.h"

static void digest_of(unsigned n, uint8_t d[32]) {
  memset(d, 0, 32);
  d[0] = (uint8_t)n; /* shard */
  for (int i = 0; i < 4; i++) d[8 + i] = (uint8_t)(n >> (8 * i));
}

static void *hammer(void *arg) {
  blobcache *c = arg;
  uint8_t d[32], buf[512];
  for (unsigned i = 0; i < 20000; i++) {
    digest_of(i % 700, d);
    memset(buf, (int)(i % 700), sizeof buf);
    cached_blob *e = blobcache_get(c, d);
    if (!e) e = blobcache_put(c, d, buf, sizeof buf);
    if (e && cached_blob_data(e)[0] != (uint8_t)(i % 700)) abort();
    blobcache_release(e);
  }
  return NULL;
}

int main(void) {
  CHECK(blobcache_new(0, 1024) == NULL, "budget 0 means no cache");
  CHECK(blobcache_get(NULL, (uint8_t[32]){0}) == NULL && blobcache_max_blob(NULL) == 0,
        "a NULL cache misses");
  blobcache *c = blobcache_new(16 * 64 * 1024, 4096); /* 64 KiB per shard */
  uint8_t d[32];
  digest_of(1, d);
  CHECK(blobcache_get(c, d) == NULL, "miss before put");
  cached_blob *e = blobcache_put(c, d, "hello", 5);
  CHECK(e && cached_blob_size(e) == 5 && !memcmp(cached_blob_data(e), "hello", 5), "put");
  blobcache_release(e);
  e = blobcache_get(c, d);
  CHECK(e && !memcmp(cached_blob_data(e), "hello", 5), "hit after put");
  /* a second put of the same digest returns the first entry */
  cached_blob *e2 = blobcache_put(c, d, "HELLO", 5);
  CHECK(e2 == e, "same digest, same entry");
  blobcache_release(e2);
  static uint8_t big[8192];
  CHECK(blobcache_put(c, d, big, sizeof big) == NULL, "over max_blob refused");
  /* fill one shard far past its budget: older entries go, the held one stays readable */
  for (unsigned i = 0; i < 200; i++) {
    uint8_t k[32];
    digest_of(1 + 16 * i, k); /* all in shard 1 */
    k[20] = 1;
    blobcache_release(blobcache_put(c, k, big, 4096));
  }
  CHECK(!memcmp(cached_blob_data(e), "hello", 5), "a held entry survives its eviction");
  blobcache_release(e);
  int resident = 0;
  for (unsigned i = 0; i < 200; i++) {
    uint8_t k[32];
    digest_of(1 + 16 * i, k);
    k[20] = 1;
    cached_blob *h = blobcache_get(c, k);
    resident += h != NULL;
    blobcache_release(h);
  }
  CHECK(resident > 0 && resident <= 16, "shard holds at most its budget: %d of 4 KiB", resident);
  digest_of(2, d);
  blobcache_release(blobcache_put(c, d, "x", 1));
  blobcache_remove(c, d);
  CHECK(blobcache_get(c, d) == NULL, "removed");
  /* clear: everything goes, a reference held meanwhile stays valid */
  for (unsigned i = 10; i < 20; i++) {
    digest_of(i, d);
    blobcache_release(blobcache_put(c, d, "y", 1));
  }
  cached_blob *kept = blobcache_get(c, d);
  blobcache_clear(c);
  int left = 0;
  for (unsigned i = 10; i < 20; i++) {
    digest_of(i, d);
    cached_blob *h = blobcache_get(c, d);
    left += h != NULL;
    blobcache_release(h);
  }
  CHECK(left == 0 && kept && cached_blob_data(kept)[0] == 'y', "clear: %d left", left);
  blobcache_release(kept);
  /* concurrent gets and puts with eviction */
  pthread_t t[4];
  for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, hammer, c);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  blobcache_free(c);
  return unit_summary("blobcache");
}
