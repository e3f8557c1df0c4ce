/* The grammar of values that reach response headers, and the passive media types. Pure. */
#include "blobref/header.h"

#include <string.h>
#include <strings.h>

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
