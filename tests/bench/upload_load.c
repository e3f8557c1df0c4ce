/* upload_load: upload and read load generator, blob generator for tests/bench/run.sh. */
/*
 * usage: upload_load -m MODE [options]
 *   -m put       PUT URL/<hex> (blobref, nginx dav)
 *   -m registry  POST URL/uploads/ then PUT <Location>&digest=sha256:<hex> (URL = /v2/NAME/blobs)
 *   -m mount     POST URL/uploads/?mount=sha256:<hex>&from=FROM (registry cross-repo mount)
 *   -m gen       write the synthetic blobs as DIR/sha256/aa/bb/<hex>, print "hex path" lines
 *   -m disk      no HTTP: C writers each write+fsync+rename+dir-fsync blobs under DIR
 *   -m reqs      keep-alive read load: -f lists "METHOD PATH [RANGE]" lines, used in turn
 *                (wrk 4.1 cannot do HEAD: it waits for a body after a HEAD response);
 *                2xx and 3xx count as ok
 *   -u URL       http://IPv4:PORT/path            -o DIR   output directory (gen, disk)
 *   -f LIST      blobs from a "hex path" list     -s SIZE -n N -S SEED  synthetic blobs
 *   -c CONC      concurrency (1..1024, default 16)
 *   -d SECS      stop starting requests after SECS (default 10)
 *   -N MAX       at most MAX requests (default: number of blobs; with -r unlimited)
 *   -r           cycle over the blobs (dedup runs); -e  send Expect: 100-continue, new
 *                connection per request (the server may answer before the body)
 *   -F FROM      source repository for -m mount;  -t N  client threads (default 1)
 * Prints one line: requests= ok= errors= early= seconds= rps= p50_ms= p99_ms= mbps= status=
 * Synthetic blob i = SIZE-64 shared pseudo-random bytes + a 64-byte tail naming SEED and i, so
 * that its SHA-256 costs one 64-byte block after the shared prefix has been hashed once.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 1024
#define MAX_SIZE (64u << 20)
#define MAX_SYNTH 200000u
#define MAX_LIST 100000u
#define MAX_LIST_BYTES (1ull << 30)
#define MAX_LAT (50u * 1000 * 1000)
#define RBUF_SIZE 16384
#define HDR_SIZE 4096
#define LOC_SIZE 2048
#define TAIL 64
#define GRACE_US 10000000ll

enum mode { M_PUT, M_REGISTRY, M_MOUNT, M_GEN, M_DISK, M_REQS };
enum body { B_NONE, B_LEN, B_CHUNK_SIZE, B_CHUNK_DATA, B_CHUNK_CRLF, B_CHUNK_TRAILER, B_CLOSE };
enum cstate { C_IDLE, C_CONNECTING, C_SENDING, C_RECEIVING, C_DRAINING };

struct blob {
  char hex[65];
  const unsigned char *seg[2]; /* body = seg[0] (len[0]) followed by seg[1] (len[1]) */
  size_t len[2];
};

struct req {
  char *text; /* the whole request head */
  size_t len;
  int head; /* HEAD: the response has no body */
};

struct conn {
  int fd;
  enum cstate state;
  int step;      /* registry: 0 = POST, 1 = PUT */
  int with_body; /* body is part of what is being sent */
  int wait_100;  /* headers sent with Expect, no body byte sent yet */
  size_t blob;
  int64_t t0;
  char hdr[HDR_SIZE];
  size_t hdr_len, off, total;
  char rbuf[RBUF_SIZE];
  size_t rlen;
  int have_head, status, close_after, is_head;
  enum body bmode;
  uint64_t body_left;
  char location[LOC_SIZE];
};

static struct {
  enum mode mode;
  const char *url, *list, *seed, *from, *outdir;
  size_t size, count;
  unsigned conc;
  double secs;
  uint64_t max_req;
  int cycle, expect;
  struct sockaddr_in addr;
  char host[64], path[1024];
  struct blob *blobs;
  struct req *reqs;
  size_t nblobs; /* blobs or reqs */
  unsigned threads;
  unsigned char *base;
  unsigned char *tails;
} g = {.mode = M_PUT, .seed = "bench", .conc = 16, .secs = 10, .threads = 1};

