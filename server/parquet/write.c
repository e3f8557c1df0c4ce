/* Parquet writer: flat columns, PLAIN values, RLE definition levels, data page v1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/internal.h"

#define MAX_COLS 4096

typedef struct wcol {
  br_parquet_column_spec spec;
  char *name;
  tc_buf vals;   /* PLAIN values of the open page */
  uint8_t *defs; /* definition levels of the open page */
  size_t ndefs, defs_cap;
  tc_buf chunk; /* finished pages of the open row group */
  int64_t chunk_values, chunk_uncompressed;
} wcol;

struct br_parquet_writer {
  wcol *cols;
  size_t ncols;
  br_parquet_write_options o;
  br_parquet_write_fn out;
  void *out_ud;
  uint64_t offset;
  uint32_t rg_rows;
  int64_t total_rows;
  tc_buf rgs; /* serialized RowGroup structs */
  uint32_t nrgs;
  int failed;
};

static int emit(br_parquet_writer *w, const void *p, size_t len, br_err *err) {
  if (w->out(w->out_ud, p, len, err)) {
    w->failed = 1;
    return -1;
  }
  w->offset += len;
  return 0;
}

void br_parquet_writer_free(br_parquet_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->ncols; i++) {
    free(w->cols[i].name);
    free(w->cols[i].vals.p);
    free(w->cols[i].defs);
    free(w->cols[i].chunk.p);
  }
  free(w->cols);
  free(w->rgs.p);
  free(w);
}

br_parquet_writer *br_parquet_writer_new(const br_parquet_column_spec *cols, size_t ncols,
                                         const br_parquet_write_options *opts,
                                         br_parquet_write_fn out, void *out_ud, br_err *err) {
  br_parquet_writer *w = NULL;
  if (ncols == 0 || ncols > MAX_COLS) {
    br_fail(err, "parquet writer: %zu columns (1..%d allowed)", ncols, MAX_COLS);
    return NULL;
  }
  switch (opts->codec) {
    case BR_PQ_UNCOMPRESSED:
    case BR_PQ_SNAPPY:
    case BR_PQ_GZIP:
    case BR_PQ_BROTLI:
    case BR_PQ_ZSTD:
    case BR_PQ_LZ4_RAW:
      break;
    default:
      br_fail(err, "parquet writer: codec %d cannot be written", opts->codec);
      return NULL;
  }
  w = calloc(1, sizeof *w);
  if (!w || !(w->cols = calloc(ncols, sizeof *w->cols))) {
    free(w);
    br_fail(err, "out of memory");
    return NULL;
  }
  w->ncols = ncols;
  w->o = *opts;
  if (!w->o.row_group_rows) w->o.row_group_rows = 1u << 20;
  if (!w->o.page_bytes) w->o.page_bytes = 1u << 20;
  if (w->o.page_bytes > BR_PQ_MAX_PAGE / 4) w->o.page_bytes = BR_PQ_MAX_PAGE / 4;
  w->out = out;
  w->out_ud = out_ud;
  for (size_t i = 0; i < ncols; i++) {
    const br_parquet_column_spec *c = &cols[i];
    int ok = c->name && c->name[0];
    switch (c->type) {
      case BR_PQ_FIXED_LEN_BYTE_ARRAY:
        ok = ok && c->type_length > 0 && c->type_length <= 65536;
        break;
      case BR_PQ_BYTE_ARRAY:
      case BR_PQ_INT32:
      case BR_PQ_INT64:
      case BR_PQ_FLOAT:
      case BR_PQ_DOUBLE:
        break;
      default:
        ok = 0;
    }
    if (!ok) {
      br_fail(err, "parquet writer: column %zu has a bad name, type or length", i);
      br_parquet_writer_free(w);
      return NULL;
    }
    w->cols[i].spec = *c;
    w->cols[i].name = strdup(c->name);
    if (!w->cols[i].name) {
      br_fail(err, "out of memory");
      br_parquet_writer_free(w);
      return NULL;
    }
    w->cols[i].spec.name = w->cols[i].name;
  }
  if (emit(w, "PAR1", 4, err)) {
    br_parquet_writer_free(w);
    return NULL;
  }
  return w;
}

