/* Iceberg table metadata: metadata.json parsing, current-version choice and path mapping. */
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "iceberg/internal.h"

/* Inflates a gzip member into a malloc'd, NUL-terminated buffer of at most max bytes. */
static int gunzip(const uint8_t *in, size_t inlen, size_t max, uint8_t **out, size_t *outlen,
                  br_err *err) {
  int rc = -1;
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  size_t cap = inlen * 4 + 1024;
  if (cap > max + 1) cap = max + 1;
  uint8_t *buf = malloc(cap);
  if (!buf) return br_fail(err, "out of memory");
  if (inflateInit2(&zs, 15 + 16) != Z_OK) {
    free(buf);
    return br_fail(err, "gzip: cannot initialise zlib");
  }
  zs.next_in = (Bytef *)in;
  zs.avail_in = (uInt)(inlen > UINT32_MAX ? UINT32_MAX : inlen);
  size_t used = 0;
  for (;;) {
    if (used == cap) {
      if (cap > max) {
        br_fail(err, "gzip'd metadata inflates to more than %zu bytes", max);
        goto fail;
      }
      size_t ncap = cap * 2 > max + 1 ? max + 1 : cap * 2;
      uint8_t *nb = realloc(buf, ncap);
      if (!nb) {
        br_fail(err, "out of memory");
        goto fail;
      }
      buf = nb;
      cap = ncap;
    }
    zs.next_out = buf + used;
    zs.avail_out = (uInt)(cap - used);
    int zr = inflate(&zs, Z_NO_FLUSH);
    used = cap - zs.avail_out;
    if (zr == Z_STREAM_END) break;
    if (zr != Z_OK && !(zr == Z_BUF_ERROR && zs.avail_out == 0)) {
      br_fail(err, "gzip'd metadata is corrupt or truncated");
      goto fail;
    }
  }
  if (used > max) {
    br_fail(err, "gzip'd metadata inflates to more than %zu bytes", max);
    goto fail;
  }
  uint8_t *nb = realloc(buf, used + 1);
  if (!nb) {
    br_fail(err, "out of memory");
    goto fail;
  }
  buf = nb;
  buf[used] = 0;
  *out = buf;
  *outlen = used;
  buf = NULL;
  rc = 0;
fail:
  inflateEnd(&zs);
  free(buf);
  return rc;
}

void ice_meta_free(ice_meta *m) {
  if (!m) return;
  for (size_t i = 0; i < m->nsnapshots; i++) {
    ice_snapshot *s = &m->snapshots[i];
    free(s->manifest_list);
    for (size_t j = 0; j < s->nmanifests; j++) free(s->manifests[j]);
    free(s->manifests);
  }
  free(m->snapshots);
  free(m->location);
  memset(m, 0, sizeof *m);
}

static char *dup_path(const char *s, br_err *err) {
  size_t n = strlen(s);
  if (n == 0 || n >= ICE_MAX_PATH) {
    br_fail(err, "metadata: path is empty or longer than %d bytes", ICE_MAX_PATH);
    return NULL;
  }
  char *d = strdup(s);
  if (!d) br_fail(err, "out of memory");
  return d;
}

static int parse_snapshot(json_t *js, ice_snapshot *s, size_t idx, br_err *err) {
  if (!json_is_object(js)) return br_fail(err, "metadata: snapshots[%zu] is not an object", idx);
  json_t *id = json_object_get(js, "snapshot-id");
  if (!json_is_integer(id))
    return br_fail(err, "metadata: snapshots[%zu] has no integer snapshot-id", idx);
  s->id = (int64_t)json_integer_value(id);
  json_t *ts = json_object_get(js, "timestamp-ms");
  s->timestamp_ms = json_is_integer(ts) ? (int64_t)json_integer_value(ts) : -1;
  json_t *ml = json_object_get(js, "manifest-list");
  json_t *mf = json_object_get(js, "manifests");
  if (ml && !json_is_null(ml)) {
    if (!json_is_string(ml))
      return br_fail(err, "metadata: snapshot %lld: manifest-list is not a string",
                     (long long)s->id);
    s->manifest_list = dup_path(json_string_value(ml), err);
    return s->manifest_list ? 0 : -1;
  }
  if (!json_is_array(mf))
    return br_fail(err, "metadata: snapshot %lld has neither manifest-list nor manifests",
                   (long long)s->id);
  size_t n = json_array_size(mf);
  if (n > ICE_MAX_INLINE_MANIFESTS)
    return br_fail(err, "metadata: snapshot %lld lists too many manifests", (long long)s->id);
  s->manifests = calloc(n ? n : 1, sizeof *s->manifests);
  if (!s->manifests) return br_fail(err, "out of memory");
  for (size_t j = 0; j < n; j++) {
    json_t *p = json_array_get(mf, j);
    if (!json_is_string(p))
      return br_fail(err, "metadata: snapshot %lld: manifests[%zu] is not a string",
                     (long long)s->id, j);
    s->manifests[j] = dup_path(json_string_value(p), err);
    if (!s->manifests[j]) return -1;
    s->nmanifests = j + 1;
  }
  return 0;
}

