/* Parquet column reader: footer, column chunks, pages v1/v2, levels and value encodings. */
#include <stdlib.h>
#include <string.h>

#include "parquet/internal.h"

enum {
  ENC_PLAIN = 0,
  ENC_PLAIN_DICTIONARY = 2,
  ENC_RLE = 3,
  ENC_BIT_PACKED = 4,
  ENC_DELTA_BINARY_PACKED = 5,
  ENC_DELTA_LENGTH_BYTE_ARRAY = 6,
  ENC_DELTA_BYTE_ARRAY = 7,
  ENC_RLE_DICTIONARY = 8,
  ENC_BYTE_STREAM_SPLIT = 9,
};

enum { PAGE_DATA = 0, PAGE_INDEX = 1, PAGE_DICT = 2, PAGE_DATA_V2 = 3 };

#define BATCH 1024

static int grow(uint8_t **buf, size_t *cap, size_t need, br_err *err) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : 4096;
  while (nc < need) nc = nc > SIZE_MAX / 2 ? need : nc * 2;
  uint8_t *p = realloc(*buf, nc);
  if (!p) return br_fail(err, "parquet: out of memory (%zu bytes)", need);
  *buf = p;
  *cap = nc;
  return 0;
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int bit_width(int max) {
  int w = 0;
  while (max >> w) w++;
  return w;
}

/* Byte width of a fixed-size physical type, 0 for BYTE_ARRAY / BOOLEAN. */
static int32_t fixed_width(const pq_leaf *col) {
  switch (col->type) {
    case BR_PQ_INT32:
    case BR_PQ_FLOAT:
      return 4;
    case BR_PQ_INT64:
    case BR_PQ_DOUBLE:
      return 8;
    case BR_PQ_INT96:
      return 12;
    case BR_PQ_FIXED_LEN_BYTE_ARRAY:
      return col->type_length;
    default:
      return 0;
  }
}

void pq_scratch_free(pq_scratch *s) {
  free(s->page);
  free(s->dict);
  free(s->dict_ents);
  free(s->prev);
  memset(s, 0, sizeof *s);
}

/* ---- dictionary ---- */

static int load_dict(const pq_leaf *col, const uint8_t *p, size_t len, int32_t n, pq_scratch *s,
                     size_t *ndict, br_err *err) {
  int32_t w = fixed_width(col);
  if (col->type == BR_PQ_BOOLEAN) return br_fail(err, "parquet: dictionary for a BOOLEAN column");
  size_t minw = w ? (size_t)w : 4;
  if ((size_t)n > len / minw + (len == 0 && n == 0))
    return br_fail(err, "parquet: dictionary of %d values cannot fit %zu bytes", n, len);
  if ((size_t)n > s->dict_cap_ents) {
    void *e = realloc(s->dict_ents, (size_t)n * sizeof *s->dict_ents);
    if (!e) return br_fail(err, "parquet: out of memory");
    s->dict_ents = e;
    s->dict_cap_ents = (size_t)n;
  }
  size_t pos = 0;
  for (int32_t i = 0; i < n; i++) {
    uint32_t l;
    if (w) {
      l = (uint32_t)w;
    } else {
      if (len - pos < 4) return br_fail(err, "parquet: truncated dictionary");
      l = le32(p + pos);
      pos += 4;
    }
    if (l > len - pos) return br_fail(err, "parquet: truncated dictionary value");
    s->dict_ents[i].off = (uint32_t)pos;
    s->dict_ents[i].len = l;
    pos += l;
  }
  *ndict = (size_t)n;
  return 0;
}

/* ---- levels ---- */

typedef struct levels {
  int kind; /* 0 constant, 1 RLE hybrid, 2 legacy BIT_PACKED (MSB first) */
  uint32_t constant;
  pq_rle rle;
  const uint8_t *p, *end;
  uint64_t pos;
  int bw;
} levels;

