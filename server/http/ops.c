/* The operator's side of requests: request ids, the access log, trusted proxies, the auth table
 * (swapped whole on SIGHUP), the global budget of buffered JSON bodies, and the sweeper that cuts
 * slow clients (an incomplete head or a body slower than min_body_rate) after a bounded total time
 * (libmicrohttpd's own connection_timeout restarts with every byte). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/ops.h"
#include "http/tls.h"

const double br_latency_bounds[LATENCY_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                   0.1,    0.25,  0.5,    1,     2.5,  5,     10};
const char *const br_upload_step_names[UPLOAD_STEPS] = {"receive", "hash", "store_write",
                                                        "store_commit", "index_commit"};

#define SWEEP_MS 250

struct auth_token {
  uint8_t sha256[BR_SHA256_LEN];
  unsigned scopes;
  char name[128];
};
/* Immutable once published; replaced whole on reload. */
struct auth_table {
  unsigned anonymous;
  int private_metrics; /* [auth] private_metrics */
  int n;
  struct auth_token t[BR_MAX_TOKENS];
};

struct proxy_table {
  int n;
  br_cidr c[BR_MAX_PROXIES];
};

/* One per connection (libmicrohttpd's socket context), on the sweeper's list while open. */
struct conn_track {
  int fd;
  atomic_int state;                /* TRACK_* */
  atomic_uint_fast64_t since_ms;   /* when the current state began */
  atomic_uint_fast64_t body_bytes; /* body received so far (TRACK_BODY) */
  struct conn_track *prev, *next;
};

/* What a reload replaced; freed when the server stops (readers may still hold them). */
struct retired {
  void *p;
  struct retired *next;
};

struct ops {
  pthread_mutex_t lock; /* reloads, the retired list */
  atomic_int log_fd;    /* -1: no access log */
  char *log_target;     /* "off", "stderr" or a path */
  uint64_t id_base;
  atomic_uint_fast64_t id_next;
  _Atomic(struct auth_table *) auth;
  _Atomic(struct proxy_table *) proxies;
  struct retired *retired;
  /* slow clients */
  pthread_mutex_t track_lock;
  struct conn_track head; /* sentinel of the circular list */
  pthread_t sweeper;
  int sweeping;
  pthread_cond_t sweep_cv;
};

/* ---- parsing --------------------------------------------------------------------------------- */

/* trusted_proxies: IPs and CIDRs separated by commas or spaces (br_config_parse_proxies, which
 * also checked them when the config was loaded). NULL with err on a bad one. */
static struct proxy_table *parse_proxies(const char *text, br_err *err) {
  struct proxy_table *pt = calloc(1, sizeof *pt);
  if (!pt) {
    br_fail(err, "out of memory");
    return NULL;
  }
  if (br_config_parse_proxies(text, pt->c, &pt->n, err) < 0) {
    free(pt);
    return NULL;
  }
  return pt;
}

static int cidr_contains(const br_cidr *c, int family, const uint8_t *addr) {
  if (c->family != family) return 0;
  unsigned full = c->bits / 8, rest = c->bits % 8;
  if (memcmp(c->addr, addr, full) != 0) return 0;
  if (!rest) return 1;
  uint8_t mask = (uint8_t)(0xff << (8 - rest));
  return (c->addr[full] & mask) == (addr[full] & mask);
}

static struct auth_table *make_auth(const br_config *cfg) {
  struct auth_table *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->anonymous = cfg->anonymous_scopes;
  a->private_metrics = cfg->private_metrics;
  a->n = cfg->ntokens;
  for (int i = 0; i < cfg->ntokens; i++) {
    memcpy(a->t[i].sha256, cfg->tokens[i].sha256, BR_SHA256_LEN);
    a->t[i].scopes = cfg->tokens[i].scopes;
    snprintf(a->t[i].name, sizeof a->t[i].name, "%s", cfg->tokens[i].name);
  }
  return a;
}