int ice_meta_parse(const uint8_t *data, size_t len, ice_meta *m, br_err *err) {
  int rc = -1;
  uint8_t *plain = NULL;
  json_t *root = NULL;
  memset(m, 0, sizeof *m);
  if (len >= 2 && data[0] == 0x1f && data[1] == 0x8b) {
    size_t plen = 0;
    if (gunzip(data, len, ICE_MAX_METADATA, &plain, &plen, err) != 0) goto fail;
    data = plain;
    len = plen;
  }
  if (len > ICE_MAX_METADATA) {
    br_fail(err, "metadata: larger than %u bytes", ICE_MAX_METADATA);
    goto fail;
  }
  json_error_t je;
  root = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    br_fail(err, "metadata: invalid JSON at line %d: %s", je.line, je.text);
    goto fail;
  }
  if (!json_is_object(root)) {
    br_fail(err, "metadata: not a JSON object");
    goto fail;
  }
  json_t *fv = json_object_get(root, "format-version");
  if (fv == NULL) {
    m->format_version = 1;
  } else if (json_is_integer(fv) && json_integer_value(fv) >= 1 && json_integer_value(fv) <= 3) {
    m->format_version = (int)json_integer_value(fv);
  } else {
    br_fail(err, "metadata: unsupported format-version (1, 2 and 3 are known)");
    goto fail;
  }
  json_t *loc = json_object_get(root, "location");
  if (json_is_string(loc) && json_string_length(loc) > 0) {
    m->location = dup_path(json_string_value(loc), err);
    if (!m->location) goto fail;
  } else if (loc && !json_is_null(loc) && !json_is_string(loc)) {
    br_fail(err, "metadata: location is not a string");
    goto fail;
  }
  json_t *snaps = json_object_get(root, "snapshots");
  if (snaps && !json_is_null(snaps) && !json_is_array(snaps)) {
    br_fail(err, "metadata: snapshots is not an array");
    goto fail;
  }
  size_t n = json_array_size(snaps);
  if (n > ICE_MAX_SNAPSHOTS) {
    br_fail(err, "metadata: more than %d snapshots", ICE_MAX_SNAPSHOTS);
    goto fail;
  }
  if (n) {
    m->snapshots = calloc(n, sizeof *m->snapshots);
    if (!m->snapshots) {
      br_fail(err, "out of memory");
      goto fail;
    }
  }
  for (size_t i = 0; i < n; i++) {
    m->nsnapshots = i + 1;
    if (parse_snapshot(json_array_get(snaps, i), &m->snapshots[i], i, err) != 0) goto fail;
  }
  /* A current snapshot that is not among the snapshots means the file is not what we think. */
  json_t *cur = json_object_get(root, "current-snapshot-id");
  if (json_is_integer(cur) && json_integer_value(cur) != -1) {
    int found = 0;
    for (size_t i = 0; i < m->nsnapshots && !found; i++)
      found = m->snapshots[i].id == (int64_t)json_integer_value(cur);
    if (!found) {
      br_fail(err, "metadata: current-snapshot-id %lld is not in snapshots",
              (long long)json_integer_value(cur));
      goto fail;
    }
  }
  rc = 0;
fail:
  if (rc != 0) ice_meta_free(m);
  json_decref(root);
  free(plain);
  return rc;
}

/* Parses leading decimal digits of s[0..len) into *v (at most 18 digits). Returns the digits
 * consumed, 0 if none or too many. */
static size_t parse_digits(const char *s, size_t len, int64_t *v) {
  size_t i = 0;
  int64_t x = 0;
  while (i < len && s[i] >= '0' && s[i] <= '9') {
    if (i >= 18) return 0;
    x = x * 10 + (s[i] - '0');
    i++;
  }
  *v = x;
  return i;
}

