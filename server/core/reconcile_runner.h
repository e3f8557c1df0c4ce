/* Private to the daemon: the reconcile run thread inside blobrefd (core/reconcile_runner.c). */
#ifndef BLOBREF_CORE_RECONCILE_RUNNER_H
#define BLOBREF_CORE_RECONCILE_RUNNER_H

#include <jansson.h>

#include "blobref/reconcile.h"
#include "core/server.h"

/* Opens the reconciler (state under DATA_DIR/reconcile) and starts its thread; -1 with err. */
int reconcile_runner_start(br_server *srv, br_err *err);
/* Stops the thread (a run in progress completes first) and closes the reconciler. */
void reconcile_runner_stop(br_server *srv);

/* The calls below need a started runner (srv->reconcile not NULL). */

/* Asks for a run with opt. Returns 0 with *id the new run's id, 1 when a run is asked for or in
 * progress already (*id is its id), or -1 with err. */
int reconcile_runner_request(br_server *srv, const br_reconcile_options *opt, uint64_t *id,
                             br_err *err);
/* The run in progress as a small report ({"id","state":"running",...}), when there is one and id
 * is 0 or its id; else NULL. The caller owns the result. */
json_t *reconcile_runner_current(br_server *srv, uint64_t id);
/* The stored reports of ended runs, newest first, at most max; NULL with err. */
json_t *reconcile_runner_reports(br_server *srv, size_t max, br_err *err);
/* The stored report of run id as JSON text (malloc'd), or NULL (*found = 0: no such run). */
char *reconcile_runner_report(br_server *srv, uint64_t id, int *found, br_err *err);
/* When the next periodic run is due (ms since the epoch), or 0: none is scheduled (interval =
 * 0) or a run is under way (the next is scheduled when it ends). */
uint64_t reconcile_runner_next_ms(br_server *srv);
/* The reconciler itself, for reading a run's blob lists (br_reconciler_list_page). */
br_reconciler *reconcile_runner_reconciler(br_server *srv);
/* Appends the runner's Prometheus lines (runs by result, the last run's figures). */
void reconcile_runner_metrics(br_server *srv, void (*emit)(void *ud, const char *line), void *ud);

#endif