static int levels_get(levels *lv, uint32_t *out, size_t n) {
  if (lv->kind == 0) {
    for (size_t i = 0; i < n; i++) out[i] = lv->constant;
    return 0;
  }
  if (lv->kind == 1) return pq_rle_get(&lv->rle, out, n);
  /* legacy bit-packed, most significant bit first */
  uint64_t need = (lv->pos + n) * (uint64_t)lv->bw;
  if (need > (uint64_t)(lv->end - lv->p) * 8) return -1;
  for (size_t i = 0; i < n; i++) {
    uint32_t v = 0;
    for (int b = 0; b < lv->bw; b++) {
      uint64_t bit = lv->pos * (uint64_t)lv->bw + (uint64_t)b;
      v = v << 1 | ((lv->p[bit >> 3] >> (7 - (bit & 7))) & 1);
    }
    out[i] = v;
    lv->pos++;
  }
  return 0;
}

/* v1 level section at *p: RLE with a 4-byte length, or legacy BIT_PACKED. */
static int levels_v1(levels *lv, int encoding, int max, int32_t n, const uint8_t **p,
                     const uint8_t *end, br_err *err) {
  memset(lv, 0, sizeof *lv);
  if (max == 0) return 0;
  lv->bw = bit_width(max);
  if (encoding == ENC_RLE) {
    if (end - *p < 4) return br_fail(err, "parquet: truncated level length");
    uint32_t l = le32(*p);
    *p += 4;
    if (l > (size_t)(end - *p)) return br_fail(err, "parquet: level data past the page end");
    lv->kind = 1;
    pq_rle_init(&lv->rle, *p, l, lv->bw);
    *p += l;
    return 0;
  }
  if (encoding == ENC_BIT_PACKED) {
    uint64_t bytes = ((uint64_t)n * (uint64_t)lv->bw + 7) / 8;
    if (bytes > (uint64_t)(end - *p)) return br_fail(err, "parquet: level data past the page end");
    lv->kind = 2;
    lv->p = *p;
    lv->end = *p + bytes;
    *p += bytes;
    return 0;
  }
  return br_fail(err, "parquet: unsupported level encoding %d", encoding);
}

/* ---- values ---- */

typedef struct vdec {
  int enc, type;
  int32_t width;
  const uint8_t *p, *end; /* value bytes (PLAIN, suffix data, split streams) */
  uint64_t idx, count;
  pq_rle rle;
  uint32_t ibuf[BATCH];
  size_t ibuf_n, ibuf_pos;
  size_t ndict;
  pq_dbp d1, d2;
  pq_scratch *s;
  size_t prev_len;
  uint8_t tmp[12];
} vdec;