static int ends_with(const char *s, size_t n, const char *suffix) {
  size_t k = strlen(suffix);
  return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

int64_t ice_metadata_version(const char *name) {
  size_t n = strlen(name);
  if (!ends_with(name, n, ".metadata.json")) return -1;
  size_t stem = n - strlen(".metadata.json");
  if (ends_with(name, stem, ".gz")) stem -= 3;
  int64_t v;
  if (name[0] == 'v') {
    size_t d = parse_digits(name + 1, stem - 1, &v);
    return d > 0 && d == stem - 1 ? v : -1;
  }
  size_t d = parse_digits(name, stem, &v);
  return d > 0 && d < stem && name[d] == '-' ? v : -1;
}

long ice_pick_metadata(const char *hint, size_t hint_len, char *const *names, size_t n,
                       br_err *err) {
  /* best[version]: prefer plain over gzip at the same version. */
  long best = -1;
  int64_t best_v = -1;
  int64_t want = -1;
  if (hint) {
    size_t a = 0, b = hint_len;
    while (a < b && isspace((unsigned char)hint[a])) a++;
    while (b > a && isspace((unsigned char)hint[b - 1])) b--;
    int64_t v;
    if (b > a && parse_digits(hint + a, b - a, &v) == b - a) want = v;
  }
  if (want >= 0) {
    /* Start at the hinted version, then follow N+1, N+2, ... while they exist. */
    for (int64_t v = want;; v++) {
      long hit = -1;
      for (size_t i = 0; i < n; i++) {
        if (names[i][0] == '.' || ice_metadata_version(names[i]) != v) continue;
        if (hit < 0 || strstr(names[hit], ".gz.")) hit = (long)i;
      }
      if (hit < 0) break;
      best = hit;
      best_v = v;
    }
    if (best < 0)
      return br_fail(err, "version-hint names version %lld but its metadata file is missing",
                     (long long)want);
    return best;
  }
  for (size_t i = 0; i < n; i++) {
    if (names[i][0] == '.') continue; /* .crc side files and the like */
    int64_t v = ice_metadata_version(names[i]);
    if (v < 0) continue;
    if (v > best_v || (v == best_v && strstr(names[best], ".gz."))) {
      best = (long)i;
      best_v = v;
    }
  }
  if (best < 0) return br_fail(err, "no *.metadata.json file in the metadata folder");
  return best;
}

static int has_scheme(const char *s) {
  if (!isalpha((unsigned char)s[0])) return 0;
  size_t i = 1;
  while (isalnum((unsigned char)s[i]) || s[i] == '+' || s[i] == '.' || s[i] == '-') i++;
  return s[i] == ':' && s[i + 1] == '/' && s[i + 2] == '/';
}

/* "./a/b/" -> "a/b" for prefix comparison of recorded locations. */
static size_t norm_prefix(const char *s, const char **start) {
  while (s[0] == '.' && s[1] == '/') s += 2;
  size_t n = strlen(s);
  while (n > 0 && s[n - 1] == '/') n--;
  *start = s;
  return n;
}

int ice_map_path(const ice_pathmap *pm, const char *raw, char *out, size_t outlen, br_err *err) {
  char tmp[ICE_MAX_PATH + 1];
  size_t rawlen = strlen(raw);
  if (rawlen == 0) return br_fail(err, "empty path in table metadata");
  if (rawlen > ICE_MAX_PATH) return br_fail(err, "path longer than %d bytes", ICE_MAX_PATH);
  int mapped = 0;
  for (size_t i = 0; i < pm->nrewrites && !mapped; i++) {
    size_t k = strlen(pm->rewrites[i].from);
    if (k == 0 || strncmp(raw, pm->rewrites[i].from, k) != 0) continue;
    if ((size_t)snprintf(tmp, sizeof tmp, "%s%s", pm->rewrites[i].to, raw + k) >= sizeof tmp)
      return br_fail(err, "%s: rewritten path too long", raw);
    mapped = 1;
  }
  if (!mapped && pm->table_dir && pm->location) {
    const char *loc;
    const char *r;
    size_t ln = norm_prefix(pm->location, &loc);
    norm_prefix(raw, &r);
    if (ln > 0 && strncmp(r, loc, ln) == 0 && r[ln] == '/') {
      if ((size_t)snprintf(tmp, sizeof tmp, "%s%s", pm->table_dir, r + ln) >= sizeof tmp)
        return br_fail(err, "%s: mapped path too long", raw);
      mapped = 1;
    }
  }
  if (!mapped) memcpy(tmp, raw, rawlen + 1);
  const char *p = tmp;
  if (strncmp(p, "file://", 7) == 0) {
    p += 7;
    if (strncmp(p, "localhost/", 10) == 0) p += 9;
  } else if (has_scheme(p)) {
    if ((size_t)snprintf(out, outlen, "%s", p) >= outlen) return br_fail(err, "path too long");
    return 0;
  }
  if (*p == 0) return br_fail(err, "%s: empty path", raw);
  if (*p == '/') {
    if ((size_t)snprintf(out, outlen, "%s", p) >= outlen) return br_fail(err, "path too long");
    return 0;
  }
  if (!pm->table_dir)
    return br_fail(err, "%s: relative path but the table has no local folder (add a rewrite)", raw);
  while (p[0] == '.' && p[1] == '/') p += 2;
  size_t tl = strlen(pm->table_dir);
  const char *sep = tl > 0 && pm->table_dir[tl - 1] == '/' ? "" : "/";
  if ((size_t)snprintf(out, outlen, "%s%s%s", pm->table_dir, sep, p) >= outlen)
    return br_fail(err, "%s: path too long", raw);
  return 0;
}
