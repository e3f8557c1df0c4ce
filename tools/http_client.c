/* HTTP client helpers for the blobref subcommands (libcurl + jansson); see http_client.h. */
#include "http_client.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <errno.h>
#include <unistd.h>
#include <sys/stat.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CONNECT_TIMEOUT_S 10L
#define LOW_SPEED_TIME_S 120L /* abort when less than 1 byte/s arrives for this long */
#define MAX_REDIRECTS 5L

int br_http_buf_append(br_http_buf *b, const void *p, size_t n) {
  if (n > b->max || b->len > b->max - n) {
    b->toobig = 1;
    return -1;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
  return 0;
}

void br_http_buf_free(br_http_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

size_t br_http_buf_write(char *ptr, size_t size, size_t nmemb, void *userdata) {
  size_t n = size * nmemb;
  if (br_http_buf_append(userdata, ptr, n) != 0) return 0; /* curl fails with WRITE_ERROR */
  return n;
}

int br_http_url(const char *base, const char *path, char *out, size_t outsize, br_err *err) {
  if (strncmp(base, "http://", 7) != 0 && strncmp(base, "https://", 8) != 0)
    return br_fail(err, "server URL must start with http:// or https:// (got '%.100s')", base);
  size_t blen = strlen(base);
  while (blen > 0 && base[blen - 1] == '/') blen--;
  while (*path == '/') path++;
  int n = snprintf(out, outsize, "%.*s/%s", (int)blen, base, path);
  if (n < 0 || (size_t)n >= outsize) return br_fail(err, "URL longer than %zu bytes", outsize - 1);
  for (const char *c = out; *c; c++)
    if ((unsigned char)*c <= ' ' || *c == 0x7f)
      return br_fail(err, "server URL contains a space or control character");
  return 0;
}

int br_http_req_init(br_http_req *r, const char *server, const char *token, const char *path,
                     br_err *err) {
  int rc = -1;
  memset(r, 0, sizeof *r);
  if (br_http_url(server, path, r->url, sizeof r->url, err) != 0) goto fail;
  r->curl = curl_easy_init();
  if (!r->curl) {
    br_fail(err, "cannot initialise libcurl");
    goto fail;
  }
  CURL *c = r->curl;
  curl_easy_setopt(c, CURLOPT_URL, r->url);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->curl_err);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "blobref/1");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, CONNECT_TIMEOUT_S);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, LOW_SPEED_TIME_S);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, MAX_REDIRECTS);
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  if (token && *token) {
    /* curl's own bearer auth: never replayed to another host on a redirect. */
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, (long)CURLAUTH_BEARER);
    curl_easy_setopt(c, CURLOPT_XOAUTH2_BEARER, token);
  }
  rc = 0;
fail:
  if (rc != 0) br_http_req_free(r);
  return rc;
}

int br_http_req_header(br_http_req *r, const char *line, br_err *err) {
  struct curl_slist *h = curl_slist_append(r->headers, line);
  if (!h) return br_fail(err, "out of memory");
  r->headers = h;
  return 0;
}

int br_http_req_perform(br_http_req *r, long *status, br_err *err) {
  *status = 0;
  r->curl_err[0] = '\0';
  curl_easy_setopt(r->curl, CURLOPT_HTTPHEADER, r->headers);
  CURLcode cc = curl_easy_perform(r->curl);
  curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, status);
  if (cc != CURLE_OK) {
    const char *why = r->curl_err[0] ? r->curl_err : curl_easy_strerror(cc);
    if (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
        cc == CURLE_OPERATION_TIMEDOUT || *status == 0)
      return br_fail(err, "cannot reach %s: %s", r->url, why);
    return br_fail(err, "transfer from %s failed: %s", r->url, why);
  }
  return 0;
}

void br_http_req_free(br_http_req *r) {
  if (r->curl) curl_easy_cleanup(r->curl);
  curl_slist_free_all(r->headers);
  r->curl = NULL;
  r->headers = NULL;
}

