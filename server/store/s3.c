/* The s3 store: blobs as objects in an S3 bucket (AWS, Ceph radosgw, MinIO, R2), SigV4-signed.
 *
 * Uploads never block a network thread on S3: the body is appended to a local spool file as it
 * arrives, and part workers send each full part (part_size) to S3 as a multipart upload while the
 * rest still arrives, each part signed with its own SHA-256 so that S3 verifies every byte. The
 * commit (on a finisher thread) sends what is left and completes the upload; a blob that fits in
 * one part goes up as one PUT whose x-amz-content-sha256 is the blob id itself. A failure aborts
 * the multipart upload: nothing is ever visible under the content key before the whole blob was
 * verified and S3 confirmed it. Parts already sent are punched out of the spool file, so a
 * 2 GiB upload holds at most a part or two of disk and no more than a buffer of memory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/s3_client.h"
#include "store/s3_url_cache.h"
#include "store/internal.h"

#define PART_WORKERS 4
#define MAX_PARTS 10000
#define HASH_CHUNK (1u << 20)
#define COPY_PART (1ull << 30)       /* UploadPartCopy size for copies over 5 GiB */
#define SINGLE_COPY_MAX (5ull << 30) /* S3's limit for one CopyObject */
#define PRESIGN_CACHE 8192           /* presigned redirect URLs kept per store */
#define DELETE_BATCH_KEYS 1000       /* keys per DeleteObjects (S3's limit) */
/* DeleteObjects requests of one br_store_delete_many in flight at once: radosgw and S3 delete a
 * batch's keys one after another, so a few requests together use the endpoint's parallelism;
 * each holds one batch's XML (about 100 KiB), so memory stays bounded. */
#define DELETE_INFLIGHT 4
/* An upload is backlogged (its client should pause) when it holds this many unsent bytes: two
 * parts, less room for the one more chunk the network may hand over before the pause. */
#define BACKLOG_SLACK (1u << 20)

/* Bytes spooled and not yet sent by every s3 store of the process (spool_max_total). */
static atomic_uint_fast64_t spooled_total;

struct s3_writer;

struct s3_store {
  s3_target t;
  s3_url_cache *urls; /* presigned redirect URLs (serve = redirect without cdn_url), else NULL */
  char spool_dir[PATH_MAX];
  uint64_t part_size;
  uint64_t spool_max, spool_max_total; /* caps on spooled bytes not yet sent (config) */
  uint64_t spooled;                    /* this store's, under lock */
  pthread_t workers[PART_WORKERS];
  int nworkers;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  struct s3_writer *queue_head, *queue_tail; /* writers with a part to send, or to abort */
  int stopping;
  /* multipart uploads whose abort failed (S3 down): retried by the health check */
  struct failed_abort {
    char key[1200];
    char upload_id[512];
  } * aborts;
  size_t naborts;
  enum br_direct_mode direct; /* direct uploads (direct_uploads and the startup probe) */
  int direct_by_content;      /* trusted on x-amz-content-sha256, not on a stored checksum */
};

struct part {
  char etag[80];
  char sha_b64[48];
};

struct s3_writer {
  br_store_writer base;
  struct s3_store *s3;
  int fd;
  char spool_path[PATH_MAX + 64];
  uint64_t written; /* bytes spooled */
  uint64_t counted; /* of those, not yet sent: in s3->spooled and spooled_total (under lock) */
  /* shared with the part workers, under s3->lock */
  int queued, in_flight, failed, abandoned;
  int fail_errno;
  char fail_msg[sizeof(br_err)];
  char upload_id[512]; /* "" until the multipart upload was created */
  char mp_key[1200];   /* the key it was created under: the intended key, or a staging key */
  struct part *parts;
  size_t nparts; /* parts sent */
  pthread_cond_t done_cv;
  struct s3_writer *next;
};

static struct s3_store *s3_of(br_store *st) { return st->impl; }

/* errno for a failed request: unreachable (503) or refused by S3 (502). */
static int request_errno(const s3_response *r) { return r->status ? EPROTO : EHOSTUNREACH; }

/* ---- part uploads -----------------------------------------------------------------------------
 */

