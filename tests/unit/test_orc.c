/* ORC's pure decoders: varints, byte RLE, booleans, integer RLE v1 and v2 (short repeat, direct,
 * patched base, delta), with the examples of the ORC specification and malformed inputs. */
#include <lz4.h>
#include <snappy-c.h>
#include <stdint.h>
#include <stdlib.h>
#include <zlib.h>
#include <zstd.h>

#include "blobref/orc.h"
#include "unit.h"

#define MAXV 128

typedef struct rle_case {
  const char *name;
  int version, is_signed;
  uint8_t in[40];
  size_t in_len;
  size_t n;           /* values asked for */
  int64_t want[MAXV]; /* when ok */
  int ok;
} rle_case;

static void fill_seq(int64_t *w, size_t n, int64_t start, int64_t step) {
  for (size_t i = 0; i < n; i++) w[i] = start + (int64_t)i * step;
}

static void test_rle_tables(void) {
  static rle_case cases[] = {
      /* RLE v1 (spec: "Run Length Encoding version 1") */
      {"v1 run of 100 sevens", 1, 0, {0x61, 0x00, 0x07}, 3, 100, {0}, 1},
      {"v1 run 100 down to 1", 1, 0, {0x61, 0xff, 0x64}, 3, 100, {0}, 1},
      {"v1 literals", 1, 0, {0xfb, 0x02, 0x03, 0x06, 0x07, 0x0b}, 6, 5, {2, 3, 6, 7, 11}, 1},
      {"v1 signed literals", 1, 1, {0xfe, 0x01, 0x04}, 3, 2, {-1, 2}, 1},
      {"v1 literal truncated", 1, 0, {0xfb, 0x02, 0x03}, 3, 5, {0}, 0},
      {"v1 run past n", 1, 0, {0x61, 0x00, 0x07}, 3, 10, {0}, 0},
      {"v1 data ends early", 1, 0, {0x00, 0x00, 0x07}, 3, 4, {0}, 0},
      /* RLE v2 (spec: "Run Length Encoding version 2") */
      {"v2 short repeat", 2, 0, {0x0a, 0x27, 0x10}, 3, 5, {10000, 10000, 10000, 10000, 10000}, 1},
      {"v2 short repeat signed -1", 2, 1, {0x00, 0x01}, 2, 3, {-1, -1, -1}, 1},
      {"v2 short repeat truncated", 2, 0, {0x0a, 0x27}, 2, 5, {0}, 0},
      {"v2 short repeat past n", 2, 0, {0x0a, 0x27, 0x10}, 3, 3, {0}, 0},
      {"v2 direct",
       2,
       0,
       {0x5e, 0x03, 0x5c, 0xa1, 0xab, 0x1e, 0xde, 0xad, 0xbe, 0xef},
       10,
       4,
       {23713, 43806, 57005, 48879},
       1},
      {"v2 direct truncated", 2, 0, {0x5e, 0x03, 0x5c, 0xa1, 0xab}, 5, 4, {0}, 0},
      {"v2 direct signed", 2, 1, {0x42, 0x02, 0x6c}, 3, 3, {-1, 1, -2}, 1},
      {"v2 patched base",
       2,
       0,
       {0x8e, 0x13, 0x2b, 0x21, 0x07, 0xd0, 0x1e, 0x00, 0x14, 0x70, 0x28, 0x32, 0x3c, 0x46,
        0x50, 0x5a, 0x64, 0x6e, 0x78, 0x82, 0x8c, 0x96, 0xa0, 0xaa, 0xb4, 0xbe, 0xfc, 0xe8},
       28,
       20,
       {2030, 2000, 2020, 1000000, 2040, 2050, 2060, 2070, 2080, 2090,
        2100, 2110, 2120, 2130,    2140, 2150, 2160, 2170, 2180, 2190},
       1},
      {"v2 patched base, patch list truncated",
       2,
       0,
       {0x8e, 0x13, 0x2b, 0x21, 0x07, 0xd0, 0x1e, 0x00, 0x14, 0x70, 0x28, 0x32, 0x3c,
        0x46, 0x50, 0x5a, 0x64, 0x6e, 0x78, 0x82, 0x8c, 0x96, 0xa0, 0xaa, 0xb4, 0xbe},
       26,
       20,
       {0},
       0},
      {"v2 patched base, patch gap outside the run",
       2,
       0,
       {0x8e, 0x02, 0x2b, 0x21, 0x07, 0xd0, 0x1e, 0x00, 0x14, 0xfc, 0xe8},
       11,
       3,
       {0},
       0},
      {"v2 delta (primes)",
       2,
       0,
       {0xc6, 0x09, 0x02, 0x02, 0x22, 0x42, 0x42, 0x46},
       8,
       10,
       {2, 3, 5, 7, 11, 13, 17, 19, 23, 29},
       1},
      {"v2 delta fixed step",
       2,
       0,
       {0xc0, 0x09, 0x01, 0x02},
       4,
       10,
       {1, 2, 3, 4, 5, 6, 7, 8, 9, 10},
       1},
      {"v2 delta signed descending", 2, 1, {0xc0, 0x04, 0x14, 0x03}, 4, 5, {10, 8, 6, 4, 2}, 1},
      {"v2 delta one value", 2, 0, {0xc0, 0x00, 0x07, 0x00}, 4, 1, {7}, 1},
      {"v2 delta truncated", 2, 0, {0xc6, 0x09, 0x02, 0x02, 0x22}, 5, 10, {0}, 0},
      {"v2 empty input", 2, 0, {0}, 0, 1, {0}, 0},
  };
  fill_seq(cases[0].want, 100, 7, 0);
  fill_seq(cases[1].want, 100, 100, -1);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const rle_case *t = &cases[c];
    uint64_t out[MAXV];
    br_err err = {""};
    int rc = br_orc_rle_decode(t->version, t->is_signed, t->in, t->in_len, out, t->n, &err);
    if (!t->ok) {
      CHECK(rc == -1 && err.msg[0], "%s: want an error, got rc=%d", t->name, rc);
      continue;
    }
    CHECK(rc == 0, "%s: %s", t->name, err.msg);
    if (rc != 0) continue;
    size_t bad = t->n;
    for (size_t i = 0; i < t->n && bad == t->n; i++)
      if ((int64_t)out[i] != t->want[i]) bad = i;
    CHECK(bad == t->n, "%s: value %zu is %lld, want %lld", t->name, bad,
          bad < t->n ? (long long)out[bad] : 0, bad < t->n ? (long long)t->want[bad] : 0);
  }
  /* the same streams in pieces (br_orc_rle_next, one value wanted at a time): same values, and
   * an error for the same inputs */
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const rle_case *t = &cases[c];
    uint64_t all[MAXV], piece[BR_ORC_RLE_MAX_RUN];
    br_err err = {""};
    br_orc_rle r;
    br_orc_rle_init(&r, t->version, t->is_signed, t->in, t->in_len, t->n);
    size_t total = 0, got = 0;
    int rc = 0;
    while (total < t->n && rc == 0) {
      rc = br_orc_rle_next(&r, piece, 1, &got, &err);
      if (rc == 0 && (got == 0 || got > BR_ORC_RLE_MAX_RUN || total + got > t->n)) rc = -2;
      if (rc == 0) memcpy(all + total, piece, got * sizeof *piece);
      total += rc == 0 ? got : 0;
    }
    if (!t->ok) {
      CHECK(rc == -1 && err.msg[0], "%s in pieces: want an error, got rc=%d", t->name, rc);
      continue;
    }
    CHECK(rc == 0 && total == t->n, "%s in pieces: rc=%d, %zu values: %s", t->name, rc, total,
          err.msg);
    if (rc != 0) continue;
    size_t bad = t->n;
    for (size_t i = 0; i < t->n && bad == t->n; i++)
      if ((int64_t)all[i] != t->want[i]) bad = i;
    CHECK(bad == t->n, "%s in pieces: value %zu differs", t->name, bad);
  }
}

