/* blobref put/get/stat/lookup: upload, download, describe and look up blobs over the HTTP API. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blobref/header.h"
#include "commands.h"
#include "http_client.h"

#define HASH_CHUNK (64 * 1024) /* read size when hashing a file */
#define LOOKUP_BATCH 10000     /* hashes per POST /v1/lookup */
#define LOOKUP_LINE_MAX 1024   /* longest stdin line accepted by lookup */
#define EXIT_LOOKUP_MISSING 1
#define EXIT_USAGE 2
#define EXIT_LOOKUP_ERROR 3

/* ---- small shared pieces ---- */

/* Prints the one-line error "blobref: WHAT: why". */
static void print_error(const char *what, const char *why) {
  fprintf(stderr, "blobref: %s: %s\n", what, why);
}

/* Prints the server's error for a non-2xx reply. */
static void print_reply_error(const char *what, long status, const br_http_buf *body) {
  char text[512];
  br_http_error_text(status, body->data, body->len, text, sizeof text);
  print_error(what, text);
}

static int is_2xx(long status) { return status >= 200 && status <= 299; }

/* Resets getopt for a subcommand's argv (argv[0] = the command name). */
static void getopt_reset(void) {
  optind = 0; /* glibc: full re-initialisation */
  opterr = 0;
}

/* Hashes the rest of f with SHA-256 (streaming, HASH_CHUNK at a time) into hex. Returns 0, or
 * -1 with err on a read error. */
static int sha256_file(FILE *f, char hex[BR_HEX_LEN + 1], uint64_t *size, br_err *err) {
  int rc = -1;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int dlen = 0;
  char *buf = malloc(HASH_CHUNK);
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  *size = 0;
  if (!buf || !md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
    br_fail(err, "out of memory");
    goto fail;
  }
  for (;;) {
    size_t n = fread(buf, 1, HASH_CHUNK, f);
    if (n > 0 && EVP_DigestUpdate(md, buf, n) != 1) {
      br_fail(err, "SHA-256 failed");
      goto fail;
    }
    *size += n;
    if (n < HASH_CHUNK) break;
  }
  if (ferror(f)) {
    br_fail(err, "read error: %s", strerror(errno));
    goto fail;
  }
  if (EVP_DigestFinal_ex(md, digest, &dlen) != 1 || dlen != BR_SHA256_LEN) {
    br_fail(err, "SHA-256 failed");
    goto fail;
  }
  br_hex_encode(digest, hex);
  rc = 0;
fail:
  EVP_MD_CTX_free(md);
  free(buf);
  return rc;
}

/* Hashes the file into hex and *size and, in the same pass, each part_size bytes into the JSON
 * array *parts of hex SHA-256s (the caller owns it). Returns 0 or -1 with err. */
static int sha256_file_parts(FILE *f, uint64_t part_size, char hex[BR_HEX_LEN + 1], uint64_t *size,
                             json_t **parts, br_err *err) {
  int rc = -1;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int dlen = 0;
  char *buf = malloc(HASH_CHUNK), phex[BR_HEX_LEN + 1];
  EVP_MD_CTX *md = EVP_MD_CTX_new(), *pmd = EVP_MD_CTX_new();
  uint64_t in_part = 0;
  *size = 0;
  *parts = json_array();
  if (!buf || !md || !pmd || !*parts || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 ||
      EVP_DigestInit_ex(pmd, EVP_sha256(), NULL) != 1) {
    br_fail(err, "out of memory");
    goto fail;
  }
  for (;;) {
    size_t want = part_size - in_part < HASH_CHUNK ? (size_t)(part_size - in_part) : HASH_CHUNK;
    size_t n = fread(buf, 1, want, f);
    if (n > 0 && (EVP_DigestUpdate(md, buf, n) != 1 || EVP_DigestUpdate(pmd, buf, n) != 1)) {
      br_fail(err, "SHA-256 failed");
      goto fail;
    }
    *size += n;
    in_part += n;
    if (in_part == part_size || (n < want && in_part > 0)) {
      if (EVP_DigestFinal_ex(pmd, digest, &dlen) != 1 ||
          EVP_DigestInit_ex(pmd, EVP_sha256(), NULL) != 1) {
        br_fail(err, "SHA-256 failed");
        goto fail;
      }
      br_hex_encode(digest, phex);
      json_array_append_new(*parts, json_string(phex));
      in_part = 0;
    }
    if (n < want) break;
  }
  if (ferror(f)) {
    br_fail(err, "read error: %s", strerror(errno));
    goto fail;
  }
  if (EVP_DigestFinal_ex(md, digest, &dlen) != 1 || dlen != BR_SHA256_LEN) {
    br_fail(err, "SHA-256 failed");
    goto fail;
  }
  br_hex_encode(digest, hex);
  rc = 0;
fail:
  if (rc != 0) {
    json_decref(*parts);
    *parts = NULL;
  }
  EVP_MD_CTX_free(md);
  EVP_MD_CTX_free(pmd);
  free(buf);
  return rc;
}

/* Parses a 2xx JSON reply body into *root. Returns 0 or -1 with err. */
static int parse_json_reply(const br_http_buf *body, json_t **root, br_err *err) {
  json_error_t je;
  *root = body->len ? json_loadb(body->data, body->len, 0, &je) : NULL;
  if (!*root) return br_fail(err, "server sent a reply that is not JSON");
  return 0;
}

/* ---- put ---- */

static const char put_help[] =
    "usage: blobref put [--type CONTENT-TYPE] [--sha256 HEX] [-v] FILE|-\n"
    "       blobref put [--type CONTENT-TYPE] [-r] [--jobs N] [--direct] FILE|DIR...\n"
    "\n"
    "Uploads FILE (or standard input for '-') and prints its SHA-256 in hex.\n"
    "A regular file is hashed locally first and sent with PUT /v1/blobs/HASH and\n"
    "'Expect: 100-continue', so a blob the server already has is not sent again.\n"
    "Standard input is streamed with POST /v1/blobs (chunked), or with a chunked\n"
    "PUT when --sha256 is given. With several files (or -r DIR), each line is\n"
    "'HEX  PATH', uploads run N at a time, and a summary goes to standard error.\n"
    "\n"
    "  --type CONTENT-TYPE  stored Content-Type (default: from the file name's\n"
    "                       extension, else application/octet-stream)\n"
    "  --sha256 HEX         expected hash (64 hex digits or sha256:HEX); the server\n"
    "                       refuses the upload when the bytes do not match it\n"
    "  -r, --recursive      upload the regular files under each DIR (symbolic links\n"
    "                       are not followed)\n"
    "  --jobs N             uploads at a time with several files (1-64, default 4)\n"
    "  --direct             ask POST /v1/uploads first and PUT each new file straight\n"
    "                       to the store where offered (else through the server), then\n"
    "                       register them with POST /v1/uploads/commit; a file over\n"
    "                       5 MiB is hashed per 8 MiB part in the same pass and sent in\n"
    "                       parts when the store's part size is smaller than the file\n"
    "  -v, --verbose        print 'HEX size=N dedup=yes|no sent=N' instead of HEX\n"
    "  -h, --help           this help\n"
    "\n"
    "Exit status: 0 uploaded (or already present), 1 error, 2 usage error.\n";

