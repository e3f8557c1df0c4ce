/* The HTTP dispatcher: the libmicrohttpd daemons, header checks, route table dispatch, auth, the
 * request lifecycle, and the front's start and stop order. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http/handlers.h"
#include "http/ops.h"
#include "http/proxy.h"
#include "http/rehash.h"
#include "http/tls.h"

/* After an error in the middle of a body, at most this much more is read (so that the client can
 * see the error) before the connection is cut. */
#define DROP_MAX (16u << 20)

/* Matches url against a route pattern; a "{hash}", "{id}" or "{file}" segment captures one path
 * segment (possibly empty). */
static int pattern_match(const char *pattern, const char *url, const char **cap, size_t *cap_len) {
  const char *p = pattern, *u = url;
  while (*p) {
    if (*p == '{') { /* routes use '{' only to open a capture */
      const char *end = strchr(u, '/');
      if (!end) end = u + strlen(u);
      *cap = u;
      *cap_len = (size_t)(end - u);
      u = end;
      p = strchr(p, '}') + 1;
      continue;
    }
    if (*p++ != *u++) return 0;
  }
  return *u == '\0';
}

/* Leaves %00..%1F, %7F and %2F encoded, so that a control byte can never hide in a decoded path
 * and an encoded slash never makes a new path segment. */
static size_t unescape_path(void *cls, struct MHD_Connection *c, char *s) {
  (void)cls, (void)c;
  char *w = s;
  for (const char *r = s; *r; r++) {
    int hi, lo;
    if (r[0] == '%' && r[1] && r[2] &&
        (hi = (r[1] >= '0' && r[1] <= '9')               ? r[1] - '0'
              : (r[1] | 32) >= 'a' && (r[1] | 32) <= 'f' ? (r[1] | 32) - 'a' + 10
                                                         : -1) >= 0 &&
        (lo = (r[2] >= '0' && r[2] <= '9')               ? r[2] - '0'
              : (r[2] | 32) >= 'a' && (r[2] | 32) <= 'f' ? (r[2] | 32) - 'a' + 10
                                                         : -1) >= 0) {
      int v = hi << 4 | lo;
      if (v >= 0x20 && v != 0x7f && v != '/') {
        *w++ = (char)v;
        r += 2;
        continue;
      }
    }
    *w++ = *r;
  }
  *w = '\0';
  return (size_t)(w - s);
}

static enum MHD_Result add_header_size(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value) {
  (void)kind;
  size_t *total = cls;
  *total += strlen(key) + (value ? strlen(value) : 0) + 4;
  return MHD_YES;
}

static enum MHD_Result add_arg_size(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
  (void)kind;
  size_t *total = cls;
  *total += strlen(key) + (value ? strlen(value) + 1 : 0) + 1;
  return MHD_YES;
}

/* libmicrohttpd parses every query argument into the connection's memory pool (one header
 * record each) before any handler runs; a pool that runs out leaves the request unanswered until
 * the connection times out. on_uri counts them first and drops the query when there are more. */
#define MAX_QUERY_ARGS 64

/* The query's argument names seen so far, to find one given twice (?dry_run=1&dry_run=0 must not
 * mean whichever a handler happens to read). Borrowed from libmicrohttpd for the request. */
struct arg_scan {
  const char *names[MAX_QUERY_ARGS];
  size_t n;
  const char *repeated; /* the first name given twice, or NULL */
};

static enum MHD_Result scan_arg_names(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value) {
  (void)kind, (void)value;
  struct arg_scan *as = cls;
  for (size_t i = 0; i < as->n; i++)
    if (!strcmp(as->names[i], key)) {
      as->repeated = key;
      return MHD_NO;
    }
  if (as->n < MAX_QUERY_ARGS) as->names[as->n++] = key; /* on_uri keeps there no more */
  return MHD_YES;
}

