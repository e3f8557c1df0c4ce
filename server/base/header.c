/* The grammar of values that reach response headers, and the passive media types. Pure. */
#include "blobref/header.h"

#include <string.h>
#include <strings.h>

/* RFC 9110 5.6.2 tchar. */
static int is_tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Skips a token at *p; returns its length. */
static size_t token(const char **p) {
  const char *s = *p;
  while (is_tchar((unsigned char)**p)) (*p)++;
  return (size_t)(*p - s);
}

static void skip_ows(const char **p) {
  while (**p == ' ') (*p)++; /* a tab is refused before, with the other control characters */
}

/* Skips a quoted-string at *p (printable ASCII and quoted-pairs); 0, or -1 when it is not one. */
static int quoted_string(const char **p) {
  const char *s = *p;
  if (*s++ != '"') return -1;
  for (;; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"') break;
    if (c == '\\') c = (unsigned char)*++s;
    if (c < 0x20 || c > 0x7e) return -1;
  }
  *p = s + 1;
  return 0;
}

const char *br_header_content_type_check(const char *ct) {
  if (!ct || !*ct) return "the content type is empty";
  if (strnlen(ct, BR_MAX_HEADER_CONTENT_TYPE + 1) > BR_MAX_HEADER_CONTENT_TYPE)
    return "the content type is over 255 bytes";
  for (const char *q = ct; *q; q++)
    if ((unsigned char)*q < 0x20 || (unsigned char)*q >= 0x7f)
      return "the content type holds a control or non-ASCII character";
  const char *p = ct;
  if (!token(&p) || *p++ != '/' || !token(&p)) return "the content type is not type/subtype";
  for (;;) {
    skip_ows(&p);
    if (!*p) return NULL;
    if (*p++ != ';') return "the content type has text after type/subtype that is not a parameter";
    skip_ows(&p);
    if (!*p) return NULL; /* a trailing ';' (RFC 9110 allows empty parameters) */
    if (*p == ';') continue;
    if (!token(&p) || *p++ != '=') return "a content type parameter is not name=value";
    if (*p == '"' ? quoted_string(&p) < 0 : !token(&p))
      return "a content type parameter's value is not a token or a quoted string";
  }
}

const char *br_header_text_check(const char *v, size_t max) {
  if (!v || !*v) return "it is empty";
  if (strnlen(v, max + 1) > max) return "it is too long";
  for (; *v; v++)
    if ((unsigned char)*v < 0x20 || *v == 0x7f) return "it holds a control character";
  return NULL;
}

int br_header_request_id_ok(const char *v) {
  size_t n = v ? strnlen(v, BR_MAX_REQUEST_ID + 1) : 0;
  if (n == 0 || n > BR_MAX_REQUEST_ID) return 0;
  for (; *v; v++)
    if (!((*v >= '0' && *v <= '9') || ((*v | 32) >= 'a' && (*v | 32) <= 'z') || strchr("-_.:", *v)))
      return 0;
  return 1;
}

/* Types rendered inline; "type/" entries admit every subtype of type (except those in
 * active_subtypes). */
static const char *const passive_types[] = {
    "image/",
    "audio/",
    "video/",
    "application/pdf",
    "application/octet-stream",
    "application/json",
    "application/parquet",
    "application/vnd.apache.parquet",
    "application/x-parquet",
    "application/avro",
    "application/gzip",
    "application/zip",
    "application/zstd",
    "application/x-tar",
    "text/plain",
    "text/csv",
};

/* Subtypes under a passive "type/" prefix that can still run script or markup. */
static const char *const active_subtypes[] = {
    "image/svg+xml", "image/svg",
    "video/vnd.mpegurl", /* an HLS playlist, text a player may fetch more from: keep it out */
};

/* Copies ct's media type (before ';', trimmed) into out; 0, or -1 when empty or too long. */
static int media_type(const char *ct, char *out, size_t outlen) {
  if (!ct) return -1;
  while (*ct == ' ' || *ct == '\t') ct++;
  size_t n = strcspn(ct, ";");
  while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t')) n--;
  if (!n || n >= outlen) return -1;
  memcpy(out, ct, n);
  out[n] = '\0';
  return 0;
}

int br_content_type_is_passive(const char *ct) {
  char mt[128];
  if (media_type(ct, mt, sizeof mt) < 0) return 0;
  for (size_t i = 0; i < sizeof active_subtypes / sizeof *active_subtypes; i++)
    if (!strcasecmp(mt, active_subtypes[i])) return 0;
  size_t mlen = strlen(mt);
  if (mlen > 4 && !strcasecmp(mt + mlen - 4, "+xml")) return 0; /* image/foo+xml and the like */
  for (size_t i = 0; i < sizeof passive_types / sizeof *passive_types; i++) {
    const char *p = passive_types[i];
    size_t plen = strlen(p);
    if (p[plen - 1] == '/') {
      if (mlen > plen && !strncasecmp(mt, p, plen) && !strchr(mt + plen, '/')) return 1;
    } else if (!strcasecmp(mt, p)) {
      return 1;
    }
  }
  return 0;
}

/* One table for the CLI's uploads and the server's imports. */
const char *br_content_type_for_name(const char *name) {
  static const struct {
    const char *ext, *type;
  } types[] = {
      {"jpg", "image/jpeg"},      {"jpeg", "image/jpeg"},
      {"png", "image/png"},       {"gif", "image/gif"},
      {"webp", "image/webp"},     {"avif", "image/avif"},
      {"heic", "image/heic"},     {"tif", "image/tiff"},
      {"tiff", "image/tiff"},     {"bmp", "image/bmp"},
      {"svg", "image/svg+xml"},   {"ico", "image/x-icon"},
      {"mp3", "audio/mpeg"},      {"wav", "audio/wav"},
      {"flac", "audio/flac"},     {"ogg", "audio/ogg"},
      {"opus", "audio/opus"},     {"m4a", "audio/mp4"},
      {"mp4", "video/mp4"},       {"webm", "video/webm"},
      {"mov", "video/quicktime"}, {"mkv", "video/x-matroska"},
      {"pdf", "application/pdf"}, {"json", "application/json"},
      {"txt", "text/plain"},      {"csv", "text/csv"},
      {"html", "text/html"},      {"htm", "text/html"},
      {"xml", "application/xml"}, {"zip", "application/zip"},
      {"gz", "application/gzip"}, {"parquet", "application/vnd.apache.parquet"},
  };
  const char *slash = strrchr(name, '/');
  const char *base = slash ? slash + 1 : name;
  const char *dot = strrchr(base, '.');
  if (!dot || dot == base || !dot[1]) return NULL;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (!strcasecmp(dot + 1, types[i].ext)) return types[i].type;
  return NULL;
}
