/* blobrefd: the daemon's entry point. Loads the config, opens stores and index, serves until
 * SIGTERM/SIGINT; `--fsck` checks that every index entry has its bytes instead, and
 * `--rebuild-index` indexes the stores' content-addressed objects again. */
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <time.h>

#include "core/blobcache.h"
#include "http/httpd.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: blobrefd [-c FILE] [--listen HOST:PORT] [--data DIR] [--debug]\n"
          "       blobrefd --fsck [--verify] [-c FILE] [--data DIR]\n"
          "       blobrefd --rebuild-index [-c FILE] [--data DIR]\n"
          "With no -c, runs on the embedded default: an fs store 'local' under DIR/blobs and the\n"
          "index under DIR/index (DIR defaults to ./var). Flags override the file.\n");
}

struct options {
  const char *config, *listen, *data;
  int fsck, verify, rebuild, debug;
};

static int parse_args(int argc, char **argv, struct options *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int has_value = i + 1 < argc;
    if ((!strcmp(a, "-c") || !strcmp(a, "--config")) && has_value)
      o->config = argv[++i];
    else if (!strcmp(a, "--listen") && has_value)
      o->listen = argv[++i];
    else if (!strcmp(a, "--data") && has_value)
      o->data = argv[++i];
    else if (!strcmp(a, "--fsck"))
      o->fsck = 1;
    else if (!strcmp(a, "--verify"))
      o->verify = 1;
    else if (!strcmp(a, "--rebuild-index"))
      o->rebuild = 1;
    else if (!strcmp(a, "--debug"))
      o->debug = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    } else {
      fprintf(stderr, "blobrefd: unknown or incomplete argument '%s'\n", a);
      usage(stderr);
      return -1;
    }
  }
  return 0;
}

static int load_config(const struct options *o, br_config *cfg, br_err *err) {
  br_config_init(cfg);
  if (o->config && br_config_load(cfg, o->config, err) < 0) return -1;
  if (o->listen && br_config_set_string(&cfg->listen, o->listen) < 0)
    return br_fail(err, "out of memory");
  if (o->data && br_config_set_string(&cfg->data_dir, o->data) < 0)
    return br_fail(err, "out of memory");
  return br_config_finish(cfg, err);
}

static int open_stores(br_server *srv, int read_only, br_err *err) {
  for (int i = 0; i < srv->cfg->nstores; i++) {
    br_store_config sc = srv->cfg->stores[i];
    sc.read_only = read_only;
    br_store *st = br_store_open(&sc, err);
    if (!st) return -1;
    srv->stores[srv->nstores++] = st;
  }
  srv->upload_store = br_server_store(srv, srv->cfg->upload_store);
  return 0;
}

static void close_all(br_server *srv) {
  blobcache_free(srv->cache);
  srv->cache = NULL;
  br_index_close(srv->index);
  for (int i = 0; i < srv->nstores; i++) br_store_close(srv->stores[i]);
}

/* ---- fsck ------------------------------------------------------------------------------------ */

struct fsck {
  br_server *srv;
  int verify;
  uint64_t blobs, problems;
};

static int verify_digest(br_store *st, const char *key, const uint8_t want[BR_SHA256_LEN],
                         br_err *err) {
  br_store_reader r;
  int rc = br_store_open_read(st, key, &r, err);
  if (rc != 0) return rc > 0 ? br_fail(err, "missing") : -1;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  static char buf[1 << 20];
  for (uint64_t off = 0; rc == 0 && off < r.size;) {
    size_t n = r.size - off < sizeof buf ? (size_t)(r.size - off) : sizeof buf;
    rc = r.source->pread(r.source, buf, n, off, err);
    EVP_DigestUpdate(ctx, buf, n);
    off += n;
  }
  uint8_t got[BR_SHA256_LEN];
  EVP_DigestFinal_ex(ctx, got, NULL);
  EVP_MD_CTX_free(ctx);
  br_store_reader_close(&r);
  if (rc == 0 && memcmp(got, want, BR_SHA256_LEN) != 0) rc = br_fail(err, "SHA-256 mismatch");
  return rc;
}