int pq_put_data_page_v1(tc_buf *chunk, int codec, const tc_buf *body, int32_t nvalues,
                        int64_t *uncompressed, br_err *err) {
  tc_buf hdr = {0};
  uint8_t *comp = NULL;
  size_t clen = 0;
  if (pq_compress(codec, body->p, body->len, &comp, &clen, err)) return -1;
  int16_t last = 0, l2 = 0;
  tc_put_i32_field(&hdr, &last, 1, 0); /* DATA_PAGE */
  tc_put_i32_field(&hdr, &last, 2, (int32_t)body->len);
  tc_put_i32_field(&hdr, &last, 3, (int32_t)clen);
  tc_put_field(&hdr, &last, 5, TC_STRUCT);
  tc_put_i32_field(&hdr, &l2, 1, nvalues);
  tc_put_i32_field(&hdr, &l2, 2, 0); /* PLAIN */
  tc_put_i32_field(&hdr, &l2, 3, 3); /* RLE */
  tc_put_i32_field(&hdr, &l2, 4, 3);
  tc_put_stop(&hdr);
  tc_put_stop(&hdr);
  tc_buf_put(chunk, hdr.p, hdr.len);
  tc_buf_put(chunk, comp, clen);
  int rc = hdr.failed || chunk->failed ? br_fail(err, "out of memory") : 0;
  if (rc == 0) *uncompressed += (int64_t)(hdr.len + body->len);
  free(hdr.p);
  free(comp);
  return rc;
}

void pq_put_column_chunk(tc_buf *o, int32_t type, const char *name, int codec, int64_t num_values,
                         int64_t uncompressed, int64_t compressed, int64_t offset) {
  int16_t lc = 0, lm = 0;
  tc_put_i64_field(o, &lc, 2, offset);
  tc_put_field(o, &lc, 3, TC_STRUCT);
  tc_put_i32_field(o, &lm, 1, type);
  tc_put_field(o, &lm, 2, TC_LIST);
  tc_put_list(o, TC_I32, 2);
  tc_put_zigzag(o, 0); /* PLAIN */
  tc_put_zigzag(o, 3); /* RLE */
  tc_put_field(o, &lm, 3, TC_LIST);
  tc_put_list(o, TC_BINARY, 1);
  tc_put_varint(o, strlen(name));
  tc_buf_put(o, name, strlen(name));
  tc_put_i32_field(o, &lm, 4, codec);
  tc_put_i64_field(o, &lm, 5, num_values);
  tc_put_i64_field(o, &lm, 6, uncompressed);
  tc_put_i64_field(o, &lm, 7, compressed);
  tc_put_i64_field(o, &lm, 9, offset);
  tc_put_stop(o); /* ColumnMetaData */
  tc_put_stop(o); /* ColumnChunk */
}

void pq_file_tail(uint32_t footer_len, uint8_t tail[8]) {
  for (int i = 0; i < 4; i++) tail[i] = (uint8_t)(footer_len >> (8 * i));
  memcpy(tail + 4, "PAR1", 4);
}

static int flush_page(br_parquet_writer *w, wcol *c, br_err *err) {
  tc_buf body = {0};
  int rc = -1;
  if (c->spec.optional) {
    tc_buf lv = {0};
    pq_rle_encode(&lv, c->defs, c->ndefs, 1);
    uint8_t l4[4] = {(uint8_t)lv.len, (uint8_t)(lv.len >> 8), (uint8_t)(lv.len >> 16),
                     (uint8_t)(lv.len >> 24)};
    tc_buf_put(&body, l4, 4);
    tc_buf_put(&body, lv.p, lv.len);
    free(lv.p);
  }
  tc_buf_put(&body, c->vals.p, c->vals.len);
  if (body.failed || c->vals.failed) {
    br_fail(err, "out of memory");
    goto out;
  }
  if (pq_put_data_page_v1(&c->chunk, w->o.codec, &body, (int32_t)c->ndefs, &c->chunk_uncompressed,
                          err))
    goto out;
  c->chunk_values += (int64_t)c->ndefs;
  c->vals.len = 0;
  c->ndefs = 0;
  rc = 0;
out:
  free(body.p);
  return rc;
}