#define PUT_JOBS_MAX 64
#define PUT_FILES_MAX (1u << 24) /* paths one command takes (-r included) */

typedef struct put_opts {
  const char *type;
  char hex[BR_HEX_LEN + 1]; /* expected hash, "" when unknown */
  int verbose;
  int labelled; /* several files: print "HEX  PATH" */
} put_opts;

/* What one upload did, for the summary of a multi-file put. */
typedef struct put_result {
  int ok, dedup;
  uint64_t size;
  curl_off_t sent;
} put_result;

/* Sends the upload; on a 2xx prints the result (one printf, so parallel uploads do not mix their
 * lines) and fills *res. Returns the exit status. */
static int put_send(const cli_globals *g, const put_opts *o, const char *type, FILE *in,
                    int64_t length, const char *label, const char *what, put_result *res) {
  int rc = 1;
  br_err err = {{0}};
  br_http_req req;
  br_http_buf body = {.max = BR_HTTP_JSON_MAX};
  json_t *root = NULL;
  char path[128], ctype[BR_CLI_CONTENT_TYPE_MAX + 32];
  long status = 0;

  if (o->hex[0])
    snprintf(path, sizeof path, "/v1/blobs/%s", o->hex);
  else
    snprintf(path, sizeof path, "/v1/blobs");
  if (br_http_req_init(&req, g->server, g->token, path, &err) != 0) {
    print_error(what, err.msg);
    return 1;
  }
  CURL *c = req.curl;
  snprintf(ctype, sizeof ctype, "Content-Type: %s", type);
  if (br_http_req_header(&req, ctype, &err) != 0) goto fail;
  curl_easy_setopt(c, CURLOPT_READDATA, in);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, br_http_buf_write);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  if (o->hex[0]) {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L); /* PUT */
    /* Always ask first: the server answers 200 for a known blob before any body byte. */
    if (br_http_req_header(&req, "Expect: 100-continue", &err) != 0) goto fail;
  } else {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    if (br_http_req_header(&req, "Expect:", &err) != 0) goto fail; /* nothing to skip */
  }
  if (length >= 0) {
    curl_off_t len = (curl_off_t)length;
    curl_easy_setopt(c, o->hex[0] ? CURLOPT_INFILESIZE_LARGE : CURLOPT_POSTFIELDSIZE_LARGE, len);
  } else if (br_http_req_header(&req, "Transfer-Encoding: chunked", &err) != 0) {
    goto fail;
  }
  if (br_http_req_perform(&req, &status, &err) != 0) {
    if (body.toobig) snprintf(err.msg, sizeof err.msg, "server reply larger than allowed");
    goto fail;
  }
  if (!is_2xx(status)) {
    print_reply_error(what, status, &body);
    goto done;
  }
  if (parse_json_reply(&body, &root, &err) != 0) goto fail;
  const char *sha = json_string_value(json_object_get(root, "sha256"));
  json_t *size = json_object_get(root, "size");
  json_t *dedup = json_object_get(root, "dedup");
  if (!sha || strlen(sha) != BR_HEX_LEN || !json_is_integer(size) || !json_is_boolean(dedup)) {
    br_fail(&err, "server reply lacks sha256/size/dedup");
    goto fail;
  }
  if (o->hex[0] && strcmp(sha, o->hex) != 0) {
    br_fail(&err, "server stored %s, not the requested %s", sha, o->hex);
    goto fail;
  }
  curl_off_t sent = 0;
  curl_easy_getinfo(c, CURLINFO_SIZE_UPLOAD_T, &sent);
  *res = (put_result){1, json_is_true(dedup), (uint64_t)json_integer_value(size), sent};
  int w;
  if (g->json) {
    json_t *line = json_pack("{s:s, s:O, s:O}", "sha256", sha, "size", size, "dedup", dedup);
    if (line && o->labelled) json_object_set_new(line, "path", json_string(label));
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    w = text ? printf("%s\n", text) : -1;
    free(text);
    json_decref(line);
  } else if (o->verbose) {
    w = printf("%s size=%" JSON_INTEGER_FORMAT " dedup=%s sent=%" CURL_FORMAT_CURL_OFF_T "%s%s\n",
               sha, json_integer_value(size), json_is_true(dedup) ? "yes" : "no", sent,
               o->labelled ? "  " : "", o->labelled ? label : "");
  } else {
    w = printf("%s%s%s\n", sha, o->labelled ? "  " : "", o->labelled ? label : "");
  }
  if (w < 0 || fflush(stdout) != 0) {
    br_fail(&err, "cannot write to standard output: %s", strerror(errno));
    goto fail;
  }
  rc = 0;
  goto done;
fail:
  print_error(what, err.msg);
done:
  json_decref(root);
  br_http_buf_free(&body);
  br_http_req_free(&req);
  return rc;
}

/* Uploads one path ('-' = standard input). Returns the exit status; *res says what happened. */
static int put_one(const cli_globals *g, const put_opts *o, const char *file, put_result *res) {
  char what[300];
  br_err err = {{0}};
  put_opts mine = *o;
  FILE *in = NULL;
  int rc = 1;
  *res = (put_result){0};
  snprintf(what, sizeof what, "put %.250s", file);
  const char *type = o->type;
  if (!type) type = br_content_type_for_name(file);
  if (!type) type = "application/octet-stream";

  int64_t length = -1;
  if (strcmp(file, "-") == 0) {
    in = stdin;
  } else {
    struct stat st;
    in = fopen(file, "rb");
    if (!in || fstat(fileno(in), &st) != 0) {
      br_fail(&err, "cannot open: %s", strerror(errno));
      goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
      br_fail(&err, "is a directory (see -r)");
      goto fail;
    }
    if (S_ISREG(st.st_mode)) {
      /* A regular file: hash it first (unless told), then send it with its length. */
      if (!mine.hex[0]) {
        uint64_t hashed = 0;
        if (sha256_file(in, mine.hex, &hashed, &err) != 0) goto fail;
        if (fseeko(in, 0, SEEK_SET) != 0) {
          br_fail(&err, "cannot rewind: %s", strerror(errno));
          goto fail;
        }
        if ((off_t)hashed != st.st_size) {
          br_fail(&err, "file changed while it was hashed");
          goto fail;
        }
      }
      length = (int64_t)st.st_size;
    }
  }
  rc = put_send(g, &mine, type, in, length, file, what, res);
  goto done;
fail:
  print_error(what, err.msg);
  rc = 1;
done:
  if (in && in != stdin) fclose(in);
  return rc;
}