static void retire(struct ops *o, void *p) {
  struct retired *r = malloc(sizeof *r);
  if (!r) return; /* leaked rather than freed under a reader */
  r->p = p;
  r->next = o->retired;
  o->retired = r;
}

/* ---- access log ------------------------------------------------------------------------------ */

/* Points the access log at target ("off", "stderr" or a path), reopening a file (logrotate).
 * The descriptor number stays the same once allocated (dup2 swaps what it refers to), so that a
 * line being written at that moment goes to the old file or the new one, never elsewhere. */
static int open_log(struct ops *o, const char *target, br_err *err) {
  int fd;
  if (!strcmp(target, "off"))
    fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  else if (!strcmp(target, "stderr"))
    fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
  else
    fd = open(target, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0)
    return br_fail(err, "[server] access_log: cannot open %s: %s", target, strerror(errno));
  int cur = atomic_load(&o->log_fd);
  if (!strcmp(target, "off")) {
    atomic_store(&o->log_fd, -1);
    if (cur >= 0) dup2(fd, cur); /* a writer that loaded cur just now writes to /dev/null */
    close(fd);
  } else if (cur < 0) {
    atomic_store(&o->log_fd, fd);
  } else {
    dup2(fd, cur);
    close(fd);
  }
  char *copy = strdup(target);
  if (copy) {
    free(o->log_target);
    o->log_target = copy;
  }
  return 0;
}

/* Appends s to out as the inside of a JSON string (at most max input bytes). */
static size_t json_escape(char *out, size_t cap, const char *s, size_t max) {
  size_t w = 0;
  for (size_t i = 0; s && s[i] && i < max && w + 7 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      out[w++] = '\\';
      out[w++] = (char)c;
    } else if (c < 0x20 || c >= 0x7f) {
      w += (size_t)snprintf(out + w, cap - w, "\\u%04x", c);
    } else {
      out[w++] = (char)c;
    }
  }
  out[w] = '\0';
  return w;
}

static const char *outcome_name(const struct request *req) {
  if (req->route && req->route->scope == BR_SCOPE_WRITE && req->route->body) {
    if (req->status == MHD_HTTP_CREATED) return "created";
    if (req->status == MHD_HTTP_OK) return "dedup";
  }
  if (req->outcome == OUTCOME_CACHE_HIT) return "cache_hit";
  if (req->outcome == OUTCOME_CACHE_MISS) return "cache_miss";
  return "";
}

static void log_request(br_http *http, struct request *req, uint64_t duration_ns) {
  int fd = atomic_load(&http->ops->log_fd);
  if (fd < 0) return;
  char when[40], method[64], path[6 * 1024 + 8], token[6 * 128 + 8], line[8192];
  br_format_time_ms(br_now_ms(), when, sizeof when);
  json_escape(method, sizeof method, req->method, 16);
  json_escape(path, sizeof path, req->path, 1024);
  json_escape(token, sizeof token, req->token_name, sizeof req->token_name);
  int n = snprintf(line, sizeof line,
                   "{\"time\":\"%s\",\"request_id\":\"%s\",\"remote\":\"%s\",\"token\":%s%s%s,"
                   "\"method\":\"%s\",\"path\":\"%s\",\"status\":%u,\"bytes_in\":%" PRIu64
                   ",\"bytes_out\":%" PRIu64 ",\"duration_us\":%" PRIu64 ",\"outcome\":\"%s\"}\n",
                   when, req->request_id, req->remote, *token ? "\"" : "", *token ? token : "null",
                   *token ? "\"" : "", method, path, req->status, req->bytes_in,
                   req->is_head ? 0 : req->bytes_out, duration_ns / 1000, outcome_name(req));
  if (n <= 0) return;
  if ((size_t)n >= sizeof line) { /* cannot happen with the bounds above; keep the line whole */
    n = sizeof line - 1;
    line[n - 1] = '\n';
  }
  ssize_t w = write(fd, line, (size_t)n); /* O_APPEND: one line, one write, never interleaved */
  (void)w;
}

