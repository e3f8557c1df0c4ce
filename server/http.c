/* The HTTP front: libmicrohttpd daemon, route table dispatch, auth, request lifecycle, and the
 * finisher threads that make uploads durable without blocking the network threads. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "httpd.h"

#define FINISHER_THREADS 32
/* After an error in the middle of a body, at most this much more is read (so that the client can
 * see the error) before the connection is cut. */
#define DROP_MAX (16u << 20)

br_store *br_server_store(br_server *srv, const char *name) {
  for (int i = 0; i < srv->nstores; i++)
    if (!strcmp(br_store_name(srv->stores[i]), name)) return srv->stores[i];
  return NULL;
}

/* Matches url against a route pattern; a "{hash}" segment captures one path segment. */
static int pattern_match(const char *pattern, const char *url, const char **cap, size_t *cap_len) {
  const char *p = pattern, *u = url;
  while (*p) {
    if (!strncmp(p, "{hash}", 6)) {
      const char *end = strchr(u, '/');
      if (!end) end = u + strlen(u);
      *cap = u;
      *cap_len = (size_t)(end - u);
      u = end;
      p += 6;
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

struct length_headers {
  int count, conflicting;
  const char *first;
};

static enum MHD_Result note_length(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
  (void)kind;
  struct length_headers *lh = cls;
  if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) != 0) return MHD_YES;
  if (lh->count++ == 0)
    lh->first = value;
  else if (strcmp(lh->first ? lh->first : "", value ? value : "") != 0)
    lh->conflicting = 1;
  return MHD_YES;
}

/* RFC 9112 6.3: differing Content-Lengths, or one beside Transfer-Encoding, make the body's end
 * ambiguous (request smuggling behind a proxy): such requests are refused and the connection
 * closed. */
static int body_framing_ambiguous(struct request *req) {
  struct length_headers lh = {0, 0, NULL};
  MHD_get_connection_values(req->conn, MHD_HEADER_KIND, note_length, &lh);
  return lh.conflicting ||
         (lh.count && MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND,
                                                  MHD_HTTP_HEADER_TRANSFER_ENCODING));
}

static int request_has_body(struct request *req) {
  const char *cl =
      MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  const char *te =
      MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
  return te != NULL || (cl != NULL && strcmp(cl, "0") != 0);
}

/* Scopes granted to this request: all when no tokens are configured, else the bearer token's
 * (by SHA-256 digest) or the anonymous ones. Returns -1 for a token that is not known. */
static int granted_scopes(struct request *req, unsigned *scopes) {
  const br_config *cfg = req->srv->cfg;
  if (cfg->ntokens == 0) {
    *scopes = BR_SCOPE_READ | BR_SCOPE_WRITE | BR_SCOPE_ADMIN;
    return 0;
  }
  const char *auth =
      MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!auth) {
    *scopes = cfg->anonymous_scopes;
    return 0;
  }
  if (strncasecmp(auth, "Bearer ", 7) != 0) return -1;
  const char *token = auth + 7;
  while (*token == ' ') token++;
  uint8_t digest[BR_SHA256_LEN];
  SHA256((const unsigned char *)token, strlen(token), digest);
  for (int i = 0; i < cfg->ntokens; i++)
    if (CRYPTO_memcmp(digest, cfg->tokens[i].sha256, BR_SHA256_LEN) == 0) {
      *scopes = cfg->tokens[i].scopes;
      return 0;
    }
  return -1;
}