static int vdec_init(vdec *vd, const pq_leaf *col, int enc, const uint8_t *p, const uint8_t *end,
                     uint64_t max_values, pq_scratch *s, size_t ndict, int have_dict, br_err *err) {
  memset(vd, 0, offsetof(vdec, ibuf));
  vd->ibuf_n = vd->ibuf_pos = 0;
  vd->enc = enc;
  vd->type = col->type;
  vd->width = fixed_width(col);
  vd->p = p;
  vd->end = end;
  vd->s = s;
  vd->ndict = ndict;
  vd->prev_len = 0;
  switch (enc) {
    case ENC_PLAIN:
      return 0;
    case ENC_PLAIN_DICTIONARY:
    case ENC_RLE_DICTIONARY:
      if (!have_dict) return br_fail(err, "parquet: dictionary-encoded page without a dictionary");
      if (p >= end) {
        /* no indices at all: only valid when every value is null, checked on use */
        pq_rle_init(&vd->rle, p, 0, 0);
        return 0;
      }
      if (*p > 32) return br_fail(err, "parquet: dictionary index bit width %d", *p);
      pq_rle_init(&vd->rle, p + 1, (size_t)(end - p - 1), *p);
      return 0;
    case ENC_RLE:
      if (col->type != BR_PQ_BOOLEAN) return br_fail(err, "parquet: RLE values for a non-boolean");
      if (end - p < 4 || le32(p) > (size_t)(end - p - 4))
        return br_fail(err, "parquet: bad RLE boolean length");
      pq_rle_init(&vd->rle, p + 4, le32(p), 1);
      return 0;
    case ENC_DELTA_BINARY_PACKED:
      if (col->type != BR_PQ_INT32 && col->type != BR_PQ_INT64)
        return br_fail(err, "parquet: DELTA_BINARY_PACKED for a non-integer column");
      return pq_dbp_init(&vd->d1, p, (size_t)(end - p), max_values, err);
    case ENC_DELTA_LENGTH_BYTE_ARRAY: {
      const uint8_t *data;
      if (col->type != BR_PQ_BYTE_ARRAY)
        return br_fail(err, "parquet: DELTA_LENGTH_BYTE_ARRAY for a non-BYTE_ARRAY column");
      if (pq_dbp_init(&vd->d1, p, (size_t)(end - p), max_values, err) ||
          pq_dbp_skip_all(&vd->d1, &data, err))
        return -1;
      vd->p = data;
      return pq_dbp_init(&vd->d1, p, (size_t)(end - p), max_values, err);
    }
    case ENC_DELTA_BYTE_ARRAY: {
      const uint8_t *sfx, *data;
      if (col->type != BR_PQ_BYTE_ARRAY && col->type != BR_PQ_FIXED_LEN_BYTE_ARRAY)
        return br_fail(err, "parquet: DELTA_BYTE_ARRAY for a non-byte-array column");
      if (pq_dbp_init(&vd->d1, p, (size_t)(end - p), max_values, err) ||
          pq_dbp_skip_all(&vd->d1, &sfx, err) ||
          pq_dbp_init(&vd->d2, sfx, (size_t)(end - sfx), max_values, err) ||
          pq_dbp_skip_all(&vd->d2, &data, err))
        return -1;
      vd->p = data;
      return pq_dbp_init(&vd->d1, p, (size_t)(end - p), max_values, err) ||
             pq_dbp_init(&vd->d2, sfx, (size_t)(end - sfx), max_values, err);
    }
    case ENC_BYTE_STREAM_SPLIT:
      if (!vd->width || col->type == BR_PQ_INT96)
        return br_fail(err, "parquet: BYTE_STREAM_SPLIT for a variable-width column");
      if ((size_t)(end - p) % (size_t)vd->width)
        return br_fail(err, "parquet: BYTE_STREAM_SPLIT data is not a whole number of values");
      vd->count = (size_t)(end - p) / (size_t)vd->width;
      return grow(&s->prev, &s->prev_cap, (size_t)vd->width, err);
    default:
      return br_fail(err, "parquet: unsupported encoding %d", enc);
  }
}

