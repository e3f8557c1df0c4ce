/* Table tests of the Parquet building blocks: Thrift compact, RLE hybrid, delta, codecs, pages. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/internal.h"
#include "unit.h"

static void test_varints(void) {
  static const struct {
    uint8_t in[12];
    size_t len;
    int ok;
    int64_t want; /* zigzag-decoded */
  } t[] = {
      {{0x00}, 1, 1, 0},
      {{0x01}, 1, 1, -1},
      {{0x02}, 1, 1, 1},
      {{0x03}, 1, 1, -2},
      {{0xac, 0x02}, 2, 1, 150},
      {{0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 10, 1, INT64_MAX},
      {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 10, 1, INT64_MIN},
      {{0x80}, 1, 0, 0},                                                        /* truncated */
      {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, 10, 0, 0}, /* overflow */
      {{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 11, 0, 0},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    br_err err;
    tc_reader r = {t[i].in, t[i].in + t[i].len, 0, 0, &err};
    int64_t v = 0;
    int rc = tc_i64(&r, &v);
    CHECK((rc == 0) == t[i].ok, "varint case %zu rc=%d", i, rc);
    if (t[i].ok) CHECK(v == t[i].want, "varint case %zu: %lld", i, (long long)v);
  }
  /* writer round trip */
  static const int64_t vals[] = {0, 1, -1, 63, -64, 64, 1000000, INT64_MAX, INT64_MIN};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    tc_buf b = {0};
    tc_put_zigzag(&b, vals[i]);
    br_err err;
    tc_reader r = {b.p, b.p + b.len, 0, 0, &err};
    int64_t v;
    CHECK(tc_i64(&r, &v) == 0 && v == vals[i] && r.p == r.end, "zigzag round trip %lld",
          (long long)vals[i]);
    free(b.p);
  }
}

static void test_fields(void) {
  /* field 1 i32 = 5 (delta form), field 20 i64 = -1 (long form), field 21 binary "ab",
   * field 22 list<i32>[1,2], field 23 nested struct {1: true}, field 24 map, stop */
  static const uint8_t in[] = {0x15, 0x0a, 0x06, 0x28, 0x01, 0x18, 0x02, 'a',
                               'b',  0x19, 0x25, 0x02, 0x04, 0x1c, 0x11, 0x00,
                               0x1b, 0x01, 0x85, 0x01, 'k',  0x06, 0x00};
  br_err err;
  tc_reader r = {in, in + sizeof in, 0, 0, &err};
  int16_t last = 0, id = 0;
  int t = tc_field(&r, &last, &id);
  int64_t v;
  CHECK(t == TC_I32 && id == 1 && tc_int_field(&r, t, &v) == 0 && v == 5, "field 1");
  t = tc_field(&r, &last, &id);
  CHECK(t == TC_I64 && id == 20 && tc_int_field(&r, t, &v) == 0 && v == -1, "field 20: %d %d", t,
        id);
  int ids[4] = {0}, n = 0;
  while ((t = tc_field(&r, &last, &id)) > 0 && n < 4) {
    ids[n++] = id;
    CHECK(tc_skip(&r, t) == 0, "skip field %d: %s", id, err.msg);
  }
  CHECK(t == TC_STOP && n == 4 && ids[0] == 21 && ids[3] == 24 && r.p == r.end,
        "skipped fields t=%d n=%d", t, n);
  /* every truncation fails */
  for (size_t cut = 0; cut < sizeof in; cut++) {
    tc_reader rr = {in, in + cut, 0, 0, &err};
    CHECK(tc_skip(&rr, TC_STRUCT) == -1, "truncated at %zu accepted", cut);
  }
  /* deep nesting is refused */
  uint8_t deep[200];
  for (size_t i = 0; i < sizeof deep; i++) deep[i] = 0x1c; /* field +1, struct */
  tc_reader rd = {deep, deep + sizeof deep, 0, 0, &err};
  CHECK(tc_skip(&rd, TC_STRUCT) == -1 && strstr(err.msg, "deep"), "deep nesting: %s", err.msg);
  /* a list claiming more elements than bytes */
  static const uint8_t big[] = {0xf5, 0xff, 0xff, 0xff, 0xff, 0x0f};
  tc_reader rb = {big, big + sizeof big, 0, 0, &err};
  CHECK(tc_skip(&rb, TC_LIST) == -1, "huge list accepted");
}

