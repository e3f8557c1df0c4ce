/* Parquet page codecs: snappy, gzip, zstd, lz4 (raw, Hadoop-framed, frame), brotli. */
#include <brotli/decode.h>
#include <brotli/encode.h>
#include <lz4.h>
#include <lz4frame.h>
#include <snappy-c.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "parquet/internal.h"

static int gunzip(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len, br_err *err) {
  z_stream zs;
  int rc = -1;
  memset(&zs, 0, sizeof zs);
  if (in_len > UINT32_MAX || out_len > UINT32_MAX)
    return br_fail(err, "parquet: gzip page too big");
  if (inflateInit2(&zs, 15 + 32) != Z_OK) return br_fail(err, "parquet: inflateInit failed");
  zs.next_in = (Bytef *)in;
  zs.avail_in = (uInt)in_len;
  zs.next_out = out;
  zs.avail_out = (uInt)out_len;
  for (;;) {
    int z = inflate(&zs, Z_NO_FLUSH);
    if (z == Z_STREAM_END) {
      /* concatenated gzip members: keep going while input remains */
      if (zs.avail_in > 0 && zs.avail_out > 0) {
        if (inflateReset(&zs) != Z_OK) break;
        continue;
      }
      if (zs.avail_out != 0) {
        br_fail(err, "parquet: gzip data shorter than the declared size");
        goto out;
      }
      rc = 0;
      goto out;
    }
    if (z == Z_OK) continue;
    if (z == Z_BUF_ERROR && zs.avail_out == 0) {
      br_fail(err, "parquet: gzip data longer than the declared size");
      goto out;
    }
    break;
  }
  br_fail(err, "parquet: corrupt gzip data (%s)", zs.msg ? zs.msg : "truncated");
out:
  inflateEnd(&zs);
  return rc;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Hadoop's framing: blocks of [u32 BE raw size][u32 BE compressed size][lz4 block]. */
static int lz4_hadoop(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len) {
  size_t ip = 0, op = 0;
  while (ip < in_len) {
    if (in_len - ip < 8) return -1;
    uint32_t raw = be32(in + ip), comp = be32(in + ip + 4);
    ip += 8;
    if (comp > in_len - ip || raw > out_len - op || comp > INT32_MAX || raw > INT32_MAX) return -1;
    int n = LZ4_decompress_safe((const char *)in + ip, (char *)out + op, (int)comp, (int)raw);
    if (n < 0 || (uint32_t)n != raw) return -1;
    ip += comp;
    op += raw;
  }
  return op == out_len ? 0 : -1;
}

static int lz4_frame(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len) {
  LZ4F_dctx *ctx = NULL;
  int rc = -1;
  if (LZ4F_isError(LZ4F_createDecompressionContext(&ctx, LZ4F_VERSION))) return -1;
  size_t ip = 0, op = 0;
  for (;;) {
    size_t src = in_len - ip, dst = out_len - op;
    size_t hint = LZ4F_decompress(ctx, out + op, &dst, in + ip, &src, NULL);
    if (LZ4F_isError(hint)) break;
    ip += src;
    op += dst;
    if (hint == 0) {
      rc = (op == out_len && ip == in_len) ? 0 : -1;
      break;
    }
    if (src == 0 && dst == 0) break; /* no progress: truncated or output full */
  }
  LZ4F_freeDecompressionContext(ctx);
  return rc;
}

int pq_decompress(int codec, const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len,
                  br_err *err) {
  if (in_len > BR_PQ_MAX_PAGE || out_len > BR_PQ_MAX_PAGE)
    return br_fail(err, "parquet: page larger than %u bytes", BR_PQ_MAX_PAGE);
  switch (codec) {
    case BR_PQ_UNCOMPRESSED:
      if (in_len != out_len)
        return br_fail(err, "parquet: uncompressed page of %zu bytes declares %zu", in_len,
                       out_len);
      if (in_len) memcpy(out, in, in_len);
      return 0;
    case BR_PQ_SNAPPY: {
      size_t n;
      if (in_len == 0 && out_len == 0) return 0;
      if (snappy_uncompressed_length((const char *)in, in_len, &n) != SNAPPY_OK || n != out_len)
        return br_fail(err, "parquet: snappy page size differs from the declared %zu", out_len);
      if (snappy_uncompress((const char *)in, in_len, (char *)out, &n) != SNAPPY_OK || n != out_len)
        return br_fail(err, "parquet: corrupt snappy data");
      return 0;
    }
    case BR_PQ_GZIP:
      return gunzip(in, in_len, out, out_len, err);
    case BR_PQ_ZSTD: {
      uint8_t dummy;
      size_t n = ZSTD_decompress(out_len ? out : &dummy, out_len, in, in_len);
      if (ZSTD_isError(n)) return br_fail(err, "parquet: zstd: %s", ZSTD_getErrorName(n));
      if (n != out_len) return br_fail(err, "parquet: zstd page shorter than declared");
      return 0;
    }
    case BR_PQ_LZ4_RAW: {
      if (in_len == 0 && out_len == 0) return 0;
      int n = LZ4_decompress_safe((const char *)in, (char *)out, (int)in_len, (int)out_len);
      if (n < 0 || (size_t)n != out_len) return br_fail(err, "parquet: corrupt lz4 block");
      return 0;
    }
    case BR_PQ_LZ4:
      if (in_len == 0 && out_len == 0) return 0;
      if (lz4_hadoop(in, in_len, out, out_len) == 0) return 0;
      {
        int n = LZ4_decompress_safe((const char *)in, (char *)out, (int)in_len, (int)out_len);
        if (n >= 0 && (size_t)n == out_len) return 0;
      }
      if (lz4_frame(in, in_len, out, out_len) == 0) return 0;
      return br_fail(err, "parquet: corrupt lz4 data (neither Hadoop, raw nor frame)");
    case BR_PQ_BROTLI: {
      size_t n = out_len;
      uint8_t dummy;
      if (BrotliDecoderDecompress(in_len, in, &n, out_len ? out : &dummy) !=
              BROTLI_DECODER_RESULT_SUCCESS ||
          n != out_len)
        return br_fail(err, "parquet: corrupt brotli data or size differs from the declared one");
      return 0;
    }
    default:
      return br_fail(err, "parquet: unsupported codec %d", codec);
  }
}

int pq_compress(int codec, const uint8_t *in, size_t in_len, uint8_t **out, size_t *out_len,
                br_err *err) {
  size_t cap;
  uint8_t *buf = NULL;
  *out = NULL;
  *out_len = 0;
  if (in_len > BR_PQ_MAX_PAGE) return br_fail(err, "parquet: page too large to write");
  switch (codec) {
    case BR_PQ_UNCOMPRESSED:
      cap = in_len;
      break;
    case BR_PQ_SNAPPY:
      cap = snappy_max_compressed_length(in_len);
      break;
    case BR_PQ_GZIP:
      cap = compressBound((uLong)in_len) + 32;
      break;
    case BR_PQ_ZSTD:
      cap = ZSTD_compressBound(in_len);
      break;
    case BR_PQ_LZ4_RAW:
      cap = (size_t)LZ4_compressBound((int)in_len);
      break;
    case BR_PQ_BROTLI:
      cap = BrotliEncoderMaxCompressedSize(in_len);
      if (cap == 0) cap = in_len + 1024;
      break;
    default:
      return br_fail(err, "parquet: cannot write codec %d", codec);
  }
  buf = malloc(cap ? cap : 1);
  if (!buf) return br_fail(err, "out of memory");
  size_t n = cap;
  int ok = 1;
  switch (codec) {
    case BR_PQ_UNCOMPRESSED:
      if (in_len) memcpy(buf, in, in_len);
      n = in_len;
      break;
    case BR_PQ_SNAPPY:
      ok = snappy_compress((const char *)in, in_len, (char *)buf, &n) == SNAPPY_OK;
      break;
    case BR_PQ_GZIP: {
      z_stream zs;
      memset(&zs, 0, sizeof zs);
      ok = deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK;
      if (ok) {
        zs.next_in = (Bytef *)in;
        zs.avail_in = (uInt)in_len;
        zs.next_out = buf;
        zs.avail_out = (uInt)cap;
        ok = deflate(&zs, Z_FINISH) == Z_STREAM_END;
        n = zs.total_out;
        deflateEnd(&zs);
      }
      break;
    }
    case BR_PQ_ZSTD:
      n = ZSTD_compress(buf, cap, in, in_len, 3);
      ok = !ZSTD_isError(n);
      break;
    case BR_PQ_LZ4_RAW: {
      int r = LZ4_compress_default((const char *)in, (char *)buf, (int)in_len, (int)cap);
      ok = r > 0 || in_len == 0;
      n = r > 0 ? (size_t)r : 0;
      break;
    }
    case BR_PQ_BROTLI:
      ok = BrotliEncoderCompress(5, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_GENERIC, in_len, in, &n,
                                 buf) == BROTLI_TRUE;
      break;
  }
  if (!ok) {
    free(buf);
    return br_fail(err, "parquet: compression (codec %d) failed", codec);
  }
  *out = buf;
  *out_len = n;
  return 0;
}
