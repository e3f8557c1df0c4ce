/* Configuration: one table of keys with types, defaults and bounds; INI parsing via inih. A key
 * given twice in a section, a value continued on an indented line, a value out of its bounds or
 * that cannot mean what it says stops loading with FILE:LINE. */
#include "blobref/config.h"
#include "blobref/source.h"

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <ini.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum key_type {
  KEY_STRING,
  KEY_SIZE,
  KEY_DURATION,
  KEY_COUNT,
  KEY_FRACTION,
  KEY_BOOL,
  KEY_SERVE,
  KEY_FORM,
  KEY_TABLE_FORMAT,
  KEY_SCOPES,
  KEY_SHA256,
  KEY_REWRITE,     /* may repeat */
  KEY_HEADER,      /* may repeat */
  KEY_ANONYMOUS,   /* read | none */
  KEY_PROXIES,     /* a string that br_config_parse_proxies accepts */
  KEY_TLS_PRIORITY /* a string that gnutls_priority_init accepts */
};

/* One configurable key: where it lives (offset into its section's struct), its default and
 * bounds. Sizes are bytes, durations milliseconds, counts plain numbers. A value below min is
 * refused, except 0 when zero_off (0 turns the feature off); a duration in range but below
 * warn_below loads with a warning (it is for tests, not for production). */
struct key_spec {
  const char *name;
  enum key_type type;
  size_t offset;
  const char *default_value;
  uint64_t min, max;
  int zero_off;
  uint64_t warn_below;
};

#define MINUTE_MS 60000ull
#define HOUR_MS 3600000ull

#define SRV(field) offsetof(br_config, field)
static const struct key_spec server_keys[] = {
    {"listen", KEY_STRING, SRV(listen), "127.0.0.1:8080", 0, 0, 0, 0},
    {"data_dir", KEY_STRING, SRV(data_dir), "./var", 0, 0, 0, 0},
    {"upload_store", KEY_STRING, SRV(upload_store), "", 0, 0, 0, 0},
    {"max_blob_size", KEY_SIZE, SRV(max_blob_size), "5GiB", 1, UINT64_MAX / 2, 0, 0},
    {"max_url_length", KEY_SIZE, SRV(max_url_length), "4096", 64, 1 << 20, 0, 0},
    {"max_header_size", KEY_SIZE, SRV(max_header_size), "16KiB", 1024, 1 << 20, 0, 0},
    {"max_json_size", KEY_SIZE, SRV(max_json_size), "8MiB", 1024, 1ull << 30, 0, 0},
    {"max_lookup_hashes", KEY_COUNT, SRV(max_lookup_hashes), "100000", 1, 10000000, 0, 0},
    {"connection_timeout", KEY_DURATION, SRV(connection_timeout_ms), "30s", 1000, 86400000, 0, 0},
    {"max_connections", KEY_COUNT, SRV(max_connections), "1024", 1, 1000000, 0, 0},
    {"threads", KEY_COUNT, SRV(threads), "0", 0, 1024, 0, 0},
    {"spool_max_total", KEY_SIZE, SRV(spool_max_total), "1GiB", 10 << 20, 1ull << 50, 0, 0},
    {"connection_memory", KEY_SIZE, SRV(connection_memory), "32KiB", 16384, 16 << 20, 0, 0},
    {"index_map_size", KEY_SIZE, SRV(index_map_size), "1TiB", 1 << 20, 1ull << 44, 0, 0},
    {"index_batch_max", KEY_COUNT, SRV(index_batch_max), "1024", 1, 1000000, 0, 0},
    {"cache_size", KEY_SIZE, SRV(cache_size), "64MiB", 0, 1ull << 40, 0, 0},
    {"cache_max_blob", KEY_SIZE, SRV(cache_max_blob), "64KiB", 0, 1 << 30, 0, 0},
    {"cache_max_age", KEY_DURATION, SRV(cache_max_age_ms), "60s", 0, 86400000ull * 365, 0, 0},
    {"shutdown_timeout", KEY_DURATION, SRV(shutdown_timeout_ms), "10s", 0, 3600000, 0, 0},
    {"dedup_touch_interval", KEY_DURATION, SRV(dedup_touch_interval_ms), "60s", 0, 86400000, 0, 0},
    {"access_log", KEY_STRING, SRV(access_log), "off", 0, 0, 0, 0},
    {"trusted_proxies", KEY_PROXIES, SRV(trusted_proxies), "", 0, 0, 0, 0},
    {"max_connections_per_ip", KEY_COUNT, SRV(max_connections_per_ip), "0", 0, 1000000, 0, 0},
    {"max_json_inflight", KEY_SIZE, SRV(max_json_inflight), "256MiB", 1 << 20, 1ull << 40, 0, 0},
    {"request_header_timeout", KEY_DURATION, SRV(request_header_timeout_ms), "10s", 1000, 86400000,
     0, 0},
    {"min_body_rate", KEY_SIZE, SRV(min_body_rate), "1KiB", 0, 1ull << 40, 0, 0},
    {"tls_cert", KEY_STRING, SRV(tls_cert), "", 0, 0, 0, 0},
    {"tls_key", KEY_STRING, SRV(tls_key), "", 0, 0, 0, 0},
    {"tls_priorities", KEY_TLS_PRIORITY, SRV(tls_priorities), BR_TLS_PRIORITIES_DEFAULT, 0, 0, 0,
     0},
    {"listen_plain", KEY_STRING, SRV(listen_plain), "", 0, 0, 0, 0},
    /* 0 would delete the old copy under the redirects and readers still using it */
    {"drain_grace", KEY_DURATION, SRV(drain_grace_ms), "24h", 1000, UINT64_MAX / 2, 0, MINUTE_MS},
    /* what an unfinished direct upload left is deleted after this long (at least presign_ttl) */
    {"direct_upload_grace", KEY_DURATION, SRV(direct_upload_grace_ms), "24h", 1000, UINT64_MAX / 2,
     0, MINUTE_MS},
};
/* interval: 0 = on demand only; under a second it would never stop reading the tables. grace
 * and retention: 0 would switch off invariants 6 (a pipeline may upload before it commits) and 4
 * (a quarantine can be undone); under an hour they are for tests. */
