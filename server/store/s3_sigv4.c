/* AWS Signature Version 4 for S3 over OpenSSL: canonical request, string to sign, Authorization
 * header and presigned query, with the daily signing key cached per signer. */
#include "blobref/sigv4.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>

#define ALGORITHM "AWS4-HMAC-SHA256"
#define MAX_HEADERS 64         /* req->headers plus host, x-amz-date, x-amz-security-token */
#define MAX_PARAMS 256         /* query parameters plus the X-Amz-* ones */
#define MAX_SIGNED_INPUT 65536 /* query + header bytes one request may carry into the signer */

/* A bounded, always NUL-terminated text buffer over storage someone else owns. Appends past
 * the end set full instead of writing; callers check full once at the end. */
typedef struct buf {
  char *p;
  size_t len, cap;
  int full;
} buf;

static buf buf_over(char *p, size_t cap) {
  buf b = {p, 0, cap, cap == 0};
  if (cap) p[0] = '\0';
  return b;
}

/* Appends n bytes and returns where they start (NUL-terminated), or NULL when full. */
static char *put(buf *b, const char *s, size_t n) {
  if (b->full || n >= b->cap - b->len) {
    b->full = 1;
    return NULL;
  }
  char *at = b->p + b->len;
  memcpy(at, s, n);
  b->len += n;
  b->p[b->len] = '\0';
  return at;
}

static char *puts_(buf *b, const char *s) { return put(b, s, strlen(s)); }

static int unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '~';
}

/* Appends s[0..n) percent-encoded (uppercase hex) as SigV4 wants; what does not fit sets full, as
 * put does. Writes straight into the buffer: this runs over every key and query of a signature. */
static void put_encoded(buf *b, const char *s, size_t n, int keep_slash) {
  static const char hex[] = "0123456789ABCDEF";
  if (b->full || n == 0) return;
  if (b->len >= b->cap) { /* an arena_end may have filled it to the last byte */
    b->full = 1;
    return;
  }
  char *o = b->p + b->len;
  size_t room = b->cap - b->len; /* one byte of it stays for the NUL */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    int plain = unreserved(c) || (keep_slash && c == '/');
    size_t need = plain ? 1 : 3;
    if (need >= room) {
      b->full = 1;
      break;
    }
    if (plain) {
      *o++ = (char)c;
    } else {
      o[0] = '%';
      o[1] = hex[c >> 4];
      o[2] = hex[c & 15];
      o += 3;
    }
    room -= need;
  }
  b->len = (size_t)(o - b->p);
  *o = '\0';
}

size_t br_sigv4_uri_encode(const char *in, int keep_slash, char *out, size_t outlen) {
  buf b = buf_over(out, outlen);
  put_encoded(&b, in, strlen(in), keep_slash);
  return b.full ? 0 : b.len;
}

static int hexval(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Decodes %XY escapes of s[0..n) in place; a '%' not followed by two hex digits stays literal,
 * and '+' is not a space. Returns the decoded length. */
static size_t pct_decode(char *s, size_t n) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    int hi = -1, lo = -1;
    if (s[i] == '%' && i + 2 < n) {
      hi = hexval((unsigned char)s[i + 1]);
      lo = hexval((unsigned char)s[i + 2]);
    }
    if (hi >= 0 && lo >= 0) {
      s[o++] = (char)(hi << 4 | lo);
      i += 2;
    } else {
      s[o++] = s[i];
    }
  }
  return o;
}

/* SHA-256 and an HMAC-SHA256 context without a key, fetched once: EVP_sha256() and HMAC() look
 * the algorithms up by name on every call, which was most of a presign's cost. NULL when a fetch
 * failed; the one-shot functions are used then. */
static EVP_MD *sha256_md;
static EVP_MAC_CTX *hmac_template;
static pthread_once_t algs_once = PTHREAD_ONCE_INIT;

static void fetch_algs(void) {
  sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
  EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  hmac_template = mac ? EVP_MAC_CTX_new(mac) : NULL;
  EVP_MAC_free(mac); /* the context keeps its own reference */
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, "SHA256", 0),
                         OSSL_PARAM_construct_end()};
  if (hmac_template && !EVP_MAC_CTX_set_params(hmac_template, params)) {
    EVP_MAC_CTX_free(hmac_template);
    hmac_template = NULL;
  }
}

