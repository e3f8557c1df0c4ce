/* The store interface: where blob bytes live (a local directory now; S3 and read-only HTTP origins
 * plug in behind the same operations). The daemon, the tools and the table readers use only this.
 */
#ifndef BLOBREF_STORE_H
#define BLOBREF_STORE_H

#include "blobref/common.h"
#include "blobref/config.h"
#include "blobref/source.h"

typedef struct br_store br_store;
typedef struct br_store_writer br_store_writer;

/* An open read handle on one object. For stores that can hand out a file descriptor (fs), fd is a
 * descriptor positioned nowhere in particular (use pread/sendfile at an offset) and owned by the
 * reader until br_store_reader_take_fd(); otherwise fd is -1 and reads go through source. */
typedef struct br_store_reader {
  int fd;
  uint64_t size;
  br_source *source;   /* always set: random access to the object's bytes */
  uint64_t changed_ms; /* fs: the later of the file's mtime and ctime (ms); 0 when unknown */
  uint64_t dev, ino;   /* fs: the open file's st_dev and st_ino; 0 when unknown */
} br_store_reader;

/* The message of an fs store that refuses a key because a component of its path is a symbolic
 * link or the path would leave the root (errno ELOOP). fs stores also refuse keys in their tmp/
 * directory (EPERM) and, unless allow_hardlinks, files with several hard links (EMLINK). */
#define BR_STORE_CONFINED "key leaves the store root or is a symlink"

/* Called by br_store_list for each object; return non-zero to stop the listing. */
typedef int (*br_store_list_fn)(void *ud, const char *key, uint64_t size);

/* Opens the store described by cfg (creating an fs root if needed, removing leftover temp files).
 * Returns NULL with err filled. */
br_store *br_store_open(const br_store_config *cfg, br_err *err);
void br_store_close(br_store *st);
const char *br_store_name(const br_store *st);
const char *br_store_kind(const br_store *st);
enum br_serve_mode br_store_serve_mode(const br_store *st);
/* How long a read from this store may move no byte before it fails (s3, http); 0 = no limit. */
uint64_t br_store_stall_ms(const br_store *st);
/* How many more times a failed read is tried (the store's `retries`). */
unsigned br_store_retries(const br_store *st);

/* Default object key of a blob: "<prefix>sha256/<h[0:2]>/<h[2:4]>/<hex>". out must hold
 * strlen(prefix) + 80 bytes; returns the length written, or 0 if it does not fit. */
size_t br_store_default_key(const br_store *st, const uint8_t digest[BR_SHA256_LEN], char *out,
                            size_t outlen);

/* The blob whose default key (above) key is in st: 0 and its digest, or -1 when key is none's. */
int br_store_default_key_digest(const br_store *st, const char *key, uint8_t digest[BR_SHA256_LEN]);

/* The identity of the object at key (fs: the file's st_dev and st_ino), for a location verified
 * now: 0 with *dev, *ino (both 0 when the store has none), 1 if absent, -1 with err. */
int br_store_identity(br_store *st, const char *key, uint64_t *dev, uint64_t *ino, br_err *err);

/* --- writing: stream bytes in, then commit under a key only once durable ------------------- */

/* Starts a new object. Bytes go to a temporary place inside the store. NULL with err (errno
 * EBUSY: an s3 store's spool is over spool_max or spool_max_total; EHOSTUNREACH: down). */
br_store_writer *br_store_write_begin(br_store *st, br_err *err);
/* Appends len bytes; returns 0, or -1 (err->msg says why; errno ENOSPC/EDQUOT is kept in
 * br_store_writer_errno for a 507, EBUSY when an s3 store's spool is full: 503). */
int br_store_write(br_store_writer *w, const void *buf, size_t len, br_err *err);
/* Why the last write or commit failed: ENOSPC/EDQUOT (no space: 507), EHOSTUNREACH (the store
 * cannot be reached: 503), EBUSY (the s3 spool is full: 503), EPROTO (the store refused: 502), or
 * another errno (500). */
int br_store_writer_errno(const br_store_writer *w);
/* Makes the bytes durable (fsync) and visible under key atomically (rename + directory fsync).
 * Frees w whatever the outcome; on failure nothing is left behind. */
int br_store_write_commit(br_store_writer *w, const char *key, br_err *err);
/* 1 when w holds as many bytes not yet handed on as it should (s3: about two parts waiting for
 * their upload): the caller should stop feeding it until this says 0 again (it does once a part
 * went up, or the upload failed: the next write then says why). With wait = 1 it blocks until
 * then instead and returns 0 (never on a network thread). 0 for stores that do not spool. */
int br_store_write_backlogged(br_store_writer *w, int wait);
/* Bytes spooled for S3 and not yet sent, over every s3 store of the process. */
uint64_t br_store_spooled_bytes(void);
/* Drops the temporary bytes and frees w. NULL is allowed. */
void br_store_write_abort(br_store_writer *w);

