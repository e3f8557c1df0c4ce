/* Values that reach HTTP response headers: one grammar for content types, store keys, reasons
 * and request ids, and the list of media types a browser may render inline. Pure. */
#ifndef BLOBREF_HEADER_H
#define BLOBREF_HEADER_H

#include <stddef.h>

/* Is the media type of ct (parameters and case ignored) one a browser shows without running
 * anything: raster images (not SVG), audio, video, PDF, plain text, JSON, octet-stream, Parquet
 * and a few other data formats? Everything else (HTML, SVG, XML, JavaScript, unknown types, NULL
 * or "") is active: served as an attachment. */
int br_content_type_is_passive(const char *ct);

#endif
