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

/* Lists the objects whose URL starts with url_prefix ("s3://BUCKET/PREFIX", through the bucket's
 * store): fn gets each key (without the bucket) and size; its non-zero value stops the listing and
 * is returned. Returns 0, -1 + err, or fn's value. (Delta tables list their _delta_log/.) */
int br_iceberg_s3_list(br_iceberg_s3 *o, const char *url_prefix, br_store_list_fn fn, void *ud,
                       br_err *err);

#endif
