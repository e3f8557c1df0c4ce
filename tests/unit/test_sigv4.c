/* SigV4 signer: URI encoding, key derivation and caching, and AWS's published test vectors.
 *
 * The vectors live in ../shared/testdata/sigv4 (relative to the repo root, where run-unit.sh
 * runs us); when that folder is absent the vector part prints a line and is skipped.
 *
 * Request files hold logical paths (raw spaces, UTF-8, '$'); on the wire an S3 client sends
 * br_sigv4_uri_encode(path, keep_slash = 1), which is what we sign (no case path contains '%',
 * so this never encodes twice; double encoding is tested separately below). The payload hash is
 * the request's x-amz-content-sha256 when it has one, else SHA-256 of the body.
 *
 * Skipped, each printed with its reason and counted:
 *  - cases whose suite normalises the path (all of the 2015 botocore suite, aws-c-auth cases with
 *    "normalize": true) when normalising changes it (the 2015 normalize-path/ get-relative*,
 *    get-slash*, and the aws-c-auth *-normalized twins of the *-unnormalized cases we do run):
 *    S3 does not normalise paths;
 *  - cases that add X-Amz-Security-Token after signing (2015 post-sts-header-after, aws-c-auth
 *    "omit_session_token": true): S3 and boto3 sign the session token (header signing: the
 *    x-amz-security-token header; presigning: the X-Amz-Security-Token query parameter).
 * Run although botocore skips them: repeated query keys (our sort by encoded name then value is
 * what the suite expects), aws-c-auth sign_body (the caller passes X-Amz-Content-Sha256 as a
 * header, as S3 wants), the S3 chunked-upload seed signature (an ordinary header signature over
 * the STREAMING-AWS4-HMAC-SHA256-PAYLOAD hash; the per-chunk signatures are not implemented).
 * aws-c-auth query-signed-request.txt lists X-Amz-SignedHeaders before X-Amz-Expires; we emit
 * boto3's order, so those query strings are compared as sorted parameter lists.
 *
 * `test_sigv4 --presign ACCESS SECRET TOKEN REGION HOST PATH QUERY EXPIRES UNIXTIME` prints our
 * presigned query for a GET (service s3, UNSIGNED-PAYLOAD; TOKEN "" = none), for the boto3
 * cross-check in tests/integration/test_sigv4_boto3.py; `test_sigv4 --uri-encode KEEP_SLASH TEXT`
 * prints br_sigv4_uri_encode(TEXT, KEEP_SLASH), which that test uses to turn keys into paths. */
#include "blobref/sigv4.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "unit.h"

#define VECTORS "../shared/testdata/sigv4"
#define BIG 65536

static int cases_run, cases_skipped;

/* Reads a whole file (at most 1 MiB) into a NUL-terminated malloc'd buffer; NULL if absent. */
static char *slurp(const char *dir, const char *name, const char *suffix) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s%s", dir, name, suffix);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *b = malloc(1 << 20);
  size_t n = fread(b, 1, (1 << 20) - 1, f);
  fclose(f);
  b[n] = '\0';
  return b;
}

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void sha256_hex(const char *data, size_t n, char out[65]) {
  uint8_t md[32];
  unsigned int len = 0;
  EVP_Digest(data, n, md, &len, EVP_sha256(), NULL);
  br_hex_encode(md, out);
}

/* One parsed request file. Pointers are into text (modified in place). */
typedef struct http_req {
  char *text;
  const char *method, *target, *host, *amz_date, *token, *content_sha;
  const char *body;
  br_sigv4_header h[32];
  size_t nh;
  char path[2048]; /* the wire path: br_sigv4_uri_encode(logical path, keep_slash) */
  const char *query;
  char payload[65];
} http_req;

/* Parses "METHOD TARGET HTTP/1.1", header lines (a line starting with a space or tab continues
 * the previous value) and, after a blank line, the body. Returns 0 or -1. */
