/* The pure pieces of the Delta log: `_delta_log/` file names, percent-decoding, reader features
 * and the JSON-lines commit parser (what the fuzz target drives). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "delta/internal.h"

/* Reads 1..20 digits at *p as a version; advances *p. -1 if none or too large. */
static int64_t read_version(const char **p) {
  const char *s = *p;
  int64_t v = 0;
  size_t n = 0;
  while (s[n] >= '0' && s[n] <= '9') {
    if (n == 20) return -1;
    v = v * 10 + (s[n] - '0');
    if (v > DL_MAX_VERSION) return -1;
    n++;
  }
  if (n == 0) return -1;
  *p = s + n;
  return v;
}

/* 1 if s[0..n) is a UUID-like token (hex digits and dashes, at least 8 characters). */
static int uuid_like(const char *s, size_t n) {
  if (n < 8) return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!hex && c != '-') return 0;
  }
  return 1;
}

void dl_parse_name(const char *name, dl_name *out) {
  memset(out, 0, sizeof *out);
  const char *p = name;
  int64_t v = read_version(&p);
  if (v < 0) return;
  if (!strcmp(p, ".json")) {
    out->kind = DL_NAME_COMMIT;
  } else if (!strcmp(p, ".checkpoint.parquet")) {
    out->kind = DL_NAME_CHECKPOINT;
  } else if (!strncmp(p, ".checkpoint.", 12)) {
    const char *q = p + 12;
    const char *r = q;
    int64_t part = read_version(&r);
    if (part >= 0 && *r == '.') {
      r++;
      int64_t nparts = read_version(&r);
      if (nparts >= 1 && nparts <= DL_MAX_PARTS && part >= 1 && part <= nparts &&
          !strcmp(r, ".parquet")) {
        out->kind = DL_NAME_MULTIPART;
        out->part = (uint32_t)part;
        out->nparts = (uint32_t)nparts;
      }
    }
    if (out->kind == DL_NAME_OTHER) {
      const char *dot = strchr(q, '.');
      if (dot && uuid_like(q, (size_t)(dot - q))) {
        if (!strcmp(dot, ".json"))
          out->kind = DL_NAME_V2_JSON;
        else if (!strcmp(dot, ".parquet"))
          out->kind = DL_NAME_V2_PARQUET;
      }
    }
  }
  if (out->kind != DL_NAME_OTHER) out->version = v;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

long dl_percent_decode(const char *src, size_t len, char *out, size_t outlen) {
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    char c = src[i];
    if (c == '%') {
      if (i + 2 >= len) return -1;
      int h = hexval(src[i + 1]), l = hexval(src[i + 2]);
      if (h < 0 || l < 0) return -1;
      c = (char)(h * 16 + l);
      i += 2;
    }
    if (c == 0 || o + 1 >= outlen) return -1;
    out[o++] = c;
  }
  if (o >= outlen) return -1;
  out[o] = 0;
  return (long)o;
}

/* Reader features that do not change which files a version holds, or that this reader follows:
 * deletion vectors (rows only, the file stays referenced), column mapping (physical names), v2
 * checkpoints, and type/value features that only change how values decode. */
static const char *const known_features[] = {
    "deletionVectors",      "columnMapping",
    "timestampNtz",         "v2Checkpoint",
    "vacuumProtocolCheck",  "typeWidening",
    "typeWidening-preview", "variantType",
    "variantType-preview",  "variantShredding-preview",
};

int dl_reader_feature_known(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof known_features / sizeof known_features[0]; i++)
    if (strlen(known_features[i]) == len && !memcmp(known_features[i], name, len)) return 1;
  return 0;
}

int dl_check_protocol(int64_t min_reader, const char *const *features, size_t nfeatures,
                      br_err *err) {
  if (min_reader < 1 || min_reader > 3)
    return br_fail(err, "protocol minReaderVersion %lld is not supported (1 to 3 are)",
                   (long long)min_reader);
  for (size_t i = 0; i < nfeatures; i++)
    if (!dl_reader_feature_known(features[i], strlen(features[i])))
      return br_fail(err, "unknown reader feature '%.100s' (protocol readerFeatures)", features[i]);
  return 0;
}

/* A path field: a non-empty string. */
static int get_path(json_t *obj, const char *what, dl_action *a, br_err *err) {
  json_t *p = json_object_get(obj, "path");
  if (!json_is_string(p) || json_string_length(p) == 0)
    return br_fail(err, "%s action without a path", what);
  if (json_string_length(p) > DL_MAX_PATH) return br_fail(err, "%s path too long", what);
  a->path = json_string_value(p);
  a->path_len = json_string_length(p);
  return 0;
}

