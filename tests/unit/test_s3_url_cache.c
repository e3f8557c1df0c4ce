/* Table tests of the S3 store's presigned-URL cache: reuse within half a TTL, the remaining
 * validity, refresh, eviction, a clock that goes back, and URLs never crossing keys (threads). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "store/s3_client.h"
#include "store/s3_url_cache.h"
#include "unit.h"

#define T0 1700000000500ull /* mid-second: the URL is signed at 1700000000, 500 ms earlier */
#define TTL 10              /* seconds */

static s3_target target;

static void make_target(void) {
  br_err err;
  s3_target_options o = {.name = "t",
                         .endpoint = "http://127.0.0.1:9000",
                         .bucket = "blobs",
                         .access_key = "AK",
                         .secret_key = "SK",
                         .path_style = 1};
  if (s3_target_init(&target, &o, &err) < 0) {
    fprintf(stderr, "init: %s\n", err.msg);
    exit(1);
  }
}

/* The X-Amz-Date of url, or "". */
static const char *amz_date(const char *url, char out[17]) {
  const char *d = strstr(url, "X-Amz-Date=");
  snprintf(out, 17, "%s", d ? d + 11 : "");
  return out;
}

/* One request in a sequence on one cache: at time `at` for `key`, expect the URL to be the one of
 * step `same_as` (-1: a fresh one, different from every earlier step's), valid for valid_ms. */
static void test_window(void) {
  static const struct {
    uint64_t at;
    const char *key;
    int same_as;
    uint64_t valid_ms;
  } steps[] = {
      {T0, "sha256/aa/bb/one", -1, 9500},           /* 0: signed at T0 - 500 */
      {T0 + 1, "sha256/aa/bb/one", 0, 9499},        /* reused, what is left of it */
      {T0 + 999, "sha256/aa/bb/one", 0, 8501},      /* across a second boundary: still it */
      {T0 + 4500, "sha256/aa/bb/one", 0, 5000},     /* exactly half left: still reused */
      {T0, "sha256/aa/bb/two", -1, 9500},           /* 4: another key, another URL */
      {T0 + 4500, "sha256/aa/bb/two", 4, 5000},     /* each key keeps its own */
      {T0 + 4501, "sha256/aa/bb/one", -1, 9999},    /* 6: under half left: signed again */
      {T0 + 5000, "sha256/aa/bb/one", 6, 9500},     /* and the new one is reused */
      {T0 + 4501, "sha256/aa/bb/two", -1, 9999},    /* 8 */
      {T0 + 2000, "sha256/aa/bb/one", -1, 9500},    /* 9: the clock went back before 6's date */
      {T0 + 9500, "sha256/aa/bb/one", -1, 10000},   /* 10: signed on the second */
      {T0 + 600000, "sha256/aa/bb/one", -1, 9500},  /* 11: long expired */
      {T0 + 600000, "sha256/aa/bb/one/", -1, 9500}, /* 12: a key that extends another */
      {T0 + 600001, "sha256/aa/bb/one", 11, 9499},  {T0 + 600001, "sha256/aa/bb/one/", 12, 9499},
  };
  enum { N = sizeof steps / sizeof steps[0] };
  s3_url_cache *c = s3_url_cache_new(64);
  CHECK(c != NULL, "new");
  char urls[N][600];
  for (size_t i = 0; i < N; i++) {
    br_err err;
    uint64_t valid = 0;
    int rc = s3_url_cache_presign(c, &target, steps[i].key, "", steps[i].at, TTL, urls[i],
                                  sizeof urls[i], &valid, &err);
    CHECK(rc == 0, "step %zu: %s", i, err.msg);
    CHECK(valid == steps[i].valid_ms, "step %zu: valid %llu, want %llu", i,
          (unsigned long long)valid, (unsigned long long)steps[i].valid_ms);
    char path[200];
    snprintf(path, sizeof path, "/blobs/%s?", steps[i].key);
    CHECK(strstr(urls[i], path) != NULL, "step %zu: %s is not for %s", i, urls[i], steps[i].key);
    if (steps[i].same_as >= 0) {
      CHECK(!strcmp(urls[i], urls[steps[i].same_as]), "step %zu: %s, want step %d's %s", i, urls[i],
            steps[i].same_as, urls[steps[i].same_as]);
    } else {
      for (size_t j = 0; j < i; j++)
        CHECK(strcmp(urls[i], urls[j]) != 0, "step %zu: same URL as step %zu", i, j);
      /* a fresh URL is exactly what the signer gives for that second */
      char want[600];
      CHECK(s3_presign_get_at(&target, steps[i].key, "", (time_t)(steps[i].at / 1000), TTL, want,
                              sizeof want, &err) == 0 &&
                !strcmp(want, urls[i]),
            "step %zu: %s, signer says %s", i, urls[i], want);
    }
  }
  char d[17];
  CHECK(!strcmp(amz_date(urls[0], d), "20231114T221320Z"), "date %s", d);
  CHECK(!strcmp(amz_date(urls[6], d), "20231114T221325Z"), "refreshed date %s", d);
  uint64_t hits, signs;
  s3_url_cache_stats(c, &hits, &signs);
  CHECK(hits == 7 && signs == 8, "hits %llu signs %llu", (unsigned long long)hits,
        (unsigned long long)signs);
  s3_url_cache_free(c);
}

