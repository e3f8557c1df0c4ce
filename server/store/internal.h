/* Private to the store modules: the per-kind operations table behind br_store_*. */
#ifndef BLOBREF_STORE_INTERNAL_H
#define BLOBREF_STORE_INTERNAL_H

#include "blobref/store.h"

struct store_ops {
  const char *kind;
  int (*open)(br_store *st, br_err *err);
  void (*close)(br_store *st);
  br_store_writer *(*write_begin)(br_store *st, br_err *err);
  int (*write)(br_store_writer *w, const void *buf, size_t len, br_err *err);
  int (*write_commit)(br_store_writer *w, const char *key, br_err *err);
  void (*write_abort)(br_store_writer *w);
  int (*write_backlogged)(br_store_writer *w, int wait); /* optional: never backlogged */
  int (*open_read)(br_store *st, const char *key, br_store_reader *out, br_err *err);
  int (*stat)(br_store *st, const char *key, uint64_t *size, br_err *err);
  /* attachment: only a URL whose origin answers with Content-Disposition: attachment, else 1;
   * content_type: the type the answer should carry (NULL: the origin's) */
  int (*redirect_url)(br_store *st, const char *key, int attachment, const char *content_type,
                      char *out, size_t outlen, uint64_t *valid_ms, br_err *err);
  int (*remove)(br_store *st, const char *key, br_err *err);
  int (*list)(br_store *st, const char *prefix, br_store_list_fn fn, void *ud, br_err *err);
  /* optional */
  int (*fetch_url)(br_store *st, const char *key, char *out, size_t outlen, br_err *err);
  int (*remove_many)(br_store *st, const char *const *keys, size_t n, uint8_t *failed, br_err *err);
  int (*check)(br_store *st, br_err *err);
  int (*unavailable)(br_store *st);
  /* server-side copy from src (same kind); returns 1 when it cannot (other endpoint) */
  int (*copy_from)(br_store *dst, const char *dst_key, br_store *src, const char *src_key,
                   br_err *err);
  /* direct uploads (optional: none offered) */
  enum br_direct_mode (*direct_mode)(const br_store *st);
  int (*presign_put)(br_store *st, const char *key, const uint8_t digest[BR_SHA256_LEN],
                     br_direct_put *out, br_err *err);
  int (*multipart_begin)(br_store *st, const char *key, const char *content_type, char *upload_id,
                         size_t idlen, br_err *err);
  int (*presign_part)(br_store *st, const char *key, const char *upload_id, unsigned part,
                      const uint8_t part_digest[BR_SHA256_LEN], br_direct_put *out, br_err *err);
  int (*multipart_complete)(br_store *st, const char *key, const char *upload_id,
                            const char *const *etags, size_t n, br_err *err);
  int (*multipart_abort)(br_store *st, const char *key, const char *upload_id, br_err *err);
  int (*head_checksum)(br_store *st, const char *key, uint64_t *size, uint8_t sha[BR_SHA256_LEN],
                       int *has_sha, br_err *err);
  /* optional: the SHA-256 and size of key in one pass (br_store_hash; expect: its size when
   * known, else 0); else open_read + pread */
  int (*hash)(br_store *st, const char *key, uint64_t expect, uint8_t out[BR_SHA256_LEN],
              uint64_t *size, br_err *err);
};

struct br_store {
  const struct store_ops *ops;
  br_store_config cfg; /* strings borrowed from the config, which outlives the store */
  void *impl;          /* kind-specific state */
};

/* Every writer starts with this header so the generic layer can find its store and errno. */
struct br_store_writer {
  br_store *store;
  int saved_errno;
  int has_digest;
  uint8_t digest[BR_SHA256_LEN];
  char key_hint[1100];    /* the key the commit will use, when known at the start ("" = not) */
  char content_type[256]; /* what the object is served with ("" = the store's default) */
};

extern const struct store_ops br_store_fs_ops;
extern const struct store_ops br_store_s3_ops;
extern const struct store_ops br_store_http_ops;

/* Checks that a key is a relative path without "." or ".." components, empty components,
 * backslashes or control characters. Returns 0 or -1. */
int br_store_key_valid(const char *key);

/* Tests: makes the fs store resolve keys without openat2(2) (on = 1), as on kernels before 5.6,
 * or with it again where the kernel has it (on = 0). */
void br_store_fs_force_fallback(int on);

#endif
