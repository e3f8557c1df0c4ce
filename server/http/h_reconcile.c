/* POST /v1/reconcile and GET /v1/reconcile/runs[/{id}[/blobs]]: asking the core's runner for a
 * run and reading its reports and blob lists. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blobref/leases.h"
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
  int rc = reconcile_runner_request(req->srv, &qo.opt, &id, &err), remote = 0;
  /* Another node held the lease: its run's id, which it published. When none is found, that run
   * may have ended (report stored, lease given back) since the lease was refused: ask again, so
   * that a POST after its end starts a run instead of a 409 naming no run. */
  for (int tries = 0; rc > 0 && !id && tries < 3; tries++) {
    id = br_reconciler_lease_run(reconcile_runner_reconciler(req->srv));
    remote = id != 0;
    if (!id) rc = reconcile_runner_request(req->srv, &qo.opt, &id, &err);
  }
  if (rc < 0) return reply_error(req, E_INTERNAL, "%s", err.msg);
  if (rc > 0 && !id) /* on another node sharing the index, and not published yet: starting */
    return reply_error(req, E_RECONCILE_RUNNING, "a run is in progress on another node");
  if (rc > 0 && remote) {
    json_t *body =
        error_body(E_RECONCILE_RUNNING, "run %" PRIu64 " is running on another node", id);
    json_object_set_new(body, "id", json_integer((json_int_t)id));
    return reply_json(req, br_api_error_status(E_RECONCILE_RUNNING), body);
  }
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
  json_t *body = json_pack("{s:o}", "runs", runs);
  uint64_t next = reconcile_runner_next_ms(req->srv); /* for the console's "next run" */
  char when[40];
  if (next) br_format_time_ms(next, when, sizeof when);
  json_object_set_new(body, "next_run_at", next ? json_string(when) : json_null());
  return reply_json(req, MHD_HTTP_OK, body);
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

#define RUN_BLOBS_DEFAULT_LIMIT 100
#define RUN_BLOBS_MAX_LIMIT 1000

/* Appends one listed blob ({"sha256"}, pending ones with "eligible_at") to the array ud. */
static int add_listed(void *ud, const uint8_t d[BR_SHA256_LEN], uint64_t t_ms) {
  char hex[BR_HEX_LEN + 1], ts[64];
  br_hex_encode(d, hex);
  json_t *e = json_pack("{s:s}", "sha256", hex);
  if (e && t_ms) {
    br_format_time_ms(t_ms, ts, sizeof ts);
    json_object_set_new(e, "eligible_at", json_string(ts));
  }
  return !e || json_array_append_new(ud, e) != 0;
}

/* GET /v1/reconcile/runs/{id}/blobs?action=A[&after=HEX][&limit=N]: one page of the run's list of
 * blobs quarantined, restored, deleted, held (by an admin, while referenced) or pending. */
enum MHD_Result reconcile_run_blobs_get(struct request *req) {
  if (!req->srv->reconcile) return reply_error(req, E_NOT_READY, "reconcile is not running");
  const char *action = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "action");
  const char *after_s = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "after");
  const char *limit_s = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "limit");
  static const char *const actions[] = {"quarantined", "restored", "deleted", "pending", "held"};
  int known = 0;
  for (size_t i = 0; action && i < sizeof actions / sizeof *actions; i++)
    known |= !strcmp(action, actions[i]);
  if (!known)
    return reply_error(req, E_BAD_REQUEST,
                       "action must be quarantined, restored, deleted, pending or held");
  uint8_t after[BR_SHA256_LEN];
  if (after_s && *after_s && br_blob_id_parse(after_s, strlen(after_s), after) < 0)
    return reply_error(req, E_BAD_HASH, "after must be 64 lowercase hex digits");
  unsigned long limit = RUN_BLOBS_DEFAULT_LIMIT;
  if (limit_s) {
    char *end = NULL;
    errno = 0;
    limit = strtoul(limit_s, &end, 10);
    if (errno || end == limit_s || *end || limit_s[0] == '-' || limit_s[0] == '+' || limit < 1 ||
        limit > RUN_BLOBS_MAX_LIMIT)
      return reply_error(req, E_BAD_REQUEST, "limit must be a number from 1 to %d",
                         RUN_BLOBS_MAX_LIMIT);
  }
  json_t *cur = reconcile_runner_current(req->srv, req->run_id);
  if (cur) {
    json_decref(cur);
    return reply_error(req, E_RECONCILE_RUNNING,
                       "run %" PRIu64 " is running: its lists are complete when it ends",
                       req->run_id);
  }
  br_err err;
  int found = 0;
  char *text = reconcile_runner_report(req->srv, req->run_id, &found, &err);
  if (!found) return reply_error(req, E_NOT_FOUND, "no run %" PRIu64, req->run_id);
  json_t *rep = json_loads(text, 0, NULL);
  free(text);
  if (!rep) return reply_error(req, E_INTERNAL, "a stored report does not parse");
  int listed = !json_is_null(json_object_get(rep, "lists"));
  json_decref(rep);
  /* 404, not 409: no retry or later state makes these lists exist (they were never written) */
  if (!listed)
    return reply_error(req, E_LISTS_NOT_RECORDED,
                       "run %" PRIu64 " recorded counts only ([reconcile] lists = false)",
                       req->run_id);
  json_t *blobs = json_array();
  int more = 0;
  if (!blobs || br_reconciler_list_page(reconcile_runner_reconciler(req->srv), req->run_id, action,
                                        after_s && *after_s ? after : NULL, limit, add_listed,
                                        blobs, &more, &err) < 0) {
    json_decref(blobs);
    return reply_error(req, E_INTERNAL, "%s", blobs ? err.msg : "out of memory");
  }
  json_t *next = json_null();
  size_t n = json_array_size(blobs);
  if (more && n) next = json_incref(json_object_get(json_array_get(blobs, n - 1), "sha256"));
  return reply_json(req, MHD_HTTP_OK,
                    json_pack("{s:I,s:s,s:o,s:o}", "run", (json_int_t)req->run_id, "action", action,
                              "blobs", blobs, "next", next));
}

