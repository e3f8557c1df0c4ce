/* S3 requests over libcurl: addressing, SigV4 signing, bounded retries with jittered backoff,
 * S3 error documents, and a circuit breaker for unreachable endpoints. */
#include "store/s3_client.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define MAX_KEPT_BODY (4u << 20)
#define BREAKER_MS 2000 /* how long an unreachable endpoint fails fast */

static pthread_key_t curl_key;
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_handle_free(void *h) { curl_easy_cleanup(h); }
static void curl_key_make(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  pthread_key_create(&curl_key, curl_handle_free);
}

CURL *s3_curl_handle(void) {
  pthread_once(&curl_once, curl_key_make);
  CURL *h = pthread_getspecific(curl_key);
  if (!h) {
    h = curl_easy_init();
    if (h) pthread_setspecific(curl_key, h);
  } else {
    curl_easy_reset(h);
  }
  return h;
}

static int copy_str(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src ? src : "");
  if (n >= cap) return -1;
  memcpy(dst, src ? src : "", n + 1);
  return 0;
}

int s3_target_init(s3_target *t, const s3_target_options *o, br_err *err) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", o->name ? o->name : "s3");
  const char *ep = o->endpoint ? o->endpoint : "";
  const char *rest = strstr(ep, "://");
  if (!rest) return br_fail(err, "store %s: endpoint '%s' needs http:// or https://", t->name, ep);
  size_t slen = (size_t)(rest - ep);
  if (slen >= sizeof t->scheme || (strncasecmp(ep, "http", slen) && strncasecmp(ep, "https", slen)))
    return br_fail(err, "store %s: endpoint '%s' must be http or https", t->name, ep);
  memcpy(t->scheme, ep, slen);
  t->scheme[slen] = '\0';
  for (char *p = t->scheme; *p; p++) *p = (char)(*p | 0x20);
  rest += 3;
  size_t hlen = strcspn(rest, "/");
  if (!hlen || hlen >= sizeof t->host || (rest[hlen] && strcmp(rest + hlen, "/")))
    return br_fail(err, "store %s: endpoint '%s' must be scheme://host[:port] with no path",
                   t->name, ep);
  memcpy(t->host, rest, hlen);
  t->host[hlen] = '\0';
  size_t blen = strlen(o->bucket ? o->bucket : "");
  if (blen < 3 || blen > 63 || copy_str(t->bucket, sizeof t->bucket, o->bucket) < 0)
    return br_fail(err, "store %s: bucket must have 3 to 63 characters", t->name);
  for (const char *p = t->bucket; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' ||
          *p == '_'))
      return br_fail(err, "store %s: bucket '%s' has a character S3 does not allow", t->name,
                     t->bucket);
  t->path_style = o->path_style;
  const char *ak = o->access_key && *o->access_key ? o->access_key : getenv("AWS_ACCESS_KEY_ID");
  const char *sk =
      o->secret_key && *o->secret_key ? o->secret_key : getenv("AWS_SECRET_ACCESS_KEY");
  const char *tok =
      o->access_key && *o->access_key ? o->session_token : getenv("AWS_SESSION_TOKEN");
  if (!ak || !*ak || !sk || !*sk)
    return br_fail(err,
                   "store %s: no credentials (access_key/secret_key, or AWS_ACCESS_KEY_ID and "
                   "AWS_SECRET_ACCESS_KEY)",
                   t->name);
  br_err e2;
  if (br_sigv4_init(&t->signer, ak, sk, tok, o->region && *o->region ? o->region : "us-east-1",
                    "s3", &e2) < 0)
    return br_fail(err, "store %s: %s", t->name, e2.msg);
  t->connect_timeout_ms = (long)(o->connect_timeout_ms ? o->connect_timeout_ms : 2000);
  t->timeout_ms = (long)(o->timeout_ms ? o->timeout_ms : 60000);
  t->stall_ms = (long)(o->stall_ms ? o->stall_ms : 10000);
  t->max_retries = o->max_retries;
  return 0;
}

void s3_target_destroy(s3_target *t) { br_sigv4_destroy(&t->signer); }