static int vdec_next(vdec *vd, const uint8_t **out, size_t *out_len, br_err *err) {
  switch (vd->enc) {
    case ENC_PLAIN:
      if (vd->type == BR_PQ_BYTE_ARRAY) {
        if (vd->end - vd->p < 4) return br_fail(err, "parquet: PLAIN data ends early");
        uint32_t l = le32(vd->p);
        if (l > (size_t)(vd->end - vd->p - 4))
          return br_fail(err, "parquet: PLAIN value past the page end");
        *out = vd->p + 4;
        *out_len = l;
        vd->p += 4 + (size_t)l;
        return 0;
      }
      if (vd->type == BR_PQ_BOOLEAN) {
        if (vd->idx / 8 >= (uint64_t)(vd->end - vd->p))
          return br_fail(err, "parquet: PLAIN booleans end early");
        vd->tmp[0] = (vd->p[vd->idx / 8] >> (vd->idx % 8)) & 1;
        vd->idx++;
        *out = vd->tmp;
        *out_len = 1;
        return 0;
      }
      if (vd->end - vd->p < vd->width) return br_fail(err, "parquet: PLAIN data ends early");
      *out = vd->p;
      *out_len = (size_t)vd->width;
      vd->p += vd->width;
      return 0;
    case ENC_PLAIN_DICTIONARY:
    case ENC_RLE_DICTIONARY: {
      if (vd->ibuf_pos == vd->ibuf_n) return br_fail(err, "parquet: dictionary indices end early");
      uint32_t i = vd->ibuf[vd->ibuf_pos++];
      if (i >= vd->ndict)
        return br_fail(err, "parquet: dictionary index %u out of range (%zu entries)", i,
                       vd->ndict);
      *out = vd->s->dict + vd->s->dict_ents[i].off;
      *out_len = vd->s->dict_ents[i].len;
      return 0;
    }
    case ENC_RLE: {
      uint32_t v;
      if (pq_rle_get(&vd->rle, &v, 1)) return br_fail(err, "parquet: RLE booleans end early");
      vd->tmp[0] = (uint8_t)(v & 1);
      *out = vd->tmp;
      *out_len = 1;
      return 0;
    }
    case ENC_DELTA_BINARY_PACKED: {
      uint64_t v;
      if (pq_dbp_next(&vd->d1, &v, err)) return -1;
      for (int i = 0; i < 8; i++) vd->tmp[i] = (uint8_t)(v >> (8 * i));
      *out = vd->tmp;
      *out_len = vd->type == BR_PQ_INT32 ? 4 : 8;
      return 0;
    }
    case ENC_DELTA_LENGTH_BYTE_ARRAY: {
      uint64_t l;
      if (pq_dbp_next(&vd->d1, &l, err)) return -1;
      if (l > (uint64_t)(vd->end - vd->p))
        return br_fail(err, "parquet: DELTA_LENGTH_BYTE_ARRAY value past the page end");
      *out = vd->p;
      *out_len = (size_t)l;
      vd->p += l;
      return 0;
    }
    case ENC_DELTA_BYTE_ARRAY: {
      uint64_t pre, sl;
      if (pq_dbp_next(&vd->d1, &pre, err) || pq_dbp_next(&vd->d2, &sl, err)) return -1;
      if (pre > vd->prev_len) return br_fail(err, "parquet: DELTA_BYTE_ARRAY prefix too long");
      if (sl > (uint64_t)(vd->end - vd->p))
        return br_fail(err, "parquet: DELTA_BYTE_ARRAY suffix past the page end");
      size_t l = (size_t)pre + (size_t)sl;
      if (grow(&vd->s->prev, &vd->s->prev_cap, l ? l : 1, err)) return -1;
      if (sl) memcpy(vd->s->prev + pre, vd->p, (size_t)sl);
      vd->p += sl;
      vd->prev_len = l;
      if (vd->type == BR_PQ_FIXED_LEN_BYTE_ARRAY && l != (size_t)vd->width)
        return br_fail(err, "parquet: DELTA_BYTE_ARRAY value of %zu bytes in FLBA(%d)", l,
                       vd->width);
      *out = vd->s->prev;
      *out_len = l;
      return 0;
    }
    case ENC_BYTE_STREAM_SPLIT: {
      if (vd->idx >= vd->count) return br_fail(err, "parquet: BYTE_STREAM_SPLIT data ends early");
      for (int32_t k = 0; k < vd->width; k++)
        vd->s->prev[k] = vd->p[(uint64_t)k * vd->count + vd->idx];
      vd->idx++;
      *out = vd->s->prev;
      *out_len = (size_t)vd->width;
      return 0;
    }
  }
  return br_fail(err, "parquet: unsupported encoding %d", vd->enc);
}

/* ---- pages ---- */

typedef struct chunk_state {
  const pq_leaf *col;
  br_parquet_value_fn fn;
  void *ud;
  int64_t rows, seen;
  int cb_rc;
} chunk_state;

/* Decodes the dictionary indices of the next n non-null values. */
static int vdec_prepare(vdec *vd, size_t n, br_err *err) {
  if (vd->enc != ENC_PLAIN_DICTIONARY && vd->enc != ENC_RLE_DICTIONARY) return 0;
  if (n && pq_rle_get(&vd->rle, vd->ibuf, n))
    return br_fail(err, "parquet: dictionary indices end early");
  vd->ibuf_n = n;
  vd->ibuf_pos = 0;
  return 0;
}