static int parse_req(char *text, http_req *r) {
  memset(r, 0, sizeof *r);
  r->text = text;
  char *end = text + strlen(text), *nl = strchr(text, '\n');
  char *p = nl ? nl + 1 : end;
  if (nl) *nl = '\0';
  char *sp1 = strchr(text, ' '), *sp2 = strrchr(text, ' ');
  if (!sp1 || sp2 == sp1) return -1;
  *sp1 = *sp2 = '\0';
  r->method = text;
  r->target = sp1 + 1;
  r->body = "";
  while (p < end) {
    if (*p == '\n') {
      r->body = p + 1;
      break;
    }
    char *q = strchr(p, '\n');
    while (q && (q[1] == ' ' || q[1] == '\t')) q = strchr(q + 1, '\n');
    char *colon = strchr(p, ':');
    if (!colon || (q && colon > q) || r->nh == 32) return -1;
    *colon = '\0';
    if (q) *q = '\0';
    const char *name = p, *value = colon + 1;
    if (strcasecmp(name, "host") == 0)
      r->host = value;
    else if (strcasecmp(name, "x-amz-date") == 0)
      r->amz_date = value;
    else if (strcasecmp(name, "x-amz-security-token") == 0)
      r->token = value;
    else
      r->h[r->nh++] = (br_sigv4_header){name, value};
    if (strcasecmp(name, "x-amz-content-sha256") == 0) r->content_sha = value;
    p = q ? q + 1 : end;
  }
  char *qm = strchr(r->target, '?');
  r->query = qm ? qm + 1 : "";
  if (qm) *qm = '\0';
  if (!br_sigv4_uri_encode(r->target, 1, r->path, sizeof r->path)) return -1;
  if (r->content_sha)
    snprintf(r->payload, sizeof r->payload, "%s", r->content_sha);
  else
    sha256_hex(r->body, strlen(r->body), r->payload);
  return r->host ? 0 : -1;
}

/* Whether RFC 3986 dot-segment removal plus collapsing of empty segments changes path. */
static int normalising_changes(const char *path) {
  char out[2048] = "", seg[2048];
  size_t len = 0;
  const char *p = path;
  while (*p) {
    while (*p == '/') p++;
    size_t n = strcspn(p, "/");
    if (n == 0) break;
    memcpy(seg, p, n);
    seg[n] = '\0';
    p += n;
    if (strcmp(seg, ".") == 0) continue;
    if (strcmp(seg, "..") == 0) {
      while (len > 0 && out[len - 1] != '/') len--;
      if (len > 0) len--;
      out[len] = '\0';
      continue;
    }
    len += (size_t)snprintf(out + len, sizeof out - len, "/%s", seg);
  }
  if (len == 0 || (path[0] && path[strlen(path) - 1] == '/'))
    len += (size_t)snprintf(out + len, sizeof out - len, "/");
  return strcmp(out, path) != 0;
}

static void skip(const char *suite, const char *name, const char *why) {
  printf("  skip %s/%s: %s\n", suite, name, why);
  cases_skipped++;
}

static void check_text(const char *name, const char *what, const char *got, const char *want) {
  if (!want) {
    CHECK(want != NULL, "%s: expected %s file missing", name, what);
    return;
  }
  CHECK(strcmp(got, want) == 0, "%s %s:\n  got: %s\n want: %s", name, what, got, want);
}

/* Header signing of r: canonical request, string to sign, and Authorization (or only its
 * signature when want_authz is NULL and want_sig is set). */
static void run_header(br_sigv4 *s, const char *name, http_req *r, time_t when,
                       const br_sigv4_header *extra, const char *want_creq, const char *want_sts,
                       const char *want_authz, const char *want_sig) {
  br_sigv4_header h[33];
  size_t n = r->nh;
  memcpy(h, r->h, n * sizeof *h);
  if (extra) h[n++] = *extra;
  br_sigv4_request req = {r->method, r->host, r->path, r->query, h, n, r->payload};
  static char creq[BIG], sts[1024], authz[1024];
  char amz_date[17];
  br_err err = {{0}};
  int rc = br_sigv4_canonical(s, &req, when, 0, 0, creq, sizeof creq, sts, sizeof sts, &err);
  CHECK(rc == 0, "%s: canonical: %s", name, err.msg);
  check_text(name, "canonical request", creq, want_creq);
  check_text(name, "string to sign", sts, want_sts);
  rc = br_sigv4_sign(s, &req, when, authz, sizeof authz, amz_date, &err);
  CHECK(rc == 0, "%s: sign: %s", name, err.msg);
  if (r->amz_date) check_text(name, "x-amz-date", amz_date, r->amz_date);
  if (want_authz) check_text(name, "authorization", authz, want_authz);
  if (want_sig) {
    const char *sig = strstr(authz, "Signature=");
    check_text(name, "signature", sig ? sig + 10 : "", want_sig);
  }
}

static int str_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Splits q on '&' (in place) into at most 64 parts, sorted; raw bytes >= 0x80 are %-encoded
 * first (aws-c-auth writes its signed request lines with raw UTF-8). Returns the count. */
