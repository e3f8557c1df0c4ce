/* The http store: a read-only origin (an existing web server or CDN holding the files under
 * url/KEY). HEAD tells existence and size, ranged GETs read, redirects point at the origin. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "store/s3_client.h"
#include "store/internal.h"

#define BREAKER_MS 2000

struct http_store {
  char base[2048]; /* url with a trailing '/' */
  long connect_timeout_ms, timeout_ms;
  unsigned retries;
  atomic_uint_fast64_t down_until_ms;
};

static struct http_store *http_of(br_store *st) { return st->impl; }

static int http_open(br_store *st, br_err *err) {
  const char *url = st->cfg.url;
  if (strncasecmp(url, "http://", 7) && strncasecmp(url, "https://", 8))
    return br_fail(err, "store %s: url '%s' must start with http:// or https://", st->cfg.name,
                   url);
  struct http_store *hs = calloc(1, sizeof *hs);
  if (!hs) return br_fail(err, "out of memory");
  size_t len = strlen(url);
  if (len + 2 > sizeof hs->base) {
    free(hs);
    return br_fail(err, "store %s: url too long", st->cfg.name);
  }
  snprintf(hs->base, sizeof hs->base, "%s%s", url, len && url[len - 1] == '/' ? "" : "/");
  hs->connect_timeout_ms = (long)st->cfg.connect_timeout_ms;
  hs->timeout_ms = (long)st->cfg.timeout_ms;
  hs->retries = (unsigned)st->cfg.retries;
  st->impl = hs;
  return 0;
}

static void http_close(br_store *st) { free(http_of(st)); }

static int object_url(br_store *st, const char *key, char *out, size_t outlen, br_err *err) {
  char enc[3200];
  if (!br_sigv4_uri_encode(key, 1, enc, sizeof enc)) return br_fail(err, "key too long");
  int n = snprintf(out, outlen, "%s%s", http_of(st)->base, enc);
  if (n < 0 || (size_t)n >= outlen) return br_fail(err, "store %s: URL too long", st->cfg.name);
  return 0;
}

struct sink {
  char *buf;
  size_t cap, len;
  int overflow;
};

static size_t on_write(char *data, size_t size, size_t nmemb, void *ud) {
  struct sink *s = ud;
  size_t n = size * nmemb;
  if (!s->buf) return n; /* a body we do not want (an error page) */
  if (s->len + n > s->cap) {
    s->overflow = 1;
    return 0;
  }
  memcpy(s->buf + s->len, data, n);
  s->len += n;
  return n;
}

/* HEAD of key with retries of transport errors and 5xx. Returns 0 with *status and *length
 * (UINT64_MAX when absent), or -1 with err. */
static int origin_head(br_store *st, const char *key, long *status, uint64_t *length, br_err *err) {
  struct http_store *hs = http_of(st);
  if (br_now_ms() < atomic_load(&hs->down_until_ms))
    return br_fail(err, "store %s: the origin is unreachable (retrying in a moment)", st->cfg.name);
  char url[4096];
  if (object_url(st, key, url, sizeof url, err) < 0) return -1;
  for (unsigned attempt = 0;; attempt++) {
    CURL *h = s3_curl_handle();
    if (!h) return br_fail(err, "cannot create a curl handle");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, hs->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, hs->timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    CURLcode rc = curl_easy_perform(h);
    *status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    if (rc != CURLE_OK) {
      if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST)
        atomic_store(&hs->down_until_ms, br_now_ms() + BREAKER_MS);
      if (attempt >= hs->retries || rc == CURLE_COULDNT_CONNECT)
        return br_fail(err, "store %s: HEAD %s: %s", st->cfg.name, url, curl_easy_strerror(rc));
      continue;
    }
    atomic_store(&hs->down_until_ms, 0);
    if (*status >= 500 && attempt < hs->retries) continue;
    curl_off_t cl = -1;
    curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
    *length = cl < 0 ? UINT64_MAX : (uint64_t)cl;
    return 0;
  }
}

static int http_stat(br_store *st, const char *key, uint64_t *size, br_err *err) {
  long status = 0;
  uint64_t length = UINT64_MAX;
  if (origin_head(st, key, &status, &length, err) < 0) return -1;
  if (status == 404 || status == 410) return 1;
  if (status != 200) return br_fail(err, "store %s: HEAD %s: HTTP %ld", st->cfg.name, key, status);
  if (length == UINT64_MAX)
    return br_fail(err, "store %s: HEAD %s: no Content-Length", st->cfg.name, key);
  *size = length;
  return 0;
}

struct origin_source {
  br_source base;
  br_store *st;
  char key[1100];
};

