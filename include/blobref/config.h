/* blobref configuration: the INI file (conf/blobref.conf) and command-line overrides. */
#ifndef BLOBREF_CONFIG_H
#define BLOBREF_CONFIG_H

#include "blobref/common.h"

#define BR_MAX_STORES 32
#define BR_MAX_TABLES 64
#define BR_MAX_TOKENS 64
#define BR_MAX_REWRITES 16
#define BR_MAX_CDNS 8
#define BR_MAX_CDN_HEADERS 8
#define BR_MAX_PROXIES 64
#define BR_MAX_CONFIG_WARNINGS 8

/* [server] tls_priorities by default: TLS 1.3 and 1.2 only, AEAD ciphers, ECDHE key exchange
 * (forward secrecy); certificates of any size (NORMAL, not a SECURE level). */
#define BR_TLS_PRIORITIES_DEFAULT                                                               \
  "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-256-GCM:+AES-128-GCM:+CHACHA20-" \
  "POLY1305:-KX-ALL:+ECDHE-ECDSA:+ECDHE-RSA"

enum br_serve_mode { BR_SERVE_PROXY, BR_SERVE_REDIRECT };

/* Everything a store kind needs to open; filled from a `[store NAME]` section. Strings are owned
 * by the config that holds this struct. */
typedef struct br_store_config {
  char *name;
  char *kind;       /* "fs" | "s3" | "http" */
  char *root;       /* fs: directory */
  char *public_url; /* fs/http: base URL for redirects ("" = none) */
  char *prefix;     /* key prefix, e.g. "" or "blobs/" */
  enum br_serve_mode serve;
  uint64_t presign_ttl_ms;
  /* s3 */
  char *endpoint; /* "http(s)://host[:port]" */
  char *region;
  char *bucket;
  int path_style; /* 1: endpoint/bucket/key; 0: bucket.endpoint/key */
  char *access_key, *secret_key, *session_token; /* "" = from AWS_* environment variables */
  char *cdn_url;   /* s3: base URL that replaces the endpoint in redirects ("" = presign) */
  char *spool_dir; /* s3: local directory where upload bodies wait for their part upload */
  uint64_t part_size;
  char *direct_uploads;     /* s3: "off" | "auto" | "on": clients PUT blobs to the bucket */
  uint64_t spool_max;       /* s3: spooled bytes not yet sent, all uploads of this store */
  uint64_t spool_max_total; /* s3: the same over every s3 store ([server] spool_max_total) */
  /* s3 and http */
  char *url; /* http: the origin's base URL */
  uint64_t connect_timeout_ms, timeout_ms;
  uint64_t stall_timeout_ms; /* s3: no byte moving for this long fails the request */
  uint64_t retries;
  int allow_hardlinks; /* fs: serve files with more than one name (st_nlink > 1); refused if 0 */
  int line;            /* where the section starts in the config file, for messages */
  int read_only;       /* set by tools that only look (fsck): no directories made, no clean-up */
} br_store_config;

enum br_table_form { BR_FORM_HEX, BR_FORM_BINARY, BR_FORM_URL };
/* [table] format: AUTO (key absent) = Delta Lake when the location holds _delta_log/. */
enum br_table_format { BR_TABLE_AUTO, BR_TABLE_ICEBERG, BR_TABLE_DELTA };

typedef struct br_table_config {
  char *name;
  char *location;
  char *column;
  enum br_table_form form;
  enum br_table_format format;
  char *store;
  char *rewrite_from[BR_MAX_REWRITES];
  char *rewrite_to[BR_MAX_REWRITES];
  int nrewrites;
  int line;
} br_table_config;

/* METRICS: /metrics and /readyz's details when [auth] private_metrics is set (admin has it too). */
enum br_scope { BR_SCOPE_READ = 1, BR_SCOPE_WRITE = 2, BR_SCOPE_ADMIN = 4, BR_SCOPE_METRICS = 8 };

typedef struct br_token_config {
  char *name;
  uint8_t sha256[BR_SHA256_LEN];
  int has_sha256;
  unsigned scopes; /* BR_SCOPE_* bits */
  int line;
} br_token_config;

/* A CDN to purge when a blob stops being servable (quarantined, deleted, moved). */
typedef struct br_cdn_config {
  char *name;
  char *purge_url;                   /* template: "{hash}" is replaced by the blob's hex */
  char *method;                      /* PURGE (default), BAN, ... */
  char *headers[BR_MAX_CDN_HEADERS]; /* "Name: value" lines sent with each purge */
  int nheaders;
  int line;
} br_cdn_config;