static const struct key_spec reconcile_keys[] = {
    {"interval", KEY_DURATION, SRV(reconcile_interval_ms), "6h", 1000, UINT64_MAX / 2, 1,
     MINUTE_MS},
    {"grace", KEY_DURATION, SRV(grace_ms), "72h", 1000, UINT64_MAX / 2, 0, HOUR_MS},
    {"retention", KEY_DURATION, SRV(retention_ms), "7d", 1000, UINT64_MAX / 2, 0, HOUR_MS},
    {"max_fraction", KEY_FRACTION, SRV(max_fraction), "0.10", 0, 1, 0, 0},
    /* false: a run records its counts only, no per-run blob lists */
    {"lists", KEY_BOOL, SRV(reconcile_lists), "true", 0, 0, 0, 0},
};
/* [index]: where the index lives; postgres lets several nodes share one (the dsn may name several
 * hosts with target_session_attrs=read-write; its password is never logged). */
static const struct key_spec index_keys[] = {
    {"kind", KEY_STRING, SRV(index_kind), "lmdb", 0, 0, 0, 0},
    {"dsn", KEY_STRING, SRV(index_dsn), "", 0, 0, 0, 0},
    /* how long a node's claim on a CDN purge keeps other nodes off it (a killed node's claims
     * are sent by another node once it passes) */
    {"purge_claim_timeout", KEY_DURATION, SRV(purge_claim_timeout_ms), "60s", 1000, 86400000, 0, 0},
    /* how long a node's lease on the job it runs holds without a renewal (renewed every sixth
     * of it): a killed node's jobs are taken over by another node once it passes */
    {"job_lease", KEY_DURATION, SRV(job_lease_ms), "30s", 1000, 3600000, 0, 0},
    {"read_dsn", KEY_STRING, SRV(index_read_dsn), "", 0, 0, 0, 0},
    /* the record cache's entries, ~360 bytes each; rounded up to a power of two */
    {"record_cache", KEY_COUNT, SRV(index_record_cache), "65536", 64, 1 << 24, 0, 0},
};
static const struct key_spec auth_keys[] = {
    {"anonymous", KEY_ANONYMOUS, SRV(anonymous_scopes), "read", 0, 0, 0, 0},
    {"private_metrics", KEY_BOOL, SRV(private_metrics), "false", 0, 0, 0, 0},
};
#define STO(field) offsetof(br_store_config, field)
static const struct key_spec store_keys[] = {
    {"kind", KEY_STRING, STO(kind), "fs", 0, 0, 0, 0},
    {"root", KEY_STRING, STO(root), "", 0, 0, 0, 0},
    {"serve", KEY_SERVE, STO(serve), "proxy", 0, 0, 0, 0},
    {"public_url", KEY_STRING, STO(public_url), "", 0, 0, 0, 0},
    {"prefix", KEY_STRING, STO(prefix), "", 0, 0, 0, 0},
    /* under a minute a redirect may expire before the client follows it; 7 days is S3's limit */
    {"presign_ttl", KEY_DURATION, STO(presign_ttl_ms), "15m", 1000, 7 * 86400000ull, 0, MINUTE_MS},
    {"endpoint", KEY_STRING, STO(endpoint), "", 0, 0, 0, 0},
    {"region", KEY_STRING, STO(region), "us-east-1", 0, 0, 0, 0},
    {"bucket", KEY_STRING, STO(bucket), "", 0, 0, 0, 0},
    {"path_style", KEY_BOOL, STO(path_style), "true", 0, 0, 0, 0},
    {"access_key", KEY_STRING, STO(access_key), "", 0, 0, 0, 0},
    {"secret_key", KEY_STRING, STO(secret_key), "", 0, 0, 0, 0},
    {"session_token", KEY_STRING, STO(session_token), "", 0, 0, 0, 0},
    {"cdn_url", KEY_STRING, STO(cdn_url), "", 0, 0, 0, 0},
    {"spool_dir", KEY_STRING, STO(spool_dir), "", 0, 0, 0, 0},
    {"part_size", KEY_SIZE, STO(part_size), "16MiB", 5 << 20, 5ull << 30, 0, 0},
    {"direct_uploads", KEY_STRING, STO(direct_uploads), "off", 0, 0, 0, 0},
    {"spool_max", KEY_SIZE, STO(spool_max), "256MiB", 10 << 20, 1ull << 50, 0, 0},
    {"url", KEY_STRING, STO(url), "", 0, 0, 0, 0},
    {"connect_timeout", KEY_DURATION, STO(connect_timeout_ms), "2s", 100, 600000, 0, 0},
    {"timeout", KEY_DURATION, STO(timeout_ms), "5m", 1000, 86400000, 0, 0},
    {"stall_timeout", KEY_DURATION, STO(stall_timeout_ms), "10s", 1000, 3600000, 0, 0},
    {"retries", KEY_COUNT, STO(retries), "3", 0, 10, 0, 0},
    {"allow_hardlinks", KEY_BOOL, STO(allow_hardlinks), "false", 0, 0, 0, 0},
};
#define TAB(field) offsetof(br_table_config, field)
static const struct key_spec table_keys[] = {
    {"location", KEY_STRING, TAB(location), "", 0, 0, 0, 0},
    {"column", KEY_STRING, TAB(column), "", 0, 0, 0, 0},
    {"form", KEY_FORM, TAB(form), "hex", 0, 0, 0, 0},
    {"format", KEY_TABLE_FORMAT, TAB(format), NULL, 0, 0, 0, 0}, /* absent: auto-detected */
    {"store", KEY_STRING, TAB(store), "", 0, 0, 0, 0},
    {"rewrite", KEY_REWRITE, 0, NULL, 0, 0, 0, 0},
};
#define TOK(field) offsetof(br_token_config, field)
static const struct key_spec token_keys[] = {
    {"sha256", KEY_SHA256, TOK(sha256), NULL, 0, 0, 0, 0},
    {"scopes", KEY_SCOPES, TOK(scopes), "read", 0, 0, 0, 0},
};
#define CDN(field) offsetof(br_cdn_config, field)
static const struct key_spec cdn_keys[] = {
    {"purge_url", KEY_STRING, CDN(purge_url), "", 0, 0, 0, 0},
    {"method", KEY_STRING, CDN(method), "PURGE", 0, 0, 0, 0},
    {"header", KEY_HEADER, 0, NULL, 0, 0, 0, 0},
};
#define NKEYS(a) (sizeof(a) / sizeof((a)[0]))

