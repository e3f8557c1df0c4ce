/* POST /v1/reconcile and GET /v1/reconcile/runs[/{id}]: asking the core's runner for a run and
 * reading its reports. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/reconcile_runner.h"
#include "http/handlers.h"

/* The options of POST /v1/reconcile: only dry_run, force and full, each bare or =, =1, =true,
 * =0, =false. Anything else is an error: a misspelt option (dryrun=1, dry_run=yes) must never
 * turn what the caller meant as a dry run into a real one. */
struct query_opts {
  br_reconcile_options opt;
  char msg[200];
};
static enum MHD_Result parse_query_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value) {
  (void)kind;
  struct query_opts *q = cls;
  int *flag = !strcmp(key, "dry_run") ? &q->opt.dry_run
              : !strcmp(key, "force") ? &q->opt.force
              : !strcmp(key, "full")  ? &q->opt.full
                                      : NULL;
  if (!flag) {
    snprintf(q->msg, sizeof q->msg, "unknown parameter '%.60s' (dry_run, force, full)", key);
    return MHD_NO;
  }
  if (!value || !*value || !strcmp(value, "1") || !strcmp(value, "true")) {
    *flag = 1; /* libmicrohttpd gives a bare "?dry_run" a NULL value */
  } else if (!strcmp(value, "0") || !strcmp(value, "false")) {
    *flag = 0;
  } else {
    snprintf(q->msg, sizeof q->msg, "%s=%.60s: expected 1, true, 0 or false", key, value);
    return MHD_NO;
  }
  return MHD_YES;
}

enum MHD_Result reconcile_post(struct request *req) {
  if (!req->srv->reconcile) return reply_error(req, E_NOT_READY, "reconcile is not running");
  struct query_opts qo;
  memset(&qo, 0, sizeof qo);
  MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, parse_query_arg, &qo);
  if (qo.msg[0]) return reply_error(req, E_BAD_REQUEST, "%s", qo.msg);
  br_err err;
  uint64_t id = 0;
  int rc = reconcile_runner_request(req->srv, &qo.opt, &id, &err);
  if (rc < 0) return reply_error(req, E_INTERNAL, "%s", err.msg);
  if (rc > 0 && !id) /* on another node sharing the index */
    return reply_error(req, E_RECONCILE_RUNNING, "a run is in progress on another node");
  if (rc > 0) {
    json_t *body = error_body(E_RECONCILE_RUNNING, "run %" PRIu64 " is running", id);
    json_object_set_new(body, "id", json_integer((json_int_t)id));
    return reply_json(req, br_api_error_status(E_RECONCILE_RUNNING), body);
  }
  return reply_json(req, 202, json_pack("{s:I,s:s}", "id", (json_int_t)id, "state", "running"));
}

enum MHD_Result reconcile_runs_get(struct request *req) {
  if (!req->srv->reconcile) return reply_error(req, E_NOT_READY, "reconcile is not running");
  br_err err;
  json_t *runs = reconcile_runner_reports(req->srv, 100, &err);
  if (!runs) return reply_error(req, E_INTERNAL, "%s", err.msg);
  json_t *cur = reconcile_runner_current(req->srv, 0);
  if (cur) json_array_insert_new(runs, 0, cur);
  return reply_json(req, MHD_HTTP_OK, json_pack("{s:o}", "runs", runs));
}

enum MHD_Result reconcile_run_get(struct request *req) {
  if (!req->srv->reconcile) return reply_error(req, E_NOT_READY, "reconcile is not running");
  json_t *cur = reconcile_runner_current(req->srv, req->run_id);
  if (cur) return reply_json(req, MHD_HTTP_OK, cur);
  br_err err;
  int found = 0;
  char *text = reconcile_runner_report(req->srv, req->run_id, &found, &err);
  if (!found) return reply_error(req, E_NOT_FOUND, "no run %" PRIu64, req->run_id);
  json_t *j = json_loads(text, 0, NULL);
  free(text);
  if (!j) return reply_error(req, E_INTERNAL, "a stored report does not parse");
  return reply_json(req, MHD_HTTP_OK, j);
}
