/* Private to the HTTP front: every route handler, one group per file (h_*.c), and the route table
 * that names them (routes.c). A new route: its handler here, its file h_NAME.c, its line in
 * routes.c. Handlers use httpd.h's replies and request services and the core below; they never
 * call into the dispatcher (http.c). */
#ifndef BLOBREF_HTTP_HANDLERS_H
#define BLOBREF_HTTP_HANDLERS_H

#include "http/httpd.h"

/* routes.c */
extern const struct route br_routes[];
extern const size_t br_nroutes;

/* h_blobs.c: uploads (PUT with the expected hash, POST hashed here), reads and /meta. */
enum MHD_Result put_begin(struct request *req);
enum MHD_Result post_begin(struct request *req);
int upload_body(struct request *req, const char *data, size_t len);
enum MHD_Result upload_finish(struct request *req);
enum MHD_Result blob_get(struct request *req);
enum MHD_Result blob_meta(struct request *req);
/* GET /v1/blobs/{hash}/preview (admin): the bytes of a blob in any state but deleting, proxied
 * (never redirected), private, no-store, an attachment unless a passive image. */
enum MHD_Result blob_preview(struct request *req);
/* h_list.c: GET /v1/blobs (paged listing). */
enum MHD_Result list_get(struct request *req);
/* h_lookup.c: POST /v1/lookup. */
enum MHD_Result lookup_finish(struct request *req);
/* Parses a lookup body {"hashes":[...]} (bounded depth and count) into a malloc'd array of n
 * digests. Returns 0, or -1 with the error and its message. */
int lookup_parse(const char *body, size_t len, uint64_t max_hashes, uint8_t **digests, size_t *n,
                 enum br_api_error *e, char *msg, size_t msglen);
/* h_uploads.c: POST /v1/uploads (presigned direct uploads) and POST /v1/uploads/commit. */
enum MHD_Result uploads_post(struct request *req);
enum MHD_Result uploads_commit_post(struct request *req);
enum MHD_Result uploads_abort(struct request *req);
/* h_admin.c: DELETE /v1/blobs/{hash} (quarantine) and POST /v1/blobs/{hash}/restore. */
enum MHD_Result blob_hold(struct request *req);
enum MHD_Result blob_release(struct request *req);
/* h_location.c: PUT /v1/blobs/{hash}/location (a verified move). */
enum MHD_Result blob_location_put(struct request *req);
/* h_import.c: POST /v1/import (index existing objects in place). */
enum MHD_Result import_post(struct request *req);
/* h_reconcile.c: POST /v1/reconcile, GET /v1/reconcile/runs[/{id}]. */
enum MHD_Result reconcile_post(struct request *req);
enum MHD_Result reconcile_runs_get(struct request *req);
enum MHD_Result reconcile_run_get(struct request *req);
/* h_jobs.c: POST /v1/jobs, GET /v1/jobs[/{id}], POST /v1/jobs/{id}/cancel (admin). */
enum MHD_Result jobs_post(struct request *req);
enum MHD_Result jobs_get_all(struct request *req);
enum MHD_Result job_get(struct request *req);
enum MHD_Result job_cancel_post(struct request *req);
enum MHD_Result reconcile_run_blobs_get(struct request *req);
enum MHD_Result blob_refs_get(struct request *req); /* GET /v1/blobs/{hash}/refs */

/* h_leases.c: POST/GET /v1/leases, GET/DELETE /v1/leases/{id}; and for uploads and lookups:
 * lease_take checks ?lease=ID (a live lease the token may use; else answers 404
 * lease_not_found) into req->lease, lease_attach attaches blobs to it durably (a sync: call it
 * on a finisher, never a network thread; 0, or -1 with *e and msg, nothing answered). */
enum MHD_Result leases_post(struct request *req);
enum MHD_Result leases_get(struct request *req);
enum MHD_Result lease_get(struct request *req);
enum MHD_Result lease_delete(struct request *req);
enum MHD_Result lease_take(struct request *req);
int lease_attach(struct request *req, const uint8_t *digests, size_t n, enum br_api_error *e,
                 char *msg, size_t msglen);
/* A finisher job (JOB_CALL) attaching the upload's req->digest to req->lease, durably, off the
 * network thread: finish_rc 0, or -1 with finish_error and finish_message. */
void lease_attach_job(struct request *req);
/* h_health.c: /healthz, /readyz, /metrics. */
enum MHD_Result health_get(struct request *req);
enum MHD_Result ready_get(struct request *req);
enum MHD_Result metrics_get(struct request *req);
/* h_ui.c: the operator console's files. */
enum MHD_Result ui_get(struct request *req);
enum MHD_Result ui_redirect(struct request *req);
/* h_openapi.c: the OpenAPI description. */
enum MHD_Result openapi_get(struct request *req);

#endif