/* The URL is signed with the TTL given, and the half-TTL rule follows it: a URL is reused while at
 * least half of it is left (signed at T0 - 500 ms, so later_ms + 500 of it is gone). */
static void test_ttls(void) {
  static const struct {
    uint64_t ttl_s, later_ms;
    int reused;
  } cases[] = {
      {1, 0, 1},
      {1, 1, 0},
      {3, 1000, 1},
      {3, 1001, 0},
      {4, 1500, 1},
      {4, 1501, 0},
      {900, 449500, 1},
      {900, 449501, 0},
      {604800, 1, 1},
      {604800, 302399500, 1},
      {604800, 302399501, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    s3_url_cache *c = s3_url_cache_new(4);
    char a[600], b[600], want[40];
    uint64_t va, vb;
    br_err err;
    int rc = s3_url_cache_presign(c, &target, "k", "", T0, cases[i].ttl_s, a, sizeof a, &va, &err);
    rc |= s3_url_cache_presign(c, &target, "k", "", T0 + cases[i].later_ms, cases[i].ttl_s, b,
                               sizeof b, &vb, &err);
    snprintf(want, sizeof want, "X-Amz-Expires=%llu&", (unsigned long long)cases[i].ttl_s);
    CHECK(rc == 0 && strstr(a, want), "case %zu: %s", i, a);
    uint64_t hits, signs;
    s3_url_cache_stats(c, &hits, &signs);
    CHECK(hits == (uint64_t)cases[i].reused && signs == 2 - hits, "case %zu: hits %llu", i,
          (unsigned long long)hits);
    if (cases[i].reused) CHECK(!strcmp(a, b), "case %zu: %s then %s", i, a, b);
    if (cases[i].reused)
      CHECK(vb == va - cases[i].later_ms && vb * 2 >= cases[i].ttl_s * 1000, "case %zu: valid %llu",
            i, (unsigned long long)vb);
    s3_url_cache_free(c);
  }
}

/* Many keys through a small cache: it stays bounded, evicts, and never answers for another key. */
static void test_eviction(void) {
  s3_url_cache *c = s3_url_cache_new(8);
  char url[600], key[64], path[80];
  br_err err;
  uint64_t valid;
  int ok = 1;
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < 1000; i++) {
      snprintf(key, sizeof key, "sha256/%02x/k%d", i & 255, i);
      snprintf(path, sizeof path, "/blobs/%s?", key);
      ok &= s3_url_cache_presign(c, &target, key, "", T0 + (uint64_t)round, TTL, url, sizeof url,
                                 &valid, &err) == 0 &&
            strstr(url, path) != NULL;
    }
  CHECK(ok, "a URL was wrong or missing");
  uint64_t hits, signs;
  s3_url_cache_stats(c, &hits, &signs);
  /* the second round found at most 8 of the 1,000 still cached */
  CHECK(hits <= 8 && hits + signs == 2000, "hits %llu signs %llu", (unsigned long long)hits,
        (unsigned long long)signs);
  /* a key just signed is there */
  uint64_t h0 = hits;
  s3_url_cache_presign(c, &target, key, "", T0 + 2, TTL, url, sizeof url, &valid, &err);
  s3_url_cache_stats(c, &hits, &signs);
  CHECK(hits == h0 + 1, "last key not cached");
  /* a buffer too small for the cached URL: signed again, and refused */
  char tiny[40];
  CHECK(s3_url_cache_presign(c, &target, key, "", T0 + 2, TTL, tiny, sizeof tiny, &valid, &err) < 0,
        "tiny buffer accepted");
  s3_url_cache_free(c);
  /* no cache: always signed, still right */
  CHECK(s3_url_cache_presign(NULL, &target, "k", "", T0, TTL, url, sizeof url, &valid, &err) == 0 &&
            valid == 9500 && strstr(url, "/blobs/k?"),
        "no cache: %s", url);
}

