/* Delta tables in S3: `_delta_log/` listed through the Iceberg S3 opener's per-bucket stores. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blobref/iceberg_s3.h"
#include "delta/internal.h"

typedef struct list_ctx {
  size_t skip; /* length of the listed key prefix */
  char **names;
  size_t n, cap;
  int oom, too_many;
} list_ctx;

static int on_key(void *ud, const char *key, uint64_t size) {
  (void)size;
  list_ctx *c = ud;
  const char *name = key + c->skip;
  if (strlen(key) <= c->skip || strchr(name, '/')) return 0; /* _sidecars/..., deeper keys */
  if (c->n == DL_MAX_LOG_FILES) return c->too_many = 1, 1;
  if (c->n == c->cap) {
    size_t nc = c->cap ? c->cap * 2 : 64;
    char **nv = realloc(c->names, nc * sizeof *nv);
    if (!nv) return c->oom = 1, 1;
    c->names = nv;
    c->cap = nc;
  }
  if (!(c->names[c->n] = strdup(name))) return c->oom = 1, 1;
  c->n++;
  return 0;
}

/* The key prefix of log_dir ("s3://b/k/_delta_log" -> "k/_delta_log/") as a URL with a slash. */
static int log_prefix(const char *log_dir, char *url, size_t urllen, size_t *skip, br_err *err) {
  if ((size_t)snprintf(url, urllen, "%s/", log_dir) >= urllen)
    return br_fail(err, "%s: too long", log_dir);
  const char *p = strstr(url, "://");
  p = p ? strchr(p + 3, '/') : NULL;
  if (!p) return br_fail(err, "%s: not s3://BUCKET/KEY", log_dir);
  *skip = strlen(p + 1);
  return 0;
}

int br_delta_list_s3(void *ud, const char *log_dir, char ***names, size_t *n, br_err *err) {
  char url[DL_MAX_PATH + 2];
  list_ctx c = {0};
  if (log_prefix(log_dir, url, sizeof url, &c.skip, err) != 0) return -1;
  int rc = br_iceberg_s3_list(ud, url, on_key, &c, err);
  if (rc != 0 || c.oom || c.too_many) {
    for (size_t i = 0; i < c.n; i++) free(c.names[i]);
    free(c.names);
    if (c.oom) return br_fail(err, "out of memory");
    if (c.too_many) return br_fail(err, "%s: more than %d files", log_dir, DL_MAX_LOG_FILES);
    return rc == -1 ? -1 : br_fail(err, "%s: listing failed", log_dir);
  }
  *names = c.names;
  *n = c.n;
  return 0;
}

static int stop_at_first(void *ud, const char *key, uint64_t size) {
  (void)key, (void)size;
  *(int *)ud = 1;
  return 1;
}

int br_delta_s3_is_table(void *ud, const char *location) {
  char url[DL_MAX_PATH + 2];
  size_t n = strlen(location);
  while (n > 0 && location[n - 1] == '/') n--;
  if ((size_t)snprintf(url, sizeof url, "%.*s/_delta_log/", (int)n, location) >= sizeof url)
    return 0;
  int found = 0;
  br_err err;
  br_iceberg_s3_list(ud, url, stop_at_first, &found, &err);
  return found;
}