static size_t sorted_params(const char *q, char *store, size_t cap, char **parts) {
  size_t n = 0, o = 0;
  for (; *q && o + 4 < cap; q++) {
    unsigned char c = (unsigned char)*q;
    if (c >= 0x80)
      o += (size_t)snprintf(store + o, cap - o, "%%%02X", c);
    else
      store[o++] = (char)c;
  }
  store[o] = '\0';
  for (char *t = strtok(store, "&"); t && n < 64; t = strtok(NULL, "&")) parts[n++] = t;
  qsort(parts, n, sizeof *parts, str_cmp);
  return n;
}

/* Query signing (presign) of r, checked against the canonical request, string to sign and
 * signature; want_query is the expected query, compared exactly or (sorted) as a set. */
static void run_query(br_sigv4 *s, const char *name, http_req *r, time_t when, uint64_t expires,
                      const char *payload, const char *want_creq, const char *want_sts,
                      const char *want_sig, const char *want_query, int exact) {
  br_sigv4_request req = {r->method, r->host, r->path, r->query, r->h, r->nh, payload};
  static char creq[BIG], sts[1024], q[BIG], a[BIG], b[BIG];
  br_err err = {{0}};
  int rc = br_sigv4_canonical(s, &req, when, 1, expires, creq, sizeof creq, sts, sizeof sts, &err);
  CHECK(rc == 0, "%s: canonical (query): %s", name, err.msg);
  check_text(name, "query canonical request", creq, want_creq);
  check_text(name, "query string to sign", sts, want_sts);
  rc = br_sigv4_presign(s, &req, when, expires, q, sizeof q, &err);
  CHECK(rc == 0, "%s: presign: %s", name, err.msg);
  if (want_sig) {
    const char *sig = strstr(q, "&X-Amz-Signature=");
    check_text(name, "query signature", sig ? sig + 17 : "", want_sig);
  }
  if (!want_query) return;
  if (exact) {
    check_text(name, "presigned query", q, want_query);
    return;
  }
  char *pa[64], *pb[64];
  size_t na = sorted_params(q, a, sizeof a, pa), nb = sorted_params(want_query, b, sizeof b, pb);
  CHECK(na == nb, "%s: presigned query has %zu parameters, want %zu", name, na, nb);
  for (size_t i = 0; i < na && i < nb; i++)
    CHECK(strcmp(pa[i], pb[i]) == 0, "%s: presigned parameter %s, want %s", name, pa[i], pb[i]);
}

static char *trim_nl(char *s) {
  if (s) s[strcspn(s, "\n")] = '\0';
  return s;
}

/* The value of "Name:value" in a signed request file (in place), or NULL. */
static char *header_line(char *text, const char *name) {
  size_t n = strlen(name);
  for (char *l = text; l; l = strchr(l, '\n')) {
    if (*l == '\n') l++;
    if (strncasecmp(l, name, n) == 0 && l[n] == ':') return trim_nl(l + n + 1);
  }
  return NULL;
}

/* The query of the request line "METHOD PATH?QUERY HTTP/1.1" (in place). */
static char *request_line_query(char *text) {
  if (!text) return NULL;
  trim_nl(text);
  char *q = strchr(text, '?'), *sp = strrchr(text, ' ');
  if (!q || !sp || sp < q) return NULL;
  *sp = '\0';
  return q + 1;
}

static int name_cmp(const void *a, const void *b) { return strcmp(a, b); }

/* Writes a/b into out (cap bytes); a path that does not fit is a failed check. */
static void join(char *out, size_t cap, const char *a, const char *b) {
  int n = snprintf(out, cap, "%s/%s", a, b);
  CHECK(n >= 0 && (size_t)n < cap, "path too long: %s/%s", a, b);
}

static int list_dirs(const char *dir, char names[][256], int max) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d) return 0;
  for (struct dirent *e; (e = readdir(d)) && n < max;) {
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
    if (e->d_name[0] != '.' && is_dir(sub)) snprintf(names[n++], 256, "%s", e->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, 256, name_cmp);
  return n;
}

static const time_t T20150830 = 1440938160; /* 2015-08-30T12:36:00Z */
static const time_t T20130524 = 1369353600; /* 2013-05-24T00:00:00Z */
#define AKID "AKIDEXAMPLE"
#define SECRET "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#define S3_AKID "AKIAIOSFODNN7EXAMPLE"
#define S3_SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