/* ---- requests -------------------------------------------------------------------------------- */

void ops_request_begin(struct request *req) {
  br_http *http = req->http;
  struct ops *o = http->ops;
  req->start_ns = br_mono_ns();
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  req->track = ci ? ci->socket_context : NULL;
  struct proxy_table *pt = atomic_load(&o->proxies);
  int trusted = 0;
  if (pt->n || atomic_load(&o->log_fd) >= 0) {
    ci = MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    const uint8_t *addr = NULL;
    if (sa && sa->sa_family == AF_INET) {
      addr = (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
      inet_ntop(AF_INET, addr, req->remote, sizeof req->remote);
    } else if (sa && sa->sa_family == AF_INET6) {
      addr = (const uint8_t *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
      inet_ntop(AF_INET6, addr, req->remote, sizeof req->remote);
    }
    for (int i = 0; addr && i < pt->n && !trusted; i++)
      trusted = cidr_contains(&pt->c[i], sa->sa_family, addr);
  }
  if (trusted) {
    const char *given = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "X-Request-Id");
    if (given && br_header_request_id_ok(given)) { /* else a generated one replaces it */
      memcpy(req->request_id, given, strlen(given) + 1);
      return;
    }
  }
  br_hex_u64(o->id_base + atomic_fetch_add(&o->id_next, 1), req->request_id);
}

void ops_request_end(struct request *req) {
  br_http *http = req->http;
  uint64_t ns = br_mono_ns() - req->start_ns;
  int r = req->route_index;
  if (r >= 0 && r < BR_MAX_ROUTES && req->status) {
    double s = (double)ns / 1e9;
    int b = 0;
    while (b < LATENCY_BUCKETS && s > br_latency_bounds[b]) b++;
    atomic_fetch_add(&http->latency[r][b], 1);
    atomic_fetch_add(&http->latency_sum_ns[r], ns);
  }
  log_request(http, req, ns);
  ops_json_release(req);
}

int ops_granted_scopes(struct request *req, unsigned *scopes) {
  struct auth_table *a = atomic_load(&req->http->ops->auth);
  if (a->n == 0) {
    *scopes = BR_SCOPE_READ | BR_SCOPE_WRITE | BR_SCOPE_ADMIN | BR_SCOPE_METRICS;
    return 0;
  }
  *scopes = a->anonymous;
  const char *auth =
      MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!auth) return 0;
  if (strncasecmp(auth, "Bearer ", 7) != 0) return -1;
  const char *token = auth + 7;
  while (*token == ' ') token++;
  uint8_t digest[BR_SHA256_LEN];
  SHA256((const unsigned char *)token, strlen(token), digest);
  /* Every configured digest is compared and the match selected without a branch, so that the
   * time taken says neither which token matched nor whether one did. */
  unsigned found = 0, granted = 0, index = 0;
  for (int i = 0; i < a->n; i++) {
    unsigned same = (unsigned)(CRYPTO_memcmp(digest, a->t[i].sha256, BR_SHA256_LEN) == 0);
    granted |= a->t[i].scopes & (0u - same);
    index |= (unsigned)i & (0u - same);
    found |= same;
  }
  if (!found) return -1;
  *scopes |= granted;
  if (index < (unsigned)a->n) /* two tokens with one digest would OR their indexes */
    snprintf(req->token_name, sizeof req->token_name, "%s", a->t[index].name);
  return 0;
}

enum br_api_error ops_metrics_access(struct request *req) {
  struct auth_table *a = atomic_load(&req->http->ops->auth);
  if (!a->private_metrics) return E__COUNT;
  unsigned scopes = 0;
  if (ops_granted_scopes(req, &scopes) < 0) return E_UNAUTHORIZED;
  if (scopes & (BR_SCOPE_METRICS | BR_SCOPE_ADMIN)) return E__COUNT;
  return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION)
             ? E_FORBIDDEN
             : E_UNAUTHORIZED;
}

