/* ORC run-length encodings: varints, byte RLE, booleans, integer RLE v1 and v2. */
#include <string.h>

#include "blobref/orc.h"

int br_orc_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t r = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*p >= end) return -1;
    uint8_t b = *(*p)++;
    if (shift == 63 && (b & 0x7e)) return -1; /* more than 64 bits */
    r |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = r;
      return 0;
    }
  }
  return -1;
}

static uint64_t unzigzag(uint64_t v) { return (v >> 1) ^ (0 - (v & 1)); }

int br_orc_byte_rle_decode(const uint8_t *p, size_t len, uint8_t *out, size_t n, br_err *err) {
  const uint8_t *end = p + len;
  size_t pos = 0;
  while (pos < n) {
    if (p >= end) return br_fail(err, "orc: byte RLE stream ends after %zu of %zu values", pos, n);
    uint8_t c = *p++;
    if (c < 0x80) { /* a run of c + 3 copies */
      size_t run = (size_t)c + 3;
      if (p >= end) return br_fail(err, "orc: byte RLE run without its value");
      if (run > n - pos) return br_fail(err, "orc: byte RLE run goes past the stream's values");
      memset(out + pos, *p++, run);
      pos += run;
    } else { /* 256 - c literal bytes */
      size_t lit = 256 - (size_t)c;
      if (lit > (size_t)(end - p)) return br_fail(err, "orc: byte RLE literals run past the data");
      if (lit > n - pos) lit = n - pos; /* the last byte of booleans may be partly used */
      memcpy(out + pos, p, lit);
      p += lit;
      pos += lit;
    }
  }
  return 0;
}

int br_orc_bool_decode(const uint8_t *p, size_t len, uint8_t *out, size_t n, br_err *err) {
  size_t nbytes = n / 8 + (n % 8 != 0);
  /* decode the bytes into the tail of out, then spread them into bits from the front */
  uint8_t *bytes = out + (n - nbytes);
  if (br_orc_byte_rle_decode(p, len, bytes, nbytes, err) != 0) return -1;
  for (size_t i = 0; i < n; i++) {
    uint8_t b = bytes[i / 8]; /* out[n - nbytes + k] is overwritten only after its last bit */
    out[i] = (b >> (7 - i % 8)) & 1;
  }
  return 0;
}

/* ---- RLE v1 ---- */

/* The run decoders write values start .. into out[0 ..], whole runs while fewer than want - start,
 * none past n (the stream's count: a run past it is an error); *pp is advanced, *endpos set. out
 * needs room for want - start + BR_ORC_RLE_MAX_RUN - 1 values (or n - start). */
static int rle_v1(int is_signed, const uint8_t **pp, const uint8_t *end, uint64_t *out,
                  size_t start, size_t want, size_t n, size_t *endpos, br_err *err) {
  const uint8_t *p = *pp;
  size_t pos = 0; /* from start: out[pos] is value start + pos */
  want -= start;
  n -= start;
  while (pos < want) {
    if (p >= end)
      return br_fail(err, "orc: RLE v1 stream ends after %zu of %zu values", start + pos,
                     start + n);
    uint8_t c = *p++;
    if (c < 0x80) { /* run: c + 3 values, a signed byte delta, the base as a varint */
      size_t run = (size_t)c + 3;
      if (p >= end) return br_fail(err, "orc: RLE v1 run without its delta");
      int8_t delta = (int8_t)*p++;
      uint64_t base;
      if (br_orc_varint(&p, end, &base) != 0) return br_fail(err, "orc: RLE v1 bad base varint");
      if (is_signed) base = unzigzag(base);
      if (run > n - pos) return br_fail(err, "orc: RLE v1 run goes past the stream's values");
      for (size_t i = 0; i < run; i++) out[pos++] = base + (uint64_t)((int64_t)delta * (int64_t)i);
    } else { /* 256 - c literal varints */
      size_t lit = 256 - (size_t)c;
      if (lit > n - pos) return br_fail(err, "orc: RLE v1 literals go past the stream's values");
      for (size_t i = 0; i < lit; i++) {
        uint64_t v;
        if (br_orc_varint(&p, end, &v) != 0) return br_fail(err, "orc: RLE v1 bad literal varint");
        out[pos++] = is_signed ? unzigzag(v) : v;
      }
    }
  }
  *pp = p;
  *endpos = start + pos;
  return 0;
}

/* ---- RLE v2 ---- */

/* The 5-bit width code of DIRECT, PATCHED_BASE and DELTA headers, in bits. */
static int decode_width(unsigned code) {
  static const uint8_t big[] = {26, 28, 30, 32, 40, 48, 56, 64};
  return code < 24 ? (int)code + 1 : big[code - 24];
}

