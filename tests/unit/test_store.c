/* The fs store through the store interface: durable writes under a key, reads, stat, redirect
 * URLs, listing, copy, delete, and keys that must be refused. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blobref/store.h"
#include "store/internal.h"
#include "unit.h"

static int count_keys(void *ud, const char *key, uint64_t size) {
  (void)key;
  int *n = ud;
  *n += size == 5;
  return 0;
}

static br_store *open_fs(const char *name, const char *root, const char *public_url) {
  br_store_config cfg = {.name = (char *)name,
                         .kind = (char *)"fs",
                         .root = (char *)root,
                         .public_url = (char *)public_url,
                         .prefix = (char *)""};
  br_err err;
  br_store *st = br_store_open(&cfg, &err);
  CHECK(st != NULL, "open %s: %s", root, err.msg);
  return st;
}

static int put(br_store *st, const char *key, const char *bytes) {
  br_err err;
  br_store_writer *w = br_store_write_begin(st, &err);
  if (!w || br_store_write(w, bytes, strlen(bytes), &err) < 0) return -1;
  return br_store_write_commit(w, key, &err);
}

int main(void) {
  char root[128], root2[128], cmd[300];
  snprintf(root, sizeof root, "/tmp/blobref-test-store-%d/a", (int)getpid());
  snprintf(root2, sizeof root2, "/tmp/blobref-test-store-%d/b", (int)getpid());
  br_store *st = open_fs("a", root, "http://cdn.example/b/");
  br_store *st2 = open_fs("b", root2, "");
  br_err err;

  uint8_t digest[BR_SHA256_LEN];
  br_hex_decode("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03", 64, digest);
  char key[200];
  size_t klen = br_store_default_key(st, digest, key, sizeof key);
  CHECK(klen > 0 && !strcmp(key,
                            "sha256/58/91/"
                            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"),
        "default key %s", key);
  CHECK(br_store_default_key(st, digest, key, 20) == 0, "a key that does not fit is refused");
  br_store_default_key(st, digest, key, sizeof key);

  CHECK(put(st, key, "hello") == 0, "write + commit");
  br_store_reader r;
  CHECK(br_store_open_read(st, key, &r, &err) == 0 && r.size == 5 && r.fd >= 0, "open_read");
  char buf[8] = "";
  CHECK(r.source->pread(r.source, buf, 5, 0, &err) == 0 && !memcmp(buf, "hello", 5), "pread");
  CHECK(r.source->pread(r.source, buf, 2, 4, &err) < 0, "pread past the end refused");
  br_store_reader_close(&r);
  uint64_t size = 0;
  CHECK(br_store_stat(st, key, &size, &err) == 0 && size == 5, "stat");
  CHECK(br_store_stat(st, "sha256/00/00/none", &size, &err) == 1, "stat of an absent key");
  CHECK(br_store_open_read(st, "sha256/00/00/none", &r, &err) == 1, "open of an absent key");

  char url[300];
  uint64_t valid = 0;
  CHECK(br_store_redirect_url(st, key, url, sizeof url, &valid, &err) == 0 &&
            !strncmp(url, "http://cdn.example/b/sha256/58/91/", 34) && valid == UINT64_MAX,
        "redirect url %s, valid %llu", url, (unsigned long long)valid);
  CHECK(br_store_redirect_url(st2, key, url, sizeof url, &valid, &err) == 1,
        "no public_url: no redirect");
  CHECK(br_store_fetch_url(st, key, url, sizeof url, &err) == 1, "fs is read through fds");

  CHECK(put(st, "other/x", "world") == 0, "write under a custom key");
  int n = 0;
  CHECK(br_store_list(st, "", count_keys, &n, &err) == 0 && n == 2, "list all: %d", n);
  n = 0;
  CHECK(br_store_list(st, "sha256/", count_keys, &n, &err) == 0 && n == 1, "list prefix: %d", n);

  CHECK(br_store_copy(st, key, st2, key, &err) == 0, "copy: %s", err.msg);
  CHECK(br_store_stat(st2, key, &size, &err) == 0 && size == 5, "copied");
  CHECK(br_store_copy(st, "sha256/00/00/none", st2, "x", &err) < 0, "copy of an absent key");

  CHECK(br_store_delete(st, key, &err) == 0 && br_store_stat(st, key, &size, &err) == 1, "delete");
  CHECK(br_store_delete(st, key, &err) == 0, "deleting an absent key is fine");

  /* aborted writes leave nothing; bad keys are refused and leave nothing */
  br_store_writer *w = br_store_write_begin(st, &err);
  br_store_write(w, "junk", 4, &err);
  br_store_write_abort(w);
  static const char *bad[] = {"", "/abs", "a/../b", "..", "a//b", "a/./b", "a/", "a\\b", "a\nb"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK(br_store_key_valid(bad[i]) < 0, "key '%s' accepted", bad[i]);
    CHECK(put(st, bad[i], "x") < 0, "commit under '%s' accepted", bad[i]);
  }
  n = 0;
  br_store_list(st, "", count_keys, &n, &err);
  char tmpdir[200];
  snprintf(tmpdir, sizeof tmpdir, "%s/tmp", root);
  int leftovers = 0;
  snprintf(cmd, sizeof cmd, "test -z \"$(ls -A %s)\"", tmpdir);
  leftovers = system(cmd) != 0;
  CHECK(n == 1 && !leftovers, "only other/x left (%d), no temp files (%d)", n, leftovers);

  br_store_close(st);
  br_store_close(st2);
  snprintf(cmd, sizeof cmd, "rm -rf /tmp/blobref-test-store-%d", (int)getpid());
  if (system(cmd) != 0) fprintf(stderr, "cannot clean up\n");
  return unit_summary("store");
}