/* The paths a multi-file put uploads, in command-line order (directories walked, sorted). */
typedef struct put_list {
  char **paths;
  size_t n, cap;
  int failed; /* a path that could not be walked (already reported) */
} put_list;

static int put_list_add(put_list *l, const char *path) {
  if (l->n >= PUT_FILES_MAX) return -1;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    char **grown = realloc(l->paths, cap * sizeof *grown);
    if (!grown) return -1;
    l->paths = grown;
    l->cap = cap;
  }
  if (!(l->paths[l->n] = strdup(path))) return -1;
  l->n++;
  return 0;
}

static int path_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds the regular files under dir (symbolic links are neither followed nor uploaded). */
static int put_walk(put_list *l, const char *dir, int depth) {
  if (depth > 64) {
    fprintf(stderr, "blobref: put %s: directories nested too deep\n", dir);
    l->failed = 1;
    return 0;
  }
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "blobref: put %s: cannot open: %s\n", dir, strerror(errno));
    l->failed = 1;
    return 0;
  }
  size_t first = l->n;
  char path[4096];
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) {
      fprintf(stderr, "blobref: put %s/%s: path too long\n", dir, e->d_name);
      l->failed = 1;
      continue;
    }
    struct stat st;
    if (lstat(path, &st) != 0) continue; /* gone meanwhile */
    if (S_ISREG(st.st_mode) && put_list_add(l, path) < 0) {
      closedir(d);
      return -1;
    }
  }
  qsort(l->paths + first, l->n - first, sizeof *l->paths, path_cmp);
  rewinddir(d);
  while ((e = readdir(d))) { /* then the subdirectories, in name order of their files */
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) continue;
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && put_walk(l, path, depth + 1) < 0) {
      closedir(d);
      return -1;
    }
  }
  closedir(d);
  return 0;
}

typedef struct put_batch {
  const cli_globals *g;
  const put_opts *o;
  const put_list *list;
  atomic_size_t next;
  pthread_mutex_t lock;
  size_t uploaded, present, failed;
  uint64_t bytes, sent;
} put_batch;

static void *put_worker(void *arg) {
  put_batch *b = arg;
  for (;;) {
    size_t i = atomic_fetch_add(&b->next, 1);
    if (i >= b->list->n) return NULL;
    put_result r;
    int rc = put_one(b->g, b->o, b->list->paths[i], &r);
    pthread_mutex_lock(&b->lock);
    if (rc != 0 || !r.ok)
      b->failed++;
    else if (r.dedup)
      b->present++;
    else
      b->uploaded++;
    b->bytes += r.ok ? r.size : 0;
    b->sent += r.sent > 0 ? (uint64_t)r.sent : 0;
    pthread_mutex_unlock(&b->lock);
  }
}

/* Uploads every path of list, jobs at a time; prints the summary. Returns the exit status. */
static int put_many(const cli_globals *g, const put_opts *o, const put_list *list, int jobs) {
  put_batch b = {.g = g, .o = o, .list = list};
  atomic_init(&b.next, 0);
  pthread_mutex_init(&b.lock, NULL);
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    fprintf(stderr, "blobref: put: libcurl did not start\n");
    return 1;
  }
  pthread_t threads[PUT_JOBS_MAX];
  int started = 0;
  if ((size_t)jobs > list->n) jobs = (int)list->n;
  for (; started < jobs; started++)
    if (pthread_create(&threads[started], NULL, put_worker, &b) != 0) break;
  if (started == 0) put_worker(&b);
  for (int t = 0; t < started; t++) pthread_join(threads[t], NULL);
  pthread_mutex_destroy(&b.lock);
  fprintf(stderr,
          "blobref put: %zu file%s: %zu uploaded, %zu already present, %zu failed; %" PRIu64
          " bytes, %" PRIu64 " sent\n",
          list->n, list->n == 1 ? "" : "s", b.uploaded, b.present, b.failed, b.bytes, b.sent);
  return b.failed || list->failed ? 1 : 0;
}

/* ---- put --direct: negotiate, PUT straight to the store, commit -------------------------- */

#define DIRECT_BATCH 1000            /* blobs per negotiation and commit */
#define DIRECT_HASHES_MAX 20000      /* part hashes per negotiation (the server's bound) */
#define DIRECT_MIN_PART (5ull << 20) /* S3's smallest part: no single PUT is offered below it */
#define DIRECT_PART (8ull << 20)     /* the part size a file over DIRECT_MIN_PART is hashed at */
#define DIRECT_MAX_PARTS 10000
#define DIRECT_ETAG_MAX 127

typedef struct direct_item {
  const char *path;
  char hex[BR_HEX_LEN + 1];
  uint64_t size;
  const char *type;
  uint64_t part_size; /* 0: hashed whole only (not over DIRECT_MIN_PART) */
  json_t *part_sha256;
  json_t *action; /* borrowed from the negotiation reply */
  json_t *etags;  /* a multipart plan's ETags, in part order (owned) */
  int ok;         /* the bytes are in the store (or were sent through blobrefd) */
  int via_server;
  uint64_t sent;
} direct_item;

typedef struct direct_run {
  const cli_globals *g;
  const put_opts *o;
  direct_item *items;
  size_t n;
  atomic_size_t next;
  pthread_mutex_t lock;
  size_t uploaded, present, failed;
} direct_run;

/* The part size a file of size bytes is hashed at: DIRECT_PART or bigger (a MiB multiple) so that
 * it has at most DIRECT_MAX_PARTS parts; 0 when it is not over DIRECT_MIN_PART. Pure. */
