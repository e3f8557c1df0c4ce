/* The core's lifetime: opens index and stores, and starts and stops the background services
 * (purge queue, store health, reconcile runner, drain, jobs, direct-upload sweep) in one order. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "core/blobcache.h"
#include "core/cdn_purge.h"
#include "core/direct_plans.h"
#include "core/drain.h"
#include "core/jobs.h"
#include "core/reconcile_runner.h"
#include "core/server.h"
#include "blobref/sniff.h"

/* Takes flock(LOCK_EX | LOCK_NB) on DATA_DIR/lock and writes our pid into it (for the next one's
 * message). -1 with err when the file cannot be opened or another process holds the lock. */
static int lock_data_dir(br_server *srv, const char *data_dir, br_err *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/lock", data_dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return br_fail(err, "cannot open %s: %s", path, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno;
    char holder[32] = "";
    ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
    holder[n > 0 ? n : 0] = '\0';
    holder[strcspn(holder, "\n")] = '\0';
    close(fd);
    if (e == EWOULDBLOCK)
      return br_fail(err, "data directory %s is in use by another blobrefd (pid %s holds %s)",
                     data_dir, holder[0] ? holder : "unknown", path);
    return br_fail(err, "cannot lock %s: %s", path, strerror(e));
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)len, 0) != len)
    br_warn("cannot write the pid into %s: %s", path, strerror(errno));
  srv->data_lock_fd = fd;
  srv->data_locked = 1;
  return 0;
}

/* The index's listener: another node changed digest's record (NULL: maybe any record). */
static void index_changed(void *ud, const uint8_t *digest) {
  br_server *srv = ud;
  if (digest)
    blobcache_remove(srv->cache, digest);
  else
    blobcache_clear(srv->cache);
}

int br_server_open(br_server *srv, br_config *cfg, enum br_open_mode mode, br_err *err) {
  srv->cfg = cfg;
  if (mode != BR_OPEN_CHECK && lock_data_dir(srv, cfg->data_dir, err) < 0) return -1;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/index", cfg->data_dir);
  br_index_options opt = {.map_size = cfg->index_map_size,
                          .batch_max = mode == BR_OPEN_SERVE || mode == BR_OPEN_IMPORT ||
                                               mode == BR_OPEN_REBUILD /* 1,024 a commit */
                                           ? (unsigned)cfg->index_batch_max
                                           : 1,
                          .read_only = mode == BR_OPEN_CHECK,
                          .queue_purges = mode != BR_OPEN_CHECK && cfg->ncdns > 0,
                          .dsn = !strcmp(cfg->index_kind, "postgres") ? cfg->index_dsn : NULL,
                          .purge_claim_ms = cfg->purge_claim_timeout_ms,
                          .read_dsn = cfg->index_read_dsn,
                          .record_cache = (size_t)cfg->index_record_cache,
                          .on_change = index_changed,
                          .on_change_ud = srv};
  int read_only = mode != BR_OPEN_SERVE;
  /* uploads without a type get one from their first bytes: no database, no start */
  if (mode == BR_OPEN_SERVE && br_sniff_open(err) < 0) return -1;
  /* before the index: its listener evicts from it (and the index closes first) */
  if (mode == BR_OPEN_SERVE) srv->cache = blobcache_new(cfg->cache_size, cfg->cache_max_blob);
  srv->index = br_index_open(dir, &opt, err);
  if (!srv->index) return -1;
  for (int i = 0; i < cfg->nstores; i++) {
    br_store_config sc = cfg->stores[i];
    sc.read_only = read_only;
    br_store *st = br_store_open(&sc, err);
    if (!st) return -1;
    srv->stores[srv->nstores++] = st;
  }
  srv->upload_store = br_server_store(srv, cfg->upload_store);
  return 0;
}

int br_server_add_stores(br_server *srv, br_config *fresh, br_err *err) {
  br_config *cfg = srv->cfg;
  int added = 0;
  for (int i = 0; i < fresh->nstores; i++) {
    br_store_config *sc = &fresh->stores[i];
    if (br_config_store(cfg, sc->name)) continue; /* known: changes need a restart */
    if (cfg->nstores == BR_MAX_STORES || srv->nstores == BR_MAX_STORES)
      return br_fail(err, "[store %s]: at most %d stores", sc->name, BR_MAX_STORES);
    br_store *st = br_store_open(sc, err);
    if (!st) return -1;
    /* the new section's strings move into the daemon's config (the store points at them) */
    cfg->stores[cfg->nstores] = *sc;
    memset(sc, 0, sizeof *sc);
    __atomic_store_n(&cfg->nstores, cfg->nstores + 1, __ATOMIC_RELEASE);
    int n = srv->nstores;
    srv->stores[n] = st;
    atomic_store(&srv->store_ok[n], strcmp(br_store_kind(st), "fs") ? -1 : 1);
    __atomic_store_n(&srv->nstores, n + 1, __ATOMIC_RELEASE); /* published last */
    br_info("reload: [store %s] (%s) added", br_store_name(st), br_store_kind(st));
    added++;
  }
  return added;
}

void br_server_close(br_server *srv) {
  br_index_close(srv->index); /* its listener evicts from the cache until then */
  srv->index = NULL;
  blobcache_free(srv->cache);
  srv->cache = NULL;
  for (int i = 0; i < srv->nstores; i++) br_store_close(srv->stores[i]);
  srv->nstores = 0;
  if (srv->data_locked) close(srv->data_lock_fd); /* releases the flock */
  srv->data_locked = 0;
}

int br_server_start(br_server *srv, br_err *err) {
  srv->started_ms = br_now_ms();
  for (int i = 0; i < BLOB_LOCKS; i++) pthread_mutex_init(&srv->blob_locks[i], NULL);
  pthread_mutex_init(&srv->busy_lock, NULL);
  char pdir[4200];
  snprintf(pdir, sizeof pdir, "%s/purge", srv->cfg->data_dir);
  srv->purger = cdn_purger_open(srv->cfg, srv->index, pdir, err);
  if (!srv->purger) return -1;
  if (br_server_health_start(srv, err) < 0) return -1;
  if (reconcile_runner_start(srv, err) < 0) return -1;
  if (drain_start(srv, err) < 0) return -1;
  if (jobs_start(srv, err) < 0) return -1;
  if (direct_plans_start(srv, err) < 0) return -1;
  return 0;
}

void br_server_stop(br_server *srv) {
  direct_plans_stop(srv); /* after the HTTP front: no negotiation or commit is running */
  jobs_stop(srv);         /* first: jobs move blobs, which drain and queue purges */
  drain_stop(srv);
  reconcile_runner_stop(srv); /* a run in progress completes first */
  br_server_health_stop(srv);
  cdn_purger_close(srv->purger); /* last: every thread that queues purges has ended */
  srv->purger = NULL;
}