/* GET /v1/blobs/{hash}/refs: why a blob is still here. The tables are read on a slow-pool thread
 * (a targeted read of every retained snapshot's data files); the record and the leases say why
 * an unreferenced blob is not quarantined yet. */
struct refs_job {
  json_t *tables;
  char message[sizeof(br_err)];
};

static void refs_run(struct request *req) {
  struct refs_job *j = req->job_data;
  br_err err;
  j->tables = br_reconciler_refs(reconcile_runner_reconciler(req->srv), req->digest, &err);
  if (!j->tables) snprintf(j->message, sizeof j->message, "%s", err.msg);
}

enum MHD_Result blob_refs_get(struct request *req) {
  if (!req->srv->reconcile) return reply_error(req, E_NOT_READY, "reconcile is not running");
  if (req->phase != PHASE_RESUMED) {
    struct refs_job *j = calloc(1, sizeof *j);
    if (!j) return reply_error(req, E_INTERNAL, "out of memory");
    req->job_data = j;
    req->job_fn = refs_run;
    if (request_finish_async(req, JOB_SLOW) < 0)
      return reply_error(req, E_NOT_READY, "the server is stopping");
    return MHD_YES;
  }
  struct refs_job *j = req->job_data;
  if (!j->tables) return reply_error(req, E_INTERNAL, "%s", j->message);
  json_t *tables = j->tables;
  j->tables = NULL;
  br_record rec;
  br_err err;
  int rc = br_index_get(req->srv->index, req->digest, &rec, &err);
  if (rc < 0) {
    json_decref(tables);
    return reply_error(req, E_INTERNAL, "%s", err.msg);
  }
  int referenced = 0;
  size_t i;
  json_t *t;
  json_array_foreach(tables, i, t) referenced |=
      json_array_size(json_object_get(t, "data_files")) > 0;
  char hex[BR_HEX_LEN + 1], ts[64], why[600];
  br_hex_encode(req->digest, hex);
  json_t *body =
      json_pack("{s:s,s:o,s:b}", "sha256", hex, "tables", tables, "referenced", referenced);
  const br_config *cfg = req->srv->cfg;
  uint64_t now = br_now_ms();
  br_leases *ls = br_reconciler_leases(reconcile_runner_reconciler(req->srv));
  char lease_id[BR_LEASE_ID_LEN + 1] = "";
  uint64_t leased = br_leased_until(ls, req->digest, now, lease_id);
  uint64_t grace_end =
      rc == 0 ? rec.last_upload_ms + cfg->grace_ms + cfg->dedup_touch_interval_ms : 0;
  if (rc != 0) {
    snprintf(why, sizeof why, "not in the index");
  } else if (rec.state == BR_STATE_HELD) {
    snprintf(why, sizeof why, "held by an admin: %s", rec.reason);
  } else if (rec.state == BR_STATE_QUARANTINED) {
    br_format_time_ms(rec.state_ms + cfg->retention_ms, ts, sizeof ts);
    snprintf(why, sizeof why, "%s: quarantined, deleted by the first run after %s",
             referenced ? "referenced (restored by the next run)" : "unreferenced", ts);
  } else if (rec.state != BR_STATE_LIVE) {
    snprintf(why, sizeof why, "being deleted");
  } else if (referenced) {
    snprintf(why, sizeof why, "referenced");
  } else if (leased) {
    br_lease l;
    br_format_time_ms(leased, ts, sizeof ts);
    int named = br_lease_get(ls, lease_id, now, &l, &err) == 1;
    snprintf(why, sizeof why, "unreferenced, leased by %s (%s) until %s", lease_id,
             named ? l.name : "?", ts);
    json_object_set_new(
        body, "lease",
        json_pack("{s:s,s:s,s:s}", "id", lease_id, "name", named ? l.name : "", "until", ts));
  } else if (grace_end > now) {
    br_format_time_ms(grace_end, ts, sizeof ts);
    snprintf(why, sizeof why, "unreferenced, in grace until %s", ts);
    json_object_set_new(body, "grace_until", json_string(ts));
  } else {
    snprintf(why, sizeof why, "unreferenced: the next run quarantines it");
  }
  json_object_set_new(body, "state",
                      json_string(rc != 0                             ? "absent"
                                  : rec.state == BR_STATE_LIVE        ? "live"
                                  : rec.state == BR_STATE_HELD        ? "held"
                                  : rec.state == BR_STATE_QUARANTINED ? "quarantined"
                                                                      : "deleting"));
  json_object_set_new(body, "why", json_string(why));
  return reply_json(req, MHD_HTTP_OK, body);
}
