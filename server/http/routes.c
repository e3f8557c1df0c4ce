/* The route table: every endpoint with its method, path pattern, scope and handlers. The
 * dispatcher (http.c) matches requests against it in order; handlers.h declares every handler,
 * so the compiler checks each one's signature against its slot here. */
#include "http/handlers.h"

const struct route br_routes[] = {
    {"PUT", "/v1/blobs/{hash}", BR_SCOPE_WRITE, put_begin, upload_body, upload_finish},
    {"GET", "/v1/blobs/{hash}", BR_SCOPE_READ, NULL, NULL, blob_get},
    {"POST", "/v1/blobs", BR_SCOPE_WRITE, post_begin, upload_body, upload_finish},
    {"GET", "/v1/blobs", BR_SCOPE_READ, NULL, NULL, list_get},
    {"GET", "/v1/blobs/{hash}/meta", BR_SCOPE_READ, NULL, NULL, blob_meta},
    {"GET", "/v1/blobs/{hash}/preview", BR_SCOPE_ADMIN, NULL, NULL, blob_preview},
    {"GET", "/v1/blobs/{hash}/refs", BR_SCOPE_READ, NULL, NULL, blob_refs_get},
    {"DELETE", "/v1/blobs/{hash}", BR_SCOPE_ADMIN, NULL, NULL, blob_hold},
    {"POST", "/v1/blobs/{hash}/restore", BR_SCOPE_ADMIN, NULL, NULL, blob_release},
    {"PUT", "/v1/blobs/{hash}/location", BR_SCOPE_ADMIN, NULL, json_body, blob_location_put},
    {"POST", "/v1/import", BR_SCOPE_ADMIN, NULL, json_body, import_post},
    {"POST", "/v1/reconcile", BR_SCOPE_ADMIN, NULL, NULL, reconcile_post},
    {"GET", "/v1/reconcile/runs", BR_SCOPE_READ, NULL, NULL, reconcile_runs_get},
    {"GET", "/v1/reconcile/runs/{id}", BR_SCOPE_READ, NULL, NULL, reconcile_run_get},
    {"POST", "/v1/jobs", BR_SCOPE_ADMIN, NULL, json_body, jobs_post},
    {"GET", "/v1/jobs", BR_SCOPE_ADMIN, NULL, NULL, jobs_get_all},
    {"GET", "/v1/jobs/{id}", BR_SCOPE_ADMIN, NULL, NULL, job_get},
    {"POST", "/v1/jobs/{id}/cancel", BR_SCOPE_ADMIN, NULL, NULL, job_cancel_post},
    {"POST", "/v1/lookup", BR_SCOPE_READ, NULL, json_body, lookup_finish},
    {"POST", "/v1/uploads", BR_SCOPE_WRITE, NULL, json_body, uploads_post},
    {"POST", "/v1/uploads/commit", BR_SCOPE_WRITE, NULL, json_body, uploads_commit_post},
    {"DELETE", "/v1/uploads/{upload_id}", BR_SCOPE_WRITE, NULL, NULL, uploads_abort},
    {"GET", "/v1/reconcile/runs/{id}/blobs", BR_SCOPE_READ, NULL, NULL, reconcile_run_blobs_get},
    {"POST", "/v1/leases", BR_SCOPE_WRITE, NULL, json_body, leases_post},
    {"GET", "/v1/leases", BR_SCOPE_WRITE, NULL, NULL, leases_get},
    {"GET", "/v1/leases/{lease}", BR_SCOPE_WRITE, NULL, NULL, lease_get},
    {"DELETE", "/v1/leases/{lease}", BR_SCOPE_WRITE, NULL, NULL, lease_delete},
    {"GET", "/healthz", 0, NULL, NULL, health_get},
    {"GET", "/readyz", 0, NULL, NULL, ready_get},
    {"GET", "/metrics", 0, NULL, NULL, metrics_get},
    {"GET", "/v1/openapi.json", 0, NULL, NULL, openapi_get},
    {"GET", "/ui", 0, NULL, NULL, ui_redirect},
    {"GET", "/ui/{file}", 0, NULL, NULL, ui_get},
};
const size_t br_nroutes = sizeof br_routes / sizeof br_routes[0];
_Static_assert(sizeof br_routes / sizeof br_routes[0] <= BR_MAX_ROUTES,
               "raise BR_MAX_ROUTES: every route has its own counters");