static struct {
  uint64_t started, done, ok, errors, early, aborted;
  uint64_t status[600];
  uint32_t *lat;
  size_t nlat, cap;
  int64_t start, deadline, grace_end, last;
  pthread_mutex_t mu;
} st = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void die(const char *fmt, const char *arg) {
  fprintf(stderr, "upload_load: ");
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  exit(2);
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void fill_random(unsigned char *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = splitmix(&seed);
    memcpy(p + i, &v, n - i < 8 ? n - i : 8);
  }
}

static uint64_t seed_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void hex_of(const unsigned char *md, char out[65]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    out[2 * i] = digits[md[i] >> 4];
    out[2 * i + 1] = digits[md[i] & 15];
  }
  out[64] = 0;
}

/* Builds g.count synthetic blobs of g.size bytes; hashes the shared prefix once. */
static void make_synth(void) {
  if (g.size < TAIL || g.size % TAIL || g.size > MAX_SIZE)
    die("bad -s (64..64MiB, multiple of 64)", "");
  if (g.count < 1 || g.count > MAX_SYNTH) die("bad -n (1..200000)", "");
  size_t plen = g.size - TAIL;
  uint64_t seed = seed_hash(g.seed);
  g.base = malloc(plen ? plen : 1);
  g.tails = malloc(g.count * TAIL);
  g.blobs = calloc(g.count, sizeof *g.blobs);
  if (!g.base || !g.tails || !g.blobs) die("out of memory", "");
  fill_random(g.base, plen, seed);
  EVP_MD_CTX *base = EVP_MD_CTX_new(), *one = EVP_MD_CTX_new();
  if (!base || !one || !EVP_DigestInit_ex(base, EVP_sha256(), NULL) ||
      !EVP_DigestUpdate(base, g.base, plen))
    die("sha256 init failed", "");
  for (size_t i = 0; i < g.count; i++) {
    unsigned char *t = g.tails + i * TAIL, md[32];
    unsigned mdlen = 0;
    fill_random(t, TAIL, seed ^ (i + 1) * 0x2545f4914f6cdd1dull);
    char text[128];
    int tl = snprintf(text, sizeof text, "blobref-bench %.16s %zu ", g.seed, i);
    memcpy(t, text, tl > 40 ? 40 : (size_t)tl); /* the rest of the tail depends on the seed */
    if (!EVP_MD_CTX_copy_ex(one, base) || !EVP_DigestUpdate(one, t, TAIL) ||
        !EVP_DigestFinal_ex(one, md, &mdlen))
      die("sha256 failed", "");
    hex_of(md, g.blobs[i].hex);
    g.blobs[i].seg[0] = g.base;
    g.blobs[i].len[0] = plen;
    g.blobs[i].seg[1] = t;
    g.blobs[i].len[1] = TAIL;
  }
  EVP_MD_CTX_free(base);
  EVP_MD_CTX_free(one);
  g.nblobs = g.count;
}

/* Loads "hex path" lines; the files are read into memory (bounded by MAX_LIST_BYTES). */
static void load_list(void) {
  FILE *f = fopen(g.list, "r");
  if (!f) die("cannot open %s", g.list);
  char line[4200];
  size_t cap = 0, total = 0;
  while (fgets(line, sizeof line, f)) {
    char hex[65], path[4097];
    if (sscanf(line, "%64s %4096s", hex, path) != 2 || strlen(hex) != 64) continue;
    if (g.nblobs == MAX_LIST) die("list too long", "");
    if (g.nblobs == cap) {
      cap = cap ? cap * 2 : 1024;
      g.blobs = realloc(g.blobs, cap * sizeof *g.blobs);
      if (!g.blobs) die("out of memory", "");
    }
    FILE *b = fopen(path, "rb");
    if (!b) die("cannot open %s", path);
    fseek(b, 0, SEEK_END);
    long n = ftell(b);
    fseek(b, 0, SEEK_SET);
    if (n < 0 || (uint64_t)n > MAX_SIZE || total + (uint64_t)n > MAX_LIST_BYTES)
      die("blob too big: %s", path);
    unsigned char *data = malloc(n ? (size_t)n : 1);
    if (!data || fread(data, 1, (size_t)n, b) != (size_t)n) die("cannot read %s", path);
    fclose(b);
    struct blob *bl = &g.blobs[g.nblobs++];
    memset(bl, 0, sizeof *bl);
    memcpy(bl->hex, hex, 65);
    bl->seg[0] = data;
    bl->len[0] = (size_t)n;
    total += (size_t)n;
  }
  fclose(f);
  if (!g.nblobs) die("no blobs in %s", g.list);
}