/* The width actually used for packing w-bit values (patch list entries). */
static int closest_fixed_bits(int w) {
  if (w <= 24) return w == 0 ? 1 : w;
  if (w <= 26) return 26;
  if (w <= 28) return 28;
  if (w <= 30) return 30;
  if (w <= 32) return 32;
  if (w <= 40) return 40;
  if (w <= 48) return 48;
  if (w <= 56) return 56;
  return 64;
}

/* Big-endian, most significant bit first bit reader over [p, end). */
typedef struct bitreader {
  const uint8_t *p, *end;
  unsigned bit; /* bits of *p already used */
} bitreader;

static int read_bits(bitreader *b, int w, uint64_t *v) {
  uint64_t r = 0;
  while (w > 0) {
    if (b->p >= b->end) return -1;
    unsigned avail = 8 - b->bit;
    unsigned take = (unsigned)w < avail ? (unsigned)w : avail;
    unsigned shift = avail - take;
    r = (r << take) | ((*b->p >> shift) & ((1u << take) - 1));
    b->bit += take;
    w -= (int)take;
    if (b->bit == 8) {
      b->bit = 0;
      b->p++;
    }
  }
  *v = r;
  return 0;
}

/* Reads n values of w bits from a byte-aligned reader into out: whole bytes into a 64-bit
 * accumulator (read_bits' bit-by-bit loop was most of a dictionary column's decode time). Widths
 * over 56 bits go through read_bits. Leaves the reader after the last value's bits. */
static int unpack_bits(bitreader *b, int w, size_t n, uint64_t *out) {
  if ((n * (size_t)w + 7) / 8 > (size_t)(b->end - b->p)) return -1;
  if (w > 56 || b->bit) {
    for (size_t i = 0; i < n; i++)
      if (read_bits(b, w, &out[i]) != 0) return -1;
    return 0;
  }
  const uint8_t *p = b->p;
  uint64_t acc = 0, mask = (1ull << w) - 1;
  int nbits = 0;
  for (size_t i = 0; i < n; i++) {
    while (nbits < w) {
      acc = acc << 8 | *p++;
      nbits += 8;
    }
    nbits -= w;
    out[i] = (acc >> nbits) & mask;
    acc &= (1ull << nbits) - 1;
  }
  b->p = nbits ? p - 1 : p;
  b->bit = nbits ? 8 - (unsigned)nbits : 0;
  return 0;
}

/* Skips to the next byte boundary (each run's packed values are padded to whole bytes). */
static void align_bits(bitreader *b) {
  if (b->bit) {
    b->bit = 0;
    b->p++;
  }
}

static int read_be(const uint8_t **p, const uint8_t *end, int nbytes, uint64_t *v) {
  if (nbytes > end - *p) return -1;
  uint64_t r = 0;
  for (int i = 0; i < nbytes; i++) r = r << 8 | *(*p)++;
  *v = r;
  return 0;
}

