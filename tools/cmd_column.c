/* `blobref column FILE --name COL`: one top-level string or binary column of a Parquet or ORC
 * file, one JSON value per line in file order. */
#include <getopt.h>
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
  int binary; /* 1: print as hex */
} print_ctx;

/* Writes data as a JSON string: quotes, backslashes and control bytes escaped, other bytes as
 * they are (UTF-8 passes through). */
static void put_json_string(FILE *out, const uint8_t *data, size_t len) {
  static const char hex[] = "0123456789abcdef";
  fputc('"', out);
  for (size_t i = 0; i < len; i++) {
    uint8_t c = data[i];
    if (c == '"' || c == '\\') {
      fputc('\\', out);
      fputc(c, out);
    } else if (c < 0x20) {
      fprintf(out, "\\u00%c%c", hex[c >> 4], hex[c & 15]);
    } else {
      fputc(c, out);
    }
  }
  fputc('"', out);
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
    put_json_string(p->out, data, len);
    fputc('\n', p->out);
  }
  return ferror(p->out) ? 1 : 0;
}

static int print_parquet(br_source *src, const char *name, br_err *err) {
  print_ctx p = {stdout, 0};
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
done:
  br_parquet_close(f);
  return rc;
}

static int print_orc(br_source *src, const char *name, br_err *err) {
  print_ctx p = {stdout, 0};
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
        return br_cli_usage_error("column", "unknown option or missing argument: '%s'",
                                  optind > 0 ? argv[optind - 1] : "?");
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
