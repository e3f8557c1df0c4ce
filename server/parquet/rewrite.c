/* Parquet column replacement: one flat BYTE_ARRAY column becomes the SHA-256 of its values, every
 * other column chunk is copied byte for byte, and the footer is re-encoded around the new
 * offsets (Thrift compact, field by field: what is not rewritten is copied as it was). */
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/internal.h"

#define COPY_BUF (1u << 20)
#define PAGE_VALUE_BYTES (1u << 20) /* target uncompressed values per page of the new column */
#define ARROW_SCHEMA_KEY "ARROW:schema"

/* ---- output with a position ---- */

typedef struct sink {
  br_parquet_write_fn out;
  void *ud;
  uint64_t pos;
} sink;

static int sink_put(sink *k, const void *p, size_t len, br_err *err) {
  if (len && k->out(k->ud, p, len, err)) return -1;
  k->pos += len;
  return 0;
}

/* ---- one row group's values of the replaced column ---- */

typedef struct cell {
  uint64_t off;
  size_t len;
  int is_null;
} cell;

typedef struct rg_cells {
  tc_buf bytes; /* every value, back to back */
  cell *cells;
  size_t n, cap;
  int oom;
} rg_cells;

static int collect(void *ud, const uint8_t *data, size_t len, int is_null) {
  rg_cells *c = ud;
  if (c->n == c->cap) {
    size_t nc = c->cap ? c->cap * 2 : 4096;
    cell *p = realloc(c->cells, nc * sizeof *p);
    if (!p) {
      c->oom = 1;
      return 1;
    }
    c->cells = p;
    c->cap = nc;
  }
  c->cells[c->n].off = c->bytes.len;
  c->cells[c->n].len = len;
  c->cells[c->n].is_null = is_null;
  c->n++;
  if (!is_null) tc_buf_put(&c->bytes, data, len);
  if (c->bytes.failed) {
    c->oom = 1;
    return 1;
  }
  return 0;
}

/* ---- the new column chunk ---- */

typedef struct new_chunk {
  tc_buf bytes;
  int64_t num_values, uncompressed;
  int codec;
} new_chunk;

static int writable_codec(int codec) {
  switch (codec) {
    case BR_PQ_UNCOMPRESSED:
    case BR_PQ_SNAPPY:
    case BR_PQ_GZIP:
    case BR_PQ_BROTLI:
    case BR_PQ_ZSTD:
    case BR_PQ_LZ4_RAW:
      return codec;
    case BR_PQ_LZ4:
      return BR_PQ_LZ4_RAW;
    default:
      return BR_PQ_UNCOMPRESSED;
  }
}