static int flush_row_group(br_parquet_writer *w, br_err *err) {
  if (w->rg_rows == 0) return 0;
  tc_buf *b = &w->rgs;
  int16_t last = 0;
  int64_t total = 0;
  tc_put_field(b, &last, 1, TC_LIST);
  tc_put_list(b, TC_STRUCT, (uint32_t)w->ncols);
  for (size_t i = 0; i < w->ncols; i++) {
    wcol *c = &w->cols[i];
    if (c->ndefs && flush_page(w, c, err)) return -1;
    uint64_t off = w->offset;
    if (emit(w, c->chunk.p, c->chunk.len, err)) return -1;
    pq_put_column_chunk(b, c->spec.type, c->name, w->o.codec, c->chunk_values,
                        c->chunk_uncompressed, (int64_t)c->chunk.len, (int64_t)off);
    total += c->chunk_uncompressed;
    c->chunk.len = 0;
    c->chunk_values = c->chunk_uncompressed = 0;
  }
  tc_put_i64_field(b, &last, 2, total);
  tc_put_i64_field(b, &last, 3, w->rg_rows);
  tc_put_stop(b);
  if (b->failed) return br_fail(err, "out of memory");
  w->nrgs++;
  w->total_rows += w->rg_rows;
  w->rg_rows = 0;
  return 0;
}

int br_parquet_writer_row(br_parquet_writer *w, const br_parquet_value *vals, br_err *err) {
  if (w->failed) return br_fail(err, "parquet writer: unusable after an earlier error");
  for (size_t i = 0; i < w->ncols; i++) {
    wcol *c = &w->cols[i];
    const br_parquet_value *v = &vals[i];
    size_t want = 0;
    switch (c->spec.type) {
      case BR_PQ_INT32:
      case BR_PQ_FLOAT:
        want = 4;
        break;
      case BR_PQ_INT64:
      case BR_PQ_DOUBLE:
        want = 8;
        break;
      case BR_PQ_FIXED_LEN_BYTE_ARRAY:
        want = (size_t)c->spec.type_length;
        break;
      default:
        want = 0;
    }
    if (v->is_null && !c->spec.optional) {
      w->failed = 1;
      return br_fail(err, "parquet writer: null in required column %s", c->name);
    }
    if (!v->is_null && want && v->len != want) {
      w->failed = 1;
      return br_fail(err, "parquet writer: column %s wants %zu bytes, got %zu", c->name, want,
                     v->len);
    }
    if (!v->is_null && v->len > BR_PQ_MAX_PAGE / 8) {
      w->failed = 1;
      return br_fail(err, "parquet writer: value of %zu bytes in column %s is too big", v->len,
                     c->name);
    }
    if (c->spec.optional) {
      if (c->ndefs == c->defs_cap) {
        size_t nc = c->defs_cap ? c->defs_cap * 2 : 1024;
        uint8_t *p = realloc(c->defs, nc);
        if (!p) {
          w->failed = 1;
          return br_fail(err, "out of memory");
        }
        c->defs = p;
        c->defs_cap = nc;
      }
      c->defs[c->ndefs] = v->is_null ? 0 : 1;
    }
    c->ndefs++;
    if (!v->is_null) {
      if (c->spec.type == BR_PQ_BYTE_ARRAY) {
        uint8_t l4[4] = {(uint8_t)v->len, (uint8_t)(v->len >> 8), (uint8_t)(v->len >> 16),
                         (uint8_t)(v->len >> 24)};
        tc_buf_put(&c->vals, l4, 4);
      }
      tc_buf_put(&c->vals, v->data, v->len);
      if (c->vals.failed) {
        w->failed = 1;
        return br_fail(err, "out of memory");
      }
    }
    if (c->vals.len >= w->o.page_bytes || c->ndefs >= (1u << 20)) {
      if (flush_page(w, c, err)) {
        w->failed = 1;
        return -1;
      }
    }
  }
  w->rg_rows++;
  if (w->rg_rows >= w->o.row_group_rows && flush_row_group(w, err)) {
    w->failed = 1;
    return -1;
  }
  return 0;
}

