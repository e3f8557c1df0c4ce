/* Finding and reading a table's current metadata: Hadoop-style folders, metadata.json paths and
 * URLs, and the REST catalog. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "iceberg/internal.h"
#include "iceberg/rest.h"

#define MAX_DIR_ENTRIES 1000000
#define MAX_HINT 256

br_source *br_iceberg_open_local(void *ud, const char *path, br_err *err) {
  (void)ud;
  if (path[0] != '/') {
    br_fail(err, "%s: no opener for this location (add a --rewrite to a local folder)", path);
    return NULL;
  }
  return br_source_open_file(path, err);
}

static int read_source(const br_iceberg_table_config *cfg, const char *path, uint64_t max,
                       uint8_t **out, size_t *len, br_err *err) {
  br_iceberg_open_fn open = cfg->open ? cfg->open : br_iceberg_open_local;
  br_source *src = open(cfg->open_ud, path, err);
  if (!src) return -1;
  int rc = br_source_read_all(src, max, out, len, err);
  br_source_close(src);
  return rc;
}

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void free_names(char **names, size_t n) {
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
}

/* Reads metadata/version-hint.text (or .txt) if present. Returns 0 (hint NULL when absent). */
static int read_hint(const char *mdir, char *hint, size_t *hint_len, int *have, br_err *err) {
  static const char *const files[] = {"version-hint.text", "version-hint.txt"};
  *have = 0;
  for (size_t i = 0; i < 2 && !*have; i++) {
    char p[PATH_MAX];
    if ((size_t)snprintf(p, sizeof p, "%s/%s", mdir, files[i]) >= sizeof p)
      return br_fail(err, "path too long");
    FILE *f = fopen(p, "rb");
    if (!f) {
      if (errno == ENOENT) continue;
      return br_fail(err, "%s: %s", p, strerror(errno));
    }
    size_t n = fread(hint, 1, MAX_HINT, f);
    int bad = ferror(f) || (n == MAX_HINT && fgetc(f) != EOF);
    fclose(f);
    if (bad) return br_fail(err, "%s: unreadable or longer than %d bytes", p, MAX_HINT - 1);
    *hint_len = n;
    *have = 1;
  }
  return 0;
}

/* Picks the current metadata file of a Hadoop table folder; path receives its full path. */
static int pick_in_folder(const char *mdir, char *path, size_t pathlen, br_err *err) {
  int rc = -1;
  char hint[MAX_HINT];
  size_t hint_len = 0;
  int have_hint = 0;
  char **names = NULL;
  size_t n = 0, cap = 0;
  DIR *d = NULL;
  if (read_hint(mdir, hint, &hint_len, &have_hint, err) != 0) return -1;
  d = opendir(mdir);
  if (!d) return br_fail(err, "%s: %s", mdir, strerror(errno));
  struct dirent *de;
  errno = 0;
  while ((de = readdir(d)) != NULL) {
    if (ice_metadata_version(de->d_name) < 0 || de->d_name[0] == '.') continue;
    if (n == MAX_DIR_ENTRIES) {
      br_fail(err, "%s: too many metadata files", mdir);
      goto fail;
    }
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 64;
      char **nn = realloc(names, ncap * sizeof *nn);
      if (!nn) {
        br_fail(err, "out of memory");
        goto fail;
      }
      names = nn;
      cap = ncap;
    }
    names[n] = strdup(de->d_name);
    if (!names[n]) {
      br_fail(err, "out of memory");
      goto fail;
    }
    n++;
  }
  if (errno != 0) {
    br_fail(err, "%s: %s", mdir, strerror(errno));
    goto fail;
  }
  long i = ice_pick_metadata(have_hint ? hint : NULL, hint_len, names, n, err);
  if (i < 0) {
    char tmp[sizeof err->msg];
    snprintf(tmp, sizeof tmp, "%s", err ? err->msg : "");
    br_fail(err, "%s: %s", mdir, tmp);
    goto fail;
  }
  if ((size_t)snprintf(path, pathlen, "%s/%s", mdir, names[i]) >= pathlen) {
    br_fail(err, "path too long");
    goto fail;
  }
  rc = 0;
fail:
  if (d) closedir(d);
  free_names(names, n);
  return rc;
}

/* The table folder of a local metadata file: the parent of its folder when that is "metadata". */
static char *table_dir_of_file(const char *file, br_err *err) {
  char *real = realpath(file, NULL);
  if (!real) {
    br_fail(err, "%s: %s", file, strerror(errno));
    return NULL;
  }
  char *slash = strrchr(real, '/');
  if (slash) *slash = 0;
  slash = strrchr(real, '/');
  if (slash && strcmp(slash + 1, "metadata") == 0) *slash = 0;
  if (real[0] == 0) strcpy(real, "/");
  return real;
}

