/* The benchmark's fourth column: libmicrohttpd with a trivial handler, configured like blobrefd
 * (epoll thread pool, same connection memory), answering blobref's URLs with blobref's headers
 * from memory, so that every ratio can be read against what the library itself allows.
 *
 * usage: mhd_ceiling PORT FILES_DIR REDIRECT_BASE [UP_DIR]
 *   GET/HEAD /v1/blobs/{hex}   200 with the blob's bytes (all loaded from FILES_DIR/sha256/aa/bb/
 *                              {hex} at start), ETag, Cache-Control, Accept-Ranges, Repr-Digest,
 *                              Content-Type, X-Request-Id; a Range header gives 206 of one range
 *   GET /r/{hex}               307 to REDIRECT_BASE/sha256/aa/bb/{hex}, Cache-Control private
 *   PUT /v1/blobs/{anything}   (with UP_DIR) the least a durable content-addressed upload does:
 *                              the body hashed (SHA-256) and written to UP_DIR/tmp/N as it
 *                              arrives, then on a thread of its own (the connection suspended)
 *                              fsync, rename to UP_DIR/sha256/aa/bb/{hex}, directory fsync; 201
 * Responses are built per request, as a plain handler would; no caching of response objects. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
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

/* ---- PUT: an upload's state, from its first body byte to its answer ---- */

static const char *up_dir; /* NULL: no PUT */
static int begun;          /* a request's context after its first call (&up_dir: a PUT's) */

struct upload {
  struct MHD_Connection *conn;
  EVP_MD_CTX *sha;
  int fd;
  int ok;   /* every write so far succeeded */
  int done; /* the commit thread finished (ok says how) */
  char tmp[4096];
};

static void *commit_thread(void *arg) {
  struct upload *u = arg;
  unsigned char md[32];
  char hex[HEX_LEN + 1], dir[4096], dst[4200];
  unsigned mdlen = 0;
  u->ok = u->ok && EVP_DigestFinal_ex(u->sha, md, &mdlen) == 1 && fsync(u->fd) == 0;
  u->ok = close(u->fd) == 0 && u->ok;
  for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
  snprintf(dir, sizeof dir, "%s/sha256/%.2s", up_dir, hex);
  if (mkdir(dir, 0755) < 0 && errno != EEXIST) u->ok = 0;
  snprintf(dir, sizeof dir, "%s/sha256/%.2s/%.2s", up_dir, hex, hex + 2);
  if (mkdir(dir, 0755) < 0 && errno != EEXIST) u->ok = 0;
  snprintf(dst, sizeof dst, "%s/%s", dir, hex);
  u->ok = u->ok && rename(u->tmp, dst) == 0;
  int dfd = open(dir, O_RDONLY | O_DIRECTORY);
  u->ok = u->ok && dfd >= 0 && fsync(dfd) == 0;
  if (dfd >= 0) close(dfd);
  __atomic_store_n(&u->done, 1, __ATOMIC_RELEASE);
  MHD_resume_connection(u->conn);
  return NULL;
}

static void upload_freed(void *cls, struct MHD_Connection *c, void **ctx,
                         enum MHD_RequestTerminationCode why) {
  (void)cls, (void)c, (void)why;
  struct upload *u = *ctx;
  if (!u || u == (void *)&up_dir || u == (void *)&begun) return;
  if (!u->done && u->fd >= 0) { /* cut short before its commit */
    close(u->fd);
    unlink(u->tmp);
  }
  EVP_MD_CTX_free(u->sha);
  free(u);
}

/* PUT's calls: the body's chunks, then (once) the commit thread, then the answer. */
static enum MHD_Result put_blob(struct MHD_Connection *c, const char *upload, size_t *upload_size,
                                void **ctx) {
  static unsigned long long n;
  struct upload *u = *ctx;
  if (u == (void *)&up_dir) { /* the first body call */
    u = calloc(1, sizeof *u);
    if (!u || !(u->sha = EVP_MD_CTX_new()) || EVP_DigestInit_ex(u->sha, EVP_sha256(), NULL) != 1)
      abort();
    u->conn = c;
    snprintf(u->tmp, sizeof u->tmp, "%s/tmp/%llu", up_dir,
             __atomic_fetch_add(&n, 1, __ATOMIC_RELAXED));
    u->fd = open(u->tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    u->ok = u->fd >= 0;
    *ctx = u;
  }
  if (*upload_size) {
    u->ok = u->ok && EVP_DigestUpdate(u->sha, upload, *upload_size) == 1;
    for (size_t off = 0; u->ok && off < *upload_size;) {
      ssize_t w = write(u->fd, upload + off, *upload_size - off);
      if (w < 0 && errno == EINTR) continue;
      u->ok = w > 0;
      off += w > 0 ? (size_t)w : 0;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (!__atomic_load_n(&u->done, __ATOMIC_ACQUIRE)) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    MHD_suspend_connection(c);
    if (pthread_create(&t, &a, commit_thread, u)) abort();
    pthread_attr_destroy(&a);
    return MHD_YES;
  }
  struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
  enum MHD_Result q = MHD_queue_response(c, u->ok ? MHD_HTTP_CREATED : 500, r);
  MHD_destroy_response(r);
  return q;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **ctx) {
  (void)cls, (void)method, (void)version, (void)upload; /* HEAD: libmicrohttpd drops the body */
  if (!*ctx) { /* queue on the second call, as blobrefd does (a first-call answer closes) */
    *ctx = up_dir && !strcmp(method, "PUT") ? (void *)&up_dir : &begun;
    return MHD_YES;
  }
  if (*ctx != &begun) return put_blob(c, upload, upload_size, ctx);
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
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "public, max-age=31536000, immutable");
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
    MHD_add_response_header(r, "Repr-Digest", b->repr);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    if (status == MHD_HTTP_PARTIAL_CONTENT) {
      snprintf(cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%zu", first, first + len - 1,
               b->size);
      MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
    }
  }
  MHD_add_response_header(r, "X-Request-Id", rid);
  enum MHD_Result q = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return q;
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: %s PORT FILES_DIR REDIRECT_BASE [UP_DIR]\n", argv[0]);
    return 2;
  }
  if (argc == 5) {
    up_dir = argv[4];
    char d[4096];
    snprintf(d, sizeof d, "%s/tmp", up_dir);
    mkdir(up_dir, 0755);
    mkdir(d, 0755);
    snprintf(d, sizeof d, "%s/sha256", up_dir);
    mkdir(d, 0755);
  }
  char top[4096];
  snprintf(top, sizeof top, "%s/sha256", argv[2]);
  load_tree(top, 1);
  qsort(blobs, nblobs, sizeof *blobs, by_hex);
  redirect_base = argv[3];
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_TURBO |
          (up_dir ? MHD_ALLOW_SUSPEND_RESUME : 0), /* (suspending only with PUT) */
      (uint16_t)atoi(argv[1]), NULL, NULL, answer, NULL, MHD_OPTION_NOTIFY_COMPLETED, upload_freed,
      NULL, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(cores > 0 ? cores : 1),
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
