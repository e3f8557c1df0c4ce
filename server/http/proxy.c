/* Proxied reads from stores that are read over HTTP (S3, http origins) without ever blocking a
 * network thread: one thread runs a curl multi loop; each proxied request suspends its
 * connection until the origin's answer headers (or, for small blobs headed for the cache, the
 * whole body) arrived, then libmicrohttpd pulls the body from a bounded ring buffer, suspending
 * again whenever it runs dry. A full buffer pauses the origin transfer, so a slow client never
 * makes the server hold more than one buffer per request. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include "core/suspect.h"
#include "http/proxy.h"

/* Per request: the ring (origin bytes waiting for the client), curl's receive buffer and
 * libmicrohttpd's send block (768 KiB in all, was 336). Bigger chunks and waking the reader only
 * once READ_WAKE bytes wait (or the stream is complete), not for every chunk, mean fewer system
 * calls and thread hand-overs per byte: what a proxied read spends its CPU on besides the copies
 * and the hash. READ_WAKE + CURL_CHUNK <= RING_SIZE: a paused origin always wakes the reader. */
#define RING_SIZE (512u * 1024)
#define CURL_CHUNK (128L * 1024)
#define READ_WAKE (128u * 1024)
#define SEND_BLOCK (128u * 1024)

enum seg_kind { SEG_LITERAL, SEG_REMOTE };
struct segment {
  enum seg_kind kind;
  size_t lit_off, lit_len; /* into job->lits */
  uint64_t first, len;     /* remote bytes */
  int joins;               /* remote: read by the transfer of the remote segment before */
  uint64_t gap;            /* joins: bytes dropped between that segment's end and first */
};

struct proxy_job {
  pthread_mutex_t lock;
  struct MHD_Connection *conn;
  char url[4096];
  struct segment *segs;
  size_t nsegs, seg; /* segments, and the one being produced (engine side) */
  size_t lit_done;   /* bytes of the current literal already in the ring */
  uint64_t seg_got;  /* bytes of the current remote segment received */
  uint64_t gap_left; /* bytes still to drop before the current remote segment's */
  char *lits;
  /* the ring: bytes [head, head + len) modulo cap */
  char *ring;
  size_t cap, head, len;
  uint64_t total, produced; /* bytes of the whole stream, and put into the ring so far */
  int collect;              /* resume the handler only when everything arrived */
  long stall_s;             /* an origin moving no byte this long fails the read */
  int headers_seen;         /* the first remote answer's headers arrived */
  long status;              /* of the current remote answer */
  int failed, done;
  char error[256];
  int waiting_handler, waiting_reader; /* the connection is suspended for us */
  int body_started;                    /* body bytes went to libmicrohttpd already */
  int paused, blocked;                 /* origin paused / literal waiting for room */
  int unpause_queued;
  CURL *easy;
  struct curl_slist *headers;
  int refs;          /* request + response + a queued operation */
  int mhd_refs;      /* request + response: when none is left, the transfer is cancelled */
  int engine_active; /* the engine still knows the job */
  struct proxy_job *next_op;
  enum { OP_NONE, OP_START, OP_RESUME, OP_CANCEL } op;
  struct proxy_job *next_live; /* engine's list of jobs it owns */
  struct proxy_engine *engine;
  /* whole-blob reads: the stream is hashed and its last bytes held back unless it is the blob */
  EVP_MD_CTX *verify;
  uint8_t want[BR_SHA256_LEN];
  atomic_uint_fast64_t *mismatches; /* br_http's counter */
  char store_name[BR_MAX_STORE_NAME + 1];
  char key[BR_MAX_KEY + 1]; /* the object read, for the suspect list */
  const char *data_dir;     /* borrowed from the config, which outlives the engine */
  /* retries of a transfer that failed (5xx, or the connection) before any of its bytes went
   * into the ring: nothing of it reached the client, so it starts over exactly */
  unsigned retries_left, attempt;
  int retry;                     /* the current answer is a 5xx to retry */
  uint64_t xfer_bytes;           /* bytes of the current transfer put into the ring */
  uint64_t retry_at_ms;          /* the next attempt not before (0: none waiting) */
  atomic_uint_fast64_t *retried; /* br_http's counter */
};