/* RFC 9110 5.6.2: the characters of a token (what a field name must consist of). */
static int is_tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* What start_request needs to know about the header fields, in one pass. */
struct header_scan {
  int bad_name;         /* a field name that is empty or not a token ("Content-Length ") */
  int hosts;            /* Host field lines */
  int lengths;          /* Content-Length field lines ... */
  int conflicting;      /* ... with differing values */
  const char *length;   /* the first Content-Length value */
  int encodings;        /* Transfer-Encoding field lines */
  const char *encoding; /* the first Transfer-Encoding value */
};

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
  (void)kind;
  struct header_scan *hs = cls;
  if (!value) value = "";
  if (!*key) hs->bad_name = 1;
  for (const char *k = key; *k; k++)
    if (!is_tchar((unsigned char)*k)) hs->bad_name = 1;
  if (!strcasecmp(key, MHD_HTTP_HEADER_HOST)) {
    hs->hosts++;
  } else if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
    if (hs->lengths++ == 0)
      hs->length = value;
    else if (strcmp(hs->length, value) != 0)
      hs->conflicting = 1;
  } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
    if (hs->encodings++ == 0) hs->encoding = value;
  }
  return MHD_YES;
}

/* RFC 9112 6.1, 6.3, 3.2, 5.1: field names that are not tokens (libmicrohttpd keeps
 * "Content-Length " as a name of its own, so the body would be taken as empty and the request
 * hidden in it run), a transfer coding other than exactly chunked (which libmicrohttpd would read
 * until the connection closes), differing Content-Lengths or one beside Transfer-Encoding (request
 * smuggling behind a proxy), and more than one Host. NULL when the header is acceptable. */
static const char *header_problem(const struct header_scan *hs) {
  if (hs->bad_name) return "a header field name is empty or holds whitespace or a separator";
  if (hs->encodings > 1 || (hs->encodings && strcasecmp(hs->encoding, "chunked") != 0))
    return "the only transfer coding accepted is chunked";
  if (hs->conflicting || (hs->lengths && hs->encodings))
    return "conflicting Content-Length, or Content-Length with Transfer-Encoding";
  if (hs->hosts > 1) return "more than one Host header";
  return NULL;
}

/* A body follows when the request is chunked or its Content-Length is not zero (in any
 * spelling: "00" is zero too). */
static int request_has_body(const struct header_scan *hs) {
  if (hs->encodings) return 1;
  if (!hs->lengths) return 0;
  char *end = NULL;
  errno = 0;
  unsigned long long n = strtoull(hs->length, &end, 10);
  return errno || end == hs->length || *end || n != 0;
}

/* RFC 9112 3.2.2: a server must accept the absolute form "http://authority/path" of a request
 * target; routing looks at its path ("/" when there is none). */
static const char *origin_path(const char *url) {
  const char *p = url;
  if (!strncasecmp(p, "http://", 7))
    p += 7;
  else if (!strncasecmp(p, "https://", 8))
    p += 8;
  else
    return url;
  const char *slash = strchr(p, '/');
  return slash ? slash : "/";
}

/* Remembers an error found on the first call. Requests with a body are answered at once (the
 * body is not wanted; libmicrohttpd then closes the connection); body-less ones on their final
 * call, which keeps the connection alive. */
static enum MHD_Result early_error(struct request *req, int has_body, enum br_api_error e,
                                   const char *msg) {
  if (has_body) return reply_error(req, e, "%s", msg);
  request_fail(req, e, "%s", msg);
  return MHD_YES;
}

