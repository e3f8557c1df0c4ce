/* The store interface: dispatch to the kind (fs, s3, http) and the generic parts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "blobref/header.h"
#include "blobref/index.h"
#include "store/internal.h"

static const struct store_ops *const kinds[] = {&br_store_fs_ops, &br_store_s3_ops,
                                                &br_store_http_ops};

br_store *br_store_open(const br_store_config *cfg, br_err *err) {
  const struct store_ops *ops = NULL;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (!strcmp(kinds[i]->kind, cfg->kind)) ops = kinds[i];
  if (!ops) {
    br_fail(err, "store %s: kind '%s' is not supported by this build", cfg->name, cfg->kind);
    return NULL;
  }
  br_store *st = calloc(1, sizeof *st);
  if (!st) {
    br_fail(err, "out of memory");
    return NULL;
  }
  st->ops = ops;
  st->cfg = *cfg;
  if (ops->open(st, err) < 0) {
    free(st);
    return NULL;
  }
  return st;
}

void br_store_close(br_store *st) {
  if (!st) return;
  st->ops->close(st);
  free(st);
}

const char *br_store_name(const br_store *st) { return st->cfg.name; }
const char *br_store_kind(const br_store *st) { return st->ops->kind; }
enum br_serve_mode br_store_serve_mode(const br_store *st) { return st->cfg.serve; }
uint64_t br_store_stall_ms(const br_store *st) { return st->cfg.stall_timeout_ms; }
unsigned br_store_retries(const br_store *st) { return (unsigned)st->cfg.retries; }

size_t br_store_default_key(const br_store *st, const uint8_t digest[BR_SHA256_LEN], char *out,
                            size_t outlen) {
  char hex[BR_HEX_LEN + 1];
  br_hex_encode(digest, hex);
  int n = snprintf(out, outlen, "%ssha256/%.2s/%.2s/%s", st->cfg.prefix ? st->cfg.prefix : "", hex,
                   hex + 2, hex);
  return n < 0 || (size_t)n >= outlen ? 0 : (size_t)n;
}

int br_store_default_key_digest(const br_store *st, const char *key,
                                uint8_t digest[BR_SHA256_LEN]) {
  size_t len = strlen(key);
  char want[4096]; /* a longer prefix: no default key fits, none matches */
  if (len < BR_HEX_LEN || br_blob_id_parse(key + len - BR_HEX_LEN, BR_HEX_LEN, digest) < 0)
    return -1;
  size_t n = br_store_default_key(st, digest, want, sizeof want);
  return n == len && !memcmp(want, key, len) ? 0 : -1;
}

