/* HTTP client helpers shared by the blobref subcommands: libcurl handle setup with the bearer
 * token, bounded response buffers, server error text, and local checks of hash and range args. */
#ifndef BLOBREF_TOOLS_HTTP_CLIENT_H
#define BLOBREF_TOOLS_HTTP_CLIENT_H

#include <curl/curl.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "blobref/common.h"

#define BR_HTTP_URL_MAX 8192                      /* longest URL we build */
#define BR_HTTP_JSON_MAX ((size_t)64 << 20)       /* largest JSON reply we accept (64 MiB) */
#define BR_HTTP_ERROR_BODY_MAX ((size_t)64 << 10) /* bytes of an error body we keep */
#define BR_CLI_RANGE_SPEC_MAX 4096                /* longest --range spec */
#define BR_CLI_RANGE_COUNT_MAX 64                 /* most ranges in one --range (as the server) */
#define BR_CLI_CONTENT_TYPE_MAX 255               /* longest --type (as the server) */

/* A growable byte buffer that refuses to grow past `max` (then `toobig` is set and the curl
 * write callback fails the transfer). Zero-initialise, set max, free with br_http_buf_free. */
typedef struct br_http_buf {
  char *data; /* NUL-terminated when len > 0; owned */
  size_t len, cap, max;
  int toobig;
} br_http_buf;

/* Appends n bytes; returns 0, or -1 when over max (toobig set) or out of memory. */
int br_http_buf_append(br_http_buf *b, const void *p, size_t n);
void br_http_buf_free(br_http_buf *b);
/* A CURLOPT_WRITEFUNCTION that appends into the br_http_buf given as CURLOPT_WRITEDATA. */
size_t br_http_buf_write(char *ptr, size_t size, size_t nmemb, void *userdata);

/* One request: the easy handle with the server URL, the bearer token, timeouts and protocol
 * limits already set, plus the header list the caller adds to. Lives on the caller's stack. */
typedef struct br_http_req {
  CURL *curl;
  struct curl_slist *headers;
  char url[BR_HTTP_URL_MAX];
  char curl_err[CURL_ERROR_SIZE];
} br_http_req;

/* Builds base + path into out (one '/' between them; base must start with http:// or https://).
 * Returns 0, or -1 with err when the URL is malformed or longer than outsize - 1. Pure. */
int br_http_url(const char *base, const char *path, char *out, size_t outsize, br_err *err);

/* Initialises r for server + path with token (may be NULL) as `Authorization: Bearer`; curl does
 * not send the token to another host after a redirect. Returns 0, or -1 with err (r is then
 * already cleaned up). Call br_http_req_free when done. */
int br_http_req_init(br_http_req *r, const char *server, const char *token, const char *path,
                     br_err *err);
/* Adds one request header line ("Name: value"). Returns 0 or -1 (out of memory). */
int br_http_req_header(br_http_req *r, const char *line, br_err *err);
/* Runs the request (installs the header list first). On success returns 0 and the HTTP status
 * in *status. On a transport failure returns -1 with err = "cannot reach URL: why". */
int br_http_req_perform(br_http_req *r, long *status, br_err *err);
void br_http_req_free(br_http_req *r);

/* One JSON exchange: METHOD server+path with `body` (NULL = no body) as application/json, reply
 * read into memory (at most BR_HTTP_JSON_MAX bytes) and parsed. On a 2xx returns 0 with *reply
 * (the caller json_decref's it). Otherwise returns -1 with err: the server's error line from
 * br_http_error_text for a non-2xx (*status set), or the transport or parse failure (*status 0
 * when the server was not reached). */
int br_http_json(const char *server, const char *token, const char *method, const char *path,
                 const json_t *body, long *status, json_t **reply, br_err *err);

/* Turns a non-2xx reply into one line "code: message (HTTP status)" from the server's JSON
 * `{"error":{"code","message"}}`, or "HTTP status" with a short printable excerpt of a body
 * that is not such JSON. Control characters are replaced so that the text stays one line. */
void br_http_error_text(long status, const char *body, size_t len, char *out, size_t outsize);

/* Parses a blob hash argument: 64 hex digits (either case) optionally behind "sha256:", and
 * writes the canonical 64 lowercase hex digits + NUL into hex. Returns 0 or -1. Pure. */
int br_cli_hash_parse(const char *arg, char hex[BR_HEX_LEN + 1]);

/* Checks a --range SPEC (what follows "bytes="; a leading "bytes=" is accepted and skipped):
 * a comma-separated list of "first-last", "first-" or "-suffix" with decimal numbers,
 * first <= last, suffix > 0, at most BR_CLI_RANGE_COUNT_MAX ranges, at most
 * BR_CLI_RANGE_SPEC_MAX chars; spaces allowed around commas. On success *spec_out points into
 * spec past any "bytes=" and 0 is returned; -1 with err otherwise. Pure. */
int br_cli_range_check(const char *spec, const char **spec_out, br_err *err);

/* Checks a --type value: 1..255 printable ASCII characters (what the server accepts). */
int br_cli_content_type_check(const char *type);

/* Opens a temporary file next to path (same directory, so the rename is atomic) with the
 * permissions a new file would get. Writes its name into tmp. Returns the FILE, or NULL with err
 * (tmp then names nothing to remove). */
FILE *br_cli_open_temp_next_to(const char *path, char *tmp, size_t tmpsize, br_err *err);

/* Prints "blobref CMD: message" and a pointer to 'blobref CMD --help' on stderr; returns 2, the
 * usage exit status. */
int br_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Edit distance of two short words (insert, delete, substitute, swap of neighbours); 99 when
 * either is over 32 bytes. */
size_t br_cli_edit_distance(const char *a, const char *b);

struct option;
/* The usage error for the argv word getopt_long just refused (argv[optind - 1]) in command cmd:
 * "needs a value" for a known option, else "unknown option", with "did you mean --NAME?" when
 * one of longopts or the global options (--json, --server, --token) is within 2 edits or the
 * only one it abbreviates. Returns 2. */
int br_cli_bad_option(const char *cmd, char **argv, const struct option *longopts);

#endif
