/* ORC reader: postscript, footer and types, stripes, and one top-level string/binary column. */
#include <lz4.h>
#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "blobref/orc.h"

#define DEFAULT_BLOCK (256u << 10)
#define TAIL_GUESS (16u << 10) /* first read at the end of the file */

/* Stream kinds and column encodings, numbered as in orc_proto.proto. */
enum { S_PRESENT = 0, S_DATA = 1, S_LENGTH = 2, S_DICTIONARY_DATA = 3 };
enum { E_DIRECT = 0, E_DICTIONARY = 1, E_DIRECT_V2 = 2, E_DICTIONARY_V2 = 3 };

typedef struct orc_stripe {
  uint64_t offset, index_len, data_len, footer_len, rows;
} orc_stripe;

struct br_orc_file {
  br_source *src;
  int codec;
  uint64_t block; /* compression block size */
  uint64_t num_rows;
  uint64_t data_end; /* first byte of the metadata/footer/postscript */
  orc_stripe *stripes;
  size_t nstripes;
  uint32_t ntypes;
  int *kinds;   /* [ntypes] */
  size_t ncols; /* fields of the root struct */
  char **names; /* [nnames] field names (nnames == ncols once the footer checked out) */
  size_t nnames;
  uint32_t *col_type;    /* [ncols] type id of each field */
  uint8_t *raw, *buf[4]; /* reused buffers: compressed bytes, decompressed streams */
  size_t raw_cap, buf_cap[4];
};

/* ---- protobuf (only what the ORC tail needs) ---- */

typedef struct pb {
  const uint8_t *p, *end;
} pb;

/* Next field: its number and wire type; 1 at the end of the message, -1 when malformed. */
static int pb_next(pb *r, uint64_t *field, int *wt) {
  if (r->p >= r->end) return 1;
  uint64_t key;
  if (br_orc_varint(&r->p, r->end, &key) != 0) return -1;
  *field = key >> 3;
  *wt = (int)(key & 7);
  return 0;
}

static int pb_bytes(pb *r, pb *out) {
  uint64_t n;
  if (br_orc_varint(&r->p, r->end, &n) != 0 || n > (uint64_t)(r->end - r->p)) return -1;
  out->p = r->p;
  out->end = r->p + n;
  r->p += n;
  return 0;
}

static int pb_skip(pb *r, int wt) {
  uint64_t v;
  pb sub;
  switch (wt) {
    case 0:
      return br_orc_varint(&r->p, r->end, &v);
    case 1:
      if (r->end - r->p < 8) return -1;
      r->p += 8;
      return 0;
    case 2:
      return pb_bytes(r, &sub);
    case 5:
      if (r->end - r->p < 4) return -1;
      r->p += 4;
      return 0;
    default:
      return -1;
  }
}

static int pb_uint(pb *r, int wt, uint64_t *v) {
  return wt == 0 ? br_orc_varint(&r->p, r->end, v) : -1;
}

/* ---- decompression ---- */

static int grow(uint8_t **b, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t ncap = *cap ? *cap : 4096;
  while (ncap < need) ncap *= 2;
  uint8_t *nb = realloc(*b, ncap);
  if (!nb) return -1;
  *b = nb;
  *cap = ncap;
  return 0;
}

