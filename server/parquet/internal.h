/* Private pieces of the Parquet module: Thrift compact codec, footer model, encodings, codecs. */
#ifndef BLOBREF_PARQUET_INTERNAL_H
#define BLOBREF_PARQUET_INTERNAL_H

#include <stdint.h>
#include <stddef.h>

#include "blobref/parquet.h"

/* ---- Thrift compact protocol ---- */

enum {
  TC_STOP = 0,
  TC_TRUE = 1,
  TC_FALSE = 2,
  TC_BYTE = 3,
  TC_I16 = 4,
  TC_I32 = 5,
  TC_I64 = 6,
  TC_DOUBLE = 7,
  TC_BINARY = 8,
  TC_LIST = 9,
  TC_SET = 10,
  TC_MAP = 11,
  TC_STRUCT = 12,
};

#define TC_MAX_DEPTH 64

/* A read cursor over a Thrift compact buffer; the first error sticks in err / failed. */
typedef struct tc_reader {
  const uint8_t *p, *end;
  int depth;
  int failed;
  br_err *err;
} tc_reader;

/* Reads a field header; returns its type (TC_STOP at the end of the struct), sets *id from the
 * previous id in *last. Returns -1 on error. */
int tc_field(tc_reader *r, int16_t *last, int16_t *id);
int tc_varint(tc_reader *r, uint64_t *v);
int tc_i64(tc_reader *r, int64_t *v); /* zigzag varint */
int tc_i32(tc_reader *r, int32_t *v); /* zigzag varint within int32 */
int tc_binary(tc_reader *r, const uint8_t **p, size_t *len);
/* List/set header: element type and count (count checked against remaining bytes). */
int tc_list(tc_reader *r, int *elem_type, uint32_t *count);
/* Skips a value of the given type (bounded nesting). */
int tc_skip(tc_reader *r, int type);
/* Reads a value of the given field type as an integer (I16/I32/I64/BYTE/BOOL). */
int tc_int_field(tc_reader *r, int type, int64_t *v);

/* A growing output buffer for the writer side. */
typedef struct tc_buf {
  uint8_t *p;
  size_t len, cap;
  int failed;
} tc_buf;

void tc_buf_put(tc_buf *b, const void *data, size_t len);
void tc_put_varint(tc_buf *b, uint64_t v);
/* Field header for field id (delta from *last), type. */
void tc_put_field(tc_buf *b, int16_t *last, int16_t id, int type);
void tc_put_i64_field(tc_buf *b, int16_t *last, int16_t id, int64_t v);
void tc_put_i32_field(tc_buf *b, int16_t *last, int16_t id, int32_t v);
void tc_put_binary_field(tc_buf *b, int16_t *last, int16_t id, const void *p, size_t len);
void tc_put_list(tc_buf *b, int elem_type, uint32_t count);
void tc_put_zigzag(tc_buf *b, int64_t v);
void tc_put_stop(tc_buf *b);

/* ---- Footer model (only what the reader needs) ---- */

typedef struct pq_chunk {
  int32_t type, codec;
  int64_t num_values;
  int64_t total_compressed_size;
  int64_t total_uncompressed_size; /* 0 when absent */
  int64_t data_page_offset;
  int64_t dictionary_page_offset; /* -1 when absent */
} pq_chunk;

typedef struct pq_schema_el {
  int32_t type; /* -1 for a group */
  int32_t type_length;
  int32_t repetition; /* 0 required, 1 optional, 2 repeated; -1 absent (root) */
  int32_t num_children;
  int32_t converted_type; /* -1 absent */
  char *name;
} pq_schema_el;

typedef struct pq_leaf {
  char *path;
  int32_t type, type_length, converted_type;
  int max_def, max_rep;
} pq_leaf;

typedef struct pq_meta {
  int64_t num_rows;
  pq_schema_el *schema;
  uint32_t nschema;
  pq_leaf *leaves;
  uint32_t nleaves;
  uint32_t nrow_groups;
  int64_t *rg_rows; /* [nrow_groups] */
  pq_chunk *chunks; /* [nrow_groups * nleaves], row-major */
} pq_meta;

/* Decodes a serialized FileMetaData; checks schema shape, types and the chunk count of each row
 * group. 0, or -1 with err. The model owns its memory: free with pq_meta_free. */
int pq_meta_decode(const uint8_t *buf, size_t len, pq_meta *m, br_err *err);
void pq_meta_free(pq_meta *m);

/* Page header (subset). */
typedef struct pq_page_header {
  int32_t type;
  int32_t uncompressed_size, compressed_size;
  int32_t num_values, encoding, def_encoding, rep_encoding;
  int32_t num_nulls, num_rows, def_len, rep_len; /* v2 */
  int is_compressed;                             /* v2, default 1 */
  int has_data, has_dict, has_v2;
} pq_page_header;

/* Decodes a page header at buf; *used gets its serialized size. */
int pq_page_header_decode(const uint8_t *buf, size_t len, pq_page_header *h, size_t *used,
                          br_err *err);

/* ---- Encodings ---- */