static void test_varint(void) {
  static const struct {
    uint8_t in[12];
    size_t len;
    int ok;
    uint64_t want;
  } cases[] = {
      {{0x00}, 1, 1, 0},
      {{0x7f}, 1, 1, 127},
      {{0x96, 0x01}, 2, 1, 150},
      {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 10, 1, UINT64_MAX},
      {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, 10, 0, 0}, /* 65 bits */
      {{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 11, 0, 0},
      {{0x96}, 1, 0, 0}, /* truncated */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const uint8_t *p = cases[c].in;
    uint64_t v = 0;
    int rc = br_orc_varint(&p, cases[c].in + cases[c].len, &v);
    if (cases[c].ok)
      CHECK(rc == 0 && v == cases[c].want && p == cases[c].in + cases[c].len,
            "varint case %zu: rc=%d v=%llu", c, rc, (unsigned long long)v);
    else
      CHECK(rc == -1, "varint case %zu: want an error", c);
  }
}

static void test_byte_rle_and_bools(void) {
  br_err err = {""};
  uint8_t out[100];
  static const uint8_t run[] = {0x61, 0x00};
  memset(out, 0xaa, sizeof out);
  int rc = br_orc_byte_rle_decode(run, sizeof run, out, 100, &err);
  int zeros = 1;
  for (int i = 0; i < 100; i++) zeros &= out[i] == 0;
  CHECK(rc == 0 && zeros, "byte RLE run of 100 zeros: %s", err.msg);
  static const uint8_t lit[] = {0xfe, 0x44, 0x45};
  rc = br_orc_byte_rle_decode(lit, sizeof lit, out, 2, &err);
  CHECK(rc == 0 && out[0] == 0x44 && out[1] == 0x45, "byte RLE literals: %s", err.msg);
  CHECK(br_orc_byte_rle_decode(lit, 2, out, 2, &err) == -1, "truncated literals are an error");
  CHECK(br_orc_byte_rle_decode(run, 1, out, 3, &err) == -1, "a run without its byte is an error");
  /* spec: [true, false x 7] is 0xff 0x80 */
  static const uint8_t bools[] = {0xff, 0x80};
  rc = br_orc_bool_decode(bools, sizeof bools, out, 8, &err);
  CHECK(rc == 0 && out[0] == 1 && out[1] == 0 && out[7] == 0, "booleans: %s", err.msg);
  /* 11 booleans over two bytes: 0b10110000 0b011xxxxx */
  static const uint8_t bools2[] = {0xfe, 0xb0, 0x60};
  static const uint8_t want2[] = {1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1};
  rc = br_orc_bool_decode(bools2, sizeof bools2, out, 11, &err);
  CHECK(rc == 0 && !memcmp(out, want2, 11), "11 booleans in two bytes: %s", err.msg);
  CHECK(br_orc_bool_decode(bools, 1, out, 8, &err) == -1, "truncated booleans are an error");
}

static int count_value(void *ud, const uint8_t *data, size_t len, int is_null) {
  (*(size_t *)ud)++;
  return 0;
}

/* Whole-file decoding refuses what is not ORC without reading past the buffer. */
static void test_not_orc(void) {
  static const uint8_t junk[][8] = {{'O', 'R', 'C', 0, 0, 0, 0, 0},
                                    {'P', 'A', 'R', '1', 0, 0, 0, 1}};
  for (size_t i = 0; i < 2; i++) {
    size_t n = 0;
    br_err err = {""};
    int rc = br_orc_read_all_from_memory(junk[i], sizeof junk[i], count_value, &n, &err);
    CHECK(rc == -1 && err.msg[0] && n == 0, "junk %zu refused: rc=%d", i, rc);
  }
}

/* The compressed examples of ../shared/testdata/orc (skipped when absent): opening a file
 * decompresses its footer with the file's codec, so rows and stripes prove snappy, lz4 and zstd
 * chunk framing on real files; the stripes' string columns are checked by test_orc.py. */
static void test_codec_examples(void) {
  static const struct {
    const char *name;
    int codec;
    int64_t rows;
    size_t stripes;
  } files[] = {
      {"nulls-at-end-snappy.orc", BR_ORC_SNAPPY, 70000, 1},
      {"TestVectorOrcFile.testLz4.orc", BR_ORC_LZ4, 10000, 2},
      {"TestVectorOrcFile.testZstd.0.12.orc", BR_ORC_ZSTD, 10000, 1},
      {"TestOrcFile.testWithoutCompressionBlockSize.orc", BR_ORC_SNAPPY, 0, 1},
      {"demo-12-zlib.orc", BR_ORC_ZLIB, 1920800, 1},
  };
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char path[256];
    snprintf(path, sizeof path, "../shared/testdata/orc/%s", files[i].name);
    br_err err = {""};
    br_source *src = br_source_open_file(path, &err);
    if (!src) {
      printf("test_orc: %s absent, skipped\n", path);
      continue;
    }
    br_orc_file *f = br_orc_open(src, &err);
    CHECK(f != NULL, "%s: %s", files[i].name, err.msg);
    if (f) {
      CHECK((int)br_orc_codec(f) == files[i].codec && br_orc_num_rows(f) == files[i].rows &&
                br_orc_num_stripes(f) == files[i].stripes,
            "%s: codec %d rows %lld stripes %zu", files[i].name, (int)br_orc_codec(f),
            (long long)br_orc_num_rows(f), br_orc_num_stripes(f));
      br_orc_close(f);
    }
    br_source_close(src);
  }
}

