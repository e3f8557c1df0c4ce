/* HTTP helpers of the Iceberg reader (private): plain GETs and the REST catalog load-table call. */
#ifndef BLOBREF_ICEBERG_REST_H
#define BLOBREF_ICEBERG_REST_H

#include "iceberg/internal.h"

/* GETs url (http/https) with an optional bearer token into a malloc'd NUL-terminated buffer of at
 * most max bytes; *status is the HTTP status. Returns 0 (any status), or -1 on transport errors. */
int ice_http_get(const char *url, const char *token, size_t max, uint8_t **out, size_t *outlen,
                 long *status, br_err *err);

/* Loads the current metadata of "rest:URI#ns1.ns2.table" through the Iceberg REST catalog. */
int ice_rest_load(const char *spec, const char *token, ice_meta *m, br_err *err);

#endif
