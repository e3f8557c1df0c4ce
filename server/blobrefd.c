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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <time.h>

#include "blobref/version.h"
#include "core/fsck.h"
#include "core/index_move.h"
#include "core/server.h"
#include "http/front.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: blobrefd [-c FILE] [--listen HOST:PORT] [--data DIR] [--debug]\n"
          "       blobrefd --version\n"
          "       blobrefd --fsck [--verify] [-c FILE] [--data DIR]\n"
          "       blobrefd --rebuild-index [-c FILE] [--data DIR]\n"
          "       blobrefd --export-index FILE [-c FILE] [--data DIR]\n"
          "       blobrefd --import-index FILE [-c FILE] [--data DIR]\n"
          "With no -c, runs on the embedded default: an fs store 'local' under DIR/blobs and the\n"
          "index under DIR/index (DIR defaults to ./var). Flags override the file.\n");
}

struct options {
  const char *config, *listen, *data;
  const char *export_index, *import_index; /* --export-index / --import-index FILE */
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
    else if (!strcmp(a, "--export-index") && has_value)
      o->export_index = argv[++i];
    else if (!strcmp(a, "--import-index") && has_value)
      o->import_index = argv[++i];
    else if (!strcmp(a, "--fsck"))
      o->fsck = 1;
    else if (!strcmp(a, "--verify"))
      o->verify = 1;
    else if (!strcmp(a, "--rebuild-index"))
      o->rebuild = 1;
    else if (!strcmp(a, "--debug"))
      o->debug = 1;
    else if (!strcmp(a, "--version")) {
      printf("blobrefd %s\n", BLOBREF_VERSION);
      exit(0);
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
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

/* Descriptors beyond two per connection (client socket, upstream socket or temp file) and one per
 * store: index and queue files, listeners, logs, curl's multi handles, the finishers' files. */
#define NOFILE_MARGIN 256

/* Raises the soft RLIMIT_NOFILE toward max_connections * 2 + stores + NOFILE_MARGIN, up to the
 * hard limit; warns (with what is missing) when the hard limit is below that: connections would
 * then fail with EMFILE before max_connections is reached. Never lowers the limit. */
static void raise_nofile_limit(const br_config *cfg) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) < 0) {
    br_warn("getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    return;
  }
  rlim_t want = (rlim_t)cfg->max_connections * 2 + (rlim_t)cfg->nstores + NOFILE_MARGIN;
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
    rlim_t soft = lim.rlim_max != RLIM_INFINITY && lim.rlim_max < want ? lim.rlim_max : want;
    struct rlimit raised = {.rlim_cur = soft, .rlim_max = lim.rlim_max};
    if (soft > lim.rlim_cur && setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      br_info("open files limit raised from %llu to %llu", (unsigned long long)lim.rlim_cur,
              (unsigned long long)soft);
      lim.rlim_cur = soft;
    }
  }
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want)
    br_warn(
        "open files limit is %llu (hard %llu), below the %llu that max_connections = %llu "
        "needs: connections may fail with EMFILE (raise LimitNOFILE= or ulimit -Hn, or lower "
        "max_connections)",
        (unsigned long long)lim.rlim_cur, (unsigned long long)lim.rlim_max,
        (unsigned long long)want, (unsigned long long)cfg->max_connections);
}

/* SIGHUP: reads the config again (with the same command-line overrides) and applies what can
 * change while serving, new [store] sections included; a config that does not load changes
 * nothing. */
static void reload(const struct options *o, br_http *http, br_server *srv) {
  br_config fresh;
  br_err err;
  br_info("SIGHUP: reloading %s", o->config ? o->config : "(built-in defaults)");
  sd_notify_text("RELOADING=1");
  if (load_config(o, &fresh, &err) < 0 || br_http_reload(http, &fresh, &err) < 0)
    br_error("reload failed, nothing changed: %s", err.msg);
  else if (br_server_add_stores(srv, &fresh, &err) < 0) /* new [store] sections only */
    br_error("reload: adding a store failed: %s", err.msg);
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
  if (o.export_index || o.import_index) {
    int rc = o.export_index ? br_index_export(&cfg, o.export_index)
                            : br_index_import(&cfg, o.import_index);
    br_config_free(&cfg);
    return rc;
  }
  if (o.fsck || o.rebuild) {
    int rc = o.fsck ? br_fsck(&cfg, o.verify) : br_rebuild_index(&cfg);
    br_config_free(&cfg);
    return rc;
  }
  /* The core starts first and stops last: the front's requests and finishers use it until the
   * front has stopped. */
  static br_server srv;
  br_http *http = br_http_new();
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
  if (!http) {
    br_error("out of memory");
    goto out;
  }
  raise_nofile_limit(&cfg);
  if (br_server_open(&srv, &cfg, BR_OPEN_SERVE, &err) < 0 || br_server_start(&srv, &err) < 0 ||
      br_http_start(http, &srv, &err) < 0) {
    br_error("%s", err.msg);
    br_http_stop(http);
    br_server_stop(&srv);
    goto out;
  }
  br_info("index %s/index, upload store %s, %d store(s)%s", cfg.data_dir, cfg.upload_store,
          cfg.nstores, cfg.ntokens ? "" : ", no tokens configured: every client may write");
  sd_notify_text("READY=1\nSTATUS=serving");
  int sig = 0;
  for (;;) {
    sigwait(&stop_signals, &sig);
    if (sig != SIGHUP) break;
    reload(&o, http, &srv);
  }
  br_info("signal %d: stopping", sig);
  sd_notify_text("STOPPING=1");
  br_http_stop(http);
  br_server_stop(&srv);
  rc = 0;
out:
  br_http_free(http);
  br_server_close(&srv);
  br_config_free(&cfg);
  if (rc == 0) br_info("stopped");
  return rc;
}
