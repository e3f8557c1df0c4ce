/* GET /v1/openapi.json: the API's OpenAPI 3.1 description (conf/openapi.json), compiled in. */
#include <string.h>

#include "http/httpd.h"
#include "http/openapi_doc.h"

/* GET|HEAD /v1/openapi.json: the document with its ETag, revalidated on every use (no-cache),
 * 304 on a matching If-None-Match. Scope 0: it describes the API and holds no data, so a
 * generator or a gateway can fetch it without a token. */
enum MHD_Result openapi_get(struct request *req) {
  const char *inm =
      MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
  int not_modified = inm && (!strcmp(inm, "*") || strstr(inm, openapi_etag));
  struct MHD_Response *resp =
      not_modified ? MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT)
                   : MHD_create_response_from_buffer(openapi_json_len, (void *)openapi_json,
                                                     MHD_RESPMEM_PERSISTENT);
  if (!resp) return MHD_NO;
  if (!not_modified) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    req->bytes_out = req->is_head ? 0 : openapi_json_len;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, openapi_etag);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  return reply_response(req, not_modified ? MHD_HTTP_NOT_MODIFIED : MHD_HTTP_OK, resp);
}
