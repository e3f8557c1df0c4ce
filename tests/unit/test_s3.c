/* Table tests of the S3 client's pure parts: the XML reader, addressing, option checks, and the
 * store sections of the config. No network: requests are covered by the radosgw tests. */
#include <stdlib.h>

#include "blobref/config.h"
#include "store/s3_client.h"
#include "unit.h"

static void test_xml(void) {
  static const struct {
    const char *xml, *tag, *want; /* want NULL: absent or refused */
  } cases[] = {
      {"<Error><Code>NoSuchKey</Code></Error>", "Code", "NoSuchKey"},
      {"<a><Key>x&amp;y&lt;z&gt;&quot;&apos;</Key></a>", "Key", "x&y<z>\"'"},
      {"<Key>&#65;&#x42;&#x263A;</Key>", "Key", "AB\xe2\x98\xba"},
      {"<Key>&#x1F600;</Key>", "Key", "\xf0\x9f\x98\x80"},
      {"<Key>&#0;</Key>", "Key", "&#0;"},             /* NUL is not a character: kept as text */
      {"<Key>&#x110000;</Key>", "Key", "&#x110000;"}, /* past Unicode */
      {"<Key>&bogus;</Key>", "Key", "&bogus;"},
      {"<Key>&amp</Key>", "Key", "&amp"},
      {"<Key></Key>", "Key", ""},
      {"<Key>open", "Key", NULL},
      {"<Keys>x</Keys>", "Key", NULL},
      {"", "Key", NULL},
      {"<Key>0123456789012345678901234567890123456789</Key>", "Key", NULL}, /* over 32 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[32];
    int rc = s3_xml_text(cases[i].xml, cases[i].tag, NULL, out, sizeof out);
    if (cases[i].want)
      CHECK(rc == 0 && !strcmp(out, cases[i].want), "case %zu: got rc %d '%s'", i, rc,
            rc == 0 ? out : "");
    else
      CHECK(rc < 0, "case %zu: expected a refusal", i);
  }
  const char *list = "<R><Contents><Key>a</Key></Contents><Contents><Key>b</Key></Contents></R>";
  const char *from = NULL;
  char k[8];
  int n = 0;
  char seen[8] = "";
  while (s3_xml_text(list, "Key", &from, k, sizeof k) == 0) {
    strcat(seen, k);
    n++;
  }
  CHECK(n == 2 && !strcmp(seen, "ab"), "iterating keys: %d '%s'", n, seen);
}

static void test_target(void) {
  static const struct {
    const char *endpoint, *bucket;
    int ok;
  } cases[] = {
      {"http://127.0.0.1:9000", "blobs", 1},
      {"https://s3.eu-west-1.amazonaws.com", "my.bucket-1", 1},
      {"http://127.0.0.1:9000/", "blobs", 1},
      {"127.0.0.1:9000", "blobs", 0},
      {"ftp://host", "blobs", 0},
      {"http://host/path", "blobs", 0},
      {"http://", "blobs", 0},
      {"http://host", "bl", 0},
      {"http://host", "Blobs", 0},
      {"http://host", "a/b", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    s3_target t;
    br_err err;
    s3_target_options o = {.name = "t",
                           .endpoint = cases[i].endpoint,
                           .bucket = cases[i].bucket,
                           .access_key = "AK",
                           .secret_key = "SK",
                           .path_style = 1};
    int rc = s3_target_init(&t, &o, &err);
    CHECK((rc == 0) == cases[i].ok, "endpoint %s bucket %s: rc %d (%s)", cases[i].endpoint,
          cases[i].bucket, rc, rc ? err.msg : "");
    if (rc == 0) s3_target_destroy(&t);
  }
  /* addressing */
  s3_target t;
  br_err err;
  s3_target_options o = {.name = "t",
                         .endpoint = "http://127.0.0.1:9000",
                         .bucket = "blobs",
                         .access_key = "AK",
                         .secret_key = "SK",
                         .path_style = 1};
  CHECK(s3_target_init(&t, &o, &err) == 0, "init: %s", err.msg);
  char host[300], path[300];
  CHECK(s3_target_locate(&t, "sha256/ab/cd/x y+z", host, sizeof host, path, sizeof path) == 0 &&
            !strcmp(host, "127.0.0.1:9000") && !strcmp(path, "/blobs/sha256/ab/cd/x%20y%2Bz"),
        "path style: %s %s", host, path);
  CHECK(s3_target_locate(&t, NULL, host, sizeof host, path, sizeof path) == 0 &&
            !strcmp(path, "/blobs/"),
        "bucket: %s", path);
  char url[2000];
  CHECK(s3_presign_get(&t, "k", 60, url, sizeof url, &err) == 0 &&
            !strncmp(url, "http://127.0.0.1:9000/blobs/k?X-Amz-Algorithm=AWS4-HMAC-SHA256", 62) &&
            strstr(url, "X-Amz-Expires=60&"),
        "presign: %s", url);
  s3_target_destroy(&t);
  o.path_style = 0;
  CHECK(s3_target_init(&t, &o, &err) == 0, "init: %s", err.msg);
  CHECK(s3_target_locate(&t, "k", host, sizeof host, path, sizeof path) == 0 &&
            !strcmp(host, "blobs.127.0.0.1:9000") && !strcmp(path, "/k"),
        "virtual hosted: %s %s", host, path);
  s3_target_destroy(&t);
  /* credentials from the environment when the section has none */
  o.access_key = o.secret_key = "";
  unsetenv("AWS_ACCESS_KEY_ID");
  CHECK(s3_target_init(&t, &o, &err) < 0 && strstr(err.msg, "no credentials"), "no creds: %s",
        err.msg);
  setenv("AWS_ACCESS_KEY_ID", "ENVAK", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "ENVSK", 1);
  setenv("AWS_SESSION_TOKEN", "TOK", 1);
  CHECK(s3_target_init(&t, &o, &err) == 0 && !strcmp(t.signer.access_key, "ENVAK") &&
            !strcmp(t.signer.session_token, "TOK"),
        "env creds: %s", err.msg);
  s3_target_destroy(&t);
}

static void test_config(void) {
  static const struct {
    const char *text, *error; /* error NULL: valid */
  } cases[] = {
      {"[store lake]\nkind = s3\nendpoint = http://h:1\nbucket = blobs\n", NULL},
      {"[store lake]\nkind = s3\nbucket = blobs\n", "needs endpoint and bucket"},
      {"[store lake]\nkind = s3\nendpoint = http://h:1\n", "needs endpoint and bucket"},
      {"[store lake]\nkind = s3\nendpoint = http://h:1\nbucket = b1\npath_style = maybe\n",
       "must be true or false"},
      {"[store lake]\nkind = s3\nendpoint = http://h:1\nbucket = b1\npart_size = 1MiB\n",
       "out of range"},
      {"[store o]\nkind = http\n", "needs url"},
      {"[store o]\nkind = http\nurl = http://h/\n", "read-only http origin"},
      {"[server]\nupload_store = l\n[store l]\nroot = /tmp/x\n[store o]\nkind = http\n"
       "url = http://h/\n",
       NULL},
      {"[store x]\nkind = ftp\n", "kind must be fs, s3 or http"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    br_config cfg;
    br_config_init(&cfg);
    br_err err = {{0}};
    int rc = br_config_load_string(&cfg, cases[i].text, "t.conf", &err);
    if (rc == 0) rc = br_config_finish(&cfg, &err);
    if (cases[i].error)
      CHECK(rc < 0 && strstr(err.msg, cases[i].error), "case %zu: %s", i, rc < 0 ? err.msg : "ok");
    else
      CHECK(rc == 0, "case %zu: %s", i, err.msg);
    if (rc == 0 && !strcmp(cfg.stores[0].kind, "s3"))
      CHECK(cfg.stores[0].path_style == 1 && cfg.stores[0].part_size == 16u << 20 &&
                cfg.stores[0].presign_ttl_ms == 15 * 60000 &&
                strstr(cfg.stores[0].spool_dir, "/spool/lake"),
            "s3 defaults: spool %s", cfg.stores[0].spool_dir);
    br_config_free(&cfg);
  }
}

/* DeleteObjects answers: which keys failed, and every answer that is not a DeleteResult of the
 * keys asked for refused whole (so that nothing is taken as deleted). */
static void test_delete_result(void) {
  static const char *const keys[] = {"sha256/aa/bb/x", "a&b<c", "k3"};
  static const struct {
    const char *xml;
    int want;           /* failed count, or -1 refused */
    const char *failed; /* which of keys, as 0/1 */
  } cases[] = {
      {"<DeleteResult/>", 0, "000"},
      {"<DeleteResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"/>", 0, "000"},
      {"<DeleteResult></DeleteResult>", 0, "000"},
      {"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DeleteResult "
       "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"></DeleteResult>\n",
       0, "000"},
      {"<DeleteResult><Deleted><Key>k3</Key></Deleted><Deleted><Key>a&amp;b&lt;c</Key>"
       "<DeleteMarker>true</DeleteMarker><DeleteMarkerVersionId>v</DeleteMarkerVersionId>"
       "</Deleted></DeleteResult>",
       0, "000"},
      {"<DeleteResult><Error><Key>k3</Key><Code>AccessDenied</Code><Message>no</Message>"
       "</Error></DeleteResult>",
       1, "001"},
      {"<DeleteResult>\n  <Error><Key>a&amp;b&lt;c</Key><Code>InternalError</Code><Message/>"
       "</Error>\n  <Error><VersionId>1</VersionId><Key>sha256/aa/bb/x</Key><Code>SlowDown</Code>"
       "</Error></DeleteResult>",
       2, "110"},
      {"<DeleteResult><Error><Key>k3</Key></Error><Error><Key>k3</Key></Error></DeleteResult>", 1,
       "001"},
      {"<DeleteResult><Error><Key>other</Key><Code>X</Code></Error></DeleteResult>", -1, "000"},
      {"<DeleteResult><Error><Code>X</Code></Error></DeleteResult>", -1, "000"},
      {"<DeleteResult><Error><Key>k3</Key><Key>k3</Key></Error></DeleteResult>", -1, "000"},
      {"<DeleteResult><Error><Key>k3</Key><Bogus>1</Bogus></Error></DeleteResult>", -1, "000"},
      {"<DeleteResult><Error><Key>k3</Key><Code>X</Code></Error>", -1, "000"}, /* cut short */
      {"<DeleteResult><Error><Key>k3</Key><Code>X</Code>", -1, "000"},
      {"<DeleteResult><Error><Key>k3</Key><Code>X</Code></Error></DeleteResult>trailing", -1,
       "000"},
      {"<DeleteResult><Other/></DeleteResult>", -1, "000"},
      {"<DeleteResults></DeleteResults>", -1, "000"},
      {"<DeleteResult><Error><Key>k3<Code>X</Code></Key></Error></DeleteResult>", -1, "000"},
      {"<DeleteResult><Error><Key>k3</Keys></Error></DeleteResult>", -1, "000"},
      {"<Error><Code>InternalError</Code><Message>We encountered an internal error</Message>"
       "</Error>",
       -1, "000"}, /* a 200 whose body is an error document */
      {"<?xml version=\"1.0\"<DeleteResult></DeleteResult>", -1, "000"},
      {"", -1, "000"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t failed[3] = {0};
    char why[256];
    int rc = s3_parse_delete_result(cases[i].xml, strlen(cases[i].xml), keys, 3, failed, why,
                                    sizeof why);
    CHECK(rc == cases[i].want, "delete result %zu: rc %d want %d (%s)", i, rc, cases[i].want, why);
    if (rc >= 0)
      for (int k = 0; k < 3; k++)
        CHECK(failed[k] == (cases[i].failed[k] == '1'), "delete result %zu: key %d", i, k);
    if (rc != 0) CHECK(why[0] != '\0', "delete result %zu: no reason given", i);
  }
  /* a body with a NUL inside is not read past its length, nor trusted */
  const char nul[] = "<DeleteResult>\0</DeleteResult>";
  uint8_t failed[3] = {0};
  char why[64];
  CHECK(s3_parse_delete_result(nul, sizeof nul - 1, keys, 3, failed, why, sizeof why) < 0,
        "NUL inside");
  CHECK(s3_parse_delete_result("<DeleteResult></DeleteResult>", 14, keys, 3, failed, why,
                               sizeof why) < 0,
        "a length that cuts the document short");
}

int main(void) {
  test_xml();
  test_delete_result();
  test_target();
  test_config();
  return unit_summary("s3");
}
