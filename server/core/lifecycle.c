/* The core's lifetime: opens index and stores, and starts and stops the background services
 * (purge queue, store health, reconcile runner, drain) in one order. */
#include <stdio.h>
#include <string.h>

#include "core/blobcache.h"
#include "core/cdn_purge.h"
#include "core/drain.h"
#include "core/reconcile_runner.h"
#include "core/server.h"

int br_server_open(br_server *srv, br_config *cfg, enum br_open_mode mode, br_err *err) {
  srv->cfg = cfg;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/index", cfg->data_dir);
  br_index_options opt = {.map_size = cfg->index_map_size,
                          .batch_max = mode == BR_OPEN_SERVE ? (unsigned)cfg->index_batch_max : 1,
                          .read_only = mode == BR_OPEN_CHECK,
                          .queue_purges = mode != BR_OPEN_CHECK && cfg->ncdns > 0};
  int read_only = mode != BR_OPEN_SERVE;
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
  if (mode == BR_OPEN_SERVE) srv->cache = blobcache_new(cfg->cache_size, cfg->cache_max_blob);
  return 0;
}

void br_server_close(br_server *srv) {
  blobcache_free(srv->cache);
  srv->cache = NULL;
  br_index_close(srv->index);
  srv->index = NULL;
  for (int i = 0; i < srv->nstores; i++) br_store_close(srv->stores[i]);
  srv->nstores = 0;
}

int br_server_start(br_server *srv, br_err *err) {
  srv->started_ms = br_now_ms();
  for (int i = 0; i < BLOB_LOCKS; i++) pthread_mutex_init(&srv->blob_locks[i], NULL);
  char pdir[4200];
  snprintf(pdir, sizeof pdir, "%s/purge", srv->cfg->data_dir);
  srv->purger = cdn_purger_open(srv->cfg, srv->index, pdir, err);
  if (!srv->purger) return -1;
  if (br_server_health_start(srv, err) < 0) return -1;
  if (reconcile_runner_start(srv, err) < 0) return -1;
  if (drain_start(srv, err) < 0) return -1;
  return 0;
}

void br_server_stop(br_server *srv) {
  drain_stop(srv);
  reconcile_runner_stop(srv); /* a run in progress completes first */
  br_server_health_stop(srv);
  cdn_purger_close(srv->purger); /* last: every thread that queues purges has ended */
  srv->purger = NULL;
}