/* Every setting, with its default filled in by br_config_init. Strings are owned by the config. */
typedef struct br_config {
  char *path;         /* the file loaded last (for messages), or NULL */
  char *listen;       /* "HOST:PORT" */
  char *data_dir;     /* LMDB index in data_dir/index; default fs store root data_dir/blobs */
  char *upload_store; /* store name for new blobs ("" = the first) */
  uint64_t max_blob_size;
  uint64_t max_url_length;
  uint64_t max_header_size;
  uint64_t max_json_size;
  uint64_t max_lookup_hashes;
  uint64_t connection_timeout_ms;
  uint64_t max_connections;
  uint64_t spool_max_total; /* bytes spooled for S3 and not yet sent, all s3 stores */
  uint64_t threads;         /* 0 = number of cores */
  uint64_t connection_memory;
  uint64_t index_map_size;
  uint64_t index_batch_max;
  char *index_kind; /* [index] kind: lmdb (DATA_DIR/index) or postgres (index_dsn) */
  char *index_dsn;  /* [index] dsn: libpq conninfo or URI (the PG* environment applies) */
  /* [index] purge_claim_timeout: how long a node's claim on a CDN purge holds (postgres) */
  uint64_t purge_claim_timeout_ms;
  /* [index] job_lease: how long a node's lease on a running job holds unrenewed (postgres) */
  uint64_t job_lease_ms;
  char *index_read_dsn;        /* [index] read_dsn: a read replica for point reads ("" = none) */
  uint64_t index_record_cache; /* [index] record_cache: entries of the index's record cache */
  uint64_t cache_max_age_ms;   /* redirects' private max-age */
  uint64_t cache_size;         /* in-memory cache of small blobs (0 = off) */
  uint64_t cache_max_blob;     /* largest blob it holds */
  uint64_t shutdown_timeout_ms;
  uint64_t dedup_touch_interval_ms; /* a dedup hit refreshes last_upload when it is this old */
  char *access_log;                 /* "off", "stderr" or a file path (reopened on SIGHUP) */
  char *trusted_proxies;            /* IPs / CIDRs whose X-Request-Id is taken ("" = none) */
  uint64_t max_connections_per_ip;  /* 0 = no per-IP limit */
  uint64_t max_json_inflight; /* bytes of JSON request bodies buffered at once, all requests */
  uint64_t request_header_timeout_ms; /* an incomplete request head (or idle connection) is cut */
  uint64_t min_body_rate;             /* bytes/s a body must average after the header timeout */
  char *tls_cert;          /* PEM certificate chain: listen serves HTTPS ("" = plain HTTP) */
  char *tls_key;           /* PEM private key of tls_cert */
  char *tls_priorities;    /* GnuTLS priority string of HTTPS handshakes (checked at load) */
  char *listen_plain;      /* an extra plain-HTTP listener ("" = none) */
  uint64_t drain_grace_ms; /* a moved blob's old copy is deleted after this long */
  uint64_t direct_upload_grace_ms; /* a direct-upload plan never committed is swept after this */
  /* [reconcile] */
  uint64_t reconcile_interval_ms;
  uint64_t grace_ms;
  uint64_t retention_ms;
  double max_fraction;
  int reconcile_lists; /* each run records its blobs per action (false: counts only) */
  /* [auth] */
  unsigned anonymous_scopes;
  int private_metrics; /* /metrics and /readyz's details need the metrics or admin scope */

  br_store_config stores[BR_MAX_STORES];
  int nstores;
  br_table_config tables[BR_MAX_TABLES];
  int ntables;
  br_token_config tokens[BR_MAX_TOKENS];
  int ntokens;
  br_cdn_config cdns[BR_MAX_CDNS];
  int ncdns;
  /* "FILE:LINE: ..." of values that load but look wrong (also logged as warnings) */
  char warnings[BR_MAX_CONFIG_WARNINGS][256];
  int nwarnings;
} br_config;

/* One entry of [server] trusted_proxies: an IPv4 or IPv6 address and a prefix length. */
typedef struct br_cidr {
  int family; /* AF_INET or AF_INET6 */
  uint8_t addr[16];
  unsigned bits;
} br_cidr;

/* Fills cfg with defaults (no stores yet). */
void br_config_init(br_config *cfg);

/* Reads an INI file over the defaults. On error returns -1 with err = "file:line: message". */
int br_config_load(br_config *cfg, const char *path, br_err *err);

/* Same, from a string (for tests); name is used in messages. */
int br_config_load_string(br_config *cfg, const char *text, const char *name, br_err *err);

/* Completes the config after file and flags: adds the embedded default store `local` (fs under
 * data_dir/blobs) when none is configured, checks cross-references (upload_store, table stores).
 * Returns -1 with err = "FILE:LINE: message". */
int br_config_finish(br_config *cfg, br_err *err);

/* Replaces a string setting (frees the old value). Returns -1 on allocation failure. */
int br_config_set_string(char **field, const char *value);

/* Parses a trusted_proxies value (IPs and CIDRs separated by commas or spaces, at most
 * BR_MAX_PROXIES) into out[0..*n). Returns 0, or -1 with err naming the bad entry. Pure. */
int br_config_parse_proxies(const char *text, br_cidr out[BR_MAX_PROXIES], int *n, br_err *err);

/* The store config of that name, or NULL. */
const br_store_config *br_config_store(const br_config *cfg, const char *name);

void br_config_free(br_config *cfg);

#endif