void request_fail(struct request *req, enum br_api_error e, const char *fmt, ...) {
  if (req->has_pending) return; /* the first error is the one that counts */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(req->pending_message, sizeof req->pending_message, fmt, ap);
  va_end(ap);
  req->has_pending = 1;
  req->pending = e;
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
  int has_body = request_has_body(req);
  req->route_index = -1;
  if (body_framing_ambiguous(req))
    return reply_error(req, E_BAD_REQUEST,
                       "conflicting Content-Length, or Content-Length with Transfer-Encoding");
  size_t target_len = strlen(url);
  MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, add_arg_size, &target_len);
  if (target_len > cfg->max_url_length)
    return early_error(req, has_body, E_URL_TOO_LONG, "the URL is too long");
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
  for (size_t i = 0; i < br_nroutes; i++) {
    if (!pattern_match(br_routes[i].pattern, url, &cap, &cap_len)) continue;
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
  if (cap) {
    if (br_blob_id_parse(cap, cap_len, req->digest) < 0)
      return early_error(req, has_body, E_BAD_HASH,
                         "a blob id is 64 lowercase hex digits, optionally after sha256:");
    req->has_digest = 1;
  }
  unsigned scopes = 0;
  if (req->route->scope) {
    if (granted_scopes(req, &scopes) < 0)
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
  req->phase = PHASE_BODY;
  if (req->route->begin) return req->route->begin(req);
  return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
  br_server *srv = cls;
  struct request *req = *con_cls;
  if (!req) {
    req = calloc(1, sizeof *req);
    if (!req) return MHD_NO;
    req->srv = srv;
    req->conn = conn;
    req->method = method;
    req->is_head = !strcmp(method, MHD_HTTP_METHOD_HEAD);
    *con_cls = req;
    return start_request(req, url, version);
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
  if (req->phase == PHASE_SUSPENDED) return MHD_YES;
  return req->route->finish(req);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)conn;
  br_server *srv = cls;
  struct request *req = *con_cls;
  if (!req) return;
  if (req->route_index >= 0 && req->route_index < 16 && req->status >= 100 && req->status < 600)
    atomic_fetch_add(&srv->requests[req->route_index][req->status / 100], 1);
  if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && req->writer)
    br_info("%s %s: client went away after %llu bytes; nothing kept", req->method,
            req->route ? req->route->pattern : "-", (unsigned long long)req->received);
  request_free_upload(req);
  free(req->body);
  free(req);
  *con_cls = NULL;
}

/* ---- finishers --------------------------------------------------------------------------------
 */

/* The API error for a failed index write: a full map or a full volume is a 507. */
static enum br_api_error index_error(int rc) {
  return rc == BR_INDEX_FULL ? E_INDEX_FULL : rc == BR_INDEX_NO_SPACE ? E_NO_SPACE : E_INTERNAL;
}

static void finish_upload(struct request *req) {
  br_server *srv = req->srv;
  br_err err;
  char key[BR_MAX_KEY + 1];
  br_store_writer *w = req->writer;
  req->writer = NULL;
  req->finish_rc = -1;
  if (!br_store_default_key(req->store, req->digest, key, sizeof key)) {
    br_store_write_abort(w);
    req->finish_error = E_INTERNAL;
    snprintf(req->finish_message, sizeof req->finish_message, "object key too long");
    return;
  }
  if (br_store_write_commit(w, key, &err) < 0) {
    req->finish_error = errno == ENOSPC || errno == EDQUOT ? E_NO_SPACE : E_INTERNAL;
    snprintf(req->finish_message, sizeof req->finish_message, "%s", err.msg);
    return;
  }
  uint64_t now = br_now_ms();
  br_record rec = {.size = req->received,
                   .created_ms = now,
                   .last_upload_ms = now,
                   .state = BR_STATE_LIVE,
                   .state_ms = now,
                   .nlocations = 1};
  snprintf(rec.content_type, sizeof rec.content_type, "%s", req->content_type);
  br_location *loc = &rec.locations[0];
  snprintf(loc->store, sizeof loc->store, "%s", br_store_name(req->store));
  snprintf(loc->key, sizeof loc->key, "%s", key);
  loc->role = BR_ROLE_PRIMARY;
  loc->verified_at_ms = now;
  int rc = br_index_record_upload(srv->index, req->digest, &rec, &req->created, NULL, &err);
  if (rc < 0) {
    req->finish_error = index_error(rc);
    snprintf(req->finish_message, sizeof req->finish_message, "%s", err.msg);
    return;
  }
  req->finish_rc = 0;
}

static void *finisher_main(void *arg) {
  br_server *srv = arg;
  pthread_mutex_lock(&srv->job_lock);
  for (;;) {
    while (!srv->job_head && !srv->jobs_stopping) pthread_cond_wait(&srv->job_cv, &srv->job_lock);
    if (!srv->job_head) break;
    struct request *req = srv->job_head;
    srv->job_head = req->next_job;
    if (!srv->job_head) srv->job_tail = NULL;
    pthread_mutex_unlock(&srv->job_lock);
    if (req->job == JOB_UPLOAD) {
      finish_upload(req);
    } else {
      br_err err;
      int rc = br_index_touch(srv->index, req->digest, br_now_ms(), &err);
      req->finish_rc = rc < 0 ? -1 : 0;
      req->gone = rc == 1;
      req->created = 0;
      if (rc < 0) {
        req->finish_error = index_error(rc);
        snprintf(req->finish_message, sizeof req->finish_message, "%s", err.msg);
      }
    }
    req->phase = PHASE_RESUMED;
    MHD_resume_connection(req->conn);
    atomic_fetch_sub(&srv->jobs_in_flight, 1);
    pthread_mutex_lock(&srv->job_lock);
  }
  pthread_mutex_unlock(&srv->job_lock);
  return NULL;
}