static void sha256_hex(const char *data, size_t n, char out[BR_HEX_LEN + 1]) {
  uint8_t md[BR_SHA256_LEN];
  unsigned int mdlen = 0;
  pthread_once(&algs_once, fetch_algs);
  EVP_Digest(data, n, md, &mdlen, sha256_md ? sha256_md : EVP_sha256(), NULL);
  br_hex_encode(md, out);
}

static void hmac(const uint8_t *key, size_t keylen, const char *data, uint8_t out[32]) {
  pthread_once(&algs_once, fetch_algs);
  size_t n = strlen(data), outlen = 0;
  EVP_MAC_CTX *ctx = hmac_template ? EVP_MAC_CTX_dup(hmac_template) : NULL;
  if (ctx && EVP_MAC_init(ctx, key, keylen, NULL) &&
      EVP_MAC_update(ctx, (const unsigned char *)data, n) && EVP_MAC_final(ctx, out, &outlen, 32) &&
      outlen == 32) {
    EVP_MAC_CTX_free(ctx);
    return;
  }
  EVP_MAC_CTX_free(ctx);
  unsigned int len = 0;
  HMAC(EVP_sha256(), key, (int)keylen, (const unsigned char *)data, n, out, &len);
}

static int copy_field(char *dst, size_t cap, const char *src, const char *what, int required,
                      br_err *err) {
  size_t n = src ? strlen(src) : 0;
  if (required && n == 0) return br_fail(err, "sigv4: %s is empty", what);
  if (n >= cap) return br_fail(err, "sigv4: %s is longer than %zu bytes", what, cap - 1);
  memcpy(dst, src ? src : "", n + 1);
  return 0;
}

int br_sigv4_init(br_sigv4 *s, const char *access_key, const char *secret_key,
                  const char *session_token, const char *region, const char *service, br_err *err) {
  memset(s, 0, sizeof *s);
  if (copy_field(s->access_key, sizeof s->access_key, access_key, "access key", 1, err) ||
      copy_field(s->secret_key, sizeof s->secret_key, secret_key, "secret key", 1, err) ||
      copy_field(s->session_token, sizeof s->session_token, session_token, "session token", 0,
                 err) ||
      copy_field(s->region, sizeof s->region, region, "region", 1, err) ||
      copy_field(s->service, sizeof s->service, service, "service", 1, err)) {
    OPENSSL_cleanse(s, sizeof *s);
    return -1;
  }
  if (pthread_mutex_init(&s->lock, NULL) != 0) {
    OPENSSL_cleanse(s, sizeof *s);
    return br_fail(err, "sigv4: pthread_mutex_init failed");
  }
  return 0;
}

void br_sigv4_destroy(br_sigv4 *s) {
  pthread_mutex_destroy(&s->lock);
  OPENSSL_cleanse(s, sizeof *s);
}

