/* Delta Lake table reader: the data and change-data files a table's reconstructable versions
 * reference, found from `_delta_log/` alone (JSON commits, classic, multi-part and v2
 * checkpoints), and the hashes the configured column holds in them. */
#ifndef BLOBREF_DELTA_H
#define BLOBREF_DELTA_H

#include "blobref/iceberg.h"

/* The same table config as Iceberg: location is the table folder (local, "file://" or "s3://"
 * through cfg->open / listing), column and form the hash column, rewrites apply to absolute URIs
 * recorded in the log. stats: snapshots = retained versions, manifests = log files read,
 * data_files = distinct referenced files, delete_files = deletion vectors seen (never read). */

/* 1 if location names a local folder holding `_delta_log/` (or a "file://" URL of one), else 0.
 * An s3:// location is one when br_delta_s3_is_table says so. */
int br_delta_is_local_table(const char *location);

/* Lists `_delta_log/` of a table and returns the names in it (malloc'd array of malloc'd names).
 * Used by the reader through cfg; a custom lister serves s3:// tables. */
typedef int (*br_delta_list_fn)(void *ud, const char *log_dir, char ***names, size_t *n,
                                br_err *err);

/* The local lister (opendir). ud is unused. */
int br_delta_list_local(void *ud, const char *log_dir, char ***names, size_t *n, br_err *err);

/* A lister for s3:// tables: ud is a br_iceberg_s3 (iceberg_s3.h); names directly under
 * `_delta_log/` (not `_sidecars/`). */
int br_delta_list_s3(void *ud, const char *log_dir, char ***names, size_t *n, br_err *err);

/* 1 if the s3:// location (through ud, a br_iceberg_s3) has objects under `_delta_log/`. A listing
 * error answers 0 (the table is then read as Iceberg and fails with that error). */
int br_delta_s3_is_table(void *ud, const char *location);

/* Called once per (retained version, referenced file): the files live in that version and the
 * change-data files that version's commit adds. Same contract as br_iceberg_list_files: the
 * callback's non-zero value stops the walk and is returned. lister NULL = local. */
int br_delta_list_files(const br_iceberg_table_config *cfg, br_delta_list_fn lister, void *list_ud,
                        br_iceberg_file_fn fn, void *ud, br_iceberg_stats *stats, br_err *err);

/* Calls fn once per retained version with its commit time (commitInfo's inCommitTimestamp, else
 * its timestamp; -1 when the commit records none or the version is read from a checkpoint only).
 * Same replay and fail closed rules as br_delta_list_files. Returns 0, -1 + err or fn's value. */
int br_delta_list_versions(const br_iceberg_table_config *cfg, br_delta_list_fn lister,
                           void *list_ud, br_iceberg_snapshot_fn fn, void *ud, br_err *err);

/* Calls fn once per distinct referenced file (every file live in any retained version, and the
 * change-data files of retained commits), after the whole log has been read and checked. Fails
 * closed (-1 + err naming the file or version): a missing commit between the oldest retained
 * version and the latest, an unreadable or truncated checkpoint, an incomplete log, an unknown
 * reader feature, a malformed commit line. Returns 0, -1 or fn's non-zero value. */
int br_delta_walk_data_files(const br_iceberg_table_config *cfg, br_delta_list_fn lister,
                             void *list_ud, br_iceberg_data_file_fn fn, void *ud,
                             br_iceberg_stats *stats, br_err *err);

/* Like br_delta_walk_data_files; before the first fn call, column (BR_DELTA_MAX_COLUMN bytes)
 * receives the physical path of cfg->column under the table's column mapping (the logical one
 * when the schema maps nothing): the column to read in the data files. */
#define BR_DELTA_MAX_COLUMN 1024
int br_delta_walk_data_files_mapped(const br_iceberg_table_config *cfg, br_delta_list_fn lister,
                                    void *list_ud, br_iceberg_data_file_fn fn, void *ud,
                                    char column[BR_DELTA_MAX_COLUMN], br_iceberg_stats *stats,
                                    br_err *err);

/* Adds the hashes cfg->column holds in every referenced file (br_delta_walk_data_files, then
 * br_iceberg_read_file_hashes on each). Returns 0 or -1 + err (out may then be partial). */
int br_delta_collect_refs(const br_iceberg_table_config *cfg, br_delta_list_fn lister,
                          void *list_ud, br_hashset *out, br_iceberg_stats *stats, br_err *err);

#endif
