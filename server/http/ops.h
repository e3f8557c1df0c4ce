/* Private to the HTTP front: the operator's side of requests (ops.c): access log, request ids,
 * trusted proxies, the auth table, the JSON body budget and slow-client tracking. */
#ifndef BLOBREF_HTTP_OPS_H
#define BLOBREF_HTTP_OPS_H

#include "http/httpd.h"

/* Sets up the access log, request ids, trusted proxies, the auth table and the slow-client
 * sweeper from the config. Returns -1 with err (a bad trusted_proxies, an access log that cannot
 * be opened). */
int ops_start(br_http *http, br_err *err);
void ops_stop(br_http *http);
/* SIGHUP: takes what can change safely from a freshly loaded config (tokens, anonymous scopes,
 * access log path, trusted proxies, request limits) and reopens the access log; logs each setting
 * that differs but needs a restart. Returns -1 with err when nothing was applied. */
int ops_reload(br_http *http, const br_config *fresh, br_err *err);
/* First handler call: request id, remote address, start time. */
void ops_request_begin(struct request *req);
/* Completion: latency histogram, access log line. */
void ops_request_end(struct request *req);
/* Scopes of the request (see http.c); fills req->token_name. -1: an unknown bearer token. */
int ops_granted_scopes(struct request *req, unsigned *scopes);
/* May the request see /metrics and /readyz's details? E__COUNT: yes (private_metrics is off, or
 * the token has the metrics or admin scope); else the error to answer: E_UNAUTHORIZED (no or an
 * unknown token), E_FORBIDDEN (a token without either scope). */
enum br_api_error ops_metrics_access(struct request *req);
/* Takes n more bytes of the global JSON budget for req. -1 when it would go over. */
int ops_json_reserve(struct request *req, uint64_t n);
void ops_json_release(struct request *req);
/* libmicrohttpd's connection notifications (slow-client tracking). */
void ops_notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe);
/* Where the connection's request is, for the slow-client sweeper: waiting for a head
 * (TRACK_HEAD: after it opened or its previous request ended), reading a body (TRACK_BODY: the
 * head is complete), or neither (TRACK_BUSY: body complete, being answered). */
enum { TRACK_HEAD, TRACK_BODY, TRACK_BUSY, TRACK_CUT };
void ops_track(struct request *req, int state);
/* req->bytes_in changed (TRACK_BODY). */
void ops_track_body(struct request *req);

#endif
