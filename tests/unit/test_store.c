/* The fs store through the store interface: durable writes under a key, reads, stat, redirect
 * URLs, listing, copy, delete, keys that must be refused, and confinement to the root (no
 * symbolic link followed, no tmp/ key, no hard link), with and without openat2. */
#include <errno.h>
#include <fcntl.h>
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

/* ---- confinement ---------------------------------------------------------------------------- */

static void write_file(const char *path, const char *bytes) {
  FILE *f = fopen(path, "w");
  CHECK(f && fputs(bytes, f) >= 0 && fclose(f) == 0, "write %s", path);
}

static int exists(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0;
}

/* Collects the listed keys, '|'-separated. */
static int collect_keys(void *ud, const char *key, uint64_t size) {
  (void)size;
  char *all = ud;
  strncat(all, key, 1000 - strlen(all));
  strncat(all, "|", 1000 - strlen(all));
  return 0;
}

/* What each operation must do with a key: 0 ok, 1 absent, -1 refused with a message holding
 * want (NULL: any). */
static const struct {
  const char *key, *what;
  int open_rc, stat_rc, delete_rc;
  const char *want;
} confine_cases[] = {
    {"sub/ok", "a regular file", 0, 0, 0, NULL},
    {"link", "a symlink to a file outside", -1, -1, -1, BR_STORE_CONFINED},
    {"rel", "a symlink to a file inside", -1, -1, -1, BR_STORE_CONFINED},
    {"d/f", "a symlinked directory in the path", -1, -1, -1, BR_STORE_CONFINED},
    {"sub/d/f", "a symlinked directory deeper in the path", -1, -1, -1, BR_STORE_CONFINED},
    {"dl", "a symlink to a directory", -1, -1, -1, BR_STORE_CONFINED},
    {"sub/../link", "..", -1, -1, -1, "invalid object key"},
    {"/etc/passwd", "an absolute path", -1, -1, -1, "invalid object key"},
    {"tmp/up-1-x", "a file in tmp/", -1, -1, -1, "tmp/ directory"},
    {"tmp", "tmp/ itself", -1, -1, -1, "tmp/ directory"},
    {"sub/hl", "a hard link to a file outside", -1, -1, 0, "hard links"},
    {"sub/none", "an absent key", 1, 1, 0, NULL},
    {"sub/ok/x", "below a file", 1, 1, 0, NULL},
};

/* Builds base/{root,out}: a store root with every kind of way out and a tree outside it, then
 * checks open, stat, list, write and delete against confine_cases. */
