/* Private to the HTTP front: reads from stores that are read over HTTP (S3, http origins),
 * without blocking network threads (proxy.c). */
#ifndef BLOBREF_HTTP_PROXY_H
#define BLOBREF_HTTP_PROXY_H

#include "http/httpd.h"

int proxy_engine_start(br_http *http, br_err *err);
/* Fails every proxied read in progress (their connections resume) and stops the loop. */
void proxy_engine_stop(br_http *http);
/* One piece of a proxied body: literal bytes (literal_len > 0), or len bytes of the object from
 * first. A remote piece with joins = 1 is read by the same upstream request as the remote piece
 * before it (which must end before first; the bytes between are read and dropped): a plan from
 * br_range_plan. */
struct proxy_part {
  const char *literal;
  size_t literal_len;
  uint64_t first, len;
  int joins;
};
/* Starts fetching the pieces from url and suspends req; the route's finish handler runs again
 * (PHASE_RESUMED, req->proxy set) once the origin answered (collect = 0) or the whole body is
 * in memory (collect = 1). store and key name the object (log lines, the suspect list). A
 * transfer that fails with a 5xx or a broken connection before any of its bytes went out is
 * tried again, at most retries more times, with backoff (counted in br_http's proxy_retries).
 * whole_blob: the one part is the whole blob req->digest names; the stream is hashed on the way
 * and, if it is not that blob, its last bytes are never sent (the client sees a short body),
 * counted, logged and the location listed as suspect (core/suspect.h). Returns 0, or -1 with err
 * (nothing started, not suspended). */
int proxy_start(struct request *req, const char *url, const struct proxy_part *parts, size_t n,
                int collect, uint64_t stall_ms, const char *store, const char *key,
                unsigned retries, int whole_blob, br_err *err);
/* After the resume: 0, or -1 with the failure in msg (*status: the origin's HTTP status, 0 when
 * it could not be reached). */
int proxy_result(struct request *req, long *status, char *msg, size_t msglen);
/* collect = 1: the bytes received. */
const char *proxy_collected(struct request *req, size_t *len);
/* A response whose size-byte body streams from the transfer. */
struct MHD_Response *proxy_response(struct request *req, uint64_t size);
/* Releases the request's hold on its proxied read (on completion). */
void proxy_request_done(struct request *req);

#endif