/* Decompresses one chunk into out[0..cap); *n gets its size. */
static int decompress_chunk(int codec, const uint8_t *in, size_t in_len, uint8_t *out, size_t cap,
                            size_t *n, br_err *err) {
  switch (codec) {
    case BR_ORC_ZLIB: {
      z_stream zs;
      memset(&zs, 0, sizeof zs);
      if (inflateInit2(&zs, -15) != Z_OK) return br_fail(err, "orc: inflateInit failed");
      zs.next_in = (Bytef *)in;
      zs.avail_in = (uInt)in_len;
      zs.next_out = out;
      zs.avail_out = (uInt)cap;
      int z = inflate(&zs, Z_FINISH);
      *n = cap - zs.avail_out;
      inflateEnd(&zs);
      if (z != Z_STREAM_END) return br_fail(err, "orc: corrupt zlib chunk");
      return 0;
    }
    case BR_ORC_SNAPPY: {
      size_t len;
      if (snappy_uncompressed_length((const char *)in, in_len, &len) != SNAPPY_OK || len > cap)
        return br_fail(err, "orc: corrupt snappy chunk (or larger than the block size)");
      if (snappy_uncompress((const char *)in, in_len, (char *)out, &len) != SNAPPY_OK)
        return br_fail(err, "orc: corrupt snappy chunk");
      *n = len;
      return 0;
    }
    case BR_ORC_LZ4: {
      int r = LZ4_decompress_safe((const char *)in, (char *)out, (int)in_len, (int)cap);
      if (r < 0) return br_fail(err, "orc: corrupt lz4 chunk");
      *n = (size_t)r;
      return 0;
    }
    case BR_ORC_ZSTD: {
      size_t r = ZSTD_decompress(out, cap, in, in_len);
      if (ZSTD_isError(r)) return br_fail(err, "orc: zstd: %s", ZSTD_getErrorName(r));
      *n = r;
      return 0;
    }
    default:
      return br_fail(err, "orc: unsupported compression %d", codec);
  }
}

/* Undoes the file's compression of a stream (chunks of a 3-byte header, then original or
 * compressed bytes). The result is in *out (grown as needed, at most max bytes). */
static int decompress(const br_orc_file *f, const uint8_t *in, size_t len, uint8_t **out,
                      size_t *cap, size_t *out_len, size_t max, br_err *err) {
  if (grow(out, cap, 1) != 0) return br_fail(err, "out of memory"); /* never NULL, even empty */
  if (f->codec == BR_ORC_NONE) {
    if (len > max) return br_fail(err, "orc: stream of %zu bytes is over the limit", len);
    if (grow(out, cap, len ? len : 1) != 0) return br_fail(err, "out of memory");
    if (len) memcpy(*out, in, len);
    *out_len = len;
    return 0;
  }
  size_t ip = 0, op = 0;
  while (ip < len) {
    if (len - ip < 3) return br_fail(err, "orc: truncated compression chunk header");
    uint32_t h = in[ip] | (uint32_t)in[ip + 1] << 8 | (uint32_t)in[ip + 2] << 16;
    ip += 3;
    size_t clen = h >> 1;
    if (clen > len - ip) return br_fail(err, "orc: compression chunk runs past its stream");
    size_t room = (h & 1) ? clen : f->block;
    if (room > max - op) return br_fail(err, "orc: decompressed stream over %zu bytes", max);
    if (grow(out, cap, op + room + 1) != 0) return br_fail(err, "out of memory");
    if (h & 1) {
      memcpy(*out + op, in + ip, clen);
      op += clen;
    } else {
      size_t n = 0;
      if (decompress_chunk(f->codec, in + ip, clen, *out + op, room, &n, err) != 0) return -1;
      op += n;
    }
    ip += clen;
  }
  *out_len = op;
  return 0;
}

/* Reads len bytes at off into f->raw. */
static int read_raw(br_orc_file *f, uint64_t off, uint64_t len, br_err *err) {
  if (grow(&f->raw, &f->raw_cap, len ? len : 1) != 0) return br_fail(err, "out of memory");
  return len ? f->src->pread(f->src, f->raw, len, off, err) : 0;
}

/* ---- tail: postscript, footer ---- */

