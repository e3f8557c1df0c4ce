/* The header grammar and the passive media types, as tables. */
#include "blobref/header.h"
#include "unit.h"

static const struct {
  const char *type;
  int passive;
} passive_cases[] = {
    {"image/png", 1},
    {"image/jpeg", 1},
    {"IMAGE/WebP", 1},
    {"image/gif; charset=binary", 1},
    {"  image/avif ", 1},
    {"audio/mpeg", 1},
    {"video/mp4", 1},
    {"application/pdf", 1},
    {"application/octet-stream", 1},
    {"application/json", 1},
    {"application/parquet", 1},
    {"text/plain", 1},
    {"text/plain; charset=utf-8", 1},
    {"text/csv", 1},
    /* active: markup, script, SVG, XML, unknown, empty */
    {"image/svg+xml", 0},
    {"IMAGE/SVG+XML; charset=utf-8", 0},
    {"image/svg", 0},
    {"image/foo+xml", 0},
    {"video/vnd.mpegurl", 0},
    {"text/html", 0},
    {"TEXT/HTML;charset=utf-8", 0},
    {"application/xhtml+xml", 0},
    {"application/xml", 0},
    {"text/xml", 0},
    {"text/javascript", 0},
    {"application/javascript", 0},
    {"text/css", 0},
    {"multipart/x-mixed-replace", 0},
    {"application/x-shockwave-flash", 0},
    {"text/plainx", 0},
    {"text/plain/html", 0},
    {"image/", 0},
    {"image", 0},
    {"image/png/../svg+xml", 0},
    {"", 0},
    {";", 0},
    {NULL, 0},
};

static const struct {
  const char *type;
  int ok;
} type_cases[] = {
    {"application/octet-stream", 1},
    {"text/plain; charset=utf-8", 1},
    {"text/plain;charset=utf-8", 1},
    {"text/plain ; charset=utf-8 ", 1},
    {"multipart/form-data; boundary=----WebKitFormBoundary7MA4YWxk", 1},
    {"text/plain; charset=\"utf-8\"", 1},
    {"text/plain; title=\"a \\\"quoted\\\" word; ok\"", 1},
    {"application/vnd.apache.parquet", 1},
    {"image/svg+xml", 1},
    {"a/b;", 1},
    {"a/b; x=1;; y=2", 1},
    {"x-custom/x.y!#$%&'*+-^_`|~", 1},
    /* injection and control characters */
    {"text/plain\r\nX-Evil: 1", 0},
    {"text/plain\nX-Evil: 1", 0},
    {"text/plain\r", 0},
    {"text/plain; a=\"b\r\nX: y\"", 0},
    {"text/plain\tx", 0},
    {"text/plain\x7f", 0},
    {"text/pl\xc3\xa4in", 0},
    /* not the grammar */
    {"", 0},
    {NULL, 0},
    {"text", 0},
    {"text/", 0},
    {"/plain", 0},
    {" text/plain", 0},
    {"text /plain", 0},
    {"text/plain/x", 0},
    {"text/plain x", 0},
    {"text/plain; charset", 0},
    {"text/plain; charset=", 0},
    {"text/plain; =utf-8", 0},
    {"text/plain; charset=\"utf-8", 0},
    {"text/plain; charset=\"utf-8\"x", 0},
    {"text/plain; a=b c", 0},
    {"text/plain, text/html", 0},
    {"text/plain; a=(b)", 0},
    {"text/pl@in", 0},
};

static const struct {
  const char *text;
  size_t max;
  int ok;
} text_cases[] = {
    {"legal-hold", 255, 1},
    {"held for case #12: see ticket", 255, 1},
    {"utf-8 \xc3\xa4 is fine", 255, 1},
    {"abc", 3, 1},
    {"abcd", 3, 0},
    {"", 255, 0},
    {NULL, 255, 0},
    {"a\r\nX-Evil: 1", 255, 0},
    {"a\tb", 255, 0},
    {"a\x7f", 255, 0},
    {"a\x1b[31m", 255, 0},
};

static const struct {
  const char *id;
  int ok;
} id_cases[] = {
    {"abc-123_x.y:z", 1},
    {"0123456789012345678901234567890123456789012345678901234567890123", 1},  /* 64 */
    {"01234567890123456789012345678901234567890123456789012345678901234", 0}, /* 65 */
    {"", 0},
    {NULL, 0},
    {"a b", 0},
    {"a\r\nX-Evil: 1", 0},
    {"a\"b", 0},
    {"a/b", 0},
    {"\xc3\xa4", 0},
};

int main(void) {
  char longest[BR_MAX_HEADER_CONTENT_TYPE + 2];
  memset(longest, 'a', sizeof longest);
  longest[0] = 'x', longest[1] = '/';
  longest[BR_MAX_HEADER_CONTENT_TYPE] = '\0';
  CHECK(br_header_content_type_check(longest) == NULL, "255 bytes: %s",
        br_header_content_type_check(longest));
  longest[BR_MAX_HEADER_CONTENT_TYPE] = 'a';
  longest[BR_MAX_HEADER_CONTENT_TYPE + 1] = '\0';
  CHECK(br_header_content_type_check(longest) != NULL, "256 bytes accepted");
  for (size_t i = 0; i < sizeof type_cases / sizeof *type_cases; i++) {
    const char *t = type_cases[i].type, *why = br_header_content_type_check(t);
    CHECK((why == NULL) == type_cases[i].ok, "content type %zu %s: %s", i, t ? t : "(null)",
          why ? why : "accepted");
  }
  for (size_t i = 0; i < sizeof text_cases / sizeof *text_cases; i++) {
    const char *t = text_cases[i].text, *why = br_header_text_check(t, text_cases[i].max);
    CHECK((why == NULL) == text_cases[i].ok, "text %zu: %s", i, why ? why : "accepted");
  }
  for (size_t i = 0; i < sizeof id_cases / sizeof *id_cases; i++)
    CHECK(br_header_request_id_ok(id_cases[i].id) == id_cases[i].ok, "request id %zu", i);
  for (size_t i = 0; i < sizeof passive_cases / sizeof *passive_cases; i++) {
    const char *t = passive_cases[i].type;
    CHECK(br_content_type_is_passive(t) == passive_cases[i].passive, "%s: want %s",
          t ? t : "(null)", passive_cases[i].passive ? "passive" : "active");
  }
  return unit_summary("test_header");
}
