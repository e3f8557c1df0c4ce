/* `blobrefd --export-index` / `--import-index`: an index moved between kinds through a file.
 * Format (version 1): the line "BLOBREF-INDEX-EXPORT 1\n"; then entries 'R' digest[32] u32le len
 * record[len] (br_record_encode) and 'P' digest[32] (a pending CDN purge); then the trailer 'T'
 * u64le records u64le purges sha256[32] (of every byte before the 'T'), and nothing after. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/index_move.h"
#include "core/server.h"

#define MOVE_MAGIC "BLOBREF-INDEX-EXPORT 1\n"
#define MOVE_MAGIC_LEN (sizeof MOVE_MAGIC - 1)
#define TRAILER_LEN (1 + 8 + 8 + BR_SHA256_LEN)
#define IMPORT_BATCH 256

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* ---- export ---------------------------------------------------------------------------------- */

struct exporter {
  FILE *f;
  EVP_MD_CTX *sha;
  uint64_t records, purges;
  int failed;
};

/* Writes n bytes to the file and the checksum. */
static int emit(struct exporter *x, const void *p, size_t n) {
  EVP_DigestUpdate(x->sha, p, n);
  if (fwrite(p, 1, n, x->f) != n) x->failed = 1;
  return x->failed;
}

static int export_record(void *ud, const uint8_t digest[BR_SHA256_LEN], const br_record *rec) {
  struct exporter *x = ud;
  uint8_t buf[BR_RECORD_MAX_ENCODED];
  size_t len = br_record_encode(rec, buf, sizeof buf);
  if (len == 0) {
    fprintf(stderr, "blobrefd: a record does not encode\n");
    return x->failed = 1;
  }
  uint8_t head[1 + BR_SHA256_LEN + 4] = {'R'};
  memcpy(head + 1, digest, BR_SHA256_LEN);
  for (int i = 0; i < 4; i++) head[1 + BR_SHA256_LEN + i] = (uint8_t)(len >> (8 * i));
  if (emit(x, head, sizeof head) || emit(x, buf, len)) return 1;
  x->records++;
  return 0;
}

/* Every pending purge, due or not, in digest order. */
static int export_purges(br_index *idx, struct exporter *x, br_err *err) {
  enum { PAGE = 1024 };
  static br_purge page[PAGE];
  uint8_t next[BR_SHA256_LEN];
  int wrapped = 0, started = 0;
  while (!wrapped) {
    int n = br_index_purges_due(idx, started ? next : NULL, UINT64_MAX, page, PAGE, next, &wrapped,
                                err);
    if (n < 0) return -1;
    started = 1;
    for (int i = 0; i < n; i++) {
      uint8_t e[1 + BR_SHA256_LEN] = {'P'};
      memcpy(e + 1, page[i].digest, BR_SHA256_LEN);
      if (emit(x, e, sizeof e)) return br_fail(err, "write: %s", strerror(errno));
      x->purges++;
    }
  }
  return 0;
}

