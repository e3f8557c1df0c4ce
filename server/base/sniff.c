/* Content-type detection from the first bytes of a blob: a pool of libmagic handles. */
#include "blobref/sniff.h"

#include <magic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "blobref/header.h"

/* A magic_t is not safe to share between threads, and one per call costs a database load (about
 * a millisecond): handles are opened on demand up to SNIFF_HANDLES and reused; a caller finding
 * them all busy waits for one. */
#define SNIFF_HANDLES 8

static pthread_mutex_t sniff_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sniff_cv = PTHREAD_COND_INITIALIZER;
static int sniff_ready;                   /* the database loaded; 0 before open and after close */
static magic_t sniff_idle[SNIFF_HANDLES]; /* handles no thread holds */
static int sniff_nidle, sniff_nopen;      /* idle ones, and all that are open (idle or held) */

/* A handle with the database loaded, or NULL (err set when given). */
static magic_t handle_new(br_err *err) {
  magic_t m = magic_open(MAGIC_MIME_TYPE | MAGIC_NO_CHECK_COMPRESS | MAGIC_ERROR);
  if (!m) {
    if (err) br_fail(err, "content detection: magic_open failed (out of memory?)");
    return NULL;
  }
  if (magic_load(m, NULL) != 0) {
    const char *path = getenv("MAGIC");
    if (err)
      br_fail(err, "content detection: cannot load the magic database %s: %s",
              path && *path ? path : magic_getpath(NULL, 0), magic_error(m));
    magic_close(m);
    return NULL;
  }
  return m;
}

int br_sniff_open(br_err *err) {
  pthread_mutex_lock(&sniff_lock);
  int ready = sniff_ready;
  pthread_mutex_unlock(&sniff_lock);
  if (ready) return 0;
  magic_t m = handle_new(err); /* the first handle proves the database loads */
  if (!m) return -1;
  pthread_mutex_lock(&sniff_lock);
  if (sniff_ready || sniff_nidle == SNIFF_HANDLES) {
    magic_close(m); /* opened twice at once: keep one */
  } else {
    sniff_idle[sniff_nidle++] = m;
    sniff_nopen++;
    sniff_ready = 1;
  }
  pthread_mutex_unlock(&sniff_lock);
  return 0;
}

void br_sniff_close(void) {
  pthread_mutex_lock(&sniff_lock);
  sniff_ready = 0;
  while (sniff_nidle) {
    magic_close(sniff_idle[--sniff_nidle]);
    sniff_nopen--;
  }
  pthread_cond_broadcast(&sniff_cv); /* waiters give up; held handles close when given back */
  pthread_mutex_unlock(&sniff_lock);
}

/* An idle handle, a new one while fewer than SNIFF_HANDLES are open, else waits for one. NULL
 * when detection is closed or a new handle cannot be opened. */
static magic_t handle_take(void) {
  pthread_mutex_lock(&sniff_lock);
  while (sniff_ready && !sniff_nidle && sniff_nopen >= SNIFF_HANDLES)
    pthread_cond_wait(&sniff_cv, &sniff_lock);
  magic_t m = NULL;
  if (sniff_ready && sniff_nidle) {
    m = sniff_idle[--sniff_nidle];
  } else if (sniff_ready) {
    sniff_nopen++; /* counted now so that no more than SNIFF_HANDLES are loading */
    pthread_mutex_unlock(&sniff_lock);
    m = handle_new(NULL); /* loaded outside the lock: others keep detecting meanwhile */
    pthread_mutex_lock(&sniff_lock);
    if (!m) {
      sniff_nopen--;
      pthread_cond_signal(&sniff_cv);
    }
  }
  pthread_mutex_unlock(&sniff_lock);
  return m;
}

static void handle_give(magic_t m) {
  pthread_mutex_lock(&sniff_lock);
  if (sniff_ready && sniff_nidle < SNIFF_HANDLES) {
    sniff_idle[sniff_nidle++] = m;
  } else {
    magic_close(m);
    sniff_nopen--;
  }
  pthread_cond_signal(&sniff_cv);
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
  magic_t m = handle_take();
  if (!m) return 0;
  const char *t = magic_buffer(m, buf, len);
  if (t) snprintf(found, sizeof found, "%s", t);
  handle_give(m);
  /* "application/x-empty", "inode/x-empty" and the like say nothing about the bytes */
  if (!found[0] || br_sniff_wanted(found) || strstr(found, "x-empty") ||
      br_header_content_type_check(found) || !br_content_type_is_passive(found))
    return 0;
  if (strlen(found) >= outlen) return 0;
  memcpy(out, found, strlen(found) + 1);
  return 1;
}

void br_sniff_name_or_bytes(const char *name, const void *head, size_t head_len, char *out,
                            size_t outlen) {
  const char *t = name ? br_content_type_for_name(name) : NULL;
  if (t && strlen(t) < outlen) {
    memcpy(out, t, strlen(t) + 1);
    return;
  }
  if (br_sniff_type(head, head_len, out, outlen)) return;
  snprintf(out, outlen, "application/octet-stream");
}
