/* The S3 opener for Iceberg table files: one read-only s3 store per bucket a table names, all with
 * the configured store's endpoint and credentials; each file is a source of ranged GETs. */
#include "blobref/iceberg_s3.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BUCKETS 16

struct br_iceberg_s3 {
  br_store_config base;
  pthread_mutex_t lock;
  struct {
    char bucket[64];
    br_store *store;
  } buckets[MAX_BUCKETS];
  int nbuckets;
};

br_iceberg_s3 *br_iceberg_s3_new(const br_store_config *store, br_err *err) {
  if (strcmp(store->kind, "s3") != 0) {
    br_fail(err, "store %s is not of kind s3", store->name);
    return NULL;
  }
  br_iceberg_s3 *o = calloc(1, sizeof *o);
  if (!o) {
    br_fail(err, "out of memory");
    return NULL;
  }
  o->base = *store;
  o->base.read_only = 1;
  o->base.prefix = "";
  pthread_mutex_init(&o->lock, NULL);
  return o;
}

void br_iceberg_s3_free(br_iceberg_s3 *o) {
  if (!o) return;
  for (int i = 0; i < o->nbuckets; i++) br_store_close(o->buckets[i].store);
  pthread_mutex_destroy(&o->lock);
  free(o);
}

/* The store for bucket, opened on first use. */
static br_store *bucket_store(br_iceberg_s3 *o, const char *bucket, br_err *err) {
  pthread_mutex_lock(&o->lock);
  br_store *st = NULL;
  for (int i = 0; i < o->nbuckets && !st; i++)
    if (!strcmp(o->buckets[i].bucket, bucket)) st = o->buckets[i].store;
  if (!st) {
    if (o->nbuckets == MAX_BUCKETS) {
      br_fail(err, "tables name more than %d buckets", MAX_BUCKETS);
    } else {
      br_store_config c = o->base;
      c.bucket = (char *)bucket;
      st = br_store_open(&c, err);
      if (st) {
        snprintf(o->buckets[o->nbuckets].bucket, sizeof o->buckets[0].bucket, "%s", bucket);
        o->buckets[o->nbuckets++].store = st;
      }
    }
  }
  pthread_mutex_unlock(&o->lock);
  return st;
}

/* The part after "s3://" (or s3a://, s3n://), or NULL for another scheme. */
static const char *s3_rest(const char *path) {
  static const char *const schemes[] = {"s3://", "s3a://", "s3n://"};
  for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++)
    if (!strncmp(path, schemes[i], strlen(schemes[i]))) return path + strlen(schemes[i]);
  return NULL;
}

/* Splits "BUCKET/KEY" into bucket (NUL-terminated) and returns KEY (NULL + err when malformed). */
static const char *split_bucket(const char *path, const char *rest, char bucket[64], br_err *err) {
  const char *slash = strchr(rest, '/');
  if (!slash || slash == rest || (size_t)(slash - rest) >= 64 || !slash[1]) {
    br_fail(err, "%s: not s3://BUCKET/KEY", path);
    return NULL;
  }
  memcpy(bucket, rest, (size_t)(slash - rest));
  bucket[slash - rest] = '\0';
  return slash + 1;
}

int br_iceberg_s3_list(br_iceberg_s3 *o, const char *url_prefix, br_store_list_fn fn, void *ud,
                       br_err *err) {
  const char *rest = s3_rest(url_prefix);
  if (!rest) return br_fail(err, "%s: not an s3:// URL", url_prefix);
  char bucket[64];
  const char *key = split_bucket(url_prefix, rest, bucket, err);
  if (!key) return -1;
  br_store *st = bucket_store(o, bucket, err);
  if (!st) return -1;
  return br_store_list(st, key, fn, ud, err);
}

br_source *br_iceberg_open_s3(void *ud, const char *path, br_err *err) {
  br_iceberg_s3 *o = ud;
  const char *rest = s3_rest(path);
  if (!rest) return br_iceberg_open_local(NULL, path, err);
  char bucket[64];
  const char *key = split_bucket(path, rest, bucket, err);
  if (!key) return NULL;
  br_store *st = bucket_store(o, bucket, err);
  if (!st) return NULL;
  br_store_reader r;
  int rc = br_store_open_read(st, key, &r, err);
  if (rc != 0) {
    if (rc > 0) br_fail(err, "%s: no such object", path);
    return NULL;
  }
  return r.source; /* fd is -1 for s3: the source owns everything */
}