void br_sigv4_amz_date(time_t t, char out[17]) {
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

/* The signing key for date8 (YYYYMMDD): the cached one, or derived and cached under the lock. */
static void signing_key(br_sigv4 *s, const char date8[9], uint8_t key[32]) {
  pthread_mutex_lock(&s->lock);
  if (strcmp(s->key_date, date8) != 0) {
    char secret[4 + sizeof s->secret_key];
    uint8_t k1[32], k2[32], k3[32];
    snprintf(secret, sizeof secret, "AWS4%s", s->secret_key);
    hmac((const uint8_t *)secret, strlen(secret), date8, k1);
    hmac(k1, 32, s->region, k2);
    hmac(k2, 32, s->service, k3);
    hmac(k3, 32, "aws4_request", s->signing_key);
    memcpy(s->key_date, date8, 9);
    OPENSSL_cleanse(secret, sizeof secret);
    OPENSSL_cleanse(k1, 32);
    OPENSSL_cleanse(k2, 32);
    OPENSSL_cleanse(k3, 32);
  }
  memcpy(key, s->signing_key, 32);
  pthread_mutex_unlock(&s->lock);
}

void br_sigv4_signing_key(br_sigv4 *s, time_t now, uint8_t key[32]) {
  char amz_date[17], date8[9];
  br_sigv4_amz_date(now, amz_date);
  memcpy(date8, amz_date, 8);
  date8[8] = '\0';
  signing_key(s, date8, key);
}

/* Ends the string started at start in arena a (NUL-terminated, kept) and returns it, or NULL
 * (a->full) when it does not fit. */
static char *arena_end(buf *a, size_t start) {
  if (a->full || a->len >= a->cap) {
    a->full = 1;
    return NULL;
  }
  a->p[a->len++] = '\0';
  return a->p + start;
}

static char *arena_copy(buf *a, const char *s, size_t n) {
  size_t start = a->len;
  put(a, s, n);
  return arena_end(a, start);
}

/* Percent-decodes s[0..n) and stores it re-encoded with the unreserved set. */
static char *arena_reencode(buf *a, const char *s, size_t n) {
  size_t raw = a->len;
  if (!put(a, s, n) && n) return NULL;
  a->len = raw + pct_decode(a->p + raw, n);
  size_t start = a->len;
  put_encoded(a, a->p + raw, start - raw, 0);
  return arena_end(a, start);
}

typedef struct header {
  const char *name; /* lower-cased */
  const char *value;
  size_t seq; /* keeps same-name headers in the order given */
} header;

typedef struct param {
  const char *name; /* percent-encoded */
  const char *value;
} param;

static int header_cmp(const void *a, const void *b) {
  const header *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c) return c;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int param_cmp(const void *a, const void *b) {
  const param *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : strcmp(x->value, y->value);
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* Appends v trimmed, with inner whitespace runs collapsed to one space. */
static void put_trimmed(buf *b, const char *v) {
  while (is_space(*v)) v++;
  while (*v) {
    if (is_space(*v)) {
      while (is_space(*v)) v++;
      if (*v) put(b, " ", 1);
    } else {
      put(b, v++, 1);
    }
  }
}

/* Appends "n1=v1&n2=v2..." */
static void put_params(buf *b, const param *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (i) put(b, "&", 1);
    puts_(b, p[i].name);
    put(b, "=", 1);
    puts_(b, p[i].value);
  }
}

/* One signature's texts. Every pointer is into arena, which the caller owns. */
typedef struct canon {
  char amz_date[17];
  char date8[9];
  char scope[256];            /* YYYYMMDD/region/service/aws4_request */
  const char *headers;        /* canonical header lines, each ending in '\n' */
  const char *signed_headers; /* "host;x-amz-date" */
  const char *user_query;     /* presign: req->query re-encoded, in the order given */
  const char *auth_query;     /* presign: the X-Amz-* parameters before X-Amz-Signature */
  buf arena;
} canon;

static const char *const reserved_headers[] = {"host", "x-amz-date", "x-amz-security-token",
                                               "authorization"};

/* Sorts host, the signer's headers and req->headers; sets c->headers and c->signed_headers. */
static int canonical_headers(br_sigv4 *s, const br_sigv4_request *req, int presign, canon *c,
                             br_err *err) {
  header h[MAX_HEADERS];
  size_t n = 0;
  buf *a = &c->arena;
  if (req->nheaders > MAX_HEADERS - 3)
    return br_fail(err, "sigv4: more than %d headers", MAX_HEADERS - 3);
  h[n++] = (header){"host", req->host, 0};
  if (!presign) {
    h[n++] = (header){"x-amz-date", c->amz_date, 0};
    if (s->session_token[0]) h[n++] = (header){"x-amz-security-token", s->session_token, 0};
  }
  for (size_t i = 0; i < req->nheaders; i++) {
    const char *name = req->headers[i].name;
    size_t len = name ? strlen(name) : 0;
    if (len == 0) return br_fail(err, "sigv4: empty header name");
    char *lower = arena_copy(a, name, len);
    if (!lower) return br_fail(err, "sigv4: headers too large");
    for (char *l = lower; *l; l++)
      if (*l >= 'A' && *l <= 'Z') *l = (char)(*l + 32);
    for (size_t j = 0; j < sizeof reserved_headers / sizeof *reserved_headers; j++)
      if (strcmp(lower, reserved_headers[j]) == 0)
        return br_fail(err, "sigv4: header %s is added by the signer", name);
    h[n++] = (header){lower, req->headers[i].value ? req->headers[i].value : "", i + 1};
  }
  qsort(h, n, sizeof *h, header_cmp);

  size_t start = a->len;
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && strcmp(h[i].name, h[i - 1].name) == 0) {
      put(a, ",", 1);
    } else {
      if (i > 0) put(a, "\n", 1);
      puts_(a, h[i].name);
      put(a, ":", 1);
    }
    put_trimmed(a, h[i].value);
  }
  put(a, "\n", 1);
  c->headers = arena_end(a, start);
  start = a->len;
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && strcmp(h[i].name, h[i - 1].name) == 0) continue;
    if (i > 0) put(a, ";", 1);
    puts_(a, h[i].name);
  }
  c->signed_headers = arena_end(a, start);
  if (a->full) return br_fail(err, "sigv4: headers too large");
  return 0;
}