/* Loads "METHOD PATH [RANGE]" lines (-m reqs) into ready request heads. */
static void load_reqs(void) {
  FILE *f = fopen(g.list, "r");
  if (!f) die("cannot open %s", g.list);
  char line[4200];
  size_t cap = 0;
  while (fgets(line, sizeof line, f)) {
    char method[16], path[2048], range[256] = "";
    if (sscanf(line, "%15s %2047s %255s", method, path, range) < 2) continue;
    if (g.nblobs == MAX_LIST) die("request list too long", "");
    if (g.nblobs == cap) {
      cap = cap ? cap * 2 : 1024;
      g.reqs = realloc(g.reqs, cap * sizeof *g.reqs);
      if (!g.reqs) die("out of memory", "");
    }
    char text[HDR_SIZE];
    int n = snprintf(text, sizeof text, "%s %s HTTP/1.1\r\nHost: %s\r\n%s%s%s\r\n", method, path,
                     g.host, range[0] ? "Range: " : "", range, range[0] ? "\r\n" : "");
    if (n <= 0 || n >= HDR_SIZE) die("request too long: %s", path);
    struct req *r = &g.reqs[g.nblobs++];
    r->text = strdup(text);
    r->len = (size_t)n;
    r->head = !strcmp(method, "HEAD");
    if (!r->text) die("out of memory", "");
  }
  fclose(f);
  if (!g.nblobs) die("no requests in %s", g.list);
}

static size_t blob_size(const struct blob *b) { return b->len[0] + b->len[1]; }

static int mkdirs(char *path) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    int rc = mkdir(path, 0755);
    *p = '/';
    if (rc && errno != EEXIST) return -1;
  }
  return 0;
}

