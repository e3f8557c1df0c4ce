/* The fs store: blobs as files under a root directory, written via temp file + fsync + rename. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "store/internal.h"

#define TMP_DIR "tmp"

/* Directories known to be durable (created, and their entry in the parent fsynced) by this
 * process: an open-addressing set of relative paths. A directory that merely exists may have
 * been made by a concurrent upload that has not fsynced its parent yet, so it does not count. */
struct dir_set {
  pthread_mutex_t lock;
  char **slots;
  size_t cap, count;
};

struct fs_store {
  int root_fd; /* every path is resolved relative to this with the *at() calls */
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
  char tmp_name[64]; /* relative to the root */
};

static struct fs_store *fs_of(br_store *st) { return st->impl; }

/* fsyncs a directory; on failure errno says why (for telling ENOSPC apart). */
static int fsync_dir_at(int root_fd, const char *rel, br_err *err) {
  int fd = openat(root_fd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return br_fail(err, "open directory %s: %s", rel, strerror(errno));
  int rc = fsync(fd);
  int e = errno;
  close(fd);
  if (rc < 0) {
    br_fail(err, "fsync directory %s: %s", rel, strerror(e));
    errno = e;
    return -1;
  }
  return 0;
}

/* fsyncs the directory holding key (relative to the root). */
static int fsync_parent_of(struct fs_store *fs, const char *key, br_err *err) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", key);
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = '\0';
  else
    strcpy(dir, ".");
  return fsync_dir_at(fs->root_fd, dir, err);
}