struct proxy_engine {
  CURLM *multi;
  pthread_t thread;
  pthread_mutex_t lock;
  struct proxy_job *ops_head, *ops_tail; /* requests from other threads */
  struct proxy_job *live;                /* jobs the engine holds */
  int retries_waiting;                   /* live jobs waiting for their retry_at_ms */
  int stopping;
  int started;
};

static void job_free(struct proxy_job *j) {
  if (j->easy) curl_easy_cleanup(j->easy);
  curl_slist_free_all(j->headers);
  EVP_MD_CTX_free(j->verify);
  pthread_mutex_destroy(&j->lock);
  free(j->segs);
  free(j->lits);
  free(j->ring);
  free(j);
}

/* Drops one holder (lock held; unlocks). Frees the job when nobody holds it any more. */
static void job_put_locked(struct proxy_job *j, int engine_side) {
  if (engine_side)
    j->engine_active = 0;
  else
    j->refs--;
  int gone = !j->refs && !j->engine_active;
  pthread_mutex_unlock(&j->lock);
  if (gone) job_free(j);
}

/* Asks the engine to run op on j. The caller holds j->lock; a queued operation holds a
 * reference, dropped by the engine after running it. */
static void queue_op(struct proxy_engine *e, struct proxy_job *j, int op) {
  pthread_mutex_lock(&e->lock);
  if (j->op == OP_NONE) {
    j->op = op;
    j->refs++;
    j->next_op = NULL;
    if (e->ops_tail)
      e->ops_tail->next_op = j;
    else
      e->ops_head = j;
    e->ops_tail = j;
  } else if (op == OP_CANCEL) {
    j->op = OP_CANCEL; /* stronger than a pending resume */
  }
  pthread_mutex_unlock(&e->lock);
  curl_multi_wakeup(e->multi);
}

/* Wakes whoever waits on the job (job lock held). The reader is woken for the first bytes at
 * once (libmicrohttpd sends the answer's headers with the first body block: waiting for
 * READ_WAKE bytes there would delay the first byte by that much of the origin's transfer), then
 * only once READ_WAKE bytes wait or the stream is complete. */
static void wake(struct proxy_job *j) {
  if (j->waiting_handler && (j->failed || (j->collect ? j->done : j->headers_seen))) {
    j->waiting_handler = 0;
    MHD_resume_connection(j->conn);
  } else if (j->waiting_reader &&
             (j->len >= READ_WAKE || (j->len && (!j->body_started || j->produced == j->total)) ||
              j->failed || j->done)) {
    j->waiting_reader = 0;
    MHD_resume_connection(j->conn);
  }
}

static void fail(struct proxy_job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct proxy_job *j, const char *fmt, ...) {
  if (!j->failed) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->error, sizeof j->error, fmt, ap);
    va_end(ap);
    j->failed = 1;
  }
  wake(j);
}

static size_t ring_room(const struct proxy_job *j) { return j->cap - j->len; }

static void ring_put(struct proxy_job *j, const char *data, size_t n) {
  size_t tail = (j->head + j->len) % j->cap;
  size_t first = n < j->cap - tail ? n : j->cap - tail;
  memcpy(j->ring + tail, data, first);
  memcpy(j->ring, data + first, n - first);
  j->len += n;
  j->produced += n;
}

/* An origin's answer worth another try: S3 and web servers answer these for passing trouble. */
static int retryable_status(long status) {
  return status == 500 || status == 502 || status == 503 || status == 504;
}

/* Transfer failures worth another try: the connection failed or broke. Not a stall (a frozen
 * origin would hold the read stall_s again per attempt) nor anything the origin said. */
static int retryable_code(CURLcode rc) {
  return rc == CURLE_COULDNT_CONNECT || rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR ||
         rc == CURLE_GOT_NOTHING || rc == CURLE_PARTIAL_FILE;
}

static size_t on_origin_header(char *line, size_t size, size_t nmemb, void *ud) {
  struct proxy_job *j = ud;
  size_t n = size * nmemb;
  pthread_mutex_lock(&j->lock);
  if (n >= 5 && !memcmp(line, "HTTP/", 5)) {
    const char *sp = memchr(line, ' ', n);
    j->status = sp ? strtol(sp + 1, NULL, 10) : 0;
  } else if (n <= 2 && j->status >= 200) { /* the blank line after the final headers */
    if (retryable_status(j->status) && j->retries_left) {
      j->retry = 1; /* its body is dropped, the transfer ends and starts over */
    } else if (j->status != 206 && !(j->status == 200 && j->segs[j->seg].first == 0)) {
      fail(j, "the origin answered HTTP %ld", j->status);
    } else if (!j->headers_seen) {
      j->headers_seen = 1;
      wake(j);
    }
  }
  pthread_mutex_unlock(&j->lock);
  return n;
}