/* ---- a tiny in-memory ORC writer: one string column, DIRECT_V2, any codec ---- */

typedef struct obuf {
  uint8_t p[1 << 16];
  size_t n;
} obuf;

static void put(obuf *b, const void *d, size_t n) {
  memcpy(b->p + b->n, d, n);
  b->n += n;
}
static void put_varint(obuf *b, uint64_t v) {
  while (v >= 0x80) {
    b->p[b->n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  b->p[b->n++] = (uint8_t)v;
}
static void put_uint_field(obuf *b, unsigned field, uint64_t v) {
  put_varint(b, field << 3);
  put_varint(b, v);
}
static void put_bytes_field(obuf *b, unsigned field, const obuf *m) {
  put_varint(b, field << 3 | 2);
  put_varint(b, m->n);
  put(b, m->p, m->n);
}

/* Frames in as one compressed chunk (or an original one when original is set). */
static void put_compressed(obuf *b, int codec, const obuf *in, int original) {
  static uint8_t z[1 << 16];
  size_t zn = sizeof z;
  if (codec == BR_ORC_NONE) {
    put(b, in->p, in->n);
    return;
  }
  if (!original) {
    if (codec == BR_ORC_ZLIB) {
      z_stream zs;
      memset(&zs, 0, sizeof zs);
      deflateInit2(&zs, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
      zs.next_in = (Bytef *)in->p;
      zs.avail_in = (uInt)in->n;
      zs.next_out = z;
      zs.avail_out = sizeof z;
      deflate(&zs, Z_FINISH);
      zn = sizeof z - zs.avail_out;
      deflateEnd(&zs);
    } else if (codec == BR_ORC_SNAPPY) {
      snappy_compress((const char *)in->p, in->n, (char *)z, &zn);
    } else if (codec == BR_ORC_LZ4) {
      zn = (size_t)LZ4_compress_default((const char *)in->p, (char *)z, (int)in->n, sizeof z);
    } else {
      zn = ZSTD_compress(z, sizeof z, in->p, in->n, 3);
    }
  }
  const uint8_t *body = original ? in->p : z;
  size_t n = original ? in->n : zn;
  uint32_t h = (uint32_t)(n << 1 | (original ? 1 : 0));
  uint8_t hdr[3] = {(uint8_t)h, (uint8_t)(h >> 8), (uint8_t)(h >> 16)};
  put(b, hdr, 3);
  put(b, body, n);
}

/* A file of nrows values "v<i>" (every third null) in column "s", compressed with codec. */
static size_t tiny_orc(obuf *f, int codec, int original, size_t nrows, int encodings) {
  obuf present = {.n = 0}, data = {.n = 0}, lens = {.n = 0}, tmp, sf = {.n = 0}, ft = {.n = 0};
  uint8_t bits[64] = {0};
  size_t nonnull = 0;
  f->n = 0;
  put(f, "ORC", 3);
  for (size_t i = 0; i < nrows; i++) {
    if (i % 3 == 2) continue;
    bits[i / 8] |= (uint8_t)(0x80 >> (i % 8));
    char v[16];
    int n = snprintf(v, sizeof v, "v%zu", i);
    put(&data, v, (size_t)n);
    tmp.p[nonnull++] = (uint8_t)n;
  }
  present.p[present.n++] = (uint8_t)(256 - (nrows + 7) / 8); /* byte RLE literals */
  put(&present, bits, (nrows + 7) / 8);
  lens.p[lens.n++] = (uint8_t)(0x40 | 7 << 1 | ((nonnull - 1) >> 8)); /* RLE v2 direct, 8 bits */
  lens.p[lens.n++] = (uint8_t)((nonnull - 1) & 0xff);
  put(&lens, tmp.p, nonnull);
  const obuf *streams[3] = {&present, &data, &lens};
  size_t data_len = 0;
  for (int k = 0; k < 3; k++) {
    size_t before = f->n;
    put_compressed(f, codec, streams[k], original);
    obuf st = {.n = 0};
    put_uint_field(&st, 1, (uint64_t)k); /* PRESENT, DATA, LENGTH */
    put_uint_field(&st, 2, 1);
    put_uint_field(&st, 3, f->n - before);
    put_bytes_field(&sf, 1, &st);
    data_len += f->n - before;
  }
  obuf enc = {.n = 0};
  put_uint_field(&enc, 1, 0);
  put_bytes_field(&sf, 2, &enc);
  enc.n = 0;
  put_uint_field(&enc, 1, 2);                                        /* DIRECT_V2 */
  for (int e = 1; e < encodings; e++) put_bytes_field(&sf, 2, &enc); /* one per type: 2 */
  size_t sf_at = f->n;
  put_compressed(f, codec, &sf, original);
  size_t sf_len = f->n - sf_at;
  obuf stripe = {.n = 0}, t = {.n = 0}, sub = {.n = 0};
  put_uint_field(&stripe, 1, 3);
  put_uint_field(&stripe, 3, data_len);
  put_uint_field(&stripe, 4, sf_len);
  put_uint_field(&stripe, 5, nrows);
  put_bytes_field(&ft, 3, &stripe);
  put_uint_field(&t, 1, BR_ORC_STRUCT);
  put_varint(&sub, 1);
  put_bytes_field(&t, 2, &sub);
  put_varint(&t, 3 << 3 | 2);
  put_varint(&t, 1);
  put(&t, "s", 1);
  put_bytes_field(&ft, 4, &t);
  t.n = 0;
  put_uint_field(&t, 1, BR_ORC_STRING);
  put_bytes_field(&ft, 4, &t);
  put_uint_field(&ft, 6, nrows);
  size_t ft_at = f->n;
  put_compressed(f, codec, &ft, original);
  obuf ps = {.n = 0};
  put_uint_field(&ps, 1, f->n - ft_at);
  put_uint_field(&ps, 2, (uint64_t)codec);
  put_uint_field(&ps, 3, 1 << 16);
  put_varint(&ps, 8000 << 3 | 2);
  put_varint(&ps, 3);
  put(&ps, "ORC", 3);
  put(f, ps.p, ps.n);
  f->p[f->n++] = (uint8_t)ps.n;
  return nonnull;
}

typedef struct collect {
  size_t rows, bad;
} collect;

static int check_value(void *ud, const uint8_t *data, size_t len, int is_null) {
  collect *c = ud;
  size_t i = c->rows++;
  char want[16];
  int n = snprintf(want, sizeof want, "v%zu", i);
  if (i % 3 == 2 ? !is_null : (is_null || len != (size_t)n || memcmp(data, want, len))) c->bad++;
  return 0;
}

/* The same string column under every codec, compressed and as "original" chunks. */
static void test_codecs_on_a_string_column(void) {
  static const int codecs[] = {BR_ORC_NONE, BR_ORC_ZLIB, BR_ORC_SNAPPY, BR_ORC_LZ4, BR_ORC_ZSTD};
  static obuf f;
  for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++)
    for (int original = 0; original <= 1; original++) {
      tiny_orc(&f, codecs[c], original, 200, 2);
      collect got = {0, 0};
      br_err err = {""};
      int rc = br_orc_read_all_from_memory(f.p, f.n, check_value, &got, &err);
      CHECK(rc == 0 && got.rows == 200 && got.bad == 0,
            "codec %d original %d: rc=%d rows=%zu bad=%zu %s", codecs[c], original, rc, got.rows,
            got.bad, err.msg);
    }
  /* LZO is refused with a clear error */
  /* a stripe footer whose column encodings do not match the schema's two types */
  static const int bad[] = {1, 3};
  for (size_t i = 0; i < 2; i++) {
    tiny_orc(&f, BR_ORC_ZLIB, 0, 10, bad[i]);
    collect got = {0, 0};
    br_err err = {""};
    int rc = br_orc_read_all_from_memory(f.p, f.n, check_value, &got, &err);
    CHECK(rc == -1 && strstr(err.msg, "column encodings for 2 columns") && got.rows == 0,
          "%d encodings: rc=%d %s", bad[i], rc, err.msg);
  }
  tiny_orc(&f, BR_ORC_NONE, 0, 10, 2);
  f.p[f.n - 1 - f.p[f.n - 1] + 3] = BR_ORC_LZO; /* the postscript's compression value */
  collect got = {0, 0};
  br_err err = {""};
  int rc = br_orc_read_all_from_memory(f.p, f.n, check_value, &got, &err);
  CHECK(rc == -1 && strstr(err.msg, "LZO") && got.rows == 0, "LZO: rc=%d %s", rc, err.msg);
}

int main(void) {
  test_varint();
  test_rle_tables();
  test_byte_rle_and_bools();
  test_not_orc();
  test_codec_examples();
  test_codecs_on_a_string_column();
  return unit_summary("test_orc");
}
