/* The benchmark's fourth column: libmicrohttpd with a trivial handler, configured like blobrefd
 * (epoll thread pool, same connection memory), answering blobref's URLs with blobref's headers
 * from memory, so that every ratio can be read against what the library itself allows.
 *
 * usage: mhd_ceiling PORT FILES_DIR REDIRECT_BASE
 *   GET/HEAD /v1/blobs/{hex}   200 with the blob's bytes (all loaded from FILES_DIR/sha256/aa/bb/
 *                              {hex} at start), ETag, Cache-Control, Accept-Ranges, Repr-Digest,
 *                              Content-Type, X-Request-Id; a Range header gives 206 of one range
 *   GET /r/{hex}               307 to REDIRECT_BASE/sha256/aa/bb/{hex}, Cache-Control private
 * Responses are built per request, as a plain handler would; no caching of response objects. */
#include <dirent.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEX_LEN 64

struct blob {
  char hex[HEX_LEN + 1];
  char etag[HEX_LEN + 3];
  char repr[64];
  char *data;
  size_t size;
};

static struct blob *blobs;
static size_t nblobs, capblobs;
static const char *redirect_base;

static void load_file(const char *path, const char *name) {
  if (strlen(name) != HEX_LEN) return;
  FILE *f = fopen(path, "rb");
  if (!f) return;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *d = malloc(n > 0 ? (size_t)n : 1);
  if (!d || fread(d, 1, (size_t)n, f) != (size_t)n) {
    free(d);
    fclose(f);
    return;
  }
  fclose(f);
  if (nblobs == capblobs) {
    capblobs = capblobs ? 2 * capblobs : 1024;
    blobs = realloc(blobs, capblobs * sizeof *blobs);
    if (!blobs) abort();
  }
  struct blob *b = &blobs[nblobs++];
  memcpy(b->hex, name, HEX_LEN + 1);
  snprintf(b->etag, sizeof b->etag, "\"%s\"", name);
  unsigned char raw[32], b64[48];
  for (int i = 0; i < 32; i++) sscanf(name + 2 * i, "%2hhx", &raw[i]);
  EVP_EncodeBlock(b64, raw, 32);
  snprintf(b->repr, sizeof b->repr, "sha-256=:%s:", b64);
  b->data = d;
  b->size = (size_t)n;
}

/* Loads every DIR/sha256/aa/bb/{hex}. */
static void load_tree(const char *dir, int depth) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (depth < 3)
      load_tree(p, depth + 1);
    else
      load_file(p, e->d_name);
  }
  closedir(d);
}

static int by_hex(const void *a, const void *b) {
  return strcmp(((const struct blob *)a)->hex, ((const struct blob *)b)->hex);
}

static const struct blob *find(const char *hex) {
  struct blob key;
  if (strlen(hex) != HEX_LEN) return NULL;
  memcpy(key.hex, hex, HEX_LEN + 1);
  return bsearch(&key, blobs, nblobs, sizeof *blobs, by_hex);
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **ctx) {
  (void)cls, (void)method, (void)version, (void)upload; /* HEAD: libmicrohttpd drops the body */
  static int first;
  if (!*ctx) { /* queue on the second call, as blobrefd does (a first-call answer closes) */
    *ctx = &first;
    return MHD_YES;
  }
  if (*upload_size) {
    *upload_size = 0;
    return MHD_YES;
  }
  static unsigned long long id;
  char rid[24];
  snprintf(rid, sizeof rid, "%016llx", __atomic_fetch_add(&id, 1, __ATOMIC_RELAXED));
  struct MHD_Response *r;
  unsigned status;
  if (!strncmp(url, "/r/", 3) && find(url + 3)) {
    char loc[512];
    const char *h = url + 3;
    snprintf(loc, sizeof loc, "%s/sha256/%.2s/%.2s/%s", redirect_base, h, h + 2, h);
    r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, loc);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "private, max-age=3600");
    status = MHD_HTTP_TEMPORARY_REDIRECT;
  } else {
    const struct blob *b = !strncmp(url, "/v1/blobs/", 10) ? find(url + 10) : NULL;
    if (!b) {
      r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
      MHD_add_response_header(r, "X-Request-Id", rid);
      enum MHD_Result q = MHD_queue_response(c, MHD_HTTP_NOT_FOUND, r);
      MHD_destroy_response(r);
      return q;
    }
    uint64_t first = 0, len = b->size;
    status = MHD_HTTP_OK;
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_RANGE);
    unsigned long long a, z;
    if (range && sscanf(range, "bytes=%llu-%llu", &a, &z) == 2 && a <= z && z < b->size) {
      first = a, len = z - a + 1;
      status = MHD_HTTP_PARTIAL_CONTENT;
    }
    r = MHD_create_response_from_buffer((size_t)len, b->data + first, MHD_RESPMEM_PERSISTENT);
    char cr[80];
    MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, b->etag);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL,
                            "public, max-age=31536000, immutable");
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
    MHD_add_response_header(r, "Repr-Digest", b->repr);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    if (status == MHD_HTTP_PARTIAL_CONTENT) {
      snprintf(cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%zu", first, first + len - 1, b->size);
      MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
    }
  }
  MHD_add_response_header(r, "X-Request-Id", rid);
  enum MHD_Result q = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return q;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s PORT FILES_DIR REDIRECT_BASE\n", argv[0]);
    return 2;
  }
  char top[4096];
  snprintf(top, sizeof top, "%s/sha256", argv[2]);
  load_tree(top, 1);
  qsort(blobs, nblobs, sizeof *blobs, by_hex);
  redirect_base = argv[3];
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_TURBO, (uint16_t)atoi(argv[1]),
      NULL, NULL, answer, NULL, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(cores > 0 ? cores : 1),
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)32768, MHD_OPTION_CONNECTION_TIMEOUT, 60u,
      MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u, MHD_OPTION_END);
  if (!d) {
    fprintf(stderr, "mhd_ceiling: cannot listen on %s\n", argv[1]);
    return 1;
  }
  fprintf(stderr, "mhd_ceiling: %zu blobs, port %s\n", nblobs, argv[1]);
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  sigprocmask(SIG_BLOCK, &s, NULL);
  int sig;
  sigwait(&s, &sig);
  MHD_stop_daemon(d);
  return 0;
}