static uint64_t direct_part_size(uint64_t size) {
  if (size <= DIRECT_MIN_PART) return 0;
  uint64_t fit = (size + DIRECT_MAX_PARTS - 1) / DIRECT_MAX_PARTS;
  fit = (fit + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
  return fit > DIRECT_PART ? fit : DIRECT_PART;
}

/* A bounded read from a FILE (curl's read callback for one part). */
typedef struct part_reader {
  FILE *in;
  uint64_t left;
} part_reader;

static size_t part_read(char *buf, size_t size, size_t nitems, void *arg) {
  part_reader *r = arg;
  size_t want = size * nitems;
  if (want > r->left) want = (size_t)r->left;
  size_t n = want ? fread(buf, 1, want, r->in) : 0;
  if (n < want && ferror(r->in)) return CURL_READFUNC_ABORT;
  r->left -= n;
  return n;
}

/* Keeps the ETag response header (quotes and all, as S3 wants it back) in the char[] given. */
static size_t etag_header(char *line, size_t size, size_t nitems, void *arg) {
  size_t n = size * nitems;
  char *etag = arg;
  if (n > 5 && !strncasecmp(line, "ETag:", 5)) {
    const char *v = line + 5;
    size_t len = n - 5;
    while (len && (*v == ' ' || *v == '\t')) v++, len--;
    while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' ')) len--;
    if (len && len <= DIRECT_ETAG_MAX) snprintf(etag, DIRECT_ETAG_MAX + 1, "%.*s", (int)len, v);
  }
  return n;
}

/* PUTs len bytes of path from offset to a presigned URL with the signed headers of its action
 * (url, headers). A 412 (the object is there already: If-None-Match) counts as landed (*sent 0).
 * etag (DIRECT_ETAG_MAX + 1 chars, or NULL) gets the answer's ETag. Returns 0 or -1 with err. */
static int direct_put(const json_t *action, const char *path, uint64_t offset, uint64_t len,
                      char *etag, uint64_t *sent, br_err *err) {
  const char *url = json_string_value(json_object_get(action, "url"));
  json_t *headers = json_object_get(action, "headers");
  FILE *in = fopen(path, "rb");
  CURL *c = curl_easy_init();
  struct curl_slist *hl = curl_slist_append(NULL, "Expect:");
  int rc = -1;
  long status = 0;
  if (!url || !json_is_object(headers)) {
    br_fail(err, "negotiation answer lacks url/headers");
    goto done;
  }
  if (!in || !c || !hl) {
    br_fail(err, "cannot open: %s", in ? "out of memory" : strerror(errno));
    goto done;
  }
  if (fseeko(in, (off_t)offset, SEEK_SET) != 0) {
    br_fail(err, "cannot seek: %s", strerror(errno));
    goto done;
  }
  const char *name;
  json_t *v;
  json_object_foreach(headers, name, v) {
    char line[256];
    snprintf(line, sizeof line, "%s: %s", name, json_string_value(v) ? json_string_value(v) : "");
    hl = curl_slist_append(hl, line);
  }
  br_http_buf body = {.max = 4096};
  part_reader rd = {.in = in, .left = len};
  if (etag) etag[0] = '\0';
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
  curl_easy_setopt(c, CURLOPT_READFUNCTION, part_read);
  curl_easy_setopt(c, CURLOPT_READDATA, &rd);
  curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)len);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, br_http_buf_write);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  if (etag) {
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, etag_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, etag);
  }
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  CURLcode cc = curl_easy_perform(c);
  if (cc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (cc != CURLE_OK) {
    br_fail(err, "PUT to the store: %s", curl_easy_strerror(cc));
  } else if (is_2xx(status) || (status == 412 && !etag)) {
    curl_off_t up = 0;
    curl_easy_getinfo(c, CURLINFO_SIZE_UPLOAD_T, &up);
    *sent = status == 412 ? 0 : (uint64_t)up;
    rc = 0;
    if (etag && !etag[0]) rc = br_fail(err, "PUT of a part to the store: no ETag in the answer");
  } else {
    br_fail(err, "PUT to the store: HTTP %ld %.200s", status, body.data ? body.data : "");
  }
  br_http_buf_free(&body);
done:
  curl_slist_free_all(hl);
  if (c) curl_easy_cleanup(c);
  if (in) fclose(in);
  return rc;
}

/* PUTs every part of the multipart plan of it, in order, keeping their ETags in it->etags.
 * Returns 0 or -1 with err. */
static int direct_put_parts(direct_item *it, br_err *err) {
  json_t *parts = json_object_get(it->action, "parts");
  json_int_t ps = json_integer_value(json_object_get(it->action, "part_size"));
  size_t n = json_array_size(parts);
  if (ps <= 0 || n == 0 || n != ((it->size + (uint64_t)ps - 1) / (uint64_t)ps))
    return br_fail(err, "multipart plan does not cover the file");
  it->etags = json_array();
  for (size_t k = 0; k < n; k++) {
    json_t *p = json_array_get(parts, k);
    uint64_t off = (uint64_t)ps * k,
             len = it->size - off < (uint64_t)ps ? it->size - off : (uint64_t)ps;
    char etag[DIRECT_ETAG_MAX + 1];
    uint64_t sent = 0;
    if (json_integer_value(json_object_get(p, "part_number")) != (json_int_t)k + 1)
      return br_fail(err, "multipart plan: parts out of order");
    if (direct_put(p, it->path, off, len, etag, &sent, err) != 0) return -1;
    json_array_append_new(it->etags, json_string(etag));
    it->sent += sent;
  }
  return 0;
}

static void *direct_worker(void *arg) {
  direct_run *r = arg;
  for (;;) {
    size_t i = atomic_fetch_add(&r->next, 1);
    if (i >= r->n) return NULL;
    direct_item *it = &r->items[i];
    const char *status = json_string_value(json_object_get(it->action, "status"));
    br_err err = {{0}};
    if (status && !strcmp(status, "present")) {
      it->ok = 1;
    } else if (status && (!strcmp(status, "upload") || !strcmp(status, "multipart"))) {
      it->ok = !strcmp(status, "upload")
                   ? direct_put(it->action, it->path, 0, it->size, NULL, &it->sent, &err) == 0
                   : direct_put_parts(it, &err) == 0;
      if (!it->ok) {
        char what[300];
        snprintf(what, sizeof what, "put %.250s", it->path);
        print_error(what, err.msg);
      }
    } else { /* via_server, or a plan this client does not follow */
      put_result res;
      it->via_server = 1;
      it->ok = put_one(r->g, r->o, it->path, &res) == 0 && res.ok;
      it->sent = res.sent > 0 ? (uint64_t)res.sent : 0;
      pthread_mutex_lock(&r->lock);
      if (it->ok) *(res.dedup ? &r->present : &r->uploaded) += 1;
      pthread_mutex_unlock(&r->lock);
    }
  }
}