static int64_t get_int(json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

/* numRecords from an add's stats string, or -1. */
static int64_t stats_records(json_t *add) {
  json_t *s = json_object_get(add, "stats");
  if (!json_is_string(s)) return -1;
  json_t *st = json_loadb(json_string_value(s), json_string_length(s), 0, NULL);
  int64_t n = st ? get_int(st, "numRecords") : -1;
  json_decref(st);
  return n;
}

static int protocol_action(json_t *obj, dl_action *a, br_err *err) {
  json_t *mr = json_object_get(obj, "minReaderVersion");
  if (!json_is_integer(mr)) return br_fail(err, "protocol action without minReaderVersion");
  a->min_reader = (int64_t)json_integer_value(mr);
  json_t *feats = json_object_get(obj, "readerFeatures");
  const char *names[64];
  size_t n = 0;
  if (feats && !json_is_null(feats)) {
    if (!json_is_array(feats)) return br_fail(err, "protocol readerFeatures is not a list");
    size_t i;
    json_t *f;
    json_array_foreach(feats, i, f) {
      if (!json_is_string(f)) return br_fail(err, "protocol readerFeatures holds a non-string");
      if (!dl_reader_feature_known(json_string_value(f), json_string_length(f)))
        return br_fail(err, "unknown reader feature '%.100s' (protocol readerFeatures)",
                       json_string_value(f));
      if (n < sizeof names / sizeof names[0]) names[n++] = json_string_value(f);
    }
  }
  return dl_check_protocol(a->min_reader, names, n, err);
}

/* Dispatches one parsed line. */
static int line_actions(json_t *line, dl_action_fn fn, void *ud, br_err *err) {
  const char *key;
  json_t *obj;
  json_object_foreach(line, key, obj) {
    dl_action a;
    memset(&a, 0, sizeof a);
    a.size = a.records = a.timestamp = -1;
    int rc = 0;
    if (!strcmp(key, "add") || !strcmp(key, "remove") || !strcmp(key, "cdc") ||
        !strcmp(key, "sidecar")) {
      if (!json_is_object(obj)) return br_fail(err, "%s action is not an object", key);
      a.kind = key[0] == 'a'   ? DL_ADD
               : key[0] == 'r' ? DL_REMOVE
               : key[0] == 'c' ? DL_CDC
                               : DL_SIDECAR;
      if (get_path(obj, key, &a, err) != 0) return -1;
      a.size = get_int(obj, a.kind == DL_SIDECAR ? "sizeInBytes" : "size");
      if (a.kind == DL_ADD) {
        json_t *dv = json_object_get(obj, "deletionVector");
        a.has_dv = dv && !json_is_null(dv);
        a.records = stats_records(obj);
      }
    } else if (!strcmp(key, "protocol")) {
      if (!json_is_object(obj)) return br_fail(err, "protocol action is not an object");
      a.kind = DL_PROTOCOL;
      if (protocol_action(obj, &a, err) != 0) return -1;
    } else if (!strcmp(key, "metaData")) {
      if (!json_is_object(obj)) return br_fail(err, "metaData action is not an object");
      a.kind = DL_METADATA;
      json_t *conf = json_object_get(obj, "configuration");
      json_t *mode =
          json_is_object(conf) ? json_object_get(conf, "delta.columnMapping.mode") : NULL;
      a.cm_mode = json_is_string(mode) ? json_string_value(mode) : NULL;
      json_t *schema = json_object_get(obj, "schemaString");
      a.schema = json_is_string(schema) ? json_string_value(schema) : NULL;
    } else if (!strcmp(key, "commitInfo")) {
      if (!json_is_object(obj)) continue; /* not a reader's concern: only its time is shown */
      a.kind = DL_COMMITINFO;
      a.timestamp = get_int(obj, "inCommitTimestamp");
      if (a.timestamp < 0) a.timestamp = get_int(obj, "timestamp");
    } else {
      continue; /* txn, domainMetadata, checkpointMetadata, ... */
    }
    rc = fn(ud, &a, err);
    if (rc != 0) return rc;
  }
  return 0;
}

int dl_parse_commit(const uint8_t *data, size_t len, dl_action_fn fn, void *ud, br_err *err) {
  size_t pos = 0, lineno = 0;
  while (pos < len) {
    const uint8_t *nl = memchr(data + pos, '\n', len - pos);
    size_t end = nl ? (size_t)(nl - data) : len;
    size_t n = end - pos;
    lineno++;
    if (n > 0 && data[pos + n - 1] == '\r') n--;
    if (n > 0) {
      json_error_t je;
      json_t *line = json_loadb((const char *)data + pos, n, 0, &je);
      if (!line) return br_fail(err, "line %zu: not JSON: %s", lineno, je.text);
      if (!json_is_object(line)) {
        json_decref(line);
        return br_fail(err, "line %zu: not a JSON object", lineno);
      }
      int rc = line_actions(line, fn, ud, err);
      json_decref(line);
      if (rc == -1) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err ? err->msg : "");
        return br_fail(err, "line %zu: %s", lineno, why);
      }
      if (rc != 0) return rc;
    }
    pos = end + 1;
  }
  return 0;
}

/* The field named name[0..len) of a struct type, or NULL. */
static json_t *struct_field(json_t *type, const char *name, size_t len) {
  json_t *fields = json_is_object(type) ? json_object_get(type, "fields") : NULL;
  size_t i;
  json_t *f;
  json_array_foreach(fields, i, f) {
    json_t *n = json_object_get(f, "name");
    if (json_is_string(n) && json_string_length(n) == len &&
        !memcmp(json_string_value(n), name, len))
      return f;
  }
  return NULL;
}

int dl_physical_column(const char *schema, const char *column, char *out, size_t outlen) {
  json_t *root = schema ? json_loads(schema, 0, NULL) : NULL;
  json_t *type = root;
  size_t o = 0;
  int rc = 0;
  for (const char *p = column;;) {
    const char *dot = strchr(p, '.');
    size_t len = dot ? (size_t)(dot - p) : strlen(p);
    json_t *f = type ? struct_field(type, p, len) : NULL;
    json_t *md = f ? json_object_get(f, "metadata") : NULL;
    json_t *phys =
        json_is_object(md) ? json_object_get(md, "delta.columnMapping.physicalName") : NULL;
    const char *name = json_is_string(phys) ? json_string_value(phys) : p;
    size_t nlen = json_is_string(phys) ? json_string_length(phys) : len;
    if (o + nlen + 2 > outlen) {
      rc = -1;
      break;
    }
    if (o) out[o++] = '.';
    memcpy(out + o, name, nlen);
    o += nlen;
    out[o] = 0;
    type = f ? json_object_get(f, "type") : NULL;
    if (!dot) break;
    p = dot + 1;
  }
  json_decref(root);
  return rc;
}