/* SHA-256 of len bytes of fd at off, as hex and base64. */
static int hash_range(int fd, uint64_t off, uint64_t len, char hex[65], char b64[48], br_err *err) {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  char *buf = malloc(HASH_CHUNK);
  int rc =
      ctx && buf && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ? 0 : br_fail(err, "out of memory");
  for (uint64_t done = 0; rc == 0 && done < len;) {
    size_t n = len - done < HASH_CHUNK ? (size_t)(len - done) : HASH_CHUNK;
    ssize_t r = pread(fd, buf, n, (off_t)(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = br_fail(err, "spool read: %s", r < 0 ? strerror(errno) : "short file");
      break;
    }
    EVP_DigestUpdate(ctx, buf, (size_t)r);
    done += (uint64_t)r;
  }
  uint8_t d[32];
  if (rc == 0) {
    EVP_DigestFinal_ex(ctx, d, NULL);
    br_hex_encode(d, hex);
    EVP_EncodeBlock((unsigned char *)b64, d, 32);
  }
  free(buf);
  EVP_MD_CTX_free(ctx);
  return rc;
}

/* content_type (NULL or "": S3's default) is the completed object's, kept by a later copy.
 * On failure *fail_errno says whom to blame: EHOSTUNREACH (no answer) or EPROTO (S3 refused). */
static int create_multipart_as(struct s3_store *s3, const char *key, const char *content_type,
                               int part_checksums, char *upload_id, size_t idlen, int *fail_errno,
                               br_err *err) {
  s3_request rq = {.method = "POST", .key = key, .query = "uploads="};
  if (part_checksums)
    rq.headers[rq.nheaders++] = (br_sigv4_header){"x-amz-checksum-algorithm", "SHA256"};
  if (content_type && *content_type)
    rq.headers[rq.nheaders++] = (br_sigv4_header){"content-type", content_type};
  s3_response rs;
  int rc = s3_perform(&s3->t, &rq, &rs, err);
  if (rc == 0 && (rs.status != 200 ||
                  s3_xml_text(rs.body, "UploadId", NULL, upload_id, idlen) < 0 || !*upload_id))
    rc = rs.status == 200 ? br_fail(err, "store %s: CreateMultipartUpload: no UploadId", s3->t.name)
                          : s3_fail_status(err, &s3->t, "CreateMultipartUpload", &rs);
  if (rc < 0 && fail_errno) *fail_errno = request_errno(&rs);
  s3_response_free(&rs);
  return rc;
}

static int create_multipart(struct s3_store *s3, const char *key, const char *content_type,
                            char *upload_id, size_t idlen, int *fail_errno, br_err *err) {
  return create_multipart_as(s3, key, content_type, 1, upload_id, idlen, fail_errno, err);
}

/* The key a multipart upload is created under: the blob's own key when the caller said it in
 * advance (PUT with the hash in the URL; nothing shows there until the upload completes), else a
 * per-upload staging key that is copied to the content key once the hash is known. */
static void choose_mp_key(struct s3_writer *w) {
  if (w->mp_key[0]) return;
  if (w->base.key_hint[0]) {
    snprintf(w->mp_key, sizeof w->mp_key, "%s", w->base.key_hint);
    return;
  }
  snprintf(w->mp_key, sizeof w->mp_key, "%s.staging/%s", w->base.store->cfg.prefix,
           strrchr(w->spool_path, '/') + 1);
}

static int upload_part(struct s3_store *s3, struct s3_writer *w, size_t index, uint64_t off,
                       uint64_t len, br_err *err) {
  char hex[65], b64[48], query[1700];
  if (hash_range(w->fd, off, len, hex, b64, err) < 0) return -1;
  const char *key = w->mp_key;
  char idenc[1600];
  if (!br_sigv4_uri_encode(w->upload_id, 0, idenc, sizeof idenc))
    return br_fail(err, "upload id too long");
  snprintf(query, sizeof query, "partNumber=%zu&uploadId=%s", index + 1, idenc);
  s3_request rq = {.method = "PUT",
                   .key = key,
                   .query = query,
                   .payload_hash = hex,
                   .body = {.fd = w->fd, .off = off, .len = len}};
  rq.headers[rq.nheaders++] = (br_sigv4_header){"x-amz-checksum-sha256", b64};
  s3_response rs;
  int rc = s3_perform(&s3->t, &rq, &rs, err);
  if (rc == 0 && (rs.status != 200 || !rs.etag[0]))
    rc = s3_fail_status(err, &s3->t, "UploadPart", &rs);
  if (rc == 0) {
    snprintf(w->parts[index].etag, sizeof w->parts[index].etag, "%s", rs.etag);
    memcpy(w->parts[index].sha_b64, b64, sizeof b64);
    /* the part is safe in S3: give its disk space back */
    fallocate(w->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
  } else {
    w->base.saved_errno = request_errno(&rs);
  }
  s3_response_free(&rs);
  return rc;
}

#define MAX_FAILED_ABORTS 4096

/* AbortMultipartUpload of upload_id under key. Returns 0 when S3 no longer has it. */
static int abort_upload(struct s3_store *s3, const char *key, const char *upload_id, br_err *err) {
  char query[1700], idenc[1600];
  if (!br_sigv4_uri_encode(upload_id, 0, idenc, sizeof idenc))
    return br_fail(err, "upload id too long");
  snprintf(query, sizeof query, "uploadId=%s", idenc);
  s3_request rq = {.method = "DELETE", .key = key, .query = query};
  s3_response rs;
  int rc = s3_perform(&s3->t, &rq, &rs, err);
  if (rc == 0 && rs.status != 204 && rs.status != 200 && rs.status != 404)
    rc = s3_fail_status(err, &s3->t, "AbortMultipartUpload", &rs);
  s3_response_free(&rs);
  return rc;
}

/* Aborts w's multipart upload; one that cannot be aborted now (S3 down) is remembered and
 * retried by the health check, so that no incomplete upload is left behind. */
static void abort_multipart(struct s3_store *s3, struct s3_writer *w) {
  if (!w->upload_id[0]) return;
  br_err err;
  if (abort_upload(s3, w->mp_key, w->upload_id, &err) < 0) {
    pthread_mutex_lock(&s3->lock);
    if (s3->naborts < MAX_FAILED_ABORTS) {
      struct failed_abort *fa = &s3->aborts[s3->naborts++];
      snprintf(fa->key, sizeof fa->key, "%s", w->mp_key);
      snprintf(fa->upload_id, sizeof fa->upload_id, "%s", w->upload_id);
      br_warn("%s (will retry)", err.msg);
    } else {
      br_warn("%s (an incomplete multipart upload is left for the bucket's lifecycle rule)",
              err.msg);
    }
    pthread_mutex_unlock(&s3->lock);
  }
  w->upload_id[0] = '\0';
}

/* Retries the aborts that failed (health thread). */
static void retry_failed_aborts(struct s3_store *s3) {
  pthread_mutex_lock(&s3->lock);
  size_t n = s3->naborts;
  pthread_mutex_unlock(&s3->lock);
  for (size_t i = 0; i < n; i++) {
    struct failed_abort fa;
    pthread_mutex_lock(&s3->lock);
    if (i >= s3->naborts) {
      pthread_mutex_unlock(&s3->lock);
      break;
    }
    fa = s3->aborts[i];
    pthread_mutex_unlock(&s3->lock);
    br_err err;
    if (abort_upload(s3, fa.key, fa.upload_id, &err) < 0) continue;
    pthread_mutex_lock(&s3->lock);
    for (size_t j = 0; j < s3->naborts; j++)
      if (!strcmp(s3->aborts[j].upload_id, fa.upload_id)) {
        s3->aborts[j] = s3->aborts[--s3->naborts];
        break;
      }
    pthread_mutex_unlock(&s3->lock);
    i--; /* the slot now holds another entry */
    n--;
  }
}

/* Takes n of w's counted bytes off the spool totals (lock held). */
static void uncount(struct s3_writer *w, uint64_t n) {
  if (n > w->counted) n = w->counted;
  w->counted -= n;
  w->s3->spooled -= n;
  atomic_fetch_sub(&spooled_total, n);
}

/* Frees w; call it without the store's lock. */
static void writer_free(struct s3_writer *w) {
  pthread_mutex_lock(&w->s3->lock);
  uncount(w, w->counted);
  pthread_mutex_unlock(&w->s3->lock);
  if (w->fd >= 0) close(w->fd);
  unlink(w->spool_path);
  pthread_cond_destroy(&w->done_cv);
  free(w->parts);
  free(w);
}

/* Number of parts that are complete in the spool and known not to be the last one. */
static size_t sendable_parts(const struct s3_writer *w) {
  if (!w->written) return 0;
  size_t n = (size_t)((w->written - 1) / w->s3->part_size);
  return n > MAX_PARTS - 1 ? MAX_PARTS - 1 : n;
}

/* Sends the parts that are ready, one at a time, outside the lock. Called by a worker with the
 * lock held and w->in_flight set; returns with the lock held. */
static void send_ready_parts(struct s3_store *s3, struct s3_writer *w) {
  while (!w->failed && !w->abandoned && w->nparts < sendable_parts(w)) {
    size_t index = w->nparts;
    pthread_mutex_unlock(&s3->lock);
    br_err err;
    int rc = 0;
    if (!w->upload_id[0]) {
      choose_mp_key(w);
      rc = create_multipart(s3, w->mp_key, w->base.content_type, w->upload_id, sizeof w->upload_id,
                            &w->base.saved_errno, &err);
    }
    if (rc == 0)
      rc = upload_part(s3, w, index, (uint64_t)index * s3->part_size, s3->part_size, &err);
    pthread_mutex_lock(&s3->lock);
    if (rc < 0) {
      w->failed = 1;
      w->fail_errno = w->base.saved_errno ? w->base.saved_errno : EIO;
      snprintf(w->fail_msg, sizeof w->fail_msg, "%s", err.msg);
    } else {
      w->nparts++;
      uncount(w, s3->part_size);
      pthread_cond_broadcast(&w->done_cv); /* a paused writer may go on */
    }
  }
}

static void *part_worker(void *arg) {
  struct s3_store *s3 = arg;
  pthread_mutex_lock(&s3->lock);
  for (;;) {
    while (!s3->queue_head && !s3->stopping) pthread_cond_wait(&s3->cv, &s3->lock);
    if (!s3->queue_head) break;
    struct s3_writer *w = s3->queue_head;
    s3->queue_head = w->next;
    if (!s3->queue_head) s3->queue_tail = NULL;
    w->queued = 0;
    w->in_flight = 1;
    send_ready_parts(s3, w);
    w->in_flight = 0;
    if (w->abandoned) { /* the upload was dropped while a part was on its way */
      pthread_mutex_unlock(&s3->lock);
      abort_multipart(s3, w);
      writer_free(w);
      pthread_mutex_lock(&s3->lock);
      continue;
    }
    pthread_cond_broadcast(&w->done_cv);
  }
  pthread_mutex_unlock(&s3->lock);
  return NULL;
}

/* Queues w for a worker (lock held). */
static void enqueue(struct s3_store *s3, struct s3_writer *w) {
  if (w->queued || w->in_flight) return;
  w->queued = 1;
  w->next = NULL;
  if (s3->queue_tail)
    s3->queue_tail->next = w;
  else
    s3->queue_head = w;
  s3->queue_tail = w;
  pthread_cond_signal(&s3->cv);
}

/* ---- the store --------------------------------------------------------------------------------
 */

static int mkdir_p(const char *path) {
  char buf[PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      if (mkdir(buf, 0700) < 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(buf, 0700) < 0 && errno != EEXIST ? -1 : 0;
}

/* Removes spool files of processes that are gone (a crash mid-upload). */
static void clean_spool(struct s3_store *s3) {
  DIR *d = opendir(s3->spool_dir);
  if (!d) return;
  for (struct dirent *e = readdir(d); e; e = readdir(d)) {
    int pid = 0;
    if (sscanf(e->d_name, "up-%d-", &pid) != 1 || pid <= 0) continue;
    if (pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
    unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

static enum br_direct_mode direct_mode_at_open(br_store *st, struct s3_store *s3);

static int s3_open(br_store *st, br_err *err) {
  struct s3_store *s3 = calloc(1, sizeof *s3);
  if (!s3) return br_fail(err, "out of memory");
  const br_store_config *c = &st->cfg;
  s3_target_options o = {.name = c->name,
                         .endpoint = c->endpoint,
                         .region = c->region,
                         .bucket = c->bucket,
                         .access_key = c->access_key,
                         .secret_key = c->secret_key,
                         .session_token = c->session_token,
                         .path_style = c->path_style,
                         .connect_timeout_ms = c->connect_timeout_ms,
                         .timeout_ms = c->timeout_ms,
                         .stall_ms = c->stall_timeout_ms,
                         .max_retries = (unsigned)c->retries};
  if (s3_target_init(&s3->t, &o, err) < 0) {
    free(s3);
    return -1;
  }
  s3->part_size = c->part_size ? c->part_size : 16u << 20;
  s3->spool_max = c->spool_max ? c->spool_max : 256u << 20;
  s3->spool_max_total = c->spool_max_total ? c->spool_max_total : 1u << 30;
  s3->aborts = calloc(MAX_FAILED_ABORTS, sizeof *s3->aborts);
  int presigns = c->serve == BR_SERVE_REDIRECT && !(c->cdn_url && *c->cdn_url);
  if (presigns) s3->urls = s3_url_cache_new(PRESIGN_CACHE);
  if (!s3->aborts || (presigns && !s3->urls)) {
    s3_url_cache_free(s3->urls);
    free(s3->aborts);
    s3_target_destroy(&s3->t);
    free(s3);
    return br_fail(err, "out of memory");
  }
  snprintf(s3->spool_dir, sizeof s3->spool_dir, "%s", c->spool_dir ? c->spool_dir : "");
  pthread_mutex_init(&s3->lock, NULL);
  pthread_cond_init(&s3->cv, NULL);
  st->impl = s3;
  if (c->read_only || !*s3->spool_dir) return 0; /* tools that only read: no spool, no workers */
  if (mkdir_p(s3->spool_dir) < 0) {
    br_fail(err, "store %s: cannot create spool_dir %s: %s", c->name, s3->spool_dir,
            strerror(errno));
    s3_target_destroy(&s3->t);
    s3_url_cache_free(s3->urls);
    free(s3->aborts);
    free(s3);
    return -1;
  }
  clean_spool(s3);
  s3->direct = direct_mode_at_open(st, s3);
  for (; s3->nworkers < PART_WORKERS; s3->nworkers++)
    if (pthread_create(&s3->workers[s3->nworkers], NULL, part_worker, s3)) break;
  return 0;
}

static void s3_close(br_store *st) {
  struct s3_store *s3 = s3_of(st);
  pthread_mutex_lock(&s3->lock);
  s3->stopping = 1;
  pthread_cond_broadcast(&s3->cv);
  pthread_mutex_unlock(&s3->lock);
  for (int i = 0; i < s3->nworkers; i++) pthread_join(s3->workers[i], NULL);
  s3_target_destroy(&s3->t);
  s3_url_cache_free(s3->urls);
  free(s3->aborts);
  free(s3);
}

static br_store_writer *s3_write_begin(br_store *st, br_err *err) {
  struct s3_store *s3 = s3_of(st);
  if (!s3->nworkers) {
    br_fail(err, "store %s: opened read-only", st->cfg.name);
    return NULL;
  }
  if (s3_target_down(&s3->t)) {
    errno = EHOSTUNREACH;
    br_fail(err, "store %s: %s is unreachable", st->cfg.name, s3->t.host);
    return NULL;
  }
  pthread_mutex_lock(&s3->lock);
  uint64_t spooled = s3->spooled, total = atomic_load(&spooled_total);
  pthread_mutex_unlock(&s3->lock);
  /* a new upload needs room for a chunk or two before its first part can go */
  if (spooled + BACKLOG_SLACK >= s3->spool_max || total + BACKLOG_SLACK >= s3->spool_max_total) {
    br_warn("store %s: upload refused: %" PRIu64 " bytes spooled for S3 (spool_max %" PRIu64
            "), %" PRIu64 " in all (spool_max_total %" PRIu64 ")",
            st->cfg.name, spooled, s3->spool_max, total, s3->spool_max_total);
    errno = EBUSY;
    br_fail(err, "store %s: the upload spool is full (S3 is slower than the uploads); retry later",
            st->cfg.name);
    return NULL;
  }
  struct s3_writer *w = calloc(1, sizeof *w);
  if (!w || !(w->parts = calloc(MAX_PARTS, sizeof *w->parts))) {
    free(w);
    br_fail(err, "out of memory");
    return NULL;
  }
  w->base.store = st;
  w->s3 = s3;
  pthread_cond_init(&w->done_cv, NULL);
  for (int attempt = 0; attempt < 8; attempt++) {
    uint64_t r = ((uint64_t)random() << 31) ^ (uint64_t)random() ^ br_now_ms();
    snprintf(w->spool_path, sizeof w->spool_path, "%s/up-%d-%016llx", s3->spool_dir, (int)getpid(),
             (unsigned long long)r);
    w->fd = open(w->spool_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (w->fd >= 0 || errno != EEXIST) break;
  }
  if (w->fd < 0) {
    int e = errno;
    br_fail(err, "store %s: create spool file: %s", st->cfg.name, strerror(e));
    free(w->parts);
    pthread_cond_destroy(&w->done_cv);
    free(w);
    errno = e;
    return NULL;
  }
  return &w->base;
}

static int s3_write(br_store_writer *bw, const void *buf, size_t len, br_err *err) {
  struct s3_writer *w = (struct s3_writer *)bw;
  struct s3_store *s3 = w->s3;
  const char *p = buf;
  size_t left = len;
  pthread_mutex_lock(&s3->lock);
  int full =
      s3->spooled + len > s3->spool_max || atomic_load(&spooled_total) + len > s3->spool_max_total;
  if (full) {
    br_warn("store %s: upload cut: the spool is full (%" PRIu64
            " bytes of this store waiting for "
            "S3)",
            bw->store->cfg.name, s3->spooled);
  } else {
    w->counted += len; /* counted before the bytes land: the caps are never passed */
    s3->spooled += len;
    atomic_fetch_add(&spooled_total, len);
  }
  pthread_mutex_unlock(&s3->lock);
  if (full) {
    bw->saved_errno = EBUSY;
    return br_fail(err,
                   "store %s: the upload spool is full (S3 is slower than the uploads); "
                   "retry later",
                   bw->store->cfg.name);
  }
  while (left) {
    ssize_t n = pwrite(w->fd, p, left, (off_t)w->written + (off_t)(len - left));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      bw->saved_errno = errno;
      return br_fail(err, "store %s: spool write: %s", bw->store->cfg.name, strerror(errno));
    }
    p += n;
    left -= (size_t)n;
  }
  pthread_mutex_lock(&s3->lock);
  w->written += len;
  int failed = w->failed;
  if (failed) {
    bw->saved_errno = w->fail_errno;
    br_fail(err, "%s", w->fail_msg);
  } else if (w->nparts < sendable_parts(w)) {
    enqueue(s3, w);
  }
  pthread_mutex_unlock(&s3->lock);
  return failed ? -1 : 0;
}

/* 1 when w holds about two unsent parts (and has not failed): its feeder should pause. With
 * wait, blocks until that is no longer so instead (for callers off the network threads). */
static int s3_write_backlogged(br_store_writer *bw, int wait) {
  struct s3_writer *w = (struct s3_writer *)bw;
  struct s3_store *s3 = w->s3;
  uint64_t bound = 2 * s3->part_size - BACKLOG_SLACK;
  pthread_mutex_lock(&s3->lock);
  while (wait && !w->failed && w->counted >= bound && !s3->stopping)
    pthread_cond_wait(&w->done_cv, &s3->lock);
  int backlogged = !w->failed && w->counted >= bound;
  pthread_mutex_unlock(&s3->lock);
  return backlogged;
}

uint64_t br_store_spooled_bytes(void) { return atomic_load(&spooled_total); }

/* Waits until no worker holds w (lock held). */
static void wait_idle(struct s3_store *s3, struct s3_writer *w) {
  while (w->queued || w->in_flight) pthread_cond_wait(&w->done_cv, &s3->lock);
}

static void s3_write_abort(br_store_writer *bw) {
  struct s3_writer *w = (struct s3_writer *)bw;
  struct s3_store *s3 = w->s3;
  pthread_mutex_lock(&s3->lock);
  w->abandoned = 1;
  if (w->queued || w->in_flight || w->upload_id[0]) {
    /* a worker finishes or aborts the multipart upload and frees w: this may be a network
     * thread, which must not wait for S3 */
    enqueue(s3, w);
    pthread_mutex_unlock(&s3->lock);
    return;
  }
  pthread_mutex_unlock(&s3->lock);
  writer_free(w);
}

static int put_single(struct s3_store *s3, struct s3_writer *w, const char *key, br_err *err) {
  char hex[65], b64[48];
  if (w->base.has_digest) {
    br_hex_encode(w->base.digest, hex);
    EVP_EncodeBlock((unsigned char *)b64, w->base.digest, 32);
  } else if (hash_range(w->fd, 0, w->written, hex, b64, err) < 0) {
    return -1;
  }
  s3_request rq = {.method = "PUT",
                   .key = key,
                   .payload_hash = hex,
                   .body = {.fd = w->fd, .off = 0, .len = w->written}};
  rq.headers[rq.nheaders++] = (br_sigv4_header){"x-amz-checksum-sha256", b64};
  if (w->base.content_type[0]) /* S3 answers GETs with it (else binary/octet-stream) */
    rq.headers[rq.nheaders++] = (br_sigv4_header){"content-type", w->base.content_type};
  s3_response rs;
  int rc = s3_perform(&s3->t, &rq, &rs, err);
  if (rc == 0 && rs.status != 200) rc = s3_fail_status(err, &s3->t, "PutObject", &rs);
  if (rc < 0) w->base.saved_errno = request_errno(&rs);
  s3_response_free(&rs);
  return rc;
}

/* CompleteMultipartUpload of w's parts under w->mp_key. */
static int complete_multipart(struct s3_store *s3, struct s3_writer *w, br_err *err) {
  size_t cap = w->nparts * 220 + 128;
  char *xml = malloc(cap);
  if (!xml) return br_fail(err, "out of memory");
  size_t used = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
  for (size_t i = 0; i < w->nparts; i++)
    used += (size_t)snprintf(xml + used, cap - used,
                             "<Part><PartNumber>%zu</PartNumber><ETag>%s</ETag>"
                             "<ChecksumSHA256>%s</ChecksumSHA256></Part>",
                             i + 1, w->parts[i].etag, w->parts[i].sha_b64);
  used += (size_t)snprintf(xml + used, cap - used, "</CompleteMultipartUpload>");
  uint8_t d[32];
  char hex[65], query[1700], idenc[1600];
  EVP_Digest(xml, used, d, NULL, EVP_sha256(), NULL);
  br_hex_encode(d, hex);
  br_sigv4_uri_encode(w->upload_id, 0, idenc, sizeof idenc);
  snprintf(query, sizeof query, "uploadId=%s", idenc);
  s3_request rq = {.method = "POST",
                   .key = w->mp_key,
                   .query = query,
                   .payload_hash = hex,
                   .body = {.mem = xml, .len = used}};
  s3_response rs;
  int rc = s3_perform(&s3->t, &rq, &rs, err);
  /* S3 may answer 200 with an error document when completion fails late */
  if (rc == 0 && (rs.status != 200 || (rs.body && strstr(rs.body, "<Error>"))))
    rc = s3_fail_status(err, &s3->t, "CompleteMultipartUpload", &rs);
  if (rc < 0) w->base.saved_errno = request_errno(&rs);
  s3_response_free(&rs);
  free(xml);
  if (rc == 0) w->upload_id[0] = '\0'; /* completed: nothing to abort any more */
  return rc;
}

static int delete_object(struct s3_store *s3, const char *key, br_err *err);
static int server_copy(struct s3_store *s3, const char *src_key, uint64_t size, const char *dst_key,
                       br_err *err);

static int s3_write_commit(br_store_writer *bw, const char *key, br_err *err) {
  struct s3_writer *w = (struct s3_writer *)bw;
  struct s3_store *s3 = w->s3;
  pthread_mutex_lock(&s3->lock);
  wait_idle(s3, w);
  int failed = w->failed;
  pthread_mutex_unlock(&s3->lock);
  int rc = 0;
  if (failed) {
    bw->saved_errno = w->fail_errno;
    rc = br_fail(err, "%s", w->fail_msg);
  } else if (!w->upload_id[0] && w->written <= s3->part_size) {
    rc = put_single(s3, w, key, err);
  } else {
    /* the rest of the parts, from this (finisher) thread */
    size_t total = (size_t)((w->written + s3->part_size - 1) / s3->part_size);
    if (total > MAX_PARTS)
      rc = br_fail(err,
                   "store %s: the blob needs over %d parts of %" PRIu64 " bytes (raise part_size)",
                   s3->t.name, MAX_PARTS, s3->part_size);
    if (rc == 0 && !w->upload_id[0]) {
      choose_mp_key(w);
      rc = create_multipart(s3, w->mp_key, bw->content_type, w->upload_id, sizeof w->upload_id,
                            &bw->saved_errno, err);
    }
    for (size_t i = w->nparts; rc == 0 && i < total; i++) {
      uint64_t off = (uint64_t)i * s3->part_size;
      uint64_t len = w->written - off < s3->part_size ? w->written - off : s3->part_size;
      rc = upload_part(s3, w, i, off, len, err);
      if (rc == 0) w->nparts++;
    }
    if (rc == 0)
      rc = complete_multipart(s3, w, err);
    else
      abort_multipart(s3, w);
    if (rc == 0 && strcmp(w->mp_key, key)) {
      /* completed under a staging key (the hash was not known in advance): copy it server-side
       * to its content key, then drop the staging object */
      rc = server_copy(s3, w->mp_key, w->written, key, err);
      if (rc < 0 && !bw->saved_errno) bw->saved_errno = EPROTO;
      br_err derr;
      if (delete_object(s3, w->mp_key, &derr) < 0)
        br_warn("%s (staging object left behind)", derr.msg);
    }
  }
  int saved = bw->saved_errno;
  writer_free(w);
  errno = saved ? saved : EIO;
  return rc;
}

/* ---- reading ----------------------------------------------------------------------------------
 */

static int delete_object(struct s3_store *s3, const char *key, br_err *err) {
  s3_request rq = {.method = "DELETE", .key = key, .query = ""};
  s3_response rs;
  int rc = s3_perform(&s3->t, &rq, &rs, err);
  if (rc == 0 && rs.status != 204 && rs.status != 200 && rs.status != 404)
    rc = s3_fail_status(err, &s3->t, "DeleteObject", &rs);
  s3_response_free(&rs);
  return rc;
}

/* HEAD of key: 0 with *size, 1 if absent, -1 on error. */
static int head_object(struct s3_store *s3, const char *key, uint64_t *size, br_err *err) {
  s3_request rq = {.method = "HEAD", .key = key, .query = ""};
  s3_response rs;
  int rc = s3_perform(&s3->t, &rq, &rs, err);
  if (rc == 0) {
    if (rs.status == 404)
      rc = 1;
    else if (rs.status != 200 || rs.content_length == UINT64_MAX)
      rc = s3_fail_status(err, &s3->t, "HeadObject", &rs);
    else
      *size = rs.content_length;
  }
  s3_response_free(&rs);
  return rc;
}

struct object_source {
  br_source base;
  struct s3_store *s3;
  char key[1100];
};

static int object_pread(br_source *src, void *buf, size_t len, uint64_t off, br_err *err) {
  struct object_source *os = (struct object_source *)src;
  if (off > src->size || len > src->size - off)
    return br_fail(err, "%s: read of %zu bytes at %" PRIu64 " is past the end (%" PRIu64 " bytes)",
                   os->key, len, off, src->size);
  if (!len) return 0;
  s3_request rq = {.method = "GET",
                   .key = os->key,
                   .query = "",
                   .has_range = 1,
                   .range_first = off,
                   .range_last = off + len - 1,
                   .into = buf,
                   .into_cap = len};
  s3_response rs;
  int rc = s3_perform(&os->s3->t, &rq, &rs, err);
  if (rc == 0 && rs.status != 206 && !(rs.status == 200 && off == 0 && len == src->size))
    rc = s3_fail_status(err, &os->s3->t, os->key, &rs);
  if (rc == 0 && rs.body_len != len)
    rc = br_fail(err, "store %s: %s: %zu bytes at %" PRIu64 " came back as %zu (object changed?)",
                 os->s3->t.name, os->key, len, off, rs.body_len);
  s3_response_free(&rs);
  return rc;
}

static void object_close(br_source *src) { free(src); }

static int s3_open_read(br_store *st, const char *key, br_store_reader *out, br_err *err) {
  struct s3_store *s3 = s3_of(st);
  uint64_t size = 0;
  int rc = head_object(s3, key, &size, err);
  if (rc != 0) return rc;
  struct object_source *os = calloc(1, sizeof *os);
  if (!os) return br_fail(err, "out of memory");
  os->base.size = size;
  os->base.pread = object_pread;
  os->base.close = object_close;
  os->s3 = s3;
  snprintf(os->key, sizeof os->key, "%s", key);
  out->fd = -1;
  out->size = size;
  out->source = &os->base;
  return 0;
}

static int s3_stat(br_store *st, const char *key, uint64_t *size, br_err *err) {
  return head_object(s3_of(st), key, size, err);
}

/* A streamed whole-object GET hashed as it arrives (s3_hash). */
struct hash_sink {
  EVP_MD_CTX *ctx;
  uint64_t n, max; /* bytes hashed; more than max (the expected size) stops the transfer */
};

static void hash_sink_reset(void *ud) {
  struct hash_sink *h = ud;
  EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL);
  h->n = 0;
}

static int hash_sink_take(void *ud, const char *data, size_t n) {
  struct hash_sink *h = ud;
  h->n += n;
  if (h->n > h->max) return 0; /* not the blob: no need to read a larger object to its end */
  return EVP_DigestUpdate(h->ctx, data, n) == 1;
}

/* The SHA-256 and size of key from one GET streamed through the digest (curl's buffer only:
 * memory bounded whatever the size; a retry starts the digest over). expect (a HEAD when 0) sets
 * the time budget, and an object longer than it is read no further: 0 with a *size over expect
 * (out is then not its digest). A body shorter than its Content-Length is a transfer error.
 * Returns 0, 1 if absent, -1 with err. */
static int s3_hash(br_store *st, const char *key, uint64_t expect, uint8_t out[BR_SHA256_LEN],
                   uint64_t *size, br_err *err) {
  struct s3_store *s3 = s3_of(st);
  if (!expect) {
    int hrc = head_object(s3, key, &expect, err);
    if (hrc) return hrc;
  }
  struct hash_sink h = {.ctx = EVP_MD_CTX_new(), .max = expect};
  if (!h.ctx) return br_fail(err, "out of memory");
  s3_request rq = {.method = "GET",
                   .key = key,
                   .query = "",
                   .sink = hash_sink_take,
                   .sink_reset = hash_sink_reset,
                   .sink_ud = &h,
                   .sink_len = expect};
  s3_response rs;
  int rc = s3_perform(&s3->t, &rq, &rs, err);
  if (rc < 0 && rs.sink_stopped && h.n > h.max) {
    rc = 0; /* longer than expected: the caller sees the size */
  } else if (rc == 0) {
    if (rs.status == 404)
      rc = 1;
    else if (rs.status != 200)
      rc = s3_fail_status(err, &s3->t, "GetObject", &rs);
    else if (rs.content_length != UINT64_MAX && rs.content_length != h.n)
      rc = br_fail(err, "store %s: %s: %" PRIu64 " of %" PRIu64 " bytes came back", s3->t.name, key,
                   h.n, rs.content_length);
  }
  if (rc == 0) {
    EVP_DigestFinal_ex(h.ctx, out, NULL);
    *size = h.n;
  }
  s3_response_free(&rs);
  EVP_MD_CTX_free(h.ctx);
  return rc;
}

/* The signed query parameter that makes S3 answer a presigned GET as a download. */
#define ATTACHMENT_QUERY "response-content-disposition=attachment"

static int s3_redirect_url(br_store *st, const char *key, int attachment, const char *content_type,
                           char *out, size_t outlen, uint64_t *valid_ms, br_err *err) {
  const char *cdn = st->cfg.cdn_url;
  if (cdn && *cdn) {
    if (attachment) return 1; /* S3 honours response-* parameters only on signed requests */
    char enc[3200];
    if (!br_sigv4_uri_encode(key, 1, enc, sizeof enc)) return br_fail(err, "key too long");
    size_t clen = strlen(cdn);
    int n = snprintf(out, outlen, "%s%s%s", cdn, clen && cdn[clen - 1] == '/' ? "" : "/", enc);
    if (n < 0 || (size_t)n >= outlen) return br_fail(err, "redirect URL too long");
    *valid_ms = UINT64_MAX;
    return 0;
  }
  /* a URL signed less than half a TTL ago is reused: *valid_ms is what is left of it */
  uint64_t ttl_s = st->cfg.presign_ttl_ms / 1000;
  if (ttl_s < 1) ttl_s = 1;
  struct s3_store *s3 = s3_of(st);
  /* the record's type, signed: objects written without one would answer binary/octet-stream.
   * Parameters in name order; the URL cache is keyed by this query, so each type has its own. */
  char query[64 + 3 * 256] = "";
  size_t qlen = 0;
  if (attachment) qlen = (size_t)snprintf(query, sizeof query, "%s", ATTACHMENT_QUERY);
  if (content_type && *content_type) {
    char enc[3 * 256 + 1];
    if (strlen(content_type) > 255 || !br_sigv4_uri_encode(content_type, 0, enc, sizeof enc))
      return br_fail(err, "content type too long for a presigned URL");
    snprintf(query + qlen, sizeof query - qlen, "%sresponse-content-type=%s", qlen ? "&" : "", enc);
  }
  return s3_url_cache_presign(s3->urls, &s3->t, key, query, br_now_ms(), ttl_s, out, outlen,
                              valid_ms, err);
}

static int s3_fetch_url(br_store *st, const char *key, char *out, size_t outlen, br_err *err) {
  /* long enough for the slowest proxied read to start; the URL never leaves this process */
  return s3_presign_get(&s3_of(st)->t, key, 3600, out, outlen, err);
}

static int s3_remove(br_store *st, const char *key, br_err *err) {
  return delete_object(s3_of(st), key, err);
}

/* DeleteObjects of keys[0..count), 1,000 at most (S3's limit), Quiet mode: only failures are
 * listed. A request that fails or whose answer is not a well-formed DeleteResult counts as failed
 * whole (every failed[i] set: its keys may still be there). Returns 0 when every key went, -1
 * with err set otherwise. */
static int delete_batch(struct s3_store *s3, const char *const *bk, size_t count, uint8_t *bf,
                        br_err *e) {
  memset(bf, 0, count);
  size_t cap = 128;
  for (size_t i = 0; i < count; i++) cap += strlen(bk[i]) * 5 + 32;
  char *xml = malloc(cap);
  if (!xml) {
    memset(bf, 1, count);
    return br_fail(e, "out of memory");
  }
  size_t used = (size_t)snprintf(xml, cap, "<Delete><Quiet>true</Quiet>");
  for (size_t i = 0; i < count; i++) {
    used += (size_t)snprintf(xml + used, cap - used, "<Object><Key>");
    for (const char *k = bk[i]; *k; k++) {
      const char *ent = *k == '&' ? "&amp;" : *k == '<' ? "&lt;" : *k == '>' ? "&gt;" : NULL;
      if (ent)
        used += (size_t)snprintf(xml + used, cap - used, "%s", ent);
      else
        xml[used++] = *k;
    }
    used += (size_t)snprintf(xml + used, cap - used, "</Key></Object>");
  }
  used += (size_t)snprintf(xml + used, cap - used, "</Delete>");
  uint8_t d[32], md5[16];
  char hex[65], md5b64[32];
  EVP_Digest(xml, used, d, NULL, EVP_sha256(), NULL);
  EVP_Digest(xml, used, md5, NULL, EVP_md5(), NULL);
  br_hex_encode(d, hex);
  EVP_EncodeBlock((unsigned char *)md5b64, md5, 16);
  s3_request rq = {.method = "POST",
                   .key = NULL,
                   .query = "delete=",
                   .payload_hash = hex,
                   .body = {.mem = xml, .len = used}};
  rq.headers[rq.nheaders++] = (br_sigv4_header){"content-md5", md5b64};
  rq.headers[rq.nheaders++] = (br_sigv4_header){"content-type", "application/xml"};
  s3_response rs;
  int rc = s3_perform(&s3->t, &rq, &rs, e);
  free(xml);
  if (rc == 0 && rs.status != 200) rc = s3_fail_status(e, &s3->t, "DeleteObjects", &rs);
  if (rc == 0) {
    char why[1024];
    int nf = s3_parse_delete_result(rs.body ? rs.body : "", rs.body ? rs.body_len : 0, bk, count,
                                    bf, why, sizeof why);
    if (nf < 0) {
      rc = br_fail(e, "store %s: DeleteObjects: answer refused: %s", s3->t.name, why);
      br_warn("%s", e->msg);
    } else if (nf > 0) {
      br_fail(e, "store %s: DeleteObjects: %d key(s) failed, first %s", s3->t.name, nf, why);
      s3_response_free(&rs);
      return -1;
    }
  }
  if (rc < 0) memset(bf, 1, count);
  s3_response_free(&rs);
  return rc;
}

/* One br_store_delete_many call's batches, taken in order by up to DELETE_INFLIGHT threads. */
struct delete_run {
  struct s3_store *s3;
  const char *const *keys;
  uint8_t *failed;
  size_t n, nbatches;
  atomic_size_t next;
  pthread_mutex_t lock;
  size_t first_failed; /* the lowest failed batch (nbatches: none yet), and its error */
  br_err first_err;
};

/* Sends batches until none is left; remembers the error of the lowest batch that failed. */
static void *delete_worker(void *arg) {
  struct delete_run *dr = arg;
  for (size_t b; (b = atomic_fetch_add(&dr->next, 1)) < dr->nbatches;) {
    size_t base = b * DELETE_BATCH_KEYS;
    size_t count = dr->n - base < DELETE_BATCH_KEYS ? dr->n - base : DELETE_BATCH_KEYS;
    br_err e;
    if (delete_batch(dr->s3, dr->keys + base, count, dr->failed + base, &e) < 0) {
      pthread_mutex_lock(&dr->lock);
      if (b < dr->first_failed) {
        dr->first_failed = b;
        dr->first_err = e;
      }
      pthread_mutex_unlock(&dr->lock);
    }
  }
  return NULL;
}

/* DeleteObjects in batches of 1,000 keys, up to DELETE_INFLIGHT requests at a time (threads of
 * this call, each with its own connection; one batch needs none). A failed batch does not stop
 * the others; err names the failure of the lowest batch that had one. */
static int s3_remove_many(br_store *st, const char *const *keys, size_t n, uint8_t *failed,
                          br_err *err) {
  struct delete_run dr = {.s3 = s3_of(st), .keys = keys, .failed = failed, .n = n};
  dr.nbatches = (n + DELETE_BATCH_KEYS - 1) / DELETE_BATCH_KEYS;
  dr.first_failed = dr.nbatches;
  atomic_init(&dr.next, 0);
  pthread_mutex_init(&dr.lock, NULL);
  pthread_t th[DELETE_INFLIGHT - 1];
  size_t nth = 0;
  while (nth < DELETE_INFLIGHT - 1 && nth + 1 < dr.nbatches &&
         pthread_create(&th[nth], NULL, delete_worker, &dr) == 0)
    nth++;
  delete_worker(&dr); /* this thread sends too */
  for (size_t i = 0; i < nth; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&dr.lock);
  if (dr.first_failed == dr.nbatches) return 0;
  if (err) *err = dr.first_err;
  return -1;
}

/* ListObjectsV2, 1,000 keys a page, in key order. */
static int s3_list(br_store *st, const char *prefix, br_store_list_fn fn, void *ud, br_err *err) {
  struct s3_store *s3 = s3_of(st);
  char token[1200] = "", penc[3200], tenc[3700], query[7200];
  if (!br_sigv4_uri_encode(prefix ? prefix : "", 0, penc, sizeof penc) && prefix && *prefix)
    return br_fail(err, "prefix too long");
  for (;;) {
    if (token[0] && !br_sigv4_uri_encode(token, 0, tenc, sizeof tenc))
      return br_fail(err, "continuation token too long");
    snprintf(query, sizeof query, "list-type=2&max-keys=1000&prefix=%s%s%s",
             prefix && *prefix ? penc : "", token[0] ? "&continuation-token=" : "",
             token[0] ? tenc : "");
    s3_request rq = {.method = "GET", .key = NULL, .query = query};
    s3_response rs;
    if (s3_perform(&s3->t, &rq, &rs, err) < 0) return -1;
    if (rs.status != 200) {
      int rc = s3_fail_status(err, &s3->t, "ListObjectsV2", &rs);
      s3_response_free(&rs);
      return rc;
    }
    int stop = 0;
    const char *at = rs.body;
    while (!stop && at && (at = strstr(at, "<Contents>"))) {
      const char *end = strstr(at, "</Contents>");
      if (!end) break;
      char key[1100], size[32];
      /* look inside this <Contents> element only */
      size_t elen = (size_t)(end - at);
      char *elem = strndup(at, elen);
      if (elem && s3_xml_text(elem, "Key", NULL, key, sizeof key) == 0 &&
          s3_xml_text(elem, "Size", NULL, size, sizeof size) == 0)
        stop = fn(ud, key, strtoull(size, NULL, 10));
      free(elem);
      at = end;
    }
    char truncated[8] = "false";
    s3_xml_text(rs.body, "IsTruncated", NULL, truncated, sizeof truncated);
    token[0] = '\0';
    s3_xml_text(rs.body, "NextContinuationToken", NULL, token, sizeof token);
    s3_response_free(&rs);
    if (stop || strcmp(truncated, "true") || !token[0]) return 0;
  }
}

/* CopyObject (up to 5 GiB) or a multipart copy in 1 GiB parts, within this store's bucket. */
static int server_copy(struct s3_store *s3, const char *src_key, uint64_t size, const char *dst_key,
                       br_err *err) {
  char src[3400];
  char enc[3200];
  if (!br_sigv4_uri_encode(src_key, 1, enc, sizeof enc)) return br_fail(err, "key too long");
  snprintf(src, sizeof src, "/%s/%s", s3->t.bucket, enc);
  if (size <= SINGLE_COPY_MAX) {
    s3_request rq = {.method = "PUT", .key = dst_key, .query = ""};
    rq.headers[rq.nheaders++] = (br_sigv4_header){"x-amz-copy-source", src};
    s3_response rs;
    int rc = s3_perform(&s3->t, &rq, &rs, err);
    if (rc == 0 && (rs.status != 200 || !rs.body || strstr(rs.body, "<Error>")))
      rc = s3_fail_status(err, &s3->t, "CopyObject", &rs);
    s3_response_free(&rs);
    return rc;
  }
  char upload_id[512], idenc[1600], query[1800], range[80];
  if (create_multipart(s3, dst_key, NULL, upload_id, sizeof upload_id, NULL, err) < 0) return -1;
  br_sigv4_uri_encode(upload_id, 0, idenc, sizeof idenc);
  size_t nparts = (size_t)((size + COPY_PART - 1) / COPY_PART);
  size_t cap = nparts * 160 + 128, used = 0;
  char *xml = malloc(cap);
  int rc = xml ? 0 : br_fail(err, "out of memory");
  if (rc == 0) used = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
  for (size_t i = 0; rc == 0 && i < nparts; i++) {
    uint64_t first = (uint64_t)i * COPY_PART;
    uint64_t last = first + COPY_PART - 1 < size - 1 ? first + COPY_PART - 1 : size - 1;
    snprintf(query, sizeof query, "partNumber=%zu&uploadId=%s", i + 1, idenc);
    snprintf(range, sizeof range, "bytes=%" PRIu64 "-%" PRIu64, first, last);
    s3_request rq = {.method = "PUT", .key = dst_key, .query = query};
    rq.headers[rq.nheaders++] = (br_sigv4_header){"x-amz-copy-source", src};
    rq.headers[rq.nheaders++] = (br_sigv4_header){"x-amz-copy-source-range", range};
    s3_response rs;
    char etag[80] = "";
    rc = s3_perform(&s3->t, &rq, &rs, err);
    if (rc == 0 && (rs.status != 200 || s3_xml_text(rs.body, "ETag", NULL, etag, sizeof etag) < 0))
      rc = s3_fail_status(err, &s3->t, "UploadPartCopy", &rs);
    s3_response_free(&rs);
    if (rc == 0)
      used +=
          (size_t)snprintf(xml + used, cap - used,
                           "<Part><PartNumber>%zu</PartNumber><ETag>%s</ETag></Part>", i + 1, etag);
  }
  if (rc == 0) {
    used += (size_t)snprintf(xml + used, cap - used, "</CompleteMultipartUpload>");
    uint8_t d[32];
    char hex[65];
    EVP_Digest(xml, used, d, NULL, EVP_sha256(), NULL);
    br_hex_encode(d, hex);
    snprintf(query, sizeof query, "uploadId=%s", idenc);
    s3_request rq = {.method = "POST",
                     .key = dst_key,
                     .query = query,
                     .payload_hash = hex,
                     .body = {.mem = xml, .len = used}};
    s3_response rs;
    rc = s3_perform(&s3->t, &rq, &rs, err);
    if (rc == 0 && (rs.status != 200 || (rs.body && strstr(rs.body, "<Error>"))))
      rc = s3_fail_status(err, &s3->t, "CompleteMultipartUpload", &rs);
    s3_response_free(&rs);
  }
  if (rc < 0) {
    snprintf(query, sizeof query, "uploadId=%s", idenc);
    s3_request rq = {.method = "DELETE", .key = dst_key, .query = query};
    s3_response rs;
    br_err aerr;
    s3_perform(&s3->t, &rq, &rs, &aerr);
    s3_response_free(&rs);
  }
  free(xml);
  return rc;
}

/* Server-side copy when both stores are buckets of the same endpoint and account. */
static int s3_copy_from(br_store *dst, const char *dst_key, br_store *src, const char *src_key,
                        br_err *err) {
  struct s3_store *d = s3_of(dst), *s = s3_of(src);
  if (strcmp(d->t.host, s->t.host) || strcmp(d->t.signer.access_key, s->t.signer.access_key))
    return 1;
  uint64_t size = 0;
  int rc = head_object(s, src_key, &size, err);
  if (rc != 0) return rc > 0 ? br_fail(err, "%s: %s: no such object", s->t.name, src_key) : -1;
  char enc[3200], source[3400];
  if (!br_sigv4_uri_encode(src_key, 1, enc, sizeof enc)) return br_fail(err, "key too long");
  snprintf(source, sizeof source, "/%s/%s", s->t.bucket, enc);
  if (!strcmp(d->t.bucket, s->t.bucket)) return server_copy(d, src_key, size, dst_key, err);
  if (size > SINGLE_COPY_MAX) return 1; /* stream it */
  s3_request rq = {.method = "PUT", .key = dst_key, .query = ""};
  rq.headers[rq.nheaders++] = (br_sigv4_header){"x-amz-copy-source", source};
  s3_response rs;
  rc = s3_perform(&d->t, &rq, &rs, err);
  if (rc == 0 && (rs.status != 200 || !rs.body || strstr(rs.body, "<Error>")))
    rc = s3_fail_status(err, &d->t, "CopyObject", &rs);
  s3_response_free(&rs);
  return rc;
}

/* HEAD of the bucket: reachable, credentials accepted, bucket present. */
static int s3_check(br_store *st, br_err *err) {
  struct s3_store *s3 = s3_of(st);
  /* an endpoint that accepts connections but does not answer (an overloaded or frozen server)
   * must fail the probe in seconds, not after the whole-request timeout (5 minutes) */
  s3_request rq = {.method = "HEAD",
                   .key = NULL,
                   .query = "",
                   .no_retry = 1,
                   .timeout_ms = 2 * s3->t.connect_timeout_ms};
  s3_response rs;
  atomic_store(&s3->t.down_until_ms, 0); /* a probe always goes out */
  int rc = s3_perform(&s3->t, &rq, &rs, err);
  if (rc == 0 && rs.status != 200) {
    if (rs.status == 404)
      rc = br_fail(err, "store %s: bucket %s does not exist", s3->t.name, s3->t.bucket);
    else if (rs.status == 403)
      rc = br_fail(err, "store %s: access to bucket %s denied (check the credentials)", s3->t.name,
                   s3->t.bucket);
    else
      rc = s3_fail_status(err, &s3->t, "HeadBucket", &rs);
  }
  s3_response_free(&rs);
  if (rc == 0) retry_failed_aborts(s3);
  return rc;
}

static int s3_unavailable(br_store *st) { return s3_target_down(&s3_of(st)->t); }

/* ---- direct uploads: presigned PUTs under content keys, and what the backend checks ----------
 */

#define PROBE_BODY "blobref direct-upload probe"

/* The signed headers of a direct PUT of digest: the checksum (base64), the content SHA-256 (hex),
 * If-None-Match: * (an existing object is never replaced) and x-amz-meta-blobref-sha256 (hex:
 * the object's mark that it came through such a URL, which a store enforcing only the content
 * SHA-256 keeps no other trace of). wrong_checksum / wrong_content sign another digest's value
 * instead (the startup probe). */
static void direct_headers(const uint8_t digest[BR_SHA256_LEN], const uint8_t *wrong_checksum,
                           const uint8_t *wrong_content, br_direct_put *out) {
  const uint8_t *c = wrong_checksum ? wrong_checksum : digest;
  const uint8_t *h = wrong_content ? wrong_content : digest;
  out->nheaders = 4;
  snprintf(out->headers[0].name, sizeof out->headers[0].name, "x-amz-checksum-sha256");
  EVP_EncodeBlock((unsigned char *)out->headers[0].value, c, BR_SHA256_LEN);
  snprintf(out->headers[1].name, sizeof out->headers[1].name, "x-amz-content-sha256");
  br_hex_encode(h, out->headers[1].value);
  snprintf(out->headers[2].name, sizeof out->headers[2].name, "If-None-Match");
  snprintf(out->headers[2].value, sizeof out->headers[2].value, "*");
  snprintf(out->headers[3].name, sizeof out->headers[3].name, "x-amz-meta-blobref-sha256");
  br_hex_encode(digest, out->headers[3].value);
}

static int presign_direct(struct s3_store *s3, const char *key, uint64_t ttl_s, br_direct_put *out,
                          br_err *err) {
  br_sigv4_header h[BR_DIRECT_HEADERS];
  for (size_t i = 0; i < out->nheaders; i++)
    h[i] = (br_sigv4_header){out->headers[i].name, out->headers[i].value};
  time_t now = time(NULL);
  out->expires_ms = ((uint64_t)now + ttl_s) * 1000;
  /* the canonical payload is the signed x-amz-content-sha256 (hex), as S3 and radosgw compute
   * it when the request carries that header */
  return s3_presign_at(&s3->t, "PUT", key, h, out->nheaders, out->headers[1].value, now, ttl_s,
                       out->url, sizeof out->url, err);
}

static size_t discard_body(char *p, size_t size, size_t n, void *ud) {
  (void)p;
  (void)ud;
  return size * n;
}

/* PUTs PROBE_BODY to key through a presigned URL whose checksum (wrong_content = 0) or content
 * SHA-256 (wrong_content = 1) header names other bytes. Returns 1 when the store refused it (a
 * 400) and a HEAD then finds no object at key, 2 when it refused it but an object is there (or
 * the HEAD had no answer: not a refusal to rely on), 0 when it took it, -1 when there was no
 * usable answer. An object the probe left is deleted. */
static int probe_put(struct s3_store *s3, const char *key, int wrong_content, br_err *err) {
  uint8_t digest[BR_SHA256_LEN], wrong[BR_SHA256_LEN];
  EVP_Digest(PROBE_BODY, strlen(PROBE_BODY), digest, NULL, EVP_sha256(), NULL);
  EVP_Digest("other bytes", 11, wrong, NULL, EVP_sha256(), NULL);
  br_direct_put put;
  direct_headers(digest, wrong_content ? NULL : wrong, wrong_content ? wrong : NULL, &put);
  if (presign_direct(s3, key, 60, &put, err) < 0) return -1;
  CURL *c = curl_easy_init();
  struct curl_slist *hl = curl_slist_append(NULL, "Content-Type:");
  for (size_t i = 0; i < put.nheaders; i++) {
    char line[160];
    snprintf(line, sizeof line, "%s: %s", put.headers[i].name, put.headers[i].value);
    hl = curl_slist_append(hl, line);
  }
  int rc = -1;
  long status = 0;
  if (c && hl) {
    curl_easy_setopt(c, CURLOPT_URL, put.url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, PROBE_BODY);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(PROBE_BODY));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard_body);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, s3->t.connect_timeout_ms);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 4 * s3->t.connect_timeout_ms);
    CURLcode cc = curl_easy_perform(c);
    if (cc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK)
      br_fail(err, "store %s: direct-upload probe: %s", s3->t.name, curl_easy_strerror(cc));
    else if (status >= 200 && status < 300)
      rc = 0;
    else if (status == 400)
      rc = 1;
    else
      br_fail(err, "store %s: direct-upload probe: HTTP %ld", s3->t.name, status);
  } else {
    br_fail(err, "out of memory");
  }
  curl_slist_free_all(hl);
  if (c) curl_easy_cleanup(c);
  br_err derr;
  if (rc == 1) {
    uint64_t size = 0;
    int there = head_object(s3, key, &size, &derr);
    if (there == 0)
      br_warn("store %s: direct-upload probe: refused with HTTP 400, yet %s holds %" PRIu64
              " bytes: not relied on",
              s3->t.name, key, size);
    else if (there < 0)
      br_warn("%s (direct-upload probe: the refused PUT's key could not be checked)", derr.msg);
    if (there != 1) rc = 2;
  }
  if (rc != 1 && rc != -1 && delete_object(s3, key, &derr) < 0)
    br_warn("%s (probe object left)", derr.msg);
  return rc;
}

/* direct_uploads: off offers none; on offers presigned PUTs and re-hashes every object on commit;
 * auto probes the store once with two PUTs that each sign one wrong header (the checksum, then
 * the content SHA-256) and trusts single-part uploads when the store refused either and kept no
 * object: on the stored checksum when it enforces that (a HEAD on commit shows it), else on the
 * content SHA-256 (radosgw: the HEAD shows the URL's x-amz-meta-blobref-sha256, which only a PUT
 * whose body had that hash could have set). Multipart uploads are re-hashed whatever the probe
 * found. Both headers are probed and logged. */
static enum br_direct_mode direct_mode_at_open(br_store *st, struct s3_store *s3) {
  const char *want = st->cfg.direct_uploads ? st->cfg.direct_uploads : "off";
  if (!strcmp(want, "off") || st->cfg.read_only) return BR_DIRECT_NONE;
  if (!strcmp(want, "on")) return BR_DIRECT_REHASH;
  char key[1200];
  snprintf(key, sizeof key, "%s.direct-probe/%ld-%" PRIu64, st->cfg.prefix ? st->cfg.prefix : "",
           (long)getpid(), br_now_ms());
  br_err e1, e2;
  int checksum = probe_put(s3, key, 0, &e1);
  int content = probe_put(s3, key, 1, &e2);
  const char *word[] = {"not enforced", "enforced", "refused but stored", "unknown"};
  s3->direct_by_content = checksum != 1 && content == 1;
  br_info("store %s: direct uploads: x-amz-checksum-sha256 %s, x-amz-content-sha256 %s; %s",
          s3->t.name, word[checksum < 0 ? 3 : checksum], word[content < 0 ? 3 : content],
          checksum == 1  ? "single-part objects are trusted on x-amz-checksum-sha256 (a HEAD on "
                           "commit), multipart ones re-hashed"
          : content == 1 ? "single-part objects are trusted on x-amz-content-sha256 (a HEAD on "
                           "commit), multipart ones re-hashed"
                         : "objects are re-hashed on commit");
  if (checksum < 0) br_warn("%s", e1.msg);
  if (content < 0) br_warn("%s", e2.msg);
  return checksum == 1 || content == 1 ? BR_DIRECT_TRUSTED : BR_DIRECT_REHASH;
}

static enum br_direct_mode s3_direct_mode(const br_store *st) {
  return ((const struct s3_store *)st->impl)->direct;
}

static int s3_presign_put(br_store *st, const char *key, const uint8_t digest[BR_SHA256_LEN],
                          br_direct_put *out, br_err *err) {
  uint64_t ttl_s = st->cfg.presign_ttl_ms / 1000;
  if (ttl_s < 1) ttl_s = 1;
  direct_headers(digest, NULL, NULL, out);
  return presign_direct(s3_of(st), key, ttl_s, out, err);
}

/* A direct multipart upload under key: created without per-part checksums (the client's parts
 * carry a signed x-amz-content-sha256 each, and blobrefd re-hashes the whole object on commit). */
static int s3_multipart_begin(br_store *st, const char *key, const char *content_type,
                              char *upload_id, size_t idlen, br_err *err) {
  return create_multipart_as(s3_of(st), key, content_type, 0, upload_id, idlen, NULL, err);
}

static int s3_presign_part(br_store *st, const char *key, const char *upload_id, unsigned part,
                           const uint8_t part_digest[BR_SHA256_LEN], br_direct_put *out,
                           br_err *err) {
  struct s3_store *s3 = s3_of(st);
  uint64_t ttl_s = st->cfg.presign_ttl_ms / 1000;
  if (ttl_s < 1) ttl_s = 1;
  char idenc[1600], query[1700];
  if (!br_sigv4_uri_encode(upload_id, 0, idenc, sizeof idenc))
    return br_fail(err, "upload id too long");
  snprintf(query, sizeof query, "partNumber=%u&uploadId=%s", part, idenc);
  out->nheaders = 1;
  snprintf(out->headers[0].name, sizeof out->headers[0].name, "x-amz-content-sha256");
  br_hex_encode(part_digest, out->headers[0].value);
  br_sigv4_header h = {out->headers[0].name, out->headers[0].value};
  time_t now = time(NULL);
  out->expires_ms = ((uint64_t)now + ttl_s) * 1000;
  return s3_presign_query_at(&s3->t, "PUT", key, query, &h, 1, out->headers[0].value, now, ttl_s,
                             out->url, sizeof out->url, err);
}

/* S3's error code in an error document ("" when none). */
static void error_code(const char *body, char *code, size_t len) {
  code[0] = '\0';
  if (body) s3_xml_text(body, "Code", NULL, code, len);
}

static int s3_multipart_complete(br_store *st, const char *key, const char *upload_id,
                                 const char *const *etags, size_t n, br_err *err) {
  struct s3_store *s3 = s3_of(st);
  size_t cap = n * 160 + 128;
  for (size_t i = 0; i < n; i++) cap += strlen(etags[i]) * 6;
  char *xml = malloc(cap);
  if (!xml) return br_fail(err, "out of memory");
  size_t used = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
  for (size_t i = 0; i < n; i++) {
    used +=
        (size_t)snprintf(xml + used, cap - used, "<Part><PartNumber>%zu</PartNumber><ETag>", i + 1);
    for (const char *c = etags[i]; *c; c++) /* an ETag is quoted: escape it for XML */
      used += (size_t)snprintf(xml + used, cap - used, "%s",
                               *c == '"'   ? "&quot;"
                               : *c == '&' ? "&amp;"
                               : *c == '<' ? "&lt;"
                               : *c == '>' ? "&gt;"
                                           : (char[]){*c, 0});
    used += (size_t)snprintf(xml + used, cap - used, "</ETag></Part>");
  }
  used += (size_t)snprintf(xml + used, cap - used, "</CompleteMultipartUpload>");
  uint8_t d[32];
  char hex[65], query[1700], idenc[1600];
  EVP_Digest(xml, used, d, NULL, EVP_sha256(), NULL);
  br_hex_encode(d, hex);
  int rc = 0;
  if (!br_sigv4_uri_encode(upload_id, 0, idenc, sizeof idenc))
    rc = br_fail(err, "upload id too long");
  snprintf(query, sizeof query, "uploadId=%s", idenc);
  s3_request rq = {.method = "POST",
                   .key = key,
                   .query = query,
                   .payload_hash = hex,
                   .body = {.mem = xml, .len = used}};
  s3_response rs = {0};
  if (rc == 0) rc = s3_perform(&s3->t, &rq, &rs, err);
  int late = rc == 0 && rs.status == 200 && rs.body && strstr(rs.body, "<Error>");
  if (rc == 0 && (rs.status != 200 || late)) {
    char code[64];
    error_code(rs.body, code, sizeof code);
    if (!code[0]) snprintf(code, sizeof code, "%s", rs.code);
    /* the client's fault: an upload id S3 does not know, or parts that are not the ones sent */
    if (!strcmp(code, "NoSuchUpload") || !strcmp(code, "InvalidPart") ||
        !strcmp(code, "InvalidPartOrder") || !strcmp(code, "EntityTooSmall") || rs.status == 404)
      rc = (br_fail(err, "store %s: CompleteMultipartUpload: %s", s3->t.name,
                    code[0] ? code : "no such upload"),
            1);
    else
      rc = s3_fail_status(err, &s3->t, "CompleteMultipartUpload", &rs);
  }
  s3_response_free(&rs);
  free(xml);
  return rc;
}

static int s3_multipart_abort(br_store *st, const char *key, const char *upload_id, br_err *err) {
  return abort_upload(s3_of(st), key, upload_id, err);
}

/* HEAD with x-amz-checksum-mode: ENABLED: the size and, for a single-part object stored with
 * a SHA-256 checksum, that checksum (a multipart one is a composite "...-N": not the blob's).
 * On a store trusted on x-amz-content-sha256 instead, a single-part object's (ETag without "-")
 * x-amz-meta-blobref-sha256 stands for it: the direct URL signed it with the same digest as the
 * content SHA-256 the store checked the body against. */
static int s3_head_checksum(br_store *st, const char *key, uint64_t *size,
                            uint8_t sha[BR_SHA256_LEN], int *has_sha, br_err *err) {
  struct s3_store *s3 = s3_of(st);
  s3_request rq = {.method = "HEAD", .key = key, .query = ""};
  rq.headers[rq.nheaders++] = (br_sigv4_header){"x-amz-checksum-mode", "ENABLED"};
  s3_response rs;
  *has_sha = 0;
  int rc = s3_perform(&s3->t, &rq, &rs, err);
  if (rc == 0) {
    if (rs.status == 404)
      rc = 1;
    else if (rs.status != 200 || rs.content_length == UINT64_MAX)
      rc = s3_fail_status(err, &s3->t, "HeadObject", &rs);
    else
      *size = rs.content_length;
  }
  uint8_t raw[48];
  if (rc == 0 && strlen(rs.checksum_sha256) == 44 && !strchr(rs.checksum_sha256, '-') &&
      EVP_DecodeBlock(raw, (const unsigned char *)rs.checksum_sha256, 44) == 33) {
    memcpy(sha, raw, BR_SHA256_LEN); /* 44 base64 characters decode to 32 bytes and a pad */
    *has_sha = 1;
  } else if (rc == 0 && s3->direct_by_content && !strchr(rs.etag, '-') &&
             br_hex_decode(rs.meta_sha256, strlen(rs.meta_sha256), sha) == 0) {
    *has_sha = 1;
  }
  s3_response_free(&rs);
  return rc;
}

const struct store_ops br_store_s3_ops = {
    .kind = "s3",
    .open = s3_open,
    .close = s3_close,
    .write_begin = s3_write_begin,
    .write = s3_write,
    .write_commit = s3_write_commit,
    .write_abort = s3_write_abort,
    .write_backlogged = s3_write_backlogged,
    .open_read = s3_open_read,
    .stat = s3_stat,
    .redirect_url = s3_redirect_url,
    .remove = s3_remove,
    .list = s3_list,
    .fetch_url = s3_fetch_url,
    .remove_many = s3_remove_many,
    .check = s3_check,
    .unavailable = s3_unavailable,
    .copy_from = s3_copy_from,
    .direct_mode = s3_direct_mode,
    .presign_put = s3_presign_put,
    .multipart_begin = s3_multipart_begin,
    .presign_part = s3_presign_part,
    .multipart_complete = s3_multipart_complete,
    .multipart_abort = s3_multipart_abort,
    .head_checksum = s3_head_checksum,
    .hash = s3_hash,
};