static int rle_v2(int is_signed, const uint8_t **pp, const uint8_t *end, uint64_t *out,
                  size_t start, size_t want, size_t n, size_t *endpos, br_err *err) {
  const uint8_t *p = *pp;
  size_t pos = 0; /* from start: out[pos] is value start + pos */
  want -= start;
  n -= start;
  while (pos < want) {
    if (p >= end)
      return br_fail(err, "orc: RLE v2 stream ends after %zu of %zu values", start + pos,
                     start + n);
    uint8_t h = *p++;
    int enc = h >> 6;
    if (enc == 0) { /* SHORT_REPEAT: width in bytes, 3..10 copies */
      int wb = ((h >> 3) & 7) + 1;
      size_t run = (size_t)(h & 7) + 3;
      uint64_t v;
      if (read_be(&p, end, wb, &v) != 0) return br_fail(err, "orc: RLE v2 short repeat truncated");
      if (is_signed) v = unzigzag(v);
      if (run > n - pos) return br_fail(err, "orc: RLE v2 run goes past the stream's values");
      for (size_t i = 0; i < run; i++) out[pos++] = v;
      continue;
    }
    if (p >= end) return br_fail(err, "orc: RLE v2 header truncated");
    size_t run = ((size_t)(h & 1) << 8 | *p++) + 1;
    unsigned wcode = (h >> 1) & 0x1f;
    if (run > n - pos) return br_fail(err, "orc: RLE v2 run goes past the stream's values");
    if (enc == 1) { /* DIRECT: run values of w bits */
      int w = decode_width(wcode);
      bitreader b = {p, end, 0};
      if (unpack_bits(&b, w, run, out + pos) != 0)
        return br_fail(err, "orc: RLE v2 direct run truncated");
      if (is_signed)
        for (size_t i = pos; i < pos + run; i++) out[i] = unzigzag(out[i]);
      pos += run;
      align_bits(&b);
      p = b.p;
    } else if (enc == 2) { /* PATCHED_BASE */
      int w = decode_width(wcode);
      if (end - p < 2) return br_fail(err, "orc: RLE v2 patched base header truncated");
      int bw = (p[0] >> 5) + 1, pw = decode_width(p[0] & 0x1f);
      int pgw = (p[1] >> 5) + 1;
      size_t pll = p[1] & 0x1f;
      p += 2;
      uint64_t base;
      if (read_be(&p, end, bw, &base) != 0)
        return br_fail(err, "orc: RLE v2 patched base truncated");
      uint64_t sign = 1ull << (bw * 8 - 1);
      int64_t sbase = (base & sign) ? -(int64_t)(base & ~sign) : (int64_t)base;
      if (pgw + pw > 64) return br_fail(err, "orc: RLE v2 patch wider than 64 bits");
      bitreader b = {p, end, 0};
      size_t first = pos;
      if (unpack_bits(&b, w, run, out + pos) != 0)
        return br_fail(err, "orc: RLE v2 patched run truncated");
      pos += run;
      align_bits(&b);
      int cfb = closest_fixed_bits(pgw + pw);
      size_t at = first;
      for (size_t i = 0; i < pll; i++) {
        uint64_t e;
        if (read_bits(&b, cfb, &e) != 0) return br_fail(err, "orc: RLE v2 patch list truncated");
        uint64_t gap = e >> pw, patch = pw == 64 ? e : e & ((1ull << pw) - 1);
        at += gap;
        if (at >= first + run) return br_fail(err, "orc: RLE v2 patch outside its run");
        if (w < 64) out[at] |= patch << w;
      }
      align_bits(&b);
      p = b.p;
      for (size_t i = first; i < pos; i++) out[i] = (uint64_t)sbase + out[i];
    } else { /* DELTA: base, delta base, then run - 2 packed deltas (none when the width is 0) */
      int w = wcode ? decode_width(wcode) : 0;
      uint64_t base, dbase;
      if (br_orc_varint(&p, end, &base) != 0 || br_orc_varint(&p, end, &dbase) != 0)
        return br_fail(err, "orc: RLE v2 delta header truncated");
      if (is_signed) base = unzigzag(base);
      int64_t delta = (int64_t)unzigzag(dbase);
      out[pos++] = base;
      if (run == 1) continue;
      uint64_t prev = base + (uint64_t)delta;
      out[pos++] = prev;
      bitreader b = {p, end, 0};
      for (size_t i = 2; i < run; i++) {
        uint64_t d = (uint64_t)delta;
        if (w) {
          if (read_bits(&b, w, &d) != 0) return br_fail(err, "orc: RLE v2 delta run truncated");
          if (delta < 0) d = 0 - d;
        }
        prev += d;
        out[pos++] = prev;
      }
      align_bits(&b);
      p = b.p;
    }
  }
  *pp = p;
  *endpos = start + pos;
  return 0;
}

int br_orc_rle_decode(int version, int is_signed, const uint8_t *p, size_t len, uint64_t *out,
                      size_t n, br_err *err) {
  size_t got;
  if (version == 1) return rle_v1(is_signed, &p, p + len, out, 0, n, n, &got, err);
  if (version == 2) return rle_v2(is_signed, &p, p + len, out, 0, n, n, &got, err);
  return br_fail(err, "orc: unknown RLE version %d", version);
}

void br_orc_rle_init(br_orc_rle *r, int version, int is_signed, const uint8_t *p, size_t len,
                     size_t n) {
  r->version = version;
  r->is_signed = is_signed;
  r->p = p;
  r->end = p + len;
  r->pos = 0;
  r->n = n;
}

int br_orc_rle_next(br_orc_rle *r, uint64_t *out, size_t want, size_t *got, br_err *err) {
  size_t start = r->pos, stop = want > r->n - start ? r->n : start + want, endpos;
  int rc;
  if (r->version == 1)
    rc = rle_v1(r->is_signed, &r->p, r->end, out, start, stop, r->n, &endpos, err);
  else if (r->version == 2)
    rc = rle_v2(r->is_signed, &r->p, r->end, out, start, stop, r->n, &endpos, err);
  else
    return br_fail(err, "orc: unknown RLE version %d", r->version);
  if (rc != 0) return rc;
  r->pos = endpos;
  *got = endpos - start;
  return 0;
}
