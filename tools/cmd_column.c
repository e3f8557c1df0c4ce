/* `blobref column FILE --name COL`: one top-level string or binary column of a Parquet or ORC
 * file, one JSON value per line in file order. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "blobref/orc.h"
#include "blobref/parquet.h"
#include "commands.h"
#include "http_client.h"

/* parquet.thrift ConvertedType values that mean text. */
#define PQ_CT_UTF8 0
#define PQ_CT_ENUM 4
#define PQ_CT_JSON 19

static const char column_help[] =
    "usage: blobref column FILE --name COL\n"
    "Prints top-level column COL of a Parquet or ORC file, one JSON value per line in file order:\n"
    "strings as JSON strings, binary as a JSON string of lowercase hex, null as null.\n";

typedef struct print_ctx {
  FILE *out;
  int binary;        /* 1: print as hex */
  uint64_t not_utf8; /* values holding bytes that are not UTF-8 (printed as U+FFFD) */
} print_ctx;

/* The length of the well-formed UTF-8 sequence at data[0] (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF), or 0 when the bytes there are not one. */
static size_t utf8_sequence(const uint8_t *data, size_t len) {
  uint8_t c = data[0];
  if (c < 0x80) return 1;
  size_t n = c >= 0xc2 && c <= 0xdf   ? 2
             : c >= 0xe0 && c <= 0xef ? 3
             : c >= 0xf0 && c <= 0xf4 ? 4
                                      : 0;
  if (n == 0 || len < n) return 0;
  for (size_t i = 1; i < n; i++)
    if ((data[i] & 0xc0) != 0x80) return 0;
  if (c == 0xe0 && data[1] < 0xa0) return 0; /* overlong */
  if (c == 0xed && data[1] > 0x9f) return 0; /* a surrogate */
  if (c == 0xf0 && data[1] < 0x90) return 0; /* overlong */
  if (c == 0xf4 && data[1] > 0x8f) return 0; /* above U+10FFFF */
  return n;
}

/* Writes data as a JSON string: quotes, backslashes and control bytes escaped, UTF-8 as it is,
 * and each byte that is not part of well-formed UTF-8 as U+FFFD (JSON text is UTF-8). Returns
 * the number of bytes so replaced. */
static size_t put_json_string(FILE *out, const uint8_t *data, size_t len) {
  static const char hex[] = "0123456789abcdef";
  size_t replaced = 0;
  fputc('"', out);
  for (size_t i = 0; i < len;) {
    uint8_t c = data[i];
    size_t n = utf8_sequence(data + i, len - i);
    if (n == 0) {
      fputs("\\ufffd", out);
      replaced++;
      i++;
    } else if (c == '"' || c == '\\') {
      fputc('\\', out);
      fputc(c, out);
      i++;
    } else if (c < 0x20) {
      fprintf(out, "\\u00%c%c", hex[c >> 4], hex[c & 15]);
      i++;
    } else {
      fwrite(data + i, 1, n, out);
      i += n;
    }
  }
  fputc('"', out);
  return replaced;
}

static int print_value(void *ud, const uint8_t *data, size_t len, int is_null) {
  print_ctx *p = ud;
  static const char hex[] = "0123456789abcdef";
  if (is_null) {
    fputs("null\n", p->out);
  } else if (p->binary) {
    fputc('"', p->out);
    for (size_t i = 0; i < len; i++) {
      fputc(hex[data[i] >> 4], p->out);
      fputc(hex[data[i] & 15], p->out);
    }
    fputs("\"\n", p->out);
  } else {
    if (put_json_string(p->out, data, len)) p->not_utf8++;
    fputc('\n', p->out);
  }
  return ferror(p->out) ? 1 : 0;
}

/* One warning on stderr when some values were not UTF-8 (the output stays one JSON value per
 * line; the command does not fail). */
static void warn_not_utf8(const print_ctx *p, const char *name) {
  if (p->not_utf8)
    fprintf(stderr,
            "blobref column: %" PRIu64
            " value%s of '%s' held bytes that are not UTF-8, printed "
            "as U+FFFD\n",
            p->not_utf8, p->not_utf8 == 1 ? "" : "s", name);
}

static int print_parquet(br_source *src, const char *name, br_err *err) {
  print_ctx p = {stdout, 0, 0};
  int rc = -1;
  br_parquet_file *f = br_parquet_open(src, err);
  if (!f) return -1;
  int ci = br_parquet_find_column(f, name);
  br_parquet_column_info info;
  if (ci < 0 || br_parquet_column(f, (size_t)ci, &info) != 0 || strchr(info.path, '.')) {
    br_fail(err, "no top-level column '%s'", name);
    goto done;
  }
  if ((info.type != BR_PQ_BYTE_ARRAY && info.type != BR_PQ_FIXED_LEN_BYTE_ARRAY) ||
      info.max_rep != 0) {
    br_fail(err, "column '%s' is not a string or binary column", name);
    goto done;
  }
  p.binary = !(info.type == BR_PQ_BYTE_ARRAY &&
               (info.converted_type == PQ_CT_UTF8 || info.converted_type == PQ_CT_ENUM ||
                info.converted_type == PQ_CT_JSON));
  rc = br_parquet_read_column_at(f, (size_t)ci, print_value, &p, err);
  if (rc > 0) rc = br_fail(err, "cannot write to stdout");
  warn_not_utf8(&p, name);
done:
  br_parquet_close(f);
  return rc;
}

static int print_orc(br_source *src, const char *name, br_err *err) {
  print_ctx p = {stdout, 0, 0};
  int rc = -1, kind;
  const char *cname;
  br_orc_file *f = br_orc_open(src, err);
  if (!f) return -1;
  int ci = br_orc_find_column(f, name);
  if (ci < 0 || br_orc_column(f, (size_t)ci, &cname, &kind) != 0) {
    br_fail(err, "no top-level column '%s'", name);
    goto done;
  }
  p.binary = kind == BR_ORC_BINARY;
  rc = br_orc_read_column_at(f, (size_t)ci, print_value, &p, err);
  if (rc > 0) rc = br_fail(err, "cannot write to stdout");
  warn_not_utf8(&p, name);
done:
  br_orc_close(f);
  return rc;
}

int cmd_column(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {
      {"name", required_argument, NULL, 'n'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
  const char *name = NULL;
  int opt;
  optind = 0;
  opterr = 0;
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (opt) {
      case 'n':
        name = optarg;
        break;
      case 'h':
        fputs(column_help, stdout);
        return 0;
      default:
        return br_cli_bad_option("column", argv, longopts);
    }
  }
  if (argc - optind != 1) return br_cli_usage_error("column", "expected one FILE");
  if (!name || !*name) return br_cli_usage_error("column", "--name COL is required");
  const char *path = argv[optind];
  br_err err = {""};
  int rc = -1;
  br_source *src = br_source_open_file(path, &err);
  if (src) {
    uint8_t magic[4] = {0};
    if (src->size >= 4 && src->pread(src, magic, 4, 0, &err) != 0) {
      rc = -1;
    } else if (!memcmp(magic, "PAR1", 4)) {
      rc = print_parquet(src, name, &err);
    } else if (!memcmp(magic, "ORC", 3)) {
      rc = print_orc(src, name, &err);
    } else {
      rc = br_fail(&err, "not a Parquet or ORC file");
    }
  }
  br_source_close(src);
  if (fflush(stdout) != 0 && rc == 0) rc = br_fail(&err, "cannot write to stdout");
  if (rc != 0) {
    fprintf(stderr, "blobref column: %s: %s\n", path, err.msg);
    return 1;
  }
  return 0;
}