/* --- reading ------------------------------------------------------------------------------- */

/* Opens key for reading. Returns 0; 1 if there is no such object; -1 on other errors (errno
 * ELOOP / EPERM / EMLINK for the keys an fs store refuses, see BR_STORE_CONFINED). */
int br_store_open_read(br_store *st, const char *key, br_store_reader *out, br_err *err);
/* Releases a reader (closes fd unless taken). */
void br_store_reader_close(br_store_reader *r);
/* Transfers ownership of the reader's fd to the caller (e.g. to libmicrohttpd for sendfile). */
int br_store_reader_take_fd(br_store_reader *r);

/* Reads key whole: its SHA-256 in out and its size. Returns 0, 1 if absent, -1 with err. */
int br_store_hash(br_store *st, const char *key, uint8_t out[BR_SHA256_LEN], uint64_t *size,
                  br_err *err);
/* br_store_hash of an object whose size the caller already has (a HEAD spared: an S3 store
 * streams one GET through the digest). */
int br_store_hash_expect(br_store *st, const char *key, uint64_t expect, uint8_t out[BR_SHA256_LEN],
                         uint64_t *size, br_err *err);
/* br_store_hash that also copies the first min(size, head_cap) bytes into head (*head_len). */
int br_store_hash_head(br_store *st, const char *key, uint8_t out[BR_SHA256_LEN], uint64_t *size,
                       void *head, size_t head_cap, size_t *head_len, br_err *err);

/* Size of key, or 1 if absent, -1 on error (an fs store refuses the same keys as for reading). */
int br_store_stat(br_store *st, const char *key, uint64_t *size, br_err *err);

/* Writes a URL a client can be redirected to for key (presigned for S3 unless cdn_url is set;
 * public_url or the origin URL + key otherwise) and how long it stays valid in *valid_ms
 * (UINT64_MAX: no expiry). attachment: the URL must make the origin answer with
 * Content-Disposition: attachment (a presigned S3 URL signs response-content-disposition; other
 * redirects cannot promise it and return 1, so the blob is proxied). content_type (NULL or "":
 * none): the Content-Type the answer should carry, signed as response-content-type into a
 * presigned S3 URL (objects written before S3 PUTs carried the type answer binary/octet-stream
 * otherwise); other stores' origins send their own. Returns 0; 1 if this store cannot redirect
 * (so); -1 on error. */
int br_store_redirect_url(br_store *st, const char *key, int attachment, const char *content_type,
                          char *out, size_t outlen, uint64_t *valid_ms, br_err *err);

/* Writes a URL from which this process can GET key itself, with Range (presigned for S3, the
 * origin URL for http). Returns 0; 1 if the store is read through file descriptors (fs); -1 on
 * error. The daemon proxies such stores without blocking a network thread. */
int br_store_fetch_url(br_store *st, const char *key, char *out, size_t outlen, br_err *err);

/* Tells the writer the SHA-256 of everything written (known to the caller): stores that send it
 * to a server for verification (S3) use it instead of hashing again. Optional. */
void br_store_write_set_digest(br_store_writer *w, const uint8_t digest[BR_SHA256_LEN]);

/* Tells the writer the key its commit will use, when the caller knows it before the body (PUT
 * with the hash in the URL): S3 then sends large bodies straight to that key as a multipart upload
 * (invisible until completed) instead of a staging key plus a copy. Optional. */
void br_store_write_key_hint(br_store_writer *w, const char *key);

/* Tells the writer the blob's Content-Type (at most 255 bytes, header-safe; longer is ignored):
 * S3 writes the object with it. Call it before the first write, or before the write that crosses
 * the first part; later calls may come too late for a multipart upload already created. */
void br_store_write_content_type(br_store_writer *w, const char *content_type);

/* Checks that the store answers and accepts our credentials (S3: HEAD of the bucket). Returns 0,
 * or -1 with err saying what is wrong. May block for up to the store's connect timeout. */
int br_store_check(br_store *st, br_err *err);

/* Is the store known to be unreachable right now (a recent connection failure)? Cheap. */
int br_store_unavailable(br_store *st);

/* --- management (migration, reconcile, import) ---------------------------------------------- */

/* Deletes key. Absent keys are not an error. An fs store deletes only a regular file reached
 * beneath its root without a symbolic link (ELOOP otherwise, nothing deleted). */
int br_store_delete(br_store *st, const char *key, br_err *err);
/* Deletes n keys (S3: DeleteObjects in batches of 1,000; others one by one). Absent keys are not
 * an error. failed[i] says whether keys[i] may still be there: set for each key the store reported
 * failed, and for every key of a batch whose answer was refused, unreadable or never came. Returns
 * 0 when all went, or -1 with err naming the first failure (the others are still tried). */