int br_parquet_writer_finish(br_parquet_writer *w, br_err *err) {
  tc_buf f = {0};
  int rc = -1;
  if (w->failed) return br_fail(err, "parquet writer: unusable after an earlier error");
  if (flush_row_group(w, err)) goto out;
  int16_t last = 0;
  tc_put_i32_field(&f, &last, 1, 1);
  tc_put_field(&f, &last, 2, TC_LIST);
  tc_put_list(&f, TC_STRUCT, (uint32_t)w->ncols + 1);
  int16_t ls = 0;
  static const char root[] = "schema";
  tc_put_binary_field(&f, &ls, 4, root, sizeof root - 1);
  tc_put_i32_field(&f, &ls, 5, (int32_t)w->ncols);
  tc_put_stop(&f);
  for (size_t i = 0; i < w->ncols; i++) {
    const br_parquet_column_spec *c = &w->cols[i].spec;
    ls = 0;
    tc_put_i32_field(&f, &ls, 1, c->type);
    if (c->type == BR_PQ_FIXED_LEN_BYTE_ARRAY) tc_put_i32_field(&f, &ls, 2, c->type_length);
    tc_put_i32_field(&f, &ls, 3, c->optional ? 1 : 0);
    tc_put_binary_field(&f, &ls, 4, c->name, strlen(c->name));
    if (c->type == BR_PQ_BYTE_ARRAY && c->utf8) tc_put_i32_field(&f, &ls, 6, 0); /* UTF8 */
    if (c->type == BR_PQ_INT64 && c->timestamp_ms) {
      int16_t lt = 0, lu = 0, lm = 0;
      tc_put_i32_field(&f, &ls, 6, 9);      /* ConvertedType TIMESTAMP_MILLIS */
      tc_put_field(&f, &ls, 10, TC_STRUCT); /* LogicalType */
      tc_put_field(&f, &lt, 8, TC_STRUCT);  /* TIMESTAMP */
      tc_put_field(&f, &lu, 1, TC_TRUE);    /* isAdjustedToUTC */
      tc_put_field(&f, &lu, 2, TC_STRUCT);  /* unit: TimeUnit */
      tc_put_field(&f, &lm, 1, TC_STRUCT);  /* MILLIS */
      tc_put_stop(&f);                      /* MilliSeconds */
      tc_put_stop(&f);                      /* TimeUnit */
      tc_put_stop(&f);                      /* TimestampType */
      tc_put_stop(&f);                      /* LogicalType */
    }
    tc_put_stop(&f);
  }
  tc_put_i64_field(&f, &last, 3, w->total_rows);
  tc_put_field(&f, &last, 4, TC_LIST);
  tc_put_list(&f, TC_STRUCT, w->nrgs);
  tc_buf_put(&f, w->rgs.p, w->rgs.len);
  static const char by[] = "blobref parquet writer";
  tc_put_binary_field(&f, &last, 6, by, sizeof by - 1);
  tc_put_stop(&f);
  if (f.failed || f.len > BR_PQ_MAX_FOOTER) {
    br_fail(err, "parquet writer: footer too large or out of memory");
    goto out;
  }
  uint8_t tail[8];
  pq_file_tail((uint32_t)f.len, tail);
  if (emit(w, f.p, f.len, err) || emit(w, tail, 8, err)) goto out;
  rc = 0;
out:
  if (rc) w->failed = 1;
  free(f.p);
  return rc;
}

int br_parquet_write_stdio(void *ud, const void *buf, size_t len, br_err *err) {
  if (len && fwrite(buf, 1, len, (FILE *)ud) != len)
    return br_fail(err, "parquet writer: write failed");
  return 0;
}