/* Per section, the line where each key was first seen (duplicates are refused). */
#define MAX_SECTION_KEYS 48
_Static_assert(NKEYS(server_keys) <= MAX_SECTION_KEYS, "server_keys");
_Static_assert(NKEYS(store_keys) <= MAX_SECTION_KEYS, "store_keys");

int br_config_set_string(char **field, const char *value) {
  char *copy = strdup(value);
  if (!copy) return -1;
  free(*field);
  *field = copy;
  return 0;
}

static int parse_scopes(const char *value, unsigned *out) {
  unsigned scopes = 0;
  char buf[256];
  if (strlen(value) >= sizeof buf) return -1;
  strcpy(buf, value);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
    if (!strcmp(tok, "read"))
      scopes |= BR_SCOPE_READ;
    else if (!strcmp(tok, "write")) /* scopes are independent: list each one a token needs */
      scopes |= BR_SCOPE_WRITE;
    else if (!strcmp(tok, "admin"))
      scopes |= BR_SCOPE_ADMIN;
    else if (!strcmp(tok, "metrics"))
      scopes |= BR_SCOPE_METRICS;
    else if (!strcmp(tok, "none"))
      ;
    else
      return -1;
  }
  *out = scopes;
  return 0;
}

/* "IP" or "IP/BITS" (IPv4 or IPv6) into c. Returns 0 or -1. */
static int parse_cidr(const char *s, size_t len, br_cidr *c) {
  char buf[64];
  if (len == 0 || len >= sizeof buf) return -1;
  memcpy(buf, s, len);
  buf[len] = '\0';
  char *slash = strchr(buf, '/');
  long bits = -1;
  if (slash) {
    char *end = NULL;
    *slash = '\0';
    if (!slash[1]) return -1;
    bits = strtol(slash + 1, &end, 10);
    if (*end || bits < 0) return -1;
  }
  memset(c, 0, sizeof *c);
  if (inet_pton(AF_INET, buf, c->addr) == 1) {
    c->family = AF_INET;
    if (bits > 32) return -1;
    c->bits = bits < 0 ? 32 : (unsigned)bits;
  } else if (inet_pton(AF_INET6, buf, c->addr) == 1) {
    c->family = AF_INET6;
    if (bits > 128) return -1;
    c->bits = bits < 0 ? 128 : (unsigned)bits;
  } else {
    return -1;
  }
  return 0;
}

int br_config_parse_proxies(const char *text, br_cidr out[BR_MAX_PROXIES], int *n, br_err *err) {
  *n = 0;
  for (const char *p = text; *p;) {
    while (*p == ',' || *p == ' ' || *p == '\t') p++;
    if (!*p) break;
    size_t len = strcspn(p, ", \t");
    if (*n == BR_MAX_PROXIES || parse_cidr(p, len, &out[*n]) < 0)
      return br_fail(err, "trusted_proxies: '%.*s' is not an IP address or CIDR%s", (int)len, p,
                     *n == BR_MAX_PROXIES ? " (at most 64 entries)" : "");
    (*n)++;
    p += len;
  }
  return 0;
}

