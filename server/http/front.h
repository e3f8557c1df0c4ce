/* The HTTP front as the daemon sees it: an opaque handle with a start, a stop and a reload. The
 * daemon's entry point includes this alone, so that <microhttpd.h> stays inside server/http/. */
#ifndef BLOBREF_HTTP_FRONT_H
#define BLOBREF_HTTP_FRONT_H

#include "blobref/config.h"
#include "core/server.h"

typedef struct br_http br_http;

/* A front that has not started (all zero). NULL when out of memory. br_http_free after stop. */
br_http *br_http_new(void);
void br_http_free(br_http *http);
/* Starts the finishers, the proxied-read engine, the operator services and the daemons on top of
 * a started core (srv). Returns -1 with err (br_http_stop then undoes what did start). */
int br_http_start(br_http *http, br_server *srv, br_err *err);
/* Stops taking connections, lets requests in progress end (up to shutdown_timeout), waits for
 * every upload with a finisher to become durable, then stops the daemons and the finishers. The
 * core is left running: the caller stops it afterwards. */
void br_http_stop(br_http *http);
/* SIGHUP: applies what can change while serving from a freshly loaded config (tokens, anonymous
 * scopes, access log, trusted proxies, request limits). Returns -1 with err when nothing was
 * applied. */
int br_http_reload(br_http *http, const br_config *fresh, br_err *err);

#endif
