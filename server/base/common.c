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

void br_hex_u64(uint64_t v, char out[17]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 15; i >= 0; i--, v >>= 4) out[i] = digits[v & 15];
  out[16] = '\0';
}

/* Hex digits by byte: 0x20 | nibble for a digit, 0x30 | nibble for an upper-case one, 0 for
 * anything else. A table, not comparisons: the digits of a hash are random, so a comparison per
 * character is a mispredicted branch per character, and every read parses one (that was 7% of a
 * small GET's CPU). */
static const uint8_t hex_nibble[256] = {
    ['0'] = 0x20, ['1'] = 0x21, ['2'] = 0x22, ['3'] = 0x23, ['4'] = 0x24, ['5'] = 0x25,
    ['6'] = 0x26, ['7'] = 0x27, ['8'] = 0x28, ['9'] = 0x29, ['a'] = 0x2a, ['b'] = 0x2b,
    ['c'] = 0x2c, ['d'] = 0x2d, ['e'] = 0x2e, ['f'] = 0x2f, ['A'] = 0x3a, ['B'] = 0x3b,
    ['C'] = 0x3c, ['D'] = 0x3d, ['E'] = 0x3e, ['F'] = 0x3f,
};

/* Decodes 64 hex digits. Returns -1 when one is not a hex digit, 1 when all are but one is upper
 * case, 0 otherwise. */
static int hex_decode_checked(const char *hex, uint8_t digest[BR_SHA256_LEN]) {
  unsigned all = 0x20, any = 0;
  for (int i = 0; i < BR_SHA256_LEN; i++) {
    unsigned hi = hex_nibble[(unsigned char)hex[2 * i]];
    unsigned lo = hex_nibble[(unsigned char)hex[2 * i + 1]];
    all &= hi & lo;
    any |= hi | lo;
    digest[i] = (uint8_t)((hi & 15) << 4 | (lo & 15));
  }
  return !(all & 0x20) ? -1 : (any & 0x10) ? 1 : 0;
}

int br_hex_decode(const char *hex, size_t len, uint8_t digest[BR_SHA256_LEN]) {
  if (len != BR_HEX_LEN) return -1;
  return hex_decode_checked(hex, digest) < 0 ? -1 : 0;
}

int br_blob_id_parse(const char *s, size_t len, uint8_t digest[BR_SHA256_LEN]) {
  if (len >= 7 && memcmp(s, "sha256:", 7) == 0) {
    s += 7;
    len -= 7;
  }
  if (len != BR_HEX_LEN) return -1;
  uint8_t out[BR_SHA256_LEN];
  if (hex_decode_checked(s, out) != 0) return -1; /* not a digit, or upper case */
  memcpy(digest, out, BR_SHA256_LEN);
  return 0;
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