/* One case of the 2015 suite in dir/name: {name}.req/.creq/.sts/.authz. */
static void botocore_case(const char *dir, const char *name) {
  const char *suite = "botocore-2015";
  char *req = slurp(dir, name, ".req"), *creq = slurp(dir, name, ".creq"),
       *sts = slurp(dir, name, ".sts"), *authz = slurp(dir, name, ".authz");
  http_req r;
  if (!req || parse_req(req, &r) != 0) {
    CHECK(0, "%s/%s: cannot read or parse the request", suite, name);
  } else if (normalising_changes(r.target)) {
    skip(suite, name, "the suite normalises this path; S3 does not normalise paths");
  } else if (strcmp(name, "post-sts-header-after") == 0) {
    skip(suite, name, "token added after signing; S3 and boto3 sign X-Amz-Security-Token");
  } else {
    /* this case's token appears only in its canonical request */
    char *tok = creq ? strstr(creq, "\nx-amz-security-token:") : NULL;
    char token[4096] = "";
    if (r.token) snprintf(token, sizeof token, "%s", r.token);
    if (!r.token && tok)
      snprintf(token, sizeof token, "%.*s", (int)strcspn(tok + 22, "\n"), tok + 22);
    br_sigv4 s;
    br_err err;
    CHECK(br_sigv4_init(&s, AKID, SECRET, token, "us-east-1", "service", &err) == 0, "%s", err.msg);
    run_header(&s, name, &r, T20150830, NULL, creq, sts, authz, NULL);
    br_sigv4_destroy(&s);
    cases_run++;
  }
  free(req), free(creq), free(sts), free(authz);
}

static void botocore_suite(const char *root) {
  char dir[512], names[64][256], sub[64][256];
  snprintf(dir, sizeof dir, "%s/aws4_testsuite_2015_botocore", root);
  int n = list_dirs(dir, names, 64);
  for (int i = 0; i < n; i++) {
    char d[1024];
    join(d, sizeof d, dir, names[i]);
    int m = list_dirs(d, sub, 64);
    if (m == 0) botocore_case(d, names[i]);
    for (int j = 0; j < m; j++) {
      char dd[1536];
      join(dd, sizeof dd, d, sub[j]);
      botocore_case(dd, sub[j]);
    }
  }
}

