/* Values that reach HTTP response headers: one grammar for content types, store keys, reasons
 * and request ids, and the list of media types a browser may render inline. Pure. */
#ifndef BLOBREF_HEADER_H
#define BLOBREF_HEADER_H

#include <stddef.h>

#define BR_MAX_HEADER_CONTENT_TYPE 255 /* = BR_MAX_CONTENT_TYPE, what a record holds */
#define BR_MAX_REQUEST_ID 64

/* Checks ct against RFC 9110 media-type: token "/" token *( OWS ";" OWS token "=" ( token /
 * quoted-string ) ), printable ASCII only (no tab), at most BR_MAX_HEADER_CONTENT_TYPE bytes, so
 * no CR, LF or other control character. Returns NULL when it is one, else why not (a static
 * string). */
const char *br_header_content_type_check(const char *ct);

/* Checks free text that is echoed (a hold reason, a store key in a Location): 1..max bytes, no
 * control character (below 0x20, or 0x7f); UTF-8 bytes are left alone. NULL when fine, else why
 * not (a static string). */
const char *br_header_text_check(const char *v, size_t max);

/* Is v a request id we may echo in X-Request-Id: 1..BR_MAX_REQUEST_ID bytes of letters, digits
 * and "-_.:"? (Anything else is replaced by a generated id.) */
int br_header_request_id_ok(const char *v);

/* Is the media type of ct (parameters and case ignored) one a browser shows without running
 * anything: raster images (not SVG), audio, video, PDF, plain text, JSON, octet-stream, Parquet
 * and a few other data formats? Everything else (HTML, SVG, XML, JavaScript, unknown types, NULL
 * or "") is active: served as an attachment. */
int br_content_type_is_passive(const char *ct);

/* The media type a file or key name's extension names (image/jpeg for "a/x.JPG"; only the last
 * '/'-separated part counts), or NULL when it has no extension the table knows. The first rule
 * of detection, for the CLI's uploads and the server's imports; libmagic is the second. */
const char *br_content_type_for_name(const char *name);

#endif