static int write_all(int fd, const unsigned char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void record(int64_t t0, int ok, int status, int early) {
  int64_t t = now_us();
  pthread_mutex_lock(&st.mu);
  st.done++;
  st.early += (uint64_t)early;
  st.last = t;
  if (status > 0 && status < 600) st.status[status]++;
  if (ok) {
    st.ok++;
    if (st.nlat == st.cap && st.cap < MAX_LAT) {
      st.cap = st.cap ? st.cap * 2 : 65536;
      st.lat = realloc(st.lat, st.cap * sizeof *st.lat);
      if (!st.lat) die("out of memory", "");
    }
    if (st.nlat < st.cap) st.lat[st.nlat++] = (uint32_t)(t - t0 > UINT32_MAX ? UINT32_MAX : t - t0);
  } else {
    st.errors++;
  }
  pthread_mutex_unlock(&st.mu);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static void report(void) {
  double secs = (double)((st.last > st.start ? st.last : now_us()) - st.start) / 1e6;
  if (secs <= 0) secs = 1e-6;
  double p50 = 0, p99 = 0;
  if (st.nlat) {
    qsort(st.lat, st.nlat, sizeof *st.lat, cmp_u32);
    p50 = st.lat[(st.nlat - 1) / 2] / 1000.0;
    p99 = st.lat[(size_t)((st.nlat - 1) * 0.99)] / 1000.0;
  }
  size_t sz = g.blobs ? blob_size(&g.blobs[0]) : 0;
  double sent = g.mode == M_MOUNT ? 0 : g.expect ? (double)(st.ok - st.early) : (double)st.ok;
  if (sent < 0) sent = 0;
  printf("requests=%" PRIu64 " ok=%" PRIu64 " errors=%" PRIu64 " early=%" PRIu64 " aborted=%" PRIu64
         " seconds=%.3f rps=%.1f p50_ms=%.3f p99_ms=%.3f mbps=%.1f status=",
         st.done, st.ok, st.errors, st.early, st.aborted, secs, st.ok / secs, p50, p99,
         sent * (double)sz / secs / 1e6);
  int first = 1;
  for (int s = 0; s < 600; s++) {
    if (!st.status[s]) continue;
    printf("%s%d:%" PRIu64, first ? "" : ",", s, st.status[s]);
    first = 0;
  }
  printf("%s\n", first ? "-" : "");
}

/* ---- gen and disk modes ---- */

static void run_gen(void) {
  char path[4096];
  for (size_t i = 0; i < g.nblobs; i++) {
    const struct blob *b = &g.blobs[i];
    snprintf(path, sizeof path, "%s/sha256/%.2s/%.2s/%s", g.outdir, b->hex, b->hex + 2, b->hex);
    if (mkdirs(path)) die("mkdir failed under %s", g.outdir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write_all(fd, b->seg[0], b->len[0]) || write_all(fd, b->seg[1], b->len[1]) ||
        close(fd))
      die("cannot write %s", path);
    printf("%s %s\n", b->hex, path);
  }
}

static void *disk_worker(void *arg) {
  (void)arg;
  char tmp[4200], dst[4200], dir[4096];
  for (;;) {
    pthread_mutex_lock(&st.mu);
    int64_t t0 = now_us();
    size_t i = st.started;
    int go = st.started < g.max_req && t0 < st.deadline;
    if (go) st.started++;
    pthread_mutex_unlock(&st.mu);
    if (!go) break;
    const struct blob *b = &g.blobs[i % g.nblobs];
    snprintf(tmp, sizeof tmp, "%s/tmp/%s.%zu", g.outdir, b->hex, i);
    snprintf(dir, sizeof dir, "%s/sha256/%.2s/%.2s", g.outdir, b->hex, b->hex + 2);
    snprintf(dst, sizeof dst, "%s/%s", dir, b->hex);
    int ok = 0;
    if (!mkdirs(tmp) && !mkdirs(dst)) {
      int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
      if (fd >= 0) {
        ok = !write_all(fd, b->seg[0], b->len[0]) && !write_all(fd, b->seg[1], b->len[1]) &&
             !fsync(fd);
        ok = !close(fd) && ok && !rename(tmp, dst);
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        ok = ok && dfd >= 0 && !fsync(dfd);
        if (dfd >= 0) close(dfd);
      }
    }
    record(t0, ok, 0, 0);
  }
  return NULL;
}

static void run_disk(void) {
  pthread_t th[MAX_CONNS];
  st.start = now_us();
  st.deadline = st.start + (int64_t)(g.secs * 1e6);
  for (unsigned i = 0; i < g.conc; i++)
    if (pthread_create(&th[i], NULL, disk_worker, NULL)) die("pthread_create failed", "");
  for (unsigned i = 0; i < g.conc; i++) pthread_join(th[i], NULL);
}

/* ---- HTTP client ---- */

static __thread int epfd;
static __thread unsigned active;

static void conn_close(struct conn *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  c->state = C_IDLE;
}

/* Formats the request for c's current step into c->hdr. */
static void build_request(struct conn *c) {
  c->with_body = 0;
  c->wait_100 = 0;
  c->rlen = 0;
  c->have_head = 0;
  c->off = 0;
  if (g.mode == M_REQS) {
    const struct req *r = &g.reqs[c->blob];
    memcpy(c->hdr, r->text, r->len);
    c->total = c->hdr_len = r->len;
    c->is_head = r->head;
    return;
  }
  const struct blob *b = &g.blobs[c->blob];
  size_t sz = blob_size(b);
  int n;
  c->is_head = 0;
  if (g.mode == M_PUT) {
    n = snprintf(c->hdr, HDR_SIZE,
                 "PUT %s/%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n"
                 "Content-Length: %zu\r\n%s\r\n",
                 g.path, b->hex, g.host, sz, g.expect ? "Expect: 100-continue\r\n" : "");
    c->with_body = !g.expect;
    c->wait_100 = g.expect;
  } else if (g.mode == M_MOUNT) {
    n = snprintf(c->hdr, HDR_SIZE,
                 "POST %s/uploads/?mount=sha256:%s&from=%s HTTP/1.1\r\nHost: %s\r\n"
                 "Content-Length: 0\r\n\r\n",
                 g.path, b->hex, g.from, g.host);
  } else if (c->step == 0) {
    n = snprintf(c->hdr, HDR_SIZE,
                 "POST %s/uploads/ HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\n\r\n", g.path,
                 g.host);
  } else {
    n = snprintf(c->hdr, HDR_SIZE,
                 "PUT %s%cdigest=sha256:%s HTTP/1.1\r\nHost: %s\r\n"
                 "Content-Type: application/octet-stream\r\nContent-Length: %zu\r\n\r\n",
                 c->location, strchr(c->location, '?') ? '&' : '?', b->hex, g.host, sz);
    c->with_body = 1;
  }
  if (n <= 0 || n >= HDR_SIZE) die("request header too long", "");
  c->hdr_len = (size_t)n;
  c->off = 0;
  c->total = c->hdr_len + (c->with_body ? sz : 0);
  c->rlen = 0;
  c->have_head = 0;
}

static int conn_open(struct conn *c) {
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd < 0) return -1;
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP, .data.ptr = c};
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev)) return -1;
  if (!connect(c->fd, (struct sockaddr *)&g.addr, sizeof g.addr)) {
    c->state = C_SENDING;
    return 0;
  }
  if (errno != EINPROGRESS) return -1;
  c->state = C_CONNECTING;
  return 0;
}