/* One batch: hash, negotiate, upload jobs at a time, commit, print "HEX  PATH" per blob. */
static int direct_batch(direct_run *r, int jobs, uint64_t *bytes, uint64_t *sent) {
  br_err err = {{0}};
  long status = 0;
  json_t *req = json_array(), *reply = NULL, *creply = NULL, *cblobs = json_array();
  int rc = -1;
  for (size_t i = 0; i < r->n; i++) {
    direct_item *it = &r->items[i];
    FILE *in = fopen(it->path, "rb");
    struct stat st;
    if (!in || fstat(fileno(in), &st) != 0) {
      br_fail(&err, "cannot open %s: %s", it->path, strerror(errno));
      if (in) fclose(in);
      goto fail;
    }
    /* one pass: the whole file's hash and, over DIRECT_MIN_PART, its parts' */
    it->part_size = direct_part_size((uint64_t)st.st_size);
    int hr = it->part_size
                 ? sha256_file_parts(in, it->part_size, it->hex, &it->size, &it->part_sha256, &err)
                 : sha256_file(in, it->hex, &it->size, &err);
    fclose(in);
    if (hr != 0) goto fail;
    it->type = r->o->type ? r->o->type : br_content_type_for_name(it->path);
    if (!it->type) it->type = "application/octet-stream";
    json_t *one = json_pack("{s:s,s:I,s:s}", "sha256", it->hex, "size", (json_int_t)it->size,
                            "content_type", it->type);
    if (it->part_size && it->size > DIRECT_MIN_PART &&
        json_array_size(it->part_sha256) == (it->size + it->part_size - 1) / it->part_size) {
      json_object_set_new(one, "part_size", json_integer((json_int_t)it->part_size));
      json_object_set(one, "part_sha256", it->part_sha256);
    }
    json_array_append_new(req, one);
  }
  json_t *body = json_pack("{s:O}", "blobs", req);
  int jr =
      br_http_json(r->g->server, r->g->token, "POST", "/v1/uploads", body, &status, &reply, &err);
  json_decref(body);
  if (jr != 0) goto fail;
  json_t *acts = json_object_get(reply, "blobs");
  if (json_array_size(acts) != r->n) {
    br_fail(&err, "POST /v1/uploads: %zu answers for %zu blobs", json_array_size(acts), r->n);
    goto fail;
  }
  for (size_t i = 0; i < r->n; i++) r->items[i].action = json_array_get(acts, i);
  atomic_init(&r->next, 0);
  pthread_t threads[PUT_JOBS_MAX];
  int started = 0;
  if ((size_t)jobs > r->n) jobs = (int)r->n;
  for (; started < jobs; started++)
    if (pthread_create(&threads[started], NULL, direct_worker, r) != 0) break;
  if (started == 0) direct_worker(r);
  for (int t = 0; t < started; t++) pthread_join(threads[t], NULL);
  for (size_t i = 0; i < r->n; i++) {
    direct_item *it = &r->items[i];
    *sent += it->sent;
    if (!it->ok) r->failed++;
    if (it->ok) *bytes += it->size;
    if (it->ok && !it->via_server) {
      json_t *one = json_pack("{s:s,s:I,s:s}", "sha256", it->hex, "size", (json_int_t)it->size,
                              "content_type", it->type);
      if (it->etags) {
        json_object_set(one, "upload_id", json_object_get(it->action, "upload_id"));
        json_object_set(one, "parts", it->etags);
      }
      json_array_append_new(cblobs, one);
    }
  }
  rc = 0;
  if (json_array_size(cblobs)) {
    body = json_pack("{s:O}", "blobs", cblobs);
    jr = br_http_json(r->g->server, r->g->token, "POST", "/v1/uploads/commit", body, &status,
                      &creply, &err);
    json_decref(body);
    if (jr != 0) goto fail;
    json_t *res = json_object_get(creply, "blobs");
    size_t k = 0;
    for (size_t i = 0; i < r->n; i++) {
      direct_item *it = &r->items[i];
      if (!it->ok || it->via_server) continue;
      json_t *one = json_array_get(res, k++);
      const char *st = json_string_value(json_object_get(one, "status"));
      if (st && !strcmp(st, "created")) {
        r->uploaded++;
      } else if (st && !strcmp(st, "present")) {
        r->present++;
      } else {
        char what[300];
        snprintf(what, sizeof what, "put %.250s", it->path);
        const char *m = json_string_value(json_object_get(one, "message"));
        print_error(what, m ? m : st ? st : "no commit answer");
        r->failed++;
        *bytes -= it->size;
        continue;
      }
      printf("%s  %s\n", it->hex, it->path);
    }
  }
  goto done;
fail:
  print_error("put --direct", err.msg);
  r->failed += r->n;
done:
  fflush(stdout);
  for (size_t i = 0; i < r->n; i++) {
    json_decref(r->items[i].part_sha256);
    json_decref(r->items[i].etags);
  }
  json_decref(req);
  json_decref(cblobs);
  json_decref(reply);
  json_decref(creply);
  return rc;
}

/* put --direct of every path of list, DIRECT_BATCH at a time; prints the summary. */
static int put_many_direct(const cli_globals *g, const put_opts *o, const put_list *list,
                           int jobs) {
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    fprintf(stderr, "blobref: put: libcurl did not start\n");
    return 1;
  }
  direct_item *items = calloc(DIRECT_BATCH, sizeof *items);
  if (!items) {
    fprintf(stderr, "blobref: put: out of memory\n");
    return 1;
  }
  direct_run r = {.g = g, .o = o, .items = items};
  pthread_mutex_init(&r.lock, NULL);
  uint64_t bytes = 0, sent = 0;
  for (size_t first = 0; first < list->n; first += r.n) {
    /* at most DIRECT_BATCH files and DIRECT_HASHES_MAX part hashes (from their sizes now) */
    size_t hashes = 0;
    memset(items, 0, DIRECT_BATCH * sizeof *items);
    for (r.n = 0; r.n < DIRECT_BATCH && first + r.n < list->n; r.n++) {
      struct stat st;
      uint64_t size = stat(list->paths[first + r.n], &st) == 0 ? (uint64_t)st.st_size : 0;
      uint64_t ps = direct_part_size(size), nparts = ps ? (size + ps - 1) / ps : 0;
      if (r.n > 0 && hashes + nparts > DIRECT_HASHES_MAX) break;
      hashes += nparts;
      items[r.n].path = list->paths[first + r.n];
    }
    direct_batch(&r, jobs, &bytes, &sent);
  }
  pthread_mutex_destroy(&r.lock);
  free(items);
  fprintf(stderr,
          "blobref put: %zu file%s: %zu uploaded, %zu already present, %zu failed; %" PRIu64
          " bytes, %" PRIu64 " sent\n",
          list->n, list->n == 1 ? "" : "s", r.uploaded, r.present, r.failed, bytes, sent);
  return r.failed || list->failed ? 1 : 0;
}

