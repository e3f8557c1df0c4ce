/* The direct-upload plan journal, DATA_DIR/direct-plans.log: a line per plan handed out
 * ("P <ms> <hex> <store> <key> <upload_id|->"), fsync'd before the negotiation's answer, and a
 * line per plan that ended ("F <hex> <upload_id|-> <ms|0>"); rewritten with the pending plans
 * only at start and when it grows. The sweep thread removes what a plan left once
 * direct_upload_grace has passed without a commit: its multipart upload is aborted, and its
 * object deleted under the blob's lock unless a record owns the key. On a shared index
 * (PostgreSQL: several nodes over one bucket) the plans are rows in the database instead
 * (br_index_plans_*), so that a node sweeps the expired plans of any node, one that never came
 * back included: each pass claims a batch (FOR UPDATE SKIP LOCKED, a claim of PLAN_CLAIM_MS) and
 * removes a row once its plan is swept; a plan whose sweep failed is tried again when its claim
 * has expired, by whichever node claims it first. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/direct_plans.h"
#include "core/server.h"

#define BUCKETS 65536       /* hash chains by the digest's first two bytes */
#define SWEEP_BATCH 256     /* plans swept per pass (the rest on the next, at once) */
#define PLAN_CLAIM_MS 60000 /* a shared plan claimed by a sweep is left to the others this long */
#define LINE_MAX_LEN (BR_HEX_LEN + BR_MAX_STORE_NAME + BR_MAX_KEY + DIRECT_UPLOAD_ID_MAX + 64)

struct plan {
  struct plan *next;
  uint8_t digest[BR_SHA256_LEN];
  uint64_t created_ms;
  char *key, *upload_id; /* upload_id "" for a single part; both in this allocation */
  char store[BR_MAX_STORE_NAME + 1];
};

struct direct_plans {
  pthread_mutex_t lock; /* guards everything below but the thread fields; held for the fsync */
  pthread_cond_t cv;
  int shared; /* the plans are in the index (br_index_has_plans): no journal, no table here */
  int fd;     /* the journal, O_APPEND */
  char path[4200];
  struct plan *buckets[BUCKETS];
  size_t n;         /* pending plans */
  size_t lines;     /* lines in the file now */
  int write_failed; /* an F line was lost: compact at the next pass */
  atomic_uint_fast64_t swept;
  pthread_t thread;
  int started, stopping;
};

/* A copy of a plan for the sweep, which works without the lock. */
struct sweep_item {
  uint64_t id; /* the plan's row on a shared index */
  uint8_t digest[BR_SHA256_LEN];
  uint64_t created_ms;
  int younger; /* another plan of the same blob is still within the grace */
  char store[BR_MAX_STORE_NAME + 1];
  char key[BR_MAX_KEY + 1];
  char upload_id[DIRECT_UPLOAD_ID_MAX + 1];
};

static size_t bucket_of(const uint8_t digest[BR_SHA256_LEN]) {
  return (size_t)digest[0] << 8 | digest[1];
}

/* A key or upload id fits on a journal line: no space, no control byte, not empty (keys). */
static int writable(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n > max) return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] <= ' ' || s[i] == 0x7f) return 0;
  return 1;
}

static struct plan *plan_new(const uint8_t digest[BR_SHA256_LEN], uint64_t created_ms,
                             const char *store, const char *key, const char *upload_id) {
  size_t kl = strlen(key), ul = strlen(upload_id);
  struct plan *p = malloc(sizeof *p + kl + ul + 2);
  if (!p) return NULL;
  memcpy(p->digest, digest, BR_SHA256_LEN);
  p->created_ms = created_ms;
  snprintf(p->store, sizeof p->store, "%s", store);
  p->key = (char *)(p + 1);
  memcpy(p->key, key, kl + 1);
  p->upload_id = p->key + kl + 1;
  memcpy(p->upload_id, upload_id, ul + 1);
  return p;
}

static void plan_insert(struct direct_plans *dp, struct plan *p) {
  struct plan **b = &dp->buckets[bucket_of(p->digest)];
  p->next = *b;
  *b = p;
  dp->n++;
}