/* First call of a request: headers are known, the body (if any) is not. */
static enum MHD_Result start_request(struct request *req, const char *url, const char *version) {
  const br_config *cfg = req->srv->cfg;
  req->route_index = -1;
  struct header_scan hs = {0};
  MHD_get_connection_values(req->conn, MHD_HEADER_KIND, scan_header, &hs);
  const char *problem = header_problem(&hs);
  if (problem) {
    /* where the request ends is unclear: answer at once and read nothing more from the client */
    req->close_after = 1;
    return reply_error(req, E_BAD_REQUEST, "%s", problem);
  }
  int has_body = request_has_body(&hs);
  if (req->query_cut) return early_error(req, has_body, E_URL_TOO_LONG, "too many query arguments");
  size_t target_len = strlen(url);
  MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, add_arg_size, &target_len);
  if (target_len > cfg->max_url_length)
    return early_error(req, has_body, E_URL_TOO_LONG, "the URL is too long");
  struct arg_scan as = {.n = 0};
  MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, scan_arg_names, &as);
  if (as.repeated) {
    char msg[128];
    snprintf(msg, sizeof msg, "query parameter '%.60s' is given more than once", as.repeated);
    return early_error(req, has_body, E_BAD_REQUEST, msg);
  }
  if (!strcmp(version, MHD_HTTP_VERSION_1_1) &&
      !MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST))
    return early_error(req, has_body, E_BAD_REQUEST, "HTTP/1.1 requests need a Host header");
  size_t header_bytes = 0;
  MHD_get_connection_values(req->conn, MHD_HEADER_KIND, add_header_size, &header_bytes);
  if (header_bytes > cfg->max_header_size)
    return early_error(req, has_body, E_HEADERS_TOO_LARGE, "the request headers are too large");

  const char *cap = NULL;
  size_t cap_len = 0;
  int path_known = 0;
  const char *path = origin_path(url);
  for (size_t i = 0; i < br_nroutes; i++) {
    cap = NULL; /* so that cap is the chosen route's capture once the loop ends */
    if (!pattern_match(br_routes[i].pattern, path, &cap, &cap_len)) continue;
    path_known = 1;
    if (!req->route) req->route = &br_routes[i]; /* for the Allow header on a 405 */
    int same = !strcmp(br_routes[i].method, req->method) ||
               (req->is_head && !strcmp(br_routes[i].method, MHD_HTTP_METHOD_GET));
    if (!same) continue;
    req->route = &br_routes[i];
    req->route_index = (int)i;
    break;
  }
  if (!path_known) return early_error(req, has_body, E_NO_ROUTE, "no such endpoint");
  if (req->route_index < 0)
    return early_error(req, has_body, E_METHOD_NOT_ALLOWED, "method not allowed here");
  if (cap && strstr(req->route->pattern, "{id}")) {
    char num[24];
    char *end = NULL;
    if (!cap_len || cap_len >= sizeof num || cap[0] < '0' || cap[0] > '9')
      return early_error(req, has_body, E_NOT_FOUND, "no such run");
    memcpy(num, cap, cap_len);
    num[cap_len] = '\0';
    req->run_id = strtoull(num, &end, 10);
    if (*end) return early_error(req, has_body, E_NOT_FOUND, "no such run");
  } else if (cap && strstr(req->route->pattern, "{hash}")) { /* {file}: the handler's to read */
    if (br_blob_id_parse(cap, cap_len, req->digest) < 0)
      return early_error(req, has_body, E_BAD_HASH,
                         "a blob id is 64 lowercase hex digits, optionally after sha256:");
    req->has_digest = 1;
  }
  unsigned scopes = 0;
  if (req->route->scope) {
    if (ops_granted_scopes(req, &scopes) < 0)
      return early_error(req, has_body, E_UNAUTHORIZED, "unknown bearer token");
    if ((scopes & req->route->scope) != req->route->scope) {
      int anonymous =
          !MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
      return early_error(req, has_body, anonymous ? E_UNAUTHORIZED : E_FORBIDDEN,
                         anonymous ? "this needs a bearer token" : "the token lacks the scope");
    }
  }
  if (!req->route->body && has_body)
    return reply_error(req, E_BAD_REQUEST, "this endpoint takes no request body");
  if (req->route->body == json_body && hs.lengths) {
    /* the whole declared body is taken from the budget of buffered JSON now, so that a request
     * that does not fit is refused before it is read (json_body takes more for chunked ones) */
    uint64_t want = strtoull(hs.length, NULL, 10);
    if (want > cfg->max_json_size) want = cfg->max_json_size;
    if (want && ops_json_reserve(req, want) < 0)
      return reply_error(req, E_TRY_AGAIN, "too many JSON request bodies in flight; retry");
  }
  req->phase = PHASE_BODY;
  if (req->route->begin) return req->route->begin(req);
  return MHD_YES;
}

