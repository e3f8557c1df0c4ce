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

int main(void) {
  for (size_t i = 0; i < sizeof passive_cases / sizeof *passive_cases; i++) {
    const char *t = passive_cases[i].type;
    CHECK(br_content_type_is_passive(t) == passive_cases[i].passive, "%s: want %s",
          t ? t : "(null)", passive_cases[i].passive ? "passive" : "active");
  }
  return unit_summary("test_header");
}