/* Starts the next request on c (opening a connection when needed), or retires c. */
static void start_next(struct conn *c) {
  for (;;) {
    int64_t t = now_us();
    uint64_t k =
        t < st.deadline ? __atomic_fetch_add(&st.started, 1, __ATOMIC_RELAXED) : UINT64_MAX;
    if (k >= g.max_req) {
      conn_close(c);
      active--;
      return;
    }
    c->blob = k % g.nblobs;
    c->step = 0;
    c->t0 = t;
    build_request(c);
    if (c->fd >= 0 || !conn_open(c)) {
      if (c->state != C_CONNECTING) c->state = C_SENDING;
      return;
    }
    conn_close(c);
    record(c->t0, 0, 0, 0);
  }
}

/* Sends what is pending; 1 = all sent, 0 = would block, -1 = error. */
static int do_send(struct conn *c) {
  const struct blob *b = c->with_body ? &g.blobs[c->blob] : NULL;
  while (c->off < c->total) {
    struct iovec iov[3];
    const unsigned char *p[3] = {(const unsigned char *)c->hdr, b ? b->seg[0] : NULL,
                                 b ? b->seg[1] : NULL};
    size_t l[3] = {c->hdr_len, b ? b->len[0] : 0, b ? b->len[1] : 0};
    size_t off = c->off;
    int n = 0;
    for (int i = 0; i < 3; i++) {
      if (off >= l[i]) {
        off -= l[i];
        continue;
      }
      iov[n].iov_base = (void *)(p[i] + off);
      iov[n++].iov_len = l[i] - off;
      off = 0;
    }
    ssize_t w = writev(c->fd, iov, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno == EAGAIN ? 0 : -1;
    c->off += (size_t)w;
  }
  return 1;
}

static int header_is(const char *line, size_t len, const char *name, const char **val) {
  size_t n = strlen(name);
  if (len <= n || strncasecmp(line, name, n) || line[n] != ':') return 0;
  const char *v = line + n + 1;
  while (*v == ' ' || *v == '\t') v++;
  *val = v;
  return 1;
}

static void consume(struct conn *c, size_t n) {
  memmove(c->rbuf, c->rbuf + n, c->rlen - n);
  c->rlen -= n;
}

/* Parses the response head in rbuf; 1 = parsed, 0 = need more, -1 = malformed. */
static int parse_head(struct conn *c) {
  char *end = memmem(c->rbuf, c->rlen, "\r\n\r\n", 4);
  if (!end) return c->rlen == RBUF_SIZE ? -1 : 0;
  size_t head_len = (size_t)(end - c->rbuf) + 4;
  if (c->rlen < 12 || memcmp(c->rbuf, "HTTP/1.", 7)) return -1;
  c->status = atoi(c->rbuf + 9);
  c->close_after = c->rbuf[7] == '0';
  c->bmode = B_CLOSE;
  c->location[0] = 0;
  int have_len = 0, chunked = 0;
  char *line = memchr(c->rbuf, '\n', head_len) + 1;
  while (line < end) {
    char *eol = memchr(line, '\r', (size_t)(end + 2 - line));
    size_t len = (size_t)(eol - line);
    const char *v;
    if (header_is(line, len, "content-length", &v)) {
      c->body_left = strtoull(v, NULL, 10);
      have_len = 1;
    } else if (header_is(line, len, "transfer-encoding", &v)) {
      chunked = memmem(v, (size_t)(eol - v), "chunked", 7) != NULL;
    } else if (header_is(line, len, "connection", &v)) {
      if (memmem(v, (size_t)(eol - v), "close", 5)) c->close_after = 1;
    } else if (header_is(line, len, "location", &v)) {
      const char *p = v;
      if (!strncmp(p, "http://", 7) || !strncmp(p, "https://", 8)) {
        p = memchr(strstr(p, "//") + 2, '/', (size_t)(eol - p));
        if (!p) p = eol;
      }
      size_t n = (size_t)(eol - p);
      if (n >= LOC_SIZE) return -1;
      memcpy(c->location, p, n);
      c->location[n] = 0;
    }
    line = eol + 2;
  }
  if (c->status / 100 == 1 || c->status == 204 || c->status == 304 || c->is_head)
    c->bmode = B_NONE;
  else if (chunked)
    c->bmode = B_CHUNK_SIZE;
  else if (have_len)
    c->bmode = B_LEN;
  consume(c, head_len);
  c->have_head = 1;
  return 1;
}

/* Skips body bytes in rbuf; 1 = body complete, 0 = need more, -1 = malformed. */
static int parse_body(struct conn *c) {
  for (;;) {
    switch (c->bmode) {
      case B_NONE:
        return 1;
      case B_LEN: {
        size_t n = c->rlen < c->body_left ? c->rlen : (size_t)c->body_left;
        consume(c, n);
        c->body_left -= n;
        return c->body_left == 0;
      }
      case B_CLOSE:
        c->rlen = 0;
        return 0;
      case B_CHUNK_SIZE:
      case B_CHUNK_TRAILER: {
        char *eol = memmem(c->rbuf, c->rlen, "\r\n", 2);
        if (!eol) return c->rlen == RBUF_SIZE ? -1 : 0;
        size_t len = (size_t)(eol - c->rbuf);
        if (c->bmode == B_CHUNK_TRAILER) {
          consume(c, len + 2);
          if (len == 0) return 1;
          continue;
        }
        c->body_left = strtoull(c->rbuf, NULL, 16);
        consume(c, len + 2);
        c->bmode = c->body_left ? B_CHUNK_DATA : B_CHUNK_TRAILER;
        continue;
      }
      case B_CHUNK_DATA: {
        size_t n = c->rlen < c->body_left ? c->rlen : (size_t)c->body_left;
        consume(c, n);
        c->body_left -= n;
        if (c->body_left) return 0;
        c->bmode = B_CHUNK_CRLF;
        continue;
      }
      case B_CHUNK_CRLF:
        if (c->rlen < 2) return 0;
        consume(c, 2);
        c->bmode = B_CHUNK_SIZE;
        continue;
    }
  }
}

static void fail_request(struct conn *c, int status) {
  record(c->t0, 0, status, 0);
  conn_close(c);
  start_next(c);
}

/* A final response arrived for c's current step (eof: the server has closed already). */
static void on_response(struct conn *c, int eof) {
  if (eof) c->close_after = 1;
  if (g.mode == M_REGISTRY && c->step == 0 && c->status == 202 && c->location[0]) {
    if (c->close_after) conn_close(c);
    c->step = 1;
    build_request(c);
    if (c->fd < 0 && conn_open(c)) {
      fail_request(c, 0);
      return;
    }
    if (c->state != C_CONNECTING) c->state = C_SENDING;
    return;
  }
  int ok = (c->status / 100 == 2 || (g.mode == M_REQS && c->status / 100 == 3)) &&
           !(g.mode == M_REGISTRY && c->step == 0); /* reqs: a redirect is an answer */
  record(c->t0, ok, c->status, ok && c->wait_100);
  if (c->close_after && !eof) {
    /* Let the server close first, as it said it would, so that TIME_WAIT stays on its side. */
    c->state = C_DRAINING;
    return;
  }
  if (c->close_after || g.expect) conn_close(c);
  start_next(c);
}

/* Receives and parses; 1 = final response complete, 2 = 100 Continue (send the body now),
 * 0 = would block, -1 = error. *eof is set when the server closed. */
static int do_recv(struct conn *c, int *eof) {
  for (;;) {
    if (!c->have_head) {
      int h = parse_head(c);
      if (h < 0) return -1;
      if (h > 0 && c->status / 100 == 1) {
        c->have_head = 0;
        if (c->status == 100 && c->wait_100) return 2;
        continue;
      }
    }
    if (c->have_head) {
      int b = parse_body(c);
      if (b < 0) return -1;
      if (b > 0) return 1;
    }
    if (c->rlen == RBUF_SIZE) return -1;
    ssize_t r = read(c->fd, c->rbuf + c->rlen, RBUF_SIZE - c->rlen);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return 0;
    if (r <= 0) {
      *eof = 1;
      return c->have_head && c->bmode == B_CLOSE ? 1 : -1;
    }
    c->rlen += (size_t)r;
  }
}

/* Drives c as far as it can go without blocking; events = 0 when not called from epoll. */
static void progress(struct conn *c, uint32_t events) {
  for (;;) {
    if (c->state == C_IDLE) return;
    if (c->state == C_DRAINING) {
      char tmp[4096];
      ssize_t r;
      while ((r = read(c->fd, tmp, sizeof tmp)) > 0) {
      }
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
      conn_close(c);
      start_next(c);
      events = 0;
      continue;
    }
    if (c->state == C_CONNECTING) {
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
      int err = 0;
      socklen_t el = sizeof err;
      getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
      if (err) {
        fail_request(c, 0);
        events = 0;
        continue;
      }
      c->state = C_SENDING;
    }
    if (c->state == C_SENDING) {
      int r = do_send(c);
      if (r < 0) {
        fail_request(c, 0);
        events = 0;
        continue;
      }
      if (r == 0) return;
      c->state = C_RECEIVING;
    }
    int eof = 0;
    int r = do_recv(c, &eof);
    if (r == 0) return;
    events = 0;
    if (r < 0) {
      fail_request(c, c->have_head ? c->status : 0);
    } else if (r == 2) {
      c->wait_100 = 0;
      c->with_body = 1;
      c->total = c->hdr_len + blob_size(&g.blobs[c->blob]);
      c->state = C_SENDING;
    } else {
      on_response(c, eof);
    }
  }
}

static struct conn conns[MAX_CONNS];

/* One event loop over conns[first .. first+n). */
static void *http_thread(void *arg) {
  unsigned first = (unsigned)(uintptr_t)arg >> 16, n = (unsigned)(uintptr_t)arg & 0xffff;
  int64_t grace_end = 0;
  epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) die("epoll_create1 failed", "");
  for (unsigned i = first; i < first + n; i++) {
    conns[i].fd = -1;
    conns[i].state = C_IDLE;
    active++;
    start_next(&conns[i]);
    if (conns[i].state == C_SENDING) progress(&conns[i], 0);
  }
  struct epoll_event evs[256];
  while (active > 0) {
    int64_t t = now_us();
    if (t >= st.deadline && !grace_end) grace_end = t + GRACE_US;
    if (grace_end && t >= grace_end) break;
    int64_t until = grace_end ? grace_end : st.deadline;
    int timeout = (int)((until - t) / 1000) + 1;
    int k = epoll_wait(epfd, evs, 256, timeout);
    for (int i = 0; i < k; i++) progress(evs[i].data.ptr, evs[i].events);
  }
  for (unsigned i = first; i < first + n; i++)
    if (conns[i].state != C_IDLE) {
      __atomic_fetch_add(&st.aborted, 1, __ATOMIC_RELAXED);
      conn_close(&conns[i]);
    }
  close(epfd);
  return NULL;
}

