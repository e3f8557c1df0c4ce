/* Config parsing: defaults, every key type, bad files stopping with file:line, and values that
 * cannot mean what they say (anonymous admin, bad proxies, absurd durations, a key set twice, a
 * bad TLS priority string). */
#include "blobref/config.h"
#include "unit.h"

static const struct {
  const char *text;
  const char *want_error; /* substring of the message, NULL = must load */
} cases[] = {
    {"[server]\nlisten = 0.0.0.0:9000\nmax_blob_size = 64MiB\n", NULL},
    {"; comment\n[server]\nconnection_timeout = 2s ; inline comment\n", NULL},
    {"[store local]\nkind = fs\nroot = /tmp/x\nserve = redirect\npublic_url = http://cdn/b\n",
     NULL},
    {"[table images]\nlocation = /w/t\ncolumn = h\nform = url\nrewrite = s3://w/ => /srv/w/\n"
     "rewrite = s3a://w/ => /srv/w/\n",
     NULL},
    {"[reconcile]\ninterval = 6h\ngrace = 72h\nretention = 7d\nmax_fraction = 0.10\n", NULL},
    {"[auth]\nanonymous = none\n[token ci]\nsha256 = "
     "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03\nscopes = read, write\n",
     NULL},
    {"[server]\nmax_blob_size = lots\n",
     "test.conf:2: [server] max_blob_size: 'lots' is not a size"},
    {"[server]\n\nnope = 1\n", "test.conf:3: [server]: unknown key 'nope'"},
    {"[servr]\nlisten = x\n", "test.conf:1: unknown section [servr]"},
    {"listen = x\n", "test.conf:1: 'listen' before any [section]"},
    {"[server]\nthis is not ini\n", "test.conf:2:"},
    {"[server]\nconnection_timeout = 5x\n", "test.conf:2: [server] connection_timeout"},
    {"[server]\nmax_url_length = 10\n", "out of range"},
    {"[store a]\nserve = sideways\n", "must be proxy or redirect"},
    {"[store a]\nkind = fs\nroot = /x\n[store a]\nroot = /y\n",
     "test.conf:4: [store a] appears twice"},
    {"[store a b]\n", "unknown section"},
    {"[store a/b]\nroot=/x\n", "names may hold"},
    {"[table t]\nform = base64\n", "must be hex, binary or url"},
    {"[table t]\nformat = hudi\n",
     "test.conf:2: [table t] format: 'hudi' must be iceberg or delta"},
    {"[table t]\nrewrite = nothing\n", "expected 'FROM => TO'"},
    {"[token t]\nsha256 = abc\n", "64-hex SHA-256"},
    {"[auth]\nanonymous = everything\n",
     "test.conf:2: [auth] anonymous: 'everything' must be read or none"},
    {"[reconcile]\nmax_fraction = 1.5\n", "fraction between 0 and 1"},
    {"[server]\naccess_log = /var/log/blobref/access.log\ntrusted_proxies = 10.0.0.0/8, ::1\n"
     "max_connections_per_ip = 64\nmax_json_inflight = 1GiB\nrequest_header_timeout = 20s\n"
     "min_body_rate = 0\ntls_cert = /c.pem\ntls_key = /k.pem\nlisten_plain = 127.0.0.1:8081\n",
     NULL},
    {"[server]\nrequest_header_timeout = 500ms\n", "request_header_timeout: 500ms is out of range"},
    {"[server]\nmax_json_inflight = 1KiB\n", "max_json_inflight: 1KiB is out of range"},
    {"[server]\nmin_body_rate = fast\n", "min_body_rate: 'fast' is not a size"},
    /* [auth] anonymous: what a client without a token may do is read or nothing */
    {"[auth]\nanonymous = read\n", NULL},
    {"[auth]\nanonymous = none\n", NULL},
    {"[auth]\nanonymous = admin\n", "test.conf:2: [auth] anonymous: 'admin' must be read or none"},
    {"[auth]\nanonymous = write\n", "test.conf:2: [auth] anonymous: 'write' must be read or none"},
    {"[auth]\n\nanonymous = read, write\n", "test.conf:3: [auth] anonymous: 'read, write' must be"},
    {"[auth]\nanonymous = read,admin\n", "must be read or none"},
    /* trusted_proxies: every entry an IP or a CIDR, at load time */
    {"[server]\ntrusted_proxies = 192.168.1.1 fe80::/10,10.1.0.0/16\n", NULL},
    {"[server]\nlisten = :1\ntrusted_proxies = 10.0.0.0/33\n",
     "test.conf:3: [server] trusted_proxies: '10.0.0.0/33' is not an IP address or CIDR"},
    {"[server]\ntrusted_proxies = 10.0.0.1, proxy.example\n",
     "test.conf:2: [server] trusted_proxies: 'proxy.example' is not an IP address or CIDR"},
    {"[server]\ntrusted_proxies = 10.0.0.1/\n", "'10.0.0.1/' is not an IP address or CIDR"},
    {"[server]\ntrusted_proxies = ::1/129\n", "'::1/129' is not an IP address or CIDR"},
    {"[server]\ntrusted_proxies = 10.0.0.1/-1\n", "'10.0.0.1/-1' is not an IP address or CIDR"},
    /* durations that cannot mean what they say */
    {"[reconcile]\ninterval = 0\n", NULL},
    {"[reconcile]\ninterval = 500ms\n",
     "test.conf:2: [reconcile] interval: 500ms is out of range (0 = off, or at least 1s)"},
    {"[reconcile]\ngrace = 0\n", "test.conf:2: [reconcile] grace: 0 is out of range (at least 1s)"},
    {"[reconcile]\nretention = 0s\n", "[reconcile] retention: 0s is out of range (at least 1s)"},
    {"[server]\ndrain_grace = 0\n", "[server] drain_grace: 0 is out of range (at least 1s)"},
    {"[store a]\npresign_ttl = 500ms\n",
     "[store a] presign_ttl: 500ms is out of range (at least 1s)"},
    {"[store a]\npresign_ttl = 8d\n", "[store a] presign_ttl: 8d is out of range (at most 7d)"},
    /* a key set twice in a section: the second line is named */
    {"[server]\nlisten = 127.0.0.1:1\n\nlisten = 127.0.0.1:2\n",
     "test.conf:4: [server] listen is set twice (first on line 2)"},
    {"[store a]\nroot = /x\n; root = /z\nroot = /y\n",
     "test.conf:4: [store a] root is set twice (first on line 2)"},
    {"[auth]\nanonymous = none\nanonymous = read\n", "test.conf:3: [auth] anonymous is set twice"},
    {"[reconcile]\ngrace = 1h\n[auth]\nanonymous = none\n[reconcile]\ngrace = 2h\n",
     "test.conf:5: [reconcile] appears twice"},
    {"[store a]\nroot = /x\n[store b]\nroot = /y\n", NULL},
    {"[cdn e]\npurge_url = http://c/{hash}\nheader = A: 1\nheader = B: 2\n", NULL},
    {"[server]\n  listen = 127.0.0.1:1\n", NULL},
    {"[server]\nlisten = 127.0.0.1:1\n  data_dir = /x\n",
     "test.conf:3: [server] listen: an indented line would continue its value"},
    /* tls_priorities: checked by GnuTLS at load */
    {"[server]\ntls_priorities = NORMAL:-VERS-ALL:+VERS-TLS1.3\n", NULL},
    {"[server]\ntls_priorities = NORMAL:+NOPE\n",
     "test.conf:2: [server] tls_priorities: 'NORMAL:+NOPE' is not a GnuTLS priority string"},
    {"[server]\ntls_priorities =\n", "test.conf:2: [server] tls_priorities: '' is not a GnuTLS"},
    {"[store a]\nroot = /x\nallow_hardlinks = maybe\n", "allow_hardlinks: 'maybe' must be true"},
};