int cmd_put(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {
      {"type", required_argument, NULL, 't'}, {"sha256", required_argument, NULL, 's'},
      {"recursive", no_argument, NULL, 'r'},  {"jobs", required_argument, NULL, 'j'},
      {"verbose", no_argument, NULL, 'v'},    {"direct", no_argument, NULL, 'd'},
      {"help", no_argument, NULL, 'h'},       {NULL, 0, NULL, 0}};
  put_opts o = {0};
  int opt, recursive = 0, jobs = 4, direct = 0;
  char *end;

  getopt_reset();
  while ((opt = getopt_long(argc, argv, "rvh", longopts, NULL)) != -1) {
    switch (opt) {
      case 't':
        if (br_cli_content_type_check(optarg) != 0)
          return br_cli_usage_error("put", "--type must be 1 to %d printable ASCII characters",
                                    BR_CLI_CONTENT_TYPE_MAX);
        o.type = optarg;
        break;
      case 's':
        if (br_cli_hash_parse(optarg, o.hex) != 0)
          return br_cli_usage_error("put", "--sha256: '%.80s' is not a SHA-256 (64 hex digits)",
                                    optarg);
        break;
      case 'r':
        recursive = 1;
        break;
      case 'j': {
        long n = strtol(optarg, &end, 10);
        if (*optarg == '\0' || *end != '\0' || n < 1 || n > PUT_JOBS_MAX)
          return br_cli_usage_error("put", "--jobs must be 1 to %d", PUT_JOBS_MAX);
        jobs = (int)n;
        break;
      }
      case 'v':
        o.verbose = 1;
        break;
      case 'd':
        direct = 1;
        break;
      case 'h':
        fputs(put_help, stdout);
        return 0;
      default:
        return br_cli_bad_option("put", argv, longopts);
    }
  }
  int nargs = argc - optind;
  if (nargs < 1) return br_cli_usage_error("put", "expected a FILE, '-', or FILE|DIR...");
  if (nargs == 1 && !recursive && !direct) {
    put_result r;
    return put_one(g, &o, argv[optind], &r);
  }
  if (o.hex[0]) return br_cli_usage_error("put", "--sha256 takes exactly one FILE or '-'");
  put_list list = {0};
  int rc = 1;
  for (int i = optind; i < argc; i++) {
    struct stat st;
    if (!strcmp(argv[i], "-")) {
      rc = br_cli_usage_error("put", "'-' (standard input) cannot be one of several files");
      goto done;
    }
    if (recursive && stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
      if (put_walk(&list, argv[i], 0) < 0) goto oom;
    } else if (put_list_add(&list, argv[i]) < 0) {
      goto oom;
    }
  }
  o.labelled = 1;
  if (!list.n)
    rc = (fprintf(stderr, "blobref put: no files\n"), 1);
  else
    rc = direct ? put_many_direct(g, &o, &list, jobs) : put_many(g, &o, &list, jobs);
  goto done;
oom:
  fprintf(stderr, "blobref: put: out of memory (or more than %u files)\n", PUT_FILES_MAX);
done:
  for (size_t i = 0; i < list.n; i++) free(list.paths[i]);
  free(list.paths);
  return rc;
}

/* ---- get ---- */

static const char get_help[] =
    "usage: blobref get [--range SPEC] [--preview] [-o FILE] HASH\n"
    "\n"
    "Downloads blob HASH (64 hex digits or sha256:HEX) to standard output or FILE,\n"
    "following a redirect to the store. A full download is checked against HASH and\n"
    "fails when its SHA-256 differs. With -o, the bytes go to a temporary file next\n"
    "to FILE that is renamed over FILE only when the download succeeded (on standard\n"
    "output, a failed check is reported after the bytes were written).\n"
    "\n"
    "  --range SPEC   send 'Range: bytes=SPEC' (e.g. 0-99, 100-, -500, 0-9,20-29)\n"
    "  -o FILE        write to FILE instead of standard output\n"
    "  --preview      an admin's look at a held or quarantined blob (GET\n"
    "                 /v1/blobs/HASH/preview: any state but deleting; an admin token)\n"
    "  -h, --help     this help\n"
    "\n"
    "Exit status: 0 downloaded, 1 error (the server's error code is printed), 2 usage.\n";

typedef struct get_sink {
  CURL *curl;
  FILE *out;
  EVP_MD_CTX *md;
  br_http_buf err_body; /* body of a non-2xx reply, truncated to its max */
  uint64_t bytes;
  int write_errno; /* set when writing the output failed */
} get_sink;

static size_t get_write(char *ptr, size_t size, size_t nmemb, void *userdata) {
  get_sink *s = userdata;
  size_t n = size * nmemb;
  long status = 0;
  curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
  if (!is_2xx(status)) {
    size_t room = s->err_body.max - s->err_body.len;
    if (room > 0) br_http_buf_append(&s->err_body, ptr, n < room ? n : room);
    return n;
  }
  if (fwrite(ptr, 1, n, s->out) != n) {
    s->write_errno = errno ? errno : EIO;
    return 0;
  }
  EVP_DigestUpdate(s->md, ptr, n);
  s->bytes += n;
  return n;
}

