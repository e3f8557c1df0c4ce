/* Iceberg manifest lists and manifests: a bounded Avro object-container reader. libavro parses the
 * writer schema from the file header; records are decoded here against that schema so that every
 * length, count and codec error is checked (libavro's file reader ignores codec errors and cannot
 * tell end of file from a damaged block, which would let a walk end early and under-report). */
#include <avro.h>
#include <snappy-c.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "iceberg/internal.h"

#define MAX_DEPTH 64
#define MAX_HEADER_KEYS 1024
#define MAX_SCHEMA_LEN (1u << 20)
#define MAX_ZERO_SIZE_ITEMS 65536

typedef struct rd {
  const uint8_t *p;
  const uint8_t *end;
} rd;

static int rd_long(rd *r, int64_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (r->p >= r->end) return -1;
    uint8_t b = *r->p++;
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = (int64_t)(x >> 1) ^ -(int64_t)(x & 1);
      return 0;
    }
  }
  return -1; /* more than 10 bytes */
}

static int rd_bytes(rd *r, const uint8_t **b, size_t *n) {
  int64_t len;
  if (rd_long(r, &len) != 0 || len < 0 || (uint64_t)len > (uint64_t)(r->end - r->p)) return -1;
  *b = r->p;
  *n = (size_t)len;
  r->p += len;
  return 0;
}

static int rd_skip(rd *r, size_t n) {
  if (n > (size_t)(r->end - r->p)) return -1;
  r->p += n;
  return 0;
}

static avro_schema_t resolve(avro_schema_t s) {
  for (int i = 0; i < MAX_DEPTH && s && avro_typeof(s) == AVRO_LINK; i++)
    s = avro_schema_link_target(s);
  return s;
}

/* Reads union branch indexes until s is not a union. */
static int rd_branch(rd *r, avro_schema_t *s) {
  *s = resolve(*s);
  for (int i = 0; i < 4 && *s && avro_typeof(*s) == AVRO_UNION; i++) {
    int64_t idx;
    if (rd_long(r, &idx) != 0 || idx < 0 || (uint64_t)idx >= avro_schema_union_size(*s)) return -1;
    *s = resolve(avro_schema_union_branch(*s, (int)idx));
  }
  return *s && avro_typeof(*s) != AVRO_UNION ? 0 : -1;
}

static int skip_value(rd *r, avro_schema_t s, int depth);

/* Arrays and maps: blocks of count items (a negative count is followed by the block size). */
static int skip_blocks(rd *r, avro_schema_t item, int is_map, int depth) {
  for (;;) {
    int64_t count;
    if (rd_long(r, &count) != 0) return -1;
    if (count == 0) return 0;
    if (count < 0) {
      int64_t size;
      if (count == INT64_MIN || rd_long(r, &size) != 0 || size < 0) return -1;
      count = -count;
      if (rd_skip(r, (size_t)size) != 0) return -1; /* skip the whole block at once */
      continue;
    }
    if ((uint64_t)count > (uint64_t)(r->end - r->p) && count > MAX_ZERO_SIZE_ITEMS) return -1;
    for (int64_t i = 0; i < count; i++) {
      if (is_map) {
        const uint8_t *k;
        size_t kn;
        if (rd_bytes(r, &k, &kn) != 0) return -1;
      }
      if (skip_value(r, item, depth + 1) != 0) return -1;
    }
  }
}

static int skip_value(rd *r, avro_schema_t s, int depth) {
  if (depth > MAX_DEPTH || rd_branch(r, &s) != 0) return -1;
  int64_t v;
  const uint8_t *b;
  size_t n;
  switch (avro_typeof(s)) {
    case AVRO_NULL:
      return 0;
    case AVRO_BOOLEAN:
      return rd_skip(r, 1);
    case AVRO_INT32:
    case AVRO_INT64:
    case AVRO_ENUM:
      return rd_long(r, &v);
    case AVRO_FLOAT:
      return rd_skip(r, 4);
    case AVRO_DOUBLE:
      return rd_skip(r, 8);
    case AVRO_STRING:
    case AVRO_BYTES:
      return rd_bytes(r, &b, &n);
    case AVRO_FIXED: {
      int64_t fs = avro_schema_fixed_size(s);
      return fs < 0 ? -1 : rd_skip(r, (size_t)fs);
    }
    case AVRO_RECORD: {
      size_t nf = avro_schema_record_size(s);
      for (size_t i = 0; i < nf; i++)
        if (skip_value(r, avro_schema_record_field_get_by_index(s, (int)i), depth + 1) != 0)
          return -1;
      return 0;
    }
    case AVRO_ARRAY:
      return skip_blocks(r, avro_schema_array_items(s), 0, depth);
    case AVRO_MAP:
      return skip_blocks(r, avro_schema_map_values(s), 1, depth);
    default:
      return -1;
  }
}

