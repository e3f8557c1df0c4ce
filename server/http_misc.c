/* /healthz, /readyz and /metrics (Prometheus text format). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httpd.h"

enum MHD_Result health_get(struct request *req) {
  return reply_json(req, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"));
}

enum MHD_Result ready_get(struct request *req) {
  if (!atomic_load(&req->srv->ready)) return reply_error(req, E_NOT_READY, "starting or stopping");
  char msg[sizeof(br_err)];
  if (br_server_store_health(req->srv, msg, sizeof msg) < 0)
    return reply_error(req, E_NOT_READY, "%s", msg);
  return reply_json(req, MHD_HTTP_OK, json_pack("{s:s}", "status", "ready"));
}

struct text {
  char *buf;
  size_t len, cap;
};

static void appendf(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void appendf(struct text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->buf && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap ? t->cap * 2 : 8192;
    while (cap < t->len + (size_t)n + 1) cap *= 2;
    char *grown = realloc(t->buf, cap);
    if (!grown) return;
    t->buf = grown;
    t->cap = cap;
  }
}

static void emit_line(void *ud, const char *line) { appendf(ud, "%s", line); }

enum MHD_Result metrics_get(struct request *req) {
  br_server *srv = req->srv;
  struct text t = {0};
  appendf(&t,
          "# HELP blobref_http_requests_total HTTP requests answered, by route and status "
          "class.\n# TYPE blobref_http_requests_total counter\n");
  for (size_t r = 0; r < br_nroutes && r < 16; r++)
    for (int c = 1; c <= 5; c++) {
      uint64_t v = atomic_load(&srv->requests[r][c]);
      if (v)
        appendf(&t,
                "blobref_http_requests_total{route=\"%s\",method=\"%s\",code=\"%dxx\"} %" PRIu64
                "\n",
                br_routes[r].pattern, br_routes[r].method, c, v);
    }
  br_index_stats is;
  br_index_get_stats(srv->index, &is);
  appendf(&t,
          "# TYPE blobref_uploads_total counter\n"
          "blobref_uploads_total{result=\"created\"} %" PRIu64
          "\n"
          "blobref_uploads_total{result=\"dedup\"} %" PRIu64
          "\n"
          "# TYPE blobref_received_bytes_total counter\nblobref_received_bytes_total %" PRIu64
          "\n"
          "# TYPE blobref_served_bytes_total counter\nblobref_served_bytes_total %" PRIu64
          "\n"
          "# TYPE blobref_index_commits_total counter\nblobref_index_commits_total %" PRIu64
          "\n"
          "# TYPE blobref_index_operations_total counter\nblobref_index_operations_total %" PRIu64
          "\n"
          "# TYPE blobref_index_entries gauge\nblobref_index_entries %" PRIu64
          "\n"
          "# TYPE blobref_index_map_bytes gauge\nblobref_index_map_bytes %" PRIu64
          "\n"
          "# TYPE blobref_index_used_bytes gauge\nblobref_index_used_bytes %" PRIu64
          "\n"
          "# TYPE blobref_start_time_seconds gauge\nblobref_start_time_seconds %" PRIu64 "\n",
          atomic_load(&srv->uploads_created), atomic_load(&srv->uploads_dedup),
          atomic_load(&srv->bytes_in), atomic_load(&srv->bytes_out), is.commits, is.ops, is.entries,
          is.map_size, is.map_used, srv->started_ms / 1000);
  reconcile_metrics(srv, emit_line, &t);
  if (!t.buf) return reply_error(req, E_INTERNAL, "out of memory");
  struct MHD_Response *resp = MHD_create_response_from_buffer(t.len, t.buf, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(t.buf);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4");
  return reply_response(req, MHD_HTTP_OK, resp);
}