int br_index_export(br_config *cfg, const char *path) {
  br_server server = {0}, *srv = &server;
  br_err err;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (br_server_open(srv, cfg, BR_OPEN_CHECK, &err) < 0) {
    fprintf(stderr, "blobrefd: %s\n", err.msg);
    br_server_close(srv);
    return 2;
  }
  struct exporter x = {.f = fopen(tmp, "wb"), .sha = EVP_MD_CTX_new()};
  int rc = 2;
  if (!x.f) {
    fprintf(stderr, "blobrefd: cannot create %s: %s\n", tmp, strerror(errno));
    goto out;
  }
  EVP_DigestInit_ex(x.sha, EVP_sha256(), NULL);
  emit(&x, MOVE_MAGIC, MOVE_MAGIC_LEN);
  /* the records from one snapshot: one LMDB read transaction, or one PostgreSQL REPEATABLE READ
   * transaction read in key-ordered pages; the purges are read after, in pages of their own */
  if (br_index_foreach(srv->index, export_record, &x, &err) < 0 ||
      export_purges(srv->index, &x, &err) < 0) {
    fprintf(stderr, "blobrefd: export: %s\n", err.msg);
    goto out;
  }
  uint8_t trailer[TRAILER_LEN] = {'T'};
  put_u64(trailer + 1, x.records);
  put_u64(trailer + 9, x.purges);
  EVP_DigestFinal_ex(x.sha, trailer + 17, NULL);
  if (x.failed || fwrite(trailer, 1, sizeof trailer, x.f) != sizeof trailer || fflush(x.f) != 0 ||
      fsync(fileno(x.f)) != 0) {
    fprintf(stderr, "blobrefd: cannot write %s: %s\n", tmp, strerror(errno));
    goto out;
  }
  if (fclose(x.f) != 0 || rename(tmp, path) != 0) {
    x.f = NULL;
    fprintf(stderr, "blobrefd: cannot write %s: %s\n", path, strerror(errno));
    goto out;
  }
  x.f = NULL;
  printf("export: %" PRIu64 " records, %" PRIu64 " pending purges from the %s index to %s\n",
         x.records, x.purges, br_index_kind(srv->index), path);
  rc = 0;
out:
  if (x.f) fclose(x.f);
  if (rc) unlink(tmp);
  EVP_MD_CTX_free(x.sha);
  br_server_close(srv);
  return rc;
}

/* ---- reading a file -------------------------------------------------------------------------- */

/* One entry of a file: kind 'R' (digest, rec/len) or 'P' (digest), 'T' (trailer in tail). */
struct entry {
  int kind;
  uint8_t digest[BR_SHA256_LEN];
  uint8_t rec[BR_RECORD_MAX_ENCODED];
  size_t len;
  uint8_t tail[TRAILER_LEN - 1];
};

/* Reads the next entry (updating sha for R and P). Returns 0, or -1 with err. */
static int read_entry(FILE *f, EVP_MD_CTX *sha, struct entry *e, br_err *err) {
  int c = fgetc(f);
  if (c == EOF) return br_fail(err, "truncated: no trailer");
  e->kind = c;
  uint8_t k = (uint8_t)c;
  if (c == 'T') {
    if (fread(e->tail, 1, sizeof e->tail, f) != sizeof e->tail)
      return br_fail(err, "truncated trailer");
    if (fgetc(f) != EOF) return br_fail(err, "bytes after the trailer");
    return 0;
  }
  if (c != 'R' && c != 'P') return br_fail(err, "unknown entry 0x%02x", c);
  EVP_DigestUpdate(sha, &k, 1);
  if (fread(e->digest, 1, BR_SHA256_LEN, f) != BR_SHA256_LEN) return br_fail(err, "truncated");
  EVP_DigestUpdate(sha, e->digest, BR_SHA256_LEN);
  if (c == 'P') return 0;
  uint8_t l[4];
  if (fread(l, 1, 4, f) != 4) return br_fail(err, "truncated");
  EVP_DigestUpdate(sha, l, 4);
  e->len = (size_t)l[0] | (size_t)l[1] << 8 | (size_t)l[2] << 16 | (size_t)l[3] << 24;
  if (e->len == 0 || e->len > sizeof e->rec) return br_fail(err, "record length %zu", e->len);
  if (fread(e->rec, 1, e->len, f) != e->len) return br_fail(err, "truncated");
  EVP_DigestUpdate(sha, e->rec, e->len);
  return 0;
}

/* Opens path and checks its magic; the magic goes into sha. NULL + err. */
static FILE *open_export(const char *path, EVP_MD_CTX *sha, br_err *err) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    br_fail(err, "cannot open %s: %s", path, strerror(errno));
    return NULL;
  }
  char magic[MOVE_MAGIC_LEN];
  if (fread(magic, 1, sizeof magic, f) != sizeof magic || memcmp(magic, MOVE_MAGIC, sizeof magic)) {
    fclose(f);
    br_fail(err, "%s: not an index export (version 1)", path);
    return NULL;
  }
  EVP_DigestInit_ex(sha, EVP_sha256(), NULL);
  EVP_DigestUpdate(sha, magic, sizeof magic);
  return f;
}