static int parse_postscript(br_orc_file *f, pb r, uint64_t *footer_len, uint64_t *meta_len,
                            br_err *err) {
  uint64_t field, v;
  int wt, rc, magic = 1; /* old writers left it out: the file's header was checked */
  f->codec = BR_ORC_NONE;
  f->block = DEFAULT_BLOCK;
  while ((rc = pb_next(&r, &field, &wt)) == 0) {
    if (field == 1 && pb_uint(&r, wt, footer_len) == 0) continue;
    if (field == 2 && pb_uint(&r, wt, &v) == 0) {
      if (v > BR_ORC_ZSTD)
        return br_fail(err, "orc: unknown compression kind %llu", (unsigned long long)v);
      f->codec = (int)v;
      continue;
    }
    if (field == 3 && pb_uint(&r, wt, &f->block) == 0) continue;
    if (field == 5 && pb_uint(&r, wt, meta_len) == 0) continue;
    if (field == 8000 && wt == 2) {
      pb s;
      if (pb_bytes(&r, &s) != 0) return br_fail(err, "orc: malformed postscript");
      magic = s.end - s.p == 3 && memcmp(s.p, "ORC", 3) == 0;
      continue;
    }
    if (pb_skip(&r, wt) != 0) return br_fail(err, "orc: malformed postscript");
  }
  if (rc < 0) return br_fail(err, "orc: malformed postscript");
  if (!magic) return br_fail(err, "not an ORC file (the postscript's magic is not ORC)");
  if (f->codec == BR_ORC_LZO) return br_fail(err, "orc: LZO compression is not supported");
  if (f->block == 0 || f->block > BR_ORC_MAX_BLOCK)
    return br_fail(err, "orc: compression block size %llu is out of range",
                   (unsigned long long)f->block);
  return 0;
}

static int parse_stripe(pb r, orc_stripe *s) {
  uint64_t field;
  int wt, rc;
  memset(s, 0, sizeof *s);
  while ((rc = pb_next(&r, &field, &wt)) == 0) {
    uint64_t *dst = field == 1   ? &s->offset
                    : field == 2 ? &s->index_len
                    : field == 3 ? &s->data_len
                    : field == 4 ? &s->footer_len
                    : field == 5 ? &s->rows
                                 : NULL;
    if (dst ? pb_uint(&r, wt, dst) != 0 : pb_skip(&r, wt) != 0) return -1;
  }
  return rc < 0 ? -1 : 0;
}

/* A Type message: its kind; for the root (first) type also the subtypes and field names. */
static int parse_type(br_orc_file *f, pb r, int is_root, br_err *err) {
  uint64_t field, v;
  int wt, rc, kind = 0;
  size_t nsub = 0;
  while ((rc = pb_next(&r, &field, &wt)) == 0) {
    if (field == 1 && pb_uint(&r, wt, &v) == 0) {
      kind = v > 1000 ? 1000 : (int)v;
    } else if (field == 2 && is_root) { /* subtypes: packed or not */
      pb s = r;
      if (wt == 2) {
        if (pb_bytes(&r, &s) != 0) return br_fail(err, "orc: malformed type in the footer");
      } else if (wt == 0) {
        const uint8_t *start = r.p;
        if (br_orc_varint(&r.p, r.end, &v) != 0)
          return br_fail(err, "orc: malformed type in the footer");
        s.p = start;
        s.end = r.p;
      } else {
        return br_fail(err, "orc: malformed type in the footer");
      }
      while (s.p < s.end) {
        if (br_orc_varint(&s.p, s.end, &v) != 0 || v > UINT32_MAX)
          return br_fail(err, "orc: malformed type in the footer");
        uint32_t *n = realloc(f->col_type, (nsub + 1) * sizeof *n);
        if (!n) return br_fail(err, "out of memory");
        f->col_type = n;
        f->col_type[nsub++] = (uint32_t)v;
      }
    } else if (field == 3 && is_root && wt == 2) {
      pb s;
      if (pb_bytes(&r, &s) != 0) return br_fail(err, "orc: malformed type in the footer");
      char **n = realloc(f->names, (f->nnames + 1) * sizeof *n);
      if (!n) return br_fail(err, "out of memory");
      f->names = n;
      f->names[f->nnames] = strndup((const char *)s.p, (size_t)(s.end - s.p));
      if (!f->names[f->nnames]) return br_fail(err, "out of memory");
      f->nnames++;
    } else if (pb_skip(&r, wt) != 0) {
      return br_fail(err, "orc: malformed type in the footer");
    }
  }
  if (rc < 0) return br_fail(err, "orc: malformed type in the footer");
  if (is_root) {
    if (kind == BR_ORC_STRUCT && nsub != f->nnames)
      return br_fail(err, "orc: root struct has %zu subtypes and %zu names", nsub, f->nnames);
    f->ncols = kind == BR_ORC_STRUCT ? nsub : 0;
  }
  return kind;
}