int br_store_key_valid(const char *key) {
  /* keys reach Location headers and logs: the header grammar's text rule, then path rules */
  if (br_header_text_check(key, BR_MAX_KEY) || key[0] == '/') return -1;
  const char *seg = key;
  for (const char *p = key;; p++) {
    if (*p == '\\') return -1;
    if (*p == '/' || !*p) {
      size_t len = (size_t)(p - seg);
      if (len == 0 || (len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
        return -1;
      if (!*p) break;
      seg = p + 1;
    }
  }
  return 0;
}

br_store_writer *br_store_write_begin(br_store *st, br_err *err) {
  return st->ops->write_begin(st, err);
}

int br_store_write(br_store_writer *w, const void *buf, size_t len, br_err *err) {
  return w->store->ops->write(w, buf, len, err);
}

int br_store_writer_errno(const br_store_writer *w) { return w->saved_errno; }

int br_store_write_commit(br_store_writer *w, const char *key, br_err *err) {
  if (br_store_key_valid(key) < 0) {
    br_store_write_abort(w);
    return br_fail(err, "invalid object key '%s'", key);
  }
  return w->store->ops->write_commit(w, key, err);
}

int br_store_write_backlogged(br_store_writer *w, int wait) {
  return w->store->ops->write_backlogged ? w->store->ops->write_backlogged(w, wait) : 0;
}

void br_store_write_abort(br_store_writer *w) {
  if (w) w->store->ops->write_abort(w);
}

int br_store_open_read(br_store *st, const char *key, br_store_reader *out, br_err *err) {
  memset(out, 0, sizeof *out);
  out->fd = -1;
  if (br_store_key_valid(key) < 0) return br_fail(err, "invalid object key '%s'", key);
  return st->ops->open_read(st, key, out, err);
}

void br_store_reader_close(br_store_reader *r) {
  br_source_close(r->source);
  r->source = NULL;
  if (r->fd >= 0) {
    close(r->fd);
  }
  r->fd = -1;
}

int br_store_reader_take_fd(br_store_reader *r) {
  int fd = r->fd;
  r->fd = -1;
  return fd;
}

int br_store_identity(br_store *st, const char *key, uint64_t *dev, uint64_t *ino, br_err *err) {
  *dev = *ino = 0;
  if (strcmp(br_store_kind(st), "fs")) return 0; /* no inodes: nothing to open */
  br_store_reader r;
  int rc = br_store_open_read(st, key, &r, err);
  if (rc != 0) return rc;
  *dev = r.dev;
  *ino = r.ino;
  br_store_reader_close(&r);
  return 0;
}

int br_store_stat(br_store *st, const char *key, uint64_t *size, br_err *err) {
  if (br_store_key_valid(key) < 0) return br_fail(err, "invalid object key '%s'", key);
  return st->ops->stat(st, key, size, err);
}

int br_store_redirect_url(br_store *st, const char *key, int attachment, const char *content_type,
                          char *out, size_t outlen, uint64_t *valid_ms, br_err *err) {
  *valid_ms = UINT64_MAX;
  if (!st->ops->redirect_url) return 1;
  return st->ops->redirect_url(st, key, attachment, content_type, out, outlen, valid_ms, err);
}

int br_store_fetch_url(br_store *st, const char *key, char *out, size_t outlen, br_err *err) {
  if (!st->ops->fetch_url) return 1;
  if (br_store_key_valid(key) < 0) return br_fail(err, "invalid object key '%s'", key);
  return st->ops->fetch_url(st, key, out, outlen, err);
}

void br_store_write_set_digest(br_store_writer *w, const uint8_t digest[BR_SHA256_LEN]) {
  memcpy(w->digest, digest, BR_SHA256_LEN);
  w->has_digest = 1;
}

void br_store_write_content_type(br_store_writer *w, const char *content_type) {
  if (!content_type || strlen(content_type) >= sizeof w->content_type) return;
  memcpy(w->content_type, content_type, strlen(content_type) + 1);
}

void br_store_write_key_hint(br_store_writer *w, const char *key) {
  snprintf(w->key_hint, sizeof w->key_hint, "%s", key);
}

int br_store_check(br_store *st, br_err *err) {
  return st->ops->check ? st->ops->check(st, err) : 0;
}

int br_store_unavailable(br_store *st) {
  return st->ops->unavailable ? st->ops->unavailable(st) : 0;
}

int br_store_delete(br_store *st, const char *key, br_err *err) {
  if (br_store_key_valid(key) < 0) return br_fail(err, "invalid object key '%s'", key);
  return st->ops->remove(st, key, err);
}

int br_store_delete_many(br_store *st, const char *const *keys, size_t n, uint8_t *failed,
                         br_err *err) {
  int out = 0;
  br_err one;
  for (size_t i = 0; i < n; i++) {
    failed[i] = br_store_key_valid(keys[i]) < 0;
    if (failed[i] && !out++) br_fail(err, "invalid object key '%s'", keys[i]);
  }
  if (st->ops->remove_many) {
    /* the valid keys only, in one list */
    const char **valid = malloc((n ? n : 1) * sizeof *valid);
    uint8_t *vf = calloc(n ? n : 1, 1);
    size_t nv = 0;
    if (!valid || !vf) {
      free(valid);
      free(vf);
      memset(failed, 1, n);
      return br_fail(err, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
      if (!failed[i]) valid[nv++] = keys[i];
    int rc = nv ? st->ops->remove_many(st, valid, nv, vf, out ? &one : err) : 0;
    for (size_t i = 0, j = 0; i < n; i++)
      if (!failed[i]) failed[i] = vf[j++];
    free(valid);
    free(vf);
    return rc < 0 || out ? -1 : 0;
  }
  for (size_t i = 0; i < n; i++) {
    if (failed[i]) continue;
    if (st->ops->remove(st, keys[i], out ? &one : err) < 0) {
      failed[i] = 1;
      out++;
    }
  }
  return out ? -1 : 0;
}

int br_store_list(br_store *st, const char *prefix, br_store_list_fn fn, void *ud, br_err *err) {
  return st->ops->list(st, prefix, fn, ud, err);
}

int br_store_copy(br_store *src, const char *src_key, br_store *dst, const char *dst_key,
                  br_err *err) {
  return br_store_copy_blob(src, src_key, dst, dst_key, NULL, err);
}

int br_store_copy_blob(br_store *src, const char *src_key, br_store *dst, const char *dst_key,
                       const uint8_t want[BR_SHA256_LEN], br_err *err) {
  if (br_store_key_valid(src_key) < 0 || br_store_key_valid(dst_key) < 0)
    return br_fail(err, "invalid object key");
  if (dst->ops->copy_from && src->ops == dst->ops) {
    int sc = dst->ops->copy_from(dst, dst_key, src, src_key, err);
    if (sc <= 0) return sc;
  }
  br_store_reader r;
  int rc = br_store_open_read(src, src_key, &r, err);
  if (rc != 0) return rc > 0 ? br_fail(err, "%s: %s: no such object", src->cfg.name, src_key) : -1;
  br_store_writer *w = br_store_write_begin(dst, err);
  if (!w) {
    br_store_reader_close(&r);
    return -1;
  }
  enum { CHUNK = 1 << 20 };
  char *buf = malloc(CHUNK);
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  rc = buf && ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ? 0 : br_fail(err, "out of memory");
  for (uint64_t off = 0; rc == 0 && off < r.size;) {
    size_t n = r.size - off < CHUNK ? (size_t)(r.size - off) : CHUNK;
    rc = r.source->pread(r.source, buf, n, off, err);
    if (rc == 0) EVP_DigestUpdate(ctx, buf, n);
    if (rc == 0) rc = br_store_write(w, buf, n, err);
    if (rc == 0) br_store_write_backlogged(w, 1); /* S3: at most two parts spooled */
    off += n;
  }
  uint8_t got[BR_SHA256_LEN];
  if (rc == 0) EVP_DigestFinal_ex(ctx, got, NULL);
  if (rc == 0 && want && memcmp(got, want, BR_SHA256_LEN)) {
    char ghex[BR_HEX_LEN + 1], whex[BR_HEX_LEN + 1];
    br_hex_encode(got, ghex);
    br_hex_encode(want, whex);
    rc = br_fail(err, "digest mismatch: %s:%s read as SHA-256 %s, not %s (nothing written)",
                 src->cfg.name, src_key, ghex, whex);
  }
  free(buf);
  EVP_MD_CTX_free(ctx);
  br_store_reader_close(&r);
  if (rc < 0) {
    br_store_write_abort(w);
    return -1;
  }
  if (want) br_store_write_set_digest(w, want);
  return br_store_write_commit(w, dst_key, err);
}

int br_store_hash(br_store *st, const char *key, uint8_t out[BR_SHA256_LEN], uint64_t *size,
                  br_err *err) {
  if (st->ops->hash) return st->ops->hash(st, key, 0, out, size, err);
  return br_store_hash_head(st, key, out, size, NULL, 0, NULL, err);
}

int br_store_hash_expect(br_store *st, const char *key, uint64_t expect, uint8_t out[BR_SHA256_LEN],
                         uint64_t *size, br_err *err) {
  if (st->ops->hash) return st->ops->hash(st, key, expect, out, size, err);
  return br_store_hash_head(st, key, out, size, NULL, 0, NULL, err);
}

int br_store_hash_head(br_store *st, const char *key, uint8_t out[BR_SHA256_LEN], uint64_t *size,
                       void *head, size_t head_cap, size_t *head_len, br_err *err) {
  if (head_len) *head_len = 0;
  br_store_reader r;
  int rc = br_store_open_read(st, key, &r, err);
  if (rc) return rc;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  enum { CHUNK = 1 << 20 };
  char *buf = malloc(CHUNK);
  rc = ctx && buf && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ? 0 : br_fail(err, "out of memory");
  for (uint64_t off = 0; rc == 0 && off < r.size;) {
    size_t n = r.size - off < CHUNK ? (size_t)(r.size - off) : CHUNK;
    rc = r.source->pread(r.source, buf, n, off, err);
    if (rc == 0) EVP_DigestUpdate(ctx, buf, n);
    if (rc == 0 && off == 0 && head && head_len) {
      *head_len = n < head_cap ? n : head_cap;
      memcpy(head, buf, *head_len);
    }
    off += n;
  }
  if (rc == 0) EVP_DigestFinal_ex(ctx, out, NULL);
  *size = r.size;
  free(buf);
  EVP_MD_CTX_free(ctx);
  br_store_reader_close(&r);
  return rc;
}

enum br_direct_mode br_store_direct_mode(const br_store *st) {
  return st->ops->direct_mode ? st->ops->direct_mode(st) : BR_DIRECT_NONE;
}

uint64_t br_store_direct_max(const br_store *st) {
  if (br_store_direct_mode(st) == BR_DIRECT_NONE) return 0;
  return st->cfg.part_size ? st->cfg.part_size : 16u << 20;
}

int br_store_presign_put(br_store *st, const char *key, const uint8_t digest[BR_SHA256_LEN],
                         br_direct_put *out, br_err *err) {
  if (br_store_direct_mode(st) == BR_DIRECT_NONE || !st->ops->presign_put) return 1;
  return st->ops->presign_put(st, key, digest, out, err);
}

int br_store_multipart_begin(br_store *st, const char *key, const char *content_type,
                             char *upload_id, size_t idlen, br_err *err) {
  if (br_store_direct_mode(st) == BR_DIRECT_NONE || !st->ops->multipart_begin) return 1;
  return st->ops->multipart_begin(st, key, content_type, upload_id, idlen, err);
}

int br_store_presign_part(br_store *st, const char *key, const char *upload_id, unsigned part,
                          const uint8_t part_digest[BR_SHA256_LEN], br_direct_put *out,
                          br_err *err) {
  if (!st->ops->presign_part) return br_fail(err, "store %s: no multipart uploads", st->cfg.name);
  return st->ops->presign_part(st, key, upload_id, part, part_digest, out, err);
}

int br_store_multipart_complete(br_store *st, const char *key, const char *upload_id,
                                const char *const *etags, size_t n, br_err *err) {
  if (!st->ops->multipart_complete) return (br_fail(err, "no multipart uploads"), 1);
  return st->ops->multipart_complete(st, key, upload_id, etags, n, err);
}

int br_store_multipart_abort(br_store *st, const char *key, const char *upload_id, br_err *err) {
  if (!st->ops->multipart_abort) return 0;
  return st->ops->multipart_abort(st, key, upload_id, err);
}

int br_store_head_checksum(br_store *st, const char *key, uint64_t *size,
                           uint8_t sha[BR_SHA256_LEN], int *has_sha, br_err *err) {
  *has_sha = 0;
  if (st->ops->head_checksum) return st->ops->head_checksum(st, key, size, sha, has_sha, err);
  return br_store_stat(st, key, size, err);
}