/* Splits req->query (plus, for presign, the X-Amz-* parameters) into encoded pairs and appends
 * them sorted to out: the canonical query string. */
static int canonical_query(br_sigv4 *s, const br_sigv4_request *req, int presign,
                           uint64_t expires_s, canon *c, buf *out, br_err *err) {
  param p[MAX_PARAMS];
  size_t n = 0;
  buf *a = &c->arena;
  for (const char *q = req->query ? req->query : ""; *q;) {
    size_t len = strcspn(q, "&");
    if (len > 0) {
      if (n == MAX_PARAMS - 6)
        return br_fail(err, "sigv4: more than %d query parameters", MAX_PARAMS - 6);
      size_t nlen = strcspn(q, "=&");
      const char *v = q + nlen + (nlen < len);
      p[n].name = arena_reencode(a, q, nlen);
      p[n].value = arena_reencode(a, v, (size_t)(q + len - v));
      if (a->full) return br_fail(err, "sigv4: query too large");
      n++;
    }
    q += len + (q[len] == '&');
  }
  if (presign) {
    size_t user = n, start = a->len;
    put_params(a, p, n);
    c->user_query = arena_end(a, start);

    char cred[sizeof s->access_key + sizeof c->scope + 1], expires[24];
    snprintf(cred, sizeof cred, "%s/%s", s->access_key, c->scope);
    snprintf(expires, sizeof expires, "%" PRIu64, expires_s);
    const char *auth[][2] = {{"X-Amz-Algorithm", ALGORITHM},
                             {"X-Amz-Credential", cred},
                             {"X-Amz-Date", c->amz_date},
                             {"X-Amz-Expires", expires},
                             {"X-Amz-SignedHeaders", c->signed_headers},
                             {"X-Amz-Security-Token", s->session_token}};
    size_t nauth = s->session_token[0] ? 6 : 5;
    for (size_t i = 0; i < nauth; i++) {
      p[n].name = auth[i][0];
      p[n].value = arena_reencode(a, auth[i][1], strlen(auth[i][1]));
      n++;
    }
    start = a->len;
    put_params(a, p + user, nauth);
    c->auth_query = arena_end(a, start);
    if (a->full) return br_fail(err, "sigv4: query too large");
  }
  qsort(p, n, sizeof *p, param_cmp);
  put_params(out, p, n);
  return 0;
}

/* Scratch space and results of one signing; release with scratch_free. */
typedef struct scratch {
  canon c;
  char *mem;
  buf creq;
  char sts[512];
  char signature[BR_HEX_LEN + 1];
} scratch;

/* Computes the canonical request into creq, the string to sign into sts and the signature
 * (x->signature), for req at now. creq/sts NULL: use x's own. The caller frees x with
 * scratch_free, whatever this returns. */
