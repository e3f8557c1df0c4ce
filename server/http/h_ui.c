/* GET /ui/ and /ui/{file}: the operator console's static files, compiled in (no data in them). */
#include <string.h>

#include "http/httpd.h"
#include "http/ui_assets.h"

/* Every console response carries these: the page runs only its own scripts and styles, talks only
 * to this server, and cannot be framed; blob bytes are never rendered as HTML (img or text only).
 */
#define UI_CSP                                                                            \
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; " \
  "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

static void add_security_headers(struct MHD_Response *resp) {
  MHD_add_response_header(resp, "Content-Security-Policy", UI_CSP);
  MHD_add_response_header(resp, "X-Frame-Options", "DENY");
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
}

/* The asset named by the last segment of path ("" and "index.html": the page), or NULL. path is
 * the request's path (absolute-form targets included); the route guarantees one segment after
 * /ui/. */
static const struct ui_asset *find_asset(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *name = slash ? slash + 1 : path;
  if (!strcmp(name, "index.html")) name = "";
  for (size_t i = 0; i < ui_nassets; i++)
    if (!strcmp(ui_assets[i].name, name)) return &ui_assets[i];
  return NULL;
}

/* True when If-None-Match lists etag (or is "*"). */
static int etag_matches(const char *inm, const char *etag) {
  if (!inm) return 0;
  if (!strcmp(inm, "*")) return 1;
  size_t n = strlen(etag);
  for (const char *p = strstr(inm, etag); p; p = strstr(p + 1, etag)) {
    int starts = p == inm || p[-1] == ' ' || p[-1] == ',' || (p - inm >= 2 && p[-2] == 'W');
    if (starts && (p[n] == '\0' || p[n] == ',' || p[n] == ' ')) return 1;
  }
  return 0;
}

/* GET|HEAD /ui/{file}: the asset with its type, ETag and caching (a year for hashed names,
 * revalidated for index.html and licenses.txt), 304 on a matching If-None-Match, 404 JSON for a
 * name that is not compiled in. Scope 0: the files hold no data; the page asks for a token. */
enum MHD_Result ui_get(struct request *req) {
  const struct ui_asset *a = find_asset(req->path);
  if (!a) return reply_error(req, E_NOT_FOUND, "no such console file");
  const char *inm =
      MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
  int not_modified = etag_matches(inm, a->etag);
  struct MHD_Response *resp =
      not_modified
          ? MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT)
          : MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
  if (!resp) return MHD_NO;
  if (!not_modified) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, a->content_type);
    req->bytes_out = req->is_head ? 0 : a->len;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, a->etag);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
                          a->immutable ? "public, max-age=31536000, immutable" : "no-cache");
  add_security_headers(resp);
  return reply_response(req, not_modified ? MHD_HTTP_NOT_MODIFIED : MHD_HTTP_OK, resp);
}

/* GET|HEAD /ui: a permanent redirect to /ui/ (relative references in the page need the slash). */
enum MHD_Result ui_redirect(struct request *req) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, "/ui/");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  add_security_headers(resp);
  return reply_response(req, MHD_HTTP_PERMANENT_REDIRECT, resp);
}