int br_store_delete_many(br_store *st, const char *const *keys, size_t n, uint8_t *failed,
                         br_err *err);
/* Lists objects whose key starts with prefix (fs: in no particular order, regular files only,
 * never through a symbolic link, tmp/ and refused hard links left out; s3: in key order, paged). */
int br_store_list(br_store *st, const char *prefix, br_store_list_fn fn, void *ud, br_err *err);
/* Copies src_key of src into dst under dst_key, durably. Stores of the same kind and endpoint may
 * do it server-side; otherwise the bytes are streamed through. */
int br_store_copy(br_store *src, const char *src_key, br_store *dst, const char *dst_key,
                  br_err *err);
/* br_store_copy of a blob whose SHA-256 is want: a streamed copy hashes what it reads and, if
 * that is not want, commits nothing and fails ("digest mismatch: ..."). A server-side copy cannot
 * be hashed on the way: the caller verifies the target (PUT .../location always does). */
int br_store_copy_blob(br_store *src, const char *src_key, br_store *dst, const char *dst_key,
                       const uint8_t want[BR_SHA256_LEN], br_err *err);

/* --- direct uploads: clients PUT a blob to the store itself, blobrefd verifies and records ---- */

/* What a store offers for direct uploads: none (clients upload through blobrefd), or presigned
 * PUTs whose bytes the backend is known to check against a signed SHA-256 header (trusted: a HEAD
 * on commit is enough for a single-part object that shows it came through such a PUT; others are
 * still re-hashed), or presigned PUTs whose object blobrefd must re-hash before it is recorded. */
enum br_direct_mode { BR_DIRECT_NONE, BR_DIRECT_TRUSTED, BR_DIRECT_REHASH };
enum br_direct_mode br_store_direct_mode(const br_store *st);
/* Largest blob one presigned PUT may carry (the store's part size); 0 when there is none. */
uint64_t br_store_direct_max(const br_store *st);

#define BR_DIRECT_HEADERS 4
/* A presigned single-part PUT: the URL, the headers the client must send exactly as given (they
 * are signed), and when it expires (wall clock, ms). */
typedef struct br_direct_put {
  char url[4096];
  size_t nheaders;
  struct {
    char name[32];
    char value[96];
  } headers[BR_DIRECT_HEADERS];
  uint64_t expires_ms;
} br_direct_put;

/* Presigns a PUT of the blob digest to key, valid presign_ttl, that signs x-amz-checksum-sha256
 * (base64 of digest), x-amz-content-sha256 (hex of digest), If-None-Match: * and
 * x-amz-meta-blobref-sha256 (hex of digest). Returns 0; 1 if the store takes no direct uploads;
 * -1 with err. Pure computation (no I/O). */
int br_store_presign_put(br_store *st, const char *key, const uint8_t digest[BR_SHA256_LEN],
                         br_direct_put *out, br_err *err);

/* Multipart direct uploads (blobs over br_store_direct_max): S3's limits on parts. */
#define BR_DIRECT_MAX_PARTS 10000
#define BR_DIRECT_MIN_PART (5ull << 20)
#define BR_DIRECT_MAX_PART (5ull << 30)
/* Creates a multipart upload under key (the blob's content key; nothing shows there until it is
 * completed) with the object's content type. Returns 0 with upload_id; 1 if the store takes no
 * direct uploads; -1 with err. */
int br_store_multipart_begin(br_store *st, const char *key, const char *content_type,
                             char *upload_id, size_t idlen, br_err *err);
/* Presigns UploadPart number part (1-based) of upload_id, signing x-amz-content-sha256 (hex of
 * part_digest): the store refuses other bytes where it checks that header. Pure computation. */
int br_store_presign_part(br_store *st, const char *key, const char *upload_id, unsigned part,
                          const uint8_t part_digest[BR_SHA256_LEN], br_direct_put *out,
                          br_err *err);
/* Completes upload_id from the parts' ETags in order. Returns 0; 1 when the store refused the
 * client's parts or upload id (err says why); -1 with err (the store failed). */
int br_store_multipart_complete(br_store *st, const char *key, const char *upload_id,
                                const char *const *etags, size_t n, br_err *err);
/* Aborts upload_id (its parts are freed). Returns 0, also when the store no longer knows it. */
int br_store_multipart_abort(br_store *st, const char *key, const char *upload_id, br_err *err);

/* HEAD of key: 0 with *size and, when the store returned one, the object's SHA-256 checksum in
 * sha (*has_sha = 1; on a store trusted on x-amz-content-sha256, the digest a single-part direct
 * PUT marked the object with); 1 if absent; -1 with err. Stores without checksums say
 * *has_sha = 0. */
int br_store_head_checksum(br_store *st, const char *key, uint64_t *size,
                           uint8_t sha[BR_SHA256_LEN], int *has_sha, br_err *err);

#endif
