/* The suspect list: one text line per location a read found not to hash to its blob,
 * "<hex> <ms> <store> <key>\n" in DATA_DIR/suspect, appended by the server and read by fsck. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/suspect.h"

int br_suspect_mark(const char *data_dir, const uint8_t digest[BR_SHA256_LEN], const char *store,
                    const char *key, br_err *err) {
  char path[4096], hex[BR_HEX_LEN + 1], line[BR_HEX_LEN + BR_MAX_STORE_NAME + BR_MAX_KEY + 48];
  snprintf(path, sizeof path, "%s/suspect", data_dir);
  if (strchr(store, ' ') || strchr(store, '\n') || strchr(key, '\n'))
    return br_fail(err, "suspect list: %s:%s cannot be listed (a space or newline)", store, key);
  br_hex_encode(digest, hex);
  int len = snprintf(line, sizeof line, "%s %" PRIu64 " %s %s\n", hex, br_now_ms(), store, key);
  if (len < 0 || (size_t)len >= sizeof line) return br_fail(err, "suspect list: key too long");
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return br_fail(err, "suspect list %s: %s", path, strerror(errno));
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) == 0 && (uint64_t)st.st_size + (size_t)len > BR_SUSPECT_FILE_MAX)
    rc = br_fail(err, "suspect list %s is full (%u bytes)", path, BR_SUSPECT_FILE_MAX);
  else if (write(fd, line, (size_t)len) != len)
    rc = br_fail(err, "suspect list %s: %s", path, strerror(errno));
  close(fd);
  return rc;
}

/* Parses one line (without its newline) into s. Returns 0, or -1 when it is malformed. */
static int parse_line(char *l, br_suspect *s) {
  char *sp1 = strchr(l, ' ');
  if (!sp1 || sp1 - l != BR_HEX_LEN) return -1;
  *sp1 = '\0';
  if (br_hex_decode(l, BR_HEX_LEN, s->digest) < 0) return -1;
  char *end;
  errno = 0;
  unsigned long long ms = strtoull(sp1 + 1, &end, 10);
  if (errno || *end != ' ' || end == sp1 + 1) return -1;
  s->at_ms = ms;
  char *store = end + 1, *sp3 = strchr(store, ' ');
  if (!sp3 || sp3 == store || (size_t)(sp3 - store) > BR_MAX_STORE_NAME) return -1;
  const char *key = sp3 + 1;
  if (!*key || strlen(key) > BR_MAX_KEY) return -1;
  memcpy(s->store, store, (size_t)(sp3 - store));
  s->store[sp3 - store] = '\0';
  snprintf(s->key, sizeof s->key, "%s", key);
  return 0;
}

int br_suspect_load(const char *data_dir, br_suspect **out, size_t *n, br_err *err) {
  *out = NULL;
  *n = 0;
  char path[4096];
  snprintf(path, sizeof path, "%s/suspect", data_dir);
  FILE *f = fopen(path, "re");
  if (!f) return errno == ENOENT ? 0 : br_fail(err, "suspect list %s: %s", path, strerror(errno));
  size_t cap = 0;
  br_suspect *list = NULL;
  char line[BR_HEX_LEN + BR_MAX_STORE_NAME + BR_MAX_KEY + 48];
  int rc = 0;
  uint64_t read_bytes = 0;
  while (fgets(line, sizeof line, f)) {
    size_t len = strlen(line);
    read_bytes += len;
    if (read_bytes > 2 * (uint64_t)BR_SUSPECT_FILE_MAX) break; /* bounded whatever wrote it */
    if (!len || line[len - 1] != '\n') continue;               /* too long, or a torn last line */
    line[len - 1] = '\0';
    br_suspect s;
    if (parse_line(line, &s) < 0) continue;
    if (*n == cap) {
      size_t ncap = cap ? 2 * cap : 64;
      br_suspect *grown = realloc(list, ncap * sizeof *list);
      if (!grown) {
        rc = br_fail(err, "out of memory");
        break;
      }
      list = grown;
      cap = ncap;
    }
    list[(*n)++] = s;
  }
  fclose(f);
  if (rc < 0) {
    free(list);
    *n = 0;
    return -1;
  }
  *out = list;
  return 0;
}

const br_suspect *br_suspect_find(const br_suspect *list, size_t n,
                                  const uint8_t digest[BR_SHA256_LEN], const char *store,
                                  const char *key) {
  for (size_t i = n; i-- > 0;)
    if (!memcmp(list[i].digest, digest, BR_SHA256_LEN) && !strcmp(list[i].store, store) &&
        !strcmp(list[i].key, key))
      return &list[i];
  return NULL;
}
