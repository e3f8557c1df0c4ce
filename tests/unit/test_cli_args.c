/* Unit tests for the blobref tool's pure helpers: hash arguments, --range specs, --type values,
 * URL joining and the one-line text of server errors (tools/http_client.c, built in here). */
#include "../../tools/http_client.c"
#include "unit.h"

#define H64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void test_hash_parse(void) {
  static const struct {
    const char *in;
    const char *want; /* NULL = rejected */
  } cases[] = {
      {H64, H64},
      {"sha256:" H64, H64},
      {"0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789ABCDEF", H64},
      {"sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789ABCDEF", H64},
      {"", NULL},
      {"sha256:", NULL},
      {"SHA256:" H64, NULL},
      {H64 "0", NULL},
      {"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde", NULL},
      {"g123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", NULL},
      {" " H64, NULL},
      {H64 " ", NULL},
      {"sha256: " H64, NULL},
      {"md5:" H64, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char hex[BR_HEX_LEN + 1] = "";
    int rc = br_cli_hash_parse(cases[i].in, hex);
    if (cases[i].want) {
      CHECK(rc == 0 && strcmp(hex, cases[i].want) == 0, "'%s' -> rc %d '%s'", cases[i].in, rc, hex);
    } else {
      CHECK(rc == -1, "'%s' accepted as '%s'", cases[i].in, hex);
    }
  }
  CHECK(br_cli_hash_parse(NULL, (char[65]){0}) == -1, "NULL accepted");
}