static int parse_footer(br_orc_file *f, pb r, br_err *err) {
  uint64_t field;
  int wt, rc;
  size_t stripe_cap = 0, kind_cap = 0;
  while ((rc = pb_next(&r, &field, &wt)) == 0) {
    pb s;
    if (field == 3 && wt == 2) {
      if (pb_bytes(&r, &s) != 0) goto bad;
      if (f->nstripes == stripe_cap) {
        stripe_cap = stripe_cap ? stripe_cap * 2 : 16;
        orc_stripe *n = realloc(f->stripes, stripe_cap * sizeof *n);
        if (!n) return br_fail(err, "out of memory");
        f->stripes = n;
      }
      if (parse_stripe(s, &f->stripes[f->nstripes]) != 0) goto bad;
      f->nstripes++;
    } else if (field == 4 && wt == 2) {
      if (pb_bytes(&r, &s) != 0) goto bad;
      if (f->ntypes == kind_cap) {
        kind_cap = kind_cap ? kind_cap * 2 : 16;
        int *n = realloc(f->kinds, kind_cap * sizeof *n);
        if (!n) return br_fail(err, "out of memory");
        f->kinds = n;
      }
      int kind = parse_type(f, s, f->ntypes == 0, err);
      if (kind < 0) return -1;
      f->kinds[f->ntypes++] = kind;
    } else if (field == 6 && wt == 0) {
      if (pb_uint(&r, wt, &f->num_rows) != 0) goto bad;
    } else if (pb_skip(&r, wt) != 0) {
      goto bad;
    }
  }
  if (rc < 0) goto bad;
  for (size_t i = 0; i < f->ncols; i++)
    if (f->col_type[i] == 0 || f->col_type[i] >= f->ntypes)
      return br_fail(err, "orc: column '%s' names type %u of %u", f->names[i], f->col_type[i],
                     f->ntypes);
  for (size_t i = 0; i < f->nstripes; i++) {
    const orc_stripe *s = &f->stripes[i];
    uint64_t end = s->offset;
    if (s->index_len > f->data_end || s->data_len > f->data_end || s->footer_len > f->data_end ||
        end > f->data_end || (end += s->index_len + s->data_len + s->footer_len) > f->data_end ||
        s->offset < 3)
      return br_fail(err, "orc: stripe %zu lies outside the data area", i);
    if (s->rows > BR_ORC_MAX_STRIPE_ROWS)
      return br_fail(err, "orc: stripe %zu has %llu rows (limit %u)", i,
                     (unsigned long long)s->rows, BR_ORC_MAX_STRIPE_ROWS);
  }
  return 0;
bad:
  return br_fail(err, "orc: malformed footer");
}

