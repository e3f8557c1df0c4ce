/* The fs store: blobs as files under a root directory, written via temp file + fsync + rename.
 * Every key is resolved beneath the root without following a symbolic link in any component
 * (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or one O_NOFOLLOW component at a time from the
 * root's fd on kernels without it), so nothing outside the root is ever read, written or deleted
 * (PRODUCT.md invariant 10). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "store/internal.h"

#define TMP_DIR "tmp"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

/* Directories known to be durable (created, and their entry in the parent fsynced) by this
 * process: an open-addressing set of relative paths. A directory that merely exists may have
 * been made by a concurrent upload that has not fsynced its parent yet, so it does not count. */
struct dir_set {
  pthread_mutex_t lock;
  char **slots;
  size_t cap, count;
};

struct fs_store {
  int root_fd; /* every path is resolved beneath this (open_beneath, or one *at() per component) */
  int tmp_fd;  /* root/tmp, where uploads are written before their rename (-1: read-only) */
  char root[PATH_MAX];
  struct dir_set durable;
};

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int dir_set_has(struct dir_set *ds, const char *dir) {
  pthread_mutex_lock(&ds->lock);
  int found = 0;
  if (ds->cap)
    for (size_t i = hash_str(dir) & (ds->cap - 1); ds->slots[i]; i = (i + 1) & (ds->cap - 1))
      if (!strcmp(ds->slots[i], dir)) {
        found = 1;
        break;
      }
  pthread_mutex_unlock(&ds->lock);
  return found;
}

/* Adds dir; failures to allocate only cost a later fsync, so they are ignored. */
static void dir_set_add(struct dir_set *ds, const char *dir) {
  pthread_mutex_lock(&ds->lock);
  if ((ds->count + 1) * 2 > ds->cap) {
    size_t cap = ds->cap ? ds->cap * 2 : 1024;
    char **slots = calloc(cap, sizeof *slots);
    if (!slots) goto out;
    for (size_t i = 0; i < ds->cap; i++) {
      if (!ds->slots[i]) continue;
      size_t j = hash_str(ds->slots[i]) & (cap - 1);
      while (slots[j]) j = (j + 1) & (cap - 1);
      slots[j] = ds->slots[i];
    }
    free(ds->slots);
    ds->slots = slots;
    ds->cap = cap;
  }
  size_t i = hash_str(dir) & (ds->cap - 1);
  for (; ds->slots[i]; i = (i + 1) & (ds->cap - 1))
    if (!strcmp(ds->slots[i], dir)) goto out;
  ds->slots[i] = strdup(dir);
  if (ds->slots[i]) ds->count++;
out:
  pthread_mutex_unlock(&ds->lock);
}

static void dir_set_free(struct dir_set *ds) {
  for (size_t i = 0; i < ds->cap; i++) free(ds->slots[i]);
  free(ds->slots);
  pthread_mutex_destroy(&ds->lock);
}

struct fs_writer {
  struct br_store_writer base;
  int fd;
  char tmp_name[64]; /* relative to tmp_fd ("" once renamed) */
};

static struct fs_store *fs_of(br_store *st) { return st->impl; }

/* ---- confinement ----------------------------------------------------------------------------- */

/* 1 while openat2(2) is usable; cleared for good by its first ENOSYS (a kernel before 5.6, or a
 * seccomp filter that hides it), or by a test through br_store_fs_force_fallback. */
static atomic_int have_openat2 = 1;

void br_store_fs_force_fallback(int on) { atomic_store(&have_openat2, !on); }

/* openat(dfd, name, flags | O_NOFOLLOW | O_CLOEXEC), a symbolic link at name reported as ELOOP
 * whatever the flags (with O_DIRECTORY the kernel says ENOTDIR). */
static int openat_nofollow(int dfd, const char *name, int flags) {
  int fd = openat(dfd, name, flags | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0 || errno != ENOTDIR) return fd;
  struct stat sb;
  errno =
      fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode) ? ELOOP : ENOTDIR;
  return -1;
}