static void put_le32(tc_buf *b, uint32_t v) {
  uint8_t l4[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  tc_buf_put(b, l4, 4);
}

/* Encodes rows [first, first + n) as one data page v1 appended to nc. */
static int encode_page(const br_parquet_value *vals, const uint8_t (*dg)[BR_PQ_SHA256_LEN],
                       size_t first, size_t n, int optional, int binary, new_chunk *nc,
                       uint8_t *defs, br_err *err) {
  static const char hexd[] = "0123456789abcdef";
  tc_buf body = {0};
  int rc = -1;
  if (optional) {
    tc_buf lv = {0};
    for (size_t i = 0; i < n; i++) defs[i] = vals[first + i].is_null ? 0 : 1;
    pq_rle_encode(&lv, defs, n, 1);
    put_le32(&body, (uint32_t)lv.len);
    tc_buf_put(&body, lv.p, lv.len);
    if (lv.failed) body.failed = 1;
    free(lv.p);
  }
  for (size_t i = first; i < first + n; i++) {
    if (vals[i].is_null) continue;
    if (binary) {
      tc_buf_put(&body, dg[i], BR_PQ_SHA256_LEN);
    } else {
      char hex[2 * BR_PQ_SHA256_LEN];
      for (int j = 0; j < BR_PQ_SHA256_LEN; j++) {
        hex[2 * j] = hexd[dg[i][j] >> 4];
        hex[2 * j + 1] = hexd[dg[i][j] & 15];
      }
      put_le32(&body, sizeof hex);
      tc_buf_put(&body, hex, sizeof hex);
    }
  }
  if (body.failed) {
    br_fail(err, "out of memory");
    goto out;
  }
  if (pq_put_data_page_v1(&nc->bytes, nc->codec, &body, (int32_t)n, &nc->uncompressed, err))
    goto out;
  nc->num_values += (int64_t)n;
  rc = 0;
out:
  free(body.p);
  return rc;
}

static int encode_chunk(const br_parquet_value *vals, const uint8_t (*dg)[BR_PQ_SHA256_LEN],
                        size_t n, int optional, int binary, new_chunk *nc, br_err *err) {
  size_t per_value = binary ? BR_PQ_SHA256_LEN : 4 + 2 * BR_PQ_SHA256_LEN;
  size_t per_page = PAGE_VALUE_BYTES / per_value;
  uint8_t *defs = malloc(per_page);
  int rc = 0;
  if (!defs) return br_fail(err, "out of memory");
  for (size_t first = 0; first < n && rc == 0; first += per_page) {
    size_t k = n - first < per_page ? n - first : per_page;
    rc = encode_page(vals, dg, first, k, optional, binary, nc, defs, err);
  }
  free(defs);
  return rc;
}

/* ---- footer ---- */

typedef struct layout {
  uint64_t old_start, len, new_start, new_len;
} layout;

typedef struct rewrite {
  const pq_meta *m;
  size_t col;
  uint32_t schema_idx;
  const char *name;
  int binary;
  layout *at;      /* [nrow_groups * nleaves] */
  new_chunk *newc; /* [nrow_groups]: sizes only (bytes already written) */
  uint32_t g;      /* row group being rewritten */
  tc_buf *o;
} rewrite;

/* Copies the value of a field whose header was just read, under a new header. */
static int copy_field(tc_reader *r, tc_buf *o, int16_t *olast, int16_t id, int type) {
  const uint8_t *start = r->p;
  if (tc_skip(r, type)) return -1;
  tc_put_field(o, olast, id, type);
  tc_buf_put(o, start, (size_t)(r->p - start));
  return 0;
}

static int64_t shifted(int64_t v, const layout *l) {
  if (v >= (int64_t)l->old_start && (uint64_t)v < l->old_start + l->len)
    return v + (int64_t)(l->new_start - l->old_start);
  return v;
}

static int rewrite_column_meta(tc_reader *r, tc_buf *o, const layout *l) {
  int16_t last = 0, olast = 0, id;
  for (;;) {
    int t = tc_field(r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    int64_t v;
    if (id == 9 || id == 10 || id == 11) { /* data, index and dictionary page offsets */
      if (tc_int_field(r, t, &v)) return -1;
      tc_put_i64_field(o, &olast, id, shifted(v, l));
    } else if (id == 14 || id == 15) { /* bloom filter: outside the chunk, not copied */
      if (tc_skip(r, t)) return -1;
    } else if (copy_field(r, o, &olast, id, t)) {
      return -1;
    }
  }
  tc_put_stop(o);
  return 0;
}

static int rewrite_column_chunk(tc_reader *r, tc_buf *o, const layout *l) {
  int16_t last = 0, olast = 0, id;
  for (;;) {
    int t = tc_field(r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    int64_t v;
    if (id == 2) { /* file_offset (deprecated): follows the chunk */
      if (tc_int_field(r, t, &v)) return -1;
      tc_put_i64_field(o, &olast, 2,
                       v >= (int64_t)l->old_start && (uint64_t)v <= l->old_start + l->len
                           ? v + (int64_t)(l->new_start - l->old_start)
                           : (int64_t)l->new_start);
    } else if (id == 3 && t == TC_STRUCT) {
      tc_put_field(o, &olast, 3, TC_STRUCT);
      if (rewrite_column_meta(r, o, l)) return -1;
    } else if (id >= 4 && id <= 7) { /* offset and column index: outside the chunk, dropped */
      if (tc_skip(r, t)) return -1;
    } else if (copy_field(r, o, &olast, id, t)) {
      return -1;
    }
  }
  tc_put_stop(o);
  return 0;
}

static void write_new_column_chunk(rewrite *w) {
  tc_buf *o = w->o;
  const layout *l = &w->at[(size_t)w->g * w->m->nleaves + w->col];
  const new_chunk *nc = &w->newc[w->g];
  pq_put_column_chunk(o, w->binary ? BR_PQ_FIXED_LEN_BYTE_ARRAY : BR_PQ_BYTE_ARRAY, w->name,
                      nc->codec, nc->num_values, nc->uncompressed, (int64_t)nc->bytes.len,
                      (int64_t)l->new_start);
}

static int rewrite_row_group(tc_reader *r, rewrite *w) {
  tc_buf *o = w->o;
  int16_t last = 0, olast = 0, id;
  const layout *row = &w->at[(size_t)w->g * w->m->nleaves];
  const pq_chunk *old = &w->m->chunks[(size_t)w->g * w->m->nleaves + w->col];
  uint64_t first = UINT64_MAX, total_len = 0;
  for (uint32_t c = 0; c < w->m->nleaves; c++) {
    if (row[c].new_start < first) first = row[c].new_start;
    total_len += row[c].new_len;
  }
  for (;;) {
    int t = tc_field(r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    int64_t v;
    if (id == 1 && t == TC_LIST) {
      int et;
      uint32_t n;
      if (tc_list(r, &et, &n)) return -1;
      if (et != TC_STRUCT || n != w->m->nleaves) {
        br_fail(r->err, "parquet: row group %u has %u column chunks", w->g, n);
        return -1;
      }
      tc_put_field(o, &olast, 1, TC_LIST);
      tc_put_list(o, TC_STRUCT, n);
      for (uint32_t c = 0; c < n; c++) {
        if (c == w->col) {
          if (tc_skip(r, TC_STRUCT)) return -1;
          write_new_column_chunk(w);
        } else if (rewrite_column_chunk(r, o, &row[c])) {
          return -1;
        }
      }
    } else if (id == 2) { /* total_byte_size: uncompressed */
      if (tc_int_field(r, t, &v)) return -1;
      tc_put_i64_field(o, &olast, 2, v - old->total_uncompressed_size + w->newc[w->g].uncompressed);
    } else if (id == 5) { /* file_offset */
      if (tc_int_field(r, t, &v)) return -1;
      tc_put_i64_field(o, &olast, 5, (int64_t)first);
    } else if (id == 6) { /* total_compressed_size */
      if (tc_int_field(r, t, &v)) return -1;
      tc_put_i64_field(o, &olast, 6, (int64_t)total_len);
    } else if (copy_field(r, o, &olast, id, t)) {
      return -1;
    }
  }
  tc_put_stop(o);
  return 0;
}

static int rewrite_schema_element(tc_reader *r, rewrite *w) {
  tc_buf *o = w->o;
  int16_t last = 0, olast = 0, id;
  int64_t repetition = 0, field_id = 0;
  int have_field_id = 0;
  for (;;) {
    int t = tc_field(r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    if (id == 3) {
      if (tc_int_field(r, t, &repetition)) return -1;
    } else if (id == 9) {
      if (tc_int_field(r, t, &field_id)) return -1;
      have_field_id = 1;
    } else if (tc_skip(r, t)) {
      return -1;
    }
  }
  tc_put_i32_field(o, &olast, 1, w->binary ? BR_PQ_FIXED_LEN_BYTE_ARRAY : BR_PQ_BYTE_ARRAY);
  if (w->binary) tc_put_i32_field(o, &olast, 2, BR_PQ_SHA256_LEN);
  tc_put_i32_field(o, &olast, 3, (int32_t)repetition);
  tc_put_binary_field(o, &olast, 4, w->name, strlen(w->name));
  if (!w->binary) tc_put_i32_field(o, &olast, 6, 0); /* ConvertedType UTF8 */
  if (have_field_id) tc_put_i32_field(o, &olast, 9, (int32_t)field_id);
  if (!w->binary) { /* LogicalType STRING */
    int16_t ll = 0;
    tc_put_field(o, &olast, 10, TC_STRUCT);
    tc_put_field(o, &ll, 1, TC_STRUCT);
    tc_put_stop(o);
    tc_put_stop(o);
  }
  tc_put_stop(o);
  return 0;
}

/* Key/value metadata without the ARROW:schema entry. */
static int rewrite_kv(tc_reader *r, tc_buf *o, int16_t *olast) {
  int et;
  uint32_t n, kept = 0;
  tc_buf items = {0};
  if (tc_list(r, &et, &n)) return -1;
  for (uint32_t i = 0; i < n; i++) {
    const uint8_t *start = r->p, *key = NULL;
    size_t klen = 0;
    int16_t last = 0, id;
    if (et != TC_STRUCT) {
      if (tc_skip(r, et)) goto fail;
      tc_buf_put(&items, start, (size_t)(r->p - start));
      kept++;
      continue;
    }
    for (;;) {
      int t = tc_field(r, &last, &id);
      if (t < 0) goto fail;
      if (t == TC_STOP) break;
      if (id == 1 && t == TC_BINARY) {
        if (tc_binary(r, &key, &klen)) goto fail;
      } else if (tc_skip(r, t)) {
        goto fail;
      }
    }
    if (key && klen == strlen(ARROW_SCHEMA_KEY) && !memcmp(key, ARROW_SCHEMA_KEY, klen)) continue;
    tc_buf_put(&items, start, (size_t)(r->p - start));
    kept++;
  }
  tc_put_field(o, olast, 5, TC_LIST);
  tc_put_list(o, et, kept);
  tc_buf_put(o, items.p, items.len);
  free(items.p);
  return 0;
fail:
  free(items.p);
  return -1;
}

static int rewrite_footer(const uint8_t *buf, size_t len, rewrite *w, br_err *err) {
  tc_reader r = {buf, buf + len, 0, 0, err};
  tc_buf *o = w->o;
  int16_t last = 0, olast = 0, id;
  for (;;) {
    int t = tc_field(&r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    int et;
    uint32_t n;
    if (id == 2 && t == TC_LIST) {
      if (tc_list(&r, &et, &n)) return -1;
      tc_put_field(o, &olast, 2, TC_LIST);
      tc_put_list(o, et, n);
      for (uint32_t i = 0; i < n; i++) {
        const uint8_t *start = r.p;
        if (i == w->schema_idx && et == TC_STRUCT) {
          if (rewrite_schema_element(&r, w)) return -1;
        } else {
          if (tc_skip(&r, et)) return -1;
          tc_buf_put(o, start, (size_t)(r.p - start));
        }
      }
    } else if (id == 4 && t == TC_LIST) {
      if (tc_list(&r, &et, &n)) return -1;
      if (et != TC_STRUCT || n != w->m->nrow_groups)
        return br_fail(err, "parquet: row groups changed between two reads of the footer");
      tc_put_field(o, &olast, 4, TC_LIST);
      tc_put_list(o, TC_STRUCT, n);
      for (w->g = 0; w->g < n; w->g++)
        if (rewrite_row_group(&r, w)) return -1;
    } else if (id == 5 && t == TC_LIST) {
      if (rewrite_kv(&r, o, &olast)) return -1;
    } else if (copy_field(&r, o, &olast, id, t)) {
      return -1;
    }
  }
  tc_put_stop(o);
  if (o->failed) return br_fail(err, "out of memory");
  return 0;
}

/* The schema element of leaf `col` when it is a direct child of the root, else 0. */
static uint32_t skip_subtree(const pq_meta *m, uint32_t i, size_t *leaves) {
  const pq_schema_el *el = &m->schema[i++];
  if (el->num_children == 0 && el->type >= 0) {
    (*leaves)++;
    return i;
  }
  for (int32_t c = 0; c < el->num_children && i < m->nschema; c++) i = skip_subtree(m, i, leaves);
  return i;
}

static uint32_t top_level_element(const pq_meta *m, size_t col) {
  uint32_t i = 1;
  size_t leaves = 0;
  for (int32_t c = 0; c < m->schema[0].num_children && i < m->nschema; c++) {
    const pq_schema_el *el = &m->schema[i];
    if (el->num_children == 0 && el->type >= 0 && leaves == col) return i;
    i = skip_subtree(m, i, &leaves);
  }
  return 0;
}

static int copy_bytes(br_source *src, uint64_t off, uint64_t len, uint8_t *buf, sink *k,
                      br_err *err) {
  while (len) {
    size_t n = len < COPY_BUF ? (size_t)len : COPY_BUF;
    if (src->pread(src, buf, n, off, err) || sink_put(k, buf, n, err)) return -1;
    off += n;
    len -= n;
  }
  return 0;
}

int br_parquet_replace_column(br_parquet_file *f, const br_parquet_replace_options *o,
                              br_parquet_write_fn out, void *out_ud, br_err *err) {
  const pq_meta *m = &f->m;
  sink k = {out, out_ud, 0};
  rg_cells cells = {0};
  pq_scratch s;
  br_parquet_value *vals = NULL;
  uint8_t(*dg)[BR_PQ_SHA256_LEN] = NULL;
  uint8_t *copybuf = NULL, *footer = NULL;
  layout *at = NULL;
  new_chunk *newc = NULL;
  tc_buf fo = {0};
  int rc = -1;
  memset(&s, 0, sizeof s);
  if (o->column >= m->nleaves) return br_fail(err, "parquet: no column %zu", o->column);
  const pq_leaf *leaf = &m->leaves[o->column];
  uint32_t schema_idx = top_level_element(m, o->column);
  if (leaf->type != BR_PQ_BYTE_ARRAY)
    return br_fail(err, "parquet: column %s is not BYTE_ARRAY (physical type %d)", leaf->path,
                   leaf->type);
  if (!schema_idx || leaf->max_rep || leaf->max_def > 1)
    return br_fail(err,
                   "parquet: column %s is nested or repeated: only top-level columns can be "
                   "replaced",
                   leaf->path);
  const char *name = o->new_name && *o->new_name ? o->new_name : m->schema[schema_idx].name;
  for (uint32_t c = 0; c < m->nleaves; c++)
    if (c != o->column && !strcmp(m->leaves[c].path, name))
      return br_fail(err, "parquet: the file already has a column named %s", name);
  uint64_t flen = f->src->size - 8 - f->data_end;
  at = calloc((size_t)m->nrow_groups * m->nleaves + 1, sizeof *at);
  newc = calloc((size_t)m->nrow_groups + 1, sizeof *newc);
  copybuf = malloc(COPY_BUF);
  footer = malloc(flen ? flen : 1);
  if (!at || !newc || !copybuf || !footer) {
    br_fail(err, "out of memory");
    goto out;
  }
  if (sink_put(&k, "PAR1", 4, err)) goto out;
  int64_t first_row = 0;
  for (uint32_t g = 0; g < m->nrow_groups; g++) {
    /* the replaced column: values, digests, the caller's turn, the new chunk */
    cells.n = 0;
    cells.bytes.len = 0;
    int r = pq_read_chunk(f, g, o->column, &s, collect, &cells, err);
    if (cells.oom) {
      br_fail(err, "out of memory reading row group %u of %s", g, leaf->path);
      goto out;
    }
    if (r) goto out;
    if ((int64_t)cells.n != m->rg_rows[g]) {
      br_fail(err, "parquet: column %s: row group %u has %lld rows, the column %zu", leaf->path, g,
              (long long)m->rg_rows[g], cells.n);
      goto out;
    }
    free(vals);
    free(dg);
    vals = malloc((cells.n ? cells.n : 1) * sizeof *vals);
    dg = calloc(cells.n ? cells.n : 1, sizeof *dg);
    if (!vals || !dg) {
      br_fail(err, "out of memory");
      goto out;
    }
    for (size_t i = 0; i < cells.n; i++) {
      static const uint8_t empty[1];
      if (cells.cells[i].is_null)
        vals[i].data = NULL;
      else /* only empty values so far: no bytes buffer yet */
        vals[i].data = cells.bytes.p ? cells.bytes.p + cells.cells[i].off : empty;
      vals[i].len = cells.cells[i].len;
      vals[i].is_null = cells.cells[i].is_null;
      if (!vals[i].is_null && !EVP_Digest(vals[i].data ? (const void *)vals[i].data : "",
                                          vals[i].len, dg[i], NULL, EVP_sha256(), NULL)) {
        br_fail(err, "SHA-256 failed");
        goto out;
      }
    }
    br_parquet_rg_values rgv = {g, first_row, cells.n, vals,
                                (const uint8_t(*)[BR_PQ_SHA256_LEN])dg};
    r = o->fn ? o->fn(o->ud, &rgv, err) : 0;
    if (r) {
      rc = r;
      goto out;
    }
    const pq_chunk *och = &m->chunks[(size_t)g * m->nleaves + o->column];
    newc[g].codec = writable_codec(och->codec);
    if (encode_chunk(vals, (const uint8_t(*)[BR_PQ_SHA256_LEN])dg, cells.n, leaf->max_def == 1,
                     o->binary, &newc[g], err))
      goto out;
    first_row += m->rg_rows[g];
    /* every chunk in the order of the schema */
    for (uint32_t c = 0; c < m->nleaves; c++) {
      layout *l = &at[(size_t)g * m->nleaves + c];
      l->new_start = k.pos;
      if (c == o->column) {
        l->new_len = newc[g].bytes.len;
        if (sink_put(&k, newc[g].bytes.p, newc[g].bytes.len, err)) goto out;
        free(newc[g].bytes.p);
        memset(&newc[g].bytes, 0, sizeof newc[g].bytes); /* cap 0: freed */
        newc[g].bytes.len = (size_t)l->new_len;          /* the size stays for the footer */
        continue;
      }
      if (m->chunks[(size_t)g * m->nleaves + c].num_values == 0 &&
          m->chunks[(size_t)g * m->nleaves + c].total_compressed_size == 0) {
        l->old_start = l->len = 0;
      } else if (pq_chunk_range(f, g, c, &l->old_start, &l->len, err)) {
        goto out;
      }
      l->new_len = l->len;
      if (copy_bytes(f->src, l->old_start, l->len, copybuf, &k, err)) goto out;
    }
  }
  /* the footer, re-encoded */
  if (f->src->pread(f->src, footer, (size_t)flen, f->data_end, err)) goto out;
  rewrite w = {m, o->column, schema_idx, name, o->binary, at, newc, 0, &fo};
  if (rewrite_footer(footer, (size_t)flen, &w, err)) goto out;
  if (fo.len > BR_PQ_MAX_FOOTER) {
    br_fail(err, "parquet: the new footer is over %u bytes", BR_PQ_MAX_FOOTER);
    goto out;
  }
  uint8_t tail[8];
  pq_file_tail((uint32_t)fo.len, tail);
  if (sink_put(&k, fo.p, fo.len, err) || sink_put(&k, tail, 8, err)) goto out;
  rc = 0;
out:
  free(cells.bytes.p);
  free(cells.cells);
  pq_scratch_free(&s);
  free(vals);
  free(dg);
  free(copybuf);
  free(footer);
  free(at);
  for (uint32_t g = 0; newc && g < m->nrow_groups; g++)
    if (newc[g].bytes.cap) free(newc[g].bytes.p);
  free(newc);
  free(fo.p);
  return rc;
}