/* Removes leftovers of uploads that never committed (the server stopped mid-upload). */
static void remove_temp_files(struct fs_store *fs) {
  int dfd = openat(fs->root_fd, TMP_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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

static int fs_open(br_store *st, br_err *err) {
  struct fs_store *fs = calloc(1, sizeof *fs);
  if (!fs) return br_fail(err, "out of memory");
  pthread_mutex_init(&fs->durable.lock, NULL);
  snprintf(fs->root, sizeof fs->root, "%s", st->cfg.root);
  if (st->cfg.read_only) {
    fs->root_fd = open(fs->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fs->root_fd < 0) {
      br_fail(err, "store %s: cannot open %s: %s", st->cfg.name, fs->root, strerror(errno));
      free(fs);
      return -1;
    }
    st->impl = fs;
    return 0;
  }
  if (mkdir_p(fs->root) < 0) {
    br_fail(err, "store %s: cannot create %s: %s", st->cfg.name, fs->root, strerror(errno));
    free(fs);
    return -1;
  }
  fs->root_fd = open(fs->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fs->root_fd < 0 || (mkdirat(fs->root_fd, TMP_DIR, 0700) < 0 && errno != EEXIST)) {
    br_fail(err, "store %s: cannot open %s: %s", st->cfg.name, fs->root, strerror(errno));
    if (fs->root_fd >= 0) close(fs->root_fd);
    free(fs);
    return -1;
  }
  st->impl = fs;
  /* the root and tmp/ themselves must survive a crash before any blob is acknowledged */
  if (fsync_dir_at(fs->root_fd, ".", err) < 0 || fsync_dir_at(fs->root_fd, "..", err) < 0) {
    close(fs->root_fd);
    dir_set_free(&fs->durable);
    free(fs);
    return -1;
  }
  remove_temp_files(fs);
  return 0;
}

static void fs_close(br_store *st) {
  struct fs_store *fs = fs_of(st);
  close(fs->root_fd);
  dir_set_free(&fs->durable);
  free(fs);
}

static br_store_writer *fs_write_begin(br_store *st, br_err *err) {
  struct fs_store *fs = fs_of(st);
  struct fs_writer *w = calloc(1, sizeof *w);
  if (!w) {
    br_fail(err, "out of memory");
    return NULL;
  }
  w->base.store = st;
  for (int attempt = 0; attempt < 8; attempt++) {
    uint64_t r = ((uint64_t)random() << 31) ^ (uint64_t)random() ^ br_now_ms();
    snprintf(w->tmp_name, sizeof w->tmp_name, TMP_DIR "/up-%d-%016llx", (int)getpid(),
             (unsigned long long)r);
    w->fd = openat(fs->root_fd, w->tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
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
  unlinkat(fs->root_fd, w->tmp_name, 0);
  free(w);
}

/* Makes sure the parent directories of key (relative to the root) exist durably: each component
 * is created if needed and its entry in its parent fsynced, unless this process already did so.
 * On failure errno says why. */
static int make_parents(struct fs_store *fs, const char *key, br_err *err) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", key);
  char *slash = strrchr(dir, '/');
  if (!slash) return 0;
  *slash = '\0';
  if (dir_set_has(&fs->durable, dir)) return 0;
  for (char *p = dir;; p++) {
    if (*p != '/' && *p) continue;
    char saved = *p;
    *p = '\0';
    if (!dir_set_has(&fs->durable, dir)) {
      if (mkdirat(fs->root_fd, dir, 0755) < 0 && errno != EEXIST)
        return br_fail(err, "mkdir %s/%s: %s", fs->root, dir, strerror(errno));
      char *parent_end = strrchr(dir, '/');
      int rc;
      if (parent_end) {
        *parent_end = '\0';
        rc = fsync_dir_at(fs->root_fd, dir, err);
        *parent_end = '/';
      } else {
        rc = fsync_dir_at(fs->root_fd, ".", err);
      }
      if (rc < 0) return -1;
      dir_set_add(&fs->durable, dir);
    }
    *p = saved;
    if (!saved) break;
  }
  return 0;
}

static int fs_write_commit(br_store_writer *bw, const char *key, br_err *err) {
  struct fs_writer *w = (struct fs_writer *)bw;
  struct fs_store *fs = fs_of(bw->store);
  int rc = -1;
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
  if (make_parents(fs, key, err) < 0) {
    bw->saved_errno = errno;
    goto done;
  }
  if (renameat(fs->root_fd, w->tmp_name, fs->root_fd, key) < 0) {
    bw->saved_errno = errno;
    br_fail(err, "rename to %s: %s", key, strerror(errno));
    goto done;
  }
  w->tmp_name[0] = '\0';
  rc = fsync_parent_of(fs, key, err);
  if (rc < 0) bw->saved_errno = errno;
done:;
  int saved = bw->saved_errno;
  if (w->fd >= 0) close(w->fd);
  if (w->tmp_name[0]) unlinkat(fs->root_fd, w->tmp_name, 0);
  free(w);
  if (rc < 0) errno = saved; /* lets callers tell "disk full" from other failures */
  return rc;
}

static int fs_open_read(br_store *st, const char *key, br_store_reader *out, br_err *err) {
  struct fs_store *fs = fs_of(st);
  int fd = openat(fs->root_fd, key, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return 1;
    return br_fail(err, "store %s: open %s: %s", st->cfg.name, key, strerror(errno));
  }
  struct stat sb;
  if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return br_fail(err, "store %s: %s is not a regular file", st->cfg.name, key);
  }
  out->fd = fd;
  out->size = (uint64_t)sb.st_size;
  out->source = br_source_from_fd(fd, out->size, key, err);
  if (!out->source) {
    close(fd);
    out->fd = -1;
    return -1;
  }
  return 0;
}

static int fs_stat(br_store *st, const char *key, uint64_t *size, br_err *err) {
  struct stat sb;
  if (fstatat(fs_of(st)->root_fd, key, &sb, 0) < 0) {
    if (errno == ENOENT) return 1;
    return br_fail(err, "store %s: stat %s: %s", st->cfg.name, key, strerror(errno));
  }
  if (!S_ISREG(sb.st_mode)) return 1;
  *size = (uint64_t)sb.st_size;
  return 0;
}

static int fs_redirect_url(br_store *st, const char *key, char *out, size_t outlen,
                           uint64_t *valid_ms, br_err *err) {
  (void)valid_ms;
  const char *base = st->cfg.public_url;
  if (!base || !*base) return 1;
  size_t blen = strlen(base), klen = strlen(key);
  size_t slash = blen && base[blen - 1] == '/' ? 0 : 1;
  if (blen + slash + klen >= outlen) return br_fail(err, "redirect URL too long");
  memcpy(out, base, blen); /* no printf: every redirect comes here */
  if (slash) out[blen] = '/';
  memcpy(out + blen + slash, key, klen + 1);
  return 0;
}

static int fs_remove(br_store *st, const char *key, br_err *err) {
  struct fs_store *fs = fs_of(st);
  if (unlinkat(fs->root_fd, key, 0) < 0) {
    if (errno == ENOENT) return 0;
    return br_fail(err, "store %s: unlink %s: %s", st->cfg.name, key, strerror(errno));
  }
  return fsync_parent_of(fs, key, err);
}

/* Recursive walk below rel (relative to the root); the tmp directory is skipped. */
static int list_dir(struct fs_store *fs, char *rel, size_t rel_len, const char *prefix,
                    br_store_list_fn fn, void *ud, int depth, br_err *err) {
  if (depth > 64) return br_fail(err, "directory tree too deep at %s", rel);
  int dfd = openat(fs->root_fd, rel_len ? rel : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return errno == ENOENT ? 0 : br_fail(err, "open %s: %s", rel, strerror(errno));
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return br_fail(err, "opendir %s: %s", rel, strerror(errno));
  }
  int rc = 0;
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
    if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
      size_t plen = strlen(prefix);
      size_t cmp = new_len < plen ? new_len : plen;
      if (strncmp(rel, prefix, cmp) == 0) {
        if (S_ISDIR(sb.st_mode))
          rc = list_dir(fs, rel, new_len, prefix, fn, ud, depth + 1, err);
        else if (S_ISREG(sb.st_mode) && new_len >= plen && fn(ud, rel, (uint64_t)sb.st_size))
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
  return list_dir(fs_of(st), rel, 0, prefix ? prefix : "", fn, ud, 0, err);
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