static void test_range_check(void) {
  static const struct {
    const char *in;
    const char *want; /* what is sent after "bytes=", NULL = rejected */
  } cases[] = {
      {"0-99", "0-99"},
      {"bytes=0-99", "0-99"},
      {"100-", "100-"},
      {"-500", "-500"},
      {"0-0", "0-0"},
      {"0-9,20-29", "0-9,20-29"},
      {"0-9, 20-29, -5", "0-9, 20-29, -5"},
      {"999999999999999999-", "999999999999999999-"},
      {"", NULL},
      {"bytes=", NULL},
      {"-", NULL},
      {"-0", NULL},
      {"5-3", NULL},
      {"a-b", NULL},
      {"0-9,", NULL},
      {",0-9", NULL},
      {"0-9;1-2", NULL},
      {"0-9\r\nX-Evil: 1", NULL},
      {"1-2-3", NULL},
      {"9999999999999999999-", NULL},
      {"0x10-20", NULL},
      {"items=0-9", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    br_err err = {{0}};
    const char *out = NULL;
    int rc = br_cli_range_check(cases[i].in, &out, &err);
    if (cases[i].want) {
      CHECK(rc == 0 && out && strcmp(out, cases[i].want) == 0, "'%s' -> rc %d (%s)", cases[i].in,
            rc, err.msg);
    } else {
      CHECK(rc == -1 && err.msg[0], "'%s' accepted", cases[i].in);
    }
  }
  /* 64 ranges are fine, 65 are refused, as by the server. */
  char spec[1024] = "";
  for (int i = 0; i < 65; i++) {
    char one[32];
    snprintf(one, sizeof one, "%s%d-%d", i ? "," : "", i * 10, i * 10 + 1);
    strcat(spec, one);
    const char *out = NULL;
    int rc = br_cli_range_check(spec, &out, NULL);
    CHECK(rc == (i < 64 ? 0 : -1), "%d ranges -> rc %d", i + 1, rc);
  }
  /* Length bound. */
  static char big[BR_CLI_RANGE_SPEC_MAX + 10];
  memset(big, ' ', sizeof big - 1);
  memcpy(big + sizeof big - 5, "0-1", 3);
  const char *out = NULL;
  CHECK(br_cli_range_check(big, &out, NULL) == -1, "over-long spec accepted");
}

static void test_content_type(void) {
  char t255[256], t256[257];
  memset(t255, 'a', 255);
  t255[255] = '\0';
  memset(t256, 'a', 256);
  t256[256] = '\0';
  CHECK(br_cli_content_type_check("image/png") == 0, "image/png");
  CHECK(br_cli_content_type_check("text/plain; charset=utf-8") == 0, "with parameter");
  CHECK(br_cli_content_type_check(t255) == 0, "255 chars");
  CHECK(br_cli_content_type_check(t256) == -1, "256 chars");
  CHECK(br_cli_content_type_check("") == -1, "empty");
  CHECK(br_cli_content_type_check("text/plain\r\nX-Evil: 1") == -1, "CRLF");
  CHECK(br_cli_content_type_check("caf\xc3\xa9/x") == -1, "non-ASCII");
}

static void test_url(void) {
  static const struct {
    const char *base, *path, *want;
  } cases[] = {
      {"http://h:1", "/v1/lookup", "http://h:1/v1/lookup"},
      {"http://h:1/", "/v1/lookup", "http://h:1/v1/lookup"},
      {"http://h:1//", "v1/lookup", "http://h:1/v1/lookup"},
      {"https://h/prefix/", "/v1/x", "https://h/prefix/v1/x"},
      {"ftp://h", "/v1", NULL},
      {"h:8080", "/v1", NULL},
      {"http://h x", "/v1", NULL},
      {"http://h\n", "/v1", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[64] = "";
    br_err err = {{0}};
    int rc = br_http_url(cases[i].base, cases[i].path, out, sizeof out, &err);
    if (cases[i].want)
      CHECK(rc == 0 && strcmp(out, cases[i].want) == 0, "%s + %s -> '%s' (%s)", cases[i].base,
            cases[i].path, out, err.msg);
    else
      CHECK(rc == -1 && err.msg[0], "%s + %s accepted as '%s'", cases[i].base, cases[i].path, out);
  }
  char small[16];
  CHECK(br_http_url("http://example.com", "/v1/blobs/abc", small, sizeof small, NULL) == -1,
        "overflow accepted");
}

static void test_error_text(void) {
  static const struct {
    long status;
    const char *body, *want;
  } cases[] = {
      {404, "{\"error\":{\"code\":\"not_found\",\"message\":\"no such blob\"}}",
       "not_found: no such blob (HTTP 404)"},
      {416, "{\"error\":{\"code\":\"bad_range\"}}", "bad_range (HTTP 416)"},
      {400, "{\"error\":{\"code\":\"bad_hash\",\"message\":\"line1\\nline2\"}}",
       "bad_hash: line1?line2 (HTTP 400)"},
      {431, "", "HTTP 431"},
      {502, "<html>Bad gateway</html>", "HTTP 502: <html>Bad gateway</html>"},
      {500, "{\"error\":\"flat\"}", "HTTP 500: {\"error\":\"flat\"}"},
      {503, "a\r\nb", "HTTP 503: a??b"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[256];
    br_http_error_text(cases[i].status, cases[i].body, strlen(cases[i].body), out, sizeof out);
    CHECK(strcmp(out, cases[i].want) == 0, "%ld '%s' -> '%s'", cases[i].status, cases[i].body, out);
  }
  char tiny[8];
  br_http_error_text(404, "{\"error\":{\"code\":\"not_found\",\"message\":\"x\"}}", 44, tiny,
                     sizeof tiny);
  CHECK(strlen(tiny) == 7, "truncation: '%s'", tiny);
}

static void test_buf_bound(void) {
  br_http_buf b = {.max = 10};
  CHECK(br_http_buf_append(&b, "12345", 5) == 0, "first append");
  CHECK(br_http_buf_append(&b, "67890", 5) == 0, "up to max");
  CHECK(br_http_buf_append(&b, "x", 1) == -1 && b.toobig, "over max accepted");
  CHECK(b.len == 10 && strcmp(b.data, "1234567890") == 0, "content '%s'", b.data);
  CHECK(br_http_buf_write("abc", 1, 3, &b) == 0, "write callback over max");
  br_http_buf_free(&b);
}

int main(void) {
  test_hash_parse();
  test_range_check();
  test_content_type();
  test_url();
  test_error_text();
  test_buf_bound();
  return unit_summary("test_cli_args");
}
