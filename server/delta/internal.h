/* Private pieces of the Delta Lake reader, shared by the server/delta sources, unit tests and
 * fuzzers. */
#ifndef BLOBREF_DELTA_INTERNAL_H
#define BLOBREF_DELTA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "blobref/delta.h"

#define DL_MAX_PATH 4096                 /* longest recorded or mapped path */
#define DL_MAX_COMMIT (256u << 20)       /* one commit or JSON checkpoint file */
#define DL_MAX_LOG_FILES 1000000         /* entries of _delta_log/ */
#define DL_MAX_PARTS 100000              /* parts of a multi-part checkpoint */
#define DL_MAX_VERSION 999999999999999LL /* versions beyond this are not Delta log names */

/* What a `_delta_log/` file name is. */
enum dl_name_kind {
  DL_NAME_OTHER = 0,  /* not a commit or checkpoint (.crc, _last_checkpoint, tmp, ...) */
  DL_NAME_COMMIT,     /* N.json */
  DL_NAME_CHECKPOINT, /* N.checkpoint.parquet (classic, maybe v2 content) */
  DL_NAME_MULTIPART,  /* N.checkpoint.PART.NPARTS.parquet */
  DL_NAME_V2_JSON,    /* N.checkpoint.UUID.json */
  DL_NAME_V2_PARQUET, /* N.checkpoint.UUID.parquet */
};

typedef struct dl_name {
  enum dl_name_kind kind;
  int64_t version;
  uint32_t part, nparts; /* DL_NAME_MULTIPART: 1 <= part <= nparts */
} dl_name;

/* Parses a file name of `_delta_log/` (no folder). Versions are 20 digits in practice; any run of
 * 1..20 digits up to DL_MAX_VERSION is accepted. Anything else is DL_NAME_OTHER. */
void dl_parse_name(const char *name, dl_name *out);

/* Percent-decodes src[0..len) once into out (NUL-terminated). Returns the decoded length, or -1
 * when out is too small, a '%' is not followed by two hex digits, or the result holds a NUL. */
long dl_percent_decode(const char *src, size_t len, char *out, size_t outlen);

/* 1 if a reader feature is one this reader handles (it lists files correctly with it), else 0. */
int dl_reader_feature_known(const char *name, size_t len);

/* One action of a commit line or a checkpoint row. Strings point into parser memory, valid only
 * during the callback. */
enum dl_action_kind {
  DL_ADD = 1,
  DL_REMOVE,
  DL_CDC,
  DL_PROTOCOL,
  DL_METADATA,
  DL_SIDECAR,
  DL_COMMITINFO
};
typedef struct dl_action {
  enum dl_action_kind kind;
  const char *path; /* add/remove/cdc/sidecar: the recorded (still encoded) path */
  size_t path_len;
  int64_t size;        /* add/cdc/sidecar size, -1 if absent */
  int64_t records;     /* add: numRecords from stats, -1 if absent */
  int has_dv;          /* add: carries a deletion vector */
  int64_t min_reader;  /* protocol: minReaderVersion */
  const char *cm_mode; /* metaData: delta.columnMapping.mode, NULL if absent */
  const char *schema;  /* metaData: schemaString, NULL if absent */
  int64_t timestamp;   /* commitInfo: inCommitTimestamp, else timestamp (ms), -1 if absent */
} dl_action;
typedef int (*dl_action_fn)(void *ud, const dl_action *a, br_err *err);

/* Parses the JSON lines of a commit (or a v2 JSON checkpoint) and calls fn per add, remove, cdc,
 * protocol, metaData, sidecar and commitInfo action (other actions are skipped). Empty lines are
 * skipped; a line that is not a JSON object, an action whose path is not a non-empty string, or a
 * protocol whose reader version or features this reader does not understand is an error naming the
 * line. Returns 0, -1 + err, or fn's non-zero value. */
int dl_parse_commit(const uint8_t *data, size_t len, dl_action_fn fn, void *ud, br_err *err);

/* Maps a logical column path ("a" or "a.b") to the physical one through a metaData schemaString:
 * each part's field `delta.columnMapping.physicalName` when present (column mapping name/id),
 * else the part itself. A column the schema does not name maps to itself. Returns 0, or -1 when
 * out is too small. */
int dl_physical_column(const char *schema, const char *column, char *out, size_t outlen);

/* Checks a protocol: minReaderVersion 1..3; readerFeatures (at version 3) all known. features may
 * be NULL. Returns 0 or -1 + err naming the first unknown feature. */
int dl_check_protocol(int64_t min_reader, const char *const *features, size_t nfeatures,
                      br_err *err);

#endif