static int decode_values(chunk_state *cs, levels *rep, levels *def, int32_t n, vdec *vd,
                         br_err *err) {
  uint32_t rl[BATCH], dl[BATCH];
  const pq_leaf *col = cs->col;
  for (int32_t done = 0; done < n;) {
    size_t k = (size_t)(n - done) < BATCH ? (size_t)(n - done) : BATCH;
    if (col->max_rep && levels_get(rep, rl, k))
      return br_fail(err, "parquet: column %s: repetition levels end early", col->path);
    if (col->max_def && levels_get(def, dl, k))
      return br_fail(err, "parquet: column %s: definition levels end early", col->path);
    size_t nn = k;
    if (col->max_def) {
      nn = 0;
      for (size_t j = 0; j < k; j++) nn += dl[j] == (uint32_t)col->max_def;
    }
    if (vdec_prepare(vd, nn, err)) return -1;
    for (size_t j = 0; j < k; j++) {
      if (col->max_rep) {
        if (rl[j] > (uint32_t)col->max_rep)
          return br_fail(err, "parquet: column %s: repetition level %u > %d", col->path, rl[j],
                         col->max_rep);
        if (rl[j] == 0)
          cs->rows++;
        else if (cs->seen == 0 && done == 0 && j == 0)
          return br_fail(err, "parquet: column %s: first repetition level is not 0", col->path);
      }
      int rc;
      if (col->max_def && dl[j] != (uint32_t)col->max_def) {
        if (dl[j] > (uint32_t)col->max_def)
          return br_fail(err, "parquet: column %s: definition level %u > %d", col->path, dl[j],
                         col->max_def);
        rc = cs->fn(cs->ud, NULL, 0, 1);
      } else {
        const uint8_t *v = NULL;
        size_t vl = 0;
        if (vdec_next(vd, &v, &vl, err)) return -1;
        rc = cs->fn(cs->ud, v, vl, 0);
      }
      if (rc) {
        cs->cb_rc = rc;
        return rc;
      }
    }
    if (!col->max_rep) cs->rows += (int64_t)k;
    done += (int32_t)k;
    cs->seen += (int64_t)k;
  }
  if (vd->enc == ENC_PLAIN && vd->type != BR_PQ_BOOLEAN && vd->p != vd->end)
    return br_fail(err, "parquet: column %s: %zu bytes of PLAIN values left over in a page",
                   col->path, (size_t)(vd->end - vd->p));
  return 0;
}

int pq_decode_chunk(const pq_leaf *col, int codec, const uint8_t *buf, size_t len,
                    int64_t num_values, pq_scratch *s, br_parquet_value_fn fn, void *ud,
                    int64_t *rows, br_err *err) {
  chunk_state cs = {col, fn, ud, 0, 0, 0};
  size_t pos = 0, ndict = 0;
  int have_dict = 0;
  vdec *vd = malloc(sizeof *vd);
  int rc = -1;
  if (!vd) return br_fail(err, "parquet: out of memory");
  while (cs.seen < num_values) {
    pq_page_header h;
    size_t used;
    if (pos >= len) {
      br_fail(err, "parquet: column %s: chunk ends after %lld of %lld values", col->path,
              (long long)cs.seen, (long long)num_values);
      goto out;
    }
    if (pq_page_header_decode(buf + pos, len - pos, &h, &used, err)) goto out;
    pos += used;
    if ((size_t)h.compressed_size > len - pos) {
      br_fail(err, "parquet: column %s: page of %d bytes past the chunk end", col->path,
              h.compressed_size);
      goto out;
    }
    if ((uint32_t)h.compressed_size > BR_PQ_MAX_PAGE ||
        (uint32_t)h.uncompressed_size > BR_PQ_MAX_PAGE) {
      br_fail(err, "parquet: column %s: page larger than %u bytes", col->path, BR_PQ_MAX_PAGE);
      goto out;
    }
    const uint8_t *cp = buf + pos;
    size_t csize = (size_t)h.compressed_size, usize = (size_t)h.uncompressed_size;
    pos += csize;
    if (h.type == PAGE_DICT) {
      if (!h.has_dict) {
        br_fail(err, "parquet: dictionary page without its header");
        goto out;
      }
      if (have_dict) {
        br_fail(err, "parquet: column %s: second dictionary page", col->path);
        goto out;
      }
      if (h.encoding != ENC_PLAIN && h.encoding != ENC_PLAIN_DICTIONARY) {
        br_fail(err, "parquet: dictionary encoding %d", h.encoding);
        goto out;
      }
      if (grow(&s->dict, &s->dict_cap, usize ? usize : 1, err) ||
          pq_decompress(codec, cp, csize, s->dict, usize, err) ||
          load_dict(col, s->dict, usize, h.num_values, s, &ndict, err))
        goto out;
      have_dict = 1;
      continue;
    }
    if (h.type != PAGE_DATA && h.type != PAGE_DATA_V2) continue; /* index pages etc. */
    if ((h.type == PAGE_DATA && !h.has_data) || (h.type == PAGE_DATA_V2 && !h.has_v2)) {
      br_fail(err, "parquet: data page without its header");
      goto out;
    }
    if ((uint32_t)h.num_values > BR_PQ_MAX_PAGE_VALUES || h.num_values > num_values - cs.seen) {
      br_fail(err, "parquet: column %s: page has %d values, more than the chunk's remaining %lld",
              col->path, h.num_values, (long long)(num_values - cs.seen));
      goto out;
    }
    if (grow(&s->page, &s->page_cap, usize ? usize : 1, err)) goto out;
    levels rep, def;
    const uint8_t *vp, *vend;
    if (h.type == PAGE_DATA) {
      if (pq_decompress(codec, cp, csize, s->page, usize, err)) goto out;
      vp = s->page;
      vend = s->page + usize;
      if (levels_v1(&rep, h.rep_encoding, col->max_rep, h.num_values, &vp, vend, err) ||
          levels_v1(&def, h.def_encoding, col->max_def, h.num_values, &vp, vend, err))
        goto out;
    } else {
      size_t ll = (size_t)h.rep_len + (size_t)h.def_len;
      if (ll > csize || ll > usize) {
        br_fail(err, "parquet: v2 page levels larger than the page");
        goto out;
      }
      memcpy(s->page, cp, ll);
      if (h.is_compressed) {
        if (pq_decompress(codec, cp + ll, csize - ll, s->page + ll, usize - ll, err)) goto out;
      } else if (pq_decompress(BR_PQ_UNCOMPRESSED, cp + ll, csize - ll, s->page + ll, usize - ll,
                               err)) {
        goto out;
      }
      memset(&rep, 0, sizeof rep);
      memset(&def, 0, sizeof def);
      if (col->max_rep) {
        rep.kind = 1;
        pq_rle_init(&rep.rle, s->page, (size_t)h.rep_len, bit_width(col->max_rep));
      }
      if (col->max_def) {
        def.kind = 1;
        pq_rle_init(&def.rle, s->page + h.rep_len, (size_t)h.def_len, bit_width(col->max_def));
      }
      vp = s->page + ll;
      vend = s->page + usize;
    }
    if (vdec_init(vd, col, h.encoding, vp, vend, (uint64_t)h.num_values, s, ndict, have_dict, err))
      goto out;
    int drc = decode_values(&cs, &rep, &def, h.num_values, vd, err);
    if (drc) {
      rc = cs.cb_rc ? cs.cb_rc : -1;
      goto done;
    }
  }
  *rows = cs.rows;
  rc = 0;
  goto done;
out:
  rc = -1;
done:
  free(vd);
  return rc;
}