static time_t parse_iso(const char *t) {
  struct tm tm = {0};
  if (!t || sscanf(t, "%4d-%2d-%2dT%2d:%2d:%2dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                   &tm.tm_min, &tm.tm_sec) != 6)
    return 0;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return timegm(&tm);
}

/* One aws-c-auth v4 case: header and query variants. */
static void crt_case(const char *dir, const char *name) {
  const char *suite = "aws-c-auth";
  char d[1024], path[1100];
  join(d, sizeof d, dir, name);
  snprintf(path, sizeof path, "%s/context.json", d);
  json_t *ctx = json_load_file(path, 0, NULL);
  char *req = slurp(d, "request.txt", "");
  http_req r;
  if (!ctx || !req || parse_req(req, &r) != 0) {
    CHECK(0, "%s/%s: cannot read context.json or request.txt", suite, name);
    json_decref(ctx);
    free(req);
    return;
  }
  json_t *cred = json_object_get(ctx, "credentials");
  const char *token = json_string_value(json_object_get(cred, "token"));
  if (json_is_true(json_object_get(ctx, "normalize")) && normalising_changes(r.target)) {
    skip(suite, name, "normalize: true changes this path; S3 does not normalise paths");
  } else if (json_is_true(json_object_get(ctx, "omit_session_token"))) {
    skip(suite, name, "omit_session_token: S3 and boto3 sign X-Amz-Security-Token");
  } else {
    br_sigv4 s;
    br_err err;
    int rc = br_sigv4_init(&s, json_string_value(json_object_get(cred, "access_key_id")),
                           json_string_value(json_object_get(cred, "secret_access_key")), token,
                           json_string_value(json_object_get(ctx, "region")),
                           json_string_value(json_object_get(ctx, "service")), &err);
    CHECK(rc == 0, "%s: %s", name, err.msg);
    time_t when = parse_iso(json_string_value(json_object_get(ctx, "timestamp")));
    uint64_t expires = (uint64_t)json_integer_value(json_object_get(ctx, "expiration_in_seconds"));
    char *hc = slurp(d, "header-canonical-request.txt", ""),
         *hs = slurp(d, "header-string-to-sign.txt", ""),
         *hsig = trim_nl(slurp(d, "header-signature.txt", "")),
         *hreq = slurp(d, "header-signed-request.txt", ""),
         *qc = slurp(d, "query-canonical-request.txt", ""),
         *qs = slurp(d, "query-string-to-sign.txt", ""),
         *qsig = trim_nl(slurp(d, "query-signature.txt", "")),
         *qreq = slurp(d, "query-signed-request.txt", "");
    /* sign_body: the signed x-amz-content-sha256 header, which our callers pass themselves */
    br_sigv4_header body_hash = {"X-Amz-Content-Sha256", r.payload};
    int sign_body = json_is_true(json_object_get(ctx, "sign_body"));
    run_header(&s, name, &r, when, sign_body ? &body_hash : NULL, hc, hs,
               hreq ? header_line(hreq, "Authorization") : NULL, hsig);
    run_query(&s, name, &r, when, expires, r.payload, qc, qs, qsig, request_line_query(qreq), 0);
    free(hc), free(hs), free(hsig), free(hreq), free(qc), free(qs), free(qsig), free(qreq);
    br_sigv4_destroy(&s);
    cases_run++;
  }
  json_decref(ctx);
  free(req);
}

static void crt_suite(const char *root) {
  char dir[512], names[64][256];
  snprintf(dir, sizeof dir, "%s/aws_c_auth_signing_test_suite/v4", root);
  int n = list_dirs(dir, names, 64);
  CHECK(n > 0, "no aws-c-auth cases under %s", dir);
  for (int i = 0; i < n; i++) crt_case(dir, names[i]);
}

/* The S3 documentation examples (and IAM's general-reference one). */
static void docs_suite(const char *root) {
  char dir[512], names[64][256];
  snprintf(dir, sizeof dir, "%s/aws_docs_examples", root);
  int n = list_dirs(dir, names, 64);
  CHECK(n > 0, "no docs examples under %s", dir);
  for (int i = 0; i < n; i++) {
    char d[1280];
    join(d, sizeof d, dir, names[i]);
    char *req = slurp(d, names[i], ".req"), *creq = slurp(d, names[i], ".creq"),
         *sts = slurp(d, names[i], ".sts"), *authz = slurp(d, names[i], ".authz"),
         *url = trim_nl(slurp(d, names[i], ".url"));
    http_req r;
    int iam = strncmp(names[i], "iam-", 4) == 0;
    br_sigv4 s;
    br_err err;
    CHECK(br_sigv4_init(&s, iam ? AKID : S3_AKID, iam ? SECRET : S3_SECRET, NULL, "us-east-1",
                        iam ? "iam" : "s3", &err) == 0,
          "%s", err.msg);
    if (!req || parse_req(req, &r) != 0) {
      CHECK(0, "docs/%s: cannot read or parse the request", names[i]);
    } else if (url) {
      /* presigned GET, X-Amz-Expires=86400 as in the S3 docs */
      run_query(&s, names[i], &r, T20130524, 86400, BR_SIGV4_UNSIGNED, creq, sts, NULL,
                strchr(url, '?') + 1, 1);
      cases_run++;
    } else {
      run_header(&s, names[i], &r, iam ? T20150830 : T20130524, NULL, creq, sts, authz, NULL);
      cases_run++;
    }
    br_sigv4_destroy(&s);
    free(req), free(creq), free(sts), free(authz), free(url);
  }
}

static void test_vectors(void) {
  if (!is_dir(VECTORS)) {
    printf("test_sigv4: %s not found (run from the repo root); AWS vectors skipped\n", VECTORS);
    return;
  }
  botocore_suite(VECTORS);
  crt_suite(VECTORS);
  docs_suite(VECTORS);
  printf("test_sigv4: AWS vectors: %d cases run, %d skipped\n", cases_run, cases_skipped);
  CHECK(cases_run >= 60, "only %d vector cases ran", cases_run);
}

static void test_uri_encode(void) {
  static const struct {
    const char *in;
    int keep_slash;
    const char *want;
  } cases[] = {
      {"", 0, ""},
      {"AZaz09-_.~", 0, "AZaz09-_.~"},
      {"a b", 0, "a%20b"},
      {"a/b/", 1, "a/b/"},
      {"a/b/", 0, "a%2Fb%2F"},
      {"+=&%?#", 1, "%2B%3D%26%25%3F%23"},
      {"!$'()*,;:@[]", 0, "%21%24%27%28%29%2A%2C%3B%3A%40%5B%5D"},
      {"\xe1\x88\xb4", 0, "%E1%88%B4"},
      {"caf\xc3\xa9/x y.txt", 1, "caf%C3%A9/x%20y.txt"},
      {"\x01\x7f\xff", 0, "%01%7F%FF"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char out[128];
    size_t n = br_sigv4_uri_encode(cases[i].in, cases[i].keep_slash, out, sizeof out);
    CHECK(n == strlen(cases[i].want) && strcmp(out, cases[i].want) == 0, "%s -> %s, want %s",
          cases[i].in, out, cases[i].want);
  }
  char small[4];
  CHECK(br_sigv4_uri_encode("abc", 0, small, sizeof small) == 3, "exact fit");
  CHECK(br_sigv4_uri_encode("abcd", 0, small, sizeof small) == 0, "one byte too long");
  CHECK(br_sigv4_uri_encode("a b", 0, small, sizeof small) == 0, "escape does not fit");
}

static void hex(const uint8_t *k, char out[65]) { br_hex_encode(k, out); }

/* Signing-key derivation (aws_docs_examples/signing-key-derivation.txt, fixed here so it runs
 * without the vectors) and the cache: same day, same key; new day, new key. */
static void test_signing_key(void) {
  br_sigv4 s;
  br_err err;
  uint8_t key[32];
  char h[65];
  CHECK(br_sigv4_init(&s, AKID, SECRET, NULL, "us-east-1", "iam", &err) == 0, "%s", err.msg);
  CHECK(s.key_date[0] == '\0', "no key before first use");
  br_sigv4_signing_key(&s, 1329264000 /* 2012-02-15T00:00:00Z */, key);
  hex(key, h);
  check_text("key 20120215", "kSigning", h,
             "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
  CHECK(strcmp(s.key_date, "20120215") == 0, "cached for %s", s.key_date);
  br_sigv4_signing_key(&s, 1329264000 + 86399, key);
  hex(key, h);
  check_text("key 20120215 23:59:59", "kSigning", h,
             "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");

  /* a signature on a new day re-derives the cached key */
  br_sigv4_request req = {"GET", "iam.amazonaws.com", "/", "", NULL, 0, BR_SIGV4_EMPTY_SHA256};
  char authz[512], date[17];
  CHECK(br_sigv4_sign(&s, &req, T20150830, authz, sizeof authz, date, &err) == 0, "%s", err.msg);
  CHECK(strcmp(s.key_date, "20150830") == 0, "cached for %s", s.key_date);
  hex(s.signing_key, h);
  check_text("key 20150830", "kSigning", h,
             "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9");
  check_text("amz date", "X-Amz-Date", date, "20150830T123600Z");
  br_sigv4_destroy(&s);
}

/* Threads signing across two days share one signer: each signature equals the one-thread one. */
struct signer_thread {
  br_sigv4 *s;
  const char *want[2];
  int bad;
};

static void *sign_loop(void *arg) {
  struct signer_thread *t = arg;
  br_sigv4_request req = {"GET", "h", "/k", "", NULL, 0, BR_SIGV4_UNSIGNED};
  for (int i = 0; i < 200; i++) {
    char authz[512], date[17];
    if (br_sigv4_sign(t->s, &req, T20150830 + (i & 1) * 86400, authz, sizeof authz, date, NULL) ||
        strcmp(authz, t->want[i & 1]) != 0)
      t->bad++;
  }
  return NULL;
}

static void test_key_cache_threads(void) {
  br_sigv4 s;
  br_sigv4_request req = {"GET", "h", "/k", "", NULL, 0, BR_SIGV4_UNSIGNED};
  char want[2][512], date[17];
  CHECK(br_sigv4_init(&s, AKID, SECRET, NULL, "us-east-1", "s3", NULL) == 0, "init");
  for (int d = 0; d < 2; d++)
    br_sigv4_sign(&s, &req, T20150830 + d * 86400, want[d], sizeof want[d], date, NULL);
  CHECK(strcmp(want[0], want[1]) != 0, "a new day signs differently");
  struct signer_thread t[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    t[i] = (struct signer_thread){&s, {want[0], want[1]}, 0};
    pthread_create(&th[i], NULL, sign_loop, &t[i]);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK(t[i].bad == 0, "thread %d: %d wrong signatures", i, t[i].bad);
  }
  br_sigv4_destroy(&s);
}

static void test_canonical_rules(void) {
  static const struct {
    const char *query, *want;
  } queries[] = {
      {"", ""},
      {"b=2&a=1", "a=1&b=2"},
      {"lifecycle", "lifecycle="},
      {"a=", "a="},
      {"&&a=1&", "a=1"},
      {"a=%7e%7E", "a=~~"},
      {"k=a%2Fb&k=a/b", "k=a%2Fb&k=a%2Fb"},
      {"x=a b&y=a+b", "x=a%20b&y=a%2Bb"},
      {"a=1&a=0&A=2", "A=2&a=0&a=1"},
      {"%zz=1&p=%4", "%25zz=1&p=%254"},
      {"prefix=photos%2F2024%2F&delimiter=%2F", "delimiter=%2F&prefix=photos%2F2024%2F"},
      {"x=1=2", "x=1%3D2"},
  };
  br_sigv4 s;
  br_err err;
  CHECK(br_sigv4_init(&s, AKID, SECRET, "", "us-east-1", "s3", &err) == 0, "%s", err.msg);
  static char creq[4096], sts[512];
  for (size_t i = 0; i < sizeof queries / sizeof *queries; i++) {
    br_sigv4_request req = {"GET", "h", "/", queries[i].query, NULL, 0, BR_SIGV4_UNSIGNED};
    CHECK(br_sigv4_canonical(&s, &req, T20150830, 0, 0, creq, sizeof creq, sts, sizeof sts, &err) ==
              0,
          "%s", err.msg);
    char *line = strchr(strchr(creq, '\n') + 1, '\n') + 1;
    line[strcspn(line, "\n")] = '\0';
    check_text(queries[i].query, "canonical query", line, queries[i].want);
  }

  /* the path is signed exactly as sent: never normalised, never encoded again */
  br_sigv4_header hs[] = {
      {"X-Amz-Content-Sha256", BR_SIGV4_UNSIGNED}, {"My-Header", "  a \t b  "}, {"my-header", "c"}};
  br_sigv4_request req = {"PUT", "b.s3.amazonaws.com", "/b/a%20b%2Fc/./../d//e", "", hs,
                          3,     BR_SIGV4_UNSIGNED};
  CHECK(
      br_sigv4_canonical(&s, &req, T20150830, 0, 0, creq, sizeof creq, sts, sizeof sts, &err) == 0,
      "%s", err.msg);
  check_text("path", "canonical request", creq,
             "PUT\n/b/a%20b%2Fc/./../d//e\n\nhost:b.s3.amazonaws.com\nmy-header:a b,c\n"
             "x-amz-content-sha256:UNSIGNED-PAYLOAD\nx-amz-date:20150830T123600Z\n\n"
             "host;my-header;x-amz-content-sha256;x-amz-date\nUNSIGNED-PAYLOAD");

  /* presign keeps the caller's parameters first, in their order, then boto3's X-Amz-* order */
  br_sigv4_request pre = {"GET", "h", "/k", "z=1&a=%2f", NULL, 0, BR_SIGV4_UNSIGNED};
  char q[1024];
  CHECK(br_sigv4_presign(&s, &pre, T20150830, 60, q, sizeof q, &err) == 0, "%s", err.msg);
  const char *want =
      "z=1&a=%2F&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20150830%2F"
      "us-east-1%2Fs3%2Faws4_request&X-Amz-Date=20150830T123600Z&X-Amz-Expires=60&"
      "X-Amz-SignedHeaders=host&X-Amz-Signature=";
  CHECK(strncmp(q, want, strlen(want)) == 0 && strlen(q) == strlen(want) + 64, "presigned %s", q);
  br_sigv4_destroy(&s);
}

static void test_errors(void) {
  br_sigv4 s;
  br_err err;
  char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  CHECK(br_sigv4_init(&s, "", SECRET, NULL, "us-east-1", "s3", &err) == -1, "empty access key");
  CHECK(br_sigv4_init(&s, AKID, SECRET, big, "us-east-1", "s3", &err) == -1, "token too long");
  CHECK(br_sigv4_init(&s, AKID, SECRET, "tok", "us-east-1", "s3", &err) == 0, "%s", err.msg);

  br_sigv4_header host = {"HOST", "x"};
  br_sigv4_request req = {"GET", "h", "/", "", &host, 1, BR_SIGV4_UNSIGNED};
  char out[2048], date[17];
  CHECK(br_sigv4_sign(&s, &req, T20150830, out, sizeof out, date, &err) == -1, "Host refused");
  req.nheaders = 0;
  CHECK(br_sigv4_sign(&s, &req, T20150830, out, 100, date, &err) == -1 && strstr(err.msg, "fit"),
        "small Authorization buffer: %s", err.msg);
  CHECK(br_sigv4_sign(&s, &req, T20150830, out, sizeof out, date, &err) == 0, "%s", err.msg);
  CHECK(strstr(out, "SignedHeaders=host;x-amz-date;x-amz-security-token,") != NULL, "%s", out);
  CHECK(br_sigv4_presign(&s, &req, T20150830, 0, out, sizeof out, &err) == -1, "expires 0");
  CHECK(br_sigv4_presign(&s, &req, T20150830, 604801, out, sizeof out, &err) == -1, "> 7 days");
  CHECK(br_sigv4_presign(&s, &req, T20150830, 604800, out, 64, &err) == -1, "small query buffer");
  CHECK(br_sigv4_presign(&s, &req, T20150830, 604800, out, sizeof out, &err) == 0, "%s", err.msg);
  CHECK(strstr(out, "&X-Amz-Security-Token=tok&X-Amz-Signature=") != NULL, "%s", out);
  /* bounds: worst-case expansion fits; too many parameters or bytes are refused, not cut */
  static char q[60001], out2[300000];
  memset(q, '%', sizeof q - 1);
  q[0] = 'a', q[1] = '=';
  q[sizeof q - 1] = '\0';
  req.query = q;
  CHECK(br_sigv4_presign(&s, &req, T20150830, 60, out2, sizeof out2, &err) == 0, "%s", err.msg);
  CHECK(strncmp(out2, "a=%25%25", 8) == 0 && strlen(out2) > 3 * 59998, "all '%%' encoded");
  for (size_t i = 0; i + 1 < 2000; i += 2) q[i] = 'a', q[i + 1] = '&';
  q[2000] = '\0';
  CHECK(br_sigv4_presign(&s, &req, T20150830, 60, out2, sizeof out2, &err) == -1 &&
            strstr(err.msg, "parameters"),
        "1000 parameters: %s", err.msg);
  memset(q, 'a', sizeof q - 1);
  q[sizeof q - 1] = '\0';
  br_sigv4_header bigh[] = {{"x-big", q}, {"x-big2", q}};
  br_sigv4_request big_req = {"GET", "h", "/", "", bigh, 2, BR_SIGV4_UNSIGNED};
  CHECK(br_sigv4_sign(&s, &big_req, T20150830, out, sizeof out, date, &err) == -1, "over 64 KiB");
  req.query = "";

  char creq[64], sts[512];
  CHECK(
      br_sigv4_canonical(&s, &req, T20150830, 0, 0, creq, sizeof creq, sts, sizeof sts, &err) == -1,
      "small canonical buffer");
  br_sigv4_destroy(&s);
}

/* --presign ACCESS SECRET TOKEN REGION HOST PATH QUERY EXPIRES UNIXTIME */
static int presign_main(char **argv) {
  br_sigv4 s;
  br_err err;
  if (br_sigv4_init(&s, argv[0], argv[1], argv[2], argv[3], "s3", &err) != 0) {
    fprintf(stderr, "test_sigv4: %s\n", err.msg);
    return 2;
  }
  br_sigv4_request req = {"GET", argv[4], argv[5], argv[6], NULL, 0, BR_SIGV4_UNSIGNED};
  static char q[16384];
  int rc = br_sigv4_presign(&s, &req, (time_t)strtoll(argv[8], NULL, 10),
                            strtoull(argv[7], NULL, 10), q, sizeof q, &err);
  br_sigv4_destroy(&s);
  if (rc != 0) {
    fprintf(stderr, "test_sigv4: %s\n", err.msg);
    return 1;
  }
  printf("%s\n", q);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--uri-encode") == 0) {
    static char out[16384];
    if (!br_sigv4_uri_encode(argv[3], atoi(argv[2]), out, sizeof out) && argv[3][0]) return 1;
    printf("%s\n", out);
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--presign") == 0) {
    if (argc != 11) {
      fprintf(stderr,
              "usage: test_sigv4 --presign ACCESS SECRET TOKEN REGION HOST PATH QUERY EXPIRES "
              "UNIXTIME\n");
      return 2;
    }
    return presign_main(argv + 2);
  }
  test_uri_encode();
  test_signing_key();
  test_key_cache_threads();
  test_canonical_rules();
  test_errors();
  test_vectors();
  return unit_summary("test_sigv4");
}