int br_http_json(const char *server, const char *token, const char *method, const char *path,
                 const json_t *body, long *status, json_t **reply, br_err *err) {
  int rc = -1;
  br_http_req req;
  br_http_buf buf = {.max = BR_HTTP_JSON_MAX};
  char *text = NULL;
  *status = 0;
  *reply = NULL;
  if (br_http_req_init(&req, server, token, path, err) != 0) return -1;
  curl_easy_setopt(req.curl, CURLOPT_CUSTOMREQUEST, method);
  if (body) {
    text = json_dumps(body, JSON_COMPACT);
    if (!text) {
      br_fail(err, "out of memory");
      goto fail;
    }
    if (br_http_req_header(&req, "Content-Type: application/json", err) != 0 ||
        br_http_req_header(&req, "Expect:", err) != 0)
      goto fail;
    curl_easy_setopt(req.curl, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(req.curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(text));
  }
  curl_easy_setopt(req.curl, CURLOPT_WRITEFUNCTION, br_http_buf_write);
  curl_easy_setopt(req.curl, CURLOPT_WRITEDATA, &buf);
  if (br_http_req_perform(&req, status, err) != 0) {
    if (buf.toobig) br_fail(err, "reply from %s larger than %zu bytes", req.url, buf.max);
    goto fail;
  }
  if (*status < 200 || *status > 299) {
    char line[sizeof err->msg];
    br_http_error_text(*status, buf.data, buf.len, line, sizeof line);
    br_fail(err, "%s", line);
    goto fail;
  }
  *reply = buf.len ? json_loadb(buf.data, buf.len, 0, NULL) : NULL;
  if (!*reply) {
    br_fail(err, "reply from %s is not JSON", req.url);
    goto fail;
  }
  rc = 0;
fail:
  free(text);
  br_http_buf_free(&buf);
  br_http_req_free(&req);
  return rc;
}

/* Copies at most n bytes of s into out (bounded by outsize), replacing anything that is not
 * printable ASCII with '?'. Returns the number of characters written. */
static size_t copy_printable(char *out, size_t outsize, const char *s, size_t n) {
  size_t i = 0;
  if (outsize == 0) return 0;
  for (; i < n && i + 1 < outsize; i++) {
    unsigned char ch = (unsigned char)s[i];
    out[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
  }
  out[i] = '\0';
  return i;
}

void br_http_error_text(long status, const char *body, size_t len, char *out, size_t outsize) {
  char code[64] = "", msg[256] = "";
  json_t *root = NULL;
  if (outsize == 0) return;
  if (body && len > 0) root = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
  json_t *e = root ? json_object_get(root, "error") : NULL;
  const char *jc = e ? json_string_value(json_object_get(e, "code")) : NULL;
  const char *jm = e ? json_string_value(json_object_get(e, "message")) : NULL;
  if (jc) {
    copy_printable(code, sizeof code, jc, strlen(jc));
    if (jm) copy_printable(msg, sizeof msg, jm, strlen(jm));
    if (msg[0])
      snprintf(out, outsize, "%s: %s (HTTP %ld)", code, msg, status);
    else
      snprintf(out, outsize, "%s (HTTP %ld)", code, status);
  } else if (body && len > 0) {
    copy_printable(msg, 81, body, len);
    snprintf(out, outsize, "HTTP %ld: %s", status, msg);
  } else {
    snprintf(out, outsize, "HTTP %ld", status);
  }
  json_decref(root);
}

int br_cli_hash_parse(const char *arg, char hex[BR_HEX_LEN + 1]) {
  uint8_t digest[BR_SHA256_LEN];
  if (!arg) return -1;
  if (strncmp(arg, "sha256:", 7) == 0) arg += 7;
  size_t len = strnlen(arg, BR_HEX_LEN + 1);
  if (br_hex_decode(arg, len, digest) != 0) return -1;
  br_hex_encode(digest, hex);
  return 0;
}

/* Reads a decimal of at most 18 digits at *p (so that it fits in int64). */
static int parse_decimal(const char **p, uint64_t *out) {
  const char *s = *p;
  uint64_t v = 0;
  int digits = 0;
  while (*s >= '0' && *s <= '9') {
    if (++digits > 18) return -1;
    v = v * 10 + (uint64_t)(*s - '0');
    s++;
  }
  if (digits == 0) return -1;
  *p = s;
  *out = v;
  return 0;
}

int br_cli_range_check(const char *spec, const char **spec_out, br_err *err) {
  if (!spec) return br_fail(err, "missing range");
  if (strncmp(spec, "bytes=", 6) == 0) spec += 6;
  if (strnlen(spec, BR_CLI_RANGE_SPEC_MAX + 1) > BR_CLI_RANGE_SPEC_MAX)
    return br_fail(err, "range longer than %d characters", BR_CLI_RANGE_SPEC_MAX);
  const char *p = spec;
  int count = 0;
  for (;;) {
    uint64_t first = 0, last = 0;
    while (*p == ' ') p++;
    if (++count > BR_CLI_RANGE_COUNT_MAX)
      return br_fail(err, "more than %d ranges", BR_CLI_RANGE_COUNT_MAX);
    if (*p == '-') {
      p++;
      if (parse_decimal(&p, &last) != 0 || last == 0)
        return br_fail(err, "range %d: '-N' needs a positive byte count", count);
    } else {
      if (parse_decimal(&p, &first) != 0 || *p != '-')
        return br_fail(err, "range %d: expected FIRST-LAST, FIRST- or -SUFFIX", count);
      p++;
      if (*p >= '0' && *p <= '9') {
        if (parse_decimal(&p, &last) != 0) return br_fail(err, "range %d: number too large", count);
        if (last < first) return br_fail(err, "range %d: last byte before first", count);
      }
    }
    while (*p == ' ') p++;
    if (*p == '\0') break;
    if (*p != ',') return br_fail(err, "range %d: unexpected '%c'", count, *p);
    p++;
  }
  *spec_out = spec;
  return 0;
}

int br_cli_content_type_check(const char *type) {
  size_t n = strnlen(type, BR_CLI_CONTENT_TYPE_MAX + 1);
  if (n == 0 || n > BR_CLI_CONTENT_TYPE_MAX) return -1;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)type[i] < 0x20 || (unsigned char)type[i] >= 0x7f) return -1;
  return 0;
}

