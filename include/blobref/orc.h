/* blobref's own ORC subset: read every value of one top-level string or binary column. */
#ifndef BLOBREF_ORC_H
#define BLOBREF_ORC_H

#include "blobref/source.h"

/* Hard limits of the reader (inputs beyond them are errors, never allocations). */
#define BR_ORC_MAX_TAIL (64u << 20)        /* postscript + footer + metadata, compressed */
#define BR_ORC_MAX_FOOTER (64u << 20)      /* footer or stripe footer, decompressed */
#define BR_ORC_MAX_STREAM (256u << 20)     /* one stream of one stripe, decompressed */
#define BR_ORC_MAX_BLOCK (16u << 20)       /* compression block size */
#define BR_ORC_MAX_STRIPE_ROWS (16u << 20) /* rows (and dictionary entries) of one stripe */

/* Column kinds, numbered as Type.Kind in orc_proto.proto. */
enum br_orc_kind {
  BR_ORC_STRING = 7,
  BR_ORC_BINARY = 8,
  BR_ORC_STRUCT = 12,
  BR_ORC_VARCHAR = 16,
  BR_ORC_CHAR = 17,
};

/* Compression kinds, numbered as CompressionKind in orc_proto.proto. */
enum br_orc_codec {
  BR_ORC_NONE = 0,
  BR_ORC_ZLIB = 1,
  BR_ORC_SNAPPY = 2,
  BR_ORC_LZO = 3, /* refused */
  BR_ORC_LZ4 = 4,
  BR_ORC_ZSTD = 5,
};

/* Called once per row, in row order: the value's bytes, or is_null=1 (data=NULL, len=0). The
 * pointer is valid only during the call. Return 0 to go on; any other value stops the read and
 * is returned by br_orc_read_column_at. Same shape as br_parquet_value_fn. */
typedef int (*br_orc_value_fn)(void *ud, const uint8_t *data, size_t len, int is_null);

/* An opened file: its postscript and footer decoded once. */
typedef struct br_orc_file br_orc_file;

/* Reads and checks the tail of src (borrowed; must outlive the file): postscript, footer, types
 * and stripe list. LZO compression is refused. NULL + err on failure. */
br_orc_file *br_orc_open(br_source *src, br_err *err);
void br_orc_close(br_orc_file *f);
int64_t br_orc_num_rows(const br_orc_file *f);
size_t br_orc_num_stripes(const br_orc_file *f);
enum br_orc_codec br_orc_codec(const br_orc_file *f);
/* Top-level columns (the fields of the root struct; none when the root is not a struct). */
size_t br_orc_num_columns(const br_orc_file *f);
/* The index of the top-level column with this name, or -1. */
int br_orc_find_column(const br_orc_file *f, const char *name);
/* Name (owned by the file) and kind (enum br_orc_kind or another Type.Kind) of top-level column
 * i; 0, or -1 when out of range. */
int br_orc_column(const br_orc_file *f, size_t i, const char **name, int *kind);
/* Reads every value of top-level column i (STRING, VARCHAR, CHAR or BINARY; DIRECT, DIRECT_V2,
 * DICTIONARY or DICTIONARY_V2) across all stripes, one stripe's streams of that column in memory
 * at a time. 0, the callback's non-zero value, or -1 with err for malformed/unsupported input. */
int br_orc_read_column_at(br_orc_file *f, size_t i, br_orc_value_fn fn, void *ud, br_err *err);

/* ---- Pure decoders (exposed for the unit tests and the fuzz target) ---- */

/* Decodes exactly n integers of an ORC integer stream [p, p+len): version 1 (RLE v1) or 2
 * (RLE v2), signed (zigzag) or not, into out[n]. Bytes after the n-th value are ignored; a run
 * that goes past n values or data that ends early is an error. 0, or -1 + err. */
int br_orc_rle_decode(int version, int is_signed, const uint8_t *p, size_t len, uint64_t *out,
                      size_t n, br_err *err);
/* The same decode in pieces, so that a stripe's values need not all be in memory at once:
 * init for a stream of n integers, then each next decodes whole runs until at least want values
 * (or the rest of the n) are in out, *got of them; out has room for want + BR_ORC_RLE_MAX_RUN - 1.
 * A run is at most 512 values (RLE v2; 130 in v1). 0, or -1 + err as br_orc_rle_decode. */
#define BR_ORC_RLE_MAX_RUN 512
typedef struct br_orc_rle {
  int version, is_signed;
  const uint8_t *p, *end;
  size_t pos, n; /* values decoded so far, of n */
} br_orc_rle;
void br_orc_rle_init(br_orc_rle *r, int version, int is_signed, const uint8_t *p, size_t len,
                     size_t n);
int br_orc_rle_next(br_orc_rle *r, uint64_t *out, size_t want, size_t *got, br_err *err);
/* Decodes n bytes of a byte-RLE stream into out[n]. 0, or -1 + err. */
int br_orc_byte_rle_decode(const uint8_t *p, size_t len, uint8_t *out, size_t n, br_err *err);
/* Decodes n booleans (byte RLE, most significant bit first) into out[n] as 0/1. */
int br_orc_bool_decode(const uint8_t *p, size_t len, uint8_t *out, size_t n, br_err *err);
/* Reads a base-128 varint at *p (advanced); 0, or -1 when it runs past end or over 64 bits. */
int br_orc_varint(const uint8_t **p, const uint8_t *end, uint64_t *v);

/* Decodes a whole file held in memory and calls fn for every value of every top-level string or
 * binary column (the fuzz entry point). 0, or -1 + err. */
int br_orc_read_all_from_memory(const uint8_t *data, size_t len, br_orc_value_fn fn, void *ud,
                                br_err *err);

#endif