br_orc_file *br_orc_open(br_source *src, br_err *err) {
  br_orc_file *f = calloc(1, sizeof *f);
  if (!f) {
    br_fail(err, "out of memory");
    return NULL;
  }
  f->src = src;
  uint8_t head[3];
  if (src->size < 4) {
    br_fail(err, "not an ORC file (%llu bytes)", (unsigned long long)src->size);
    goto fail;
  }
  if (src->pread(src, head, 3, 0, err) != 0) goto fail;
  if (memcmp(head, "ORC", 3) != 0) {
    br_fail(err, "not an ORC file (no ORC magic at the start)");
    goto fail;
  }
  uint64_t tail = src->size < TAIL_GUESS ? src->size : TAIL_GUESS;
  if (read_raw(f, src->size - tail, tail, err) != 0) goto fail;
  size_t ps_len = f->raw[tail - 1];
  if (ps_len == 0 || ps_len + 1 > tail - 3) {
    br_fail(err, "orc: postscript length %zu does not fit the file", ps_len);
    goto fail;
  }
  uint64_t footer_len = 0, meta_len = 0;
  pb ps = {f->raw + tail - 1 - ps_len, f->raw + tail - 1};
  if (parse_postscript(f, ps, &footer_len, &meta_len, err) != 0) goto fail;
  uint64_t fixed = 3 + 1 + ps_len;
  if (footer_len > BR_ORC_MAX_TAIL || meta_len > BR_ORC_MAX_TAIL ||
      footer_len + meta_len > src->size - fixed) {
    br_fail(err, "orc: footer (%llu bytes) and metadata (%llu) do not fit the file",
            (unsigned long long)footer_len, (unsigned long long)meta_len);
    goto fail;
  }
  f->data_end = src->size - 1 - ps_len - footer_len - meta_len;
  uint64_t footer_off = src->size - 1 - ps_len - footer_len;
  if (read_raw(f, footer_off, footer_len, err) != 0) goto fail;
  size_t flen;
  if (decompress(f, f->raw, footer_len, &f->buf[0], &f->buf_cap[0], &flen, BR_ORC_MAX_FOOTER,
                 err) != 0)
    goto fail;
  pb fr = {f->buf[0], f->buf[0] + flen};
  if (parse_footer(f, fr, err) != 0) goto fail;
  return f;
fail:
  br_orc_close(f);
  return NULL;
}

void br_orc_close(br_orc_file *f) {
  if (!f) return;
  for (size_t i = 0; i < f->nnames; i++) free(f->names[i]);
  free(f->names);
  free(f->col_type);
  free(f->kinds);
  free(f->stripes);
  free(f->raw);
  for (int i = 0; i < 4; i++) free(f->buf[i]);
  free(f);
}

int64_t br_orc_num_rows(const br_orc_file *f) { return (int64_t)f->num_rows; }
size_t br_orc_num_stripes(const br_orc_file *f) { return f->nstripes; }
enum br_orc_codec br_orc_codec(const br_orc_file *f) { return (enum br_orc_codec)f->codec; }
size_t br_orc_num_columns(const br_orc_file *f) { return f->ncols; }

int br_orc_find_column(const br_orc_file *f, const char *name) {
  for (size_t i = 0; i < f->ncols; i++)
    if (!strcmp(f->names[i], name)) return (int)i;
  return -1;
}

int br_orc_column(const br_orc_file *f, size_t i, const char **name, int *kind) {
  if (i >= f->ncols) return -1;
  *name = f->names[i];
  *kind = f->kinds[f->col_type[i]];
  return 0;
}

/* ---- stripes ---- */

/* Where one stream of the column lies in the stripe: offset from the stripe start and length. */
typedef struct stream_ref {
  int found;
  uint64_t off, len;
} stream_ref;

typedef struct stripe_col {
  stream_ref s[4]; /* PRESENT, DATA, LENGTH, DICTIONARY_DATA */
  int encoding;
  uint64_t dict_size;
} stripe_col;

