/* Upload leases over HTTP: POST/GET /v1/leases, GET/DELETE /v1/leases/{id}, and the ?lease=ID
 * of uploads and lookups (checked before any body byte is read, attached before the record is). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blobref/leases.h"
#include "core/reconcile_runner.h"
#include "http/handlers.h"
#include "http/ops.h"

static br_leases *leases_of(struct request *req) {
  return req->srv->reconcile ? br_reconciler_leases(reconcile_runner_reconciler(req->srv)) : NULL;
}

/* The owner a request may act as: NULL (any lease) for an admin, else its token's name. */
static const char *owner_of(struct request *req) {
  unsigned scopes = 0;
  if (ops_granted_scopes(req, &scopes) == 0 && (scopes & BR_SCOPE_ADMIN)) return NULL;
  return req->token_name;
}

static json_t *lease_json(const br_lease *l) {
  char created[64], expires[64];
  br_format_time_ms(l->created_ms, created, sizeof created);
  br_format_time_ms(l->expires_ms, expires, sizeof expires);
  return json_pack("{s:s,s:s,s:s,s:s,s:s,s:I}", "id", l->id, "name", l->name, "owner", l->owner,
                   "created_at", created, "expires_at", expires, "blobs", (json_int_t)l->blobs);
}

/* The {id} of /v1/leases/{id}: the path's last segment. */
static const char *path_lease_id(struct request *req) {
  const char *slash = strrchr(req->path, '/');
  return slash ? slash + 1 : "";
}

enum MHD_Result leases_post(struct request *req) {
  br_leases *ls = leases_of(req);
  if (!ls) return reply_error(req, E_NOT_READY, "reconcile is not running");
  json_error_t jerr;
  json_t *root =
      req->body ? json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
  if (!root)
    return reply_error(req, E_BAD_JSON, "the body must be {\"ttl\":\"2h\",\"name\":\"...\"}");
  json_t *ttl_j = json_object_get(root, "ttl"), *name_j = json_object_get(root, "name");
  const char *ttl_s = json_string_value(ttl_j), *name = name_j ? json_string_value(name_j) : "";
  uint64_t ttl = 0;
  enum MHD_Result r;
  size_t nkeys = json_object_size(root) - !!ttl_j - !!name_j;
  if (!json_is_object(root) || nkeys) {
    r = reply_error(req, E_BAD_REQUEST, "the body has only \"ttl\" and \"name\"");
  } else if (!ttl_s || br_parse_duration_ms(ttl_s, &ttl) < 0 || ttl == 0 ||
             ttl > BR_LEASE_TTL_MAX_MS) {
    r = reply_error(req, E_BAD_REQUEST, "ttl is a duration (\"90s\", \"2h\") from 1s to 7d");
  } else if (!name || strlen(name) > BR_LEASE_NAME_MAX) {
    r = reply_error(req, E_BAD_REQUEST, "name is a string of at most %d bytes", BR_LEASE_NAME_MAX);
  } else {
    int printable = 1;
    for (const char *p = name; *p; p++) printable &= *p >= 0x20 && *p < 0x7f;
    br_lease l;
    br_err err;
    if (!printable)
      r = reply_error(req, E_BAD_REQUEST, "name is printable ASCII");
    else if (br_lease_create(ls, name, req->token_name, ttl, br_now_ms(), &l, &err) < 0)
      r = reply_error(req, E_INTERNAL, "%s", err.msg);
    else {
      br_info("lease %s created (%s, by %s), until +%" PRIu64 " ms", l.id, l.name,
              *l.owner ? l.owner : "-", ttl);
      r = reply_json(req, MHD_HTTP_CREATED, lease_json(&l));
    }
  }
  json_decref(root);
  return r;
}

static int add_lease(void *ud, const br_lease *l) {
  return json_array_append_new(ud, lease_json(l)) != 0;
}

enum MHD_Result leases_get(struct request *req) {
  br_leases *ls = leases_of(req);
  if (!ls) return reply_error(req, E_NOT_READY, "reconcile is not running");
  json_t *a = json_array();
  br_err err;
  if (br_leases_each(ls, owner_of(req), br_now_ms(), add_lease, a, &err) < 0) {
    json_decref(a);
    return reply_error(req, E_INTERNAL, "%s", err.msg);
  }
  return reply_json(req, MHD_HTTP_OK, json_pack("{s:o}", "leases", a));
}