/* ---- file ---- */

br_parquet_file *br_parquet_open(br_source *src, br_err *err) {
  uint8_t tail[8], head[4];
  br_parquet_file *f = NULL;
  uint8_t *footer = NULL;
  if (src->size < 12) {
    br_fail(err, "parquet: file of %llu bytes is too small", (unsigned long long)src->size);
    return NULL;
  }
  if (src->pread(src, head, 4, 0, err) || src->pread(src, tail, 8, src->size - 8, err)) return NULL;
  if (memcmp(head, "PAR1", 4) || memcmp(tail + 4, "PAR1", 4)) {
    br_fail(err, "parquet: not a Parquet file (magic missing; encrypted files are unsupported)");
    return NULL;
  }
  uint32_t flen = le32(tail);
  if (flen > BR_PQ_MAX_FOOTER || flen > src->size - 12) {
    br_fail(err, "parquet: bad footer length %u", flen);
    return NULL;
  }
  f = calloc(1, sizeof *f);
  footer = malloc(flen ? flen : 1);
  if (!f || !footer) {
    br_fail(err, "parquet: out of memory");
    goto fail;
  }
  if (src->pread(src, footer, flen, src->size - 8 - flen, err)) goto fail;
  if (pq_meta_decode(footer, flen, &f->m, err)) goto fail;
  f->src = src;
  f->data_end = src->size - 8 - flen;
  free(footer);
  return f;
fail:
  free(footer);
  free(f);
  return NULL;
}

void br_parquet_close(br_parquet_file *f) {
  if (!f) return;
  pq_meta_free(&f->m);
  free(f->chunk);
  free(f);
}

int64_t br_parquet_num_rows(const br_parquet_file *f) { return f->m.num_rows; }
size_t br_parquet_num_row_groups(const br_parquet_file *f) { return f->m.nrow_groups; }
size_t br_parquet_num_columns(const br_parquet_file *f) { return f->m.nleaves; }