static int origin_pread(br_source *src, void *buf, size_t len, uint64_t off, br_err *err) {
  struct origin_source *os = (struct origin_source *)src;
  if (off > src->size || len > src->size - off)
    return br_fail(err, "%s: read past the end", os->key);
  if (!len) return 0;
  struct http_store *hs = http_of(os->st);
  char url[4096], range[80];
  if (object_url(os->st, os->key, url, sizeof url, err) < 0) return -1;
  for (unsigned attempt = 0;; attempt++) {
    CURL *h = s3_curl_handle();
    if (!h) return br_fail(err, "cannot create a curl handle");
    struct sink s = {.buf = buf, .cap = len};
    snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, off, off + len - 1);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, hs->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, hs->timeout_ms);
    curl_easy_setopt(h, CURLOPT_RANGE, range);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (rc == CURLE_OK && (status == 206 || (status == 200 && off == 0 && len == src->size)) &&
        s.len == len)
      return 0;
    if (attempt < hs->retries && (rc != CURLE_OK || status >= 500)) continue;
    if (rc != CURLE_OK)
      return br_fail(err, "store %s: GET %s: %s", os->st->cfg.name, url, curl_easy_strerror(rc));
    return br_fail(err, "store %s: GET %s (%s): HTTP %ld, %zu bytes", os->st->cfg.name, url, range,
                   status, s.len);
  }
}

static void origin_close(br_source *src) { free(src); }

static int http_open_read(br_store *st, const char *key, br_store_reader *out, br_err *err) {
  uint64_t size = 0;
  int rc = http_stat(st, key, &size, err);
  if (rc != 0) return rc;
  struct origin_source *os = calloc(1, sizeof *os);
  if (!os) return br_fail(err, "out of memory");
  os->base.size = size;
  os->base.pread = origin_pread;
  os->base.close = origin_close;
  os->st = st;
  snprintf(os->key, sizeof os->key, "%s", key);
  out->fd = -1;
  out->size = size;
  out->source = &os->base;
  return 0;
}

static br_store_writer *http_write_begin(br_store *st, br_err *err) {
  br_fail(err, "store %s: an http origin is read-only", st->cfg.name);
  return NULL;
}

static int http_write(br_store_writer *w, const void *buf, size_t len, br_err *err) {
  (void)w, (void)buf, (void)len;
  return br_fail(err, "read-only store");
}

static int http_write_commit(br_store_writer *w, const char *key, br_err *err) {
  (void)w, (void)key;
  return br_fail(err, "read-only store");
}

static void http_write_abort(br_store_writer *w) { (void)w; }

static int http_redirect_url(br_store *st, const char *key, int attachment,
                             const char *content_type, char *out, size_t outlen, uint64_t *valid_ms,
                             br_err *err) {
  (void)content_type; /* the origin names its own type */
  *valid_ms = UINT64_MAX;
  if (attachment) return 1; /* the origin sets its own headers: proxy instead */
  const char *pub = st->cfg.public_url;
  if (pub && *pub) {
    size_t plen = strlen(pub);
    int n = snprintf(out, outlen, "%s%s%s", pub, plen && pub[plen - 1] == '/' ? "" : "/", key);
    if (n < 0 || (size_t)n >= outlen) return br_fail(err, "redirect URL too long");
    return 0;
  }
  return object_url(st, key, out, outlen, err);
}

static int http_fetch_url(br_store *st, const char *key, char *out, size_t outlen, br_err *err) {
  return object_url(st, key, out, outlen, err);
}

static int http_remove(br_store *st, const char *key, br_err *err) {
  (void)key;
  return br_fail(err, "store %s: an http origin is read-only", st->cfg.name);
}

static int http_list(br_store *st, const char *prefix, br_store_list_fn fn, void *ud, br_err *err) {
  (void)prefix, (void)fn, (void)ud;
  return br_fail(err, "store %s: an http origin cannot be listed", st->cfg.name);
}

/* Any HTTP answer below 500 from the base URL means the origin is there. */
static int http_check(br_store *st, br_err *err) {
  struct http_store *hs = http_of(st);
  CURL *h = s3_curl_handle();
  if (!h) return br_fail(err, "cannot create a curl handle");
  curl_easy_setopt(h, CURLOPT_URL, hs->base);
  curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, hs->connect_timeout_ms);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, hs->connect_timeout_ms * 2);
  CURLcode rc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (rc != CURLE_OK) {
    atomic_store(&hs->down_until_ms, br_now_ms() + BREAKER_MS);
    return br_fail(err, "store %s: %s: %s", st->cfg.name, hs->base, curl_easy_strerror(rc));
  }
  atomic_store(&hs->down_until_ms, 0);
  if (status >= 500)
    return br_fail(err, "store %s: %s answers HTTP %ld", st->cfg.name, hs->base, status);
  return 0;
}

static int http_unavailable(br_store *st) {
  return br_now_ms() < atomic_load(&http_of(st)->down_until_ms);
}

const struct store_ops br_store_http_ops = {
    .kind = "http",
    .open = http_open,
    .close = http_close,
    .write_begin = http_write_begin,
    .write = http_write,
    .write_commit = http_write_commit,
    .write_abort = http_write_abort,
    .open_read = http_open_read,
    .stat = http_stat,
    .redirect_url = http_redirect_url,
    .remove = http_remove,
    .list = http_list,
    .fetch_url = http_fetch_url,
    .check = http_check,
    .unavailable = http_unavailable,
};
