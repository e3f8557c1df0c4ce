/* Reading Iceberg tables whose files live in S3: an opener for br_iceberg_table_config that maps
 * "s3://BUCKET/KEY" (and s3a://, s3n://) to ranged GETs with a configured s3 store's endpoint and
 * credentials, so that a data file costs its footer and the hash column chunk, not its size. */
#ifndef BLOBREF_ICEBERG_S3_H
#define BLOBREF_ICEBERG_S3_H

#include "blobref/iceberg.h"
#include "blobref/store.h"

typedef struct br_iceberg_s3 br_iceberg_s3;

/* An opener using store's endpoint, region and credentials for whatever bucket a path names.
 * store must be of kind s3; it is copied (its strings must outlive the opener). */
br_iceberg_s3 *br_iceberg_s3_new(const br_store_config *store, br_err *err);
void br_iceberg_s3_free(br_iceberg_s3 *o);

/* A br_iceberg_open_fn (ud = the br_iceberg_s3): s3 URLs through S3, anything else through
 * br_iceberg_open_local. */
br_source *br_iceberg_open_s3(void *ud, const char *path, br_err *err);

#endif