static int fsck_one(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  struct fsck *f = ud;
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(digest, hex);
  f->blobs++;
  if (rec->nlocations == 0) {
    printf("%s: no location\n", hex);
    f->problems++;
  }
  for (int i = 0; i < rec->nlocations; i++) {
    const br_location *l = &rec->locations[i];
    br_store *st = br_server_store(f->srv, l->store);
    br_err err;
    uint64_t size = 0;
    int rc = st ? br_store_stat(st, l->key, &size, &err) : 1;
    /* a draining copy (a moved blob's old location) may be gone already: the server deletes
     * the bytes first and drops the location after */
    if (st && rc > 0 && (l->role == BR_ROLE_DRAINING || rec->state == BR_STATE_DELETING)) continue;
    if (!st) {
      printf("%s: store %s is not configured\n", hex, l->store);
    } else if (rc < 0) {
      printf("%s: %s:%s: %s\n", hex, l->store, l->key, err.msg);
    } else if (rc > 0) {
      printf("%s: %s:%s: missing\n", hex, l->store, l->key);
    } else if (size != rec->size) {
      printf("%s: %s:%s: %" PRIu64 " bytes, index says %" PRIu64 "\n", hex, l->store, l->key, size,
             rec->size);
      rc = 1;
    } else if (f->verify && verify_digest(st, l->key, digest, &err) < 0) {
      printf("%s: %s:%s: %s\n", hex, l->store, l->key, err.msg);
      rc = 1;
    }
    if (!st || rc) f->problems++;
  }
  return 0;
}

static int run_fsck(br_server *srv, int verify) {
  br_err err;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/index", srv->cfg->data_dir);
  br_index_options opt = {.map_size = srv->cfg->index_map_size, .batch_max = 1, .read_only = 1};
  srv->index = br_index_open(dir, &opt, &err);
  if (!srv->index || open_stores(srv, 1, &err) < 0) {
    fprintf(stderr, "blobrefd: %s\n", err.msg);
    close_all(srv);
    return 2;
  }
  struct fsck f = {.srv = srv, .verify = verify};
  int rc = br_index_foreach(srv->index, fsck_one, &f, &err);
  if (rc < 0) {
    printf("index: %s\n", err.msg);
    f.problems++;
  }
  printf("fsck: %" PRIu64 " blobs, %" PRIu64 " problems\n", f.blobs, f.problems);
  close_all(srv);
  return f.problems ? 1 : 0;
}

/* ---- rebuild-index ---------------------------------------------------------------------------
 * Indexes every object a store holds under a content-addressed key "<prefix>sha256/ab/cd/<hex>"
 * whose bytes hash to <hex>, for an index that was lost or damaged (move a damaged one away
 * first). Objects whose bytes do not match their key are reported and left out. The content type
 * is not known any more: application/octet-stream. */

struct rebuild {
  br_server *srv;
  br_store *store;
  const br_store_config *sc;
  size_t prefix_len; /* strlen(<prefix>sha256/) */
  uint64_t indexed, present, problems;
  int fatal;
};

/* The digest a content-addressed key names: "<prefix>sha256/ab/cd/<64 hex>" after the prefix
 * (already matched), with ab and cd the hex's first digits. Returns 0, or -1 for another key. */
static int key_digest(const char *rest, uint8_t digest[BR_SHA256_LEN]) {
  if (strlen(rest) != 6 + BR_HEX_LEN || rest[2] != '/' || rest[5] != '/') return -1;
  const char *hex = rest + 6;
  if (strncmp(rest, hex, 2) != 0 || strncmp(rest + 3, hex + 2, 2) != 0) return -1;
  return br_blob_id_parse(hex, BR_HEX_LEN, digest);
}

