/* Parquet encodings: RLE / bit-packed hybrid (decode and encode) and DELTA_BINARY_PACKED. */
#include <string.h>

#include "parquet/internal.h"

/* bw bits (0..64) at bit position pos of p; the caller checked that they lie before end. */
static inline uint64_t get_bits(const uint8_t *p, const uint8_t *end, uint64_t pos, int bw) {
  const uint8_t *q = p + (pos >> 3);
  unsigned sh = (unsigned)(pos & 7);
  uint64_t lo;
  if (bw == 0) return 0;
  if (end - q >= 8) {
    memcpy(&lo, q, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    lo = __builtin_bswap64(lo);
#endif
  } else {
    lo = 0;
    for (int i = 0; i < end - q; i++) lo |= (uint64_t)q[i] << (8 * i);
  }
  uint64_t v = lo >> sh;
  if (sh + (unsigned)bw > 64) v |= (uint64_t)q[8] << (64 - sh);
  if (bw < 64) v &= ((uint64_t)1 << bw) - 1;
  return v;
}

static int read_uvarint(const uint8_t **pp, const uint8_t *end, uint64_t *v) {
  const uint8_t *p = *pp;
  uint64_t out = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p >= end) return -1;
    uint8_t b = *p++;
    out |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *pp = p;
      *v = out;
      return 0;
    }
  }
  return -1;
}

void pq_rle_init(pq_rle *d, const uint8_t *p, size_t len, int bw) {
  memset(d, 0, sizeof *d);
  d->p = p;
  d->end = p + len;
  d->bw = bw;
}

static int rle_next_run(pq_rle *d) {
  uint64_t h;
  if (read_uvarint(&d->p, d->end, &h)) return -1;
  uint64_t n = h >> 1;
  size_t avail = (size_t)(d->end - d->p);
  if (h & 1) {
    uint64_t count;
    size_t bytes;
    if (d->bw == 0) {
      count = n > UINT32_MAX / 8 ? UINT32_MAX : n * 8;
      bytes = 0;
    } else if (n > avail || n * (uint64_t)d->bw > avail) {
      /* a short last run: take the values that are fully present */
      count = (uint64_t)avail * 8 / (uint64_t)d->bw;
      bytes = avail;
    } else {
      count = n * 8;
      bytes = (size_t)(n * (uint64_t)d->bw);
    }
    if (count > UINT32_MAX) count = UINT32_MAX;
    d->bp = d->p;
    d->bp_end = d->p + bytes;
    d->bp_pos = 0;
    d->bp_left = (uint32_t)count;
    d->p += bytes;
  } else {
    size_t nb = ((size_t)d->bw + 7) / 8;
    if (nb > avail) return -1;
    uint32_t v = 0;
    for (size_t i = 0; i < nb; i++) v |= (uint32_t)d->p[i] << (8 * i);
    d->p += nb;
    d->rle_value = v;
    d->rle_left = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
  }
  return 0;
}

int pq_rle_get(pq_rle *d, uint32_t *out, size_t n) {
  while (n > 0) {
    if (d->rle_left) {
      size_t k = n < d->rle_left ? n : d->rle_left;
      uint32_t v = d->rle_value;
      for (size_t i = 0; i < k; i++) out[i] = v;
      out += k;
      n -= k;
      d->rle_left -= (uint32_t)k;
    } else if (d->bp_left) {
      size_t k = n < d->bp_left ? n : d->bp_left;
      int bw = d->bw;
      uint64_t pos = d->bp_pos * (uint64_t)bw;
      for (size_t i = 0; i < k; i++, pos += (uint64_t)bw)
        out[i] = (uint32_t)get_bits(d->bp, d->bp_end, pos, bw);
      d->bp_pos += k;
      out += k;
      n -= k;
      d->bp_left -= (uint32_t)k;
    } else {
      if (d->p >= d->end) return -1;
      if (rle_next_run(d)) return -1;
    }
  }
  return 0;
}

/* One run header + payload. */
static void put_rle_run(tc_buf *b, uint8_t v, size_t count) {
  tc_put_varint(b, (uint64_t)count << 1);
  tc_buf_put(b, &v, 1);
}