/* Removes the plans of digest with upload_id, made at created_ms (0: at any time). */
static void plan_remove(struct direct_plans *dp, const uint8_t digest[BR_SHA256_LEN],
                        const char *upload_id, uint64_t created_ms) {
  for (struct plan **pp = &dp->buckets[bucket_of(digest)]; *pp;) {
    struct plan *p = *pp;
    if (!memcmp(p->digest, digest, BR_SHA256_LEN) && !strcmp(p->upload_id, upload_id) &&
        (!created_ms || p->created_ms == created_ms)) {
      *pp = p->next;
      free(p);
      dp->n--;
    } else {
      pp = &p->next;
    }
  }
}

static int plan_line(const struct plan *p, char *out, size_t cap) {
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(p->digest, hex);
  int len = snprintf(out, cap, "P %" PRIu64 " %s %s %s %s\n", p->created_ms, hex, p->store, p->key,
                     p->upload_id[0] ? p->upload_id : "-");
  return len < 0 || (size_t)len >= cap ? -1 : len;
}

static int write_all(int fd, const char *buf, size_t len) {
  while (len) {
    ssize_t w = write(fd, buf, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    buf += w;
    len -= (size_t)w;
  }
  return 0;
}

/* Parses one line (newline stripped) and applies it. Malformed lines (a torn last write) are
 * skipped: a plan whose P line was torn was never answered (its fsync had not returned). */
static void apply_line(struct direct_plans *dp, char *l) {
  char *f[6];
  int nf = 0;
  for (char *save = NULL, *t = strtok_r(l, " ", &save); t && nf < 6; t = strtok_r(NULL, " ", &save))
    f[nf++] = t;
  uint8_t digest[BR_SHA256_LEN];
  char *end;
  if (nf == 6 && !strcmp(f[0], "P")) {
    errno = 0;
    uint64_t ms = strtoull(f[1], &end, 10);
    if (errno || *end || br_hex_decode(f[2], strlen(f[2]), digest) < 0 ||
        strlen(f[3]) > BR_MAX_STORE_NAME || strlen(f[4]) > BR_MAX_KEY ||
        strlen(f[5]) > DIRECT_UPLOAD_ID_MAX || dp->n >= DIRECT_PLANS_MAX)
      return;
    struct plan *p = plan_new(digest, ms, f[3], f[4], strcmp(f[5], "-") ? f[5] : "");
    if (p) plan_insert(dp, p);
  } else if (nf == 4 && !strcmp(f[0], "F")) {
    errno = 0;
    uint64_t ms = strtoull(f[3], &end, 10);
    if (errno || *end || br_hex_decode(f[1], strlen(f[1]), digest) < 0) return;
    plan_remove(dp, digest, strcmp(f[2], "-") ? f[2] : "", ms);
  }
}

/* Rewrites the journal with the pending plans only: a temporary file, fsync, rename, fsync of
 * the directory; then appends go to the new file. Under dp->lock. -1 with err (the old file
 * stays in use). */
static int compact(struct direct_plans *dp, const char *data_dir, br_err *err) {
  char tmp[4300];
  snprintf(tmp, sizeof tmp, "%s.tmp", dp->path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return br_fail(err, "%s: %s", tmp, strerror(errno));
  char *buf = malloc(1 << 16), line[LINE_MAX_LEN];
  size_t used = 0;
  int rc = buf ? 0 : -1;
  for (size_t b = 0; rc == 0 && b < BUCKETS; b++)
    for (struct plan *p = dp->buckets[b]; rc == 0 && p; p = p->next) {
      int len = plan_line(p, line, sizeof line);
      if (len < 0) continue;
      if (used + (size_t)len > (1 << 16)) {
        rc = write_all(fd, buf, used);
        used = 0;
      }
      memcpy(buf + used, line, (size_t)len);
      used += (size_t)len;
    }
  if (rc == 0 && used) rc = write_all(fd, buf, used);
  free(buf);
  if (rc == 0) rc = fsync(fd);
  close(fd);
  if (rc == 0) rc = rename(tmp, dp->path);
  if (rc != 0) {
    int e = errno;
    unlink(tmp);
    return br_fail(err, "compacting %s: %s", dp->path, strerror(e));
  }
  int dfd = open(data_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  int nfd = open(dp->path, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (nfd < 0) return br_fail(err, "%s: %s", dp->path, strerror(errno));
  if (dp->fd >= 0) close(dp->fd);
  dp->fd = nfd;
  dp->lines = dp->n;
  dp->write_failed = 0;
  return 0;
}

static int load(struct direct_plans *dp, br_err *err) {
  FILE *f = fopen(dp->path, "re");
  if (!f) return errno == ENOENT ? 0 : br_fail(err, "%s: %s", dp->path, strerror(errno));
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) > 0) {
    if (line[len - 1] != '\n' || len > LINE_MAX_LEN) continue; /* torn or not ours */
    line[len - 1] = '\0';
    apply_line(dp, line);
  }
  free(line);
  fclose(f);
  return 0;
}

/* Appends text (whole lines); with sync, fsyncs. Under dp->lock. */
static int append(struct direct_plans *dp, const char *text, size_t len, size_t lines, int sync,
                  br_err *err) {
  if (write_all(dp->fd, text, len) < 0 || (sync && fdatasync(dp->fd) < 0))
    return br_fail(err, "journal %s: %s", dp->path, strerror(errno));
  dp->lines += lines;
  return 0;
}

int direct_plans_add(br_server *srv, const struct direct_plan *plans, size_t n, br_err *err) {
  struct direct_plans *dp = srv->plans;
  if (!n) return 0;
  if (!dp) return br_fail(err, "the direct-upload journal is not open");
  for (size_t i = 0; i < n; i++)
    if (!writable(plans[i].key, BR_MAX_KEY) || !*plans[i].key ||
        !writable(plans[i].store, BR_MAX_STORE_NAME) ||
        !writable(plans[i].upload_id, DIRECT_UPLOAD_ID_MAX))
      return 1;
  if (dp->shared) {
    br_index_plan *rows = calloc(n, sizeof *rows);
    if (!rows) return br_fail(err, "out of memory");
    for (size_t i = 0; i < n; i++) {
      memcpy(rows[i].digest, plans[i].digest, BR_SHA256_LEN);
      rows[i].store = plans[i].store;
      rows[i].key = plans[i].key;
      rows[i].upload_id = plans[i].upload_id;
    }
    int rc = br_index_plans_add(srv->index, rows, n, err) < 0 ? -1 : 0;
    free(rows);
    return rc;
  }
  uint64_t now = br_now_ms();
  struct plan **made = calloc(n, sizeof *made);
  char *text = malloc(n * LINE_MAX_LEN);
  size_t used = 0;
  int rc = made && text ? 0 : br_fail(err, "out of memory");
  for (size_t i = 0; rc == 0 && i < n; i++) {
    made[i] = plan_new(plans[i].digest, now, plans[i].store, plans[i].key, plans[i].upload_id);
    if (!made[i]) rc = br_fail(err, "out of memory");
    int len = made[i] ? plan_line(made[i], text + used, LINE_MAX_LEN) : -1;
    if (rc == 0 && len < 0) rc = br_fail(err, "journal line too long");
    if (rc == 0) used += (size_t)len;
  }
  if (rc == 0) {
    pthread_mutex_lock(&dp->lock);
    if (dp->n + n > DIRECT_PLANS_MAX)
      rc = 1;
    else
      rc = append(dp, text, used, n, 1, err);
    for (size_t i = 0; rc == 0 && i < n; i++) plan_insert(dp, made[i]);
    pthread_mutex_unlock(&dp->lock);
  }
  if (rc != 0)
    for (size_t i = 0; made && i < n; i++) free(made[i]);
  free(made);
  free(text);
  return rc;
}

/* Forgets one plan (created_ms) or all of digest with upload_id (0), with its F line. */
static void forget(struct direct_plans *dp, const uint8_t digest[BR_SHA256_LEN],
                   const char *upload_id, uint64_t created_ms) {
  char hex[BR_HEX_LEN + 1], line[LINE_MAX_LEN];
  br_hex_encode(digest, hex);
  int len = snprintf(line, sizeof line, "F %s %s %" PRIu64 "\n", hex,
                     upload_id[0] ? upload_id : "-", created_ms);
  pthread_mutex_lock(&dp->lock);
  size_t before = dp->n;
  plan_remove(dp, digest, upload_id, created_ms);
  br_err err;
  if (dp->n != before && len > 0 && (size_t)len < sizeof line &&
      append(dp, line, (size_t)len, 1, 0, &err) < 0) {
    dp->write_failed = 1; /* the plan would come back at a restart: compact soon */
    br_warn("direct uploads: %s", err.msg);
  }
  pthread_mutex_unlock(&dp->lock);
}

void direct_plans_forget(br_server *srv, const uint8_t digest[BR_SHA256_LEN],
                         const char *upload_id) {
  br_err err;
  if (srv->plans && srv->plans->shared) {
    /* a row left behind is swept later, and the sweep never deletes an object a record owns */
    if (br_index_plans_forget(srv->index, digest, upload_id ? upload_id : "", 0, &err) < 0)
      br_warn("direct uploads: forgetting a plan: %s", err.msg);
  } else if (srv->plans) {
    forget(srv->plans, digest, upload_id ? upload_id : "", 0);
  }
}

uint64_t direct_plans_pending(br_server *srv) {
  struct direct_plans *dp = srv->plans;
  if (!dp) return 0;
  uint64_t n = 0;
  br_err err;
  if (dp->shared) {
    /* every node's, as the database counts them (0 when it cannot be asked); a node none of
     * whose stores offers direct uploads asks nothing (a /metrics scrape runs no count(*)) */
    int offers = 0;
    for (int i = 0; i < srv->nstores && !offers; i++)
      offers = br_store_direct_mode(srv->stores[i]) != BR_DIRECT_NONE;
    return !offers || br_index_plans_count(srv->index, &n, &err) < 0 ? 0 : n;
  }
  pthread_mutex_lock(&dp->lock);
  n = dp->n;
  pthread_mutex_unlock(&dp->lock);
  return n;
}

uint64_t direct_plans_swept(br_server *srv) {
  return srv->plans ? atomic_load(&srv->plans->swept) : 0;
}

/* Removes what one expired plan left: aborts its multipart upload (one already completed or
 * aborted is not an error), then, unless another plan of the blob is still young, deletes the
 * object under the blob's lock when no record owns the key (invariant 10: never bytes a record
 * names) and, on LMDB, no commit of the blob is running outside the stripe (it registers as a
 * delete first: a commit that comes later answers retry). Returns 1 when the plan is done with,
 * 0 to try again on the next pass. */
static int sweep_one(br_server *srv, const struct sweep_item *it) {
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(it->digest, hex);
  br_store *st = br_server_store(srv, it->store);
  br_err err;
  if (!st) {
    br_warn("direct uploads: plan for %s in store %s, which is not configured: forgotten", hex,
            it->store);
    return 1;
  }
  if (it->upload_id[0]) {
    if (br_store_multipart_abort(st, it->key, it->upload_id, &err) < 0) {
      br_warn("direct uploads: aborting the expired upload of %s: %s (retried)", hex, err.msg);
      return 0;
    }
    atomic_fetch_add(&srv->plans->swept, 1);
    br_info("direct uploads: expired multipart upload of %s at %s:%s aborted", hex, it->store,
            it->key);
  }
  if (it->younger) return 1; /* that plan's own sweep decides about the object */
  if (br_server_lock_blob(srv, it->digest, 1) < 0) return 0;
  uint8_t owner[BR_SHA256_LEN];
  int rc = br_index_key_owner(srv->index, it->store, it->key, owner, &err);
  int done = 0, busy = 0, off = br_server_off_stripe(srv);
  if (rc < 0) {
    br_warn("direct uploads: the owner of %s:%s: %s (retried)", it->store, it->key, err.msg);
  } else if (rc != 1) {
    done = 1; /* a record owns the key (a commit, or a PUT through blobrefd): kept */
  } else if (off && (busy = br_server_delete_begin(srv, it->digest)) != 0) {
    /* a commit of the blob runs outside the stripe (its bytes may be at this key, about to be
     * recorded): the next pass decides */
    if (busy < 0) br_warn("direct uploads: out of memory sweeping %s (retried)", hex);
  } else {
    uint64_t size;
    int src = br_store_stat(st, it->key, &size, &err);
    if (src == 0 && br_store_delete(st, it->key, &err) < 0) {
      br_warn("direct uploads: deleting %s:%s: %s (retried)", it->store, it->key, err.msg);
    } else if (src < 0) {
      br_warn("direct uploads: %s (retried)", err.msg);
    } else {
      done = 1;
      if (src == 0) {
        atomic_fetch_add(&srv->plans->swept, 1);
        br_info("direct uploads: %s:%s, uploaded for %s and never committed, deleted", it->store,
                it->key, hex);
      }
    }
    if (off) br_server_delete_end(srv, it->digest);
  }
  br_server_lock_blob(srv, it->digest, 0);
  return done;
}

/* Copies up to SWEEP_BATCH plans older than cutoff into items; *more when there were others. */
static size_t collect(struct direct_plans *dp, uint64_t cutoff, struct sweep_item *items,
                      int *more) {
  size_t n = 0;
  *more = 0;
  pthread_mutex_lock(&dp->lock);
  for (size_t b = 0; b < BUCKETS; b++)
    for (struct plan *p = dp->buckets[b]; p; p = p->next) {
      if (p->created_ms > cutoff) continue;
      if (n == SWEEP_BATCH) {
        *more = 1;
        goto out;
      }
      struct sweep_item *it = &items[n++];
      memcpy(it->digest, p->digest, BR_SHA256_LEN);
      it->created_ms = p->created_ms;
      snprintf(it->store, sizeof it->store, "%s", p->store);
      snprintf(it->key, sizeof it->key, "%s", p->key);
      snprintf(it->upload_id, sizeof it->upload_id, "%s", p->upload_id);
      it->younger = 0;
      for (struct plan *q = dp->buckets[b]; q; q = q->next)
        if (q->created_ms > cutoff && !memcmp(q->digest, p->digest, BR_SHA256_LEN)) it->younger = 1;
    }
out:
  pthread_mutex_unlock(&dp->lock);
  return n;
}

/* The claim's callback: a copy of each claimed row into the items (struct claim_into). */
struct claim_into {
  struct sweep_item *items;
  size_t n;
};

static int claimed(void *ud, const br_index_plan *p) {
  struct claim_into *ci = ud;
  if (ci->n == SWEEP_BATCH) return 1;
  struct sweep_item *it = &ci->items[ci->n++];
  it->id = p->id;
  memcpy(it->digest, p->digest, BR_SHA256_LEN);
  it->created_ms = 0;
  snprintf(it->store, sizeof it->store, "%s", p->store);
  snprintf(it->key, sizeof it->key, "%s", p->key);
  snprintf(it->upload_id, sizeof it->upload_id, "%s", p->upload_id);
  it->younger = p->younger;
  return 0;
}

/* Claims up to SWEEP_BATCH expired plans of the shared index into items; *more when the batch
 * was full. 0 on a database failure (logged; the next pass tries again). */
static size_t claim_shared(br_server *srv, uint64_t grace, struct sweep_item *items, int *more) {
  struct claim_into ci = {.items = items};
  br_err err;
  int n = br_index_plans_claim(srv->index, grace, PLAN_CLAIM_MS, SWEEP_BATCH, claimed, &ci, &err);
  if (n < 0) br_warn("direct uploads: claiming expired plans: %s (retried)", err.msg);
  *more = ci.n == SWEEP_BATCH;
  return ci.n;
}

static uint64_t sweep_interval(const br_config *cfg) {
  uint64_t iv = cfg->direct_upload_grace_ms / 4;
  if (iv < 250) iv = 250;
  if (iv > 60000) iv = 60000;
  return iv;
}

static void *sweep_main(void *arg) {
  br_server *srv = arg;
  struct direct_plans *dp = srv->plans;
  struct sweep_item *items = calloc(SWEEP_BATCH, sizeof *items);
  uint64_t iv = sweep_interval(srv->cfg);
  pthread_mutex_lock(&dp->lock);
  while (!dp->stopping && items) {
    pthread_mutex_unlock(&dp->lock);
    uint64_t now = br_now_ms(), grace = srv->cfg->direct_upload_grace_ms;
    int more = 0, retry = 0;
    size_t n = dp->shared ? claim_shared(srv, grace, items, &more)
                          : collect(dp, now > grace ? now - grace : 0, items, &more);
    for (size_t i = 0; i < n; i++) {
      pthread_mutex_lock(&dp->lock);
      int stop = dp->stopping;
      pthread_mutex_unlock(&dp->lock);
      if (stop) break;
      br_err err;
      if (!sweep_one(srv, &items[i]))
        retry = 1; /* shared: its claim expires, then any node tries again */
      else if (!dp->shared)
        forget(dp, items[i].digest, items[i].upload_id, items[i].created_ms);
      else if (br_index_plans_forget(srv->index, items[i].digest, items[i].upload_id, items[i].id,
                                     &err) < 0)
        br_warn("direct uploads: %s (swept again after its claim)", err.msg);
    }
    pthread_mutex_lock(&dp->lock);
    if (!dp->shared && (dp->write_failed || dp->lines > 2 * dp->n + 10000)) {
      br_err err;
      if (compact(dp, srv->cfg->data_dir, &err) < 0) br_warn("direct uploads: %s", err.msg);
    }
    if (more && !retry) continue; /* more expired plans: at once */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(iv / 1000);
    ts.tv_nsec += (long)(iv % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    if (!dp->stopping) pthread_cond_timedwait(&dp->cv, &dp->lock, &ts);
  }
  pthread_mutex_unlock(&dp->lock);
  free(items);
  return NULL;
}

static void plans_free(struct direct_plans *dp) {
  for (size_t b = 0; b < BUCKETS; b++)
    for (struct plan *p = dp->buckets[b], *next; p; p = next) {
      next = p->next;
      free(p);
    }
  if (dp->fd >= 0) close(dp->fd);
  pthread_mutex_destroy(&dp->lock);
  pthread_cond_destroy(&dp->cv);
  free(dp);
}

int direct_plans_start(br_server *srv, br_err *err) {
  struct direct_plans *dp = calloc(1, sizeof *dp);
  if (!dp) return br_fail(err, "out of memory");
  pthread_mutex_init(&dp->lock, NULL);
  pthread_cond_init(&dp->cv, NULL);
  dp->fd = -1;
  atomic_init(&dp->swept, 0);
  snprintf(dp->path, sizeof dp->path, "%s/direct-plans.log", srv->cfg->data_dir);
  dp->shared = br_index_has_plans(srv->index);
  if (!dp->shared && (load(dp, err) < 0 || compact(dp, srv->cfg->data_dir, err) < 0)) {
    plans_free(dp);
    return -1;
  }
  if (dp->n) br_info("direct uploads: %zu plan(s) pending from before", dp->n);
  srv->plans = dp;
  if (pthread_create(&dp->thread, NULL, sweep_main, srv))
    return br_fail(err, "cannot start the direct-upload sweep thread");
  dp->started = 1;
  return 0;
}

void direct_plans_stop(br_server *srv) {
  struct direct_plans *dp = srv->plans;
  if (!dp) return;
  pthread_mutex_lock(&dp->lock);
  dp->stopping = 1;
  pthread_cond_broadcast(&dp->cv);
  pthread_mutex_unlock(&dp->lock);
  if (dp->started) pthread_join(dp->thread, NULL);
  srv->plans = NULL;
  plans_free(dp);
}