/* Hashes the next n bytes of a whole-blob stream; when they are its last, says whether the blob
 * hashes to what it should (0: they must not go out, the client sees a short body). Job lock held.
 */
static int verified_chunk(struct proxy_job *j, const char *data, size_t n) {
  EVP_DigestUpdate(j->verify, data, n);
  if (j->seg_got + n < j->segs[j->seg].len) return 1;
  uint8_t got[BR_SHA256_LEN];
  EVP_DigestFinal_ex(j->verify, got, NULL);
  EVP_MD_CTX_free(j->verify);
  j->verify = NULL;
  if (!memcmp(got, j->want, BR_SHA256_LEN)) return 1;
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(j->want, hex);
  atomic_fetch_add(j->mismatches, 1);
  br_error(
      "blob %s: the proxied bytes do not match their hash (store %s): the reply was cut "
      "before its end",
      hex, j->store_name);
  br_err err; /* a local append: fsck hashes the location whatever --verify says */
  if (br_suspect_mark(j->data_dir, j->want, j->store_name, j->key, &err) < 0)
    br_warn("blob %s: %s", hex, err.msg);
  return 0;
}

/* Walks n bytes of the transfer from the job's position without changing anything: the bytes
 * they put into the ring (the segments' bytes, and the literals between segments read by the
 * same transfer). -1 when they run past the last segment the transfer was asked for. */
static int64_t route_size(const struct proxy_job *j, size_t n) {
  size_t k = j->seg;
  uint64_t got = j->seg_got, gap = j->gap_left, ring = 0;
  while (n) {
    uint64_t take;
    if (gap) {
      take = gap < n ? gap : n;
      gap -= take;
    } else if (got < j->segs[k].len) {
      take = j->segs[k].len - got < n ? j->segs[k].len - got : n;
      got += take;
      ring += take;
    } else {
      size_t next = k + 1;
      while (next < j->nsegs && j->segs[next].kind == SEG_LITERAL) ring += j->segs[next++].lit_len;
      if (next >= j->nsegs || !j->segs[next].joins) return -1;
      k = next;
      got = 0;
      gap = j->segs[k].gap;
      continue;
    }
    n -= (size_t)take;
  }
  return (int64_t)ring;
}

/* Moves n bytes of the transfer into the ring as route_size measured them (room checked). */
static void route_put(struct proxy_job *j, const char *data, size_t n) {
  while (n) {
    struct segment *s = &j->segs[j->seg];
    size_t take;
    if (j->gap_left) {
      take = j->gap_left < n ? (size_t)j->gap_left : n;
      j->gap_left -= take;
    } else if (j->seg_got < s->len) {
      take = s->len - j->seg_got < n ? (size_t)(s->len - j->seg_got) : n;
      ring_put(j, data, take);
      j->seg_got += take;
    } else {
      while (j->segs[++j->seg].kind == SEG_LITERAL)
        ring_put(j, j->lits + j->segs[j->seg].lit_off, j->segs[j->seg].lit_len);
      j->seg_got = 0;
      j->gap_left = j->segs[j->seg].gap;
      continue;
    }
    data += take;
    n -= take;
  }
}

static size_t on_origin_body(char *data, size_t size, size_t nmemb, void *ud) {
  struct proxy_job *j = ud;
  size_t n = size * nmemb;
  pthread_mutex_lock(&j->lock);
  size_t rc = n;
  int refuse = j->failed || j->retry || j->status < 200 || j->status > 206;
  int64_t need = refuse ? 0 : route_size(j, n);
  if (refuse) {
    rc = 0; /* stop the transfer */
  } else if (need < 0) {
    fail(j, "the origin sent more bytes than asked for");
    rc = 0;
  } else if (ring_room(j) < (size_t)need) {
    j->paused = 1;
    rc = CURL_WRITEFUNC_PAUSE;
  } else if (j->verify && !verified_chunk(j, data, n)) {
    fail(j, "the bytes do not match the blob's SHA-256");
    rc = 0;
  } else {
    route_put(j, data, n);
    j->xfer_bytes += n;
    wake(j);
  }
  pthread_mutex_unlock(&j->lock);
  return rc;
}

