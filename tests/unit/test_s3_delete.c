/* br_store_delete_many on an s3 store against a stub origin: batches of 1,000 keys sent several
 * at a time (never more than four), every key once, and failed[] per key when one of the
 * concurrent batches is refused whole and another reports one key failed. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "blobref/store.h"
#include "unit.h"

#define N 4500       /* five DeleteObjects: four of 1,000 keys, one of 500 */
#define HOLD_MS 1000 /* how long a request waits for a second one to arrive */

/* The stub origin: counts keys and requests in flight; a request waits (up to HOLD_MS) until two
 * were in flight together once, so that sequential sending shows as a peak of one. */
static struct {
  int fd;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  int inflight, peak, requests, keys;
} stub = {.lock = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static int read_full(int fd, char *buf, size_t n) {
  for (size_t got = 0; got < n;) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

static void reply(int fd, int status, const char *body) {
  char head[256];
  int hl =
      snprintf(head, sizeof head,
               "HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\nContent-Length: %zu\r\n\r\n",
               status, status == 200 ? "OK" : "Forbidden", strlen(body));
  if (write(fd, head, (size_t)hl) != hl || write(fd, body, strlen(body)) < 0) return;
}

static int count_of(const char *s, const char *what) {
  int n = 0;
  for (const char *p = s; (p = strstr(p, what)); p += strlen(what)) n++;
  return n;
}

/* One connection: requests until the client closes it. */
static void *serve(void *arg) {
  int fd = (int)(intptr_t)arg;
  char local[8192];
  for (;;) {
    size_t hl = 0;
    while (hl < sizeof local - 1 && !(hl >= 4 && !memcmp(local + hl - 4, "\r\n\r\n", 4))) {
      if (read(fd, local + hl, 1) != 1) goto out;
      hl++;
    }
    local[hl] = '\0';
    const char *cl = strcasestr(local, "\r\ncontent-length:");
    size_t len = cl ? strtoul(cl + 17, NULL, 10) : 0;
    char *body = malloc(len + 1);
    if (!body || read_full(fd, body, len) < 0) {
      free(body);
      goto out;
    }
    body[len] = '\0';
    if (strncmp(local, "POST /bkt/?delete", 17)) {
      reply(fd, 403, "<Error><Code>AccessDenied</Code><Message>only deletes</Message></Error>");
      free(body);
      continue;
    }
    pthread_mutex_lock(&stub.lock);
    stub.requests++;
    stub.keys += count_of(body, "<Key>");
    if (++stub.inflight > stub.peak) stub.peak = stub.inflight;
    pthread_cond_broadcast(&stub.cv);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += HOLD_MS / 1000;
    while (stub.peak < 2)
      if (pthread_cond_timedwait(&stub.cv, &stub.lock, &until)) break;
    pthread_mutex_unlock(&stub.lock);
    char *one = strstr(body, "<Key>fail-one/");
    if (strstr(body, "<Key>fail-all/")) {
      reply(fd, 403, "<Error><Code>AccessDenied</Code><Message>whole batch</Message></Error>");
    } else if (one) {
      char res[512], key[64];
      sscanf(one + 5, "%63[^<]", key);
      snprintf(res, sizeof res,
               "<DeleteResult><Error><Key>%s</Key><Code>AccessDenied</Code>"
               "<Message>denied</Message></Error></DeleteResult>",
               key);
      reply(fd, 200, res);
    } else {
      reply(fd, 200, "<DeleteResult></DeleteResult>");
    }
    pthread_mutex_lock(&stub.lock);
    stub.inflight--;
    pthread_mutex_unlock(&stub.lock);
    free(body);
  }
out:
  close(fd);
  return NULL;
}

static void *accept_loop(void *arg) {
  (void)arg;
  for (;;) {
    int c = accept(stub.fd, NULL, NULL);
    if (c < 0) return NULL;
    pthread_t t;
    if (pthread_create(&t, NULL, serve, (void *)(intptr_t)c) == 0)
      pthread_detach(t);
    else
      close(c);
  }
}

int main(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  stub.fd = socket(AF_INET, SOCK_STREAM, 0);
  if (stub.fd < 0 || bind(stub.fd, (struct sockaddr *)&a, sizeof a) < 0 ||
      listen(stub.fd, 64) < 0 || getsockname(stub.fd, (struct sockaddr *)&a, &al) < 0) {
    perror("stub");
    return 1;
  }
  pthread_t acc;
  pthread_create(&acc, NULL, accept_loop, NULL);
  char endpoint[64];
  snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", ntohs(a.sin_port));
  br_store_config cfg = {.name = (char *)"lake",
                         .kind = (char *)"s3",
                         .endpoint = endpoint,
                         .region = (char *)"us-east-1",
                         .bucket = (char *)"bkt",
                         .access_key = (char *)"AK",
                         .secret_key = (char *)"SK",
                         .path_style = 1,
                         .prefix = (char *)"",
                         .public_url = (char *)"",
                         .spool_dir = (char *)"",
                         .timeout_ms = 20000,
                         .read_only = 1};
  br_err err;
  br_store *st = br_store_open(&cfg, &err);
  CHECK(st != NULL, "open: %s", err.msg);
  if (!st) return unit_summary("s3_delete");

  /* batch 1 (keys 1000..1999) is refused whole; in batch 3 one key fails */
  static char names[N][32];
  static const char *keys[N];
  static uint8_t failed[N];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "%s/%05d",
             i == 1500   ? "fail-all"
             : i == 3333 ? "fail-one"
                         : "k",
             i);
    keys[i] = names[i];
  }
  err.msg[0] = '\0';
  int rc = br_store_delete_many(st, keys, N, failed, &err);
  CHECK(rc == -1, "a failed batch: %d", rc);
  CHECK(strstr(err.msg, "AccessDenied") && strstr(err.msg, "whole batch"),
        "the error names the lowest failed batch: %s", err.msg);
  int wrong = 0;
  for (int i = 0; i < N; i++) wrong += failed[i] != ((i >= 1000 && i < 2000) || i == 3333);
  CHECK(wrong == 0, "%d keys with the wrong failed[] flag", wrong);
  pthread_mutex_lock(&stub.lock);
  CHECK(stub.requests == 5 && stub.keys == N, "%d requests, %d keys (want 5, %d)", stub.requests,
        stub.keys, N);
  CHECK(stub.peak >= 2 && stub.peak <= 4, "at most four, more than one in flight: peak %d",
        stub.peak);
  stub.requests = stub.keys = 0; /* the peak stays: no more holding */
  pthread_mutex_unlock(&stub.lock);

  /* one batch: sent by the caller alone, every key gone */
  memset(failed, 1, N);
  rc = br_store_delete_many(st, keys, 999, failed, &err);
  CHECK(rc == 0, "one batch: %s", err.msg);
  CHECK(memchr(failed, 1, 999) == NULL, "one batch: a key flagged failed");
  CHECK(stub.requests == 1 && stub.keys == 999, "one batch: %d requests, %d keys", stub.requests,
        stub.keys);
  br_store_close(st);
  return unit_summary("s3_delete");
}