struct worker {
  s3_url_cache *c;
  int id, bad;
};

static void *hammer(void *arg) {
  struct worker *w = arg;
  char url[600], key[64], path[80];
  br_err err;
  uint64_t valid;
  for (int i = 0; i < 20000; i++) {
    int k = (i * 7 + w->id) % 64;
    snprintf(key, sizeof key, "sha256/k%d", k);
    snprintf(path, sizeof path, "/blobs/%s?", key);
    uint64_t now = T0 + (uint64_t)(i / 100) * 1000; /* time runs: refreshes happen too */
    if (s3_url_cache_presign(w->c, &target, key, "", now, TTL, url, sizeof url, &valid, &err) < 0 ||
        !strstr(url, path) || valid * 2 < TTL * 1000 || valid > TTL * 1000)
      w->bad++;
  }
  return NULL;
}

static void test_threads(void) {
  s3_url_cache *c = s3_url_cache_new(16);
  pthread_t th[4];
  struct worker w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (struct worker){c, i, 0};
    pthread_create(&th[i], NULL, hammer, &w[i]);
  }
  int bad = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    bad += w[i].bad;
  }
  CHECK(bad == 0, "%d wrong answers under threads", bad);
  s3_url_cache_free(c);
}

/* The cache is keyed by key and signed query: an attachment URL never answers for an inline one
 * (nor the reverse), and each is reused for its own kind. */
static void test_query_keyed(void) {
  s3_url_cache *c = s3_url_cache_new(64);
  const char *att = "response-content-disposition=attachment";
  char inl[600], dl[600], inl2[600], dl2[600];
  uint64_t valid;
  br_err err;
  int rc = s3_url_cache_presign(c, &target, "k", "", T0, TTL, inl, sizeof inl, &valid, &err);
  rc |= s3_url_cache_presign(c, &target, "k", att, T0 + 1, TTL, dl, sizeof dl, &valid, &err);
  rc |= s3_url_cache_presign(c, &target, "k", "", T0 + 2, TTL, inl2, sizeof inl2, &valid, &err);
  rc |= s3_url_cache_presign(c, &target, "k", att, T0 + 3, TTL, dl2, sizeof dl2, &valid, &err);
  CHECK(rc == 0, "presign: %s", err.msg);
  CHECK(!strstr(inl, "response-content-disposition"), "inline URL %s asks for a download", inl);
  CHECK(strstr(dl, "response-content-disposition=attachment&") != NULL, "attachment URL %s", dl);
  CHECK(!strcmp(inl, inl2) && !strcmp(dl, dl2), "each kind reused: %s / %s", inl2, dl2);
  char want[600];
  CHECK(s3_presign_get_at(&target, "k", att, (time_t)(T0 / 1000), TTL, want, sizeof want, &err) ==
                0 &&
            !strcmp(want, dl),
        "attachment URL %s, signer says %s", dl, want);
  uint64_t hits, signs;
  s3_url_cache_stats(c, &hits, &signs);
  CHECK(hits == 2 && signs == 2, "hits %llu signs %llu", (unsigned long long)hits,
        (unsigned long long)signs);
  s3_url_cache_free(c);
}

int main(void) {
  make_target();
  test_query_keyed();
  test_window();
  test_ttls();
  test_eviction();
  test_threads();
  s3_target_destroy(&target);
  return unit_summary("s3_url_cache");
}