/* Marks, as the request context that on_uri hands to the first handler call, a target whose query
 * was cut off. Not an allocation: libmicrohttpd does not call on_completed for a request it fails
 * itself (headers over its pool, for one) after this callback, so anything allocated here could
 * leak. */
static char query_cut;

/* libmicrohttpd's URI log callback: called with the raw request target before it parses the query
 * into the connection's pool. When the query has more than MAX_QUERY_ARGS arguments it is cut off
 * (a NUL written right after the '?', in libmicrohttpd's own writable copy of the request line) so
 * that the request can still be answered, with 414, instead of hanging on an exhausted pool. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
  (void)cls, (void)conn;
  const char *q = strchr(uri, '?');
  if (!q) return NULL;
  unsigned n = 1;
  for (const char *p = q + 1; *p; p++) n += *p == '&';
  if (n <= MAX_QUERY_ARGS) return NULL;
  ((char *)q)[1] = '\0';
  return &query_cut;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  br_http *http = cls;
  struct request *req = *con_cls;
  if (!req || (void *)req == &query_cut) { /* first call: headers known */
    int cut = req != NULL;
    req = calloc(1, sizeof *req);
    if (!req) return MHD_NO;
    req->http = http;
    req->srv = http->srv;
    req->conn = conn;
    req->method = method;
    req->is_head = !strcmp(method, MHD_HTTP_METHOD_HEAD);
    req->query_cut = cut;
    req->path = url;
    atomic_fetch_add(&http->requests_in_progress, 1);
    *con_cls = req;
    ops_request_begin(req);
    ops_track(req, TRACK_BODY);
    return start_request(req, url, version);
  }
  if (*upload_data_size) {
    req->bytes_in += *upload_data_size;
    if (!req->body_start_ns) req->body_start_ns = br_mono_ns();
    ops_track_body(req);
  } else if (req->phase != PHASE_SUSPENDED) {
    ops_track(req, TRACK_BUSY);
    if (req->body_start_ns && req->route && req->route->scope == BR_SCOPE_WRITE) {
      atomic_fetch_add(&http->upload_step_ns[STEP_RECEIVE], br_mono_ns() - req->body_start_ns);
      req->body_start_ns = 0;
    }
  }
  if (req->phase == PHASE_ANSWERED) { /* answered early: drop whatever body still arrives */
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (*upload_data_size) {
    size_t len = *upload_data_size;
    *upload_data_size = 0;
    if (req->has_pending) {
      req->dropped += len;
      return req->dropped > DROP_MAX ? MHD_NO : MHD_YES; /* MHD_NO closes the connection */
    }
    if (req->route && req->route->body) req->route->body(req, upload_data, len);
    return MHD_YES;
  }
  if (req->has_pending) return reply_error(req, req->pending, "%s", req->pending_message);
  if (req->phase == PHASE_SUSPENDED) {
    if (!req->proxy) return MHD_YES;
    req->phase = PHASE_RESUMED; /* a proxied read whose origin answered */
  }
  return req->route->finish(req);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)conn;
  br_http *http = cls;
  struct request *req = *con_cls;
  *con_cls = NULL;
  if (!req || (void *)req == &query_cut) return;
  if (req->route_index >= 0 && req->route_index < BR_MAX_ROUTES && req->status >= 100 &&
      req->status < 600)
    atomic_fetch_add(&http->requests[req->route_index][req->status / 100], 1);
  ops_request_end(req);
  ops_track(req, TRACK_HEAD);
  if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && req->writer)
    br_info("%s %s: client went away after %llu bytes; nothing kept", req->method,
            req->route ? req->route->pattern : "-", (unsigned long long)req->received);
  atomic_fetch_sub(&http->requests_in_progress, 1);
  request_free_upload(req);
  proxy_request_done(req);
  free(req->body);
  free(req->sniff_buf);
  if (req->job_free)
    req->job_free(req->job_data);
  else
    free(req->job_data);
  free(req);
  *con_cls = NULL;
}

/* ---- daemon -----------------------------------------------------------------------------------
 */

/* Accept policy: every connection, until the server starts stopping. */
static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
  (void)addr, (void)addrlen;
  br_http *http = cls;
  return atomic_load(&http->refuse_connections) ? MHD_NO : MHD_YES;
}