static int parse_stripe_footer(const br_orc_file *f, size_t si, pb r, uint32_t col, stripe_col *c,
                               br_err *err) {
  const orc_stripe *st = &f->stripes[si];
  uint64_t field, off = 0, ncodings = 0;
  int wt, rc;
  memset(c, 0, sizeof *c);
  c->encoding = -1;
  while ((rc = pb_next(&r, &field, &wt)) == 0) {
    pb s;
    if (field == 1 && wt == 2) { /* Stream: kind, column, length */
      uint64_t kind = 0, column = 0, length = 0, sf;
      int swt, src;
      if (pb_bytes(&r, &s) != 0) goto bad;
      while ((src = pb_next(&s, &sf, &swt)) == 0) {
        uint64_t *dst = sf == 1 ? &kind : sf == 2 ? &column : sf == 3 ? &length : NULL;
        if (dst ? pb_uint(&s, swt, dst) != 0 : pb_skip(&s, swt) != 0) goto bad;
      }
      if (src < 0) goto bad;
      if (length > st->index_len + st->data_len - off)
        return br_fail(err, "orc: stripe %zu: streams run past the stripe's data", si);
      if (column == col && kind < 4) {
        if (c->s[kind].found)
          return br_fail(err, "orc: stripe %zu: column %u has two streams of kind %llu", si, col,
                         (unsigned long long)kind);
        c->s[kind] = (stream_ref){1, off, length};
      }
      off += length;
    } else if (field == 2 && wt == 2) { /* ColumnEncoding: kind, dictionarySize */
      if (pb_bytes(&r, &s) != 0) goto bad;
      if (ncodings == col) {
        uint64_t sf, v;
        int swt, src;
        c->encoding = E_DIRECT;
        while ((src = pb_next(&s, &sf, &swt)) == 0) {
          if (sf == 1 && pb_uint(&s, swt, &v) == 0)
            c->encoding = v > 3 ? 4 : (int)v;
          else if (sf == 2 && pb_uint(&s, swt, &v) == 0)
            c->dict_size = v;
          else if (pb_skip(&s, swt) != 0)
            goto bad;
        }
        if (src < 0) goto bad;
      }
      ncodings++;
    } else if (pb_skip(&r, wt) != 0) {
      goto bad;
    }
  }
  if (rc < 0) goto bad;
  if (ncodings != f->ntypes)
    return br_fail(err, "orc: stripe %zu footer has %llu column encodings for %u columns", si,
                   (unsigned long long)ncodings, f->ntypes);
  if (c->encoding > E_DICTIONARY_V2)
    return br_fail(err, "orc: stripe %zu: unknown encoding of column %u", si, col);
  return 0;
bad:
  return br_fail(err, "orc: stripe %zu: malformed stripe footer", si);
}

/* Reads and decompresses stream k of the column into f->buf[k]; *len 0 when it is absent. */
static int load_stream(br_orc_file *f, size_t si, const stripe_col *c, int k, size_t *len,
                       br_err *err) {
  *len = 0;
  if (grow(&f->buf[k], &f->buf_cap[k], 1) != 0) return br_fail(err, "out of memory");
  if (!c->s[k].found) return 0; /* an empty, non-NULL buffer */
  const orc_stripe *st = &f->stripes[si];
  if (c->s[k].len > BR_ORC_MAX_STREAM)
    return br_fail(err, "orc: stripe %zu: stream of %llu bytes over the limit", si,
                   (unsigned long long)c->s[k].len);
  if (read_raw(f, st->offset + c->s[k].off, c->s[k].len, err) != 0) return -1;
  if (decompress(f, f->raw, c->s[k].len, &f->buf[k], &f->buf_cap[k], len, BR_ORC_MAX_STREAM, err) !=
      0) {
    char tmp[sizeof err->msg];
    snprintf(tmp, sizeof tmp, "%s", err ? err->msg : "");
    return br_fail(err, "stripe %zu: %s", si, tmp);
  }
  return 0;
}

/* Calls fn for every row of stripe si of column col (a type id). */
/* Dictionary indexes and lengths are decoded IDX_CHUNK (and at most one run more) at a time: a
 * stripe of millions of rows had them all in one fresh array (8 bytes a value, most of the
 * decode's time in page faults). */
