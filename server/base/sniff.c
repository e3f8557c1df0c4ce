/* Content-type detection from the first bytes of a blob: one libmagic handle under a lock. */
#include "blobref/sniff.h"

#include <magic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "blobref/header.h"

static pthread_mutex_t sniff_lock = PTHREAD_MUTEX_INITIALIZER;
static magic_t sniff_cookie; /* under sniff_lock; NULL until br_sniff_open */

int br_sniff_open(br_err *err) {
  int rc = 0;
  pthread_mutex_lock(&sniff_lock);
  if (sniff_cookie) goto done;
  magic_t m = magic_open(MAGIC_MIME_TYPE | MAGIC_NO_CHECK_COMPRESS | MAGIC_ERROR);
  if (!m) {
    rc = br_fail(err, "content detection: magic_open failed (out of memory?)");
    goto done;
  }
  if (magic_load(m, NULL) != 0) {
    const char *path = getenv("MAGIC");
    rc = br_fail(err, "content detection: cannot load the magic database %s: %s",
                 path && *path ? path : magic_getpath(NULL, 0), magic_error(m));
    magic_close(m);
    goto done;
  }
  sniff_cookie = m;
done:
  pthread_mutex_unlock(&sniff_lock);
  return rc;
}

void br_sniff_close(void) {
  pthread_mutex_lock(&sniff_lock);
  if (sniff_cookie) magic_close(sniff_cookie);
  sniff_cookie = NULL;
  pthread_mutex_unlock(&sniff_lock);
}

int br_sniff_wanted(const char *ct) {
  if (!ct) return 1;
  while (*ct == ' ' || *ct == '\t') ct++;
  size_t n = strcspn(ct, ";");
  while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t')) n--;
  static const char octet[] = "application/octet-stream";
  return n == 0 || (n == sizeof octet - 1 && !strncasecmp(ct, octet, n));
}

int br_sniff_type(const void *buf, size_t len, char *out, size_t outlen) {
  if (!buf || !len || !outlen) return 0;
  if (len > BR_SNIFF_BYTES) len = BR_SNIFF_BYTES;
  char found[BR_MAX_HEADER_CONTENT_TYPE + 1] = "";
  pthread_mutex_lock(&sniff_lock);
  const char *t = sniff_cookie ? magic_buffer(sniff_cookie, buf, len) : NULL;
  if (t) snprintf(found, sizeof found, "%s", t);
  pthread_mutex_unlock(&sniff_lock);
  /* "application/x-empty", "inode/x-empty" and the like say nothing about the bytes */
  if (!found[0] || br_sniff_wanted(found) || strstr(found, "x-empty") ||
      br_header_content_type_check(found) || !br_content_type_is_passive(found))
    return 0;
  if (strlen(found) >= outlen) return 0;
  memcpy(out, found, strlen(found) + 1);
  return 1;
}