/* Opens the directory comp of dfd as an O_PATH fd, refusing "", ".." and symbolic links (ELOOP)
 * and what is not a directory (ENOTDIR). Returns the fd or -1 with errno. */
static int open_component(int dfd, const char *comp) {
  if (!*comp || !strcmp(comp, "..")) {
    errno = ELOOP;
    return -1;
  }
  int fd = openat(dfd, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat sb;
  int e = 0;
  if (fstat(fd, &sb) < 0)
    e = errno;
  else if (S_ISLNK(sb.st_mode))
    e = ELOOP;
  else if (!S_ISDIR(sb.st_mode))
    e = ENOTDIR;
  if (!e) return fd;
  close(fd);
  errno = e;
  return -1;
}

/* The walk used without openat2: from root_fd, one directory component at a time
 * (open_component), then the last one opened with flags | O_NOFOLLOW (an O_PATH open of a
 * symbolic link succeeds, so that one is checked by fstat). */
static int open_walk(int root_fd, const char *rel, int flags) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", rel) >= (int)sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int dfd = root_fd;
  char *comp = buf;
  for (char *slash = strchr(comp, '/'); slash; slash = strchr(comp, '/')) {
    *slash = '\0';
    int next = open_component(dfd, comp);
    int e = errno;
    if (dfd != root_fd) close(dfd);
    if (next < 0) {
      errno = e;
      return -1;
    }
    dfd = next;
    comp = slash + 1;
  }
  int fd = -1, e = ELOOP;
  if (*comp && strcmp(comp, "..")) {
    fd = openat_nofollow(dfd, comp, flags);
    e = errno;
  }
  struct stat sb;
  if (fd >= 0 && (flags & O_PATH)) {
    if (fstat(fd, &sb) < 0)
      e = errno;
    else if (S_ISLNK(sb.st_mode))
      e = ELOOP;
    else
      e = 0;
    if (e) {
      close(fd);
      fd = -1;
    }
  }
  if (dfd != root_fd) close(dfd);
  if (fd < 0) errno = e;
  return fd;
}

/* Opens rel (a key, a directory of one, or "." for the root itself) beneath root_fd without
 * following a symbolic link in any component. flags are open(2) flags without O_CREAT (O_CLOEXEC
 * is added). Returns the fd, or -1 with errno: ELOOP when a component is a symbolic link or the
 * path would leave the root, ENOENT or ENOTDIR when it is absent, another errno otherwise. */
