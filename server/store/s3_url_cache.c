/* Presigned-URL cache of an S3 store: a two-way set-associative hash table of key -> URL with one
 * mutex per set, so that a redirect to an object signed less than half a TTL ago costs a hash, a
 * key compare and a copy instead of a SigV4 signature. */
#include "store/s3_url_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAYS 2

/* One cached URL; text is "query\0key\0url\0" (malloc'd, owned by the entry; klen counts
 * "query\0key", the cache's key), NULL when empty. */
struct entry {
  uint64_t hash;
  uint64_t expires_ms; /* X-Amz-Date + X-Amz-Expires, in ms since the epoch */
  uint64_t signed_ms;  /* X-Amz-Date in ms: a clock that went back past it makes the URL stale */
  size_t klen, ulen;
  char *text;
};

struct set {
  pthread_mutex_t lock;
  struct entry way[WAYS];
  uint64_t hits, signs; /* under lock */
};

struct s3_url_cache {
  size_t mask; /* sets - 1 */
  struct set *sets;
};

/* FNV-1a, 64 bits. */
static uint64_t hash_key(const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
  return h;
}

s3_url_cache *s3_url_cache_new(size_t entries) {
  size_t sets = 1;
  while (sets * WAYS < entries) sets *= 2;
  s3_url_cache *c = calloc(1, sizeof *c);
  if (c) c->sets = calloc(sets, sizeof *c->sets);
  if (!c || !c->sets) {
    free(c);
    return NULL;
  }
  c->mask = sets - 1;
  for (size_t i = 0; i < sets; i++) pthread_mutex_init(&c->sets[i].lock, NULL);
  return c;
}

void s3_url_cache_free(s3_url_cache *c) {
  if (!c) return;
  for (size_t i = 0; i <= c->mask; i++) {
    for (int w = 0; w < WAYS; w++) free(c->sets[i].way[w].text);
    pthread_mutex_destroy(&c->sets[i].lock);
  }
  free(c->sets);
  free(c);
}

void s3_url_cache_stats(s3_url_cache *c, uint64_t *hits, uint64_t *signs) {
  *hits = *signs = 0;
  for (size_t i = 0; c && i <= c->mask; i++) {
    pthread_mutex_lock(&c->sets[i].lock);
    *hits += c->sets[i].hits;
    *signs += c->sets[i].signs;
    pthread_mutex_unlock(&c->sets[i].lock);
  }
}

/* The way of s holding key, or NULL (lock held). */
static struct entry *find(struct set *s, uint64_t h, const char *key, size_t klen) {
  for (int w = 0; w < WAYS; w++) {
    struct entry *e = &s->way[w];
    if (e->text && e->hash == h && e->klen == klen && !memcmp(e->text, key, klen)) return e;
  }
  return NULL;
}

/* Copies the cached URL of key into url when it still works for at least min_ms after now_ms;
 * returns how long it works, or 0 (not cached, too old, or url too small). */
static uint64_t lookup(struct set *s, uint64_t h, const char *key, size_t klen, uint64_t now_ms,
                       uint64_t min_ms, char *url, size_t urllen) {
  uint64_t left = 0;
  pthread_mutex_lock(&s->lock);
  const struct entry *e = find(s, h, key, klen);
  if (e && e->signed_ms <= now_ms && e->expires_ms > now_ms && e->expires_ms - now_ms >= min_ms &&
      e->ulen < urllen) {
    memcpy(url, e->text + klen + 1, e->ulen + 1);
    left = e->expires_ms - now_ms;
    s->hits++;
  }
  pthread_mutex_unlock(&s->lock);
  return left;
}

/* Puts key -> url in s: over key's old entry, else an empty way, else the way that expires
 * first. The text is allocated before the lock and the evicted one freed after it. */
static void store(struct set *s, uint64_t h, const char *key, size_t klen, const char *url,
                  uint64_t signed_ms, uint64_t expires_ms) {
  size_t ulen = strlen(url);
  char *text = malloc(klen + ulen + 2);
  pthread_mutex_lock(&s->lock);
  s->signs++;
  if (!text) {
    pthread_mutex_unlock(&s->lock);
    return;
  }
  struct entry *e = find(s, h, key, klen);
  for (int w = 0; !e && w < WAYS; w++)
    if (!s->way[w].text) e = &s->way[w];
  if (!e) e = s->way[0].expires_ms <= s->way[1].expires_ms ? &s->way[0] : &s->way[1];
  char *old = e->text;
  memcpy(text, key, klen + 1);
  memcpy(text + klen + 1, url, ulen + 1);
  *e = (struct entry){.hash = h,
                      .expires_ms = expires_ms,
                      .signed_ms = signed_ms,
                      .klen = klen,
                      .ulen = ulen,
                      .text = text};
  pthread_mutex_unlock(&s->lock);
  free(old);
}

int s3_url_cache_presign(s3_url_cache *c, s3_target *t, const char *key, const char *query,
                         uint64_t now_ms, uint64_t ttl_s, char *url, size_t urllen,
                         uint64_t *valid_ms, br_err *err) {
  uint64_t ttl_ms = ttl_s * 1000;
  if (!query) query = "";
  /* the cache's key is "query\0key": the whole signed query, not the object key alone */
  size_t qlen = strlen(query), olen = strlen(key), klen = qlen + 1 + olen;
  char ck[4096];
  if (klen >= sizeof ck) return br_fail(err, "store %s: key too long for a URL", t->name);
  memcpy(ck, query, qlen + 1);
  memcpy(ck + qlen + 1, key, olen + 1);
  uint64_t h = hash_key(ck, klen);
  struct set *s = c ? &c->sets[h & c->mask] : NULL;
  uint64_t left = s ? lookup(s, h, ck, klen, now_ms, ttl_ms - ttl_ms / 2, url, urllen) : 0;
  if (left) {
    *valid_ms = left;
    return 0;
  }
  time_t now_s = (time_t)(now_ms / 1000);
  if (s3_presign_get_at(t, key, query, now_s, ttl_s, url, urllen, err) < 0) return -1;
  uint64_t signed_ms = (uint64_t)now_s * 1000;
  *valid_ms = signed_ms + ttl_ms - now_ms;
  if (s) store(s, h, ck, klen, url, signed_ms, signed_ms + ttl_ms);
  return 0;
}
