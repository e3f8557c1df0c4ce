/* Shared helpers: error formatting, hex ids, size and duration parsing, logging. */
#include "blobref/common.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int br_log_min_level = BR_LOG_INFO;

int br_fail(br_err *err, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return -1;
}

void br_hex_encode(const uint8_t digest[BR_SHA256_LEN], char out[BR_HEX_LEN + 1]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < BR_SHA256_LEN; i++) {
    out[2 * i] = digits[digest[i] >> 4];
    out[2 * i + 1] = digits[digest[i] & 15];
  }
  out[BR_HEX_LEN] = '\0';
}

static int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int br_hex_decode(const char *hex, size_t len, uint8_t digest[BR_SHA256_LEN]) {
  if (len != BR_HEX_LEN) return -1;
  for (int i = 0; i < BR_SHA256_LEN; i++) {
    int hi = hex_value((unsigned char)hex[2 * i]);
    int lo = hex_value((unsigned char)hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    digest[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

int br_blob_id_parse(const char *s, size_t len, uint8_t digest[BR_SHA256_LEN]) {
  if (len >= 7 && memcmp(s, "sha256:", 7) == 0) {
    s += 7;
    len -= 7;
  }
  if (len != BR_HEX_LEN) return -1;
  for (size_t i = 0; i < len; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return -1;
  return br_hex_decode(s, len, digest);
}

/* Parses a non-negative decimal (fraction allowed) into *value and points *unit at the suffix
 * that follows it (spaces skipped). */
static int parse_number_unit(const char *s, long double *value, const char **unit) {
  while (isspace((unsigned char)*s)) s++;
  if (!isdigit((unsigned char)*s)) return -1;
  char *end = NULL;
  errno = 0;
  long double v = strtold(s, &end);
  if (errno || end == s || v < 0) return -1;
  while (isspace((unsigned char)*end)) end++;
  *value = v;
  *unit = end;
  return 0;
}

static int unit_is(const char *unit, const char *name) {
  size_t n = strlen(name);
  if (strncasecmp(unit, name, n) != 0) return 0;
  for (const char *p = unit + n; *p; p++)
    if (!isspace((unsigned char)*p)) return 0;
  return 1;
}

struct unit {
  const char *name;
  uint64_t scale;
};

/* A number with one of the units (case-insensitive; "" = no unit), scaled and rounded. */
static int parse_scaled(const char *s, const struct unit *units, size_t nunits, uint64_t *out) {
  long double v;
  const char *unit;
  if (!s || parse_number_unit(s, &v, &unit) < 0) return -1;
  for (size_t i = 0; i < nunits; i++) {
    if (unit_is(unit, units[i].name)) {
      long double scaled = v * (long double)units[i].scale;
      if (scaled > 1.8e19L) return -1;
      *out = (uint64_t)(scaled + 0.5L);
      return 0;
    }
  }
  return -1;
}

int br_parse_size(const char *s, uint64_t *out) {
  static const struct unit units[] = {{"", 1},
                                      {"b", 1},
                                      {"kib", 1ull << 10},
                                      {"mib", 1ull << 20},
                                      {"gib", 1ull << 30},
                                      {"tib", 1ull << 40},
                                      {"k", 1000},
                                      {"kb", 1000},
                                      {"m", 1000000},
                                      {"mb", 1000000},
                                      {"g", 1000000000},
                                      {"gb", 1000000000},
                                      {"t", 1000000000000ull},
                                      {"tb", 1000000000000ull}};
  return parse_scaled(s, units, sizeof units / sizeof units[0], out);
}

int br_parse_duration_ms(const char *s, uint64_t *out_ms) {
  static const struct unit units[] = {{"", 1000},      {"ms", 1},       {"s", 1000},
                                      {"m", 60000},    {"min", 60000},  {"h", 3600000},
                                      {"d", 86400000}, {"w", 604800000}};
  return parse_scaled(s, units, sizeof units / sizeof units[0], out_ms);
}

uint64_t br_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void br_log(enum br_log_level level, const char *fmt, ...) {
  static const char *names[] = {"debug", "info", "warn", "error"};
  if ((int)level < br_log_min_level) return;
  char line[2048];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   ts.tv_nsec / 1000000, names[level]);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w;
}

void br_format_time_ms(uint64_t ms, char *out, size_t outlen) {
  time_t secs = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  snprintf(out, outlen, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900, tm.tm_mon + 1,
           tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (unsigned)(ms % 1000));
}