static void test_rle(void) {
  static const struct {
    uint8_t in[16];
    size_t len;
    int bw;
    size_t n;
    int ok;
    uint32_t want[16];
  } t[] = {
      /* RLE run of 5 x 3 (bw 2) */
      {{0x0a, 0x03}, 2, 2, 5, 1, {3, 3, 3, 3, 3}},
      /* bit-packed, one group of 8 values 0..7 with bw 3: 0x88 0xc6 0xfa */
      {{0x03, 0x88, 0xc6, 0xfa}, 4, 3, 8, 1, {0, 1, 2, 3, 4, 5, 6, 7}},
      /* RLE then bit-packed (bw 1): 3 x 1, then 8 bits 0b10101010 */
      {{0x06, 0x01, 0x03, 0xaa}, 4, 1, 11, 1, {1, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1}},
      /* two-byte RLE value with bw 9 */
      {{0x04, 0x2c, 0x01}, 3, 9, 2, 1, {300, 300}},
      /* bw 0: all zero */
      {{0x10}, 1, 0, 8, 1, {0}},
      /* not enough values */
      {{0x04, 0x01}, 2, 1, 3, 0, {0}},
      /* truncated RLE value */
      {{0x04}, 1, 8, 1, 0, {0}},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    pq_rle d;
    uint32_t out[16] = {0};
    pq_rle_init(&d, t[i].in, t[i].len, t[i].bw);
    int rc = pq_rle_get(&d, out, t[i].n);
    CHECK((rc == 0) == t[i].ok, "rle case %zu rc=%d", i, rc);
    if (t[i].ok) CHECK(memcmp(out, t[i].want, t[i].n * 4) == 0, "rle case %zu values", i);
  }
  /* encoder round trip on mixed patterns */
  uint8_t vals[1000];
  for (size_t i = 0; i < sizeof vals; i++) vals[i] = (i / 37) % 2 ? (uint8_t)((i * 7) % 3 == 0) : 1;
  tc_buf b = {0};
  pq_rle_encode(&b, vals, sizeof vals, 1);
  pq_rle d;
  uint32_t out[1000];
  pq_rle_init(&d, b.p, b.len, 1);
  int same = pq_rle_get(&d, out, 1000) == 0;
  for (size_t i = 0; same && i < 1000; i++) same = out[i] == vals[i];
  CHECK(same, "rle encode/decode round trip");
  free(b.p);
}