static void confinement(const char *base, int fallback) {
  char root[256], out[256], p[512], q[512], cmd[2048];
  br_store_fs_force_fallback(fallback);
  snprintf(root, sizeof root, "%s/root%d", base, fallback);
  snprintf(out, sizeof out, "%s/out%d", base, fallback);
  snprintf(cmd, sizeof cmd, "mkdir -p %s/sub %s/dir && chmod 755 %s", root, out, out);
  CHECK(system(cmd) == 0, "%s", cmd);
  br_store *st = open_fs("c", root, "");
  br_err err;
  snprintf(p, sizeof p, "%s/secret", out);
  write_file(p, "secret!");
  snprintf(p, sizeof p, "%s/dir/f", out);
  write_file(p, "outside");
  snprintf(p, sizeof p, "%s/hl-target", out);
  write_file(p, "linked!");
  snprintf(p, sizeof p, "%s/sub/ok", root);
  write_file(p, "hello");
  snprintf(p, sizeof p, "%s/tmp/up-1-x", root); /* after the open: start-up would remove it */
  write_file(p, "upload");
  snprintf(p, sizeof p, "%s/secret", out), snprintf(q, sizeof q, "%s/link", root);
  CHECK(symlink(p, q) == 0, "symlink %s", q);
  snprintf(q, sizeof q, "%s/rel", root);
  CHECK(symlink("sub/ok", q) == 0, "symlink %s", q);
  snprintf(p, sizeof p, "%s/dir", out), snprintf(q, sizeof q, "%s/d", root);
  CHECK(symlink(p, q) == 0, "symlink %s", q);
  snprintf(q, sizeof q, "%s/dl", root);
  CHECK(symlink(p, q) == 0, "symlink %s", q);
  snprintf(q, sizeof q, "%s/sub/d", root);
  CHECK(symlink(p, q) == 0, "symlink %s", q);
  snprintf(p, sizeof p, "%s/hl-target", out), snprintf(q, sizeof q, "%s/sub/hl", root);
  CHECK(link(p, q) == 0, "link %s: %s", q, strerror(errno));

  for (size_t i = 0; i < sizeof confine_cases / sizeof confine_cases[0]; i++) {
    const char *key = confine_cases[i].key, *want = confine_cases[i].want;
    br_store_reader r;
    err.msg[0] = '\0';
    int rc = br_store_open_read(st, key, &r, &err);
    CHECK(rc == confine_cases[i].open_rc && (rc >= 0 || !want || strstr(err.msg, want)),
          "fallback %d: open %s (%s): %d '%s'", fallback, key, confine_cases[i].what, rc, err.msg);
    if (rc == 0) br_store_reader_close(&r);
    uint64_t size = 0;
    err.msg[0] = '\0';
    rc = br_store_stat(st, key, &size, &err);
    CHECK(rc == confine_cases[i].stat_rc && (rc >= 0 || !want || strstr(err.msg, want)),
          "fallback %d: stat %s (%s): %d '%s'", fallback, key, confine_cases[i].what, rc, err.msg);
  }
  /* the same file through a store that allows hard links */
  br_store_config hcfg = {.name = (char *)"h",
                          .kind = (char *)"fs",
                          .root = root,
                          .public_url = (char *)"",
                          .prefix = (char *)"",
                          .allow_hardlinks = 1};
  br_store *hst = br_store_open(&hcfg, &err);
  CHECK(hst != NULL, "open with allow_hardlinks: %s", err.msg);
  uint64_t size = 0;
  CHECK(hst && br_store_stat(hst, "sub/hl", &size, &err) == 0 && size == 7,
        "allow_hardlinks: stat %s", err.msg);

  /* listing: regular files only, never through a symlink, nothing of tmp/, no hard link */
  char listed[1001] = "";
  CHECK(br_store_list(st, "", collect_keys, listed, &err) == 0 && !strcmp(listed, "sub/ok|"),
        "fallback %d: list: '%s'", fallback, listed);
  listed[0] = '\0';
  CHECK(hst && br_store_list(hst, "sub/", collect_keys, listed, &err) == 0 &&
            strstr(listed, "sub/hl|") && strstr(listed, "sub/ok|") && !strstr(listed, "sub/d"),
        "fallback %d: list with hard links: '%s'", fallback, listed);
  if (hst) br_store_close(hst);

  /* writes: never through a symlinked directory, never into tmp/ */
  CHECK(put(st, "d/new", "x") < 0, "fallback %d: commit through a symlinked directory", fallback);
  snprintf(p, sizeof p, "%s/dir/new", out);
  CHECK(!exists(p), "fallback %d: %s written outside the root", fallback, p);
  CHECK(put(st, "sub/d/deeper/new", "x") < 0, "fallback %d: commit below a symlink", fallback);
  snprintf(p, sizeof p, "%s/dir/deeper", out);
  CHECK(!exists(p), "fallback %d: %s made outside the root", fallback, p);
  CHECK(put(st, "tmp/up-2-y", "x") < 0, "fallback %d: commit into tmp/", fallback);
  CHECK(put(st, "sub/new/deep", "x") == 0, "fallback %d: commit in a new directory", fallback);

  /* deletes: last, each case on its own; nothing outside the root goes, nor the links */
  for (size_t i = 0; i < sizeof confine_cases / sizeof confine_cases[0]; i++) {
    const char *key = confine_cases[i].key, *want = confine_cases[i].want;
    err.msg[0] = '\0';
    int rc = br_store_delete(st, key, &err);
    CHECK(rc == confine_cases[i].delete_rc && (rc >= 0 || !want || strstr(err.msg, want)),
          "fallback %d: delete %s (%s): %d '%s'", fallback, key, confine_cases[i].what, rc,
          err.msg);
  }
  static const char *const survivors[] = {"secret", "dir/f", "hl-target"};
  for (size_t i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", out, survivors[i]);
    CHECK(exists(p), "fallback %d: %s outside the root was deleted", fallback, p);
  }
  static const char *const kept[] = {"link", "rel", "d", "dl", "sub/d", "tmp/up-1-x"};
  for (size_t i = 0; i < 6; i++) {
    snprintf(p, sizeof p, "%s/%s", root, kept[i]);
    CHECK(exists(p), "fallback %d: %s was deleted", fallback, p);
  }
  snprintf(p, sizeof p, "%s/sub/ok", root);
  CHECK(!exists(p), "fallback %d: the regular file was not deleted", fallback);
  br_store_close(st);

  /* a tmp/ that is a symbolic link: the store does not open (uploads and start-up's clean-up
   * would go outside) */
  snprintf(p, sizeof p, "%s/root-tmp%d", base, fallback);
  snprintf(cmd, sizeof cmd, "mkdir -p %s && ln -s %s %s/tmp", p, out, p);
  CHECK(system(cmd) == 0, "%s", cmd);
  br_store_config tcfg = {.name = (char *)"t",
                          .kind = (char *)"fs",
                          .root = p,
                          .public_url = (char *)"",
                          .prefix = (char *)""};
  br_store *tst = br_store_open(&tcfg, &err);
  CHECK(!tst && strstr(err.msg, "symbolic link"), "tmp symlink: %s", tst ? "opened" : err.msg);
  if (tst) br_store_close(tst);
  snprintf(p, sizeof p, "%s/secret", out);
  CHECK(exists(p), "fallback %d: start-up removed %s", fallback, p);
  br_store_fs_force_fallback(0);
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
  CHECK(br_store_redirect_url(st, key, 0, NULL, url, sizeof url, &valid, &err) == 0 &&
            !strncmp(url, "http://cdn.example/b/sha256/58/91/", 34) && valid == UINT64_MAX,
        "redirect url %s, valid %llu", url, (unsigned long long)valid);
  CHECK(br_store_redirect_url(st2, key, 0, NULL, url, sizeof url, &valid, &err) == 1,
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
  /* a copy of a blob is hashed on the way: other bytes than its hash commit nothing */
  CHECK(br_store_copy_blob(st, key, st2, "other/y", digest, &err) < 0 &&
            strstr(err.msg, "digest mismatch") && br_store_stat(st2, "other/y", &size, &err) == 1,
        "copy of bytes that are not the blob's refused: %s", err.msg);
  uint8_t hello[BR_SHA256_LEN];
  br_hex_decode("2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824", 64, hello);
  CHECK(br_store_copy_blob(st, key, st2, "other/y", hello, &err) == 0 &&
            br_store_stat(st2, "other/y", &size, &err) == 0 && size == 5,
        "copy of the blob's bytes: %s", err.msg);

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
  char base[128];
  snprintf(base, sizeof base, "/tmp/blobref-test-store-%d/confine", (int)getpid());
  confinement(base, 0);
  confinement(base, 1);
  snprintf(cmd, sizeof cmd, "rm -rf /tmp/blobref-test-store-%d", (int)getpid());
  if (system(cmd) != 0) fprintf(stderr, "cannot clean up\n");
  return unit_summary("store");
}