static int open_beneath(int root_fd, const char *rel, int flags) {
  if (atomic_load(&have_openat2)) {
    struct open_how how = {
        .flags = (uint64_t)(flags | O_CLOEXEC),
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    for (int attempt = 0; attempt < 8; attempt++) {
      long fd = syscall(SYS_openat2, root_fd, rel, &how, sizeof how);
      if (fd >= 0) return (int)fd;
      if (errno == EXDEV) errno = ELOOP; /* RESOLVE_BENEATH: it would leave the root */
      if (errno != EAGAIN) break;        /* EAGAIN: a rename raced the walk; try again */
    }
    if (errno != ENOSYS) return -1;
    atomic_store(&have_openat2, 0);
  }
  return open_walk(root_fd, rel, flags);
}

/* Keys the fs store refuses whatever the files say: those in tmp/, where uploads wait for their
 * rename and which start-up empties. Returns 0, or -1 with err and errno EPERM. */
static int check_key(br_store *st, const char *key, br_err *err) {
  size_t n = strlen(TMP_DIR);
  if (strncmp(key, TMP_DIR, n) || (key[n] && key[n] != '/')) return 0;
  br_fail(err,
          "store %s: %s: the key is in the store's " TMP_DIR
          "/ directory (uploads in progress, emptied at start-up)",
          st->cfg.name, key);
  errno = EPERM;
  return -1;
}

/* Fills err for op on key failing with errno e (a symbolic link or a way out of the root reads
 * the same everywhere) and returns -1 with errno = e. */
static int fail_key(br_store *st, const char *op, const char *key, int e, br_err *err) {
  if (e == ELOOP)
    br_fail(err, "store %s: %s %s: " BR_STORE_CONFINED, st->cfg.name, op, key);
  else
    br_fail(err, "store %s: %s %s: %s", st->cfg.name, op, key, strerror(e));
  errno = e;
  return -1;
}

/* A file with more than one name may also be reachable from outside the root (a hard link made
 * to a file the store must not serve): refused unless the store allows it. 0, or -1 (EMLINK). */
static int check_links(br_store *st, const char *key, const struct stat *sb, br_err *err) {
  if (sb->st_nlink <= 1 || st->cfg.allow_hardlinks) return 0;
  br_fail(err,
          "store %s: %s has %ju hard links: refused (set allow_hardlinks = true in [store %s] "
          "if that is intended)",
          st->cfg.name, key, (uintmax_t)sb->st_nlink, st->cfg.name);
  errno = EMLINK;
  return -1;
}

/* Splits key into its directory (written to dir, "" for the root) and returns its last
 * component (a pointer into key). */
static const char *split_key(const char *key, char dir[PATH_MAX]) {
  const char *slash = strrchr(key, '/');
  size_t n = slash ? (size_t)(slash - key) : 0;
  if (n >= PATH_MAX) n = PATH_MAX - 1;
  memcpy(dir, key, n);
  dir[n] = '\0';
  return slash ? slash + 1 : key;
}

/* ---- opening --------------------------------------------------------------------------------- */

/* fsyncs fd (a directory); on failure err names what and errno says why (for ENOSPC). */
static int fsync_dir(int fd, const char *what, br_err *err) {
  if (fsync(fd) == 0) return 0;
  int e = errno;
  br_fail(err, "fsync directory %s: %s", what, strerror(e));
  errno = e;
  return -1;
}

/* fsyncs a directory of the root's own (".", ".."), which the operator's path names. */
static int fsync_dir_at(int root_fd, const char *rel, br_err *err) {
  int fd = openat(root_fd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return br_fail(err, "open directory %s: %s", rel, strerror(errno));
  int rc = fsync_dir(fd, rel, err);
  int e = errno;
  close(fd);
  errno = e;
  return rc;
}

/* Removes leftovers of uploads that never committed (the server stopped mid-upload). */
static void remove_temp_files(struct fs_store *fs) {
  int dfd = openat(fs->tmp_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  int removed = 0;
  for (struct dirent *e = readdir(d); e; e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    /* "up-<pid>-<random>": keep the temp files of another live process sharing this root */
    int pid = 0;
    if (sscanf(e->d_name, "up-%d-", &pid) == 1 && pid > 0 && pid != (int)getpid() &&
        (kill(pid, 0) == 0 || errno == EPERM))
      continue;
    if (unlinkat(dfd, e->d_name, 0) == 0) removed++;
  }
  closedir(d);
  if (removed)
    br_info("store: removed %d leftover temp file(s) under %s/" TMP_DIR, removed, fs->root);
}

static int mkdir_p(const char *path) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) < 0 && errno != EEXIST) return -1;
    *p = '/';
  }
  if (mkdir(buf, 0755) < 0 && errno != EEXIST) return -1;
  return 0;
}

static void fs_free(struct fs_store *fs) {
  if (fs->root_fd >= 0) close(fs->root_fd);
  if (fs->tmp_fd >= 0) close(fs->tmp_fd);
  dir_set_free(&fs->durable);
  free(fs);
}