/* The live lease of the URL that the request may see, or an answered 404 (returns 0). */
static int visible_lease(struct request *req, br_leases *ls, br_lease *l, enum MHD_Result *r) {
  const char *id = path_lease_id(req), *owner = owner_of(req);
  br_err err;
  int rc = br_lease_get(ls, id, br_now_ms(), l, &err);
  if (rc < 0) {
    *r = reply_error(req, E_INTERNAL, "%s", err.msg);
    return 0;
  }
  if (rc == 0 || (owner && strcmp(owner, l->owner))) {
    *r = reply_error(req, E_LEASE_NOT_FOUND, "no lease %.40s (expired, released or not yours)", id);
    return 0;
  }
  return 1;
}

enum MHD_Result lease_get(struct request *req) {
  br_leases *ls = leases_of(req);
  if (!ls) return reply_error(req, E_NOT_READY, "reconcile is not running");
  br_lease l;
  enum MHD_Result r;
  if (!visible_lease(req, ls, &l, &r)) return r;
  return reply_json(req, MHD_HTTP_OK, lease_json(&l));
}

enum MHD_Result lease_delete(struct request *req) {
  br_leases *ls = leases_of(req);
  if (!ls) return reply_error(req, E_NOT_READY, "reconcile is not running");
  br_lease l;
  enum MHD_Result r;
  if (!visible_lease(req, ls, &l, &r)) return r;
  br_err err;
  int rc = br_lease_release(ls, l.id, &err);
  if (rc < 0) return reply_error(req, E_INTERNAL, "%s", err.msg);
  if (rc == 0) return reply_error(req, E_LEASE_NOT_FOUND, "no lease %s", l.id);
  br_info("lease %s released (%s, %" PRIu64 " blobs)", l.id, l.name, l.blobs);
  json_t *body = lease_json(&l);
  json_object_set_new(body, "released", json_true());
  return reply_json(req, MHD_HTTP_OK, body);
}

enum MHD_Result lease_take(struct request *req) {
  const char *id = MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, "lease");
  if (!id) return MHD_YES;
  br_leases *ls = leases_of(req);
  if (!ls) return reply_error(req, E_NOT_READY, "reconcile is not running: no leases");
  br_lease l;
  br_err err;
  const char *owner = owner_of(req);
  int rc = br_lease_get(ls, id, br_now_ms(), &l, &err);
  if (rc < 0) return reply_error(req, E_INTERNAL, "%s", err.msg);
  if (rc == 0 || (owner && strcmp(owner, l.owner)))
    return reply_error(req, E_LEASE_NOT_FOUND, "no lease %.40s (expired, released or not yours)",
                       id);
  memcpy(req->lease, l.id, sizeof req->lease);
  return MHD_YES;
}

void lease_attach_job(struct request *req) {
  br_leases *ls = leases_of(req);
  br_err err;
  int rc =
      ls ? br_lease_attach(ls, req->lease, owner_of(req), req->digest, 1, br_now_ms(), &err) : 0;
  req->finish_rc = rc == 1 ? 0 : -1;
  req->finish_error = rc == 2 ? E_LEASE_FULL : rc == 0 ? E_LEASE_NOT_FOUND : E_INTERNAL;
  if (rc == 2)
    snprintf(req->finish_message, sizeof req->finish_message,
             "lease %s holds %d blobs, the most one lease may", req->lease, BR_LEASE_MAX_BLOBS);
  else if (rc == 0)
    snprintf(req->finish_message, sizeof req->finish_message, "lease %s ended", req->lease);
  else if (rc < 0)
    snprintf(req->finish_message, sizeof req->finish_message, "%s", err.msg);
}

int lease_attach(struct request *req, const uint8_t *digests, size_t n, enum br_api_error *e,
                 char *msg, size_t msglen) {
  if (!req->lease[0] || !n) return 0;
  br_leases *ls = leases_of(req);
  br_err err;
  int rc = ls ? br_lease_attach(ls, req->lease, owner_of(req), digests, n, br_now_ms(), &err) : 0;
  if (rc == 1) return 0;
  *e = rc == 2 ? E_LEASE_FULL : rc == 0 ? E_LEASE_NOT_FOUND : E_INTERNAL;
  if (rc == 2)
    snprintf(msg, msglen, "lease %s holds %d blobs, the most one lease may", req->lease,
             BR_LEASE_MAX_BLOBS);
  else if (rc == 0)
    snprintf(msg, msglen, "lease %s ended", req->lease);
  else
    snprintf(msg, msglen, "%s", err.msg);
  return -1;
}
