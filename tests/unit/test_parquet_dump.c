/* Parquet command-line driver for cross-checks (--list, --dump, --sum, --write) and, without
 * arguments, table tests of whole files built in memory with our writer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blobref/parquet.h"
#include "unit.h"

static int print_value(void *ud, const uint8_t *data, size_t len, int is_null) {
  FILE *out = ud;
  static const char hex[] = "0123456789abcdef";
  if (is_null) {
    fputs("N\n", out);
    return 0;
  }
  fputc('v', out);
  for (size_t i = 0; i < len; i++) {
    fputc(hex[data[i] >> 4], out);
    fputc(hex[data[i] & 15], out);
  }
  fputc('\n', out);
  return 0;
}

struct sum {
  uint64_t values, nulls, bytes;
  uint8_t x;
};

static int sum_value(void *ud, const uint8_t *data, size_t len, int is_null) {
  struct sum *s = ud;
  if (is_null) {
    s->nulls++;
    return 0;
  }
  s->values++;
  s->bytes += len;
  if (len) s->x ^= data[len - 1];
  return 0;
}

static int cmd_list(const char *path) {
  br_err err = {""};
  br_source *src = br_source_open_file(path, &err);
  br_parquet_file *f = src ? br_parquet_open(src, &err) : NULL;
  if (!f) {
    fprintf(stderr, "ERROR: %s\n", err.msg);
    br_source_close(src);
    return 2;
  }
  printf("rows\t%lld\t%zu\n", (long long)br_parquet_num_rows(f), br_parquet_num_row_groups(f));
  for (size_t i = 0; i < br_parquet_num_columns(f); i++) {
    br_parquet_column_info c;
    br_parquet_column(f, i, &c);
    printf("col\t%s\t%d\t%d\t%d\t%d\t%d\n", c.path, c.type, c.type_length, c.max_def, c.max_rep,
           c.converted_type);
  }
  br_parquet_close(f);
  br_source_close(src);
  return 0;
}

static int cmd_read(const char *path, const char *col, int sum) {
  br_err err = {""};
  br_source *src = br_source_open_file(path, &err);
  struct sum s = {0, 0, 0, 0};
  int rc = -1;
  if (src)
    rc = sum ? br_parquet_read_column(src, col, sum_value, &s, &err)
             : br_parquet_read_column(src, col, print_value, stdout, &err);
  br_source_close(src);
  if (rc) {
    fflush(stdout);
    fprintf(stderr, "ERROR: %s\n", err.msg);
    return 2;
  }
  if (sum)
    printf("values %llu nulls %llu bytes %llu x %u\n", (unsigned long long)s.values,
           (unsigned long long)s.nulls, (unsigned long long)s.bytes, s.x);
  return 0;
}

/* --dumpall FILE: every leaf column as "C\tpath", its values, then "R\trc\tmessage". */
static int cmd_dumpall(const char *path) {
  br_err err = {""};
  br_source *src = br_source_open_file(path, &err);
  br_parquet_file *f = src ? br_parquet_open(src, &err) : NULL;
  if (!f) {
    fprintf(stderr, "ERROR: %s\n", err.msg);
    br_source_close(src);
    return 2;
  }
  for (size_t i = 0; i < br_parquet_num_columns(f); i++) {
    br_parquet_column_info c;
    br_parquet_column(f, i, &c);
    printf("C\t%s\n", c.path);
    err.msg[0] = 0;
    int rc = br_parquet_read_column_at(f, i, print_value, stdout, &err);
    printf("R\t%d\t%s\n", rc, rc ? err.msg : "");
  }
  br_parquet_close(f);
  br_source_close(src);
  return 0;
}

static int unhex(const char *s, size_t n, uint8_t *out) {
  for (size_t i = 0; i < n / 2; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (uint8_t)v;
  }
  return 0;
}

/* --write OUT CODEC ROWS_PER_GROUP SPEC...: SPEC is name:type[:len][:opt][:utf8][:ts] with type one
 * of ba, flba, i32, i64. Rows come on stdin, one per line, cells tab-separated: "N" or v<hex>. */