static void run_http(void) {
  pthread_t th[64];
  signal(SIGPIPE, SIG_IGN);
  st.start = now_us();
  st.deadline = st.start + (int64_t)(g.secs * 1e6);
  unsigned first = 0;
  for (unsigned i = 0; i < g.threads; i++) {
    unsigned n = g.conc / g.threads + (i < g.conc % g.threads);
    if (pthread_create(&th[i], NULL, http_thread, (void *)(uintptr_t)(first << 16 | n)))
      die("pthread_create failed", "");
    first += n;
  }
  for (unsigned i = 0; i < g.threads; i++) pthread_join(th[i], NULL);
}

static void parse_url(void) {
  char ip[16];
  unsigned port = 0;
  int n = 0;
  if (!g.url || sscanf(g.url, "http://%15[0-9.]:%u%n", ip, &port, &n) != 2 || port == 0 ||
      port > 65535)
    die("bad -u %s (want http://IPv4:PORT/path)", g.url ? g.url : "");
  const char *path = g.url + n;
  if (strlen(path) >= sizeof g.path) die("path too long", "");
  snprintf(g.path, sizeof g.path, "%s", path);
  size_t pl = strlen(g.path);
  while (pl && g.path[pl - 1] == '/') g.path[--pl] = 0;
  snprintf(g.host, sizeof g.host, "%s:%u", ip, port);
  g.addr.sin_family = AF_INET;
  g.addr.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, ip, &g.addr.sin_addr) != 1) die("bad address %s", ip);
}

