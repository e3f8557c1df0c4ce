/* Thrift compact protocol reader/writer and the Parquet footer and page-header decoders. */
#include <stdlib.h>
#include <string.h>

#include "parquet/internal.h"

/* ---- reader ---- */

static int tc_error(tc_reader *r, const char *what) {
  if (!r->failed) br_fail(r->err, "parquet: bad thrift data: %s", what);
  r->failed = 1;
  return -1;
}

int tc_varint(tc_reader *r, uint64_t *v) {
  uint64_t out = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (r->p >= r->end) return tc_error(r, "truncated varint");
    uint8_t b = *r->p++;
    if (shift == 63 && (b & 0x7e)) return tc_error(r, "varint overflows 64 bits");
    out |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = out;
      return 0;
    }
  }
  return tc_error(r, "varint longer than 10 bytes");
}

int tc_i64(tc_reader *r, int64_t *v) {
  uint64_t u;
  if (tc_varint(r, &u)) return -1;
  *v = (int64_t)((u >> 1) ^ (~(u & 1) + 1));
  return 0;
}

int tc_i32(tc_reader *r, int32_t *v) {
  int64_t x;
  if (tc_i64(r, &x)) return -1;
  if (x < INT32_MIN || x > INT32_MAX) return tc_error(r, "i32 out of range");
  *v = (int32_t)x;
  return 0;
}

int tc_binary(tc_reader *r, const uint8_t **p, size_t *len) {
  uint64_t n;
  if (tc_varint(r, &n)) return -1;
  if (n > (uint64_t)(r->end - r->p)) return tc_error(r, "binary past the end");
  *p = r->p;
  *len = (size_t)n;
  r->p += n;
  return 0;
}

int tc_field(tc_reader *r, int16_t *last, int16_t *id) {
  if (r->p >= r->end) return tc_error(r, "truncated struct");
  uint8_t b = *r->p++;
  if (b == 0) return TC_STOP;
  int type = b & 0x0f;
  int delta = b >> 4;
  if (type > TC_STRUCT) return tc_error(r, "unknown field type");
  if (delta) {
    *id = (int16_t)(*last + delta);
  } else {
    int64_t x;
    if (tc_i64(r, &x)) return -1;
    if (x < INT16_MIN || x > INT16_MAX) return tc_error(r, "field id out of range");
    *id = (int16_t)x;
  }
  *last = *id;
  return type;
}

int tc_list(tc_reader *r, int *elem_type, uint32_t *count) {
  if (r->p >= r->end) return tc_error(r, "truncated list");
  uint8_t b = *r->p++;
  uint64_t n = b >> 4;
  *elem_type = b & 0x0f;
  if (n == 15 && tc_varint(r, &n)) return -1;
  /* every element takes at least one byte */
  if (n > (uint64_t)(r->end - r->p)) return tc_error(r, "list longer than its data");
  if (*elem_type == TC_STOP || *elem_type > TC_STRUCT) return tc_error(r, "bad list element type");
  *count = (uint32_t)n;
  return 0;
}