/* An optional int/long: *present = 0 for null. */
static int read_int(rd *r, avro_schema_t s, int64_t *v, int *present) {
  if (rd_branch(r, &s) != 0) return -1;
  *present = 0;
  if (avro_typeof(s) == AVRO_NULL) return 0;
  if (avro_typeof(s) != AVRO_INT32 && avro_typeof(s) != AVRO_INT64) return -1;
  *present = 1;
  return rd_long(r, v);
}

/* An optional string/bytes: *present = 0 for null. */
static int read_str(rd *r, avro_schema_t s, const char **str, size_t *n, int *present) {
  if (rd_branch(r, &s) != 0) return -1;
  *present = 0;
  if (avro_typeof(s) == AVRO_NULL) return 0;
  if (avro_typeof(s) != AVRO_STRING && avro_typeof(s) != AVRO_BYTES) return -1;
  *present = 1;
  const uint8_t *b;
  if (rd_bytes(r, &b, n) != 0) return -1;
  *str = (const char *)b;
  return 0;
}

/* --- container framing ------------------------------------------------------------------- */

typedef enum { CODEC_NULL, CODEC_DEFLATE, CODEC_SNAPPY, CODEC_ZSTD } codec_t;

typedef struct container {
  avro_schema_t schema;
  codec_t codec;
  uint8_t sync[16];
  rd r;         /* positioned at the first block */
  uint8_t *buf; /* decompression buffer */
  size_t bufcap;
} container;

static int ensure_buf(container *c, size_t n) {
  if (n <= c->bufcap) return 0;
  size_t cap = c->bufcap ? c->bufcap : 65536;
  while (cap < n) cap *= 2;
  uint8_t *nb = realloc(c->buf, cap);
  if (!nb) return -1;
  c->buf = nb;
  c->bufcap = cap;
  return 0;
}

static int open_container(const uint8_t *data, size_t len, container *c, br_err *err) {
  memset(c, 0, sizeof *c);
  c->r.p = data;
  c->r.end = data + len;
  if (len < 4 || memcmp(data, "Obj\x01", 4) != 0) return br_fail(err, "not an Avro file");
  c->r.p += 4;
  const uint8_t *schema = NULL, *codec = NULL;
  size_t schema_len = 0, codec_len = 0;
  size_t keys = 0;
  for (;;) {
    int64_t count, size;
    if (rd_long(&c->r, &count) != 0) return br_fail(err, "Avro header is truncated");
    if (count == 0) break;
    if (count < 0) {
      if (count == INT64_MIN || rd_long(&c->r, &size) != 0)
        return br_fail(err, "Avro header is damaged");
      count = -count;
    }
    if ((uint64_t)count > MAX_HEADER_KEYS - keys)
      return br_fail(err, "Avro header has more than %d keys", MAX_HEADER_KEYS);
    keys += (size_t)count;
    for (int64_t i = 0; i < count; i++) {
      const uint8_t *k, *v;
      size_t kn, vn;
      if (rd_bytes(&c->r, &k, &kn) != 0 || rd_bytes(&c->r, &v, &vn) != 0)
        return br_fail(err, "Avro header is truncated");
      if (kn == 11 && memcmp(k, "avro.schema", 11) == 0) {
        schema = v;
        schema_len = vn;
      } else if (kn == 10 && memcmp(k, "avro.codec", 10) == 0) {
        codec = v;
        codec_len = vn;
      }
    }
  }
  if (rd_skip(&c->r, 16) != 0) return br_fail(err, "Avro header is truncated");
  memcpy(c->sync, c->r.p - 16, 16);
  if (!codec || codec_len == 0 || (codec_len == 4 && memcmp(codec, "null", 4) == 0))
    c->codec = CODEC_NULL;
  else if (codec_len == 7 && memcmp(codec, "deflate", 7) == 0)
    c->codec = CODEC_DEFLATE;
  else if (codec_len == 6 && memcmp(codec, "snappy", 6) == 0)
    c->codec = CODEC_SNAPPY;
  else if (codec_len == 9 && memcmp(codec, "zstandard", 9) == 0)
    c->codec = CODEC_ZSTD;
  else
    return br_fail(err, "unsupported Avro codec '%.*s'", (int)(codec_len > 32 ? 32 : codec_len),
                   (const char *)codec);
  if (!schema || schema_len == 0 || schema_len > MAX_SCHEMA_LEN)
    return br_fail(err, "Avro header has no usable avro.schema");
  if (avro_schema_from_json_length((const char *)schema, schema_len, &c->schema) != 0 ||
      !c->schema) {
    c->schema = NULL;
    return br_fail(err, "Avro schema: %s", avro_strerror());
  }
  return 0;
}