int br_server_finish_async(struct request *req, enum job_kind job) {
  br_server *srv = req->srv;
  pthread_mutex_lock(&srv->job_lock);
  if (srv->stopping) {
    pthread_mutex_unlock(&srv->job_lock);
    return -1;
  }
  req->job = job;
  req->phase = PHASE_SUSPENDED;
  atomic_fetch_add(&srv->jobs_in_flight, 1);
  MHD_suspend_connection(req->conn);
  req->next_job = NULL;
  if (srv->job_tail)
    srv->job_tail->next_job = req;
  else
    srv->job_head = req;
  srv->job_tail = req;
  pthread_cond_signal(&srv->job_cv);
  pthread_mutex_unlock(&srv->job_lock);
  return 0;
}

/* ---- daemon -----------------------------------------------------------------------------------
 */

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

int br_server_start(br_server *srv, br_err *err) {
  const br_config *cfg = srv->cfg;
  struct sockaddr_storage ss;
  socklen_t sslen;
  if (parse_listen(cfg->listen, &ss, &sslen, err) < 0) return -1;
  srv->started_ms = br_now_ms();
  pthread_mutex_init(&srv->job_lock, NULL);
  pthread_cond_init(&srv->job_cv, NULL);
  srv->finishers = calloc(FINISHER_THREADS, sizeof *srv->finishers);
  if (!srv->finishers) return br_fail(err, "out of memory");
  for (; srv->nfinishers < FINISHER_THREADS; srv->nfinishers++)
    if (pthread_create(&srv->finishers[srv->nfinishers], NULL, finisher_main, srv))
      return br_fail(err, "cannot start finisher threads");
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned threads = cfg->threads ? (unsigned)cfg->threads : (unsigned)(cores > 0 ? cores : 1);
  /* TURBO: opportunistic reads and writes, no shutdown() before close; it more than doubled
   * new connections per second here (every dedup answered before its body is one) */
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                   MHD_USE_ITC | MHD_USE_ERROR_LOG | MHD_USE_TURBO |
                   (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
  srv->daemon = MHD_start_daemon(
      flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_THREAD_POOL_SIZE, threads,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned)(cfg->connection_timeout_ms / 1000), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
      (size_t)cfg->connection_memory, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
      MHD_OPTION_UNESCAPE_CALLBACK, unescape_path, NULL, MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024,
      MHD_OPTION_END);
  if (!srv->daemon) return br_fail(err, "cannot listen on %s: %s", cfg->listen, strerror(errno));
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
  char host[128];
  snprintf(host, sizeof host, "%.*s", (int)(strrchr(cfg->listen, ':') - cfg->listen), cfg->listen);
  br_info("listening on http://%s:%u (%u network threads)", *host ? host : "0.0.0.0",
          info ? info->port : 0, threads);
  atomic_store(&srv->ready, 1);
  return 0;
}

void br_server_stop(br_server *srv) {
  atomic_store(&srv->ready, 0);
  if (srv->daemon) {
    /* no new connections; the listening socket is ours to close, but only after the daemon has
     * stopped: its threads drop it from their epoll sets asynchronously */
    MHD_socket listener = MHD_quiesce_daemon(srv->daemon);
    /* Uploads that completed their body by now get 503; those already with a finisher complete
     * (bounded by one fsync and one index commit each). libmicrohttpd must not be stopped while
     * a connection is suspended. */
    pthread_mutex_lock(&srv->job_lock);
    srv->stopping = 1;
    pthread_mutex_unlock(&srv->job_lock);
    uint64_t deadline = br_now_ms() + srv->cfg->shutdown_timeout_ms;
    while (atomic_load(&srv->jobs_in_flight) > 0) {
      if (br_now_ms() > deadline) {
        br_warn("stopping: still waiting for %d upload(s) to become durable",
                (int)atomic_load(&srv->jobs_in_flight));
        deadline = br_now_ms() + srv->cfg->shutdown_timeout_ms;
      }
      usleep(5000);
    }
    MHD_stop_daemon(srv->daemon);
    srv->daemon = NULL;
    if (listener != MHD_INVALID_SOCKET) close(listener);
  }
  pthread_mutex_lock(&srv->job_lock);
  srv->jobs_stopping = 1;
  pthread_cond_broadcast(&srv->job_cv);
  pthread_mutex_unlock(&srv->job_lock);
  for (int i = 0; i < srv->nfinishers; i++) pthread_join(srv->finishers[i], NULL);
  free(srv->finishers);
  srv->finishers = NULL;
  srv->nfinishers = 0;
}
