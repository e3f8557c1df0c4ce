/* `blobref refs`: prints the SHA-256 hashes (or the live data files) an Iceberg or Delta Lake table
 * references across all its retained snapshots (versions). Offline: reads the table's files. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blobref/config.h"
#include "blobref/delta.h"
#include "blobref/iceberg.h"
#include "blobref/iceberg_s3.h"
#include "commands.h"

#define MAX_REWRITES 64

static const char usage_text[] =
    "usage: blobref refs TABLE --column NAME [--form hex|binary|url] [--rewrite FROM=TO]...\n"
    "                    [--count] [--strict] [--token T]\n"
    "       blobref refs TABLE --files [--rewrite FROM=TO]... [--token T]\n"
    "       blobref refs TABLE --versions [--token T]\n"
    "       blobref refs -c FILE NAME [--count|--files] [--strict]\n"
    "TABLE: a table folder, a metadata.json path or URL, or rest:URI#namespace.table; a folder\n"
    "       holding _delta_log/ is a Delta Lake table (--files prints VERSION<TAB>PATH)\n"
    "--versions: each retained snapshot (version) and its commit time, SNAPSHOT<TAB>ISO-TIME\n"
    "            (Iceberg timestamp-ms; Delta commitInfo inCommitTimestamp or timestamp; - if "
    "none)\n"
    "-c FILE NAME: the [table NAME] of a blobref config (location, column, form, rewrites, and\n"
    "              the store whose credentials read s3:// table files)\n";

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

static int on_version(void *ud, int64_t id, int64_t timestamp_ms) {
  (void)ud;
  char ts[64] = "-";
  if (timestamp_ms >= 0) br_format_time_ms((uint64_t)timestamp_ms, ts, sizeof ts);
  printf("%" PRId64 "\t%s\n", id, ts);
  return 0;
}

static int cmp_line(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct delta_lister {
  br_delta_list_fn fn;
  void *ud;
} delta_lister;

static int refs_run(br_iceberg_table_config *cfg_in, br_iceberg_rewrite *rewrites, int files,
                    int count_only, const delta_lister *delta);
static int versions_run(br_iceberg_table_config *cfg, br_iceberg_rewrite *rewrites,
                        const delta_lister *delta);

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
  int count_only = 0, files = 0, versions = 0, form_given = 0;
  const char *table = NULL, *config_path = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int has_val = i + 1 < argc;
    if (!strcmp(a, "--column") && has_val) {
      cfg.column = argv[++i];
    } else if (!strcmp(a, "--form") && has_val) {
      const char *f = argv[++i];
      form_given = 1;
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
    } else if ((!strcmp(a, "-c") || !strcmp(a, "--config")) && has_val) {
      config_path = argv[++i];
    } else if (!strcmp(a, "--count")) {
      count_only = 1;
    } else if (!strcmp(a, "--files")) {
      files = 1;
    } else if (!strcmp(a, "--versions")) {
      versions = 1;
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
  br_err err = {{0}};
  br_config conf;
  br_config_init(&conf);
  br_iceberg_s3 *s3 = NULL;
  enum br_table_format format = BR_TABLE_AUTO;
  cfg.location = table;
  if (config_path) {
    if (br_config_load(&conf, config_path, &err) < 0 || br_config_finish(&conf, &err) < 0) {
      fprintf(stderr, "blobref refs: %s\n", err.msg);
      br_config_free(&conf);
      return 1;
    }
    const br_table_config *t = NULL;
    for (int i = 0; i < conf.ntables; i++)
      if (!strcmp(conf.tables[i].name, table)) t = &conf.tables[i];
    if (!t) {
      fprintf(stderr, "blobref refs: %s has no [table %s]\n", config_path, table);
      br_config_free(&conf);
      return 1;
    }
    cfg.location = t->location;
    format = t->format;
    if (!cfg.column) cfg.column = t->column;
    if (!form_given) cfg.form = t->form;
    for (int r = 0; r < t->nrewrites && cfg.nrewrites < MAX_REWRITES; r++) {
      rewrites[cfg.nrewrites].from = t->rewrite_from[r];
      rewrites[cfg.nrewrites].to = t->rewrite_to[r];
      cfg.nrewrites++;
    }
    const br_store_config *sc = *t->store ? br_config_store(&conf, t->store) : NULL;
    if (sc && !strcmp(sc->kind, "s3")) {
      s3 = br_iceberg_s3_new(sc, &err);
      if (!s3) {
        fprintf(stderr, "blobref refs: %s\n", err.msg);
        br_config_free(&conf);
        return 1;
      }
      cfg.open = br_iceberg_open_s3;
      cfg.open_ud = s3;
    }
  }
  /* s3:// Delta tables list their log through the table store (as reconcile does) */
  int s3_table = s3 && !strncmp(cfg.location, "s3", 2) && strstr(cfg.location, "://");
  int delta = format == BR_TABLE_DELTA ||
              (format == BR_TABLE_AUTO && (br_delta_is_local_table(cfg.location) ||
                                           (s3_table && br_delta_s3_is_table(s3, cfg.location))));
  delta_lister lister = {s3_table ? br_delta_list_s3 : NULL, s3};
  int rc_all = versions && (files || count_only) ? usage_error("--versions goes alone")
               : versions ? versions_run(&cfg, rewrites, delta ? &lister : NULL)
                          : refs_run(&cfg, rewrites, files, count_only, delta ? &lister : NULL);
  br_iceberg_s3_free(s3);
  br_config_free(&conf);
  return rc_all;
}

/* Prints each retained snapshot (version) and its commit time; returns the exit status. */
static int versions_run(br_iceberg_table_config *cfg, br_iceberg_rewrite *rewrites,
                        const delta_lister *delta) {
  cfg->rewrites = rewrites;
  br_err err = {{0}};
  int rc = delta ? br_delta_list_versions(cfg, delta->fn, delta->ud, on_version, NULL, &err)
                 : br_iceberg_list_snapshots(cfg, on_version, NULL, &err);
  if (rc != 0) {
    fprintf(stderr, "blobref refs: %s\n", err.msg);
    return 1;
  }
  return fflush(stdout) == 0 ? 0 : 1;
}

/* Prints the table's references (or files) as asked; returns the exit status. */
/* delta: NULL for an Iceberg table, else how to list the Delta table's log. */
static int refs_run(br_iceberg_table_config *cfg_in, br_iceberg_rewrite *rewrites, int files,
                    int count_only, const delta_lister *delta) {
  br_iceberg_table_config cfg = *cfg_in;
  if (!files && (!cfg.column || !*cfg.column)) return usage_error("--column is required");
  if (files && count_only) return usage_error("--files and --count do not go together");
  cfg.rewrites = rewrites;

  br_err err = {{0}};
  br_iceberg_stats stats;
  if (files) {
    lines l = {NULL, 0, 0};
    int rc = delta ? br_delta_list_files(&cfg, delta->fn, delta->ud, on_file, &l, &stats, &err)
                   : br_iceberg_list_files(&cfg, on_file, &l, &stats, &err);
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
  if ((delta ? br_delta_collect_refs(&cfg, delta->fn, delta->ud, set, &stats, &err)
             : br_iceberg_collect_refs(&cfg, set, &stats, &err)) != 0) {
    fprintf(stderr, "blobref refs: %s\n", err.msg);
    goto done;
  }
  if (stats.count_warnings)
    fprintf(stderr, "blobref refs: warning: %s%s\n", stats.first_warning,
            stats.count_warnings > 1 ? " (and more like it)" : "");
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