static void close_container(container *c) {
  if (c->schema) avro_schema_decref(c->schema);
  free(c->buf);
  memset(c, 0, sizeof *c);
}

static int inflate_raw(container *c, const uint8_t *in, size_t n, size_t *out, br_err *err) {
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (inflateInit2(&zs, -15) != Z_OK) return br_fail(err, "deflate: cannot initialise zlib");
  int rc = -1;
  zs.next_in = (Bytef *)in;
  zs.avail_in = (uInt)n;
  size_t used = 0;
  for (;;) {
    if (used == c->bufcap && (c->bufcap >= ICE_MAX_AVRO_BLOCK || ensure_buf(c, used + 1) != 0)) {
      br_fail(err, "Avro block inflates to more than %u bytes", ICE_MAX_AVRO_BLOCK);
      break;
    }
    size_t room = c->bufcap - used;
    if (room > ICE_MAX_AVRO_BLOCK) room = ICE_MAX_AVRO_BLOCK;
    zs.next_out = c->buf + used;
    zs.avail_out = (uInt)room;
    int zr = inflate(&zs, Z_NO_FLUSH);
    used += room - zs.avail_out;
    if (zr == Z_STREAM_END) {
      rc = zs.avail_in == 0 ? 0 : br_fail(err, "Avro deflate block has trailing bytes");
      break;
    }
    if (zr != Z_OK && !(zr == Z_BUF_ERROR && zs.avail_out == 0)) {
      br_fail(err, "Avro deflate block is corrupt or truncated");
      break;
    }
  }
  inflateEnd(&zs);
  *out = used;
  return rc;
}

static int unzstd(container *c, const uint8_t *in, size_t n, size_t *out, br_err *err) {
  ZSTD_DStream *ds = ZSTD_createDStream();
  if (!ds) return br_fail(err, "out of memory");
  int rc = -1;
  ZSTD_inBuffer ib = {in, n, 0};
  size_t used = 0;
  for (;;) {
    if (used == c->bufcap && (c->bufcap >= ICE_MAX_AVRO_BLOCK || ensure_buf(c, used + 1) != 0)) {
      br_fail(err, "Avro block decompresses to more than %u bytes", ICE_MAX_AVRO_BLOCK);
      break;
    }
    ZSTD_outBuffer ob = {c->buf + used, c->bufcap - used, 0};
    size_t zr = ZSTD_decompressStream(ds, &ob, &ib);
    used += ob.pos;
    if (ZSTD_isError(zr)) {
      br_fail(err, "Avro zstandard block: %s", ZSTD_getErrorName(zr));
      break;
    }
    if (zr == 0 && ib.pos == ib.size) {
      rc = 0;
      break;
    }
    if (ib.pos == ib.size && ob.pos < ob.size) {
      br_fail(err, "Avro zstandard block is truncated");
      break;
    }
  }
  ZSTD_freeDStream(ds);
  *out = used;
  return rc;
}

static int unsnappy(container *c, const uint8_t *in, size_t n, size_t *out, br_err *err) {
  if (n < 4) return br_fail(err, "Avro snappy block is too short");
  size_t ulen;
  if (snappy_uncompressed_length((const char *)in, n - 4, &ulen) != SNAPPY_OK ||
      ulen > ICE_MAX_AVRO_BLOCK)
    return br_fail(err, "Avro snappy block is corrupt or too large");
  if (ensure_buf(c, ulen ? ulen : 1) != 0) return br_fail(err, "out of memory");
  size_t got = ulen;
  if (snappy_uncompress((const char *)in, n - 4, (char *)c->buf, &got) != SNAPPY_OK || got != ulen)
    return br_fail(err, "Avro snappy block is corrupt");
  uint32_t want =
      (uint32_t)in[n - 4] << 24 | (uint32_t)in[n - 3] << 16 | (uint32_t)in[n - 2] << 8 | in[n - 1];
  if ((uint32_t)crc32(0L, c->buf, (uInt)ulen) != want)
    return br_fail(err, "Avro snappy block fails its CRC32");
  *out = ulen;
  return 0;
}

typedef int (*record_fn)(void *ud, rd *r, avro_schema_t schema, br_err *err);