/* When the object was written: its file's mtime for fs stores, else now. */
static uint64_t object_time_ms(const struct rebuild *rb, const char *key) {
  char path[4096];
  struct stat sb;
  if (strcmp(rb->sc->kind, "fs") != 0 || !rb->sc->root) return br_now_ms();
  snprintf(path, sizeof path, "%s/%s", rb->sc->root, key);
  if (stat(path, &sb) != 0) return br_now_ms();
  return (uint64_t)sb.st_mtim.tv_sec * 1000 + (uint64_t)sb.st_mtim.tv_nsec / 1000000;
}

static int rebuild_one(void *ud, const char *key, uint64_t size) {
  struct rebuild *rb = ud;
  const char *store = br_store_name(rb->store);
  uint8_t digest[BR_SHA256_LEN];
  br_err err;
  if (key_digest(key + rb->prefix_len, digest) < 0) {
    printf("%s:%s: not a content-addressed key; left out\n", store, key);
    rb->problems++;
    return 0;
  }
  br_record rec;
  int rc = br_index_get(rb->srv->index, digest, &rec, &err);
  if (rc < 0) {
    printf("index: %s\n", err.msg);
    rb->fatal = 1;
    return 1;
  }
  int have = 0;
  for (int i = 0; rc == 0 && i < rec.nlocations; i++)
    have |= !strcmp(rec.locations[i].store, store);
  if (rc == 0 && (have || rec.state != BR_STATE_LIVE)) { /* indexed already: left as it is */
    rb->present++;
    return 0;
  }
  if (verify_digest(rb->store, key, digest, &err) < 0) {
    printf("%s:%s: %s; left out\n", store, key, err.msg);
    rb->problems++;
    return 0;
  }
  uint64_t t = object_time_ms(rb, key);
  br_record add = {.size = size,
                   .created_ms = t,
                   .last_upload_ms = t,
                   .state = BR_STATE_LIVE,
                   .state_ms = t,
                   .nlocations = 1};
  snprintf(add.content_type, sizeof add.content_type, "application/octet-stream");
  br_location *loc = &add.locations[0];
  snprintf(loc->store, sizeof loc->store, "%s", store);
  snprintf(loc->key, sizeof loc->key, "%s", key);
  loc->role = BR_ROLE_PRIMARY;
  loc->verified_at_ms = br_now_ms();
  int created = 0;
  if (br_index_record_upload(rb->srv->index, digest, &add, &created, NULL, &err) < 0) {
    printf("index: %s\n", err.msg);
    rb->fatal = 1;
    return 1;
  }
  rb->indexed++;
  return 0;
}

static int run_rebuild(br_server *srv) {
  br_err err;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/index", srv->cfg->data_dir);
  br_index_options opt = {.map_size = srv->cfg->index_map_size, .batch_max = 1};
  if (mkdir(srv->cfg->data_dir, 0755) < 0 && errno != EEXIST) {
    fprintf(stderr, "blobrefd: cannot create %s: %s\n", srv->cfg->data_dir, strerror(errno));
    return 2;
  }
  srv->index = br_index_open(dir, &opt, &err);
  if (!srv->index || open_stores(srv, 1, &err) < 0) {
    fprintf(stderr, "blobrefd: %s%s\n", err.msg,
            srv->index ? "" : " (move a damaged index away and run again)");
    close_all(srv);
    return 2;
  }
  struct rebuild rb = {.srv = srv};
  for (int i = 0; i < srv->nstores && !rb.fatal; i++) {
    char prefix[BR_MAX_KEY + 1];
    rb.store = srv->stores[i];
    rb.sc = &srv->cfg->stores[i];
    snprintf(prefix, sizeof prefix, "%ssha256/", rb.sc->prefix ? rb.sc->prefix : "");
    rb.prefix_len = strlen(prefix);
    uint64_t before = rb.indexed;
    if (br_store_list(rb.store, prefix, rebuild_one, &rb, &err) < 0) {
      printf("store %s: %s\n", br_store_name(rb.store), err.msg);
      rb.fatal = 1;
    }
    printf("store %s: %" PRIu64 " blobs indexed\n", br_store_name(rb.store), rb.indexed - before);
  }
  printf("rebuild-index: %" PRIu64 " blobs indexed, %" PRIu64 " already there, %" PRIu64
         " problems\n",
         rb.indexed, rb.present, rb.problems);
  close_all(srv);
  return rb.fatal ? 2 : rb.problems ? 1 : 0;
}

