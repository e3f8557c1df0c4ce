/* blobref's own Parquet subset: read every value of one leaf column, and write flat files. */
#ifndef BLOBREF_PARQUET_H
#define BLOBREF_PARQUET_H

#include "blobref/source.h"

/* Physical types, numbered as in parquet.thrift. */
enum br_parquet_type {
  BR_PQ_BOOLEAN = 0,
  BR_PQ_INT32 = 1,
  BR_PQ_INT64 = 2,
  BR_PQ_INT96 = 3,
  BR_PQ_FLOAT = 4,
  BR_PQ_DOUBLE = 5,
  BR_PQ_BYTE_ARRAY = 6,
  BR_PQ_FIXED_LEN_BYTE_ARRAY = 7,
};

/* Compression codecs, numbered as in parquet.thrift. */
enum br_parquet_codec {
  BR_PQ_UNCOMPRESSED = 0,
  BR_PQ_SNAPPY = 1,
  BR_PQ_GZIP = 2,
  BR_PQ_BROTLI = 4,
  BR_PQ_LZ4 = 5, /* read only: Hadoop framing or raw block */
  BR_PQ_ZSTD = 6,
  BR_PQ_LZ4_RAW = 7,
};

/* Hard limits of the reader (inputs beyond them are errors, never allocations). */
#define BR_PQ_MAX_FOOTER (64u << 20)      /* serialized FileMetaData */
#define BR_PQ_MAX_PAGE (256u << 20)       /* one page, compressed or not */
#define BR_PQ_MAX_CHUNK (1024ull << 20)   /* one column chunk, read with one pread */
#define BR_PQ_MAX_PAGE_VALUES (64u << 20) /* num_values of one page */

/* Called once per row of the column, in row order: the value's bytes, or is_null=1 (data=NULL,
 * len=0). For BYTE_ARRAY/FIXED_LEN_BYTE_ARRAY the raw bytes; INT32/INT64/FLOAT/DOUBLE: the 4 or 8
 * little-endian bytes; BOOLEAN: 1 byte 0/1; INT96: 12 bytes. The pointer is valid only during
 * the call. Return 0 to go on; any other value stops the read and is returned by
 * br_parquet_read_column. For a nested or repeated column: once per leaf value or null. */
typedef int (*br_parquet_value_fn)(void *ud, const uint8_t *data, size_t len, int is_null);

/* Reads every value of the leaf column whose dotted path is column_path (e.g. "image_sha256" or
 * "a.b.c") across all row groups. Returns 0 on success, the callback's non-zero value if it
 * stopped, or -1 with err filled for any malformed/unsupported input (never a crash, never an
 * unbounded allocation). Reads only the footer and the needed column chunks through src->pread;
 * src is borrowed. */
int br_parquet_read_column(br_source *src, const char *column_path, br_parquet_value_fn fn,
                           void *ud, br_err *err);

/* An opened file: its footer decoded once, for reading several columns. */
typedef struct br_parquet_file br_parquet_file;

/* A leaf column as the schema describes it. Strings are owned by the file. */
typedef struct br_parquet_column_info {
  const char *path; /* dotted path from the root, e.g. "a.b.c" */
  enum br_parquet_type type;
  int32_t type_length;  /* FIXED_LEN_BYTE_ARRAY width, else 0 */
  int max_def, max_rep; /* definition / repetition level maxima */
  int converted_type;   /* parquet.thrift ConvertedType, or -1 when absent */
} br_parquet_column_info;

/* Reads and checks the footer of src (borrowed; must outlive the file). NULL + err on failure. */
br_parquet_file *br_parquet_open(br_source *src, br_err *err);
void br_parquet_close(br_parquet_file *f);
int64_t br_parquet_num_rows(const br_parquet_file *f);
size_t br_parquet_num_row_groups(const br_parquet_file *f);
size_t br_parquet_num_columns(const br_parquet_file *f);
/* Describes leaf column i (< num_columns); returns 0 or -1 when out of range. */
int br_parquet_column(const br_parquet_file *f, size_t i, br_parquet_column_info *out);
/* The index of the leaf with this dotted path, or -1. */
int br_parquet_find_column(const br_parquet_file *f, const char *path);
/* Like br_parquet_read_column, for leaf column i of an opened file. */
int br_parquet_read_column_at(br_parquet_file *f, size_t i, br_parquet_value_fn fn, void *ud,
                              br_err *err);

/* ---- Writer: flat schema, PLAIN encoding, data page v1, one codec for all columns. ---- */

