/* Unit tables for the pure pieces of the Iceberg reader: hash forms, hash set, metadata file
 * choice, path mapping, metadata.json parsing and the Avro container reader. */
#include <snappy-c.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "iceberg/internal.h"
#include "unit.h"

#define H64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define U64 "0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF"
#define G64 "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

static void test_parse_hash(void) {
  static const struct {
    int form;
    const char *in;
    const char *want; /* NULL = invalid */
  } cases[] = {
      {BR_FORM_HEX, H64, H64},
      {BR_FORM_HEX, U64, H64},
      {BR_FORM_HEX, "sha256:" H64, H64},
      {BR_FORM_HEX, "sha256:" U64, H64},
      {BR_FORM_HEX, "SHA256:" H64, NULL},
      {BR_FORM_HEX, H64 "0", NULL},
      {BR_FORM_HEX, H64 " ", NULL},
      {BR_FORM_HEX, " " H64, NULL},
      {BR_FORM_HEX, "", NULL},
      {BR_FORM_HEX, "sha256:", NULL},
      {BR_FORM_HEX, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdeg", NULL},
      {BR_FORM_URL, "https://cdn/x/sha256/01/23/" H64, H64},
      {BR_FORM_URL, "https://cdn/x/sha256/01/23/" H64 ".jpg", H64},
      {BR_FORM_URL, "https://cdn/x/sha256/01/23/" U64 ".jpg?v=2", H64},
      {BR_FORM_URL, H64, H64},
      {BR_FORM_URL, "sha256:" H64, H64},
      {BR_FORM_URL, "/" H64 "/" G64 ".png", G64},  /* the last 64-run wins */
      {BR_FORM_URL, "/" G64 "/" H64 "0.png", G64}, /* a 65-hex run is not a hash */
      {BR_FORM_URL, "/" G64 "/a" H64, G64},        /* neither is a run glued to 'a' */
      {BR_FORM_URL, "https://cdn/deadbeef/ab/cd.jpg", NULL},
      {BR_FORM_URL, "", NULL},
      {BR_FORM_URL, H64 H64, NULL}, /* one run of 128 */
      {BR_FORM_URL, H64 "-" G64 "x", G64},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t d[32];
    int rc =
        br_iceberg_parse_hash(cases[i].form, (const uint8_t *)cases[i].in, strlen(cases[i].in), d);
    if (!cases[i].want) {
      CHECK(rc == -1, "case %zu '%s' should be invalid", i, cases[i].in);
      continue;
    }
    char hex[65];
    if (rc == 0) br_hex_encode(d, hex);
    CHECK(rc == 0 && strcmp(hex, cases[i].want) == 0, "case %zu '%s'", i, cases[i].in);
  }
  uint8_t raw[33], d[32];
  for (int i = 0; i < 33; i++) raw[i] = (uint8_t)(i * 7);
  CHECK(br_iceberg_parse_hash(BR_FORM_BINARY, raw, 32, d) == 0 && memcmp(d, raw, 32) == 0, "bin");
  CHECK(br_iceberg_parse_hash(BR_FORM_BINARY, raw, 31, d) == -1, "31 bytes");
  CHECK(br_iceberg_parse_hash(BR_FORM_BINARY, raw, 33, d) == -1, "33 bytes");
  CHECK(br_iceberg_parse_hash(BR_FORM_BINARY, (const uint8_t *)H64, 64, d) == -1, "hex as bin");
}

static void test_hashset(void) {
  br_hashset *s = br_hashset_new();
  CHECK(s != NULL, "new");
  size_t n = 0;
  CHECK(br_hashset_sorted(s, &n) == NULL && n == 0, "empty");
  uint8_t d[32];
  const int N = 50000;
  for (int round = 0; round < 2; round++) {
    int added = 0;
    for (int i = 0; i < N; i++) {
      memset(d, 0, sizeof d);
      /* Deliberately share the first 8 bytes for many digests: probing must cope. */
      d[0] = (uint8_t)(i % 3);
      d[31] = (uint8_t)i;
      d[30] = (uint8_t)(i >> 8);
      d[29] = (uint8_t)(i >> 16);
      added += br_hashset_add(s, d);
    }
    CHECK(added == (round == 0 ? N : 0), "round %d added %d", round, added);
  }
  CHECK(br_hashset_count(s) == (size_t)N, "count %zu", br_hashset_count(s));
  memset(d, 0, sizeof d);
  d[31] = 3; /* i = 3 has d[0] = 0 */
  CHECK(br_hashset_contains(s, d), "contains");
  d[0] = 1;
  CHECK(!br_hashset_contains(s, d), "not contains");
  uint8_t *sorted = br_hashset_sorted(s, &n);
  int ok = sorted && n == (size_t)N;
  for (size_t i = 1; ok && i < n; i++) ok = memcmp(sorted + (i - 1) * 32, sorted + i * 32, 32) < 0;
  CHECK(ok, "sorted strictly ascending");
  free(sorted);
  br_hashset_free(s);
}

static void test_metadata_version(void) {
  static const struct {
    const char *name;
    long long v;
  } cases[] = {
      {"v1.metadata.json", 1},
      {"v12.gz.metadata.json", 12},
      {"v1749025517.metadata.json", 1749025517},
      {"00012-6b3c-4c4e.metadata.json", 12},
      {"00003-aa.gz.metadata.json", 3},
      {"v.metadata.json", -1},
      {"vx1.metadata.json", -1},
      {"v1.metadata.json.crc", -1},
      {".v1.metadata.json.crc", -1},
      {"00012.metadata.json", -1},
      {"version-hint.text", -1},
      {"snap-1-1-x.avro", -1},
      {"v1a.metadata.json", -1},
      {"v1.json", -1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    CHECK(ice_metadata_version(cases[i].name) == cases[i].v, "%s -> %lld", cases[i].name,
          (long long)ice_metadata_version(cases[i].name));
}

static void test_pick(void) {
  char *a[] = {"v1.metadata.json", "v2.metadata.json", "v3.gz.metadata.json", "v10.metadata.json",
               "version-hint.text"};
  char *b[] = {"v1.metadata.json", "v2.metadata.json", "v3.metadata.json", "v5.metadata.json"};
  char *c[] = {"v2.gz.metadata.json", "v2.metadata.json"};
  char *d[] = {"00001-a.metadata.json", "00003-b.metadata.json", "00002-c.metadata.json"};
  char *e[] = {"version-hint.text", "x.avro"};
  static const struct {
    int set;
    const char *hint; /* NULL = no hint file */
    long want;        /* index, or -1 error */
  } cases[] = {
      {0, NULL, 3}, {0, "", 3},    {0, "  \n", 3}, {0, "2", 2},  {0, "2\n", 2},
      {0, "10", 3}, {0, "abc", 3}, {0, "4", -1},   {1, "1", 2},  {1, "3", 2},
      {1, "5", 3},  {1, NULL, 3},  {2, NULL, 1},   {2, "2", 1},  {3, NULL, 1},
      {3, "1", 1},  {4, NULL, -1}, {4, "1", -1},   {1, "-1", 3}, {1, "99999999999999999999", 3},
  };
  char **sets[] = {a, b, c, d, e};
  size_t sizes[] = {5, 4, 2, 3, 2};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    br_err err = {{0}};
    const char *h = cases[i].hint;
    long got =
        ice_pick_metadata(h, h ? strlen(h) : 0, sets[cases[i].set], sizes[cases[i].set], &err);
    CHECK(got == cases[i].want, "case %zu (hint '%s'): got %ld (%s)", i, h ? h : "(none)", got,
          err.msg);
    if (cases[i].want < 0) CHECK(err.msg[0] != 0, "case %zu has an error message", i);
  }
}

static void test_map_path(void) {
  br_iceberg_rewrite rw[] = {{"s3://warehouse/db/", "/srv/wh/"},
                             {"s3://warehouse/", "/other/"},
                             {"hdfs://nn:8020/x/", "s3://bucket/x/"}};
  ice_pathmap with = {rw, 3, "/data/t", "s3a://lake/db/t"};
  ice_pathmap rel = {NULL, 0, "/data/t", "./t"};
  ice_pathmap rest = {rw, 3, NULL, "s3://warehouse/db/t"};
  static const struct {
    int pm;
    const char *in;
    const char *want; /* NULL = error */
  } cases[] = {
      {0, "s3://warehouse/db/t/data/a.parquet", "/srv/wh/t/data/a.parquet"}, /* first match */
      {0, "s3://warehouse/x/a.parquet", "/other/x/a.parquet"},
      {0, "hdfs://nn:8020/x/a", "s3://bucket/x/a"}, /* to another scheme: left for the opener */
      {0, "s3a://lake/db/t/metadata/m.avro", "/data/t/metadata/m.avro"}, /* table location */
      {0, "s3a://lake/db/t2/m.avro", "s3a://lake/db/t2/m.avro"},         /* not under it */
      {0, "/abs/x.parquet", "/abs/x.parquet"},
      {0, "file:///abs/x.parquet", "/abs/x.parquet"},
      {0, "file://localhost/abs/x", "/abs/x"},
      {0, "file://rel/x", "/data/t/rel/x"},
      {0, "data/x.parquet", "/data/t/data/x.parquet"},
      {0, "./data/x.parquet", "/data/t/data/x.parquet"},
      {0, "gs://b/t/x", "gs://b/t/x"},
      {0, "", NULL},
      {0, "file://", NULL},
      {1, "t/data/x.parquet", "/data/t/data/x.parquet"}, /* relative location "./t" */
      {1, "./t/data/x.parquet", "/data/t/data/x.parquet"},
      {1, "tt/data/x.parquet", "/data/t/tt/data/x.parquet"},
      {2, "s3://warehouse/db/t/a", "/srv/wh/t/a"},
      {2, "data/x.parquet", NULL}, /* relative with no local folder */
      {2, "s3://elsewhere/a", "s3://elsewhere/a"},
  };
  const ice_pathmap *pms[] = {&with, &rel, &rest};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[ICE_MAX_PATH + 1];
    br_err err = {{0}};
    int rc = ice_map_path(pms[cases[i].pm], cases[i].in, out, sizeof out, &err);
    if (!cases[i].want)
      CHECK(rc == -1 && err.msg[0], "case %zu '%s' should fail", i, cases[i].in);
    else
      CHECK(rc == 0 && strcmp(out, cases[i].want) == 0, "case %zu '%s' -> '%s' (%s)", i,
            cases[i].in, rc == 0 ? out : "", err.msg);
  }
  char longp[ICE_MAX_PATH + 10];
  memset(longp, 'a', sizeof longp - 1);
  longp[sizeof longp - 1] = 0;
  char out[ICE_MAX_PATH + 1];
  CHECK(ice_map_path(&with, longp, out, sizeof out, NULL) == -1, "too long");
}

static void test_meta_parse(void) {
  static const struct {
    const char *json;
    int ok;
    int fv;
    size_t nsnap;
  } cases[] = {
      {"{\"format-version\":2,\"location\":\"s3://b/t\",\"snapshots\":[{\"snapshot-id\":1,"
       "\"manifest-list\":\"s3://b/t/metadata/snap-1.avro\"}],\"current-snapshot-id\":1}",
       1, 2, 1},
      {"{\"format-version\":1,\"snapshots\":[{\"snapshot-id\":5,\"manifests\":[\"a\",\"b\"]}]}", 1,
       1, 1},
      {"{\"format-version\":3,\"current-snapshot-id\":-1}", 1, 3, 0},
      {"{}", 1, 1, 0},
      {"{\"format-version\":4}", 0, 0, 0},
      {"{\"format-version\":\"2\"}", 0, 0, 0},
      {"[]", 0, 0, 0},
      {"{\"snapshots\":{}}", 0, 0, 0},
      {"{\"snapshots\":[{\"manifest-list\":\"x\"}]}", 0, 0, 0},
      {"{\"snapshots\":[{\"snapshot-id\":1}]}", 0, 0, 0},
      {"{\"snapshots\":[{\"snapshot-id\":1,\"manifest-list\":\"\"}]}", 0, 0, 0},
      {"{\"snapshots\":[{\"snapshot-id\":1,\"manifests\":[1]}]}", 0, 0, 0},
      {"{\"snapshots\":[{\"snapshot-id\":1,\"manifest-list\":\"x\"}],\"current-snapshot-id\":2}", 0,
       0, 0},
      {"{\"format-version\":2,\"format-version\":2}", 0, 0, 0},
      {"{\"format-version\":2", 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ice_meta m;
    br_err err = {{0}};
    int rc = ice_meta_parse((const uint8_t *)cases[i].json, strlen(cases[i].json), &m, &err);
    if (cases[i].ok) {
      CHECK(rc == 0 && m.format_version == cases[i].fv && m.nsnapshots == cases[i].nsnap,
            "case %zu: rc %d (%s)", i, rc, err.msg);
      ice_meta_free(&m);
    } else {
      CHECK(rc == -1 && err.msg[0], "case %zu should fail", i);
    }
  }
  /* gzip'd metadata is detected by its magic. */
  const char *js =
      "{\"format-version\":1,\"snapshots\":[{\"snapshot-id\":7,\"manifests\":[\"m\"]}]}";
  uint8_t gz[512];
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  zs.next_in = (Bytef *)js;
  zs.avail_in = (uInt)strlen(js);
  zs.next_out = gz;
  zs.avail_out = sizeof gz;
  deflate(&zs, Z_FINISH);
  size_t gzlen = sizeof gz - zs.avail_out;
  deflateEnd(&zs);
  ice_meta m;
  CHECK(ice_meta_parse(gz, gzlen, &m, NULL) == 0 && m.nsnapshots == 1 && m.snapshots[0].id == 7 &&
            m.snapshots[0].nmanifests == 1,
        "gzip metadata");
  ice_meta_free(&m);
  CHECK(ice_meta_parse(gz, gzlen - 4, &m, NULL) == -1, "truncated gzip");
}

/* --- Avro: build small container files by hand --------------------------------------------- */

static size_t put_long(uint8_t *p, int64_t v) {
  uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
  size_t n = 0;
  while (z >= 0x80) {
    p[n++] = (uint8_t)(z | 0x80);
    z >>= 7;
  }
  p[n++] = (uint8_t)z;
  return n;
}

static size_t put_str(uint8_t *p, const char *s) {
  size_t n = put_long(p, (int64_t)strlen(s));
  memcpy(p + n, s, strlen(s));
  return n + strlen(s);
}

static const char LIST_SCHEMA[] =
    "{\"type\":\"record\",\"name\":\"manifest_file\",\"fields\":["
    "{\"name\":\"manifest_path\",\"type\":\"string\"},"
    "{\"name\":\"manifest_length\",\"type\":\"long\"},"
    "{\"name\":\"content\",\"type\":\"int\"},"
    "{\"name\":\"added_files_count\",\"type\":[\"null\",\"int\"]},"
    "{\"name\":\"existing_files_count\",\"type\":[\"null\",\"int\"]},"
    "{\"name\":\"deleted_files_count\",\"type\":[\"null\",\"int\"]},"
    "{\"name\":\"partitions\",\"type\":[\"null\",{\"type\":\"array\",\"items\":\"bytes\"}]}]}";

/* One list record: path, length 100, content, counts 2/1/0, a partitions array of 2 items. */
static size_t list_record(uint8_t *p, const char *path, int content) {
  size_t n = put_str(p, path);
  n += put_long(p + n, 100);
  n += put_long(p + n, content);
  for (int i = 0; i < 3; i++) {
    n += put_long(p + n, 1); /* branch int */
    n += put_long(p + n, i == 0 ? 2 : i == 1 ? 1 : 0);
  }
  n += put_long(p + n, 1); /* branch array */
  n += put_long(p + n, 2);
  n += put_str(p + n, "ab");
  n += put_str(p + n, "");
  n += put_long(p + n, 0);
  return n;
}

static const uint8_t SYNC[16] = "0123456789ABCDEF";

/* Writes a container with the given codec and blocks of records; returns its length. */
static size_t container(uint8_t *out, const char *codec, const char *schema, int nblocks,
                        int per_block) {
  size_t n = 0;
  memcpy(out, "Obj\x01", 4);
  n = 4;
  n += put_long(out + n, 2);
  n += put_str(out + n, "avro.schema");
  n += put_str(out + n, schema);
  n += put_str(out + n, "avro.codec");
  n += put_str(out + n, codec);
  n += put_long(out + n, 0);
  memcpy(out + n, SYNC, 16);
  n += 16;
  for (int b = 0; b < nblocks; b++) {
    uint8_t raw[4096], comp[8192];
    size_t rn = 0;
    for (int r = 0; r < per_block; r++) {
      char path[64];
      snprintf(path, sizeof path, "s3://b/t/metadata/m%d-%d.avro", b, r);
      rn += list_record(raw + rn, path, r % 2);
    }
    const uint8_t *blk = raw;
    size_t bn = rn;
    if (!strcmp(codec, "deflate")) {
      z_stream zs;
      memset(&zs, 0, sizeof zs);
      deflateInit2(&zs, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
      zs.next_in = raw;
      zs.avail_in = (uInt)rn;
      zs.next_out = comp;
      zs.avail_out = sizeof comp;
      deflate(&zs, Z_FINISH);
      bn = sizeof comp - zs.avail_out;
      deflateEnd(&zs);
      blk = comp;
    } else if (!strcmp(codec, "snappy")) {
      size_t cn = sizeof comp - 4;
      snappy_compress((const char *)raw, rn, (char *)comp, &cn);
      uint32_t crc = (uint32_t)crc32(0L, raw, (uInt)rn);
      comp[cn] = (uint8_t)(crc >> 24);
      comp[cn + 1] = (uint8_t)(crc >> 16);
      comp[cn + 2] = (uint8_t)(crc >> 8);
      comp[cn + 3] = (uint8_t)crc;
      bn = cn + 4;
      blk = comp;
    }
    n += put_long(out + n, per_block);
    n += put_long(out + n, (int64_t)bn);
    memcpy(out + n, blk, bn);
    n += bn;
    memcpy(out + n, SYNC, 16);
    n += 16;
  }
  return n;
}

typedef struct seen {
  int n;
  int content_sum;
  int64_t nentries;
  char last[128];
} seen;

static int on_ref(void *ud, const ice_manifest_ref *r, br_err *err) {
  seen *s = ud;
  s->n++;
  s->content_sum += r->content;
  s->nentries = r->nentries;
  snprintf(s->last, sizeof s->last, "%.*s", (int)r->path_len, r->path);
  return 0;
}

static void test_avro(void) {
  static uint8_t buf[65536];
  const char *codecs[] = {"null", "deflate", "snappy"};
  for (int c = 0; c < 3; c++) {
    size_t n = container(buf, codecs[c], LIST_SCHEMA, 3, 4);
    seen s = {0, 0, 0, ""};
    uint64_t nrec = 0;
    br_err err = {{0}};
    int rc = ice_read_manifest_list(buf, n, on_ref, &s, &nrec, &err);
    CHECK(rc == 0 && s.n == 12 && nrec == 12 && s.content_sum == 6 && s.nentries == 3 &&
              strcmp(s.last, "s3://b/t/metadata/m2-3.avro") == 0,
          "%s: rc %d n %d (%s)", codecs[c], rc, s.n, err.msg);
    /* Every truncation is an error, except exactly at a block boundary (the list's counts
     * catch that one in the walk). */
    int bad = 0;
    size_t header_end = 0;
    for (size_t cut = 0; cut < n; cut++) {
      seen t = {0, 0, 0, ""};
      int r = ice_read_manifest_list(buf, cut, on_ref, &t, NULL, NULL);
      if (r == 0 && t.n != 0 && t.n != 4 && t.n != 8) bad++;
      if (r == 0 && t.n == 0 && !header_end) header_end = cut;
    }
    CHECK(bad == 0, "%s: %d truncations decoded a partial block", codecs[c], bad);
    /* Flip each byte after the header: never a crash; a silent success must keep 12 records. */
    for (size_t i = header_end; i < n; i++) {
      buf[i] ^= 0x5a;
      seen t = {0, 0, 0, ""};
      ice_read_manifest_list(buf, n, on_ref, &t, NULL, NULL);
      buf[i] ^= 0x5a;
    }
  }
  /* Wrong sync marker in the last block. */
  size_t n = container(buf, "null", LIST_SCHEMA, 2, 2);
  buf[n - 1] ^= 1;
  br_err err = {{0}};
  seen s = {0, 0, 0, ""};
  CHECK(ice_read_manifest_list(buf, n, on_ref, &s, NULL, &err) == -1 && strstr(err.msg, "sync"),
        "bad sync: %s", err.msg);
  /* Unknown codec, not Avro, not a manifest list. */
  n = container(buf, "bzip2", LIST_SCHEMA, 1, 1);
  CHECK(ice_read_manifest_list(buf, n, on_ref, &s, NULL, &err) == -1 && strstr(err.msg, "bzip2"),
        "codec: %s", err.msg);
  CHECK(ice_read_manifest_list((const uint8_t *)"PAR1", 4, on_ref, &s, NULL, &err) == -1,
        "not avro");
  n = container(
      buf, "null",
      "{\"type\":\"record\",\"name\":\"r\",\"fields\":[{\"name\":\"a\",\"type\":\"int\"}]}", 0, 0);
  CHECK(ice_read_manifest_list(buf, n, on_ref, &s, NULL, &err) == -1 &&
            strstr(err.msg, "manifest_path"),
        "not a list: %s", err.msg);
  CHECK(ice_read_manifest(buf, n, NULL, NULL, NULL, &err) == -1, "not a manifest: %s", err.msg);
}

int main(void) {
  test_parse_hash();
  test_hashset();
  test_metadata_version();
  test_pick();
  test_map_path();
  test_meta_parse();
  test_avro();
  return unit_summary("test_iceberg");
}