static int cmd_write(int argc, char **argv) {
  br_err err = {""};
  br_parquet_column_spec cols[16];
  br_parquet_value vals[16];
  size_t ncols = 0;
  int rc = 2;
  br_parquet_write_options o = {(enum br_parquet_codec)atoi(argv[3]), (uint32_t)atoi(argv[4]),
                                4096};
  char names[16][64];
  for (int i = 5; i < argc && ncols < 16; i++, ncols++) {
    br_parquet_column_spec *c = &cols[ncols];
    memset(c, 0, sizeof *c);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", argv[i]);
    char *save, *tok = strtok_r(buf, ":", &save);
    snprintf(names[ncols], sizeof names[ncols], "%s", tok);
    c->name = names[ncols];
    tok = strtok_r(NULL, ":", &save);
    if (!tok) return 2;
    if (!strcmp(tok, "ba"))
      c->type = BR_PQ_BYTE_ARRAY;
    else if (!strcmp(tok, "i32"))
      c->type = BR_PQ_INT32;
    else if (!strcmp(tok, "i64"))
      c->type = BR_PQ_INT64;
    else
      c->type = BR_PQ_FIXED_LEN_BYTE_ARRAY;
    while ((tok = strtok_r(NULL, ":", &save))) {
      if (!strcmp(tok, "opt"))
        c->optional = 1;
      else if (!strcmp(tok, "utf8"))
        c->utf8 = 1;
      else if (!strcmp(tok, "ts"))
        c->timestamp_ms = 1;
      else
        c->type_length = atoi(tok);
    }
  }
  FILE *out = fopen(argv[2], "wb");
  if (!out) return 2;
  br_parquet_writer *w = br_parquet_writer_new(cols, ncols, &o, br_parquet_write_stdio, out, &err);
  char *line = NULL;
  size_t cap = 0;
  uint8_t *bufs = NULL;
  if (!w) goto done;
  ssize_t n;
  while ((n = getline(&line, &cap, stdin)) > 0) {
    if (line[n - 1] == '\n') line[--n] = 0;
    free(bufs);
    bufs = malloc((size_t)n + 1);
    size_t off = 0, k = 0;
    char *save, *cell = strtok_r(line, "\t", &save);
    for (; cell && k < ncols; cell = strtok_r(NULL, "\t", &save), k++) {
      if (cell[0] == 'N') {
        vals[k] = (br_parquet_value){NULL, 0, 1};
        continue;
      }
      size_t hl = strlen(cell + 1);
      if (unhex(cell + 1, hl, bufs + off)) goto done;
      vals[k] = (br_parquet_value){bufs + off, hl / 2, 0};
      off += hl / 2;
    }
    if (k != ncols || br_parquet_writer_row(w, vals, &err)) goto done;
  }
  if (br_parquet_writer_finish(w, &err)) goto done;
  rc = 0;
done:
  if (rc) fprintf(stderr, "ERROR: %s\n", err.msg);
  br_parquet_writer_free(w);
  free(line);
  free(bufs);
  fclose(out);
  return rc;
}

/* ---- self tests: write with ours, read back with ours ---- */

struct membuf {
  uint8_t *p;
  size_t len, cap;
};

static int mem_write(void *ud, const void *buf, size_t len, br_err *err) {
  struct membuf *m = ud;
  if (m->len + len > m->cap) {
    size_t nc = (m->len + len) * 2;
    uint8_t *p = realloc(m->p, nc);
    if (!p) return br_fail(err, "oom");
    m->p = p;
    m->cap = nc;
  }
  memcpy(m->p + m->len, buf, len);
  m->len += len;
  return 0;
}

struct collect {
  uint64_t n, nulls;
  uint64_t sum;
  int bad;
};

static int collect_i64(void *ud, const uint8_t *data, size_t len, int is_null) {
  struct collect *c = ud;
  if (is_null) {
    c->nulls++;
  } else {
    int64_t v;
    if (len != 8) c->bad = 1;
    memcpy(&v, data, 8);
    if (v != (int64_t)c->n * 3 - 7) c->bad = 1;
    c->sum += (uint64_t)v;
  }
  c->n++;
  return 0;
}

static int stop_at_5(void *ud, const uint8_t *data, size_t len, int is_null) {
  int *n = ud;
  return ++*n == 5 ? 42 : 0;
}

