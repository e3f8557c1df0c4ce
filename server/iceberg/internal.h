/* Private pieces of the Iceberg reader, shared by server/iceberg_*.c, unit tests and fuzzers. */
#ifndef BLOBREF_ICEBERG_INTERNAL_H
#define BLOBREF_ICEBERG_INTERNAL_H

#include <stdint.h>

#include "blobref/iceberg.h"

#define ICE_MAX_PATH 4096                /* longest recorded or mapped path */
#define ICE_MAX_METADATA (64u << 20)     /* metadata.json, after gunzip */
#define ICE_MAX_AVRO_FILE (512ull << 20) /* one manifest list or manifest */
#define ICE_MAX_AVRO_BLOCK (256u << 20)  /* one decompressed Avro block */
#define ICE_MAX_SNAPSHOTS 1000000
#define ICE_MAX_INLINE_MANIFESTS 1000000

/* One retained snapshot from metadata.json. Strings are owned by the ice_meta. */
typedef struct ice_snapshot {
  int64_t id;
  int64_t timestamp_ms; /* timestamp-ms, -1 when absent */
  char *manifest_list;  /* NULL for v1 snapshots with an inline `manifests` list */
  char **manifests;
  size_t nmanifests;
} ice_snapshot;

typedef struct ice_meta {
  int format_version; /* 1, 2 or 3 */
  char *location;     /* the table's recorded location, or NULL */
  ice_snapshot *snapshots;
  size_t nsnapshots;
} ice_meta;

/* Parses metadata.json bytes (plain or gzip'd, detected by the gzip magic). On success fills m
 * (free with ice_meta_free); on failure returns -1 with err filled and m empty. */
int ice_meta_parse(const uint8_t *data, size_t len, ice_meta *m, br_err *err);
void ice_meta_free(ice_meta *m);

/* Parses a metadata file name: "v12.metadata.json", "v12.gz.metadata.json",
 * "00012-<uuid>.metadata.json" (also with ".gz.metadata.json"). Returns the version (>= 0), or -1
 * if the name is not a metadata file. */
int64_t ice_metadata_version(const char *name);

/* Chooses the current metadata file among names (the entries of a metadata/ folder) given the
 * content of version-hint (hint may be NULL when absent). A numeric hint N selects version N and
 * then any consecutive newer versions (N+1, N+2, ... as the Hadoop catalog does); an empty,
 * missing or non-numeric hint selects the highest version. Plain JSON wins over .gz at the same
 * version. Returns the index into names, or -1 with err filled (no metadata file; hinted version
 * missing). */
long ice_pick_metadata(const char *hint, size_t hint_len, char *const *names, size_t n,
                       br_err *err);

/* How recorded paths become openable paths. */
typedef struct ice_pathmap {
  const br_iceberg_rewrite *rewrites;
  size_t nrewrites;
  const char *table_dir; /* local table folder for relative paths, or NULL */
  const char *location;  /* recorded table location (auto-mapped to table_dir), or NULL */
} ice_pathmap;

/* Maps a recorded path: first matching rewrite (string prefix), else the recorded table location
 * when table_dir is set; then "file://" is stripped ("file:///x" -> "/x", "file://localhost/x" ->
 * "/x", "file://rel/x" -> relative "rel/x"); a relative path is joined to table_dir. Paths with
 * another scheme ("s3://...") are returned as they are. Returns 0, or -1 with err filled (too
 * long, relative without a table folder, empty). */
int ice_map_path(const ice_pathmap *pm, const char *raw, char *out, size_t outlen, br_err *err);

/* --- Avro ---------------------------------------------------------------------------------- */

/* One manifest-list entry. path points into decoder memory, valid during the callback only. */
typedef struct ice_manifest_ref {
  const char *path;
  size_t path_len;
  int content;      /* 0 data, 1 deletes (v1: 0) */
  int64_t nentries; /* added + existing + deleted files counts, or -1 if not all recorded */
} ice_manifest_ref;

/* One manifest entry. */
typedef struct ice_entry {
  int status;  /* 0 EXISTING, 1 ADDED, 2 DELETED */
  int content; /* data_file.content: 0 data, 1 position deletes, 2 equality deletes (v1: 0) */
  const char *path;
  size_t path_len;
  const char *format; /* data_file.file_format */
  size_t format_len;
  int64_t file_size;    /* data_file.file_size_in_bytes, -1 if absent */
  int64_t record_count; /* data_file.record_count, -1 if absent */
} ice_entry;

typedef int (*ice_manifest_ref_fn)(void *ud, const ice_manifest_ref *ref, br_err *err);
typedef int (*ice_entry_fn)(void *ud, const ice_entry *e, br_err *err);

/* Decodes an Avro object container file in memory (codecs null, deflate, snappy, zstandard) as a
 * manifest list / a manifest, calling fn per record. Every byte must be accounted for: a bad
 * header, codec, block, sync marker or record is an error. Returns 0, -1 with err filled, or the
 * callback's non-zero value. *nrecords (if non-NULL) receives the record count. */
int ice_read_manifest_list(const uint8_t *data, size_t len, ice_manifest_ref_fn fn, void *ud,
                           uint64_t *nrecords, br_err *err);
int ice_read_manifest(const uint8_t *data, size_t len, ice_entry_fn fn, void *ud,
                      uint64_t *nrecords, br_err *err);

/* --- loading a table ----------------------------------------------------------------------- */

/* Reads the current metadata of cfg->location (folder, file, URL or REST catalog) into m and sets
 * table_dir (malloc'd, or NULL for REST/remote tables). Returns 0 or -1 with err filled. */
int ice_load_table(const br_iceberg_table_config *cfg, ice_meta *m, char **table_dir, br_err *err);

#endif