/* Values that load, with a warning (FILE:LINE) or none. */
static const struct {
  const char *text;
  const char *want_warning; /* NULL: no warning */
} warn_cases[] = {
    {"[reconcile]\ninterval = 30s\n",
     "w.conf:2: [reconcile] interval = 30s is under 1m: meant for tests, not production"},
    {"[reconcile]\ninterval = 0\n", NULL},
    {"[reconcile]\ninterval = 1m\n", NULL},
    {"[reconcile]\n\ngrace = 10m\n", "w.conf:3: [reconcile] grace = 10m is under 1h"},
    {"[reconcile]\ngrace = 1h\nretention = 1s\n",
     "w.conf:3: [reconcile] retention = 1s is under 1h"},
    {"[server]\ndrain_grace = 30s\n", "w.conf:2: [server] drain_grace = 30s is under 1m"},
    {"[store a]\nroot = /x\npresign_ttl = 10s\n",
     "w.conf:3: [store a] presign_ttl = 10s is under 1m"},
    {"[store a]\nroot = /x\npresign_ttl = 15m\n", NULL},
};

static const struct {
  const char *text;
  const char *want_error; /* from br_config_finish */
} finish_cases[] = {
    {"[store a]\nkind = fs\n", "f.conf:1: [store a] kind = fs needs root"},
    {"[store a]\nroot = /x\nserve = redirect\n", "serve = redirect needs public_url"},
    {"[server]\nupload_store = b\n[store a]\nroot = /x\n", "no [store b]"},
    {"[table t]\ncolumn = h\n", "location and column are required"},
    {"[token t]\nscopes = read\n", "sha256 is required"},
    {"[server]\ntls_cert = /c.pem\n", "f.conf: [server] tls_cert and tls_key go together"},
    {"[server]\ntls_key = /k.pem\n", "tls_cert and tls_key go together"},
    {"[store a]\nroot = /x\n[table t]\nlocation = /t\ncolumn = h\nstore = zzz\n",
     "f.conf:3: [table t] no [store zzz]"},
};