/* RLE / bit-packed hybrid decoder over [p, end) with bit width bw (0..32). */
typedef struct pq_rle {
  const uint8_t *p, *end;
  int bw;
  uint32_t rle_left; /* values left in the current RLE run */
  uint32_t rle_value;
  uint32_t bp_left;  /* values left in the current bit-packed run */
  const uint8_t *bp; /* start of the bit-packed run */
  const uint8_t *bp_end;
  uint64_t bp_pos; /* next value index within it */
} pq_rle;

void pq_rle_init(pq_rle *d, const uint8_t *p, size_t len, int bw);
/* Fills out[0..n); -1 when the data runs out or is malformed. */
int pq_rle_get(pq_rle *d, uint32_t *out, size_t n);
/* Appends an RLE/bit-packed encoding of vals[0..n) with bit width bw (<= 8) to b. */
void pq_rle_encode(tc_buf *b, const uint8_t *vals, size_t n, int bw);

/* DELTA_BINARY_PACKED decoder, value by value. */
typedef struct pq_dbp {
  const uint8_t *p, *end;
  uint64_t block_size, nmini, per_mini, total, emitted;
  uint64_t last;
  int64_t min_delta;
  uint32_t mini_idx;     /* current miniblock in the block */
  uint32_t in_mini;      /* values read from the current miniblock */
  const uint8_t *widths; /* bit widths of the current block */
  const uint8_t *mini;   /* current miniblock data */
  int width;             /* bit width of the current miniblock */
  int in_block;
} pq_dbp;

/* Reads the header; more than max_total values is an error (bounds the work). */
int pq_dbp_init(pq_dbp *d, const uint8_t *p, size_t len, uint64_t max_total, br_err *err);
/* Next value (wrapping 64-bit arithmetic). -1 at the end or on malformed data. */
int pq_dbp_next(pq_dbp *d, uint64_t *v, br_err *err);
/* Consumes the rest of the stream; *end gets the first byte after it. */
int pq_dbp_skip_all(pq_dbp *d, const uint8_t **end, br_err *err);

/* ---- Codecs ---- */

/* Decompresses exactly out_len bytes into out (which the caller sized from the page header).
 * Any other size, or corrupt input, is an error. */
int pq_decompress(int codec, const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len,
                  br_err *err);
/* Appends to chunk a data page v1 of nvalues values (PLAIN, RLE levels) whose uncompressed
 * bytes are body: the compressed body under its page header. *uncompressed grows by the page's
 * uncompressed size (header included), as the column chunk metadata counts it. 0, or -1 + err. */
int pq_put_data_page_v1(tc_buf *chunk, int codec, const tc_buf *body, int32_t nvalues,
                        int64_t *uncompressed, br_err *err);

/* Appends a ColumnChunk struct (file offset, then its ColumnMetaData) for a chunk of pages as
 * pq_put_data_page_v1 writes them (PLAIN values, RLE levels) of column `name` at byte offset. */
void pq_put_column_chunk(tc_buf *o, int32_t type, const char *name, int codec, int64_t num_values,
                         int64_t uncompressed, int64_t compressed, int64_t offset);

/* The last 8 bytes of a Parquet file: the footer's length, little-endian, and "PAR1". */
void pq_file_tail(uint32_t footer_len, uint8_t tail[8]);

/* Compresses in into a malloc'd *out. */
int pq_compress(int codec, const uint8_t *in, size_t in_len, uint8_t **out, size_t *out_len,
                br_err *err);

/* ---- Chunk decoding (also the fuzz entry point) ---- */

typedef struct pq_scratch {
  uint8_t *page; /* decompressed page */
  size_t page_cap;
  uint8_t *dict; /* decompressed dictionary page (owned) */
  size_t dict_cap;
  struct pq_dict_ent {
    uint32_t off, len;
  } * dict_ents;
  size_t dict_cap_ents;
  uint8_t *prev; /* DELTA_BYTE_ARRAY: previous value */
  size_t prev_cap;
} pq_scratch;

void pq_scratch_free(pq_scratch *s);

/* Decodes the pages of one column chunk held in buf[0..len) for leaf col with codec, until
 * num_values level entries are seen; *rows gets the number of records (rep level 0).
 * Returns 0, the callback's non-zero value, or -1 with err. */
int pq_decode_chunk(const pq_leaf *col, int codec, const uint8_t *buf, size_t len,
                    int64_t num_values, pq_scratch *s, br_parquet_value_fn fn, void *ud,
                    int64_t *rows, br_err *err);

/* ---- Opened files ---- */

struct br_parquet_file {
  br_source *src;
  pq_meta m;
  uint64_t data_end; /* first byte of the footer */
  uint8_t *chunk;    /* reused column-chunk buffer */
  size_t chunk_cap;
};

/* Where the bytes of row group g's chunk of leaf i lie (dictionary page included), checked to be
 * inside the data area. 0, or -1 with err. */
int pq_chunk_range(const br_parquet_file *f, uint32_t g, size_t i, uint64_t *start, uint64_t *len,
                   br_err *err);
/* Reads and decodes row group g's chunk of leaf i, calling fn per value (see
 * br_parquet_read_column); checks the row count. 0, the callback's value, or -1 with err. */
int pq_read_chunk(br_parquet_file *f, uint32_t g, size_t i, pq_scratch *s, br_parquet_value_fn fn,
                  void *ud, br_err *err);

#endif