int ops_json_reserve(struct request *req, uint64_t n) {
  br_http *http = req->http;
  uint64_t max = __atomic_load_n(&http->srv->cfg->max_json_inflight, __ATOMIC_RELAXED);
  uint64_t cur = atomic_load(&http->json_inflight);
  do {
    if (cur + n > max) {
      atomic_fetch_add(&http->json_refused, 1);
      return -1;
    }
  } while (!atomic_compare_exchange_weak(&http->json_inflight, &cur, cur + n));
  req->json_reserved += n;
  return 0;
}

void ops_json_release(struct request *req) {
  if (req->json_reserved) atomic_fetch_sub(&req->http->json_inflight, req->json_reserved);
  req->json_reserved = 0;
}

/* ---- slow clients ---------------------------------------------------------------------------- */

void ops_notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe) {
  br_http *http = cls;
  struct ops *o = http->ops;
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct conn_track *t = calloc(1, sizeof *t);
    if (!t || !ci) {
      free(t);
      return;
    }
    t->fd = ci->connect_fd;
    atomic_store(&t->since_ms, br_now_ms());
    pthread_mutex_lock(&o->track_lock);
    t->next = o->head.next;
    t->prev = &o->head;
    o->head.next->prev = t;
    o->head.next = t;
    pthread_mutex_unlock(&o->track_lock);
    *socket_context = t;
  } else if (*socket_context) {
    /* libmicrohttpd closes the socket after this returns: unlinked first, the sweeper never
     * shuts down a descriptor number that may have been reused */
    struct conn_track *t = *socket_context;
    pthread_mutex_lock(&o->track_lock);
    t->prev->next = t->next;
    t->next->prev = t->prev;
    pthread_mutex_unlock(&o->track_lock);
    free(t);
    *socket_context = NULL;
  }
}

void ops_track(struct request *req, int state) {
  struct conn_track *t = req->track;
  if (!t || atomic_load(&t->state) == TRACK_CUT) return;
  if (state == TRACK_BODY) atomic_store(&t->body_bytes, 0);
  if (state != TRACK_BUSY) atomic_store(&t->since_ms, br_now_ms());
  atomic_store(&t->state, state);
}

void ops_track_body(struct request *req) {
  if (req->track) atomic_store(&req->track->body_bytes, req->bytes_in);
}

/* Every SWEEP_MS: a connection whose request head is not complete request_header_timeout after
 * it opened (or after its previous request ended), or whose body has averaged less than
 * min_body_rate since one request_header_timeout of grace, is shut down; libmicrohttpd then sees
 * the end of the stream and closes it (the request ends as not completed: uploads keep nothing). */
