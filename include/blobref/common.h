/* Small shared vocabulary: error buffers, SHA-256 ids in hex, sizes, durations and logging. */
#ifndef BLOBREF_COMMON_H
#define BLOBREF_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define BR_SHA256_LEN 32
#define BR_HEX_LEN 64

/* A human-readable error, filled by the function that failed. Callers own it (usually on the
 * stack); a NULL pointer means "caller does not want the text". */
typedef struct br_err {
  char msg[512];
} br_err;

/* Formats into err (if non-NULL) and returns -1, so that failures read `return br_fail(err, ...)`.
 */
int br_fail(br_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes 64 lowercase hex characters and a NUL into out[65]. */
void br_hex_encode(const uint8_t digest[BR_SHA256_LEN], char out[BR_HEX_LEN + 1]);
/* Writes v as 16 lower-case hex digits and a NUL (request ids: no printf on every request). */
void br_hex_u64(uint64_t v, char out[17]);

/* Parses exactly 64 hex digits (either case) into digest. Returns 0, or -1 on any other input. */
int br_hex_decode(const char *hex, size_t len, uint8_t digest[BR_SHA256_LEN]);

/* Parses a blob id as it appears in a URL: 64 lowercase hex digits, optionally behind "sha256:".
 * Uppercase hex is refused so that one blob has exactly one canonical URL. Returns 0 or -1. */
int br_blob_id_parse(const char *s, size_t len, uint8_t digest[BR_SHA256_LEN]);

/* Parses "5GiB", "64MiB", "512KiB", "1000", "10kB" (SI) into bytes. Returns 0 or -1. */
int br_parse_size(const char *s, uint64_t *out);

/* Parses "15m", "72h", "7d", "30s", "250ms" or a plain number of seconds into milliseconds. */
int br_parse_duration_ms(const char *s, uint64_t *out_ms);

/* Formats milliseconds since the epoch as RFC 3339 UTC with milliseconds ("...T12:00:00.000Z"). */
void br_format_time_ms(uint64_t ms, char *out, size_t outlen);

/* Wall-clock time in milliseconds since the epoch. */
uint64_t br_now_ms(void);

/* Logging to stderr with a UTC timestamp and level; thread-safe (one write(2) per line). */
enum br_log_level { BR_LOG_DEBUG, BR_LOG_INFO, BR_LOG_WARN, BR_LOG_ERROR };
extern int br_log_min_level;
void br_log(enum br_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define br_info(...) br_log(BR_LOG_INFO, __VA_ARGS__)
#define br_warn(...) br_log(BR_LOG_WARN, __VA_ARGS__)
#define br_error(...) br_log(BR_LOG_ERROR, __VA_ARGS__)

#endif