static void log_mhd(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  char line[512];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
  br_warn("http: %s", line);
}

/* Parses "HOST:PORT", "[V6]:PORT" or ":PORT" into a socket address. */
static int parse_listen(const char *listen, struct sockaddr_storage *ss, socklen_t *len,
                        br_err *err) {
  char host[256];
  const char *colon = strrchr(listen, ':');
  if (!colon) return br_fail(err, "listen: '%s' is not HOST:PORT", listen);
  char *end = NULL;
  long port = strtol(colon + 1, &end, 10);
  if (!colon[1] || *end || port < 0 || port > 65535)
    return br_fail(err, "listen: bad port in '%s'", listen);
  size_t hlen = (size_t)(colon - listen);
  if (hlen >= sizeof host) return br_fail(err, "listen: host too long");
  memcpy(host, listen, hlen);
  host[hlen] = '\0';
  memset(ss, 0, sizeof *ss);
  if (hlen >= 2 && host[0] == '[' && host[hlen - 1] == ']') {
    host[hlen - 1] = '\0';
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)port);
    if (inet_pton(AF_INET6, host + 1, &a6->sin6_addr) != 1)
      return br_fail(err, "listen: bad IPv6 address in '%s'", listen);
    *len = sizeof *a6;
    return 0;
  }
  struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
  a4->sin_family = AF_INET;
  a4->sin_port = htons((uint16_t)port);
  if (!*host || !strcmp(host, "*") || !strcmp(host, "0.0.0.0"))
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
  else if (!strcmp(host, "localhost"))
    a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  else if (inet_pton(AF_INET, host, &a4->sin_addr) != 1)
    return br_fail(err, "listen: '%s' is not an IPv4 address (use [v6] for IPv6)", host);
  *len = sizeof *a4;
  return 0;
}

/* One libmicrohttpd daemon on listen (HTTPS when tls), with every handler. NULL with err. */
static struct MHD_Daemon *start_daemon(br_http *http, const char *listen, int tls, unsigned threads,
                                       br_err *err) {
  const br_config *cfg = http->srv->cfg;
  struct sockaddr_storage ss;
  socklen_t sslen;
  if (parse_listen(listen, &ss, &sslen, err) < 0) return NULL;
  /* TURBO: opportunistic reads and writes, no shutdown() before close; it more than doubled
   * new connections per second here (every dedup answered before its body is one) */
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ITC | MHD_USE_ERROR_LOG | MHD_USE_TURBO |
                   (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0) | (tls ? MHD_USE_TLS : 0);
  struct MHD_OptionItem tls_opts[] = {
      {tls ? MHD_OPTION_HTTPS_CERT_CALLBACK : MHD_OPTION_END, 0, tls_cert_callback()},
      {MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)cfg->tls_priorities},
      {MHD_OPTION_END, 0, NULL}};
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, 0, accept_policy, http, on_request, http, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE, threads,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned)(cfg->connection_timeout_ms / 1000), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      (size_t)cfg->connection_memory, MHD_OPTION_NOTIFY_COMPLETED, on_completed, http,
      MHD_OPTION_UNESCAPE_CALLBACK, unescape_path, NULL, MHD_OPTION_URI_LOG_CALLBACK, on_uri, http,
      MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024, MHD_OPTION_NOTIFY_CONNECTION, ops_notify_connection,
      http, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_ip,
      MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_END);
  if (!d) {
    br_fail(err, "cannot listen on %s%s: %s", listen, tls ? " (HTTPS)" : "", strerror(errno));
    return NULL;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  char host[128];
  snprintf(host, sizeof host, "%.*s", (int)(strrchr(listen, ':') - listen), listen);
  br_info("listening on %s://%s:%u (%u network threads)", tls ? "https" : "http",
          *host ? host : "0.0.0.0", info ? info->port : 0, threads);
  return d;
}

br_http *br_http_new(void) { return calloc(1, sizeof(br_http)); }

void br_http_free(br_http *http) { free(http); }

