/* POST /v1/jobs, GET /v1/jobs[/{id}], POST /v1/jobs/{id}/cancel: the core's job engine
 * (core/jobs.c) over HTTP. */
#include <inttypes.h>
#include <stdio.h>

#include "core/jobs.h"
#include "http/handlers.h"

enum MHD_Result jobs_post(struct request *req) {
  if (!req->srv->jobs) return reply_error(req, E_NOT_READY, "jobs are not running");
  json_error_t jerr;
  json_t *spec =
      req->body ? json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
  if (!json_is_object(spec)) {
    json_decref(spec);
    return reply_error(req, E_BAD_JSON,
                       "the body must be {\"kind\":\"migrate\",\"from\",\"to\",...} or "
                       "{\"kind\":\"import\",\"store\",\"source\",\"mode\"}");
  }
  json_t *job = NULL;
  const char *field = NULL;
  char msg[400];
  enum jobs_rc rc = jobs_submit(req->srv, spec, &job, &field, msg, sizeof msg);
  json_t *body = NULL;
  switch (rc) {
    case JOBS_OK:
      json_decref(spec);
      return reply_json(req, 202, job);
    case JOBS_BAD:
      body = error_body(E_BAD_REQUEST, "%s", msg);
      /* the field named, before spec (which owns the string) goes */
      json_object_set_new(json_object_get(body, "error"), "field", json_string(field));
      json_decref(spec);
      br_info("POST /v1/jobs refused: %s", msg);
      return reply_json(req, br_api_error_status(E_BAD_REQUEST), body);
    case JOBS_CONFLICT:
      json_decref(spec);
      br_info("POST /v1/jobs refused: %s", msg);
      body = error_body(E_JOB_CONFLICT, "%s", msg);
      json_object_set_new(body, "id", json_incref(json_object_get(job, "id")));
      json_object_set_new(body, "job", job); /* the one in the way: a client may follow it */
      return reply_json(req, br_api_error_status(E_JOB_CONFLICT), body);
    case JOBS_FULL:
      json_decref(spec);
      return reply_error(req, E_TRY_AGAIN, "%s", msg);
    default:
      json_decref(spec);
      return reply_error(req, E_INTERNAL, "%s", msg);
  }
}

enum MHD_Result jobs_get_all(struct request *req) {
  if (!req->srv->jobs) return reply_error(req, E_NOT_READY, "jobs are not running");
  json_t *all = jobs_list(req->srv);
  if (!all) return reply_error(req, E_INDEX_UNAVAILABLE, "the jobs cannot be read now");
  return reply_json(req, MHD_HTTP_OK, all);
}

enum MHD_Result job_get(struct request *req) {
  if (!req->srv->jobs) return reply_error(req, E_NOT_READY, "jobs are not running");
  json_t *j = NULL;
  enum jobs_rc rc = jobs_get(req->srv, req->run_id, &j);
  if (rc == JOBS_FAILED)
    return reply_error(req, E_INDEX_UNAVAILABLE, "the jobs cannot be read now");
  if (rc != JOBS_OK) return reply_error(req, E_NOT_FOUND, "no job %" PRIu64, req->run_id);
  return reply_json(req, MHD_HTTP_OK, j);
}

enum MHD_Result job_cancel_post(struct request *req) {
  if (!req->srv->jobs) return reply_error(req, E_NOT_READY, "jobs are not running");
  json_t *j = NULL;
  enum jobs_rc rc = jobs_cancel(req->srv, req->run_id, &j);
  if (rc == JOBS_FAILED)
    return reply_error(req, E_INDEX_UNAVAILABLE, "the jobs cannot be read now");
  if (rc != JOBS_OK) return reply_error(req, E_NOT_FOUND, "no job %" PRIu64, req->run_id);
  return reply_json(req, MHD_HTTP_OK, j);
}