static int fs_open(br_store *st, br_err *err) {
  struct fs_store *fs = calloc(1, sizeof *fs);
  if (!fs) return br_fail(err, "out of memory");
  pthread_mutex_init(&fs->durable.lock, NULL);
  fs->root_fd = fs->tmp_fd = -1;
  snprintf(fs->root, sizeof fs->root, "%s", st->cfg.root);
  if (!st->cfg.read_only && mkdir_p(fs->root) < 0) {
    br_fail(err, "store %s: cannot create %s: %s", st->cfg.name, fs->root, strerror(errno));
    fs_free(fs);
    return -1;
  }
  /* the root's own path is the operator's: it may go through symbolic links */
  fs->root_fd = open(fs->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fs->root_fd < 0) {
    br_fail(err, "store %s: cannot open %s: %s", st->cfg.name, fs->root, strerror(errno));
    fs_free(fs);
    return -1;
  }
  if (st->cfg.read_only) {
    st->impl = fs;
    return 0;
  }
  if (mkdirat(fs->root_fd, TMP_DIR, 0700) < 0 && errno != EEXIST) {
    br_fail(err, "store %s: cannot create %s/" TMP_DIR ": %s", st->cfg.name, fs->root,
            strerror(errno));
    fs_free(fs);
    return -1;
  }
  /* a tmp that is a symbolic link would take uploads, and start-up's clean-up, elsewhere */
  fs->tmp_fd = openat_nofollow(fs->root_fd, TMP_DIR, O_RDONLY | O_DIRECTORY);
  if (fs->tmp_fd < 0) {
    br_fail(err, "store %s: cannot open %s/" TMP_DIR ": %s", st->cfg.name, fs->root,
            errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    fs_free(fs);
    return -1;
  }
  /* the root and tmp/ themselves must survive a crash before any blob is acknowledged */
  if (fsync_dir_at(fs->root_fd, ".", err) < 0 || fsync_dir_at(fs->root_fd, "..", err) < 0) {
    fs_free(fs);
    return -1;
  }
  st->impl = fs;
  remove_temp_files(fs);
  return 0;
}

static void fs_close(br_store *st) { fs_free(fs_of(st)); }

/* ---- writing --------------------------------------------------------------------------------- */

static br_store_writer *fs_write_begin(br_store *st, br_err *err) {
  struct fs_store *fs = fs_of(st);
  if (fs->tmp_fd < 0) {
    br_fail(err, "store %s: opened read-only", st->cfg.name);
    return NULL;
  }
  struct fs_writer *w = calloc(1, sizeof *w);
  if (!w) {
    br_fail(err, "out of memory");
    return NULL;
  }
  w->base.store = st;
  for (int attempt = 0; attempt < 8; attempt++) {
    uint64_t r = ((uint64_t)random() << 31) ^ (uint64_t)random() ^ br_now_ms();
    snprintf(w->tmp_name, sizeof w->tmp_name, "up-%d-%016llx", (int)getpid(),
             (unsigned long long)r);
    w->fd =
        openat(fs->tmp_fd, w->tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (w->fd >= 0 || errno != EEXIST) break;
  }
  if (w->fd < 0) {
    br_fail(err, "store %s: create temp file: %s", st->cfg.name, strerror(errno));
    free(w);
    return NULL;
  }
  return &w->base;
}

static int fs_write(br_store_writer *bw, const void *buf, size_t len, br_err *err) {
  struct fs_writer *w = (struct fs_writer *)bw;
  const char *p = buf;
  while (len) {
    ssize_t n = write(w->fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      bw->saved_errno = errno;
      return br_fail(err, "store %s: write: %s", bw->store->cfg.name, strerror(errno));
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static void fs_write_abort(br_store_writer *bw) {
  struct fs_writer *w = (struct fs_writer *)bw;
  struct fs_store *fs = fs_of(bw->store);
  if (w->fd >= 0) close(w->fd);
  unlinkat(fs->tmp_fd, w->tmp_name, 0);
  free(w);
}

/* Opens the directory that holds key (O_RDONLY, so that it can be fsynced), creating what is
 * missing on the way: one component at a time from the root, none of them a symbolic link (each
 * opened with O_NOFOLLOW from its parent's fd). A directory this process has not made durable yet
 * (fs->durable) gets its entry in its parent fsynced. Returns the fd, fs->root_fd itself for a key
 * without '/' (not to be closed), or -1 with err and errno (ELOOP: a symbolic link). */
static int open_parent_for_write(br_store *st, const char *key, br_err *err) {
  struct fs_store *fs = fs_of(st);
  char dir[PATH_MAX];
  split_key(key, dir);
  if (!*dir) return fs->root_fd;
  if (dir_set_has(&fs->durable, dir)) {
    int fd = open_beneath(fs->root_fd, dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) return fd;
    if (errno != ENOENT) return fail_key(st, "open directory", dir, errno, err);
    /* removed since: made again below */
  }
  int dfd = fs->root_fd;
  for (char *comp = dir;;) {
    char *slash = strchr(comp, '/');
    if (slash) *slash = '\0';
    int e = 0;
    if (mkdirat(dfd, comp, 0755) < 0 && errno != EEXIST) e = errno;
    int next = e ? -1 : openat_nofollow(dfd, comp, O_RDONLY | O_DIRECTORY);
    if (!e && next < 0) e = errno;
    /* dir holds the path up to this component now: its entry lives in dfd */
    if (!e && !dir_set_has(&fs->durable, dir)) {
      if (fsync_dir(dfd, dir, err) < 0)
        e = errno;
      else
        dir_set_add(&fs->durable, dir);
    }
    if (dfd != fs->root_fd) close(dfd);
    dfd = next;
    if (e) {
      if (dfd >= 0) close(dfd);
      return fail_key(st, "mkdir", dir, e, err);
    }
    if (!slash) return dfd;
    *slash = '/';
    comp = slash + 1;
  }
}

static int fs_write_commit(br_store_writer *bw, const char *key, br_err *err) {
  struct fs_writer *w = (struct fs_writer *)bw;
  br_store *st = bw->store;
  struct fs_store *fs = fs_of(st);
  int rc = -1, pfd = -1;
  char dir[PATH_MAX];
  const char *last = split_key(key, dir);
  if (check_key(st, key, err) < 0) {
    bw->saved_errno = errno;
    goto done;
  }
  if (fsync(w->fd) < 0) {
    bw->saved_errno = errno;
    br_fail(err, "fsync: %s", strerror(errno));
    goto done;
  }
  if (close(w->fd) < 0) {
    w->fd = -1;
    bw->saved_errno = errno;
    br_fail(err, "close: %s", strerror(errno));
    goto done;
  }
  w->fd = -1;
  pfd = open_parent_for_write(st, key, err);
  if (pfd < 0) {
    bw->saved_errno = errno;
    goto done;
  }
  /* the target's directory is an fd resolved beneath the root: a symlink put in the key's path
   * meanwhile changes nothing (one at the last component is replaced, not followed) */
  if (renameat(fs->tmp_fd, w->tmp_name, pfd, last) < 0) {
    bw->saved_errno = errno;
    br_fail(err, "rename to %s: %s", key, strerror(errno));
    goto done;
  }
  w->tmp_name[0] = '\0';
  rc = fsync_dir(pfd, *dir ? dir : ".", err);
  if (rc < 0) bw->saved_errno = errno;
done:;
  int saved = bw->saved_errno;
  if (pfd >= 0 && pfd != fs->root_fd) close(pfd);
  if (w->fd >= 0) close(w->fd);
  if (w->tmp_name[0]) unlinkat(fs->tmp_fd, w->tmp_name, 0);
  free(w);
  if (rc < 0) errno = saved; /* lets callers tell "disk full" from other failures */
  return rc;
}

/* ---- reading --------------------------------------------------------------------------------- */

static int fs_open_read(br_store *st, const char *key, br_store_reader *out, br_err *err) {
  struct fs_store *fs = fs_of(st);
  if (check_key(st, key, err) < 0) return -1;
  /* O_NONBLOCK: a FIFO put at the key must not hang the open; cleared below for the file */
  int fd = open_beneath(fs->root_fd, key, O_RDONLY | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return 1;
    return fail_key(st, "open", key, errno, err);
  }
  struct stat sb;
  if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return br_fail(err, "store %s: %s is not a regular file", st->cfg.name, key);
  }
  if (check_links(st, key, &sb, err) < 0) {
    close(fd);
    errno = EMLINK;
    return -1;
  }
  if (fcntl(fd, F_SETFL, 0) < 0) {
    int e = errno;
    close(fd);
    return fail_key(st, "open", key, e, err);
  }
  out->fd = fd;
  out->size = (uint64_t)sb.st_size;
  /* a write, a truncate, a rename into place or a touch moves one of them: the reader compares
   * it with the time the bytes were last hashed (the location's verified_at) */
  uint64_t mtime_ms = (uint64_t)sb.st_mtim.tv_sec * 1000 + (uint64_t)sb.st_mtim.tv_nsec / 1000000;
  uint64_t ctime_ms = (uint64_t)sb.st_ctim.tv_sec * 1000 + (uint64_t)sb.st_ctim.tv_nsec / 1000000;
  out->changed_ms = mtime_ms > ctime_ms ? mtime_ms : ctime_ms;
  out->dev = (uint64_t)sb.st_dev;
  out->ino = (uint64_t)sb.st_ino;
  out->source = br_source_from_fd(fd, out->size, key, err);
  if (!out->source) {
    close(fd);
    out->fd = -1;
    return -1;
  }
  return 0;
}

static int fs_stat(br_store *st, const char *key, uint64_t *size, br_err *err) {
  if (check_key(st, key, err) < 0) return -1;
  int fd = open_beneath(fs_of(st)->root_fd, key, O_PATH);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return 1;
    return fail_key(st, "stat", key, errno, err);
  }
  struct stat sb;
  int rc = fstat(fd, &sb);
  int e = errno;
  close(fd);
  if (rc < 0) return fail_key(st, "stat", key, e, err);
  if (!S_ISREG(sb.st_mode)) return 1;
  if (check_links(st, key, &sb, err) < 0) return -1;
  *size = (uint64_t)sb.st_size;
  return 0;
}

static int fs_redirect_url(br_store *st, const char *key, int attachment, const char *content_type,
                           char *out, size_t outlen, uint64_t *valid_ms, br_err *err) {
  (void)valid_ms;
  (void)content_type; /* public_url's server names its own type */
  const char *base = st->cfg.public_url;
  if (!base || !*base || attachment) return 1; /* public_url's server sets its own headers */
  size_t blen = strlen(base), klen = strlen(key);
  size_t slash = blen && base[blen - 1] == '/' ? 0 : 1;
  if (blen + slash + klen >= outlen) return br_fail(err, "redirect URL too long");
  memcpy(out, base, blen); /* no printf: every redirect comes here */
  if (slash) out[blen] = '/';
  memcpy(out + blen + slash, key, klen + 1);
  return 0;
}

/* ---- management ------------------------------------------------------------------------------ */

/* Deletes key: its directory opened beneath the root (no symbolic link on the way), the last
 * component checked to be a regular file (not followed), then unlinked from that directory. */
static int fs_remove(br_store *st, const char *key, br_err *err) {
  struct fs_store *fs = fs_of(st);
  if (check_key(st, key, err) < 0) return -1;
  char dir[PATH_MAX];
  const char *last = split_key(key, dir);
  int pfd = *dir ? open_beneath(fs->root_fd, dir, O_RDONLY | O_DIRECTORY) : fs->root_fd;
  if (pfd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return 0;
    return fail_key(st, "delete", key, errno, err);
  }
  int rc = 0;
  struct stat sb;
  if (fstatat(pfd, last, &sb, AT_SYMLINK_NOFOLLOW) < 0) {
    if (errno != ENOENT) rc = fail_key(st, "delete", key, errno, err);
  } else if (S_ISLNK(sb.st_mode)) {
    rc = fail_key(st, "delete", key, ELOOP, err);
  } else if (!S_ISREG(sb.st_mode)) {
    rc = br_fail(err, "store %s: delete %s: not a regular file", st->cfg.name, key);
  } else if (unlinkat(pfd, last, 0) < 0) {
    /* (a symlink swapped in since the check is unlinked itself, never followed) */
    if (errno != ENOENT) rc = fail_key(st, "delete", key, errno, err);
  } else {
    rc = fsync_dir(pfd, *dir ? dir : ".", err);
  }
  if (pfd != fs->root_fd) close(pfd);
  return rc;
}

/* Recursive walk of the directory dfd (at rel, relative to the root; dfd is taken over). Only
 * real directories are entered (each opened with O_NOFOLLOW from its parent's fd), only regular
 * files are reported (hard-linked ones only when the store allows them), tmp/ is skipped. */
static int list_dir(br_store *st, int dfd, char *rel, size_t rel_len, const char *prefix,
                    br_store_list_fn fn, void *ud, int depth, br_err *err) {
  if (depth > 64) {
    close(dfd);
    return br_fail(err, "directory tree too deep at %s", rel);
  }
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return br_fail(err, "opendir %s: %s", rel_len ? rel : ".", strerror(errno));
  }
  int rc = 0;
  size_t plen = strlen(prefix);
  for (struct dirent *e = readdir(d); e && rc == 0; e = readdir(d)) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (!rel_len && !strcmp(e->d_name, TMP_DIR)) continue;
    size_t nlen = strlen(e->d_name);
    if (rel_len + nlen + 2 >= PATH_MAX) continue;
    size_t new_len = rel_len;
    if (rel_len) rel[new_len++] = '/';
    memcpy(rel + new_len, e->d_name, nlen + 1);
    new_len += nlen;
    struct stat sb;
    size_t cmp = new_len < plen ? new_len : plen;
    if (strncmp(rel, prefix, cmp) == 0 &&
        fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISDIR(sb.st_mode)) {
        int sub = openat_nofollow(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY);
        if (sub >= 0)
          rc = list_dir(st, sub, rel, new_len, prefix, fn, ud, depth + 1, err);
        else if (errno != ENOENT && errno != ELOOP && errno != ENOTDIR) /* else: swapped since */
          rc = br_fail(err, "open %s: %s", rel, strerror(errno));
      } else if (S_ISREG(sb.st_mode) && (sb.st_nlink <= 1 || st->cfg.allow_hardlinks) &&
                 new_len >= plen && fn(ud, rel, (uint64_t)sb.st_size)) {
        rc = 1;
      }
    }
    rel[rel_len] = '\0';
  }
  closedir(d);
  return rc < 0 ? -1 : 0;
}

static int fs_list(br_store *st, const char *prefix, br_store_list_fn fn, void *ud, br_err *err) {
  char rel[PATH_MAX] = "";
  int dfd = openat(fs_of(st)->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return br_fail(err, "open %s: %s", fs_of(st)->root, strerror(errno));
  return list_dir(st, dfd, rel, 0, prefix ? prefix : "", fn, ud, 0, err);
}

const struct store_ops br_store_fs_ops = {
    .kind = "fs",
    .open = fs_open,
    .close = fs_close,
    .write_begin = fs_write_begin,
    .write = fs_write,
    .write_commit = fs_write_commit,
    .write_abort = fs_write_abort,
    .open_read = fs_open_read,
    .stat = fs_stat,
    .redirect_url = fs_redirect_url,
    .remove = fs_remove,
    .list = fs_list,
};