static void test_delta(void) {
  /* block 128, 4 miniblocks, 5 values, first 7; deltas min -2, widths 2: values 7 5 8 9 4 */
  /* deltas: -2, 3, 1, -5 -> min -5; adjusted 3, 8, 6, 0 -> width 4 */
  static const uint8_t in[] = {0x80, 0x01, 0x04, 0x05, 0x0e, /* header: 128, 4, 5, zz(7)=14 */
                               0x09,                         /* min delta zz(-5)=9 */
                               0x04, 0x00, 0x00, 0x00,       /* widths */
                               0x83, 0x06, 0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  br_err err;
  pq_dbp d;
  uint64_t v, want[] = {7, 5, 8, 9, 4};
  CHECK(pq_dbp_init(&d, in, sizeof in, 100, &err) == 0, "dbp init: %s", err.msg);
  for (int i = 0; i < 5; i++) CHECK(pq_dbp_next(&d, &v, &err) == 0 && v == want[i], "dbp %d", i);
  CHECK(pq_dbp_next(&d, &v, &err) == -1, "dbp past the end");
  const uint8_t *end;
  CHECK(pq_dbp_init(&d, in, sizeof in, 100, &err) == 0 && pq_dbp_skip_all(&d, &end, &err) == 0 &&
            end == in + sizeof in,
        "dbp end");
  CHECK(pq_dbp_init(&d, in, sizeof in, 4, &err) == -1, "dbp over the value bound");
  CHECK(pq_dbp_init(&d, in, sizeof in - 1, 100, &err) == 0 && pq_dbp_skip_all(&d, &end, &err) == -1,
        "dbp truncated miniblock");
  static const uint8_t badblock[] = {0x81, 0x01, 0x04, 0x05, 0x0e};
  CHECK(pq_dbp_init(&d, badblock, sizeof badblock, 100, &err) == -1, "dbp block not /128");
}

static void test_codecs(void) {
  static const int codecs[] = {BR_PQ_UNCOMPRESSED, BR_PQ_SNAPPY,  BR_PQ_GZIP,
                               BR_PQ_ZSTD,         BR_PQ_LZ4_RAW, BR_PQ_BROTLI};
  uint8_t in[5000], out[5000];
  for (size_t i = 0; i < sizeof in; i++) in[i] = (uint8_t)((i * i) % 251 % 17);
  for (size_t c = 0; c < sizeof codecs / sizeof codecs[0]; c++) {
    uint8_t *z;
    size_t zl;
    br_err err;
    CHECK(pq_compress(codecs[c], in, sizeof in, &z, &zl, &err) == 0, "compress %d", codecs[c]);
    CHECK(pq_decompress(codecs[c], z, zl, out, sizeof out, &err) == 0 &&
              memcmp(in, out, sizeof in) == 0,
          "round trip %d: %s", codecs[c], err.msg);
    CHECK(pq_decompress(codecs[c], z, zl, out, sizeof out - 1, &err) == -1,
          "codec %d: smaller declared size accepted", codecs[c]);
    if (codecs[c] != BR_PQ_UNCOMPRESSED && zl > 8) {
      memset(z + zl / 2, 0xff, 4);
      int rc = pq_decompress(codecs[c], z, zl, out, sizeof out, &err);
      CHECK(rc == -1 || rc == 0, "corrupt codec %d", codecs[c]); /* must not crash */
      CHECK(pq_decompress(codecs[c], z, zl / 2, out, sizeof out, &err) == -1,
            "codec %d: truncated stream accepted", codecs[c]);
    }
    free(z);
  }
  /* LZ4 codec 5 with Hadoop framing, built by hand around a raw block */
  uint8_t *z;
  size_t zl;
  br_err err;
  CHECK(pq_compress(BR_PQ_LZ4_RAW, in, sizeof in, &z, &zl, &err) == 0, "lz4 raw");
  uint8_t *h = malloc(zl + 8);
  uint32_t raw = sizeof in, comp = (uint32_t)zl;
  for (int i = 0; i < 4; i++) {
    h[i] = (uint8_t)(raw >> (24 - 8 * i));
    h[4 + i] = (uint8_t)(comp >> (24 - 8 * i));
  }
  memcpy(h + 8, z, zl);
  CHECK(pq_decompress(BR_PQ_LZ4, h, zl + 8, out, sizeof out, &err) == 0 &&
            memcmp(in, out, sizeof in) == 0,
        "hadoop lz4: %s", err.msg);
  CHECK(pq_decompress(BR_PQ_LZ4, z, zl, out, sizeof out, &err) == 0 &&
            memcmp(in, out, sizeof in) == 0,
        "raw block under codec LZ4: %s", err.msg);
  CHECK(pq_decompress(BR_PQ_LZ4, z, zl, out, sizeof out - 3, &err) == -1, "lz4 wrong size");
  CHECK(pq_decompress(3, z, zl, out, sizeof out, &err) == -1 && strstr(err.msg, "codec"),
        "LZO refused");
  CHECK(pq_decompress(BR_PQ_ZSTD, z, zl, out, (size_t)BR_PQ_MAX_PAGE + 1, &err) == -1,
        "page size cap");
  free(h);
  free(z);
}

static int count_cb(void *ud, const uint8_t *d, size_t l, int is_null) {
  (*(int *)ud)++;
  return 0;
}

/* Page decoder: hand-made v1 page for an optional BYTE_ARRAY column, then malformed variants. */
static void test_pages(void) {
  pq_leaf col = {"s", BR_PQ_BYTE_ARRAY, 0, -1, 1, 0};
  tc_buf page = {0}, hdr = {0}, lv = {0};
  uint8_t defs[4] = {1, 0, 1, 1};
  pq_rle_encode(&lv, defs, 4, 1);
  uint8_t l4[4] = {(uint8_t)lv.len, 0, 0, 0};
  tc_buf_put(&page, l4, 4);
  tc_buf_put(&page, lv.p, lv.len);
  static const uint8_t vals[] = {1, 0, 0, 0, 'a', 0, 0, 0, 0, 2, 0, 0, 0, 'b', 'c'};
  tc_buf_put(&page, vals, sizeof vals);
  int16_t last = 0, l2 = 0;
  tc_put_i32_field(&hdr, &last, 1, 0);
  tc_put_i32_field(&hdr, &last, 2, (int32_t)page.len);
  tc_put_i32_field(&hdr, &last, 3, (int32_t)page.len);
  tc_put_field(&hdr, &last, 5, TC_STRUCT);
  tc_put_i32_field(&hdr, &l2, 1, 4);
  tc_put_i32_field(&hdr, &l2, 2, 0);
  tc_put_stop(&hdr);
  tc_put_stop(&hdr);
  tc_buf_put(&hdr, page.p, page.len);
  pq_scratch s = {0};
  br_err err;
  int n = 0;
  int64_t rows = 0;
  CHECK(pq_decode_chunk(&col, 0, hdr.p, hdr.len, 4, &s, count_cb, &n, &rows, &err) == 0 && n == 4 &&
            rows == 4,
        "v1 page: %s n=%d", err.msg, n);
  n = 0;
  CHECK(pq_decode_chunk(&col, 0, hdr.p, hdr.len, 5, &s, count_cb, &n, &rows, &err) == -1 &&
            strstr(err.msg, "chunk ends"),
        "missing values must be an error: %s", err.msg);
  CHECK(pq_decode_chunk(&col, 0, hdr.p, hdr.len - 1, 4, &s, count_cb, &n, &rows, &err) == -1,
        "truncated page");
  CHECK(pq_decode_chunk(&col, 1, hdr.p, hdr.len, 4, &s, count_cb, &n, &rows, &err) == -1,
        "wrong codec");
  /* a value length pointing past the page */
  hdr.p[hdr.len - sizeof vals] = 0x7f;
  CHECK(pq_decode_chunk(&col, 0, hdr.p, hdr.len, 4, &s, count_cb, &n, &rows, &err) == -1 &&
            strstr(err.msg, "past the page end"),
        "value past the page: %s", err.msg);
  /* a definition level above the maximum */
  pq_leaf low = {"s", BR_PQ_BYTE_ARRAY, 0, -1, 0, 1};
  CHECK(pq_decode_chunk(&low, 0, hdr.p, hdr.len, 4, &s, count_cb, &n, &rows, &err) == -1,
        "level data read under the wrong schema");
  pq_scratch_free(&s);
  free(page.p);
  free(hdr.p);
  free(lv.p);
}

/* ---- writer: logical types; column replacement ---- */

static int to_buf(void *ud, const void *p, size_t len, br_err *err) {
  tc_buf_put(ud, p, len);
  return ((tc_buf *)ud)->failed ? br_fail(err, "out of memory") : 0;
}

typedef struct collected {
  uint8_t vals[64][64];
  size_t lens[64];
  int nulls[64];
  int n;
} collected;

static int collect_cb(void *ud, const uint8_t *data, size_t len, int is_null) {
  collected *c = ud;
  if (c->n == 64 || len > 64) return 1;
  c->nulls[c->n] = is_null;
  c->lens[c->n] = len;
  if (len) memcpy(c->vals[c->n], data, len);
  c->n++;
  return 0;
}

static int rg_calls;
static int count_rgs(void *ud, const br_parquet_rg_values *rg, br_err *err) {
  (void)ud;
  (void)err;
  CHECK(rg->first_row == (int64_t)rg->row_group * 4, "first_row %lld of row group %u",
        (long long)rg->first_row, rg->row_group);
  rg_calls++;
  return 0;
}

static void test_writer_and_replace(void) {
  br_parquet_column_spec cols[3] = {{"id", BR_PQ_INT64, 0, 0, 0, 0},
                                    {"at", BR_PQ_INT64, 0, 1, 0, 1},
                                    {"img", BR_PQ_BYTE_ARRAY, 0, 1, 0, 0}};
  br_parquet_write_options wo = {BR_PQ_ZSTD, 4, 0};
  tc_buf file = {0}, out = {0};
  br_err err;
  br_parquet_writer *w = br_parquet_writer_new(cols, 3, &wo, to_buf, &file, &err);
  CHECK(w != NULL, "writer: %s", err.msg);
  if (!w) return;
  for (int i = 0; i < 10; i++) {
    int64_t id = i, at = 1700000000000 + i;
    char img[16];
    int l = snprintf(img, sizeof img, "img%d", i % 3);
    br_parquet_value v[3] = {{(const uint8_t *)&id, 8, 0},
                             {(const uint8_t *)&at, 8, 0},
                             {(const uint8_t *)img, (size_t)l, i == 4}};
    CHECK(br_parquet_writer_row(w, v, &err) == 0, "row %d: %s", i, err.msg);
  }
  CHECK(br_parquet_writer_finish(w, &err) == 0, "finish: %s", err.msg);
  br_parquet_writer_free(w);
  /* the footer decodes, with TIMESTAMP_MILLIS on the timestamp column */
  uint32_t flen = (uint32_t)file.p[file.len - 8] | (uint32_t)file.p[file.len - 7] << 8 |
                  (uint32_t)file.p[file.len - 6] << 16 | (uint32_t)file.p[file.len - 5] << 24;
  pq_meta m;
  CHECK(pq_meta_decode(file.p + file.len - 8 - flen, flen, &m, &err) == 0, "footer: %s", err.msg);
  CHECK(m.nleaves == 3 && m.leaves[1].converted_type == 9 && m.leaves[0].converted_type == -1,
        "timestamp column annotated (converted type %d)", m.leaves[1].converted_type);
  CHECK(m.nrow_groups == 3, "3 row groups, got %u", m.nrow_groups);
  pq_meta_free(&m);

  for (int binary = 0; binary <= 1; binary++) {
    br_source *src = br_source_from_memory(file.p, file.len, &err);
    br_parquet_file *f = src ? br_parquet_open(src, &err) : NULL;
    CHECK(f != NULL, "open: %s", err.msg);
    if (!f) return;
    out.len = 0;
    rg_calls = 0;
    br_parquet_replace_options ro = {2, "img_sha", binary, count_rgs, NULL};
    CHECK(br_parquet_replace_column(f, &ro, to_buf, &out, &err) == 0, "replace: %s", err.msg);
    CHECK(rg_calls == 3, "callback once per row group: %d", rg_calls);
    /* refusals: a non-BYTE_ARRAY column, a name that is taken */
    br_parquet_replace_options bad = {0, NULL, binary, NULL, NULL};
    tc_buf junk = {0};
    CHECK(br_parquet_replace_column(f, &bad, to_buf, &junk, &err) == -1 &&
              strstr(err.msg, "not BYTE_ARRAY"),
          "INT64 column refused: %s", err.msg);
    bad.column = 2;
    bad.new_name = "id";
    CHECK(br_parquet_replace_column(f, &bad, to_buf, &junk, &err) == -1 &&
              strstr(err.msg, "already has"),
          "taken name refused: %s", err.msg);
    free(junk.p);
    br_parquet_close(f);
    br_source_close(src);

    src = br_source_from_memory(out.p, out.len, &err);
    f = src ? br_parquet_open(src, &err) : NULL;
    CHECK(f != NULL, "open the rewritten file: %s", err.msg);
    if (!f) return;
    br_parquet_column_info ci;
    CHECK(br_parquet_find_column(f, "img_sha") == 2 && br_parquet_column(f, 2, &ci) == 0 &&
              ci.type == (binary ? BR_PQ_FIXED_LEN_BYTE_ARRAY : BR_PQ_BYTE_ARRAY) &&
              ci.max_def == 1 && ci.converted_type == (binary ? -1 : 0),
          "new column's schema (binary %d)", binary);
    collected ids = {0}, ats = {0}, h = {0};
    CHECK(br_parquet_read_column_at(f, 0, collect_cb, &ids, &err) == 0 &&
              br_parquet_read_column_at(f, 1, collect_cb, &ats, &err) == 0 &&
              br_parquet_read_column_at(f, 2, collect_cb, &h, &err) == 0,
          "read back: %s", err.msg);
    CHECK(ids.n == 10 && ats.n == 10 && h.n == 10, "10 rows each");
    for (int i = 0; i < 10 && h.n == 10; i++) {
      int64_t id;
      memcpy(&id, ids.vals[i], 8);
      CHECK(id == i, "id %d", i);
      char img[16];
      int l = snprintf(img, sizeof img, "img%d", i % 3);
      uint8_t d[32];
      unsigned dl = 0;
      EVP_Digest(img, (size_t)l, d, &dl, EVP_sha256(), NULL);
      if (i == 4) {
        CHECK(h.nulls[i], "null stays null");
      } else if (binary) {
        CHECK(h.lens[i] == 32 && !memcmp(h.vals[i], d, 32), "binary digest of row %d", i);
      } else {
        char hex[65];
        for (int j = 0; j < 32; j++) snprintf(hex + 2 * j, 3, "%02x", d[j]);
        CHECK(h.lens[i] == 64 && !memcmp(h.vals[i], hex, 64), "hex digest of row %d", i);
      }
    }
    br_parquet_close(f);
    br_source_close(src);
  }
  free(file.p);
  free(out.p);

  /* only empty values and nulls (found by fuzz_parquet_rewrite): digests of "" */
  br_parquet_column_spec one = {"b", BR_PQ_BYTE_ARRAY, 0, 1, 0, 0};
  tc_buf ef = {0}, eo = {0};
  w = br_parquet_writer_new(&one, 1, &wo, to_buf, &ef, &err);
  for (int i = 0; w && i < 6; i++) {
    br_parquet_value v = {(const uint8_t *)"", 0, i == 2};
    br_parquet_writer_row(w, &v, &err);
  }
  CHECK(w && br_parquet_writer_finish(w, &err) == 0, "empty values file: %s", err.msg);
  br_parquet_writer_free(w);
  br_source *src = br_source_from_memory(ef.p, ef.len, &err);
  br_parquet_file *f = src ? br_parquet_open(src, &err) : NULL;
  br_parquet_replace_options ro = {0, NULL, 1, NULL, NULL};
  CHECK(f && br_parquet_replace_column(f, &ro, to_buf, &eo, &err) == 0, "replace empties: %s",
        err.msg);
  br_parquet_close(f);
  br_source_close(src);
  src = br_source_from_memory(eo.p, eo.len, &err);
  f = src ? br_parquet_open(src, &err) : NULL;
  collected c = {0};
  CHECK(f && br_parquet_read_column_at(f, 0, collect_cb, &c, &err) == 0 && c.n == 6,
        "read back the empties: %s", err.msg);
  static const uint8_t empty_sha[32] = {0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14,
                                        0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
                                        0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c,
                                        0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};
  for (int i = 0; i < c.n; i++)
    CHECK(i == 2 ? c.nulls[i] : (c.lens[i] == 32 && !memcmp(c.vals[i], empty_sha, 32)),
          "row %d of the empties", i);
  br_parquet_close(f);
  br_source_close(src);
  free(ef.p);
  free(eo.p);
}

int main(void) {
  test_varints();
  test_fields();
  test_rle();
  test_delta();
  test_codecs();
  test_pages();
  test_writer_and_replace();
  return unit_summary("test_parquet");
}