typedef struct br_parquet_column_spec {
  const char *name;          /* copied */
  enum br_parquet_type type; /* BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY, INT32, INT64, BOOLEAN, FLOAT,
                                DOUBLE */
  int32_t type_length;       /* FIXED_LEN_BYTE_ARRAY width (1..65536) */
  int optional;              /* 1: nulls allowed */
  int utf8;                  /* BYTE_ARRAY annotated as a UTF-8 string */
  int timestamp_ms;          /* INT64 annotated as TIMESTAMP(MILLIS, UTC): ms since the epoch */
} br_parquet_column_spec;

typedef struct br_parquet_write_options {
  enum br_parquet_codec codec; /* UNCOMPRESSED, SNAPPY, GZIP, BROTLI, ZSTD or LZ4_RAW */
  uint32_t row_group_rows;     /* rows per row group; 0 = 1048576 */
  uint32_t page_bytes;         /* target uncompressed page size; 0 = 1 MiB */
} br_parquet_write_options;

/* One cell of a row: bytes as in br_parquet_value_fn, or is_null. */
typedef struct br_parquet_value {
  const uint8_t *data;
  size_t len;
  int is_null;
} br_parquet_value;

/* Sink for the writer: appends len bytes; 0 or -1 with err filled. */
typedef int (*br_parquet_write_fn)(void *ud, const void *buf, size_t len, br_err *err);

typedef struct br_parquet_writer br_parquet_writer;

/* Starts a file with ncols columns (specs copied); writes the leading magic through out. */
br_parquet_writer *br_parquet_writer_new(const br_parquet_column_spec *cols, size_t ncols,
                                         const br_parquet_write_options *opts,
                                         br_parquet_write_fn out, void *out_ud, br_err *err);
/* Appends one row: vals[ncols]. -1 on a type/size mismatch, a null in a required column or a
 * sink error; the writer is then unusable (free it). */
int br_parquet_writer_row(br_parquet_writer *w, const br_parquet_value *vals, br_err *err);
/* Flushes the last row group and writes the footer. */
int br_parquet_writer_finish(br_parquet_writer *w, br_err *err);
void br_parquet_writer_free(br_parquet_writer *w);

/* A br_parquet_write_fn over a stdio FILE * passed as ud. */
int br_parquet_write_stdio(void *ud, const void *buf, size_t len, br_err *err);

/* ---- Column replacement: a copy of a file with one column's values replaced by their SHA-256,
 * every other column chunk copied byte for byte (blobref extract-parquet). ---- */

#define BR_PQ_SHA256_LEN 32

/* One row group's values of the replaced column, handed over before its new chunk is written. */
typedef struct br_parquet_rg_values {
  uint32_t row_group;
  int64_t first_row;            /* row number in the file of vals[0] */
  size_t n;                     /* rows in the row group */
  const br_parquet_value *vals; /* [n] in row order, nulls included; borrowed during the call */
  const uint8_t (*digests)[BR_PQ_SHA256_LEN]; /* [n]: SHA-256 of vals[i] (zero for a null) */
} br_parquet_rg_values;

/* Returns 0 to go on; any other value stops the rewrite (nothing more is written) and is returned
 * by br_parquet_replace_column. */
typedef int (*br_parquet_rg_fn)(void *ud, const br_parquet_rg_values *rg, br_err *err);

typedef struct br_parquet_replace_options {
  size_t column;        /* leaf index of a top-level, non-repeated BYTE_ARRAY column */
  const char *new_name; /* name of the new column; NULL keeps the old one */
  int binary;           /* 1: FIXED_LEN_BYTE_ARRAY(32); 0: 64 lowercase hex digits as a string */
  br_parquet_rg_fn fn;  /* called once per row group, in order */
  void *ud;
} br_parquet_replace_options;

/* Writes through out a copy of f in which column o->column holds the SHA-256 of each value (nulls
 * stay null, definition levels kept; PLAIN, data page v1, the chunk's own codec, LZ4 written as
 * LZ4_RAW). Every other column chunk is copied as it is (compressed pages, any type, codec or
 * nesting); the footer is re-encoded with the new offsets, the new column's schema element and
 * chunk metadata. Row groups, row order, key/value metadata and column orders are kept; dropped:
 * page indexes and bloom filters (their offsets would be wrong; both are optional), statistics of
 * the replaced column, and the ARROW:schema key (it would describe the old column). Memory: one
 * row group's values of the replaced column. Returns 0, the callback's non-zero value, or -1 with
 * err. */
int br_parquet_replace_column(br_parquet_file *f, const br_parquet_replace_options *o,
                              br_parquet_write_fn out, void *out_ud, br_err *err);

#endif
