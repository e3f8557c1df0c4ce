/* A random-access byte source: what the Parquet, Avro and Iceberg readers read from, whether the
 * bytes live in a local file, an S3 object or memory. */
#ifndef BLOBREF_SOURCE_H
#define BLOBREF_SOURCE_H

#include "blobref/common.h"

typedef struct br_source br_source;
struct br_source {
  uint64_t size; /* total length in bytes */
  /* Reads exactly len bytes at offset off into buf; returns 0, or -1 with err filled (short
   * reads are errors). */
  int (*pread)(br_source *src, void *buf, size_t len, uint64_t off, br_err *err);
  void (*close)(br_source *src); /* releases everything, including src itself */
};

/* Opens a local file as a source. Returns NULL with err filled on failure. */
br_source *br_source_open_file(const char *path, br_err *err);

/* Wraps an open descriptor of a regular file of the given size. The descriptor is borrowed (not
 * closed by the source) and must stay open while the source is used; name is for messages. */
br_source *br_source_from_fd(int fd, uint64_t size, const char *name, br_err *err);

/* Wraps memory as a source; the memory is borrowed and must outlive the source. */
br_source *br_source_from_memory(const void *data, size_t len, br_err *err);

/* Reads the whole source into a malloc'd buffer if it is at most max bytes (else an error).
 * A NUL is appended (not counted in *len) so text parsers may use it directly. */
int br_source_read_all(br_source *src, uint64_t max, uint8_t **out, size_t *len, br_err *err);

static inline void br_source_close(br_source *src) {
  if (src) src->close(src);
}

#endif
