/* Unit tables for the pure pieces of the Delta reader: `_delta_log/` names, percent-decoding,
 * reader features and the commit-line parser. */
#include <stdlib.h>
#include <string.h>

#include "delta/internal.h"
#include "unit.h"

static void test_names(void) {
  static const struct {
    const char *name;
    enum dl_name_kind kind;
    long long version;
    unsigned part, nparts;
  } cases[] = {
      {"00000000000000000000.json", DL_NAME_COMMIT, 0, 0, 0},
      {"00000000000000000012.json", DL_NAME_COMMIT, 12, 0, 0},
      {"12.json", DL_NAME_COMMIT, 12, 0, 0},
      {"00000000000000000010.checkpoint.parquet", DL_NAME_CHECKPOINT, 10, 0, 0},
      {"00000000000000000010.checkpoint.0000000002.0000000003.parquet", DL_NAME_MULTIPART, 10, 2,
       3},
      {"00000000000000000010.checkpoint.0000000004.0000000003.parquet", DL_NAME_OTHER, 0, 0, 0},
      {"00000000000000000010.checkpoint.0000000000.0000000003.parquet", DL_NAME_OTHER, 0, 0, 0},
      {"00000000000000000010.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json", DL_NAME_V2_JSON,
       10, 0, 0},
      {"00000000000000000010.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.parquet",
       DL_NAME_V2_PARQUET, 10, 0, 0},
      {"00000000000000000010.checkpoint.notauuid!.json", DL_NAME_OTHER, 0, 0, 0},
      {"00000000000000000010.crc", DL_NAME_OTHER, 0, 0, 0},
      {".00000000000000000010.json.crc", DL_NAME_OTHER, 0, 0, 0},
      {"00000000000000000010.json.tmp", DL_NAME_OTHER, 0, 0, 0},
      {"00000000000000000001.00000000000000000003.compacted.json", DL_NAME_OTHER, 0, 0, 0},
      {"_last_checkpoint", DL_NAME_OTHER, 0, 0, 0},
      {".json", DL_NAME_OTHER, 0, 0, 0},
      {"123456789012345678901.json", DL_NAME_OTHER, 0, 0, 0}, /* 21 digits */
      {"99999999999999999999.json", DL_NAME_OTHER, 0, 0, 0},  /* over DL_MAX_VERSION */
      {"", DL_NAME_OTHER, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    dl_name nm;
    dl_parse_name(cases[i].name, &nm);
    CHECK(nm.kind == cases[i].kind && nm.version == cases[i].version && nm.part == cases[i].part &&
              nm.nparts == cases[i].nparts,
          "'%s': kind %d version %lld part %u/%u", cases[i].name, (int)nm.kind,
          (long long)nm.version, nm.part, nm.nparts);
  }
}

static void test_decode(void) {
  static const struct {
    const char *in;
    const char *want; /* NULL = error */
  } cases[] = {
      {"part-0.parquet", "part-0.parquet"},
      {"x=A%252FA/part-0.parquet", "x=A%2FA/part-0.parquet"}, /* decoded once */
      {"a%20b/c%2Fd", "a b/c/d"},
      {"s3://b/k%3Dv/f.parquet", "s3://b/k=v/f.parquet"},
      {"%", NULL},
      {"%2", NULL},
      {"%zz", NULL},
      {"a%00b", NULL}, /* a NUL inside a path */
      {"", ""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[64];
    long n = dl_percent_decode(cases[i].in, strlen(cases[i].in), out, sizeof out);
    if (cases[i].want)
      CHECK(n == (long)strlen(cases[i].want) && !strcmp(out, cases[i].want), "'%s' -> '%s'",
            cases[i].in, n >= 0 ? out : "(error)");
    else
      CHECK(n < 0, "'%s' must fail", cases[i].in);
  }
  char tiny[4];
  CHECK(dl_percent_decode("abcd", 4, tiny, sizeof tiny) < 0, "too long for out");
}

typedef struct seen {
  int adds, removes, cdcs, protocols, dvs;
  char last_path[64];
} seen;

static int on_action(void *ud, const dl_action *a, br_err *err) {
  (void)err;
  seen *s = ud;
  s->adds += a->kind == DL_ADD;
  s->removes += a->kind == DL_REMOVE;
  s->cdcs += a->kind == DL_CDC;
  s->protocols += a->kind == DL_PROTOCOL;
  s->dvs += a->has_dv;
  if (a->path) snprintf(s->last_path, sizeof s->last_path, "%.*s", (int)a->path_len, a->path);
  return 0;
}

static void test_commit(void) {
  static const struct {
    const char *text;
    const char *want_error; /* substring, NULL = parses */
    int adds, removes, cdcs, dvs;
  } cases[] = {
      {"{\"commitInfo\":{}}\n{\"add\":{\"path\":\"a\",\"size\":1}}\n"
       "{\"remove\":{\"path\":\"b\"}}\n{\"cdc\":{\"path\":\"_change_data/c\"}}\n",
       NULL, 1, 1, 1, 0},
      {"{\"add\":{\"path\":\"a\",\"deletionVector\":{\"storageType\":\"u\"}}}\r\n\n", NULL, 1, 0, 0,
       1},
      {"{\"protocol\":{\"minReaderVersion\":3,\"readerFeatures\":[\"deletionVectors\","
       "\"columnMapping\"]}}\n",
       NULL, 0, 0, 0, 0},
      {"{\"protocol\":{\"minReaderVersion\":3,\"readerFeatures\":[\"deletionVectors\","
       "\"fancyNewThing\"]}}\n",
       "line 1: unknown reader feature 'fancyNewThing'", 0, 0, 0, 0},
      {"{\"protocol\":{\"minReaderVersion\":4}}\n", "minReaderVersion 4", 0, 0, 0, 0},
      {"{\"commitInfo\":{}}\n{\"add\":{\"path\":\"a\"", "line 2: not JSON", 0, 0, 0, 0},
      {"[1]\n", "line 1: not a JSON object", 0, 0, 0, 0},
      {"{\"add\":{\"path\":\"\"}}\n", "add action without a path", 0, 0, 0, 0},
      {"{\"remove\":{\"path\":7}}\n", "remove action without a path", 0, 0, 0, 0},
      {"{\"add\":[]}\n", "add action is not an object", 0, 0, 0, 0},
      {"{\"txn\":{\"appId\":\"x\"}}\n{\"domainMetadata\":{}}\n", NULL, 0, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    seen s;
    memset(&s, 0, sizeof s);
    br_err err = {{0}};
    int rc =
        dl_parse_commit((const uint8_t *)cases[i].text, strlen(cases[i].text), on_action, &s, &err);
    if (cases[i].want_error)
      CHECK(rc == -1 && strstr(err.msg, cases[i].want_error), "case %zu: rc %d '%s'", i, rc,
            err.msg);
    else
      CHECK(rc == 0 && s.adds == cases[i].adds && s.removes == cases[i].removes &&
                s.cdcs == cases[i].cdcs && s.dvs == cases[i].dvs,
            "case %zu: rc %d '%s' adds %d removes %d cdcs %d dvs %d", i, rc, err.msg, s.adds,
            s.removes, s.cdcs, s.dvs);
  }
  CHECK(dl_reader_feature_known("v2Checkpoint", 12) && !dl_reader_feature_known("v2Check", 7),
        "feature names match whole");
}

static void test_physical_column(void) {
  static const char schema[] =
      "{\"type\":\"struct\",\"fields\":[{\"name\":\"Super Name\",\"type\":\"string\","
      "\"metadata\":{\"delta.columnMapping.physicalName\":\"col-38\"}},{\"name\":\"img\","
      "\"type\":{\"type\":\"struct\",\"fields\":[{\"name\":\"sha\",\"type\":\"string\","
      "\"metadata\":{\"delta.columnMapping.physicalName\":\"col-9\"}}]},"
      "\"metadata\":{\"delta.columnMapping.physicalName\":\"col-7\"}},"
      "{\"name\":\"plain\",\"type\":\"string\",\"metadata\":{}}]}";
  static const struct {
    const char *schema, *column, *want;
  } cases[] = {
      {schema, "Super Name", "col-38"},
      {schema, "img.sha", "col-7.col-9"},
      {schema, "plain", "plain"},
      {schema, "absent", "absent"},
      {schema, "img.absent", "col-7.absent"},
      {NULL, "a.b", "a.b"},
      {"not json", "a", "a"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[64];
    int rc = dl_physical_column(cases[i].schema, cases[i].column, out, sizeof out);
    CHECK(rc == 0 && !strcmp(out, cases[i].want), "'%s' -> rc %d '%s'", cases[i].column, rc,
          rc == 0 ? out : "");
  }
  char tiny[4];
  CHECK(dl_physical_column(schema, "Super Name", tiny, sizeof tiny) == -1, "too long for out");
}

int main(void) {
  test_physical_column();
  test_names();
  test_decode();
  test_commit();
  return unit_summary("delta");
}