/* Walks every block of an open container, decoding each record with fn. */
static int read_blocks(container *c, record_fn fn, void *ud, uint64_t *nrecords, br_err *err) {
  uint64_t total = 0;
  while (c->r.p < c->r.end) {
    int64_t count, size;
    if (rd_long(&c->r, &count) != 0 || rd_long(&c->r, &size) != 0 || count < 0 || size < 0 ||
        (uint64_t)size > (uint64_t)(c->r.end - c->r.p))
      return br_fail(err, "Avro block header is damaged or truncated");
    const uint8_t *blk = c->r.p;
    c->r.p += size;
    if (rd_skip(&c->r, 16) != 0 || memcmp(c->r.p - 16, c->sync, 16) != 0)
      return br_fail(err, "Avro block is truncated or its sync marker is wrong");
    size_t dlen = (size_t)size;
    const uint8_t *dec = blk;
    int zr = 0;
    if (c->codec == CODEC_DEFLATE) zr = inflate_raw(c, blk, (size_t)size, &dlen, err);
    if (c->codec == CODEC_SNAPPY) zr = unsnappy(c, blk, (size_t)size, &dlen, err);
    if (c->codec == CODEC_ZSTD) zr = unzstd(c, blk, (size_t)size, &dlen, err);
    if (zr != 0) return -1;
    if (c->codec != CODEC_NULL) dec = c->buf;
    if ((uint64_t)count > dlen) return br_fail(err, "Avro block claims more records than bytes");
    rd br = {dec, dec + dlen};
    for (int64_t i = 0; i < count; i++) {
      int rc = fn(ud, &br, c->schema, err);
      if (rc != 0) return rc;
    }
    if (br.p != br.end) return br_fail(err, "Avro block has bytes after its last record");
    total += (uint64_t)count;
  }
  if (nrecords) *nrecords = total;
  return 0;
}

static int field_is(const char *name, const char *a, const char *b) {
  return strcmp(name, a) == 0 || (b && strcmp(name, b) == 0);
}

/* --- manifest lists ------------------------------------------------------------------------ */

typedef struct list_ctx {
  ice_manifest_ref_fn fn;
  void *ud;
} list_ctx;

static int list_record(void *ud, rd *r, avro_schema_t s, br_err *err) {
  list_ctx *lc = ud;
  ice_manifest_ref ref = {NULL, 0, 0, -1};
  int have_path = 0;
  int64_t counts[3] = {0, 0, 0};
  int have_counts[3] = {0, 0, 0};
  size_t nf = avro_schema_record_size(s);
  for (size_t i = 0; i < nf; i++) {
    const char *name = avro_schema_record_field_name(s, (int)i);
    avro_schema_t fs = avro_schema_record_field_get_by_index(s, (int)i);
    int rc = 0, present = 0;
    int64_t v = 0;
    if (field_is(name, "manifest_path", NULL)) {
      rc = read_str(r, fs, &ref.path, &ref.path_len, &have_path);
    } else if (field_is(name, "content", NULL)) {
      rc = read_int(r, fs, &v, &present);
      if (present) ref.content = (int)v;
      if (present && (v < 0 || v > 1))
        return br_fail(err, "manifest list: content %lld", (long long)v);
    } else if (field_is(name, "added_files_count", "added_data_files_count")) {
      rc = read_int(r, fs, &counts[0], &have_counts[0]);
    } else if (field_is(name, "existing_files_count", "existing_data_files_count")) {
      rc = read_int(r, fs, &counts[1], &have_counts[1]);
    } else if (field_is(name, "deleted_files_count", "deleted_data_files_count")) {
      rc = read_int(r, fs, &counts[2], &have_counts[2]);
    } else {
      rc = skip_value(r, fs, 1);
    }
    if (rc != 0) return br_fail(err, "manifest list: record field '%s' is damaged", name);
  }
  if (!have_path || ref.path_len == 0 || ref.path_len >= ICE_MAX_PATH ||
      memchr(ref.path, 0, ref.path_len))
    return br_fail(err, "manifest list: entry without a usable manifest_path");
  if (have_counts[0] && have_counts[1] && have_counts[2] && counts[0] >= 0 && counts[1] >= 0 &&
      counts[2] >= 0 && counts[0] < INT32_MAX && counts[1] < INT32_MAX && counts[2] < INT32_MAX)
    ref.nentries = counts[0] + counts[1] + counts[2];
  return lc->fn(lc->ud, &ref, err);
}