static void *sweep_main(void *arg) {
  br_http *http = arg;
  struct ops *o = http->ops;
  pthread_mutex_lock(&o->track_lock);
  while (o->sweeping) {
    uint64_t now = br_now_ms();
    uint64_t head_ms =
        __atomic_load_n(&http->srv->cfg->request_header_timeout_ms, __ATOMIC_RELAXED);
    uint64_t rate = __atomic_load_n(&http->srv->cfg->min_body_rate, __ATOMIC_RELAXED);
    for (struct conn_track *t = o->head.next; t != &o->head; t = t->next) {
      int state = atomic_load(&t->state);
      uint64_t since = atomic_load(&t->since_ms), age = now > since ? now - since : 0;
      int cut = -1;
      if (state == TRACK_HEAD && age > head_ms) {
        cut = 0;
      } else if (state == TRACK_BODY && rate && age > head_ms) {
        uint64_t want = rate * (age - head_ms) / 1000;
        if (atomic_load(&t->body_bytes) < want) cut = 1;
      }
      if (cut < 0) continue;
      atomic_store(&t->state, TRACK_CUT);
      atomic_fetch_add(&http->slow_cut[cut], 1);
      shutdown(t->fd, SHUT_RDWR);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += SWEEP_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&o->sweep_cv, &o->track_lock, &ts);
  }
  pthread_mutex_unlock(&o->track_lock);
  return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

int ops_start(br_http *http, br_err *err) {
  struct ops *o = calloc(1, sizeof *o);
  if (!o) return br_fail(err, "out of memory");
  http->ops = o;
  pthread_mutex_init(&o->lock, NULL);
  pthread_mutex_init(&o->track_lock, NULL);
  pthread_cond_init(&o->sweep_cv, NULL);
  o->head.next = o->head.prev = &o->head;
  atomic_store(&o->log_fd, -1);
  if (RAND_bytes((unsigned char *)&o->id_base, sizeof o->id_base) != 1)
    o->id_base = br_now_ms() << 20;
  struct proxy_table *pt = parse_proxies(http->srv->cfg->trusted_proxies, err);
  struct auth_table *a = make_auth(http->srv->cfg);
  if (!pt || !a) {
    free(pt);
    free(a);
    return pt ? br_fail(err, "out of memory") : -1;
  }
  atomic_store(&o->proxies, pt);
  atomic_store(&o->auth, a);
  if (open_log(o, http->srv->cfg->access_log, err) < 0) return -1;
  o->sweeping = 1;
  if (pthread_create(&o->sweeper, NULL, sweep_main, http)) {
    o->sweeping = 0;
    return br_fail(err, "cannot start the slow-client sweeper");
  }
  return 0;
}

void ops_stop(br_http *http) {
  struct ops *o = http->ops;
  if (!o) return;
  if (o->sweeping) {
    pthread_mutex_lock(&o->track_lock);
    o->sweeping = 0;
    pthread_cond_broadcast(&o->sweep_cv);
    pthread_mutex_unlock(&o->track_lock);
    pthread_join(o->sweeper, NULL);
  }
  int fd = atomic_load(&o->log_fd);
  if (fd >= 0) close(fd);
  while (o->retired) {
    struct retired *r = o->retired;
    o->retired = r->next;
    free(r->p);
    free(r);
  }
  free(atomic_load(&o->auth));
  free(atomic_load(&o->proxies));
  free(o->log_target);
  pthread_mutex_destroy(&o->lock);
  pthread_mutex_destroy(&o->track_lock);
  pthread_cond_destroy(&o->sweep_cv);
  free(o);
  http->ops = NULL;
}

/* Numbers that are read on every request: stored whole (a reader sees the old or the new). */
#define RELOAD_LIMIT(field)                                          \
  do {                                                               \
    if (cfg->field != fresh->field) {                                \
      __atomic_store_n(&cfg->field, fresh->field, __ATOMIC_RELAXED); \
      br_info("reload: %s applied", #field);                         \
    }                                                                \
  } while (0)

static void note_fixed(const char *what, int differs) {
  if (differs) br_warn("reload: %s changed but needs a restart; the old value stays", what);
}

int ops_reload(br_http *http, const br_config *fresh, br_err *err) {
  struct ops *o = http->ops;
  br_config *cfg = http->srv->cfg;
  struct proxy_table *pt = parse_proxies(fresh->trusted_proxies, err);
  if (!pt) return -1;
  struct auth_table *a = make_auth(fresh);
  if (!a) {
    free(pt);
    return br_fail(err, "out of memory");
  }
  pthread_mutex_lock(&o->lock);
  /* the certificate first, then the log: either failing fails the reload before anything else
   * changed (a certificate taken before a log that cannot be opened stays taken) */
  int tls = *cfg->tls_cert && *fresh->tls_cert;
  if ((tls && tls_load(fresh->tls_cert, fresh->tls_key, err) < 0) ||
      open_log(o, fresh->access_log, err) < 0) {
    pthread_mutex_unlock(&o->lock);
    free(pt);
    free(a);
    return -1;
  }
  retire(o, atomic_exchange(&o->auth, a));
  retire(o, atomic_exchange(&o->proxies, pt));
  pthread_mutex_unlock(&o->lock);
  br_info("reload: %d token(s), anonymous scopes %u, access log %s, %d trusted proxy entr%s%s",
          a->n, a->anonymous, fresh->access_log, pt->n, pt->n == 1 ? "y" : "ies",
          tls ? ", TLS certificate reloaded" : "");
  RELOAD_LIMIT(max_blob_size);
  RELOAD_LIMIT(max_url_length);
  RELOAD_LIMIT(max_header_size);
  RELOAD_LIMIT(max_json_size);
  RELOAD_LIMIT(max_lookup_hashes);
  RELOAD_LIMIT(max_json_inflight);
  RELOAD_LIMIT(request_header_timeout_ms);
  RELOAD_LIMIT(min_body_rate);
  RELOAD_LIMIT(cache_max_age_ms);
  RELOAD_LIMIT(shutdown_timeout_ms);
  RELOAD_LIMIT(dedup_touch_interval_ms);
  note_fixed("listen", strcmp(cfg->listen, fresh->listen) != 0);
  note_fixed("listen_plain", strcmp(cfg->listen_plain, fresh->listen_plain) != 0);
  note_fixed("tls_cert (HTTPS on or off)", !*cfg->tls_cert != !*fresh->tls_cert);
  note_fixed("tls_priorities", strcmp(cfg->tls_priorities, fresh->tls_priorities) != 0);
  note_fixed("data_dir", strcmp(cfg->data_dir, fresh->data_dir) != 0);
  note_fixed("upload_store", strcmp(cfg->upload_store, fresh->upload_store) != 0);
  note_fixed("threads", cfg->threads != fresh->threads);
  note_fixed("max_connections", cfg->max_connections != fresh->max_connections);
  note_fixed("max_connections_per_ip",
             cfg->max_connections_per_ip != fresh->max_connections_per_ip);
  note_fixed("connection_timeout", cfg->connection_timeout_ms != fresh->connection_timeout_ms);
  note_fixed("connection_memory", cfg->connection_memory != fresh->connection_memory);
  note_fixed("index_map_size", cfg->index_map_size != fresh->index_map_size);
  note_fixed("index_batch_max", cfg->index_batch_max != fresh->index_batch_max);
  note_fixed("[index] kind and dsn", strcmp(cfg->index_kind, fresh->index_kind) ||
                                         strcmp(cfg->index_dsn, fresh->index_dsn));
  note_fixed("cache_size", cfg->cache_size != fresh->cache_size);
  note_fixed("cache_max_blob", cfg->cache_max_blob != fresh->cache_max_blob);
  int stores_differ = cfg->nstores != fresh->nstores;
  for (int i = 0; !stores_differ && i < cfg->nstores; i++) {
    const br_store_config *x = &cfg->stores[i], *y = &fresh->stores[i];
    stores_differ = strcmp(x->name, y->name) || strcmp(x->kind, y->kind) ||
                    strcmp(x->root, y->root) || strcmp(x->endpoint, y->endpoint) ||
                    strcmp(x->bucket, y->bucket) || strcmp(x->prefix, y->prefix) ||
                    strcmp(x->url, y->url) || strcmp(x->public_url, y->public_url) ||
                    strcmp(x->access_key, y->access_key) || strcmp(x->secret_key, y->secret_key) ||
                    x->serve != y->serve || x->allow_hardlinks != y->allow_hardlinks;
  }
  note_fixed("[store] sections", stores_differ);
  note_fixed("[table] sections", cfg->ntables != fresh->ntables);
  return 0;
}