int ice_load_table(const br_iceberg_table_config *cfg, ice_meta *m, char **table_dir, br_err *err) {
  int rc = -1;
  uint8_t *data = NULL;
  size_t len = 0;
  char path[PATH_MAX + 64];
  const char *loc = cfg->location;
  *table_dir = NULL;
  memset(m, 0, sizeof *m);
  if (!loc || !*loc) return br_fail(err, "no table location");
  if (strncmp(loc, "rest:", 5) == 0) return ice_rest_load(loc, cfg->token, m, err);
  if (strncmp(loc, "http://", 7) == 0 || strncmp(loc, "https://", 8) == 0) {
    long status = 0;
    if (ice_http_get(loc, cfg->token, ICE_MAX_METADATA, &data, &len, &status, err) != 0) return -1;
    if (status != 200) {
      free(data);
      return br_fail(err, "%s: HTTP %ld", loc, status);
    }
    rc = ice_meta_parse(data, len, m, err);
    free(data);
    return rc;
  }
  if (strncmp(loc, "file://", 7) == 0) loc += 7;
  if (strstr(loc, "://")) { /* s3:// and the like: through the opener, no local folder */
    size_t llen = strlen(loc);
    int is_file = (llen > 5 && !strcmp(loc + llen - 5, ".json")) ||
                  (llen > 8 && !strcmp(loc + llen - 8, ".json.gz"));
    if (!is_file) {
      /* a table folder in object storage: its version hint names the current metadata */
      char hint_path[PATH_MAX];
      const char *slash = llen && loc[llen - 1] == '/' ? "" : "/";
      if ((size_t)snprintf(hint_path, sizeof hint_path, "%s%smetadata/version-hint.text", loc,
                           slash) >= sizeof hint_path)
        return br_fail(err, "path too long");
      if (read_source(cfg, hint_path, MAX_HINT, &data, &len, err) != 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err ? err->msg : "");
        return br_fail(err,
                       "%s: no readable metadata/version-hint.text (%s); give the "
                       "metadata.json path instead",
                       loc, why);
      }
      char *end = NULL;
      long long v = strtoll((const char *)data, &end, 10);
      while (end && (*end == '\n' || *end == '\r' || *end == ' ')) end++;
      int bad = v <= 0 || !end || *end; /* end points into data: look before freeing it */
      free(data);
      data = NULL;
      if (bad) return br_fail(err, "%s: version hint is not a number", hint_path);
      /* A hint lags behind when a writer stopped between vN+1.metadata.json and the hint: follow
       * the consecutive newer versions that exist, as the Hadoop catalog (and a local folder)
       * does. A failure other than "no such object" fails the load: never an older version
       * because of a transient error. */
      br_iceberg_open_fn open = cfg->open ? cfg->open : br_iceberg_open_local;
      for (int step = 0; step < 1000; step++) {
        char next[PATH_MAX + 64];
        snprintf(next, sizeof next, "%s%smetadata/v%lld.metadata.json", loc, slash, v + 1);
        br_err oerr = {{0}};
        br_source *probe = open(cfg->open_ud, next, &oerr);
        if (!probe) {
          if (strcasestr(oerr.msg, "no such")) break;
          return br_fail(err, "%s: %s", next, oerr.msg);
        }
        br_source_close(probe);
        v++;
      }
      if ((size_t)snprintf(path, sizeof path, "%s%smetadata/v%lld.metadata.json", loc, slash, v) >=
          sizeof path)
        return br_fail(err, "path too long");
      loc = path;
    }
    if (read_source(cfg, loc, ICE_MAX_METADATA, &data, &len, err) != 0) return -1;
    rc = ice_meta_parse(data, len, m, err);
    free(data);
    return rc;
  }
  if (is_dir(loc)) {
    char mdir[PATH_MAX];
    if ((size_t)snprintf(mdir, sizeof mdir, "%s/metadata", loc) >= sizeof mdir)
      return br_fail(err, "path too long");
    if (!is_dir(mdir)) return br_fail(err, "%s: not a table folder (no metadata/)", loc);
    if (pick_in_folder(mdir, path, sizeof path, err) != 0) return -1;
  } else {
    if ((size_t)snprintf(path, sizeof path, "%s", loc) >= sizeof path)
      return br_fail(err, "path too long");
  }
  br_source *src = br_source_open_file(path, err);
  if (!src) return -1;
  rc = br_source_read_all(src, ICE_MAX_METADATA, &data, &len, err);
  br_source_close(src);
  if (rc == 0) rc = ice_meta_parse(data, len, m, err);
  if (rc != 0) {
    char tmp[sizeof err->msg];
    snprintf(tmp, sizeof tmp, "%s", err ? err->msg : "");
    if (err && strncmp(tmp, path, strlen(path)) != 0) br_fail(err, "%s: %s", path, tmp);
  }
  free(data);
  if (rc == 0) {
    *table_dir = table_dir_of_file(path, err);
    if (!*table_dir) {
      ice_meta_free(m);
      rc = -1;
    }
  }
  return rc;
}