int ice_read_manifest_list(const uint8_t *data, size_t len, ice_manifest_ref_fn fn, void *ud,
                           uint64_t *nrecords, br_err *err) {
  container c;
  int rc = open_container(data, len, &c, err);
  if (rc == 0) {
    avro_schema_t s = resolve(c.schema);
    if (!s || avro_typeof(s) != AVRO_RECORD ||
        avro_schema_record_field_get_index(s, "manifest_path") < 0) {
      rc = br_fail(err, "not a manifest list (no manifest_path field)");
    } else {
      list_ctx lc = {fn, ud};
      rc = read_blocks(&c, list_record, &lc, nrecords, err);
    }
  }
  close_container(&c);
  return rc;
}

/* --- manifests ----------------------------------------------------------------------------- */

typedef struct manifest_ctx {
  ice_entry_fn fn;
  void *ud;
} manifest_ctx;

static int data_file_record(rd *r, avro_schema_t s, ice_entry *e, br_err *err) {
  if (rd_branch(r, &s) != 0 || avro_typeof(s) != AVRO_RECORD)
    return br_fail(err, "manifest: data_file is not a record");
  int have_path = 0, have_format = 0;
  size_t nf = avro_schema_record_size(s);
  for (size_t i = 0; i < nf; i++) {
    const char *name = avro_schema_record_field_name(s, (int)i);
    avro_schema_t fs = avro_schema_record_field_get_by_index(s, (int)i);
    int rc = 0, present = 0;
    int64_t v = 0;
    if (field_is(name, "file_path", NULL)) {
      rc = read_str(r, fs, &e->path, &e->path_len, &have_path);
    } else if (field_is(name, "file_format", NULL)) {
      rc = read_str(r, fs, &e->format, &e->format_len, &have_format);
    } else if (field_is(name, "content", NULL)) {
      rc = read_int(r, fs, &v, &present);
      if (present && (v < 0 || v > 2))
        return br_fail(err, "manifest: data_file.content %lld", (long long)v);
      if (present) e->content = (int)v;
    } else if (field_is(name, "file_size_in_bytes", NULL)) {
      rc = read_int(r, fs, &v, &present);
      if (present) e->file_size = v;
    } else if (field_is(name, "record_count", NULL)) {
      rc = read_int(r, fs, &v, &present);
      if (present) e->record_count = v;
    } else {
      rc = skip_value(r, fs, 2);
    }
    if (rc != 0) return br_fail(err, "manifest: data_file field '%s' is damaged", name);
  }
  if (!have_path || e->path_len == 0 || e->path_len >= ICE_MAX_PATH ||
      memchr(e->path, 0, e->path_len))
    return br_fail(err, "manifest: entry without a usable file_path");
  if (!have_format) {
    e->format = "";
    e->format_len = 0;
  }
  return 0;
}

static int manifest_record(void *ud, rd *r, avro_schema_t s, br_err *err) {
  manifest_ctx *mc = ud;
  ice_entry e = {-1, 0, NULL, 0, NULL, 0, -1, -1};
  int have_file = 0;
  size_t nf = avro_schema_record_size(s);
  for (size_t i = 0; i < nf; i++) {
    const char *name = avro_schema_record_field_name(s, (int)i);
    avro_schema_t fs = avro_schema_record_field_get_by_index(s, (int)i);
    int rc = 0, present = 0;
    int64_t v = 0;
    if (field_is(name, "status", NULL)) {
      rc = read_int(r, fs, &v, &present);
      if (rc == 0 && (!present || v < 0 || v > 2))
        return br_fail(err, "manifest: entry status is missing or not 0, 1 or 2");
      e.status = (int)v;
    } else if (field_is(name, "data_file", NULL)) {
      if (data_file_record(r, fs, &e, err) != 0) return -1;
      have_file = 1;
    } else {
      rc = skip_value(r, fs, 1);
    }
    if (rc != 0) return br_fail(err, "manifest: entry field '%s' is damaged", name);
  }
  if (e.status < 0 || !have_file) return br_fail(err, "manifest: entry lacks status or data_file");
  return mc->fn(mc->ud, &e, err);
}

int ice_read_manifest(const uint8_t *data, size_t len, ice_entry_fn fn, void *ud,
                      uint64_t *nrecords, br_err *err) {
  container c;
  int rc = open_container(data, len, &c, err);
  if (rc == 0) {
    avro_schema_t s = resolve(c.schema);
    if (!s || avro_typeof(s) != AVRO_RECORD ||
        avro_schema_record_field_get_index(s, "data_file") < 0 ||
        avro_schema_record_field_get_index(s, "status") < 0) {
      rc = br_fail(err, "not a manifest (no status / data_file fields)");
    } else {
      manifest_ctx mc = {fn, ud};
      rc = read_blocks(&c, manifest_record, &mc, nrecords, err);
    }
  }
  close_container(&c);
  return rc;
}