#define IDX_CHUNK 4096

static int read_stripe(br_orc_file *f, size_t si, uint32_t col, br_orc_value_fn fn, void *ud,
                       br_err *err) {
  const orc_stripe *st = &f->stripes[si];
  int rc = -1;
  uint8_t *present = NULL;
  uint64_t *lens = NULL, *idx = NULL, *offs = NULL;
  stripe_col c;
  size_t flen, plen, dlen, llen, blen;
  size_t rows = (size_t)st->rows;
  if (st->footer_len > BR_ORC_MAX_FOOTER) return br_fail(err, "orc: stripe %zu footer too big", si);
  if (read_raw(f, st->offset + st->index_len + st->data_len, st->footer_len, err) != 0) return -1;
  if (decompress(f, f->raw, st->footer_len, &f->buf[0], &f->buf_cap[0], &flen, BR_ORC_MAX_FOOTER,
                 err) != 0)
    return -1;
  pb r = {f->buf[0], f->buf[0] + flen};
  if (parse_stripe_footer(f, si, r, col, &c, err) != 0) return -1;
  if (load_stream(f, si, &c, S_PRESENT, &plen, err) != 0 ||
      load_stream(f, si, &c, S_DATA, &dlen, err) != 0 ||
      load_stream(f, si, &c, S_LENGTH, &llen, err) != 0 ||
      load_stream(f, si, &c, S_DICTIONARY_DATA, &blen, err) != 0)
    return -1;
  const uint8_t *data = f->buf[S_DATA], *blob = f->buf[S_DICTIONARY_DATA];
  present = malloc(rows ? rows : 1);
  if (!present) return br_fail(err, "out of memory");
  size_t nvals = rows;
  if (c.s[S_PRESENT].found) {
    if (br_orc_bool_decode(f->buf[S_PRESENT], plen, present, rows, err) != 0) goto done;
    nvals = 0;
    for (size_t i = 0; i < rows; i++) nvals += present[i];
  } else {
    memset(present, 1, rows);
  }
  int version = c.encoding == E_DIRECT || c.encoding == E_DICTIONARY ? 1 : 2;
  int dict = c.encoding == E_DICTIONARY || c.encoding == E_DICTIONARY_V2;
  if (nvals && !c.s[S_DATA].found && (dict || !c.s[S_LENGTH].found)) {
    br_fail(err, "orc: stripe %zu: column %u has no DATA stream", si, col);
    goto done;
  }
  if (dict) {
    if (c.dict_size > BR_ORC_MAX_STRIPE_ROWS) {
      br_fail(err, "orc: stripe %zu: dictionary of %llu entries over the limit", si,
              (unsigned long long)c.dict_size);
      goto done;
    }
    if (c.dict_size && !c.s[S_LENGTH].found) {
      br_fail(err, "orc: stripe %zu: dictionary of column %u has no LENGTH stream", si, col);
      goto done;
    }
    if (c.dict_size && !c.s[S_DICTIONARY_DATA].found) {
      br_fail(err, "orc: stripe %zu: dictionary of column %u has no DICTIONARY_DATA stream", si,
              col);
      goto done;
    }
    lens = malloc((c.dict_size + 1) * sizeof *lens);
    offs = malloc((c.dict_size + 1) * sizeof *offs);
    idx = malloc((IDX_CHUNK + BR_ORC_RLE_MAX_RUN) * sizeof *idx);
    if (!lens || !offs || !idx) {
      br_fail(err, "out of memory");
      goto done;
    }
    if (br_orc_rle_decode(version, 0, f->buf[S_LENGTH], llen, lens, c.dict_size, err) != 0)
      goto done;
    uint64_t at = 0;
    for (size_t i = 0; i < c.dict_size; i++) {
      if (lens[i] > blen - at) {
        br_fail(err,
                "orc: stripe %zu: dictionary entry %zu (length %lld) runs past the "
                "dictionary data",
                si, i, (long long)lens[i]);
        goto done;
      }
      offs[i] = at;
      at += lens[i];
    }
    br_orc_rle ir;
    br_orc_rle_init(&ir, version, 0, data, dlen, nvals);
    for (size_t i = 0, v = 0, have = 0; i < rows; i++) {
      int cb;
      if (!present[i]) {
        cb = fn(ud, NULL, 0, 1);
      } else {
        if (v == have) { /* the next piece of the indexes */
          if (br_orc_rle_next(&ir, idx, IDX_CHUNK, &have, err) != 0) goto done;
          v = 0;
        }
        uint64_t k = idx[v++];
        if (k >= c.dict_size) {
          br_fail(err, "orc: stripe %zu: dictionary index %llu of %llu entries", si,
                  (unsigned long long)k, (unsigned long long)c.dict_size);
          goto done;
        }
        cb = fn(ud, blob + offs[k], (size_t)lens[k], 0);
      }
      if (cb) {
        rc = cb;
        goto done;
      }
    }
  } else {
    lens = malloc((IDX_CHUNK + BR_ORC_RLE_MAX_RUN) * sizeof *lens);
    if (!lens) {
      br_fail(err, "out of memory");
      goto done;
    }
    br_orc_rle lr;
    br_orc_rle_init(&lr, version, 0, f->buf[S_LENGTH], llen, nvals);
    uint64_t at = 0;
    for (size_t i = 0, v = 0, have = 0; i < rows; i++) {
      int cb;
      if (!present[i]) {
        cb = fn(ud, NULL, 0, 1);
      } else {
        if (v == have) { /* the next piece of the lengths */
          if (br_orc_rle_next(&lr, lens, IDX_CHUNK, &have, err) != 0) goto done;
          v = 0;
        }
        uint64_t n = lens[v++];
        if (n > dlen - at) {
          br_fail(err, "orc: stripe %zu: value %zu (length %lld) runs past the column's data", si,
                  i, (long long)n);
          goto done;
        }
        cb = fn(ud, data ? data + at : (const uint8_t *)"", (size_t)n, 0);
        at += n;
      }
      if (cb) {
        rc = cb;
        goto done;
      }
    }
  }
  rc = 0;
done:
  free(present);
  free(lens);
  free(idx);
  free(offs);
  return rc;
}