void pq_rle_encode(tc_buf *b, const uint8_t *vals, size_t n, int bw) {
  size_t i = 0;
  while (i < n) {
    /* an RLE run when at least 8 equal values follow */
    size_t j = i + 1;
    while (j < n && vals[j] == vals[i]) j++;
    if (j - i >= 8 || j == n) {
      put_rle_run(b, vals[i], j - i);
      i = j;
      continue;
    }
    /* otherwise bit-pack groups of 8 until a run of >= 8 equal values starts at a group edge */
    size_t start = i, groups = 0;
    while (i < n) {
      size_t k = i + 1;
      while (k < n && vals[k] == vals[i]) k++;
      if (k - i >= 8 && groups > 0) break;
      i = i + 8 < n ? i + 8 : n;
      groups++;
      if (groups >= (1u << 20)) break;
    }
    tc_put_varint(b, (uint64_t)groups << 1 | 1);
    for (size_t g = 0; g < groups; g++) {
      uint64_t acc = 0;
      for (size_t t = 0; t < 8; t++) {
        size_t idx = start + g * 8 + t;
        uint64_t v = idx < n ? vals[idx] : 0;
        acc |= v << (t * (size_t)bw);
      }
      uint8_t bytes[8];
      for (int t = 0; t < bw; t++) bytes[t] = (uint8_t)(acc >> (8 * t));
      tc_buf_put(b, bytes, (size_t)bw);
    }
  }
}

/* ---- DELTA_BINARY_PACKED ---- */

int pq_dbp_init(pq_dbp *d, const uint8_t *p, size_t len, uint64_t max_total, br_err *err) {
  uint64_t first;
  memset(d, 0, sizeof *d);
  d->p = p;
  d->end = p + len;
  if (read_uvarint(&d->p, d->end, &d->block_size) || read_uvarint(&d->p, d->end, &d->nmini) ||
      read_uvarint(&d->p, d->end, &d->total) || read_uvarint(&d->p, d->end, &first))
    return br_fail(err, "parquet: truncated DELTA_BINARY_PACKED header");
  if (d->block_size == 0 || d->block_size % 128 || d->block_size > (1u << 20) || d->nmini == 0 ||
      d->block_size % d->nmini || (d->block_size / d->nmini) % 32)
    return br_fail(err, "parquet: bad DELTA_BINARY_PACKED block layout");
  if (d->total > max_total)
    return br_fail(err, "parquet: DELTA_BINARY_PACKED declares %llu values, at most %llu expected",
                   (unsigned long long)d->total, (unsigned long long)max_total);
  d->per_mini = d->block_size / d->nmini;
  d->last = (first >> 1) ^ (~(first & 1) + 1);
  return 0;
}

static int dbp_open_mini(pq_dbp *d, br_err *err) {
  int w = d->widths[d->mini_idx];
  if (w > 64) return br_fail(err, "parquet: DELTA_BINARY_PACKED bit width %d", w);
  uint64_t bytes = d->per_mini * (uint64_t)w / 8;
  if (bytes > (uint64_t)(d->end - d->p))
    return br_fail(err, "parquet: truncated DELTA_BINARY_PACKED miniblock");
  d->mini = d->p;
  d->width = w;
  d->p += bytes;
  d->in_mini = 0;
  return 0;
}

int pq_dbp_next(pq_dbp *d, uint64_t *v, br_err *err) {
  if (d->emitted >= d->total) return br_fail(err, "parquet: DELTA_BINARY_PACKED data exhausted");
  if (d->emitted == 0) {
    d->emitted = 1;
    *v = d->last;
    return 0;
  }
  if (!d->in_block || d->in_mini == d->per_mini) {
    if (d->in_block && d->mini_idx + 1 < d->nmini) {
      d->mini_idx++;
    } else {
      uint64_t z;
      if (read_uvarint(&d->p, d->end, &z))
        return br_fail(err, "parquet: truncated DELTA_BINARY_PACKED block");
      d->min_delta = (int64_t)((z >> 1) ^ (~(z & 1) + 1));
      if (d->nmini > (uint64_t)(d->end - d->p))
        return br_fail(err, "parquet: truncated DELTA_BINARY_PACKED widths");
      d->widths = d->p;
      d->p += d->nmini;
      d->mini_idx = 0;
      d->in_block = 1;
    }
    if (dbp_open_mini(d, err)) return -1;
  }
  uint64_t delta = get_bits(d->mini, d->p, (uint64_t)d->in_mini * (uint64_t)d->width, d->width);
  d->in_mini++;
  d->last = d->last + (uint64_t)d->min_delta + delta;
  d->emitted++;
  *v = d->last;
  return 0;
}

int pq_dbp_skip_all(pq_dbp *d, const uint8_t **end, br_err *err) {
  uint64_t v;
  while (d->emitted < d->total)
    if (pq_dbp_next(d, &v, err)) return -1;
  *end = d->p;
  return 0;
}