/* Writes ms as the largest unit that divides it ("90s", "2h", "250ms"). */
static const char *fmt_ms(uint64_t ms, char *buf, size_t len) {
  static const struct {
    const char *unit;
    uint64_t ms;
  } units[] = {{"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (ms && ms % units[i].ms == 0) {
      snprintf(buf, len, "%llu%s", (unsigned long long)(ms / units[i].ms), units[i].unit);
      return buf;
    }
  snprintf(buf, len, "%llums", (unsigned long long)ms);
  return buf;
}

/* Refuses n (the parsed value of k) outside k's bounds, saying what they are. */
static int check_range(const struct key_spec *k, const char *value, uint64_t n, br_err *err) {
  char lo[32], hi[32];
  if (k->type == KEY_DURATION) {
    fmt_ms(k->min, lo, sizeof lo);
    fmt_ms(k->max, hi, sizeof hi);
  } else {
    snprintf(lo, sizeof lo, "%llu", (unsigned long long)k->min);
    snprintf(hi, sizeof hi, "%llu", (unsigned long long)k->max);
  }
  if (n > k->max) return br_fail(err, "%s: %s is out of range (at most %s)", k->name, value, hi);
  if (n < k->min && !(k->zero_off && n == 0))
    return br_fail(err, "%s: %s is out of range (%sat least %s)", k->name, value,
                   k->zero_off ? "0 = off, or " : "", lo);
  return 0;
}

/* Sets one key of a section struct from its text value; returns -1 with a message in err. */
static int set_key(const struct key_spec *k, void *base, const char *value, br_err *err) {
  char *p = (char *)base + k->offset;
  uint64_t n = 0;
  switch (k->type) {
    case KEY_STRING:
      return br_config_set_string((char **)p, value) < 0 ? br_fail(err, "out of memory") : 0;
    case KEY_SIZE:
      if (br_parse_size(value, &n) < 0)
        return br_fail(err, "%s: '%s' is not a size (e.g. 512KiB, 64MiB, 5GiB)", k->name, value);
      break;
    case KEY_DURATION:
      if (br_parse_duration_ms(value, &n) < 0)
        return br_fail(err, "%s: '%s' is not a duration (e.g. 30s, 15m, 72h, 7d)", k->name, value);
      break;
    case KEY_COUNT: {
      char *end = NULL;
      unsigned long long v = strtoull(value, &end, 10);
      if (!*value || *end || value[0] == '-')
        return br_fail(err, "%s: '%s' is not a whole number", k->name, value);
      n = v;
      break;
    }
    case KEY_FRACTION: {
      char *end = NULL;
      double d = strtod(value, &end);
      if (!*value || *end || !(d >= 0.0 && d <= 1.0))
        return br_fail(err, "%s: '%s' is not a fraction between 0 and 1", k->name, value);
      *(double *)p = d;
      return 0;
    }
    case KEY_BOOL:
      if (!strcmp(value, "true") || !strcmp(value, "yes") || !strcmp(value, "1"))
        *(int *)p = 1;
      else if (!strcmp(value, "false") || !strcmp(value, "no") || !strcmp(value, "0"))
        *(int *)p = 0;
      else
        return br_fail(err, "%s: '%s' must be true or false", k->name, value);
      return 0;
    case KEY_SERVE:
      if (!strcmp(value, "proxy"))
        *(enum br_serve_mode *)p = BR_SERVE_PROXY;
      else if (!strcmp(value, "redirect"))
        *(enum br_serve_mode *)p = BR_SERVE_REDIRECT;
      else
        return br_fail(err, "%s: '%s' must be proxy or redirect", k->name, value);
      return 0;
    case KEY_FORM:
      if (!strcmp(value, "hex"))
        *(enum br_table_form *)p = BR_FORM_HEX;
      else if (!strcmp(value, "binary"))
        *(enum br_table_form *)p = BR_FORM_BINARY;
      else if (!strcmp(value, "url"))
        *(enum br_table_form *)p = BR_FORM_URL;
      else
        return br_fail(err, "%s: '%s' must be hex, binary or url", k->name, value);
      return 0;
    case KEY_TABLE_FORMAT:
      if (!strcmp(value, "iceberg"))
        *(enum br_table_format *)p = BR_TABLE_ICEBERG;
      else if (!strcmp(value, "delta"))
        *(enum br_table_format *)p = BR_TABLE_DELTA;
      else
        return br_fail(err, "%s: '%s' must be iceberg or delta", k->name, value);
      return 0;
    case KEY_SCOPES:
      if (parse_scopes(value, (unsigned *)p) < 0)
        return br_fail(err, "%s: '%s' must list read, write, admin, metrics (or none)", k->name,
                       value);
      return 0;
    case KEY_ANONYMOUS: /* write or admin here would give them to every client on the network */
      if (!strcmp(value, "read"))
        *(unsigned *)p = BR_SCOPE_READ;
      else if (!strcmp(value, "none"))
        *(unsigned *)p = 0;
      else
        return br_fail(err,
                       "%s: '%s' must be read or none (what a client without a token may do; "
                       "give write and admin to a [token])",
                       k->name, value);
      return 0;
    case KEY_PROXIES: {
      br_cidr cidrs[BR_MAX_PROXIES];
      int nc = 0;
      if (br_config_parse_proxies(value, cidrs, &nc, err) < 0) return -1;
      return br_config_set_string((char **)p, value) < 0 ? br_fail(err, "out of memory") : 0;
    }
    case KEY_TLS_PRIORITY: {
      gnutls_priority_t prio = NULL;
      const char *where = NULL;
      int g = gnutls_priority_init(&prio, value, &where);
      if (g < 0)
        return br_fail(err, "%s: '%s' is not a GnuTLS priority string (%s at '%.40s')", k->name,
                       value, gnutls_strerror(g), where ? where : "");
      gnutls_priority_deinit(prio);
      return br_config_set_string((char **)p, value) < 0 ? br_fail(err, "out of memory") : 0;
    }
    case KEY_SHA256: {
      br_token_config *t = base;
      if (br_hex_decode(value, strlen(value), t->sha256) < 0)
        return br_fail(err, "%s: must be the 64-hex SHA-256 digest of the token", k->name);
      t->has_sha256 = 1;
      return 0;
    }
    case KEY_HEADER: {
      br_cdn_config *c = base;
      const char *colon = strchr(value, ':');
      if (!colon || colon == value) return br_fail(err, "header: expected 'Name: value'");
      for (const char *q = value; q < colon; q++)
        if (*q <= ' ' || *q >= 0x7f || strchr("()<>@,;\\\"/[]?={}", *q))
          return br_fail(err, "header: '%.*s' is not a header name", (int)(colon - value), value);
      for (const char *q = colon; *q; q++)
        if ((unsigned char)*q < 0x20 && *q != '\t')
          return br_fail(err, "header: control characters are not allowed");
      if (c->nheaders >= BR_MAX_CDN_HEADERS)
        return br_fail(err, "header: at most %d per [cdn]", BR_MAX_CDN_HEADERS);
      c->headers[c->nheaders] = strdup(value);
      if (!c->headers[c->nheaders]) return br_fail(err, "out of memory");
      c->nheaders++;
      return 0;
    }
    case KEY_REWRITE: {
      br_table_config *t = base;
      const char *arrow = strstr(value, "=>");
      if (!arrow) return br_fail(err, "rewrite: expected 'FROM => TO'");
      if (t->nrewrites >= BR_MAX_REWRITES)
        return br_fail(err, "rewrite: at most %d per table", BR_MAX_REWRITES);
      const char *from_end = arrow;
      while (from_end > value && (from_end[-1] == ' ' || from_end[-1] == '\t')) from_end--;
      const char *to = arrow + 2;
      while (*to == ' ' || *to == '\t') to++;
      if (from_end == value || !*to) return br_fail(err, "rewrite: FROM and TO must not be empty");
      t->rewrite_from[t->nrewrites] = strndup(value, (size_t)(from_end - value));
      t->rewrite_to[t->nrewrites] = strdup(to);
      t->nrewrites++;
      return 0;
    }
  }
  if (check_range(k, value, n, err) < 0) return -1;
  *(uint64_t *)p = n;
  return 0;
}

static void set_defaults(const struct key_spec *keys, size_t nkeys, void *base) {
  for (size_t i = 0; i < nkeys; i++)
    if (keys[i].default_value) set_key(&keys[i], base, keys[i].default_value, NULL);
}

void br_config_init(br_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  set_defaults(server_keys, NKEYS(server_keys), cfg);
  set_defaults(reconcile_keys, NKEYS(reconcile_keys), cfg);
  set_defaults(auth_keys, NKEYS(auth_keys), cfg);
  set_defaults(index_keys, NKEYS(index_keys), cfg);
}

struct parse_state {
  br_config *cfg;
  const char *name; /* the file, for warnings */
  br_err err;
  int failed;
  char section[256];  /* last section seen, to start a new store/table/token once */
  void *section_base; /* struct the current section's keys go to */
  const struct key_spec *keys;
  size_t nkeys;
  int seen_line[MAX_SECTION_KEYS]; /* where each key of the section was set (0: not yet) */
  /* the entry lines of the text, followed as inih reads them (it tells lines only on errors) */
  const char *scan; /* the next line to look at; NULL: no text (or the end) */
  int scan_line;    /* its number */
  int scan_key;     /* an entry was seen since the last section header */
};

static int names_taken(br_config *cfg, const char *kind, const char *name) {
  if (!strcmp(kind, "store")) {
    for (int i = 0; i < cfg->nstores; i++)
      if (!strcmp(cfg->stores[i].name, name)) return 1;
  } else if (!strcmp(kind, "table")) {
    for (int i = 0; i < cfg->ntables; i++)
      if (!strcmp(cfg->tables[i].name, name)) return 1;
  } else if (!strcmp(kind, "cdn")) {
    for (int i = 0; i < cfg->ncdns; i++)
      if (!strcmp(cfg->cdns[i].name, name)) return 1;
  } else {
    for (int i = 0; i < cfg->ntokens; i++)
      if (!strcmp(cfg->tokens[i].name, name)) return 1;
  }
  return 0;
}

/* Resolves a section header to the struct and key table it fills, creating stores, tables and
 * tokens as they appear. */
static int enter_section(struct parse_state *ps, const char *section) {
  br_config *cfg = ps->cfg;
  snprintf(ps->section, sizeof ps->section, "%s", section);
  memset(ps->seen_line, 0, sizeof ps->seen_line);
  if (!strcmp(section, "server")) {
    ps->section_base = cfg, ps->keys = server_keys, ps->nkeys = NKEYS(server_keys);
    return 0;
  }
  if (!strcmp(section, "reconcile")) {
    ps->section_base = cfg, ps->keys = reconcile_keys, ps->nkeys = NKEYS(reconcile_keys);
    return 0;
  }
  if (!strcmp(section, "auth")) {
    ps->section_base = cfg, ps->keys = auth_keys, ps->nkeys = NKEYS(auth_keys);
    return 0;
  }
  if (!strcmp(section, "index")) {
    ps->section_base = cfg, ps->keys = index_keys, ps->nkeys = NKEYS(index_keys);
    return 0;
  }
  char kind[16], name[128], extra[2];
  int n = sscanf(section, "%15s %127s %1s", kind, name, extra);
  if (n != 2)
    return br_fail(&ps->err,
                   "unknown section [%s] (expected server, store NAME, table NAME, "
                   "reconcile, auth, index, token NAME, cdn NAME)",
                   section);
  for (const char *c = name; *c; c++)
    if (!(*c == '-' || *c == '_' || *c == '.' || (*c >= '0' && *c <= '9') ||
          (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')))
      return br_fail(&ps->err, "[%s]: names may hold letters, digits, '-', '_' and '.'", section);
  if (strcmp(kind, "store") && strcmp(kind, "table") && strcmp(kind, "token") &&
      strcmp(kind, "cdn"))
    return br_fail(&ps->err, "unknown section [%s]", section);
  if (names_taken(cfg, kind, name)) return br_fail(&ps->err, "[%s] appears twice", section);
  if (!strcmp(kind, "store")) {
    if (cfg->nstores >= BR_MAX_STORES) return br_fail(&ps->err, "too many stores");
    br_store_config *s = &cfg->stores[cfg->nstores++];
    set_defaults(store_keys, NKEYS(store_keys), s);
    s->name = strdup(name);
    ps->section_base = s, ps->keys = store_keys, ps->nkeys = NKEYS(store_keys);
  } else if (!strcmp(kind, "table")) {
    if (cfg->ntables >= BR_MAX_TABLES) return br_fail(&ps->err, "too many tables");
    br_table_config *t = &cfg->tables[cfg->ntables++];
    set_defaults(table_keys, NKEYS(table_keys), t);
    t->name = strdup(name);
    ps->section_base = t, ps->keys = table_keys, ps->nkeys = NKEYS(table_keys);
  } else if (!strcmp(kind, "cdn")) {
    if (cfg->ncdns >= BR_MAX_CDNS) return br_fail(&ps->err, "too many [cdn] sections");
    br_cdn_config *c = &cfg->cdns[cfg->ncdns++];
    set_defaults(cdn_keys, NKEYS(cdn_keys), c);
    c->name = strdup(name);
    ps->section_base = c, ps->keys = cdn_keys, ps->nkeys = NKEYS(cdn_keys);
  } else {
    if (cfg->ntokens >= BR_MAX_TOKENS) return br_fail(&ps->err, "too many tokens");
    br_token_config *t = &cfg->tokens[cfg->ntokens++];
    set_defaults(token_keys, NKEYS(token_keys), t);
    t->name = strdup(name);
    ps->section_base = t, ps->keys = token_keys, ps->nkeys = NKEYS(token_keys);
  }
  return 0;
}

/* The line of the entry inih hands over next, found the way inih reads the text: blank lines
 * and lines starting with ';' or '#' are skipped, a '[' line starts a section, an indented line
 * after an entry of the same section continues that entry's value (*continued = 1), any other is
 * an entry. Returns its number, or 0 when the text is not known. */
static int next_entry_line(struct parse_state *ps, int *continued) {
  *continued = 0;
  while (ps->scan && *ps->scan) {
    const char *line = ps->scan, *eol = strchr(line, '\n');
    int number = ps->scan_line++;
    ps->scan = eol ? eol + 1 : NULL;
    if (number == 1 && !strncmp(line, "\xEF\xBB\xBF", 3)) line += 3;
    const char *start = line;
    while (start != eol && *start && (*start == ' ' || *start == '\t' || *start == '\r')) start++;
    if (start == eol || !*start || *start == ';' || *start == '#') continue;
    if (ps->scan_key && start > line) {
      *continued = 1;
      return number;
    }
    if (*start == '[') {
      ps->scan_key = 0;
      continue;
    }
    ps->scan_key = 1;
    return number;
  }
  return 0;
}

/* A value in range but below k's warn_below: loads, with a warning logged and kept in cfg. */
static void warn_low(struct parse_state *ps, const struct key_spec *k, const char *value,
                     int line) {
  if (k->type != KEY_DURATION || !k->warn_below) return;
  uint64_t n = *(uint64_t *)((char *)ps->section_base + k->offset);
  if (n >= k->warn_below || (k->zero_off && n == 0)) return;
  char floor[32];
  br_config *cfg = ps->cfg;
  char msg[1024];
  snprintf(msg, sizeof msg, "%s:%d: [%s] %s = %s is under %s: meant for tests, not production",
           ps->name, line, ps->section, k->name, value, fmt_ms(k->warn_below, floor, sizeof floor));
  br_warn("config: %s", msg);
  if (cfg->nwarnings == BR_MAX_CONFIG_WARNINGS) return;
  char *keep = cfg->warnings[cfg->nwarnings++];
  size_t len = strlen(msg) < sizeof cfg->warnings[0] ? strlen(msg) : sizeof cfg->warnings[0] - 1;
  memcpy(keep, msg, len);
  keep[len] = '\0';
}

static int on_ini_entry(void *user, const char *section, const char *name, const char *value) {
  struct parse_state *ps = user;
  if (ps->failed) return 0;
  int continued = 0, line = next_entry_line(ps, &continued);
  if (!*section) {
    br_fail(&ps->err, "'%s' before any [section]", name);
    goto fail;
  }
  if (strcmp(section, ps->section) != 0 && enter_section(ps, section) < 0) goto fail;
  if (continued) {
    br_fail(&ps->err,
            "[%s] %s: an indented line would continue its value; values take one line (remove "
            "the indentation)",
            section, name);
    goto fail;
  }
  for (size_t i = 0; i < ps->nkeys; i++) {
    const struct key_spec *k = &ps->keys[i];
    if (strcmp(k->name, name)) continue;
    if (ps->seen_line[i] && k->type != KEY_REWRITE && k->type != KEY_HEADER) {
      if (ps->seen_line[i] > 0)
        br_fail(&ps->err, "[%s] %s is set twice (first on line %d)", section, name,
                ps->seen_line[i]);
      else
        br_fail(&ps->err, "[%s] %s is set twice", section, name);
      goto fail;
    }
    ps->seen_line[i] = line ? line : -1;
    br_err kerr;
    if (set_key(k, ps->section_base, value, &kerr) < 0) {
      br_fail(&ps->err, "[%s] %s", section, kerr.msg);
      goto fail;
    }
    warn_low(ps, k, value, line);
    return 1;
  }
  br_fail(&ps->err, "[%s]: unknown key '%s'", section, name);
fail:
  ps->failed = 1;
  return 0;
}

/* Line number of the header "[kind name]" in text (inih reports lines only for errors), for
 * messages about whole sections; 0 if not found. */
static int section_line(const char *text, const char *kind, const char *name) {
  int line = 1;
  for (const char *p = text; *p; line++) {
    const char *eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    while (len && (*p == ' ' || *p == '\t')) p++, len--;
    size_t kl = strlen(kind), nl = strlen(name);
    if (len > kl + nl + 2 && p[0] == '[' && !strncmp(p + 1, kind, kl) && p[1 + kl] == ' ') {
      const char *q = p + 1 + kl;
      while (*q == ' ') q++;
      if (!strncmp(q, name, nl) && (q[nl] == ']' || q[nl] == ' ')) return line;
    }
    if (!eol) break;
    p = eol + 1;
  }
  return 0;
}

/* Checks every [section] header before parsing: known kinds, valid names, none twice. (inih
 * calls us only for keys, so an empty or repeated section would otherwise go unnoticed.) */
static int check_sections(const char *text, const char *name, br_err *err) {
  enum { MAX_SECTIONS = BR_MAX_STORES + BR_MAX_TABLES + BR_MAX_TOKENS + 8 };
  char seen[MAX_SECTIONS][160];
  int nseen = 0, line = 1;
  for (const char *p = text; *p; line++) {
    const char *eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    while (len && (*p == ' ' || *p == '\t')) p++, len--;
    if (len && *p == '[') {
      const char *close = memchr(p, ']', len);
      if (!close) return br_fail(err, "%s:%d: section header without ']'", name, line);
      char section[160];
      size_t sl = (size_t)(close - p - 1);
      if (sl >= sizeof section) return br_fail(err, "%s:%d: section name too long", name, line);
      memcpy(section, p + 1, sl);
      section[sl] = '\0';
      struct parse_state probe;
      br_config scratch;
      memset(&probe, 0, sizeof probe);
      br_config_init(&scratch);
      probe.cfg = &scratch;
      int rc = enter_section(&probe, section);
      br_config_free(&scratch);
      if (rc < 0) return br_fail(err, "%s:%d: %s", name, line, probe.err.msg);
      for (int i = 0; i < nseen; i++)
        if (!strcmp(seen[i], section))
          return br_fail(err, "%s:%d: [%s] appears twice", name, line, section);
      if (nseen == MAX_SECTIONS) return br_fail(err, "%s:%d: too many sections", name, line);
      memcpy(seen[nseen++], section, sl + 1);
    }
    if (!eol) break;
    p = eol + 1;
  }
  return 0;
}

static int load(br_config *cfg, const char *text, const char *name, br_err *err) {
  if (check_sections(text, name, err) < 0) return -1;
  struct parse_state ps = {.cfg = cfg, .name = name, .scan = text, .scan_line = 1};
  int line = ini_parse_string(text, on_ini_entry, &ps);
  for (int i = 0; i < cfg->nstores; i++)
    if (!cfg->stores[i].line)
      cfg->stores[i].line = section_line(text, "store", cfg->stores[i].name);
  for (int i = 0; i < cfg->ntables; i++)
    if (!cfg->tables[i].line)
      cfg->tables[i].line = section_line(text, "table", cfg->tables[i].name);
  for (int i = 0; i < cfg->ncdns; i++)
    if (!cfg->cdns[i].line) cfg->cdns[i].line = section_line(text, "cdn", cfg->cdns[i].name);
  for (int i = 0; i < cfg->ntokens; i++)
    if (!cfg->tokens[i].line)
      cfg->tokens[i].line = section_line(text, "token", cfg->tokens[i].name);
  if (line == 0 && !ps.failed) return 0;
  if (!ps.failed) br_fail(&ps.err, "syntax error (expected [section] or key = value)");
  if (line < 0) return br_fail(err, "%s: %s", name, ps.err.msg);
  return br_fail(err, "%s:%d: %s", name, line, ps.err.msg);
}

int br_config_load_string(br_config *cfg, const char *text, const char *name, br_err *err) {
  if (br_config_set_string(&cfg->path, name) < 0) return br_fail(err, "out of memory");
  return load(cfg, text, name, err);
}

int br_config_load(br_config *cfg, const char *path, br_err *err) {
  br_source *src = br_source_open_file(path, err);
  if (!src) return -1;
  uint8_t *text = NULL;
  size_t len = 0;
  int rc = br_source_read_all(src, 1 << 20, &text, &len, err);
  br_source_close(src);
  if (rc < 0) return br_fail(err, "%s: %s", path, err->msg);
  if (memchr(text, '\0', len)) {
    free(text);
    return br_fail(err, "%s: contains a NUL byte", path);
  }
  rc = br_config_set_string(&cfg->path, path) < 0 ? br_fail(err, "out of memory")
                                                  : load(cfg, (const char *)text, path, err);
  free(text);
  return rc;
}

const br_store_config *br_config_store(const br_config *cfg, const char *name) {
  for (int i = 0; i < cfg->nstores; i++)
    if (!strcmp(cfg->stores[i].name, name)) return &cfg->stores[i];
  return NULL;
}

int br_config_finish(br_config *cfg, br_err *err) {
  const char *where = cfg->path ? cfg->path : "(built-in defaults)";
  if (cfg->nstores == 0) {
    br_store_config *s = &cfg->stores[cfg->nstores++];
    set_defaults(store_keys, NKEYS(store_keys), s);
    s->name = strdup("local");
    char root[4096];
    snprintf(root, sizeof root, "%s/blobs", cfg->data_dir);
    br_config_set_string(&s->root, root);
  }
  for (int i = 0; i < cfg->nstores; i++) {
    br_store_config *s = &cfg->stores[i];
    if (!strcmp(s->kind, "fs") && !*s->root)
      return br_fail(err, "%s:%d: [store %s] kind = fs needs root", where, s->line, s->name);
    if (strlen(s->prefix) > 512)
      return br_fail(err, "%s:%d: [store %s] prefix is over 512 characters", where, s->line,
                     s->name);
    if (s->serve == BR_SERVE_REDIRECT && !strcmp(s->kind, "fs") && !*s->public_url)
      return br_fail(err, "%s:%d: [store %s] serve = redirect needs public_url", where, s->line,
                     s->name);
    if (strcmp(s->kind, "fs") && strcmp(s->kind, "s3") && strcmp(s->kind, "http"))
      return br_fail(err, "%s:%d: [store %s] kind must be fs, s3 or http", where, s->line, s->name);
    if (!strcmp(s->kind, "s3") && (!*s->endpoint || !*s->bucket))
      return br_fail(err, "%s:%d: [store %s] kind = s3 needs endpoint and bucket", where, s->line,
                     s->name);
    if (!strcmp(s->kind, "http") && !*s->url)
      return br_fail(err, "%s:%d: [store %s] kind = http needs url", where, s->line, s->name);
    if (!strcmp(s->kind, "s3") && s->spool_max < 2 * s->part_size)
      return br_fail(err, "%s:%d: [store %s] spool_max must hold two parts (2 x part_size)", where,
                     s->line, s->name);
    if (strcmp(s->direct_uploads, "off") && strcmp(s->direct_uploads, "auto") &&
        strcmp(s->direct_uploads, "on"))
      return br_fail(err, "%s:%d: [store %s] direct_uploads must be off, auto or on", where,
                     s->line, s->name);
    s->spool_max_total = cfg->spool_max_total;
    if (!strcmp(s->kind, "s3") && !*s->spool_dir) {
      char spool[4096];
      snprintf(spool, sizeof spool, "%s/spool/%s", cfg->data_dir, s->name);
      if (br_config_set_string(&s->spool_dir, spool) < 0) return br_fail(err, "out of memory");
    }
  }
  if (strcmp(cfg->index_kind, "lmdb") && strcmp(cfg->index_kind, "postgres"))
    return br_fail(err, "%s: [index] kind: '%s' is not lmdb or postgres", where, cfg->index_kind);
  if (!strcmp(cfg->index_kind, "postgres") != !!*cfg->index_dsn)
    return br_fail(err, "%s: [index] dsn goes with kind = postgres (and only with it)", where);
  if (*cfg->index_read_dsn && !*cfg->index_dsn)
    return br_fail(err, "%s: [index] read_dsn goes with kind = postgres and a dsn", where);
  if (!*cfg->tls_cert != !*cfg->tls_key)
    return br_fail(err, "%s: [server] tls_cert and tls_key go together", where);
  if (!*cfg->upload_store) br_config_set_string(&cfg->upload_store, cfg->stores[0].name);
  if (!br_config_store(cfg, cfg->upload_store))
    return br_fail(err, "%s: [server] upload_store: no [store %s]", where, cfg->upload_store);
  const br_store_config *us = br_config_store(cfg, cfg->upload_store);
  if (strcmp(us->direct_uploads, "off") && us->presign_ttl_ms > cfg->direct_upload_grace_ms)
    return br_fail(err,
                   "%s: [store %s] presign_ttl is longer than [server] direct_upload_grace: an "
                   "upload could land after its plan was swept",
                   where, us->name);
  if (!strcmp(br_config_store(cfg, cfg->upload_store)->kind, "http"))
    return br_fail(err, "%s: [server] upload_store: [store %s] is a read-only http origin", where,
                   cfg->upload_store);
  for (int i = 0; i < cfg->ntables; i++) {
    br_table_config *t = &cfg->tables[i];
    if (!*t->location || !*t->column)
      return br_fail(err, "%s:%d: [table %s] location and column are required", where, t->line,
                     t->name);
    if (*t->store && !br_config_store(cfg, t->store))
      return br_fail(err, "%s:%d: [table %s] no [store %s]", where, t->line, t->name, t->store);
  }
  for (int i = 0; i < cfg->ncdns; i++) {
    br_cdn_config *c = &cfg->cdns[i];
    if (strncmp(c->purge_url, "http://", 7) && strncmp(c->purge_url, "https://", 8))
      return br_fail(err, "%s:%d: [cdn %s] purge_url must be an http(s) URL", where, c->line,
                     c->name);
    if (!strstr(c->purge_url, "{hash}"))
      return br_fail(err, "%s:%d: [cdn %s] purge_url must contain {hash}", where, c->line, c->name);
    if (!*c->method || strspn(c->method, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != strlen(c->method))
      return br_fail(err, "%s:%d: [cdn %s] method must be an upper-case token (PURGE, BAN)", where,
                     c->line, c->name);
  }
  for (int i = 0; i < cfg->ntokens; i++)
    if (!cfg->tokens[i].has_sha256)
      return br_fail(err, "%s:%d: [token %s] sha256 is required", where, cfg->tokens[i].line,
                     cfg->tokens[i].name);
  return 0;
}

static void free_strings(const struct key_spec *keys, size_t nkeys, void *base) {
  for (size_t i = 0; i < nkeys; i++)
    if (keys[i].type == KEY_STRING || keys[i].type == KEY_PROXIES ||
        keys[i].type == KEY_TLS_PRIORITY) {
      char **p = (char **)((char *)base + keys[i].offset);
      free(*p);
      *p = NULL;
    }
}

void br_config_free(br_config *cfg) {
  free_strings(server_keys, NKEYS(server_keys), cfg);
  free_strings(index_keys, NKEYS(index_keys), cfg);
  for (int i = 0; i < cfg->nstores; i++) {
    free_strings(store_keys, NKEYS(store_keys), &cfg->stores[i]);
    free(cfg->stores[i].name);
  }
  for (int i = 0; i < cfg->ntables; i++) {
    br_table_config *t = &cfg->tables[i];
    free_strings(table_keys, NKEYS(table_keys), t);
    for (int r = 0; r < t->nrewrites; r++) {
      free(t->rewrite_from[r]);
      free(t->rewrite_to[r]);
    }
    free(t->name);
  }
  for (int i = 0; i < cfg->ntokens; i++) free(cfg->tokens[i].name);
  for (int i = 0; i < cfg->ncdns; i++) {
    free_strings(cdn_keys, NKEYS(cdn_keys), &cfg->cdns[i]);
    for (int h = 0; h < cfg->cdns[i].nheaders; h++) free(cfg->cdns[i].headers[h]);
    free(cfg->cdns[i].name);
  }
  free(cfg->path);
  memset(cfg, 0, sizeof *cfg);
}
