/* Iceberg table reader: which SHA-256 hashes (and which data files) a table's retained snapshots
 * reference. Offline; reads metadata.json, Avro manifest lists and manifests, and Parquet data. */
#ifndef BLOBREF_ICEBERG_H
#define BLOBREF_ICEBERG_H

#include <stdint.h>

#include "blobref/common.h"
#include "blobref/config.h" /* enum br_table_form: BR_FORM_HEX | BR_FORM_BINARY | BR_FORM_URL */
#include "blobref/source.h"

/* --- a set of 32-byte SHA-256 digests (open addressing) ----------------------------------- */

typedef struct br_hashset br_hashset;

/* Creates an empty set. Returns NULL when out of memory. */
br_hashset *br_hashset_new(void);
void br_hashset_free(br_hashset *set); /* NULL is allowed */
/* Adds a digest (copied). Returns 1 if it was new, 0 if already present, -1 out of memory. */
int br_hashset_add(br_hashset *set, const uint8_t digest[BR_SHA256_LEN]);
/* 1 if present, else 0. */
int br_hashset_contains(const br_hashset *set, const uint8_t digest[BR_SHA256_LEN]);
size_t br_hashset_count(const br_hashset *set);
/* Returns a malloc'd array of count*32 bytes, the digests in ascending byte order (= ascending hex
 * order); *count is set. The caller frees it. NULL when out of memory (or when the set is empty,
 * with *count = 0). */
uint8_t *br_hashset_sorted(const br_hashset *set, size_t *count);

/* --- extracting a hash from one column value ----------------------------------------------- */

/* Parses one column value in the given form into digest:
 *   BR_FORM_HEX:    exactly 64 hex digits (either case), optionally behind "sha256:";
 *   BR_FORM_BINARY: exactly 32 bytes;
 *   BR_FORM_URL:    the last run of exactly 64 hex digits bounded by non-hex characters (or the
 *                   ends of the value), e.g. "https://cdn/x/sha256/ab/cd/<hex>.jpg".
 * Returns 0, or -1 if the value is not a hash in that form. */
int br_iceberg_parse_hash(enum br_table_form form, const uint8_t *data, size_t len,
                          uint8_t digest[BR_SHA256_LEN]);

/* --- reading a table ----------------------------------------------------------------------- */

/* Opens a data/manifest/metadata file after path mapping (rewrites applied, relative paths made
 * absolute). path is either an absolute local path or a URL with a scheme ("s3://b/k"). Returns
 * a source owned by the caller, or NULL with err filled. */
typedef br_source *(*br_iceberg_open_fn)(void *ud, const char *path, br_err *err);

/* The default opener: local absolute paths only; any scheme ("s3://", "hdfs://", ...) is refused
 * with a clear error. A custom opener (e.g. S3 through a store) may delegate local paths here. */
br_source *br_iceberg_open_local(void *ud, const char *path, br_err *err);

/* A prefix rewrite: a recorded path starting with `from` has it replaced by `to`. */
typedef struct br_iceberg_rewrite {
  const char *from;
  const char *to;
} br_iceberg_rewrite;

/* Everything needed to read one table. Strings are borrowed for the duration of the call.
 * location: a Hadoop table folder (holding metadata/), a metadata.json path (plain or gzip'd),
 *           a "file://", "s3://" (through open) or "http(s)://" URL of a metadata.json, or
 *           "rest:URI#namespace.table" for an Iceberg REST catalog (namespace parts split on '.';
 *           the last part is the table).
 * Rewrites apply in order to every recorded path (first match wins). When none matches and the
 * table was given as a local folder or metadata path, a path under the table's own recorded
 * `location` is mapped into that folder. Remaining relative paths resolve against the table
 * folder (an error for REST or remote tables). */
typedef struct br_iceberg_table_config {
  const char *location;
  const char *column; /* Parquet column path, e.g. "image_sha256" or "a.b" */
  enum br_table_form form;
  const br_iceberg_rewrite *rewrites;
  size_t nrewrites;
  br_iceberg_open_fn open; /* NULL = br_iceberg_open_local */
  void *open_ud;
  const char *token;   /* REST catalog bearer token, or NULL */
  int fail_on_invalid; /* non-zero: a non-null value that is not a hash is an error */
} br_iceberg_table_config;