int br_parquet_column(const br_parquet_file *f, size_t i, br_parquet_column_info *out) {
  if (i >= f->m.nleaves) return -1;
  const pq_leaf *l = &f->m.leaves[i];
  out->path = l->path;
  out->type = (enum br_parquet_type)l->type;
  out->type_length = l->type_length;
  out->max_def = l->max_def;
  out->max_rep = l->max_rep;
  out->converted_type = l->converted_type;
  return 0;
}

int br_parquet_find_column(const br_parquet_file *f, const char *path) {
  for (uint32_t i = 0; i < f->m.nleaves; i++)
    if (strcmp(f->m.leaves[i].path, path) == 0) return (int)i;
  return -1;
}

int pq_chunk_range(const br_parquet_file *f, uint32_t g, size_t i, uint64_t *start, uint64_t *len,
                   br_err *err) {
  const pq_chunk *ch = &f->m.chunks[(size_t)g * f->m.nleaves + i];
  int64_t s = ch->data_page_offset, dict = ch->dictionary_page_offset;
  if (dict >= 4 && (dict < s || s < 4)) s = dict;
  if (s < 4 || (uint64_t)s > f->data_end ||
      (uint64_t)ch->total_compressed_size > f->data_end - (uint64_t)s)
    return br_fail(err, "parquet: column %s: chunk at %lld+%lld lies outside the data",
                   f->m.leaves[i].path, (long long)s, (long long)ch->total_compressed_size);
  *start = (uint64_t)s;
  *len = (uint64_t)ch->total_compressed_size;
  return 0;
}

int pq_read_chunk(br_parquet_file *f, uint32_t g, size_t i, pq_scratch *s, br_parquet_value_fn fn,
                  void *ud, br_err *err) {
  const pq_leaf *col = &f->m.leaves[i];
  const pq_chunk *ch = &f->m.chunks[(size_t)g * f->m.nleaves + i];
  int64_t rows = 0;
  uint64_t start, clen64;
  int rc;
  if (ch->num_values == 0) {
    if (f->m.rg_rows[g] != 0 && col->max_rep == 0)
      return br_fail(err, "parquet: column %s: chunk has no values but the row group has %lld rows",
                     col->path, (long long)f->m.rg_rows[g]);
    return 0;
  }
  if (pq_chunk_range(f, g, i, &start, &clen64, err)) return -1;
  if (clen64 > BR_PQ_MAX_CHUNK)
    return br_fail(err, "parquet: column %s: chunk of %llu bytes is over the limit", col->path,
                   (unsigned long long)clen64);
  size_t clen = (size_t)clen64;
  if (grow(&f->chunk, &f->chunk_cap, clen ? clen : 1, err) ||
      f->src->pread(f->src, f->chunk, clen, start, err))
    return -1;
  rc = pq_decode_chunk(col, ch->codec, f->chunk, clen, ch->num_values, s, fn, ud, &rows, err);
  if (rc == 0 && rows != f->m.rg_rows[g])
    rc = br_fail(err, "parquet: column %s: row group %u has %lld rows, the column %lld", col->path,
                 g, (long long)f->m.rg_rows[g], (long long)rows);
  return rc;
}

int br_parquet_read_column_at(br_parquet_file *f, size_t i, br_parquet_value_fn fn, void *ud,
                              br_err *err) {
  pq_scratch s;
  int rc = 0;
  memset(&s, 0, sizeof s);
  if (i >= f->m.nleaves) return br_fail(err, "parquet: no column %zu", i);
  for (uint32_t g = 0; g < f->m.nrow_groups && rc == 0; g++)
    rc = pq_read_chunk(f, g, i, &s, fn, ud, err);
  pq_scratch_free(&s);
  return rc;
}

int br_parquet_read_column(br_source *src, const char *column_path, br_parquet_value_fn fn,
                           void *ud, br_err *err) {
  br_parquet_file *f = br_parquet_open(src, err);
  if (!f) return -1;
  int rc;
  int i = br_parquet_find_column(f, column_path);
  if (i < 0)
    rc = br_fail(err, "parquet: no leaf column named %s", column_path);
  else
    rc = br_parquet_read_column_at(f, (size_t)i, fn, ud, err);
  br_parquet_close(f);
  return rc;
}