/* The whole file's check, before anything is written: every entry well formed (records decode),
 * then a trailer whose counts and SHA-256 match. Returns 0 and the counts, or -1 + err. */
static int verify_export(const char *path, uint64_t *records, uint64_t *purges, br_err *err) {
  EVP_MD_CTX *sha = EVP_MD_CTX_new();
  FILE *f = open_export(path, sha, err);
  int rc = f ? 0 : -1;
  static struct entry e;
  uint64_t nr = 0, np = 0;
  while (rc == 0) {
    if (read_entry(f, sha, &e, err) < 0) {
      rc = -1;
      break;
    }
    if (e.kind == 'T') break;
    br_record rec;
    if (e.kind == 'R' && br_record_decode(e.rec, e.len, &rec, err) < 0) rc = -1;
    e.kind == 'R' ? nr++ : np++;
  }
  if (rc == 0) {
    uint8_t got[BR_SHA256_LEN];
    EVP_DigestFinal_ex(sha, got, NULL);
    if (get_u64(e.tail) != nr || get_u64(e.tail + 8) != np)
      rc = br_fail(err,
                   "trailer counts %" PRIu64 " records, %" PRIu64 " purges; file has %" PRIu64
                   ", %" PRIu64,
                   get_u64(e.tail), get_u64(e.tail + 8), nr, np);
    else if (memcmp(got, e.tail + 16, BR_SHA256_LEN) != 0)
      rc = br_fail(err, "SHA-256 mismatch");
  }
  if (rc < 0 && f) {
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    br_fail(err, "%s: %s", path, msg);
  }
  if (f) fclose(f);
  EVP_MD_CTX_free(sha);
  *records = nr;
  *purges = np;
  return rc;
}

/* ---- import ---------------------------------------------------------------------------------- */

struct importer {
  br_index *idx;
  br_loc_change changes[IMPORT_BATCH];
  br_record recs[IMPORT_BATCH];
  uint8_t encoded[IMPORT_BATCH][BR_RECORD_MAX_ENCODED];
  size_t lens[IMPORT_BATCH];
  size_t n;
  uint8_t (*purges)[BR_SHA256_LEN];
  size_t npurges, cap_purges;
  uint64_t inserted, present, conflicts;
};

/* Inserts the batch; a record present is identical (skipped) or a conflict (reported). */
static int flush_batch(struct importer *im, br_err *err) {
  if (im->n == 0) return 0;
  int rc = br_index_apply_locations(im->idx, im->changes, im->n, br_now_ms(), err);
  if (rc < 0) return rc;
  for (size_t i = 0; i < im->n; i++) {
    br_loc_change *c = &im->changes[i];
    char hex[BR_HEX_LEN + 1];
    br_hex_encode(c->digest, hex);
    uint8_t now[BR_RECORD_MAX_ENCODED];
    size_t len = 0;
    if (c->outcome == BR_LOC_APPLIED) {
      im->inserted++;
    } else if ((c->outcome == BR_LOC_EXISTS || c->outcome == BR_LOC_DUPLICATE) &&
               (len = br_record_encode(&c->after, now, sizeof now)) == im->lens[i] &&
               !memcmp(now, im->encoded[i], len)) {
      im->present++;
    } else {
      printf("%s: %s\n", hex,
             c->outcome == BR_LOC_KEY_TAKEN ? "a location is another record's; not imported"
                                            : "present with a different record; left as it is");
      im->conflicts++;
    }
  }
  im->n = 0;
  return 0;
}

static int add_record(struct importer *im, const struct entry *e, br_err *err) {
  size_t i = im->n;
  if (br_record_decode(e->rec, e->len, &im->recs[i], err) < 0) return -1;
  memcpy(im->encoded[i], e->rec, e->len);
  im->lens[i] = e->len;
  im->changes[i] = (br_loc_change){.kind = BR_LOC_INSERT, .rec = &im->recs[i]};
  memcpy(im->changes[i].digest, e->digest, BR_SHA256_LEN);
  if (++im->n == IMPORT_BATCH) return flush_batch(im, err);
  return 0;
}