typedef struct br_iceberg_stats {
  uint64_t snapshots;      /* retained snapshots walked */
  uint64_t manifest_lists; /* manifest list files read */
  uint64_t manifests;      /* distinct manifests read */
  uint64_t data_files;     /* distinct live data files (read once each) */
  uint64_t delete_files;   /* live delete files / deletion vectors seen (not read) */
  uint64_t values;         /* non-null column values read */
  uint64_t nulls;          /* null values skipped */
  uint64_t invalid;        /* non-null values that are not a hash in the configured form */
  char first_invalid[256]; /* "<data file>: <value prefix>" of the first invalid value, or "" */
  uint64_t count_warnings; /* manifests holding more entries than their manifest list counts */
  char first_warning[512]; /* the first of those, or "" */
} br_iceberg_stats;

/* Adds to out every hash that the configured column holds in any live data file of any retained
 * snapshot (every entry of `snapshots` in the current metadata). Null values are skipped; invalid
 * values are counted in stats (or fail the call with fail_on_invalid). Fails closed: returns -1
 * with err filled if any metadata, manifest list, manifest or data file cannot be read completely,
 * if a live data file is not Parquet, or if a path cannot be opened; out may then hold a partial
 * set that the caller must not use. stats may be NULL. Returns 0 on success. */
int br_iceberg_collect_refs(const br_iceberg_table_config *cfg, br_hashset *out,
                            br_iceberg_stats *stats, br_err *err);

/* Called once per (retained snapshot, live data file): path is the mapped path, valid only
 * during the call. Return non-zero to stop; that value is returned by br_iceberg_list_files. */
typedef int (*br_iceberg_file_fn)(void *ud, int64_t snapshot_id, const char *path);

/* Walks metadata and manifests (not the Parquet files) and reports every live data file of every
 * retained snapshot. column and form in cfg are not used. Returns 0, -1 with err filled (same fail
 * closed rules as br_iceberg_collect_refs), or the callback's non-zero value. */
int br_iceberg_list_files(const br_iceberg_table_config *cfg, br_iceberg_file_fn fn, void *ud,
                          br_iceberg_stats *stats, br_err *err);

/* Called once per retained snapshot with its id and commit time (ms since the epoch, -1 when the
 * table does not record one). Non-zero stops; that value is returned. */
typedef int (*br_iceberg_snapshot_fn)(void *ud, int64_t snapshot_id, int64_t timestamp_ms);

/* Reads the table's metadata only and calls fn per retained snapshot (timestamp-ms). Returns 0,
 * -1 + err, or fn's non-zero value. */
int br_iceberg_list_snapshots(const br_iceberg_table_config *cfg, br_iceberg_snapshot_fn fn,
                              void *ud, br_err *err);

/* --- what reconcile needs: the live data files, then each file's hashes ---------------------- */

/* One distinct live data file of the retained snapshots, with what its manifest records. */
/* Data file formats as the manifest's file_format names them; 0: another name, the reader then
 * goes by the file's magic (PAR1 or ORC). */
enum { BR_ICEBERG_PARQUET = 1, BR_ICEBERG_ORC = 2 };

typedef struct br_iceberg_data_file {
  const char *path;     /* mapped path, valid during the call */
  int parquet;          /* format: BR_ICEBERG_PARQUET, BR_ICEBERG_ORC or 0 (see above) */
  int64_t file_size;    /* file_size_in_bytes, -1 if not recorded */
  int64_t record_count; /* record_count, -1 if not recorded */
} br_iceberg_data_file;
typedef int (*br_iceberg_data_file_fn)(void *ud, const br_iceberg_data_file *f);

/* Walks metadata and manifests (fail closed, as br_iceberg_list_files) and calls fn once per
 * distinct live data file. Returns 0, -1 + err, or fn's non-zero value. */
int br_iceberg_walk_data_files(const br_iceberg_table_config *cfg, br_iceberg_data_file_fn fn,
                               void *ud, br_iceberg_stats *stats, br_err *err);

/* Called per hash a data file holds (duplicates included); non-zero stops with an error (the
 * callback fills no message: the caller knows why it stopped). */
typedef int (*br_iceberg_hash_fn)(void *ud, const uint8_t digest[BR_SHA256_LEN]);

/* Reads cfg->column of one data file completely (fail closed, as br_iceberg_collect_refs).
 * Returns 0 or -1 + err. stats (may be NULL) counts values, nulls and invalid ones. */
int br_iceberg_read_file_hashes(const br_iceberg_table_config *cfg, const br_iceberg_data_file *f,
                                br_iceberg_hash_fn fn, void *ud, br_iceberg_stats *stats,
                                br_err *err);

#endif