int br_http_start(br_http *http, br_server *srv, br_err *err) {
  const br_config *cfg = srv->cfg;
  http->srv = srv;
  http->routes = br_routes;
  http->nroutes = br_nroutes;
  struct sockaddr_storage ss;
  socklen_t sslen;
  if (parse_listen(cfg->listen, &ss, &sslen, err) < 0) return -1;
  if (*cfg->listen_plain && parse_listen(cfg->listen_plain, &ss, &sslen, err) < 0) return -1;
  if (*cfg->tls_cert && tls_load(cfg->tls_cert, cfg->tls_key, err) < 0) return -1;
  if (ops_start(http, err) < 0) return -1;
  if (proxy_engine_start(http, err) < 0) return -1;
  if (request_finishers_start(http, err) < 0) return -1;
  if (request_spool_start(http, err) < 0) return -1;
  if (rehash_start(http, err) < 0) return -1;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned threads = cfg->threads ? (unsigned)cfg->threads : (unsigned)(cores > 0 ? cores : 1);
  http->daemon = start_daemon(http, cfg->listen, *cfg->tls_cert != '\0', threads, err);
  if (!http->daemon) return -1;
  if (*cfg->listen_plain) {
    http->daemon_plain = start_daemon(http, cfg->listen_plain, 0, threads, err);
    if (!http->daemon_plain) return -1;
  }
  atomic_store(&http->ready, 1);
  return 0;
}

void br_http_stop(br_http *http) {
  atomic_store(&http->ready, 0);
  if (http->daemon) {
    const br_config *cfg = http->srv->cfg;
    /* no new connections: the accept policy refuses them from now on. (MHD_quiesce_daemon races
     * the thread pool's own removal of the listening socket from its epoll sets in 0.9.75 and
     * can abort the process: "Failed to remove listen FD from epoll set", seen under load.) */
    atomic_store(&http->refuse_connections, 1);
    /* Requests in progress, uploads still streaming their body included, run to their end (up to
     * shutdown_timeout); their answers close the connection. Idle keep-alive connections hold
     * nothing up: MHD_stop_daemon closes them. */
    atomic_store(&http->draining, 1);
    uint64_t drain_end = br_now_ms() + cfg->shutdown_timeout_ms;
    while (atomic_load(&http->requests_in_progress) > 0 && br_now_ms() < drain_end) usleep(5000);
    int cut = atomic_load(&http->requests_in_progress) - atomic_load(&http->jobs_in_flight);
    if (cut > 0)
      br_warn("stopping: cutting %d request(s) still in progress after %llu ms", cut,
              (unsigned long long)cfg->shutdown_timeout_ms);
    /* Uploads paused for their S3 spool go on (unpaused: the spool caps still hold) */
    request_spool_stop(http);
    /* Uploads that complete their body from now on get 503; those already with a finisher
     * complete (bounded by one fsync and one index commit each). libmicrohttpd must not be
     * stopped while a connection is suspended. */
    pthread_mutex_lock(&http->job_lock);
    http->stopping = 1;
    pthread_mutex_unlock(&http->job_lock);
    uint64_t deadline = br_now_ms() + cfg->shutdown_timeout_ms;
    while (atomic_load(&http->jobs_in_flight) > 0) {
      if (br_now_ms() > deadline) {
        br_warn("stopping: still waiting for %d upload(s) to become durable",
                (int)atomic_load(&http->jobs_in_flight));
        deadline = br_now_ms() + cfg->shutdown_timeout_ms;
      }
      usleep(5000);
    }
    /* proxied reads in progress end now: their suspended connections resume with an error */
    proxy_engine_stop(http);
    MHD_stop_daemon(http->daemon);
    http->daemon = NULL;
    if (http->daemon_plain) MHD_stop_daemon(http->daemon_plain);
    http->daemon_plain = NULL;
  }
  rehash_stop(http);
  request_finishers_stop(http);
  request_spool_stop(http); /* when the daemon never started */
  proxy_engine_stop(http);  /* when the daemon never started */
  ops_stop(http);
  tls_unload();
}

int br_http_reload(br_http *http, const br_config *fresh, br_err *err) {
  return ops_reload(http, fresh, err);
}
