/* Config parsing: defaults, every key type, and bad files stopping with file:line. */
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
    {"[table t]\nrewrite = nothing\n", "expected 'FROM => TO'"},
    {"[token t]\nsha256 = abc\n", "64-hex SHA-256"},
    {"[auth]\nanonymous = everything\n", "must list read, write, admin"},
    {"[reconcile]\nmax_fraction = 1.5\n", "fraction between 0 and 1"},
    {"[server]\naccess_log = /var/log/blobref/access.log\ntrusted_proxies = 10.0.0.0/8, ::1\n"
     "max_connections_per_ip = 64\nmax_json_inflight = 1GiB\nrequest_header_timeout = 20s\n"
     "min_body_rate = 0\ntls_cert = /c.pem\ntls_key = /k.pem\nlisten_plain = 127.0.0.1:8081\n",
     NULL},
    {"[server]\nrequest_header_timeout = 500ms\n", "request_header_timeout: 500ms is out of range"},
    {"[server]\nmax_json_inflight = 1KiB\n", "max_json_inflight: 1KiB is out of range"},
    {"[server]\nmin_body_rate = fast\n", "min_body_rate: 'fast' is not a size"},
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
  CHECK(br_config_load_string(&cfg, cases[3].text, "t", &err) == 0, "table loads");
  CHECK(cfg.ntables == 1 && cfg.tables[0].nrewrites == 2 &&
            !strcmp(cfg.tables[0].rewrite_from[0], "s3://w/") &&
            !strcmp(cfg.tables[0].rewrite_to[0], "/srv/w/") && cfg.tables[0].form == BR_FORM_URL,
        "rewrite parsed");
  CHECK(br_config_load_string(&cfg, cases[1].text, "t", &err) == 0 &&
            cfg.connection_timeout_ms == 2000,
        "inline comment stripped: %llu", (unsigned long long)cfg.connection_timeout_ms);
  CHECK(br_config_finish(&cfg, &err) == 0, "finish: %s", err.msg);
  CHECK(cfg.nstores == 1 && !strcmp(cfg.stores[0].name, "local") &&
            !strcmp(cfg.stores[0].root, "./var/blobs") && !strcmp(cfg.upload_store, "local"),
        "embedded default store");
  br_config_free(&cfg);
  /* scopes are independent: write does not imply read, admin implies nothing */
  static const struct {
    const char *scopes;
    unsigned want;
  } scope_cases[] = {{"write", BR_SCOPE_WRITE},
                     {"read, write", BR_SCOPE_READ | BR_SCOPE_WRITE},
                     {"admin", BR_SCOPE_ADMIN},
                     {"none", 0}};
  for (size_t i = 0; i < sizeof scope_cases / sizeof scope_cases[0]; i++) {
    char text[256];
    snprintf(text, sizeof text, "[auth]\nanonymous = %s\n[token t]\nsha256 = %064d\nscopes = %s\n",
             scope_cases[i].scopes, 0, scope_cases[i].scopes);
    br_config_init(&cfg);
    CHECK(br_config_load_string(&cfg, text, "t", &err) == 0, "scopes %s: %s", scope_cases[i].scopes,
          err.msg);
    CHECK(cfg.ntokens == 1 && cfg.tokens[0].scopes == scope_cases[i].want &&
              cfg.anonymous_scopes == scope_cases[i].want,
          "scopes %s -> %u", scope_cases[i].scopes, cfg.ntokens ? cfg.tokens[0].scopes : 99u);
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