/* Produces the job's stream as far as it can: literals into the ring, then the next remote
 * segment's transfer. Engine thread; job lock held. */
static void pump(struct proxy_engine *e, struct proxy_job *j) {
  j->blocked = 0;
  while (!j->failed && j->seg < j->nsegs && !j->easy) {
    struct segment *s = &j->segs[j->seg];
    if (s->kind == SEG_LITERAL) {
      size_t left = s->lit_len - j->lit_done;
      size_t n = left < ring_room(j) ? left : ring_room(j);
      ring_put(j, j->lits + s->lit_off + j->lit_done, n);
      j->lit_done += n;
      if (n) wake(j);
      if (j->lit_done < s->lit_len) {
        j->blocked = 1;
        return;
      }
      j->seg++;
      j->lit_done = 0;
      continue;
    }
    if (j->retry_at_ms) return; /* the engine starts it again when the backoff is over */
    CURL *h = curl_easy_init();
    /* one request for this segment and the remote segments that join it */
    uint64_t last = s->first + s->len - 1;
    for (size_t k = j->seg + 1; k < j->nsegs; k++)
      if (j->segs[k].kind == SEG_REMOTE) {
        if (!j->segs[k].joins) break;
        last = j->segs[k].first + j->segs[k].len - 1;
      }
    char range[96];
    snprintf(range, sizeof range, "Range: bytes=%" PRIu64 "-%" PRIu64, s->first, last);
    curl_slist_free_all(j->headers);
    j->headers = curl_slist_append(NULL, range);
    if (!h || !j->headers) {
      if (h) curl_easy_cleanup(h);
      fail(j, "out of memory");
      return;
    }
    curl_easy_setopt(h, CURLOPT_URL, j->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, j->headers);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, CURL_CHUNK);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    /* a stalled origin (no byte for stall_s) fails the read instead of holding it: a frozen S3
     * accepts connections and never answers */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, j->stall_s);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_origin_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, j);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_origin_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, j);
    curl_easy_setopt(h, CURLOPT_PRIVATE, j);
    j->easy = h;
    j->status = 0;
    j->retry = 0;
    j->xfer_bytes = 0;
    j->seg_got = 0;
    j->gap_left = 0;
    curl_multi_add_handle(e->multi, h);
    return;
  }
  if (!j->failed && j->seg >= j->nsegs && !j->done) {
    j->done = 1;
    wake(j);
  }
}

static void drop_transfer(struct proxy_engine *e, struct proxy_job *j) {
  if (!j->easy) return;
  curl_multi_remove_handle(e->multi, j->easy);
  curl_easy_cleanup(j->easy);
  j->easy = NULL;
  j->paused = 0;
}

/* Job lock held. */
static void unlink_live(struct proxy_engine *e, struct proxy_job *j) {
  if (j->retry_at_ms) {
    j->retry_at_ms = 0;
    e->retries_waiting--;
  }
  for (struct proxy_job **p = &e->live; *p; p = &(*p)->next_live)
    if (*p == j) {
      *p = j->next_live;
      return;
    }
}

/* The wait before attempt number attempt + 1 (attempt >= 1): 100 ms, 200 ms, ... at most 2 s,
 * each with jitter (half to all of it), as the S3 client waits. */
static uint64_t backoff_ms(unsigned attempt) {
  uint64_t cap = 100ull << (attempt - 1 < 5 ? attempt - 1 : 5);
  if (cap > 2000) cap = 2000;
  return cap / 2 + (uint64_t)random() % (cap / 2 + 1);
}

/* A transfer that failed before any of its bytes went into the ring, with attempts left: it
 * is dropped and started again after a backoff (the engine loop's retry scan). Job lock held.
 * Returns 1 when it will be retried. */
static int retry_transfer(struct proxy_engine *e, struct proxy_job *j, CURLcode rc) {
  if (j->failed || !j->retries_left || j->xfer_bytes) return 0;
  if (!j->retry && !retryable_code(rc)) return 0;
  char why[96];
  if (j->retry)
    snprintf(why, sizeof why, "HTTP %ld", j->status);
  else
    snprintf(why, sizeof why, "%s", curl_easy_strerror(rc));
  drop_transfer(e, j);
  j->retries_left--;
  j->attempt++;
  j->retry_at_ms = br_now_ms() + backoff_ms(j->attempt);
  e->retries_waiting++;
  atomic_fetch_add(j->retried, 1);
  br_warn("store %s: a proxied read failed (%s) before sending a byte: attempt %u follows",
          j->store_name, why, j->attempt + 1);
  return 1;
}