static int build(br_sigv4 *s, const br_sigv4_request *req, time_t now, int presign,
                 uint64_t expires_s, buf *creq, buf *sts, scratch *x, br_err *err) {
  memset(x, 0, sizeof *x);
  if (!req->method || !req->method[0] || !req->host || !req->host[0] || !req->path ||
      !req->payload_hash || (req->nheaders && !req->headers))
    return br_fail(err, "sigv4: method, host, path and payload hash are required");
  if (presign && (expires_s < 1 || expires_s > 604800))
    return br_fail(err, "sigv4: expiry %" PRIu64 " s is not in 1..604800", expires_s);

  size_t in = strlen(req->method) + strlen(req->host) + strlen(req->path) +
              strlen(req->query ? req->query : "") + strlen(req->payload_hash);
  for (size_t i = 0; i < req->nheaders; i++)
    in += strlen(req->headers[i].name ? req->headers[i].name : "") +
          strlen(req->headers[i].value ? req->headers[i].value : "") + 2;
  if (in > MAX_SIGNED_INPUT)
    return br_fail(err, "sigv4: request larger than %d bytes", MAX_SIGNED_INPUT);
  /* Upper bound of the arena: the query raw, re-encoded (3x) and joined again (4x); header
   * names three times and values once; signed header names encoded (3x) twice; the token and
   * credential encoded (3x) twice. The canonical request is smaller than that. */
  size_t cap = 16 * in + 8 * strlen(s->session_token) + 4096;
  x->mem = malloc(2 * cap);
  if (!x->mem) return br_fail(err, "sigv4: out of memory");
  x->c.arena = buf_over(x->mem, cap);
  x->creq = buf_over(x->mem + cap, cap);
  if (!creq) creq = &x->creq;
  buf own_sts = buf_over(x->sts, sizeof x->sts);
  if (!sts) sts = &own_sts;

  canon *c = &x->c;
  br_sigv4_amz_date(now, c->amz_date);
  memcpy(c->date8, c->amz_date, 8);
  c->date8[8] = '\0';
  snprintf(c->scope, sizeof c->scope, "%s/%s/%s/aws4_request", c->date8, s->region, s->service);
  if (canonical_headers(s, req, presign, c, err)) return -1;

  puts_(creq, req->method);
  put(creq, "\n", 1);
  puts_(creq, req->path[0] ? req->path : "/");
  put(creq, "\n", 1);
  if (canonical_query(s, req, presign, expires_s, c, creq, err)) return -1;
  put(creq, "\n", 1);
  puts_(creq, c->headers);
  put(creq, "\n", 1);
  puts_(creq, c->signed_headers);
  put(creq, "\n", 1);
  puts_(creq, req->payload_hash);
  if (creq->full) return br_fail(err, "sigv4: canonical request does not fit");

  char hash[BR_HEX_LEN + 1];
  sha256_hex(creq->p, creq->len, hash);
  puts_(sts, ALGORITHM "\n");
  puts_(sts, c->amz_date);
  put(sts, "\n", 1);
  puts_(sts, c->scope);
  put(sts, "\n", 1);
  puts_(sts, hash);
  if (sts->full) return br_fail(err, "sigv4: string to sign does not fit");

  uint8_t key[32], sig[32];
  signing_key(s, c->date8, key);
  hmac(key, sizeof key, sts->p, sig);
  br_hex_encode(sig, x->signature);
  OPENSSL_cleanse(key, sizeof key);
  return 0;
}

static void scratch_free(scratch *x) {
  free(x->mem);
  x->mem = NULL;
}

int br_sigv4_canonical(br_sigv4 *s, const br_sigv4_request *req, time_t now, int presign,
                       uint64_t expires_s, char *creq, size_t creqlen, char *sts, size_t stslen,
                       br_err *err) {
  scratch x;
  buf cb = buf_over(creq, creqlen), sb = buf_over(sts, stslen);
  int rc = build(s, req, now, presign, expires_s, &cb, &sb, &x, err);
  scratch_free(&x);
  return rc;
}

int br_sigv4_sign(br_sigv4 *s, const br_sigv4_request *req, time_t now, char *authorization,
                  size_t authlen, char amz_date[17], br_err *err) {
  scratch x;
  int rc = build(s, req, now, 0, 0, NULL, NULL, &x, err);
  if (rc == 0) {
    int n = snprintf(authorization, authlen,
                     ALGORITHM " Credential=%s/%s, SignedHeaders=%s, Signature=%s", s->access_key,
                     x.c.scope, x.c.signed_headers, x.signature);
    if (n < 0 || (size_t)n >= authlen)
      rc = br_fail(err, "sigv4: Authorization does not fit in %zu bytes", authlen);
    else
      memcpy(amz_date, x.c.amz_date, 17);
  }
  scratch_free(&x);
  return rc;
}

int br_sigv4_presign(br_sigv4 *s, const br_sigv4_request *req, time_t now, uint64_t expires_s,
                     char *query_out, size_t outlen, br_err *err) {
  scratch x;
  int rc = build(s, req, now, 1, expires_s, NULL, NULL, &x, err);
  if (rc == 0) {
    int n = snprintf(query_out, outlen, "%s%s%s&X-Amz-Signature=%s", x.c.user_query,
                     x.c.user_query[0] ? "&" : "", x.c.auth_query, x.signature);
    if (n < 0 || (size_t)n >= outlen)
      rc = br_fail(err, "sigv4: presigned query does not fit in %zu bytes", outlen);
  }
  scratch_free(&x);
  return rc;
}
