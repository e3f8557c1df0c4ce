/* Iceberg over HTTP: the REST catalog's load-table call and plain metadata.json URLs (libcurl). */
#include <curl/curl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "iceberg/internal.h"
#include "iceberg/rest.h"

#define REST_TIMEOUT_S 60L

typedef struct body {
  uint8_t *data;
  size_t len;
  size_t max;
  int too_big;
} body;

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud) {
  body *b = ud;
  size_t n = size * nmemb;
  if (n > b->max - b->len) {
    b->too_big = 1;
    return 0;
  }
  uint8_t *nd = realloc(b->data, b->len + n + 1);
  if (!nd) return 0;
  b->data = nd;
  memcpy(b->data + b->len, ptr, n);
  b->len += n;
  b->data[b->len] = 0;
  return n;
}

int ice_http_get(const char *url, const char *token, size_t max, uint8_t **out, size_t *outlen,
                 long *status, br_err *err) {
  int rc = -1;
  body b = {NULL, 0, max, 0};
  struct curl_slist *hdrs = NULL;
  char auth[1024];
  CURL *c = curl_easy_init();
  if (!c) return br_fail(err, "cannot initialise libcurl");
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, REST_TIMEOUT_S);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  hdrs = curl_slist_append(hdrs, "Accept: application/json");
  if (token && *token) {
    if ((size_t)snprintf(auth, sizeof auth, "Authorization: Bearer %s", token) >= sizeof auth) {
      br_fail(err, "catalog token is too long");
      goto fail;
    }
    hdrs = curl_slist_append(hdrs, auth);
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  CURLcode cr = curl_easy_perform(c);
  if (b.too_big) {
    br_fail(err, "%s: response larger than %zu bytes", url, max);
    goto fail;
  }
  if (cr != CURLE_OK) {
    br_fail(err, "%s: %s", url, curl_easy_strerror(cr));
    goto fail;
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
  if (!b.data) {
    b.data = malloc(1);
    if (!b.data) {
      br_fail(err, "out of memory");
      goto fail;
    }
    b.data[0] = 0;
  }
  *out = b.data;
  *outlen = b.len;
  b.data = NULL;
  rc = 0;
fail:
  free(b.data);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(c);
  return rc;
}

/* Appends s percent-encoded (everything but unreserved characters) to out. */
static int append_enc(char *out, size_t outlen, size_t *pos, const char *s, size_t n) {
  static const char hexd[] = "0123456789ABCDEF";
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    int plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                ch == '-' || ch == '_' || ch == '.' || ch == '~';
    if (*pos + 4 >= outlen) return -1;
    if (plain) {
      out[(*pos)++] = (char)ch;
    } else {
      out[(*pos)++] = '%';
      out[(*pos)++] = hexd[ch >> 4];
      out[(*pos)++] = hexd[ch & 15];
    }
  }
  out[*pos] = 0;
  return 0;
}

/* Error text from a REST error body {"error":{"message":...}}, or "". */
static const char *rest_message(json_t *j) {
  json_t *m = json_object_get(json_object_get(j, "error"), "message");
  return json_is_string(m) ? json_string_value(m) : "";
}

int ice_rest_load(const char *spec, const char *token, ice_meta *m, br_err *err) {
  int rc = -1;
  char base[2048], url[8192];
  uint8_t *resp = NULL;
  size_t resp_len = 0;
  long status = 0;
  json_t *j = NULL;
  char *text = NULL;
  const char *hash = strrchr(spec, '#');
  if (strncmp(spec, "rest:", 5) != 0 || !hash || hash == spec + 5 || hash[1] == 0)
    return br_fail(err, "REST table must be rest:URI#namespace.table");
  size_t ulen = (size_t)(hash - (spec + 5));
  while (ulen > 0 && spec[5 + ulen - 1] == '/') ulen--;
  if (ulen >= sizeof base) return br_fail(err, "REST catalog URI too long");
  memcpy(base, spec + 5, ulen);
  base[ulen] = 0;
  const char *ident = hash + 1;
  const char *dot = strrchr(ident, '.');
  if (!dot || dot == ident || dot[1] == 0)
    return br_fail(err, "REST table '%s' must be namespace.table", ident);

  /* GET /v1/config: the prefix comes from overrides, else defaults. */
  char prefix[1024] = "";
  snprintf(url, sizeof url, "%s/v1/config", base);
  if (ice_http_get(url, token, 1u << 20, &resp, &resp_len, &status, err) != 0) goto fail;
  if (status == 200) {
    json_error_t je;
    j = json_loadb((const char *)resp, resp_len, 0, &je);
    if (!json_is_object(j)) {
      br_fail(err, "%s: invalid JSON", url);
      goto fail;
    }
    json_t *p = json_object_get(json_object_get(j, "overrides"), "prefix");
    if (!json_is_string(p)) p = json_object_get(json_object_get(j, "defaults"), "prefix");
    if (json_is_string(p) && json_string_length(p) < sizeof prefix)
      snprintf(prefix, sizeof prefix, "%s", json_string_value(p));
    json_decref(j);
    j = NULL;
  } else if (status != 404) {
    br_fail(err, "%s: HTTP %ld", url, status);
    goto fail;
  }
  free(resp);
  resp = NULL;

  /* GET /v1/{prefix}/namespaces/{ns}/tables/{table}; namespace levels joined by 0x1F. */
  size_t pos = (size_t)snprintf(url, sizeof url, "%s/v1/", base);
  if (*prefix) {
    if (append_enc(url, sizeof url, &pos, prefix, strlen(prefix)) != 0) goto toolong;
    url[pos++] = '/';
  }
  memcpy(url + pos, "namespaces/", 12);
  pos += 11;
  for (const char *s = ident; s < dot;) {
    const char *e = memchr(s, '.', (size_t)(dot - s));
    if (!e) e = dot;
    if (s != ident && append_enc(url, sizeof url, &pos, "\x1f", 1) != 0) goto toolong;
    if (append_enc(url, sizeof url, &pos, s, (size_t)(e - s)) != 0) goto toolong;
    s = e + 1;
  }
  if (pos + 8 >= sizeof url) goto toolong;
  memcpy(url + pos, "/tables/", 9);
  pos += 8;
  if (append_enc(url, sizeof url, &pos, dot + 1, strlen(dot + 1)) != 0) goto toolong;
  if (ice_http_get(url, token, ICE_MAX_METADATA, &resp, &resp_len, &status, err) != 0) goto fail;
  json_error_t je;
  j = json_loadb((const char *)resp, resp_len, 0, &je);
  if (status != 200) {
    br_fail(err, "%s: HTTP %ld %s", url, status, rest_message(j));
    goto fail;
  }
  json_t *md = json_object_get(j, "metadata");
  if (!json_is_object(md)) {
    br_fail(err, "%s: response has no metadata object", url);
    goto fail;
  }
  text = json_dumps(md, JSON_COMPACT);
  if (!text) {
    br_fail(err, "out of memory");
    goto fail;
  }
  rc = ice_meta_parse((const uint8_t *)text, strlen(text), m, err);
  goto fail;
toolong:
  br_fail(err, "REST URL too long");
fail:
  free(text);
  json_decref(j);
  free(resp);
  return rc;
}