int main(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    br_config cfg;
    br_config_init(&cfg);
    br_err err = {""};
    int rc = br_config_load_string(&cfg, cases[i].text, "test.conf", &err);
    if (!cases[i].want_error)
      CHECK(rc == 0, "case %zu should load: %s", i, err.msg);
    else
      CHECK(rc < 0 && strstr(err.msg, cases[i].want_error), "case %zu: got '%s', want '%s'", i,
            rc < 0 ? err.msg : "(loaded)", cases[i].want_error);
    br_config_free(&cfg);
  }
  for (size_t i = 0; i < sizeof finish_cases / sizeof finish_cases[0]; i++) {
    br_config cfg;
    br_config_init(&cfg);
    br_err err = {""};
    int rc = br_config_load_string(&cfg, finish_cases[i].text, "f.conf", &err);
    CHECK(rc == 0, "finish case %zu loads: %s", i, err.msg);
    rc = br_config_finish(&cfg, &err);
    CHECK(rc < 0 && strstr(err.msg, finish_cases[i].want_error), "finish case %zu: '%s'", i,
          rc < 0 ? err.msg : "(ok)");
    br_config_free(&cfg);
  }
  for (size_t i = 0; i < sizeof warn_cases / sizeof warn_cases[0]; i++) {
    br_config cfg;
    br_config_init(&cfg);
    br_err err = {""};
    int rc = br_config_load_string(&cfg, warn_cases[i].text, "w.conf", &err);
    CHECK(rc == 0, "warn case %zu loads: %s", i, err.msg);
    if (!warn_cases[i].want_warning)
      CHECK(cfg.nwarnings == 0, "warn case %zu: unexpected '%s'", i, cfg.warnings[0]);
    else
      CHECK(cfg.nwarnings == 1 && strstr(cfg.warnings[0], warn_cases[i].want_warning),
            "warn case %zu: %d warning(s) '%s', want '%s'", i, cfg.nwarnings,
            cfg.nwarnings ? cfg.warnings[0] : "", warn_cases[i].want_warning);
    br_config_free(&cfg);
  }
  /* trusted_proxies: the parser blobrefd's X-Request-Id check uses */
  br_cidr cidrs[BR_MAX_PROXIES];
  int ncidrs = 0;
  br_err perr;
  CHECK(br_config_parse_proxies("10.0.0.0/8, ::1", cidrs, &ncidrs, &perr) == 0 && ncidrs == 2 &&
            cidrs[0].bits == 8 && cidrs[0].addr[0] == 10 && cidrs[1].bits == 128 &&
            cidrs[1].addr[15] == 1,
        "proxies parsed: %d", ncidrs);
  char many[64 * 12 + 16] = "";
  for (int i = 0; i <= BR_MAX_PROXIES; i++) {
    size_t used = strlen(many);
    CHECK(snprintf(many + used, sizeof many - used, "10.0.0.%d,", i) > 0, "proxy %d", i);
  }
  CHECK(br_config_parse_proxies(many, cidrs, &ncidrs, &perr) < 0 && strstr(perr.msg, "at most 64"),
        "65 proxies: %s", perr.msg);
  /* defaults and values */
  br_config cfg;
  br_config_init(&cfg);
  br_err err;
  CHECK(!strcmp(cfg.listen, "127.0.0.1:8080") && !strcmp(cfg.data_dir, "./var"), "defaults");
  CHECK(cfg.max_blob_size == 5ull << 30 && cfg.grace_ms == 72ull * 3600000, "size/grace defaults");
  CHECK(!strcmp(cfg.access_log, "off") && !*cfg.trusted_proxies && !*cfg.tls_cert &&
            !*cfg.tls_key && !*cfg.listen_plain && cfg.max_connections_per_ip == 0 &&
            cfg.max_json_inflight == 256ull << 20 && cfg.request_header_timeout_ms == 10000 &&
            cfg.min_body_rate == 1024,
        "operations defaults");
  CHECK(!strcmp(cfg.tls_priorities, BR_TLS_PRIORITIES_DEFAULT) && cfg.nwarnings == 0 &&
            cfg.anonymous_scopes == BR_SCOPE_READ,
        "tls_priorities default '%s'", cfg.tls_priorities);
  CHECK(br_config_load_string(&cfg, cases[3].text, "t", &err) == 0, "table loads");
  CHECK(cfg.ntables == 1 && cfg.tables[0].nrewrites == 2 &&
            !strcmp(cfg.tables[0].rewrite_from[0], "s3://w/") &&
            !strcmp(cfg.tables[0].rewrite_to[0], "/srv/w/") && cfg.tables[0].form == BR_FORM_URL,
        "rewrite parsed");
  CHECK(cfg.tables[0].format == BR_TABLE_AUTO, "format absent: auto");
  br_config fcfg;
  br_config_init(&fcfg);
  CHECK(br_config_load_string(&fcfg,
                              "[table d]\nlocation = /d\ncolumn = h\nformat = delta\n"
                              "[table i]\nformat = iceberg\n[table a]\nlocation = /a\n",
                              "t", &err) == 0 &&
            fcfg.ntables == 3 && fcfg.tables[0].format == BR_TABLE_DELTA &&
            fcfg.tables[1].format == BR_TABLE_ICEBERG && fcfg.tables[2].format == BR_TABLE_AUTO,
        "format parsed: %s", err.msg);
  br_config_free(&fcfg);
  CHECK(br_config_load_string(&cfg, cases[1].text, "t", &err) == 0 &&
            cfg.connection_timeout_ms == 2000,
        "inline comment stripped: %llu", (unsigned long long)cfg.connection_timeout_ms);
  CHECK(br_config_finish(&cfg, &err) == 0, "finish: %s", err.msg);
  CHECK(cfg.nstores == 1 && !strcmp(cfg.stores[0].name, "local") &&
            !strcmp(cfg.stores[0].root, "./var/blobs") && !strcmp(cfg.upload_store, "local"),
        "embedded default store");
  br_config_free(&cfg);
  /* the default tls_priorities is one GnuTLS takes (defaults are not checked as they are set) */
  {
    br_config c2;
    br_config_init(&c2);
    char text[512];
    snprintf(text, sizeof text, "[server]\ntls_priorities = %s\n", BR_TLS_PRIORITIES_DEFAULT);
    CHECK(br_config_load_string(&c2, text, "t", &err) == 0, "default priorities: %s", err.msg);
    CHECK(br_config_load_string(&c2, "[store a]\nroot = /x\nallow_hardlinks = true\n", "t", &err) ==
                  0 &&
              c2.nstores == 1 && c2.stores[0].allow_hardlinks == 1,
          "allow_hardlinks: %s", err.msg);
    br_config_free(&c2);
  }
  /* scopes are independent: write does not imply read, admin implies nothing */
  static const struct {
    const char *scopes;
    unsigned want;
  } scope_cases[] = {{"write", BR_SCOPE_WRITE},
                     {"read, write", BR_SCOPE_READ | BR_SCOPE_WRITE},
                     {"admin", BR_SCOPE_ADMIN},
                     {"metrics", BR_SCOPE_METRICS},
                     {"read, metrics", BR_SCOPE_READ | BR_SCOPE_METRICS},
                     {"none", 0}};
  for (size_t i = 0; i < sizeof scope_cases / sizeof scope_cases[0]; i++) {
    char text[256];
    snprintf(text, sizeof text, "[token t]\nsha256 = %064d\nscopes = %s\n", 0,
             scope_cases[i].scopes);
    br_config_init(&cfg);
    CHECK(br_config_load_string(&cfg, text, "t", &err) == 0, "scopes %s: %s", scope_cases[i].scopes,
          err.msg);
    CHECK(cfg.ntokens == 1 && cfg.tokens[0].scopes == scope_cases[i].want, "scopes %s -> %u",
          scope_cases[i].scopes, cfg.ntokens ? cfg.tokens[0].scopes : 99u);
    br_config_free(&cfg);
  }
  /* the shipped example config loads and finishes */
  br_config_init(&cfg);
  int rc = br_config_load(&cfg, "conf/blobref.conf", &err);
  CHECK(rc == 0, "conf/blobref.conf: %s", err.msg);
  if (rc == 0) CHECK(br_config_finish(&cfg, &err) == 0, "conf/blobref.conf finish: %s", err.msg);
  br_config_free(&cfg);
  CHECK(br_config_load(&cfg, "/nonexistent/blobref.conf", &err) < 0 &&
            strstr(err.msg, "/nonexistent/blobref.conf"),
        "missing file named: %s", err.msg);
  return unit_summary("config");
}