int br_orc_read_column_at(br_orc_file *f, size_t i, br_orc_value_fn fn, void *ud, br_err *err) {
  if (i >= f->ncols) return br_fail(err, "orc: no column %zu", i);
  uint32_t col = f->col_type[i];
  int kind = f->kinds[col];
  if (kind != BR_ORC_STRING && kind != BR_ORC_BINARY && kind != BR_ORC_VARCHAR &&
      kind != BR_ORC_CHAR)
    return br_fail(err, "orc: column '%s' is not a string or binary column (type kind %d)",
                   f->names[i], kind);
  for (size_t s = 0; s < f->nstripes; s++) {
    int rc = read_stripe(f, s, col, fn, ud, err);
    if (rc != 0) return rc;
  }
  return 0;
}

int br_orc_read_all_from_memory(const uint8_t *data, size_t len, br_orc_value_fn fn, void *ud,
                                br_err *err) {
  br_source *src = br_source_from_memory(data, len, err);
  if (!src) return -1;
  br_orc_file *f = br_orc_open(src, err);
  int rc = f ? 0 : -1;
  for (size_t i = 0; f && i < f->ncols && rc == 0; i++) {
    int kind = f->kinds[f->col_type[i]];
    if (kind == BR_ORC_STRING || kind == BR_ORC_BINARY || kind == BR_ORC_VARCHAR ||
        kind == BR_ORC_CHAR)
      rc = br_orc_read_column_at(f, i, fn, ud, err);
  }
  br_orc_close(f);
  br_source_close(src);
  return rc;
}