static void self_test(void) {
  static const int codecs[] = {BR_PQ_UNCOMPRESSED, BR_PQ_SNAPPY,  BR_PQ_GZIP,
                               BR_PQ_ZSTD,         BR_PQ_LZ4_RAW, BR_PQ_BROTLI};
  for (size_t ci = 0; ci < sizeof codecs / sizeof codecs[0]; ci++) {
    br_parquet_column_spec cols[2] = {{"a.b", BR_PQ_INT64, 0, 1, 0, 0},
                                      {"h", BR_PQ_BYTE_ARRAY, 0, 0, 1, 0}};
    br_parquet_write_options o = {(enum br_parquet_codec)codecs[ci], 1000, 2000};
    struct membuf m = {NULL, 0, 0};
    br_err err = {""};
    br_parquet_writer *w = br_parquet_writer_new(cols, 2, &o, mem_write, &m, &err);
    CHECK(w != NULL, "writer_new: %s", err.msg);
    if (!w) continue;
    int ok = 1;
    for (int64_t i = 0; i < 5000 && ok; i++) {
      int64_t v = i * 3 - 7;
      char s[32];
      int sl = snprintf(s, sizeof s, "row-%lld", (long long)i);
      br_parquet_value vals[2] = {{(const uint8_t *)&v, 8, i % 7 == 3},
                                  {(const uint8_t *)s, (size_t)sl, 0}};
      ok = br_parquet_writer_row(w, vals, &err) == 0;
    }
    CHECK(ok && br_parquet_writer_finish(w, &err) == 0, "write codec %d: %s", codecs[ci], err.msg);
    br_parquet_writer_free(w);
    br_source *src = br_source_from_memory(m.p, m.len, &err);
    struct collect c = {0, 0, 0, 0};
    int rc = br_parquet_read_column(src, "a.b", collect_i64, &c, &err);
    CHECK(rc == 0, "read back codec %d: %s", codecs[ci], err.msg);
    CHECK(c.n == 5000 && c.nulls == 714 && !c.bad, "codec %d: n=%llu nulls=%llu bad=%d", codecs[ci],
          (unsigned long long)c.n, (unsigned long long)c.nulls, c.bad);
    br_parquet_file *f = br_parquet_open(src, &err);
    CHECK(f && br_parquet_num_rows(f) == 5000 && br_parquet_num_row_groups(f) == 5,
          "rows/groups codec %d", codecs[ci]);
    br_parquet_close(f);
    int seen = 0;
    rc = br_parquet_read_column(src, "h", stop_at_5, &seen, &err);
    CHECK(rc == 42 && seen == 5, "callback stop: rc=%d seen=%d", rc, seen);
    rc = br_parquet_read_column(src, "nope", stop_at_5, &seen, &err);
    CHECK(rc == -1 && strstr(err.msg, "nope"), "missing column: %s", err.msg);
    /* every truncation of the file is an error, never a crash */
    int trunc_ok = 1;
    for (size_t cut = 0; cut < m.len; cut += 1 + m.len / 300) {
      br_source *t = br_source_from_memory(m.p, cut, &err);
      struct collect c2 = {0, 0, 0, 0};
      if (br_parquet_read_column(t, "a.b", collect_i64, &c2, &err) != -1) trunc_ok = 0;
      br_source_close(t);
    }
    CHECK(trunc_ok, "truncated files must fail (codec %d)", codecs[ci]);
    /* flipping bytes never crashes; values never exceed the row count */
    for (size_t pos = 4; pos < m.len; pos += 1 + m.len / 500) {
      uint8_t saved = m.p[pos];
      m.p[pos] ^= 0x5a;
      br_source *t = br_source_from_memory(m.p, m.len, &err);
      struct collect c2 = {0, 0, 0, 0};
      if (br_parquet_read_column(t, "a.b", collect_i64, &c2, &err) == 0)
        CHECK(c2.n == 5000, "corrupt file read %llu values", (unsigned long long)c2.n);
      br_source_close(t);
      m.p[pos] = saved;
    }
    br_source_close(src);
    free(m.p);
  }
}

int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "--list")) return cmd_list(argv[2]);
  if (argc >= 3 && !strcmp(argv[1], "--dumpall")) return cmd_dumpall(argv[2]);
  if (argc >= 4 && !strcmp(argv[1], "--dump")) return cmd_read(argv[2], argv[3], 0);
  if (argc >= 4 && !strcmp(argv[1], "--sum")) return cmd_read(argv[2], argv[3], 1);
  if (argc >= 6 && !strcmp(argv[1], "--write")) return cmd_write(argc, argv);
  self_test();
  return unit_summary("test_parquet_dump");
}