int s3_target_down(s3_target *t) { return br_now_ms() < atomic_load(&t->down_until_ms); }

int s3_target_locate(const s3_target *t, const char *key, char *host, size_t hostlen, char *path,
                     size_t pathlen) {
  char enc[3200] = "";
  if (key && *key && !br_sigv4_uri_encode(key, 1, enc, sizeof enc)) return -1;
  int n, m;
  if (t->path_style) {
    n = snprintf(host, hostlen, "%s", t->host);
    m = snprintf(path, pathlen, "/%s%s%s", t->bucket, key ? "/" : "/", enc);
  } else {
    n = snprintf(host, hostlen, "%s.%s", t->bucket, t->host);
    m = snprintf(path, pathlen, "/%s", enc);
  }
  return n < 0 || (size_t)n >= hostlen || m < 0 || (size_t)m >= pathlen ? -1 : 0;
}

int s3_presign_get(s3_target *t, const char *key, uint64_t ttl_s, char *url, size_t urllen,
                   br_err *err) {
  return s3_presign_get_at(t, key, "", time(NULL), ttl_s, url, urllen, err);
}

/* The presigned URL of method on key with the query (already encoded, "" for none) and the
 * signed headers, for payload_hash: 0, or -1 (err). */
static int presign(s3_target *t, const char *method, const char *key, const char *query,
                   const br_sigv4_header *headers, size_t nheaders, const char *payload_hash,
                   time_t now_s, uint64_t ttl_s, char *url, size_t urllen, br_err *err) {
  char host[320], path[3400], signed_query[6000];
  if (s3_target_locate(t, key, host, sizeof host, path, sizeof path) < 0)
    return br_fail(err, "store %s: key too long for a URL", t->name);
  br_sigv4_request sr = {.method = method,
                         .host = host,
                         .path = path,
                         .query = query,
                         .headers = headers,
                         .nheaders = nheaders,
                         .payload_hash = payload_hash};
  if (br_sigv4_presign(&t->signer, &sr, now_s, ttl_s, signed_query, sizeof signed_query, err) < 0)
    return -1;
  int n = snprintf(url, urllen, "%s://%s%s?%s", t->scheme, host, path, signed_query);
  if (n < 0 || (size_t)n >= urllen)
    return br_fail(err, "store %s: presigned URL too long", t->name);
  return 0;
}

int s3_presign_get_at(s3_target *t, const char *key, const char *query, time_t now_s,
                      uint64_t ttl_s, char *url, size_t urllen, br_err *err) {
  return presign(t, "GET", key, query ? query : "", NULL, 0, BR_SIGV4_UNSIGNED, now_s, ttl_s, url,
                 urllen, err);
}

int s3_presign_query_at(s3_target *t, const char *method, const char *key, const char *query,
                        const br_sigv4_header *headers, size_t nheaders, const char *payload_hash,
                        time_t now_s, uint64_t ttl_s, char *url, size_t urllen, br_err *err) {
  return presign(t, method, key, query, headers, nheaders, payload_hash, now_s, ttl_s, url, urllen,
                 err);
}

int s3_presign_at(s3_target *t, const char *method, const char *key, const br_sigv4_header *headers,
                  size_t nheaders, const char *payload_hash, time_t now_s, uint64_t ttl_s,
                  char *url, size_t urllen, br_err *err) {
  return presign(t, method, key, "", headers, nheaders, payload_hash, now_s, ttl_s, url, urllen,
                 err);
}

/* ---- XML ------------------------------------------------------------------------------------ */

