/* Random-access byte sources over local files and memory. */
#include "blobref/source.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct file_source {
  br_source base;
  int fd;
  int owns_fd;
  char path[256];
};

static int file_pread(br_source *src, void *buf, size_t len, uint64_t off, br_err *err) {
  struct file_source *fs = (struct file_source *)src;
  if (off > src->size || len > src->size - off)
    return br_fail(err, "%s: read of %zu bytes at %llu is past the end (%llu bytes)", fs->path, len,
                   (unsigned long long)off, (unsigned long long)src->size);
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fs->fd, (char *)buf + done, len - done, (off_t)(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return br_fail(err, "%s: read: %s", fs->path, strerror(errno));
    if (n == 0) return br_fail(err, "%s: file shrank while reading", fs->path);
    done += (size_t)n;
  }
  return 0;
}

static void file_close(br_source *src) {
  struct file_source *fs = (struct file_source *)src;
  if (fs->owns_fd) close(fs->fd);
  free(fs);
}

static br_source *file_source_new(int fd, uint64_t size, int owns_fd, const char *name,
                                  br_err *err) {
  struct file_source *fs = calloc(1, sizeof *fs);
  if (!fs) {
    br_fail(err, "out of memory");
    return NULL;
  }
  fs->base.size = size;
  fs->base.pread = file_pread;
  fs->base.close = file_close;
  fs->fd = fd;
  fs->owns_fd = owns_fd;
  snprintf(fs->path, sizeof fs->path, "%s", name);
  return &fs->base;
}

br_source *br_source_from_fd(int fd, uint64_t size, const char *name, br_err *err) {
  return file_source_new(fd, size, 0, name, err);
}

br_source *br_source_open_file(const char *path, br_err *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    br_fail(err, "%s: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    br_fail(err, "%s: not a regular file", path);
    close(fd);
    return NULL;
  }
  br_source *src = file_source_new(fd, (uint64_t)st.st_size, 1, path, err);
  if (!src) close(fd);
  return src;
}

struct mem_source {
  br_source base;
  const uint8_t *data;
};

static int mem_pread(br_source *src, void *buf, size_t len, uint64_t off, br_err *err) {
  struct mem_source *ms = (struct mem_source *)src;
  if (off > src->size || len > src->size - off)
    return br_fail(err, "read of %zu bytes at %llu is past the end (%llu bytes)", len,
                   (unsigned long long)off, (unsigned long long)src->size);
  if (len) memcpy(buf, ms->data + off, len);
  return 0;
}

static void mem_close(br_source *src) { free(src); }

br_source *br_source_from_memory(const void *data, size_t len, br_err *err) {
  struct mem_source *ms = calloc(1, sizeof *ms);
  if (!ms) {
    br_fail(err, "out of memory");
    return NULL;
  }
  ms->base.size = len;
  ms->base.pread = mem_pread;
  ms->base.close = mem_close;
  ms->data = data;
  return &ms->base;
}

int br_source_read_all(br_source *src, uint64_t max, uint8_t **out, size_t *len, br_err *err) {
  if (src->size > max)
    return br_fail(err, "file is %llu bytes, over the limit of %llu", (unsigned long long)src->size,
                   (unsigned long long)max);
  uint8_t *buf = malloc((size_t)src->size + 1);
  if (!buf) return br_fail(err, "out of memory");
  if (src->pread(src, buf, (size_t)src->size, 0, err) < 0) {
    free(buf);
    return -1;
  }
  buf[src->size] = '\0';
  *out = buf;
  *len = (size_t)src->size;
  return 0;
}
