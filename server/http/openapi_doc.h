/* The OpenAPI description (conf/openapi.json), compiled in: tools/openapi-embed.sh generates it. */
#ifndef BLOBREF_OPENAPI_DOC_H
#define BLOBREF_OPENAPI_DOC_H

#include <stddef.h>

/* Generated ($(BUILD_ROOT)/gen/openapi.c), linked into blobrefd alone: the document's bytes
 * (static, not NUL-terminated), their length and ETag ("\"<16 hex of their SHA-256>\""). */
extern const unsigned char openapi_json[];
extern const size_t openapi_json_len;
extern const char openapi_etag[];

#endif
