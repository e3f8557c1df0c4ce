/* Private to the daemon: the drain thread (core/drain.c). */
#ifndef BLOBREF_CORE_DRAIN_H
#define BLOBREF_CORE_DRAIN_H

#include "core/server.h"

/* Starts the thread that deletes draining copies after drain_grace; -1 with err. */
int drain_start(br_server *srv, br_err *err);
/* Stops it (the copy being deleted, if any, is finished first) and joins it. */
void drain_stop(br_server *srv);

#endif
