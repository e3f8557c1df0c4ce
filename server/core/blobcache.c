/* Small-blob cache: 16 shards, each a chained hash table with a second-chance FIFO for
 * eviction; entries are reference-counted so a response can hold one while it is sent. */
#include "core/blobcache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define SHARDS 16

struct cached_blob {
  atomic_int refs; /* one held by the cache while it is in a shard, one per user */
  int referenced;  /* second chance: set on hit, cleared as the clock passes */
  uint8_t digest[32];
  size_t size;
  cached_blob *chain;         /* bucket chain */
  cached_blob *older, *newer; /* FIFO */
  uint8_t data[];
};

struct shard {
  pthread_mutex_t lock;
  cached_blob **buckets;
  size_t nbuckets;
  cached_blob *oldest, *newest;
  uint64_t bytes;
};

struct blobcache {
  uint64_t shard_budget, max_blob;
  struct shard shards[SHARDS];
};

static struct shard *shard_of(blobcache *c, const uint8_t d[32]) {
  return &c->shards[d[0] % SHARDS];
}

static size_t bucket_of(const struct shard *s, const uint8_t d[32]) {
  uint64_t h;
  memcpy(&h, d + 8, sizeof h); /* the digest is already uniformly distributed */
  return (size_t)(h % s->nbuckets);
}

blobcache *blobcache_new(uint64_t budget, uint64_t max_blob) {
  if (!budget) return NULL;
  blobcache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->shard_budget = budget / SHARDS;
  c->max_blob = max_blob < c->shard_budget ? max_blob : c->shard_budget;
  size_t nbuckets = (size_t)(c->shard_budget / 2048) + 64;
  for (int i = 0; i < SHARDS; i++) {
    pthread_mutex_init(&c->shards[i].lock, NULL);
    c->shards[i].nbuckets = nbuckets;
    c->shards[i].buckets = calloc(nbuckets, sizeof(cached_blob *));
    if (!c->shards[i].buckets) {
      blobcache_free(c);
      return NULL;
    }
  }
  return c;
}

uint64_t blobcache_max_blob(const blobcache *c) { return c ? c->max_blob : 0; }

void blobcache_release(void *entry) {
  cached_blob *e = entry;
  if (e && atomic_fetch_sub(&e->refs, 1) == 1) free(e);
}

/* Takes e out of its shard (bucket and FIFO) and drops the shard's reference. Lock held. */
static void unlink_entry(struct shard *s, cached_blob *e) {
  cached_blob **p = &s->buckets[bucket_of(s, e->digest)];
  while (*p && *p != e) p = &(*p)->chain;
  if (*p) *p = e->chain;
  if (e->older)
    e->older->newer = e->newer;
  else
    s->oldest = e->newer;
  if (e->newer)
    e->newer->older = e->older;
  else
    s->newest = e->older;
  s->bytes -= e->size;
  blobcache_release(e);
}

static cached_blob *find(struct shard *s, const uint8_t d[32]) {
  for (cached_blob *e = s->buckets[bucket_of(s, d)]; e; e = e->chain)
    if (!memcmp(e->digest, d, 32)) return e;
  return NULL;
}

cached_blob *blobcache_get(blobcache *c, const uint8_t digest[32]) {
  if (!c) return NULL;
  struct shard *s = shard_of(c, digest);
  pthread_mutex_lock(&s->lock);
  cached_blob *e = find(s, digest);
  if (e) {
    e->referenced = 1;
    atomic_fetch_add(&e->refs, 1);
  }
  pthread_mutex_unlock(&s->lock);
  return e;
}

cached_blob *blobcache_put(blobcache *c, const uint8_t digest[32], const void *data, size_t len) {
  if (!c || len > c->max_blob) return NULL;
  cached_blob *e = malloc(sizeof *e + (len ? len : 1));
  if (!e) return NULL;
  atomic_init(&e->refs, 2); /* the shard's and the caller's */
  e->referenced = 0;
  memcpy(e->digest, digest, 32);
  e->size = len;
  memcpy(e->data, data, len);
  struct shard *s = shard_of(c, digest);
  pthread_mutex_lock(&s->lock);
  cached_blob *old = find(s, digest);
  if (old) { /* someone else put it first: use theirs */
    atomic_fetch_add(&old->refs, 1);
    pthread_mutex_unlock(&s->lock);
    free(e);
    return old;
  }
  /* second-chance eviction from the old end */
  while (s->oldest && s->bytes + len > c->shard_budget) {
    cached_blob *victim = s->oldest;
    if (victim->referenced && victim != s->newest) {
      victim->referenced = 0;
      s->oldest = victim->newer;
      s->oldest->older = NULL;
      victim->newer = NULL;
      victim->older = s->newest;
      s->newest->newer = victim;
      s->newest = victim;
      continue;
    }
    unlink_entry(s, victim);
  }
  size_t b = bucket_of(s, digest);
  e->chain = s->buckets[b];
  s->buckets[b] = e;
  e->newer = NULL;
  e->older = s->newest;
  if (s->newest)
    s->newest->newer = e;
  else
    s->oldest = e;
  s->newest = e;
  s->bytes += len;
  pthread_mutex_unlock(&s->lock);
  return e;
}

void blobcache_remove(blobcache *c, const uint8_t digest[32]) {
  if (!c) return;
  struct shard *s = shard_of(c, digest);
  pthread_mutex_lock(&s->lock);
  cached_blob *e = find(s, digest);
  if (e) unlink_entry(s, e);
  pthread_mutex_unlock(&s->lock);
}

void blobcache_clear(blobcache *c) {
  if (!c) return;
  for (int i = 0; i < SHARDS; i++) {
    struct shard *s = &c->shards[i];
    pthread_mutex_lock(&s->lock);
    while (s->oldest) unlink_entry(s, s->oldest);
    pthread_mutex_unlock(&s->lock);
  }
}

const uint8_t *cached_blob_data(const cached_blob *e) { return e->data; }
size_t cached_blob_size(const cached_blob *e) { return e->size; }

void blobcache_free(blobcache *c) {
  if (!c) return;
  for (int i = 0; i < SHARDS; i++) {
    struct shard *s = &c->shards[i];
    while (s->oldest) unlink_entry(s, s->oldest);
    free(s->buckets);
    pthread_mutex_destroy(&s->lock);
  }
  free(c);
}