int cmd_get(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {{"range", required_argument, NULL, 'r'},
                                           {"output", required_argument, NULL, 'o'},
                                           {"preview", no_argument, NULL, 'p'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  const char *range = NULL, *outpath = NULL;
  char hex[BR_HEX_LEN + 1], what[128], path[128], tmp[4200] = "";
  int opt, rc = 1, req_ready = 0, preview = 0;
  br_err err = {{0}};
  br_http_req req;
  get_sink sink = {.err_body = {.max = BR_HTTP_ERROR_BODY_MAX}};
  long status = 0;

  getopt_reset();
  while ((opt = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
    switch (opt) {
      case 'r':
        if (br_cli_range_check(optarg, &range, &err) != 0)
          return br_cli_usage_error("get", "--range '%.80s': %s", optarg, err.msg);
        break;
      case 'o':
        if (!*optarg) return br_cli_usage_error("get", "-o needs a file name");
        outpath = optarg;
        break;
      case 'p':
        preview = 1;
        break;
      case 'h':
        fputs(get_help, stdout);
        return 0;
      default:
        return br_cli_bad_option("get", argv, longopts);
    }
  }
  if (argc - optind != 1) return br_cli_usage_error("get", "expected exactly one HASH");
  if (br_cli_hash_parse(argv[optind], hex) != 0)
    return br_cli_usage_error("get", "'%.80s' is not a SHA-256 (64 hex digits or sha256:HEX)",
                              argv[optind]);
  snprintf(what, sizeof what, "get %s", hex);
  snprintf(path, sizeof path, "/v1/blobs/%s%s", hex, preview ? "/preview" : "");

  if (br_http_req_init(&req, g->server, g->token, path, &err) != 0) goto fail;
  req_ready = 1;
  sink.curl = req.curl;
  sink.md = EVP_MD_CTX_new();
  if (!sink.md || EVP_DigestInit_ex(sink.md, EVP_sha256(), NULL) != 1) {
    br_fail(&err, "out of memory");
    goto fail;
  }
  if (outpath) {
    sink.out = br_cli_open_temp_next_to(outpath, tmp, sizeof tmp, &err);
    if (!sink.out) goto fail;
  } else {
    sink.out = stdout;
  }
  if (range) {
    char hdr[BR_CLI_RANGE_SPEC_MAX + 32];
    snprintf(hdr, sizeof hdr, "Range: bytes=%s", range);
    if (br_http_req_header(&req, hdr, &err) != 0) goto fail;
  }
  curl_easy_setopt(req.curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(req.curl, CURLOPT_WRITEFUNCTION, get_write);
  curl_easy_setopt(req.curl, CURLOPT_WRITEDATA, &sink);
  errno = 0;
  if (br_http_req_perform(&req, &status, &err) != 0) {
    if (sink.write_errno)
      br_fail(&err, "cannot write %s: %s", outpath ? outpath : "standard output",
              strerror(sink.write_errno));
    goto fail;
  }
  if (!is_2xx(status)) {
    print_reply_error(what, status, &sink.err_body);
    goto done;
  }
  if (status == 200) { /* the whole blob (also when a Range was ignored): check it */
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int dlen = 0;
    char got[BR_HEX_LEN + 1];
    if (EVP_DigestFinal_ex(sink.md, digest, &dlen) != 1 || dlen != BR_SHA256_LEN) {
      br_fail(&err, "SHA-256 failed");
      goto fail;
    }
    br_hex_encode(digest, got);
    if (strcmp(got, hex) != 0) {
      br_fail(&err, "downloaded %llu bytes with SHA-256 %s, not the requested hash",
              (unsigned long long)sink.bytes, got);
      goto fail;
    }
  }
  if (fflush(sink.out) != 0 || (outpath && fsync(fileno(sink.out)) != 0)) {
    br_fail(&err, "cannot write %s: %s", outpath ? outpath : "standard output", strerror(errno));
    goto fail;
  }
  if (outpath) {
    FILE *f = sink.out;
    sink.out = NULL;
    if (fclose(f) != 0) {
      br_fail(&err, "cannot write %s: %s", outpath, strerror(errno));
      goto fail;
    }
    if (rename(tmp, outpath) != 0) {
      br_fail(&err, "cannot rename %s to %s: %s", tmp, outpath, strerror(errno));
      goto fail;
    }
    tmp[0] = '\0';
  }
  rc = 0;
  goto done;
fail:
  print_error(what, err.msg);
done:
  if (outpath && sink.out) fclose(sink.out);
  if (tmp[0]) unlink(tmp); /* a failed download leaves nothing behind */
  EVP_MD_CTX_free(sink.md);
  br_http_buf_free(&sink.err_body);
  if (req_ready) br_http_req_free(&req);
  return rc;
}

/* ---- stat ---- */

static const char stat_help[] =
    "usage: blobref stat HASH\n"
    "\n"
    "Prints the record of blob HASH (GET /v1/blobs/HASH/meta) as indented JSON:\n"
    "sha256, size, content_type, created_at, last_upload_at, state, locations.\n"
    "\n"
    "Exit status: 0 printed, 1 error (e.g. not_found), 2 usage error.\n";

int cmd_stat(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
  char hex[BR_HEX_LEN + 1], what[128], path[128];
  json_t *root = NULL;
  int opt, rc;

  getopt_reset();
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (opt) {
      case 'h':
        fputs(stat_help, stdout);
        return 0;
      default:
        return br_cli_bad_option("stat", argv, longopts);
    }
  }
  if (argc - optind != 1) return br_cli_usage_error("stat", "expected exactly one HASH");
  if (br_cli_hash_parse(argv[optind], hex) != 0)
    return br_cli_usage_error("stat", "'%.80s' is not a SHA-256 (64 hex digits or sha256:HEX)",
                              argv[optind]);
  snprintf(what, sizeof what, "stat %s", hex);
  snprintf(path, sizeof path, "/v1/blobs/%s/meta", hex);
  long status = 0;
  br_err err = {{0}};
  rc = br_http_json(g->server, g->token, "GET", path, NULL, &status, &root, &err);
  if (rc != 0) {
    print_error(what, err.msg);
    rc = 1;
  } else {
    if (json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0 ||
        fputc('\n', stdout) == EOF || fflush(stdout) != 0) {
      print_error(what, "cannot write to standard output");
      rc = 1;
    }
  }
  json_decref(root);
  return rc;
}

/* ---- lookup ---- */

static const char lookup_help[] =
    "usage: blobref lookup HASH...\n"
    "       blobref lookup -        (one hash per line on standard input)\n"
    "\n"
    "Asks the server which blobs exist (POST /v1/lookup, 10000 hashes per request)\n"
    "and prints one line per input hash, in input order:\n"
    "  found HEX SIZE\n"
    "  missing HEX\n"
    "Hashes are 64 hex digits or sha256:HEX; blank input lines are skipped.\n"
    "\n"
    "Exit status: 0 all found, 1 at least one missing, 2 usage error or invalid hash\n"
    "(for standard input, batches before the bad line are already printed),\n"
    "3 server or network error.\n";

typedef struct found_entry {
  const char *hex; /* borrowed from the reply JSON */
  json_int_t size;
} found_entry;

static int found_cmp(const void *a, const void *b) {
  return strcmp(((const found_entry *)a)->hex, ((const found_entry *)b)->hex);
}

static int str_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Looks up n canonical hashes in one request and prints the lines. Returns 0 all found,
 * EXIT_LOOKUP_MISSING some missing, EXIT_LOOKUP_ERROR after printing an error. */
static int lookup_batch(const cli_globals *g, char (*hashes)[BR_HEX_LEN + 1], size_t n) {
  int rc = EXIT_LOOKUP_ERROR, any_missing = 0;
  br_err err = {{0}};
  json_t *reqjson = NULL, *root = NULL;
  found_entry *found = NULL;
  const char **missing = NULL;
  long status = 0;
  const char *what = "lookup";

  json_t *arr = json_array();
  reqjson = json_object();
  if (!arr || !reqjson || json_object_set_new(reqjson, "hashes", arr) != 0) goto oom;
  for (size_t i = 0; i < n; i++)
    if (json_array_append_new(arr, json_string(hashes[i])) != 0) goto oom;
  if (br_http_json(g->server, g->token, "POST", "/v1/lookup", reqjson, &status, &root, &err) != 0)
    goto fail;
  json_t *jf = json_object_get(root, "found"), *jm = json_object_get(root, "missing");
  if (!json_is_array(jf) || !json_is_array(jm)) {
    br_fail(&err, "server reply lacks the found/missing arrays");
    goto fail;
  }
  size_t nf = json_array_size(jf), nm = json_array_size(jm);
  found = calloc(nf ? nf : 1, sizeof *found);
  missing = calloc(nm ? nm : 1, sizeof *missing);
  if (!found || !missing) goto oom;
  for (size_t i = 0; i < nf; i++) {
    json_t *e = json_array_get(jf, i), *sz = json_object_get(e, "size");
    found[i].hex = json_string_value(json_object_get(e, "sha256"));
    if (!found[i].hex || !json_is_integer(sz)) {
      br_fail(&err, "server reply: found[%zu] lacks sha256/size", i);
      goto fail;
    }
    found[i].size = json_integer_value(sz);
  }
  for (size_t i = 0; i < nm; i++) {
    missing[i] = json_string_value(json_array_get(jm, i));
    if (!missing[i]) {
      br_fail(&err, "server reply: missing[%zu] is not a string", i);
      goto fail;
    }
  }
  qsort(found, nf, sizeof *found, found_cmp);
  qsort(missing, nm, sizeof *missing, str_cmp);
  for (size_t i = 0; i < n; i++) {
    found_entry key = {.hex = hashes[i]};
    const char *mkey = hashes[i];
    const found_entry *f = nf ? bsearch(&key, found, nf, sizeof *found, found_cmp) : NULL;
    if (f) {
      if (g->json)
        printf("{\"sha256\":\"%s\",\"found\":true,\"size\":%" JSON_INTEGER_FORMAT "}\n", hashes[i],
               f->size);
      else
        printf("found %s %" JSON_INTEGER_FORMAT "\n", hashes[i], f->size);
    } else if (nm && bsearch(&mkey, missing, nm, sizeof *missing, str_cmp)) {
      if (g->json)
        printf("{\"sha256\":\"%s\",\"found\":false}\n", hashes[i]);
      else
        printf("missing %s\n", hashes[i]);
      any_missing = 1;
    } else {
      br_fail(&err, "server reply does not mention %s", hashes[i]);
      goto fail;
    }
  }
  rc = any_missing ? EXIT_LOOKUP_MISSING : 0;
  goto done;
oom:
  br_fail(&err, "out of memory");
fail:
  print_error(what, err.msg);
done:
  free(found);
  free(missing);
  json_decref(reqjson);
  json_decref(root);
  return rc;
}

/* Folds one batch result into the overall exit status (errors win over missing). */
static int lookup_merge(int overall, int batch) { return batch > overall ? batch : overall; }

/* Reads hashes from stdin, one per line, and looks them up batch by batch. */
static int lookup_stdin(const cli_globals *g, char (*batch)[BR_HEX_LEN + 1]) {
  int rc = 0;
  char line[LOOKUP_LINE_MAX + 2];
  size_t n = 0;
  unsigned long lineno = 0;
  while (fgets(line, sizeof line, stdin)) {
    lineno++;
    size_t len = strlen(line);
    if (len == sizeof line - 1 && line[len - 1] != '\n') {
      fprintf(stderr, "blobref: lookup: line %lu: longer than %d characters\n", lineno,
              LOOKUP_LINE_MAX);
      return EXIT_USAGE;
    }
    char *s = line;
    while (len > 0 &&
           (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' ' || s[len - 1] == '\t'))
      s[--len] = '\0';
    while (*s == ' ' || *s == '\t') s++;
    if (!*s) continue;
    if (br_cli_hash_parse(s, batch[n]) != 0) {
      fprintf(stderr, "blobref: lookup: line %lu: '%.80s' is not a SHA-256 (64 hex digits)\n",
              lineno, s);
      return EXIT_USAGE;
    }
    if (++n == LOOKUP_BATCH) {
      rc = lookup_merge(rc, lookup_batch(g, batch, n));
      n = 0;
      if (rc == EXIT_LOOKUP_ERROR) return rc;
    }
  }
  if (ferror(stdin)) {
    fprintf(stderr, "blobref: lookup: cannot read standard input: %s\n", strerror(errno));
    return EXIT_LOOKUP_ERROR;
  }
  if (n > 0) rc = lookup_merge(rc, lookup_batch(g, batch, n));
  return rc;
}

int cmd_lookup(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
  int opt, rc = 0;
  char(*batch)[BR_HEX_LEN + 1] = NULL;

  getopt_reset();
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (opt) {
      case 'h':
        fputs(lookup_help, stdout);
        return 0;
      default:
        return br_cli_bad_option("lookup", argv, longopts);
    }
  }
  int nargs = argc - optind;
  int from_stdin = nargs == 1 && strcmp(argv[optind], "-") == 0;
  if (nargs == 0) return br_cli_usage_error("lookup", "expected HASH... or '-'");
  /* Every argument is checked before any request. */
  for (int i = optind; !from_stdin && i < argc; i++) {
    char hex[BR_HEX_LEN + 1];
    if (strcmp(argv[i], "-") == 0)
      return br_cli_usage_error("lookup", "'-' (standard input) cannot be mixed with hashes");
    if (br_cli_hash_parse(argv[i], hex) != 0)
      return br_cli_usage_error("lookup", "'%.80s' is not a SHA-256 (64 hex digits or sha256:HEX)",
                                argv[i]);
  }
  batch = malloc(LOOKUP_BATCH * sizeof *batch);
  if (!batch) {
    print_error("lookup", "out of memory");
    return EXIT_LOOKUP_ERROR;
  }
  if (from_stdin) {
    rc = lookup_stdin(g, batch);
  } else {
    size_t n = 0;
    for (int i = optind; i < argc && rc != EXIT_LOOKUP_ERROR; i++) {
      br_cli_hash_parse(argv[i], batch[n]);
      if (++n == LOOKUP_BATCH || i == argc - 1) {
        rc = lookup_merge(rc, lookup_batch(g, batch, n));
        n = 0;
      }
    }
  }
  if (fflush(stdout) != 0) {
    print_error("lookup", "cannot write to standard output");
    rc = EXIT_LOOKUP_ERROR;
  }
  free(batch);
  return rc;
}