/* Opens a temporary file next to path (same directory, so rename is atomic) with the
 * permissions a new file would get. Writes its name into tmp. Returns the FILE or NULL. */
FILE *br_cli_open_temp_next_to(const char *path, char *tmp, size_t tmpsize, br_err *err) {
  char dirbuf[4096], basebuf[4096];
  if (strlen(path) >= sizeof dirbuf) {
    br_fail(err, "output path too long");
    return NULL;
  }
  strcpy(dirbuf, path);
  strcpy(basebuf, path);
  const char *dir = dirname(dirbuf), *base = basename(basebuf);
  int n = snprintf(tmp, tmpsize, "%s/.%s.blobref-XXXXXX", dir, base);
  if (n < 0 || (size_t)n >= tmpsize) {
    br_fail(err, "output path too long");
    return NULL;
  }
  int fd = mkstemp(tmp);
  if (fd < 0) {
    br_fail(err, "cannot create a temporary file in %s: %s", dir, strerror(errno));
    tmp[0] = '\0';
    return NULL;
  }
  mode_t mask = umask(0);
  umask(mask);
  if (fchmod(fd, 0666 & ~mask) != 0) { /* mkstemp makes 0600 */
    br_fail(err, "cannot set the mode of %s: %s", tmp, strerror(errno));
    close(fd);
    return NULL;
  }
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    br_fail(err, "cannot open %s: %s", tmp, strerror(errno));
    close(fd);
  }
  return f;
}

size_t br_cli_edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 32 || lb > 32) return 99;
  size_t d[33][33];
  for (size_t i = 0; i <= la; i++) d[i][0] = i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[la][lb];
}

int br_cli_bad_option(const char *cmd, char **argv, const struct option *longopts) {
  static const char *const globals[] = {"json", "server", "token"};
  const char *arg = optind > 0 && argv[optind - 1] ? argv[optind - 1] : "?";
  if (strncmp(arg, "--", 2) != 0 || !arg[2])
    return br_cli_usage_error(cmd, "unknown option or missing argument: '%.80s'", arg);
  char typed[40];
  size_t n = strcspn(arg + 2, "=");
  snprintf(typed, sizeof typed, "%.*s", (int)(n < sizeof typed ? n : sizeof typed - 1), arg + 2);
  const char *best = NULL, *prefix_of = NULL;
  size_t best_d = 3, prefixes = 0, nlong = 0;
  while (longopts && longopts[nlong].name) nlong++;
  for (size_t i = 0; i < nlong + 3; i++) {
    const char *name = i < nlong ? longopts[i].name : globals[i - nlong];
    if (!strcmp(name, typed) && i < nlong && longopts[i].has_arg == required_argument)
      return br_cli_usage_error(cmd, "--%s needs a value", name);
    size_t d = br_cli_edit_distance(typed, name);
    if (d < best_d) best_d = d, best = name;
    if (!strncmp(name, typed, strlen(typed))) prefixes++, prefix_of = name;
  }
  if (!best && prefixes == 1) best = prefix_of;
  if (best)
    return br_cli_usage_error(cmd, "unknown option '--%s'; did you mean --%s?", typed, best);
  return br_cli_usage_error(cmd, "unknown option '--%s'", typed);
}

int br_cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "blobref %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see 'blobref %s --help')\n", cmd);
  return 2;
}