/* Starts the transfers whose backoff is over; returns the ms until the next one is due (at most
 * cap). Engine thread. */
static long start_due_retries(struct proxy_engine *e, long cap) {
  if (!e->retries_waiting) return cap;
  uint64_t now = br_now_ms();
  long next = cap;
  for (struct proxy_job **p = &e->live; *p;) {
    struct proxy_job *j = *p;
    pthread_mutex_lock(&j->lock);
    int pumped = 0;
    if (j->retry_at_ms && now >= j->retry_at_ms) {
      j->retry_at_ms = 0;
      e->retries_waiting--;
      pump(e, j); /* only an out-of-memory fails it here */
      pumped = 1;
    } else if (j->retry_at_ms && (long)(j->retry_at_ms - now) < next) {
      next = (long)(j->retry_at_ms - now);
    }
    if (pumped && (j->failed || j->done) && !j->easy) {
      *p = j->next_live;
      job_put_locked(j, 1);
    } else {
      p = &j->next_live;
      pthread_mutex_unlock(&j->lock);
    }
  }
  return next;
}

/* A transfer ended: go on with the next segment, retry it, or fail. */
static void transfer_done(struct proxy_engine *e, struct proxy_job *j, CURLcode rc) {
  pthread_mutex_lock(&j->lock);
  if (retry_transfer(e, j, rc)) {
    pthread_mutex_unlock(&j->lock);
    return;
  }
  uint64_t want = j->segs[j->seg].len;
  if (j->retry && !j->failed)
    fail(j, "the origin answered HTTP %ld", j->status);
  else if (rc != CURLE_OK && !j->failed)
    fail(j, "origin: %s", curl_easy_strerror(rc));
  else if (!j->failed && j->seg_got != want)
    fail(j, "the origin sent %" PRIu64 " of %" PRIu64 " bytes", j->seg_got, want);
  drop_transfer(e, j);
  if (!j->failed) {
    j->seg++;
    pump(e, j);
  }
  int finished = j->failed || j->done;
  if (finished) {
    unlink_live(e, j);
    job_put_locked(j, 1);
  } else {
    pthread_mutex_unlock(&j->lock);
  }
}

static void run_op(struct proxy_engine *e, struct proxy_job *j, int op) {
  pthread_mutex_lock(&j->lock);
  if (op == OP_START) {
    j->next_live = e->live;
    e->live = j;
    pump(e, j);
  } else if (op == OP_RESUME) {
    j->unpause_queued = 0;
    if (j->paused && j->easy) {
      j->paused = 0;
      pthread_mutex_unlock(&j->lock);
      curl_easy_pause(j->easy, CURLPAUSE_CONT); /* may call on_origin_body at once */
      pthread_mutex_lock(&j->lock);
    } else if (j->blocked) {
      pump(e, j);
    }
  } else if (op == OP_CANCEL) {
    drop_transfer(e, j);
    if (!j->failed && !j->done) fail(j, "cancelled");
  }
  if ((j->failed || j->done) && !j->easy && j->engine_active) {
    unlink_live(e, j);
    j->engine_active = 0;
  }
  job_put_locked(j, 0); /* the operation's reference */
}

static void *engine_main(void *arg) {
  struct proxy_engine *e = arg;
  for (;;) {
    pthread_mutex_lock(&e->lock);
    struct proxy_job *ops = e->ops_head;
    e->ops_head = e->ops_tail = NULL;
    int stopping = e->stopping;
    pthread_mutex_unlock(&e->lock);
    while (ops) {
      struct proxy_job *next = ops->next_op;
      pthread_mutex_lock(&e->lock);
      int op = ops->op;
      ops->op = OP_NONE;
      pthread_mutex_unlock(&e->lock);
      run_op(e, ops, op);
      ops = next;
    }
    if (stopping) break;
    int running = 0;
    curl_multi_perform(e->multi, &running);
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(e->multi, &left)))
      if (m->msg == CURLMSG_DONE) {
        struct proxy_job *j = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&j);
        if (j) transfer_done(e, j, m->data.result);
      }
    curl_multi_poll(e->multi, NULL, 0, (int)start_due_retries(e, 1000), NULL);
  }
  /* stopping: fail every job so that no connection stays suspended */
  while (e->live) {
    struct proxy_job *j = e->live;
    pthread_mutex_lock(&j->lock);
    e->live = j->next_live;
    drop_transfer(e, j);
    fail(j, "the server is stopping");
    job_put_locked(j, 1);
  }
  return NULL;
}