static size_t xml_decode(const char *s, size_t len, char *out, size_t outlen) {
  size_t w = 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (c == '&') {
      static const struct {
        const char *name;
        char c;
      } ents[] = {{"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"apos;", '\''}};
      int done = 0;
      for (size_t k = 0; k < sizeof ents / sizeof ents[0] && !done; k++) {
        size_t el = strlen(ents[k].name);
        if (len - i - 1 >= el && !memcmp(s + i + 1, ents[k].name, el)) {
          c = ents[k].c;
          i += el;
          done = 1;
        }
      }
      if (!done && i + 2 < len && s[i + 1] == '#') {
        size_t j = i + 2;
        int hex = s[j] == 'x';
        if (hex) j++;
        unsigned long v = 0;
        size_t digits = 0;
        for (; j < len && s[j] != ';' && digits < 8; j++, digits++) {
          char d = s[j];
          int dv = d >= '0' && d <= '9'                        ? d - '0'
                   : hex && (d | 32) >= 'a' && (d | 32) <= 'f' ? (d | 32) - 'a' + 10
                                                               : -1;
          if (dv < 0) break;
          v = v * (hex ? 16 : 10) + (unsigned long)dv;
        }
        if (j < len && s[j] == ';' && digits && v && v < 0x110000) {
          char tmp[4];
          size_t n;
          if (v < 0x80)
            tmp[0] = (char)v, n = 1;
          else if (v < 0x800)
            tmp[0] = (char)(0xc0 | v >> 6), tmp[1] = (char)(0x80 | (v & 63)), n = 2;
          else if (v < 0x10000)
            tmp[0] = (char)(0xe0 | v >> 12), tmp[1] = (char)(0x80 | (v >> 6 & 63)),
            tmp[2] = (char)(0x80 | (v & 63)), n = 3;
          else
            tmp[0] = (char)(0xf0 | v >> 18), tmp[1] = (char)(0x80 | (v >> 12 & 63)),
            tmp[2] = (char)(0x80 | (v >> 6 & 63)), tmp[3] = (char)(0x80 | (v & 63)), n = 4;
          if (w + n >= outlen) return SIZE_MAX;
          memcpy(out + w, tmp, n);
          w += n;
          i = j;
          continue;
        }
      }
    }
    if (w + 1 >= outlen) return SIZE_MAX;
    out[w++] = c;
  }
  out[w] = '\0';
  return w;
}

int s3_xml_text(const char *xml, const char *tag, const char **from, char *out, size_t outlen) {
  if (!xml || !outlen) return -1;
  char open[72], close[72];
  int on = snprintf(open, sizeof open, "<%s>", tag);
  snprintf(close, sizeof close, "</%s>", tag);
  if (on < 0 || (size_t)on >= sizeof open) return -1;
  const char *start = strstr(from && *from ? *from : xml, open);
  if (!start) return -1;
  start += on;
  const char *end = strstr(start, close);
  if (!end) return -1;
  if (from) *from = end;
  return xml_decode(start, (size_t)(end - start), out, outlen) == SIZE_MAX ? -1 : 0;
}

/* ---- DeleteObjects answers ------------------------------------------------------------------ */

/* A strict reader of one flat element <name>text</name> or <name/> at *at (whitespace before it
 * skipped): name and its text (raw, not decoded) out. 0, or -1 when what is there is not one. */
static int xml_leaf(const char **at, const char *end, const char **name, size_t *namelen,
                    const char **text, size_t *textlen) {
  const char *p = *at;
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
  if (p >= end || *p != '<' || p + 1 >= end || p[1] == '/') return -1;
  const char *n = ++p;
  while (p < end && ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z'))) p++;
  if (p == n || p >= end) return -1;
  *name = n;
  *namelen = (size_t)(p - n);
  if (*p == '/') {
    if (p + 1 >= end || p[1] != '>') return -1;
    *text = p;
    *textlen = 0;
    *at = p + 2;
    return 0;
  }
  if (*p != '>') return -1;
  const char *t = ++p;
  while (p < end && *p != '<') p++;
  if (p >= end || (size_t)(end - p) < *namelen + 3 || p[1] != '/' || memcmp(p + 2, n, *namelen) ||
      p[2 + *namelen] != '>')
    return -1;
  *text = t;
  *textlen = (size_t)(p - t);
  *at = p + 3 + *namelen;
  return 0;
}

static int name_is(const char *name, size_t len, const char *want) {
  return strlen(want) == len && !memcmp(name, want, len);
}

/* Skips whitespace, then expects the literal s. 0, or -1. */
static int xml_expect(const char **at, const char *end, const char *s) {
  const char *p = *at;
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
  size_t n = strlen(s);
  if ((size_t)(end - p) < n || memcmp(p, s, n)) return -1;
  *at = p + n;
  return 0;
}

/* Which of keys[0..n) is key (hint first: answers list keys in request order)? n if none. */
static size_t key_index(const char *const *keys, size_t n, const char *key, size_t hint) {
  if (hint < n && !strcmp(keys[hint], key)) return hint;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(keys[i], key)) return i;
  return n;
}

int s3_parse_delete_result(const char *xml, size_t len, const char *const *keys, size_t n,
                           uint8_t *failed, char *why, size_t whylen) {
  const char *at = xml, *end = xml + len;
  if (whylen) why[0] = '\0';
#define REFUSE(...) return snprintf(why, whylen, __VA_ARGS__), -1
  if (xml_expect(&at, end, "<?xml") == 0) { /* the prolog: up to its ?> */
    const char *q = at;
    while (q + 1 < end && !(q[0] == '?' && q[1] == '>') && q[0] != '<') q++;
    if (q + 1 >= end || q[0] != '?') REFUSE("bad XML declaration");
    at = q + 2;
  }
  if (xml_expect(&at, end, "<DeleteResult") < 0 ||
      (at < end && *at != '>' && *at != '/' && *at != ' ' && *at != '\n'))
    REFUSE("not a DeleteResult");
  while (at < end && *at != '>' && *at != '<') at++; /* its attributes (xmlns) */
  if (at >= end || *at != '>') REFUSE("unterminated DeleteResult tag");
  int empty = at[-1] == '/'; /* <DeleteResult .../>: nothing failed */
  at++;
  size_t nfailed = 0, hint = 0;
  while (!empty) {
    if (xml_expect(&at, end, "</DeleteResult>") == 0) break;
    int is_error;
    if (xml_expect(&at, end, "<Deleted>") == 0)
      is_error = 0;
    else if (xml_expect(&at, end, "<Error>") == 0)
      is_error = 1;
    else
      REFUSE("unexpected content at byte %zu", (size_t)(at - xml));
    char key[1100] = "", code[64] = "";
    int have_key = 0;
    while (xml_expect(&at, end, is_error ? "</Error>" : "</Deleted>") < 0) {
      const char *name, *text;
      size_t nl, tl;
      if (xml_leaf(&at, end, &name, &nl, &text, &tl) < 0)
        REFUSE("malformed entry at byte %zu", (size_t)(at - xml));
      if (name_is(name, nl, "Key")) {
        if (have_key || xml_decode(text, tl, key, sizeof key) == SIZE_MAX) REFUSE("bad Key");
        have_key = 1;
      } else if (is_error && name_is(name, nl, "Code")) {
        if (xml_decode(text, tl, code, sizeof code) == SIZE_MAX) REFUSE("bad Code");
      } else if (!name_is(name, nl, "VersionId") && !name_is(name, nl, "Message") &&
                 !name_is(name, nl, "DeleteMarker") &&
                 !name_is(name, nl, "DeleteMarkerVersionId")) {
        REFUSE("unexpected element %.*s", (int)(nl < 40 ? nl : 40), name);
      }
    }
    if (!have_key) REFUSE("an entry without a Key");
    size_t i = key_index(keys, n, key, hint);
    if (i == n) REFUSE("key %.200s was not asked for", key);
    hint = i + 1;
    if (is_error && !failed[i]) {
      failed[i] = 1;
      if (!nfailed++) snprintf(why, whylen, "%.900s: %s", key, code[0] ? code : "error");
    }
  }
  while (at < end && (*at == ' ' || *at == '\t' || *at == '\r' || *at == '\n')) at++;
  if (at != end) REFUSE("content after DeleteResult");
#undef REFUSE
  return (int)nfailed;
}

/* ---- requests ------------------------------------------------------------------------------- */

struct transfer {
  s3_request *req;
  s3_response *resp;
  uint64_t sent;   /* body bytes handed to curl */
  size_t kept_cap; /* capacity of resp->body */
  int overflow;
  int read_error;
  int sink_stopped; /* the sink refused bytes */
};

static size_t on_body_read(char *buf, size_t size, size_t nmemb, void *ud) {
  struct transfer *x = ud;
  const s3_body *b = &x->req->body;
  uint64_t left = b->len - x->sent;
  size_t n = size * nmemb < left ? size * nmemb : (size_t)left;
  if (!n) return 0;
  if (b->mem) {
    memcpy(buf, (const char *)b->mem + x->sent, n);
  } else {
    ssize_t r;
    do r = pread(b->fd, buf, n, (off_t)(b->off + x->sent));
    while (r < 0 && errno == EINTR);
    if (r <= 0) {
      x->read_error = r < 0 ? errno : EIO;
      return CURL_READFUNC_ABORT;
    }
    n = (size_t)r;
  }
  x->sent += n;
  return n;
}

static int keep_bytes(struct transfer *x, const char *data, size_t n) {
  s3_response *r = x->resp;
  if (r->body_len + n + 1 > x->kept_cap) {
    if (r->body_len + n + 1 > MAX_KEPT_BODY) return -1;
    size_t cap = x->kept_cap ? x->kept_cap * 2 : 4096;
    while (cap < r->body_len + n + 1) cap *= 2;
    char *grown = realloc(r->body, cap);
    if (!grown) return -1;
    r->body = grown;
    x->kept_cap = cap;
  }
  memcpy(r->body + r->body_len, data, n);
  r->body_len += n;
  r->body[r->body_len] = '\0';
  return 0;
}

static size_t on_body_write(char *data, size_t size, size_t nmemb, void *ud) {
  struct transfer *x = ud;
  size_t n = size * nmemb;
  s3_response *r = x->resp;
  if (r->status >= 200 && r->status < 300 && x->req->sink) {
    if (!x->req->sink(x->req->sink_ud, data, n)) {
      x->sink_stopped = r->sink_stopped = 1;
      return 0; /* aborts the transfer */
    }
    r->body_len += n;
    return n;
  }
  if (r->status >= 200 && r->status < 300 && x->req->into) {
    if (r->body_len + n > x->req->into_cap) {
      x->overflow = 1;
      return 0; /* aborts the transfer */
    }
    memcpy(x->req->into + r->body_len, data, n);
    r->body_len += n;
    return n;
  }
  if (keep_bytes(x, data, n) < 0) {
    x->overflow = 1;
    return 0;
  }
  return n;
}

/* Parses the status line and the few headers we use; a new status line (after 100 Continue, or a
 * retry) starts over. */
static size_t on_header(char *line, size_t size, size_t nmemb, void *ud) {
  struct transfer *x = ud;
  s3_response *r = x->resp;
  size_t n = size * nmemb;
  char buf[512];
  size_t len = n < sizeof buf - 1 ? n : sizeof buf - 1;
  memcpy(buf, line, len);
  buf[len] = '\0';
  while (len && (buf[len - 1] == '\r' || buf[len - 1] == '\n')) buf[--len] = '\0';
  if (!strncmp(buf, "HTTP/", 5)) {
    const char *sp = strchr(buf, ' ');
    r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
    r->content_length = UINT64_MAX;
    r->total_size = UINT64_MAX;
    r->etag[0] = '\0';
    r->checksum_sha256[0] = '\0';
    r->meta_sha256[0] = '\0';
    return n;
  }
  char *colon = strchr(buf, ':');
  if (!colon) return n;
  *colon = '\0';
  const char *v = colon + 1;
  while (*v == ' ' || *v == '\t') v++;
  if (!strcasecmp(buf, "content-length")) {
    r->content_length = strtoull(v, NULL, 10);
    if (r->total_size == UINT64_MAX) r->total_size = r->content_length;
  } else if (!strcasecmp(buf, "content-range")) {
    const char *slash = strrchr(v, '/');
    if (slash && slash[1] != '*') r->total_size = strtoull(slash + 1, NULL, 10);
  } else if (!strcasecmp(buf, "etag")) {
    snprintf(r->etag, sizeof r->etag, "%s", v);
  } else if (!strcasecmp(buf, "x-amz-checksum-sha256")) {
    snprintf(r->checksum_sha256, sizeof r->checksum_sha256, "%s", v);
  } else if (!strcasecmp(buf, "x-amz-meta-blobref-sha256")) {
    snprintf(r->meta_sha256, sizeof r->meta_sha256, "%s", v);
  }
  return n;
}

static int retryable_status(const s3_response *r) {
  return r->status == 500 || r->status == 502 || r->status == 503 || r->status == 504;
}

static void backoff(unsigned attempt) {
  uint64_t cap = 100ull << (attempt < 5 ? attempt : 5); /* 100 ms, 200 ms, ... 3.2 s */
  if (cap > 2000) cap = 2000;
  uint64_t ms = cap / 2 + (uint64_t)random() % (cap / 2 + 1); /* jitter: half to all of cap */
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

/* How long one attempt may take. A frozen S3 accepts connections and answers nothing, and
 * libcurl's low-speed check does not fire while a sent request waits for its answer: so requests
 * that move a known amount of bytes get stall_ms plus the time those bytes take at 256 KiB/s at
 * least. Completions and copies (POST, x-amz-copy-source), which S3 may take long to answer,
 * keep the whole-request timeout. */
static long request_budget_ms(const s3_target *t, const s3_request *req) {
  if (req->timeout_ms) return req->timeout_ms;
  if (!strcmp(req->method, "POST")) return t->timeout_ms;
  for (size_t i = 0; i < req->nheaders; i++)
    if (!strcasecmp(req->headers[i].name, "x-amz-copy-source")) return t->timeout_ms;
  uint64_t bytes = req->body.len + req->into_cap + req->sink_len;
  if (req->has_range) bytes += req->range_last - req->range_first + 1;
  if (!strcmp(req->method, "GET") && !req->has_range && !req->into && !req->sink) bytes += 4u << 20;
  uint64_t budget = (uint64_t)t->stall_ms + bytes * 1000 / (256 * 1024);
  return budget < (uint64_t)t->timeout_ms ? (long)budget : t->timeout_ms;
}

/* One attempt. Returns 0 with an answer, or -1 with err (transport). */
static int attempt_once(s3_target *t, s3_request *req, s3_response *resp, br_err *err) {
  CURL *h = s3_curl_handle();
  if (!h) return br_fail(err, "store %s: cannot create a curl handle", t->name);
  char host[320], path[3400], url[8192], auth[1024], amz_date[17];
  if (s3_target_locate(t, req->key, host, sizeof host, path, sizeof path) < 0)
    return br_fail(err, "store %s: key too long for a URL", t->name);
  const char *payload = req->payload_hash ? req->payload_hash : BR_SIGV4_EMPTY_SHA256;
  br_sigv4_header hdrs[10];
  size_t nh = 0;
  for (size_t i = 0; i < req->nheaders && nh < 9; i++) hdrs[nh++] = req->headers[i];
  hdrs[nh++] = (br_sigv4_header){"x-amz-content-sha256", payload};
  br_sigv4_request sr = {.method = req->method,
                         .host = host,
                         .path = path,
                         .query = req->query ? req->query : "",
                         .headers = hdrs,
                         .nheaders = nh,
                         .payload_hash = payload};
  if (br_sigv4_sign(&t->signer, &sr, time(NULL), auth, sizeof auth, amz_date, err) < 0) return -1;
  int n = snprintf(url, sizeof url, "%s://%s%s%s%s", t->scheme, host, path,
                   req->query && *req->query ? "?" : "", req->query ? req->query : "");
  if (n < 0 || (size_t)n >= sizeof url) return br_fail(err, "store %s: URL too long", t->name);

  struct curl_slist *list = NULL;
  char line[4400];
  for (size_t i = 0; i < nh; i++) {
    snprintf(line, sizeof line, "%s: %s", hdrs[i].name, hdrs[i].value);
    list = curl_slist_append(list, line);
  }
  snprintf(line, sizeof line, "x-amz-date: %s", amz_date);
  list = curl_slist_append(list, line);
  snprintf(line, sizeof line, "Authorization: %s", auth);
  list = curl_slist_append(list, line);
  if (t->signer.session_token[0]) {
    snprintf(line, sizeof line, "x-amz-security-token: %s", t->signer.session_token);
    list = curl_slist_append(list, line);
  }
  if (req->has_range) {
    snprintf(line, sizeof line, "Range: bytes=%" PRIu64 "-%" PRIu64, req->range_first,
             req->range_last);
    list = curl_slist_append(list, line);
  }
  list = curl_slist_append(list, "Expect:"); /* no 100-continue round trip */
  if (!list) return br_fail(err, "out of memory");

  struct transfer x = {.req = req, .resp = resp};
  if (req->sink_reset) req->sink_reset(req->sink_ud);
  resp->status = 0;
  resp->body_len = 0;
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, t->connect_timeout_ms);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, request_budget_ms(t, req));
  /* a frozen S3 (connections accepted, nothing answered) fails after stall_ms, not timeout_ms */
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, t->stall_ms < 1000 ? 1L : t->stall_ms / 1000);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &x);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
  /* a streamed read takes its body in 256 KiB calls (16 KiB otherwise: 16x the calls per GiB) */
  curl_easy_setopt(h, CURLOPT_BUFFERSIZE, req->sink ? 256L * 1024 : (long)CURL_MAX_WRITE_SIZE);
  if (!strcmp(req->method, "HEAD")) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (!strcmp(req->method, "PUT") || !strcmp(req->method, "POST")) {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_body_read);
    curl_easy_setopt(h, CURLOPT_READDATA, &x);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)req->body.len);
  } else if (strcmp(req->method, "GET")) {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
  }
  CURLcode rc = curl_easy_perform(h);
  curl_slist_free_all(list);
  if (x.overflow) {
    if (req->into && resp->status >= 200 && resp->status < 300)
      return br_fail(err, "store %s: the answer is longer than expected", t->name);
    return br_fail(err, "store %s: the answer is too long", t->name);
  }
  if (x.sink_stopped) return br_fail(err, "store %s: the answer's bytes were refused", t->name);
  if (x.read_error)
    return br_fail(err, "store %s: reading the upload body: %s", t->name, strerror(x.read_error));
  if (rc != CURLE_OK) {
    resp->status = 0;
    if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
        rc == CURLE_OPERATION_TIMEDOUT)
      atomic_store(&t->down_until_ms, br_now_ms() + BREAKER_MS);
    return br_fail(err, "store %s: %s %s: %s", t->name, req->method, t->host,
                   curl_easy_strerror(rc));
  }
  atomic_store(&t->down_until_ms, 0);
  if (resp->status < 200 || resp->status >= 300) {
    resp->code[0] = resp->message[0] = '\0';
    if (resp->body) {
      s3_xml_text(resp->body, "Code", NULL, resp->code, sizeof resp->code);
      s3_xml_text(resp->body, "Message", NULL, resp->message, sizeof resp->message);
    }
  }
  return 0;
}

int s3_perform(s3_target *t, s3_request *req, s3_response *resp, br_err *err) {
  memset(resp, 0, sizeof *resp);
  resp->content_length = resp->total_size = UINT64_MAX;
  if (s3_target_down(t))
    return br_fail(err, "store %s: %s is unreachable (retrying in a moment)", t->name, t->host);
  unsigned attempts = req->no_retry ? 1 : 1 + t->max_retries;
  int rc = -1;
  for (unsigned a = 0; a < attempts; a++) {
    if (a) backoff(a - 1);
    rc = attempt_once(t, req, resp, err);
    if (rc == 0 && !retryable_status(resp)) return 0;
    if (rc < 0 && s3_target_down(t)) return -1;  /* unreachable: fail fast */
    if (rc < 0 && resp->sink_stopped) return -1; /* the caller's sink said stop: final */
  }
  return rc;
}

void s3_response_free(s3_response *resp) {
  free(resp->body);
  resp->body = NULL;
}

int s3_fail_status(br_err *err, const s3_target *t, const char *what, const s3_response *resp) {
  return br_fail(err, "store %s: %s: S3 %ld %s%s%s", t->name, what, resp->status,
                 resp->code[0] ? resp->code : "error", resp->message[0] ? ": " : "", resp->message);
}
