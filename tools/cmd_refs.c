/* `blobref refs`: prints the SHA-256 hashes (or the live data files) an Iceberg table references
 * across all its retained snapshots. Offline: reads the table's files directly. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blobref/iceberg.h"
#include "commands.h"

#define MAX_REWRITES 64

static const char usage_text[] =
    "usage: blobref refs TABLE --column NAME [--form hex|binary|url] [--rewrite FROM=TO]...\n"
    "                    [--count] [--strict] [--token T]\n"
    "       blobref refs TABLE --files [--rewrite FROM=TO]... [--token T]\n"
    "TABLE: a table folder, a metadata.json path or URL, or rest:URI#namespace.table\n";

typedef struct lines {
  char **v;
  size_t n, cap;
} lines;

static int on_file(void *ud, int64_t snapshot_id, const char *path) {
  lines *l = ud;
  if (l->n == l->cap) {
    size_t ncap = l->cap ? l->cap * 2 : 256;
    char **nv = realloc(l->v, ncap * sizeof *nv);
    if (!nv) return 2;
    l->v = nv;
    l->cap = ncap;
  }
  size_t need = strlen(path) + 32;
  l->v[l->n] = malloc(need);
  if (!l->v[l->n]) return 2;
  snprintf(l->v[l->n++], need, "%" PRId64 "\t%s", snapshot_id, path);
  return 0;
}

static int cmp_line(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int usage_error(const char *msg) {
  fprintf(stderr, "blobref refs: %s\n%s", msg, usage_text);
  return 2;
}

int cmd_refs(const cli_globals *g, int argc, char **argv) {
  (void)g;
  br_iceberg_rewrite rewrites[MAX_REWRITES];
  br_iceberg_table_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.form = BR_FORM_HEX;
  cfg.token = getenv("BLOBREF_CATALOG_TOKEN");
  int count_only = 0, files = 0;
  const char *table = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int has_val = i + 1 < argc;
    if (!strcmp(a, "--column") && has_val) {
      cfg.column = argv[++i];
    } else if (!strcmp(a, "--form") && has_val) {
      const char *f = argv[++i];
      if (!strcmp(f, "hex"))
        cfg.form = BR_FORM_HEX;
      else if (!strcmp(f, "binary"))
        cfg.form = BR_FORM_BINARY;
      else if (!strcmp(f, "url"))
        cfg.form = BR_FORM_URL;
      else
        return usage_error("--form must be hex, binary or url");
    } else if (!strcmp(a, "--rewrite") && has_val) {
      char *r = argv[++i];
      char *eq = strchr(r, '=');
      if (!eq || eq == r) return usage_error("--rewrite needs FROM=TO");
      if (cfg.nrewrites == MAX_REWRITES) return usage_error("too many --rewrite options");
      *eq = 0;
      rewrites[cfg.nrewrites].from = r;
      rewrites[cfg.nrewrites].to = eq + 1;
      cfg.nrewrites++;
    } else if (!strcmp(a, "--token") && has_val) {
      cfg.token = argv[++i];
    } else if (!strcmp(a, "--count")) {
      count_only = 1;
    } else if (!strcmp(a, "--files")) {
      files = 1;
    } else if (!strcmp(a, "--strict")) {
      cfg.fail_on_invalid = 1;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(usage_text, stdout);
      return 0;
    } else if (a[0] == '-' && a[1] != 0) {
      fprintf(stderr, "blobref refs: unknown or incomplete option %s\n%s", a, usage_text);
      return 2;
    } else if (!table) {
      table = a;
    } else {
      return usage_error("only one TABLE");
    }
  }
  if (!table) return usage_error("TABLE is required");
  if (!files && (!cfg.column || !*cfg.column)) return usage_error("--column is required");
  if (files && count_only) return usage_error("--files and --count do not go together");
  cfg.location = table;
  cfg.rewrites = rewrites;

  br_err err = {{0}};
  br_iceberg_stats stats;
  if (files) {
    lines l = {NULL, 0, 0};
    int rc = br_iceberg_list_files(&cfg, on_file, &l, &stats, &err);
    if (rc == 0) {
      qsort(l.v, l.n, sizeof *l.v, cmp_line);
      for (size_t i = 0; i < l.n; i++) printf("%s\n", l.v[i]);
    } else if (rc != -1) {
      snprintf(err.msg, sizeof err.msg, "out of memory");
    }
    for (size_t i = 0; i < l.n; i++) free(l.v[i]);
    free(l.v);
    if (rc != 0) {
      fprintf(stderr, "blobref refs: %s\n", err.msg);
      return 1;
    }
    return fflush(stdout) == 0 ? 0 : 1;
  }

  br_hashset *set = br_hashset_new();
  if (!set) {
    fprintf(stderr, "blobref refs: out of memory\n");
    return 1;
  }
  int status = 1;
  uint8_t *sorted = NULL;
  if (br_iceberg_collect_refs(&cfg, set, &stats, &err) != 0) {
    fprintf(stderr, "blobref refs: %s\n", err.msg);
    goto done;
  }
  if (stats.invalid)
    fprintf(stderr,
            "blobref refs: warning: %" PRIu64 " of %" PRIu64
            " values in column '%s' are not hashes in this form (first: %s)\n",
            stats.invalid, stats.values, cfg.column, stats.first_invalid);
  size_t n = br_hashset_count(set);
  if (count_only) {
    printf("%zu\n", n);
  } else {
    sorted = br_hashset_sorted(set, &n);
    if (!sorted && n) {
      fprintf(stderr, "blobref refs: out of memory\n");
      goto done;
    }
    char hex[BR_HEX_LEN + 1];
    for (size_t i = 0; i < n; i++) {
      br_hex_encode(sorted + i * BR_SHA256_LEN, hex);
      printf("%s\n", hex);
    }
  }
  status = fflush(stdout) == 0 ? 0 : 1;
done:
  free(sorted);
  br_hashset_free(set);
  return status;
}