int proxy_engine_start(br_http *http, br_err *err) {
  struct proxy_engine *e = calloc(1, sizeof *e);
  if (!e) return br_fail(err, "out of memory");
  curl_global_init(CURL_GLOBAL_DEFAULT);
  e->multi = curl_multi_init();
  pthread_mutex_init(&e->lock, NULL);
  if (!e->multi || pthread_create(&e->thread, NULL, engine_main, e)) {
    if (e->multi) curl_multi_cleanup(e->multi);
    free(e);
    return br_fail(err, "cannot start the proxy thread");
  }
  curl_multi_setopt(e->multi, CURLMOPT_MAX_HOST_CONNECTIONS, 256L);
  e->started = 1;
  http->proxy = e;
  return 0;
}

void proxy_engine_stop(br_http *http) {
  struct proxy_engine *e = http->proxy;
  if (!e) return;
  pthread_mutex_lock(&e->lock);
  e->stopping = 1;
  pthread_mutex_unlock(&e->lock);
  curl_multi_wakeup(e->multi);
  pthread_join(e->thread, NULL);
  /* jobs queued after the loop ended (none should start: proxy_start checks stopping) */
  for (struct proxy_job *j = e->ops_head; j;) {
    struct proxy_job *next = j->next_op;
    pthread_mutex_lock(&j->lock);
    fail(j, "the server is stopping");
    j->engine_active = 0;
    job_put_locked(j, 0);
    j = next;
  }
  curl_multi_cleanup(e->multi);
  pthread_mutex_destroy(&e->lock);
  free(e);
  http->proxy = NULL;
}

/* ---- the request side -------------------------------------------------------------------------
 */

int proxy_start(struct request *req, const char *url, const struct proxy_part *parts, size_t n,
                int collect, uint64_t stall_ms, const char *store, const char *key,
                unsigned retries, int whole_blob, br_err *err) {
  struct proxy_engine *e = req->http->proxy;
  if (!e) return br_fail(err, "proxying is not running");
  struct proxy_job *j = calloc(1, sizeof *j);
  size_t lit_total = 0;
  for (size_t i = 0; i < n; i++) lit_total += parts[i].literal_len;
  if (j) {
    j->segs = calloc(n ? n : 1, sizeof *j->segs);
    j->lits = malloc(lit_total ? lit_total : 1);
  }
  uint64_t total = lit_total;
  for (size_t i = 0; i < n; i++) total += parts[i].len;
  size_t cap = collect ? (size_t)total : RING_SIZE;
  if (j) j->ring = malloc(cap ? cap : 1);
  if (!j || !j->segs || !j->lits || !j->ring || strlen(url) >= sizeof j->url) {
    if (j) free(j->segs), free(j->lits), free(j->ring);
    free(j);
    return br_fail(err, "out of memory");
  }
  pthread_mutex_init(&j->lock, NULL);
  snprintf(j->url, sizeof j->url, "%s", url);
  j->cap = cap ? cap : 1;
  j->total = total;
  size_t lo = 0;
  const struct segment *prev_remote = NULL;
  for (size_t i = 0; i < n; i++) {
    if (parts[i].literal_len) {
      memcpy(j->lits + lo, parts[i].literal, parts[i].literal_len);
      j->segs[j->nsegs++] = (struct segment){SEG_LITERAL, lo, parts[i].literal_len, 0, 0, 0, 0};
      lo += parts[i].literal_len;
    } else if (parts[i].len) {
      struct segment seg = {SEG_REMOTE, 0, 0, parts[i].first, parts[i].len, 0, 0};
      uint64_t prev_end = prev_remote ? prev_remote->first + prev_remote->len : 0;
      if (parts[i].joins && prev_remote && parts[i].first >= prev_end) {
        seg.joins = 1;
        seg.gap = parts[i].first - prev_end;
      }
      j->segs[j->nsegs] = seg;
      prev_remote = &j->segs[j->nsegs++];
    }
  }
  snprintf(j->store_name, sizeof j->store_name, "%s", store);
  snprintf(j->key, sizeof j->key, "%s", key);
  j->data_dir = req->srv->cfg->data_dir;
  j->retries_left = retries;
  j->retried = &req->http->proxy_retries;
  if (whole_blob && n == 1 && !parts[0].literal_len && parts[0].first == 0) {
    j->verify = EVP_MD_CTX_new();
    if (!j->verify || !EVP_DigestInit_ex(j->verify, EVP_sha256(), NULL)) {
      job_free(j);
      return br_fail(err, "out of memory");
    }
    memcpy(j->want, req->digest, BR_SHA256_LEN);
    j->mismatches = &req->http->read_digest_mismatch;
  }
  j->conn = req->conn;
  j->collect = collect;
  j->stall_s = stall_ms ? (long)((stall_ms + 999) / 1000) : 30;
  j->engine = e;
  j->refs = j->mhd_refs = 1; /* the request's */
  j->engine_active = 1;
  int has_remote = 0;
  for (size_t i = 0; i < j->nsegs; i++) has_remote |= j->segs[i].kind == SEG_REMOTE;
  if (!has_remote) j->headers_seen = 1; /* nothing to ask the origin before answering */
  pthread_mutex_lock(&e->lock);
  int stopping = e->stopping;
  pthread_mutex_unlock(&e->lock);
  if (stopping) {
    job_free(j);
    return br_fail(err, "the server is stopping");
  }
  req->proxy = j;
  /* suspended until the origin's headers (or everything, when collecting) arrived */
  pthread_mutex_lock(&j->lock);
  j->waiting_handler = 1;
  req->phase = PHASE_SUSPENDED;
  MHD_suspend_connection(req->conn);
  queue_op(e, j, OP_START);
  pthread_mutex_unlock(&j->lock);
  return 0;
}