static int skip_value(tc_reader *r, int type, int in_collection) {
  uint64_t u;
  const uint8_t *p;
  size_t len;
  int rc = 0;
  if (++r->depth > TC_MAX_DEPTH) return tc_error(r, "nesting too deep");
  switch (type) {
    case TC_TRUE:
    case TC_FALSE:
      if (in_collection) {
        if (r->p >= r->end)
          rc = tc_error(r, "truncated bool");
        else
          r->p++;
      }
      break;
    case TC_BYTE:
      if (r->p >= r->end)
        rc = tc_error(r, "truncated byte");
      else
        r->p++;
      break;
    case TC_I16:
    case TC_I32:
    case TC_I64:
      rc = tc_varint(r, &u);
      break;
    case TC_DOUBLE:
      if (r->end - r->p < 8)
        rc = tc_error(r, "truncated double");
      else
        r->p += 8;
      break;
    case TC_BINARY:
      rc = tc_binary(r, &p, &len);
      break;
    case TC_LIST:
    case TC_SET: {
      int et;
      uint32_t n;
      rc = tc_list(r, &et, &n);
      for (uint32_t i = 0; rc == 0 && i < n; i++) rc = skip_value(r, et, 1);
      break;
    }
    case TC_MAP: {
      rc = tc_varint(r, &u);
      if (rc == 0 && u > 0) {
        if (u > (uint64_t)(r->end - r->p)) {
          rc = tc_error(r, "map longer than its data");
          break;
        }
        if (r->p >= r->end) {
          rc = tc_error(r, "truncated map");
          break;
        }
        uint8_t kv = *r->p++;
        int kt = kv >> 4, vt = kv & 0x0f;
        if (kt == TC_STOP || kt > TC_STRUCT || vt == TC_STOP || vt > TC_STRUCT) {
          rc = tc_error(r, "bad map types");
          break;
        }
        for (uint64_t i = 0; rc == 0 && i < u; i++) {
          rc = skip_value(r, kt, 1);
          if (rc == 0) rc = skip_value(r, vt, 1);
        }
      }
      break;
    }
    case TC_STRUCT: {
      int16_t last = 0, id;
      for (;;) {
        int t = tc_field(r, &last, &id);
        if (t <= 0) {
          rc = t;
          break;
        }
        rc = skip_value(r, t, 0);
        if (rc) break;
      }
      break;
    }
    default:
      rc = tc_error(r, "unknown type");
  }
  r->depth--;
  return rc;
}

int tc_skip(tc_reader *r, int type) { return skip_value(r, type, 0); }

int tc_int_field(tc_reader *r, int type, int64_t *v) {
  switch (type) {
    case TC_TRUE:
      *v = 1;
      return 0;
    case TC_FALSE:
      *v = 0;
      return 0;
    case TC_BYTE:
      if (r->p >= r->end) return tc_error(r, "truncated byte");
      *v = (int8_t)*r->p++;
      return 0;
    case TC_I16:
    case TC_I32:
    case TC_I64:
      return tc_i64(r, v);
    default:
      return tc_error(r, "field has the wrong type");
  }
}

/* Reads an integer field that must fit int32. */
static int int32_field(tc_reader *r, int type, int32_t *v) {
  int64_t x;
  if (tc_int_field(r, type, &x)) return -1;
  if (x < INT32_MIN || x > INT32_MAX) return tc_error(r, "i32 field out of range");
  *v = (int32_t)x;
  return 0;
}

/* ---- writer ---- */

void tc_buf_put(tc_buf *b, const void *data, size_t len) {
  if (b->failed) return;
  if (len > b->cap - b->len) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < len) {
      if (cap > SIZE_MAX / 2) {
        b->failed = 1;
        return;
      }
      cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->failed = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  if (len) memcpy(b->p + b->len, data, len);
  b->len += len;
}