int main(int argc, char **argv) {
  int opt;
  const char *modes[] = {"put", "registry", "mount", "gen", "disk", "reqs"};
  int mode_set = 0;
  while ((opt = getopt(argc, argv, "m:u:f:s:n:S:c:d:N:reF:o:t:")) != -1) {
    switch (opt) {
      case 'm':
        for (int i = 0; i < 6; i++)
          if (!strcmp(optarg, modes[i])) {
            g.mode = (enum mode)i;
            mode_set = 1;
          }
        if (!mode_set) die("unknown mode %s", optarg);
        break;
      case 'u':
        g.url = optarg;
        break;
      case 'f':
        g.list = optarg;
        break;
      case 's':
        g.size = strtoull(optarg, NULL, 10);
        break;
      case 'n':
        g.count = strtoull(optarg, NULL, 10);
        break;
      case 'S':
        g.seed = optarg;
        break;
      case 'c':
        g.conc = (unsigned)atoi(optarg);
        break;
      case 'd':
        g.secs = atof(optarg);
        break;
      case 'N':
        g.max_req = strtoull(optarg, NULL, 10);
        break;
      case 'r':
        g.cycle = 1;
        break;
      case 'e':
        g.expect = 1;
        break;
      case 'F':
        g.from = optarg;
        break;
      case 'o':
        g.outdir = optarg;
        break;
      case 't':
        g.threads = (unsigned)atoi(optarg);
        break;
      default:
        die("usage: see the comment at the top of %s", __FILE__);
    }
  }
  if (g.conc < 1 || g.conc > MAX_CONNS) die("bad -c (1..1024)", "");
  if (g.secs <= 0 || g.secs > 3600) die("bad -d (0..3600 s)", "");
  if (g.threads < 1 || g.threads > 64 || g.threads > g.conc) die("bad -t (1..64, at most -c)", "");
  if (g.mode == M_REQS) {
    if (!g.list) die("-f REQUESTS is required for reqs", "");
    g.cycle = 1;
    parse_url();
    load_reqs();
  } else if (g.list) {
    load_list();
  } else {
    make_synth();
  }
  if (!g.max_req) g.max_req = g.cycle ? UINT64_MAX : g.nblobs;
  if (!g.cycle && g.max_req > g.nblobs) g.max_req = g.nblobs;
  if (g.mode == M_GEN || g.mode == M_DISK) {
    if (!g.outdir) die("-o DIR is required for gen and disk", "");
    if (g.mode == M_GEN) {
      run_gen();
      return 0;
    }
    run_disk();
  } else {
    if (g.mode == M_MOUNT && !g.from) die("-F FROM is required for mount", "");
    if (g.mode != M_REQS) parse_url();
    run_http();
  }
  report();
  return st.errors || st.aborted ? 1 : 0;
}