int proxy_result(struct request *req, long *status, char *msg, size_t msglen) {
  struct proxy_job *j = req->proxy;
  pthread_mutex_lock(&j->lock);
  int failed = j->failed;
  *status = j->status;
  if (failed) snprintf(msg, msglen, "%s", j->error);
  pthread_mutex_unlock(&j->lock);
  return failed ? -1 : 0;
}

const char *proxy_collected(struct request *req, size_t *len) {
  struct proxy_job *j = req->proxy;
  *len = j->len;
  return j->ring; /* collect mode never wraps: the ring is the blob's size */
}

static ssize_t proxy_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  struct proxy_job *j = cls;
  pthread_mutex_lock(&j->lock);
  if (j->len) {
    size_t n = j->len < max ? j->len : max;
    size_t first = n < j->cap - j->head ? n : j->cap - j->head;
    memcpy(buf, j->ring + j->head, first);
    memcpy(buf + first, j->ring, n - first);
    j->head = (j->head + n) % j->cap;
    j->len -= n;
    j->body_started = 1;
    if ((j->paused || j->blocked) && !j->unpause_queued && ring_room(j) >= j->cap / 2) {
      j->unpause_queued = 1;
      queue_op(j->engine, j, OP_RESUME);
    }
    pthread_mutex_unlock(&j->lock);
    return (ssize_t)n;
  }
  if (j->failed || j->done) {
    pthread_mutex_unlock(&j->lock);
    return MHD_CONTENT_READER_END_WITH_ERROR; /* a short body: the size was promised */
  }
  j->waiting_reader = 1;
  MHD_suspend_connection(j->conn);
  pthread_mutex_unlock(&j->lock);
  return 0;
}

static void proxy_release(struct proxy_job *j) {
  pthread_mutex_lock(&j->lock);
  if (--j->mhd_refs == 0 && j->engine_active) queue_op(j->engine, j, OP_CANCEL);
  job_put_locked(j, 0);
}

static void proxy_response_free(void *cls) { proxy_release(cls); }

struct MHD_Response *proxy_response(struct request *req, uint64_t size) {
  struct proxy_job *j = req->proxy;
  pthread_mutex_lock(&j->lock);
  j->refs++;
  j->mhd_refs++;
  pthread_mutex_unlock(&j->lock);
  struct MHD_Response *resp =
      MHD_create_response_from_callback(size, SEND_BLOCK, proxy_read, j, proxy_response_free);
  if (!resp) proxy_release(j);
  return resp;
}

void proxy_request_done(struct request *req) {
  if (!req->proxy) return;
  proxy_release(req->proxy);
  req->proxy = NULL;
}