static int add_purge(struct importer *im, const uint8_t digest[BR_SHA256_LEN], br_err *err) {
  if (im->npurges == im->cap_purges) {
    size_t cap = im->cap_purges ? im->cap_purges * 2 : 1024;
    void *p = realloc(im->purges, cap * sizeof *im->purges);
    if (!p) return br_fail(err, "out of memory");
    im->purges = p;
    im->cap_purges = cap;
  }
  memcpy(im->purges[im->npurges++], digest, BR_SHA256_LEN);
  return 0;
}

/* Every record of the file is in the index as the file has it. Returns how many are, or -1. */
static int64_t count_matching(br_index *idx, const char *path, br_err *err) {
  EVP_MD_CTX *sha = EVP_MD_CTX_new();
  FILE *f = open_export(path, sha, err);
  int64_t same = f ? 0 : -1;
  static struct entry e;
  while (same >= 0 && read_entry(f, sha, &e, err) == 0 && e.kind != 'T') {
    if (e.kind != 'R') continue;
    br_record rec;
    uint8_t now[BR_RECORD_MAX_ENCODED];
    int rc = br_index_get(idx, e.digest, &rec, err);
    if (rc < 0)
      same = -1;
    else if (rc == 0 && br_record_encode(&rec, now, sizeof now) == e.len &&
             !memcmp(now, e.rec, e.len))
      same++;
  }
  if (f) fclose(f);
  EVP_MD_CTX_free(sha);
  return same;
}

int br_index_import(br_config *cfg, const char *path) {
  br_err err;
  uint64_t records = 0, purges = 0;
  if (verify_export(path, &records, &purges, &err) < 0) {
    fprintf(stderr, "blobrefd: refusing to import: %s (nothing was written)\n", err.msg);
    return 2;
  }
  if (mkdir(cfg->data_dir, 0755) < 0 && errno != EEXIST) {
    fprintf(stderr, "blobrefd: cannot create %s: %s\n", cfg->data_dir, strerror(errno));
    return 2;
  }
  br_server server = {0}, *srv = &server;
  if (br_server_open(srv, cfg, BR_OPEN_IMPORT, &err) < 0) {
    fprintf(stderr, "blobrefd: %s\n", err.msg);
    br_server_close(srv);
    return 2;
  }
  struct importer *im = calloc(1, sizeof *im);
  EVP_MD_CTX *sha = EVP_MD_CTX_new();
  FILE *f = im ? open_export(path, sha, &err) : NULL;
  int rc = f ? 0 : -1;
  if (im) im->idx = srv->index;
  static struct entry e;
  while (rc == 0 && (rc = read_entry(f, sha, &e, &err)) == 0 && e.kind != 'T')
    rc = e.kind == 'R' ? add_record(im, &e, &err) : add_purge(im, e.digest, &err);
  if (rc == 0) rc = flush_batch(im, &err);
  if (rc == 0 && im->npurges)
    rc = br_index_queue_purges(srv->index, (const uint8_t(*)[BR_SHA256_LEN])im->purges, im->npurges,
                               &err);
  int64_t same = rc == 0 ? count_matching(srv->index, path, &err) : -1;
  int status = 2;
  if (rc < 0 || same < 0) {
    fprintf(stderr, "blobrefd: import: %s\n", im ? err.msg : "out of memory");
  } else {
    printf("import: %" PRIu64 " records in %s: %" PRIu64 " inserted, %" PRIu64
           " present already, %" PRIu64 " conflicting; %" PRIu64 " pending purges queued\n",
           records, path, im->inserted, im->present, im->conflicts, purges);
    printf("import: %" PRId64 " of %" PRIu64 " records are in the %s index as in the file%s\n",
           same, records, br_index_kind(srv->index),
           (uint64_t)same == records ? ": complete" : ": INCOMPLETE");
    status = (uint64_t)same == records && im->conflicts == 0 ? 0 : 1;
  }
  if (f) fclose(f);
  EVP_MD_CTX_free(sha);
  if (im) free(im->purges);
  free(im);
  br_server_close(srv);
  return status;
}