/* systemd's readiness protocol (Type=notify), without libsystemd: one datagram of "KEY=VALUE"
 * lines to the AF_UNIX socket named by $NOTIFY_SOCKET ("@name": the abstract namespace). Nothing
 * when the variable is not set. */
static void sd_notify_text(const char *text) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || (path[0] != '/' && path[0] != '@')) return;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t len = strlen(path);
  if (len >= sizeof sa.sun_path) return;
  memcpy(sa.sun_path, path, len);
  if (path[0] == '@') sa.sun_path[0] = '\0';
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (sendto(fd, text, strlen(text), MSG_NOSIGNAL, (struct sockaddr *)&sa,
             (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0)
    br_warn("sd_notify: %s: %s", path, strerror(errno));
  close(fd);
}

/* SIGHUP: reads the config again (with the same command-line overrides) and applies what can
 * change while serving; a config that does not load changes nothing. */
static void reload(const struct options *o, br_server *srv) {
  br_config fresh;
  br_err err;
  br_info("SIGHUP: reloading %s", o->config ? o->config : "(built-in defaults)");
  sd_notify_text("RELOADING=1");
  if (load_config(o, &fresh, &err) < 0 || ops_reload(srv, &fresh, &err) < 0)
    br_error("reload failed, nothing changed: %s", err.msg);
  br_config_free(&fresh);
  sd_notify_text("READY=1\nSTATUS=serving");
}

int main(int argc, char **argv) {
  struct options o = {0};
  if (parse_args(argc, argv, &o) < 0) return 2;
  if (o.debug) br_log_min_level = BR_LOG_DEBUG;
  br_config cfg;
  br_err err;
  if (load_config(&o, &cfg, &err) < 0) {
    fprintf(stderr, "blobrefd: %s\n", err.msg);
    br_config_free(&cfg);
    return 2;
  }
  static br_server srv; /* large (metrics), and lives as long as the process */
  srv.cfg = &cfg;
  if (o.fsck || o.rebuild) {
    int rc = o.fsck ? run_fsck(&srv, o.verify) : run_rebuild(&srv);
    br_config_free(&cfg);
    return rc;
  }
  /* Signals are taken by sigwait in this thread; every other thread inherits the mask. */
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
  signal(SIGPIPE, SIG_IGN);

  int rc = 1;
  if (mkdir(cfg.data_dir, 0755) < 0 && errno != EEXIST) {
    br_error("cannot create data directory %s: %s", cfg.data_dir, strerror(errno));
    goto out;
  }
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/index", cfg.data_dir);
  br_index_options opt = {.map_size = cfg.index_map_size,
                          .batch_max = (unsigned)cfg.index_batch_max};
  srv.index = br_index_open(dir, &opt, &err);
  srv.cache = blobcache_new(cfg.cache_size, cfg.cache_max_blob);
  if (!srv.index || open_stores(&srv, 0, &err) < 0 || br_server_start(&srv, &err) < 0) {
    br_error("%s", err.msg);
    br_server_stop(&srv);
    goto out;
  }
  br_info("index %s, upload store %s, %d store(s)%s", dir, cfg.upload_store, cfg.nstores,
          cfg.ntokens ? "" : ", no tokens configured: every client may write");
  sd_notify_text("READY=1\nSTATUS=serving");
  int sig = 0;
  for (;;) {
    sigwait(&stop_signals, &sig);
    if (sig != SIGHUP) break;
    reload(&o, &srv);
  }
  br_info("signal %d: stopping", sig);
  sd_notify_text("STOPPING=1");
  br_server_stop(&srv);
  rc = 0;
out:
  close_all(&srv);
  br_config_free(&cfg);
  if (rc == 0) br_info("stopped");
  return rc;
}