void tc_put_varint(tc_buf *b, uint64_t v) {
  uint8_t tmp[10];
  size_t n = 0;
  while (v >= 0x80) {
    tmp[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  tmp[n++] = (uint8_t)v;
  tc_buf_put(b, tmp, n);
}

void tc_put_zigzag(tc_buf *b, int64_t v) {
  tc_put_varint(b, ((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

void tc_put_field(tc_buf *b, int16_t *last, int16_t id, int type) {
  int delta = id - *last;
  if (delta > 0 && delta <= 15) {
    uint8_t h = (uint8_t)(delta << 4 | type);
    tc_buf_put(b, &h, 1);
  } else {
    uint8_t h = (uint8_t)type;
    tc_buf_put(b, &h, 1);
    tc_put_zigzag(b, id);
  }
  *last = id;
}

void tc_put_i64_field(tc_buf *b, int16_t *last, int16_t id, int64_t v) {
  tc_put_field(b, last, id, TC_I64);
  tc_put_zigzag(b, v);
}

void tc_put_i32_field(tc_buf *b, int16_t *last, int16_t id, int32_t v) {
  tc_put_field(b, last, id, TC_I32);
  tc_put_zigzag(b, v);
}

void tc_put_binary_field(tc_buf *b, int16_t *last, int16_t id, const void *p, size_t len) {
  tc_put_field(b, last, id, TC_BINARY);
  tc_put_varint(b, len);
  tc_buf_put(b, p, len);
}

void tc_put_list(tc_buf *b, int elem_type, uint32_t count) {
  if (count < 15) {
    uint8_t h = (uint8_t)(count << 4 | (uint32_t)elem_type);
    tc_buf_put(b, &h, 1);
  } else {
    uint8_t h = (uint8_t)(0xf0 | elem_type);
    tc_buf_put(b, &h, 1);
    tc_put_varint(b, count);
  }
}

void tc_put_stop(tc_buf *b) {
  uint8_t z = 0;
  tc_buf_put(b, &z, 1);
}

/* ---- footer ---- */

#define MAX_SCHEMA 100000
#define MAX_CHUNKS (4u << 20)
#define MAX_LEVEL 100
#define MAX_TYPE_LENGTH (1 << 20)

static int decode_schema_el(tc_reader *r, pq_schema_el *el) {
  int16_t last = 0, id;
  const uint8_t *name = NULL;
  size_t name_len = 0;
  int have_name = 0;
  el->type = -1;
  el->type_length = 0;
  el->repetition = -1;
  el->num_children = 0;
  el->converted_type = -1;
  if (++r->depth > TC_MAX_DEPTH) return tc_error(r, "nesting too deep");
  for (;;) {
    int t = tc_field(r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    int rc;
    if (id == 1)
      rc = int32_field(r, t, &el->type);
    else if (id == 2)
      rc = int32_field(r, t, &el->type_length);
    else if (id == 3)
      rc = int32_field(r, t, &el->repetition);
    else if (id == 4 && t == TC_BINARY)
      rc = tc_binary(r, &name, &name_len), have_name = 1;
    else if (id == 5)
      rc = int32_field(r, t, &el->num_children);
    else if (id == 6)
      rc = int32_field(r, t, &el->converted_type);
    else
      rc = tc_skip(r, t);
    if (rc) return -1;
  }
  r->depth--;
  if (!have_name) return tc_error(r, "schema element without a name");
  if (el->type < -1 || el->type > BR_PQ_FIXED_LEN_BYTE_ARRAY)
    return tc_error(r, "schema element with an unknown physical type");
  el->name = malloc(name_len + 1);
  if (!el->name) return tc_error(r, "out of memory");
  memcpy(el->name, name, name_len);
  el->name[name_len] = 0;
  return 0;
}

static int decode_column_meta(tc_reader *r, pq_chunk *c) {
  int16_t last = 0, id;
  int seen = 0;
  if (++r->depth > TC_MAX_DEPTH) return tc_error(r, "nesting too deep");
  for (;;) {
    int t = tc_field(r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    int rc;
    int64_t v = 0;
    if (id == 1)
      rc = int32_field(r, t, &c->type), seen |= 1;
    else if (id == 4)
      rc = int32_field(r, t, &c->codec), seen |= 2;
    else if (id == 5)
      rc = tc_int_field(r, t, &c->num_values), seen |= 4;
    else if (id == 6)
      rc = tc_int_field(r, t, &c->total_uncompressed_size);
    else if (id == 7)
      rc = tc_int_field(r, t, &c->total_compressed_size), seen |= 8;
    else if (id == 9)
      rc = tc_int_field(r, t, &c->data_page_offset), seen |= 16;
    else if (id == 11)
      rc = tc_int_field(r, t, &v), c->dictionary_page_offset = v;
    else
      rc = tc_skip(r, t);
    if (rc) return -1;
  }
  r->depth--;
  if (seen != 31) return tc_error(r, "column metadata lacks a required field");
  if (c->num_values < 0 || c->total_compressed_size < 0 || c->data_page_offset < 0 ||
      c->dictionary_page_offset < -1)
    return tc_error(r, "negative size or offset in column metadata");
  return 0;
}

static int decode_column_chunk(tc_reader *r, pq_chunk *c) {
  int16_t last = 0, id;
  int have_meta = 0;
  c->dictionary_page_offset = -1;
  if (++r->depth > TC_MAX_DEPTH) return tc_error(r, "nesting too deep");
  for (;;) {
    int t = tc_field(r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    int rc;
    if (id == 1)
      rc = tc_error(r, "column chunk in another file (file_path) is not supported");
    else if (id == 3 && t == TC_STRUCT)
      rc = decode_column_meta(r, c), have_meta = 1;
    else if (id == 8 || id == 9)
      rc = tc_error(r, "encrypted column chunks are not supported");
    else
      rc = tc_skip(r, t);
    if (rc) return -1;
  }
  r->depth--;
  if (!have_meta) return tc_error(r, "column chunk without metadata");
  return 0;
}

/* Row-group columns are appended to m->chunks; *ncols gets their count. */
static int decode_row_group(tc_reader *r, pq_meta *m, size_t *nchunks, size_t *cap, uint32_t *ncols,
                            int64_t *rows) {
  int16_t last = 0, id;
  int have_rows = 0, have_cols = 0;
  if (++r->depth > TC_MAX_DEPTH) return tc_error(r, "nesting too deep");
  for (;;) {
    int t = tc_field(r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    int rc = 0;
    if (id == 1 && t == TC_LIST && !have_cols) {
      int et;
      uint32_t n;
      have_cols = 1;
      if (tc_list(r, &et, &n)) return -1;
      if (et != TC_STRUCT) return tc_error(r, "row group columns are not structs");
      if (n > (size_t)(r->end - r->p) / 16 || *nchunks + n > MAX_CHUNKS)
        return tc_error(r, "too many column chunks");
      if (*nchunks + n > *cap) {
        size_t nc = (*nchunks + n) * 2;
        pq_chunk *p = realloc(m->chunks, nc * sizeof *p);
        if (!p) return tc_error(r, "out of memory");
        m->chunks = p;
        *cap = nc;
      }
      for (uint32_t i = 0; i < n; i++) {
        pq_chunk *c = &m->chunks[*nchunks];
        memset(c, 0, sizeof *c);
        if (decode_column_chunk(r, c)) return -1;
        (*nchunks)++;
      }
      *ncols = n;
    } else if (id == 3) {
      rc = tc_int_field(r, t, rows);
      have_rows = 1;
    } else {
      rc = tc_skip(r, t);
    }
    if (rc) return -1;
  }
  r->depth--;
  if (!have_rows || !have_cols) return tc_error(r, "row group lacks num_rows or columns");
  if (*rows < 0) return tc_error(r, "negative row count");
  return 0;
}

/* Walks the schema tree from element *idx, collecting leaves. */
static int walk_schema(pq_meta *m, uint32_t *idx, const char *prefix, int def, int rep, int depth,
                       br_err *err) {
  if (depth > MAX_LEVEL) return br_fail(err, "parquet: schema nested too deeply");
  /* num_children was checked against what is left, but earlier siblings' subtrees may have used
   * it up */
  if (*idx >= m->nschema) return br_fail(err, "parquet: schema has fewer elements than it says");
  pq_schema_el *el = &m->schema[*idx];
  (*idx)++;
  size_t plen = prefix ? strlen(prefix) : 0;
  char *path = NULL;
  int rc = -1;
  if (depth > 0) {
    if (el->repetition == 1)
      def++;
    else if (el->repetition == 2)
      def++, rep++;
    else if (el->repetition != 0)
      return br_fail(err, "parquet: bad repetition type %d", el->repetition);
    size_t nlen = strlen(el->name);
    path = malloc(plen + nlen + 2);
    if (!path) return br_fail(err, "out of memory");
    if (plen) {
      memcpy(path, prefix, plen);
      path[plen] = '.';
      memcpy(path + plen + 1, el->name, nlen + 1);
    } else {
      memcpy(path, el->name, nlen + 1);
    }
  }
  if (el->num_children < 0) {
    br_fail(err, "parquet: negative num_children");
    goto out;
  }
  if (el->num_children > 0 || (depth == 0) || el->type < 0) {
    if (el->num_children > 0 && el->type >= 0 && depth > 0) {
      br_fail(err, "parquet: schema element %s has both a type and children", path);
      goto out;
    }
    if ((uint32_t)el->num_children > m->nschema - *idx) {
      br_fail(err, "parquet: schema has fewer elements than num_children says");
      goto out;
    }
    for (int32_t i = 0; i < el->num_children; i++)
      if (walk_schema(m, idx, path, def, rep, depth + 1, err)) goto out;
    rc = 0;
    goto out;
  }
  if (el->type > BR_PQ_FIXED_LEN_BYTE_ARRAY) {
    br_fail(err, "parquet: column %s has unknown physical type %d", path, el->type);
    goto out;
  }
  if (el->type == BR_PQ_FIXED_LEN_BYTE_ARRAY &&
      (el->type_length <= 0 || el->type_length > MAX_TYPE_LENGTH)) {
    br_fail(err, "parquet: column %s has bad type_length %d", path, el->type_length);
    goto out;
  }
  pq_leaf *l = &m->leaves[m->nleaves++];
  l->path = path;
  path = NULL;
  l->type = el->type;
  l->type_length = el->type == BR_PQ_FIXED_LEN_BYTE_ARRAY ? el->type_length : 0;
  l->converted_type = el->converted_type;
  l->max_def = def;
  l->max_rep = rep;
  rc = 0;
out:
  free(path);
  return rc;
}

int pq_meta_decode(const uint8_t *buf, size_t len, pq_meta *m, br_err *err) {
  tc_reader r = {buf, buf + len, 0, 0, err};
  int16_t last = 0, id;
  size_t nchunks = 0, cap = 0, rg_cap = 0;
  uint32_t *rg_cols = NULL;
  int have_schema = 0, have_rgs = 0, have_rows = 0;
  int rc = -1;
  memset(m, 0, sizeof *m);
  for (;;) {
    int t = tc_field(&r, &last, &id);
    if (t < 0) goto out;
    if (t == TC_STOP) break;
    if (id == 2 && t == TC_LIST && !have_schema) {
      int et;
      uint32_t n;
      have_schema = 1;
      if (tc_list(&r, &et, &n)) goto out;
      if (et != TC_STRUCT || n == 0 || n > MAX_SCHEMA || n > (size_t)(r.end - r.p) / 2) {
        br_fail(err, "parquet: bad schema list");
        goto out;
      }
      m->schema = calloc(n, sizeof *m->schema);
      if (!m->schema) {
        br_fail(err, "out of memory");
        goto out;
      }
      for (uint32_t i = 0; i < n; i++) {
        if (decode_schema_el(&r, &m->schema[i])) goto out;
        m->nschema++;
      }
    } else if (id == 3) {
      if (tc_int_field(&r, t, &m->num_rows)) goto out;
      have_rows = 1;
    } else if (id == 4 && t == TC_LIST && !have_rgs) {
      int et;
      uint32_t n;
      have_rgs = 1;
      if (tc_list(&r, &et, &n)) goto out;
      if (et != TC_STRUCT) {
        br_fail(err, "parquet: row groups are not structs");
        goto out;
      }
      rg_cap = n;
      m->rg_rows = calloc(n ? n : 1, sizeof *m->rg_rows);
      rg_cols = calloc(n ? n : 1, sizeof *rg_cols);
      if (!m->rg_rows || !rg_cols) {
        br_fail(err, "out of memory");
        goto out;
      }
      for (uint32_t i = 0; i < n; i++) {
        if (decode_row_group(&r, m, &nchunks, &cap, &rg_cols[i], &m->rg_rows[i])) goto out;
        m->nrow_groups++;
      }
    } else {
      if (tc_skip(&r, t)) goto out;
    }
  }
  if (!have_schema || !have_rgs || !have_rows) {
    br_fail(err, "parquet: footer lacks schema, row groups or num_rows");
    goto out;
  }
  m->leaves = calloc(m->nschema, sizeof *m->leaves);
  if (!m->leaves) {
    br_fail(err, "out of memory");
    goto out;
  }
  uint32_t idx = 0;
  if (walk_schema(m, &idx, NULL, 0, 0, 0, err)) goto out;
  if (idx != m->nschema) {
    br_fail(err, "parquet: schema has %u elements but the tree uses %u", m->nschema, idx);
    goto out;
  }
  int64_t total = 0;
  for (uint32_t g = 0; g < m->nrow_groups; g++) {
    if (rg_cols[g] != m->nleaves) {
      br_fail(err, "parquet: row group %u has %u columns, schema has %u leaves", g, rg_cols[g],
              m->nleaves);
      goto out;
    }
    for (uint32_t c = 0; c < m->nleaves; c++) {
      const pq_chunk *ch = &m->chunks[(size_t)g * m->nleaves + c];
      if (ch->type != m->leaves[c].type) {
        br_fail(err, "parquet: column %s: chunk type %d differs from schema type %d",
                m->leaves[c].path, ch->type, m->leaves[c].type);
        goto out;
      }
    }
    if (m->rg_rows[g] > INT64_MAX - total) {
      br_fail(err, "parquet: row count overflows");
      goto out;
    }
    total += m->rg_rows[g];
  }
  if (m->num_rows < 0) {
    br_fail(err, "parquet: negative num_rows");
    goto out;
  }
  (void)rg_cap;
  rc = 0;
out:
  free(rg_cols);
  if (rc) pq_meta_free(m);
  return rc;
}

void pq_meta_free(pq_meta *m) {
  for (uint32_t i = 0; i < m->nschema; i++) free(m->schema[i].name);
  for (uint32_t i = 0; i < m->nleaves; i++) free(m->leaves[i].path);
  free(m->schema);
  free(m->leaves);
  free(m->rg_rows);
  free(m->chunks);
  memset(m, 0, sizeof *m);
}

/* ---- page header ---- */

static int decode_data_header(tc_reader *r, pq_page_header *h, int v2) {
  int16_t last = 0, id;
  if (++r->depth > TC_MAX_DEPTH) return tc_error(r, "nesting too deep");
  for (;;) {
    int t = tc_field(r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    int rc;
    if (id == 1)
      rc = int32_field(r, t, &h->num_values);
    else if (!v2 && id == 2)
      rc = int32_field(r, t, &h->encoding);
    else if (!v2 && id == 3)
      rc = int32_field(r, t, &h->def_encoding);
    else if (!v2 && id == 4)
      rc = int32_field(r, t, &h->rep_encoding);
    else if (v2 && id == 2)
      rc = int32_field(r, t, &h->num_nulls);
    else if (v2 && id == 3)
      rc = int32_field(r, t, &h->num_rows);
    else if (v2 && id == 4)
      rc = int32_field(r, t, &h->encoding);
    else if (v2 && id == 5)
      rc = int32_field(r, t, &h->def_len);
    else if (v2 && id == 6)
      rc = int32_field(r, t, &h->rep_len);
    else if (v2 && id == 7) {
      int64_t b;
      rc = tc_int_field(r, t, &b);
      h->is_compressed = b != 0;
    } else
      rc = tc_skip(r, t);
    if (rc) return -1;
  }
  r->depth--;
  return 0;
}

int pq_page_header_decode(const uint8_t *buf, size_t len, pq_page_header *h, size_t *used,
                          br_err *err) {
  tc_reader r = {buf, buf + len, 0, 0, err};
  int16_t last = 0, id;
  int seen = 0;
  memset(h, 0, sizeof *h);
  h->type = -1;
  h->encoding = -1;
  h->def_encoding = 3; /* RLE */
  h->rep_encoding = 3;
  h->is_compressed = 1;
  for (;;) {
    int t = tc_field(&r, &last, &id);
    if (t < 0) return -1;
    if (t == TC_STOP) break;
    int rc;
    if (id == 1)
      rc = int32_field(&r, t, &h->type), seen |= 1;
    else if (id == 2)
      rc = int32_field(&r, t, &h->uncompressed_size), seen |= 2;
    else if (id == 3)
      rc = int32_field(&r, t, &h->compressed_size), seen |= 4;
    else if (id == 5 && t == TC_STRUCT)
      rc = decode_data_header(&r, h, 0), h->has_data = 1;
    else if (id == 7 && t == TC_STRUCT)
      rc = decode_data_header(&r, h, 0), h->has_dict = 1;
    else if (id == 8 && t == TC_STRUCT)
      rc = decode_data_header(&r, h, 1), h->has_v2 = 1;
    else
      rc = tc_skip(&r, t);
    if (rc) return -1;
  }
  if (seen != 7) return br_fail(err, "parquet: page header lacks type or sizes");
  if (h->uncompressed_size < 0 || h->compressed_size < 0 || h->num_values < 0 || h->num_nulls < 0 ||
      h->def_len < 0 || h->rep_len < 0 || h->num_rows < 0)
    return br_fail(err, "parquet: negative size or count in page header");
  *used = (size_t)(r.p - buf);
  return 0;
}
