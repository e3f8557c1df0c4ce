/* The Iceberg walk: every retained snapshot -> manifest list -> manifests -> live data files
 * (each manifest and data file once), and the hash column of those files into a br_hashset. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "blobref/orc.h"
#include "blobref/parquet.h"
#include "iceberg/internal.h"

/* --- a string table: path -> index, open addressing ---------------------------------------- */

typedef struct strtab {
  char **strs;   /* by index */
  size_t n, cap; /* strs */
  size_t *slots; /* index + 1, 0 = empty */
  size_t nslots; /* power of two */
} strtab;

static uint64_t fnv(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static void strtab_free(strtab *t) {
  for (size_t i = 0; i < t->n; i++) free(t->strs[i]);
  free(t->strs);
  free(t->slots);
  memset(t, 0, sizeof *t);
}

static int strtab_rehash(strtab *t, size_t nslots) {
  size_t *ns = calloc(nslots, sizeof *ns);
  if (!ns) return -1;
  for (size_t i = 0; i < t->n; i++) {
    size_t j = fnv(t->strs[i]) & (nslots - 1);
    while (ns[j]) j = (j + 1) & (nslots - 1);
    ns[j] = i + 1;
  }
  free(t->slots);
  t->slots = ns;
  t->nslots = nslots;
  return 0;
}

/* Index of s, adding it if new (*added = 1). Returns -1 when out of memory. */
static long strtab_put(strtab *t, const char *s, int *added) {
  *added = 0;
  if ((t->n + 1) * 2 > t->nslots && strtab_rehash(t, t->nslots ? t->nslots * 2 : 1024) != 0)
    return -1;
  size_t j = fnv(s) & (t->nslots - 1);
  while (t->slots[j]) {
    if (strcmp(t->strs[t->slots[j] - 1], s) == 0) return (long)(t->slots[j] - 1);
    j = (j + 1) & (t->nslots - 1);
  }
  if (t->n == t->cap) {
    size_t ncap = t->cap ? t->cap * 2 : 256;
    char **nn = realloc(t->strs, ncap * sizeof *nn);
    if (!nn) return -1;
    t->strs = nn;
    t->cap = ncap;
  }
  t->strs[t->n] = strdup(s);
  if (!t->strs[t->n]) return -1;
  t->slots[j] = ++t->n;
  *added = 1;
  return (long)(t->n - 1);
}

/* --- index vectors ------------------------------------------------------------------------- */

typedef struct idxvec {
  size_t *v;
  size_t n, cap;
} idxvec;

static int idxvec_push(idxvec *x, size_t i) {
  if (x->n == x->cap) {
    size_t ncap = x->cap ? x->cap * 2 : 16;
    size_t *nv = realloc(x->v, ncap * sizeof *nv);
    if (!nv) return -1;
    x->v = nv;
    x->cap = ncap;
  }
  x->v[x->n++] = i;
  return 0;
}

/* --- the walk ------------------------------------------------------------------------------ */

typedef struct walk {
  const br_iceberg_table_config *cfg;
  br_iceberg_stats *stats;
  ice_pathmap pm;
  strtab manifests; /* mapped manifest paths */
  idxvec *mlive;    /* per manifest: live data file indices */
  size_t mlive_cap;
  strtab files;            /* mapped live data file paths */
  uint8_t *parquet;        /* per file: its format (BR_ICEBERG_PARQUET, _ORC or 0) */
  int64_t *fsize, *fcount; /* per file: file_size_in_bytes and record_count from the manifest */
  size_t parquet_cap;
  size_t *mark; /* per file: last snapshot index + 1 that listed it */
  idxvec cur;   /* manifest indices of the snapshot being walked */
  const char *cur_manifest;
  br_iceberg_file_fn fn;
  void *ud;
} walk;

static int read_file(walk *w, const char *path, uint64_t max, uint8_t **data, size_t *len,
                     br_err *err) {
  br_iceberg_open_fn open = w->cfg->open ? w->cfg->open : br_iceberg_open_local;
  br_source *src = open(w->cfg->open_ud, path, err);
  if (!src) return -1;
  int rc = br_source_read_all(src, max, data, len, err);
  br_source_close(src);
  return rc;
}

/* Registers a manifest path (recorded form) for the current snapshot; reads it if new. */
static int add_manifest(walk *w, const char *raw, size_t rawlen, int64_t nentries, br_err *err);

static int on_manifest_ref(void *ud, const ice_manifest_ref *ref, br_err *err) {
  return add_manifest(ud, ref->path, ref->path_len, ref->nentries, err);
}

static int on_entry(void *ud, const ice_entry *e, br_err *err) {
  walk *w = ud;
  if (e->status == 2) return 0; /* DELETED */
  if (e->content != 0) {
    w->stats->delete_files++;
    return 0;
  }
  char raw[ICE_MAX_PATH + 1], mapped[ICE_MAX_PATH + 1];
  memcpy(raw, e->path, e->path_len);
  raw[e->path_len] = 0;
  if (ice_map_path(&w->pm, raw, mapped, sizeof mapped, err) != 0) return -1;
  int added;
  long fi = strtab_put(&w->files, mapped, &added);
  if (fi < 0) return br_fail(err, "out of memory");
  if (added) {
    if ((size_t)fi >= w->parquet_cap) {
      size_t ncap = w->parquet_cap ? w->parquet_cap * 2 : 256;
      uint8_t *np = realloc(w->parquet, ncap);
      if (np) w->parquet = np;
      size_t *nm = realloc(w->mark, ncap * sizeof *nm);
      if (nm) w->mark = nm;
      int64_t *ns = realloc(w->fsize, ncap * sizeof *ns);
      if (ns) w->fsize = ns;
      int64_t *nc = realloc(w->fcount, ncap * sizeof *nc);
      if (nc) w->fcount = nc;
      if (!np || !nm || !ns || !nc) return br_fail(err, "out of memory");
      w->parquet_cap = ncap;
    }
    w->parquet[fi] = e->format_len == 7 && strncasecmp(e->format, "PARQUET", 7) == 0
                         ? BR_ICEBERG_PARQUET
                     : e->format_len == 3 && strncasecmp(e->format, "ORC", 3) == 0 ? BR_ICEBERG_ORC
                                                                                   : 0;
    w->fsize[fi] = e->file_size;
    w->fcount[fi] = e->record_count;
    w->mark[fi] = 0;
  }
  size_t mi = w->manifests.n - 1; /* the manifest being read is the newest one */
  return idxvec_push(&w->mlive[mi], (size_t)fi) == 0 ? 0 : br_fail(err, "out of memory");
}

static int add_manifest(walk *w, const char *raw, size_t rawlen, int64_t nentries, br_err *err) {
  char rawz[ICE_MAX_PATH + 1], mapped[ICE_MAX_PATH + 1];
  if (rawlen > ICE_MAX_PATH) return br_fail(err, "manifest path too long");
  memcpy(rawz, raw, rawlen);
  rawz[rawlen] = 0;
  if (ice_map_path(&w->pm, rawz, mapped, sizeof mapped, err) != 0) return -1;
  int added;
  long mi = strtab_put(&w->manifests, mapped, &added);
  if (mi < 0) return br_fail(err, "out of memory");
  if (idxvec_push(&w->cur, (size_t)mi) != 0) return br_fail(err, "out of memory");
  if (!added) return 0;
  if ((size_t)mi >= w->mlive_cap) {
    size_t ncap = w->mlive_cap ? w->mlive_cap * 2 : 64;
    idxvec *nv = realloc(w->mlive, ncap * sizeof *nv);
    if (!nv) return br_fail(err, "out of memory");
    memset(nv + w->mlive_cap, 0, (ncap - w->mlive_cap) * sizeof *nv);
    w->mlive = nv;
    w->mlive_cap = ncap;
  }
  uint8_t *data = NULL;
  size_t len = 0;
  uint64_t nrec = 0;
  if (read_file(w, mapped, ICE_MAX_AVRO_FILE, &data, &len, err) != 0) return -1;
  int rc = ice_read_manifest(data, len, on_entry, w, &nrec, err);
  free(data);
  if (rc != 0) {
    char tmp[sizeof err->msg];
    snprintf(tmp, sizeof tmp, "%s", err ? err->msg : "");
    return br_fail(err, "manifest %s: %s", mapped, tmp);
  }
  /* A manifest cut at a block boundary still decodes: the list's file counts catch that. They
   * are statistics, though, and some engines write them low: more entries than claimed cannot
   * lose a reference (every entry was read), so that is only a warning; fewer is an error. */
  if (nentries >= 0 && (uint64_t)nentries > nrec)
    return br_fail(err, "manifest %s: %llu entries, the manifest list says %lld", mapped,
                   (unsigned long long)nrec, (long long)nentries);
  if (nentries >= 0 && (uint64_t)nentries < nrec) {
    if (!w->stats->count_warnings)
      snprintf(
          w->stats->first_warning, sizeof w->stats->first_warning,
          "manifest %.300s: %llu entries, more than the %lld its manifest list counts (all read)",
          mapped, (unsigned long long)nrec, (long long)nentries);
    w->stats->count_warnings++;
  }
  w->stats->manifests++;
  return 0;
}

static int walk_snapshot(walk *w, const ice_snapshot *s, size_t si, br_err *err) {
  w->cur.n = 0;
  if (s->manifest_list) {
    char mapped[ICE_MAX_PATH + 1];
    if (ice_map_path(&w->pm, s->manifest_list, mapped, sizeof mapped, err) != 0) return -1;
    uint8_t *data = NULL;
    size_t len = 0;
    if (read_file(w, mapped, ICE_MAX_AVRO_FILE, &data, &len, err) != 0) return -1;
    /* Collect the refs first (their paths live in data), then read the manifests. */
    int rc = ice_read_manifest_list(data, len, on_manifest_ref, w, NULL, err);
    free(data);
    if (rc != 0) {
      char tmp[sizeof err->msg];
      snprintf(tmp, sizeof tmp, "%s", err ? err->msg : "");
      if (err && strstr(tmp, "manifest ") != tmp)
        br_fail(err, "snapshot %lld: manifest list %s: %s", (long long)s->id, mapped, tmp);
      return -1;
    }
    w->stats->manifest_lists++;
  } else {
    for (size_t i = 0; i < s->nmanifests; i++)
      if (add_manifest(w, s->manifests[i], strlen(s->manifests[i]), -1, err) != 0) return -1;
  }
  w->stats->snapshots++;
  for (size_t k = 0; k < w->cur.n; k++) {
    const idxvec *live = &w->mlive[w->cur.v[k]];
    for (size_t j = 0; j < live->n; j++) {
      size_t fi = live->v[j];
      if (w->mark[fi] == si + 1) continue;
      w->mark[fi] = si + 1;
      if (w->fn) {
        int rc = w->fn(w->ud, s->id, w->files.strs[fi]);
        if (rc != 0) return rc;
      }
    }
  }
  return 0;
}

static void walk_free(walk *w) {
  for (size_t i = 0; i < w->mlive_cap; i++) free(w->mlive[i].v);
  free(w->mlive);
  strtab_free(&w->manifests);
  strtab_free(&w->files);
  free(w->parquet);
  free(w->fsize);
  free(w->fcount);
  free(w->mark);
  free(w->cur.v);
}

/* Loads the table and walks every snapshot; on success w->files holds every live data file. */
static int run_walk(walk *w, const br_iceberg_table_config *cfg, br_iceberg_file_fn fn, void *ud,
                    br_iceberg_stats *stats, br_err *err) {
  ice_meta m;
  char *table_dir = NULL;
  memset(w, 0, sizeof *w);
  memset(stats, 0, sizeof *stats);
  w->cfg = cfg;
  w->stats = stats;
  w->fn = fn;
  w->ud = ud;
  if (ice_load_table(cfg, &m, &table_dir, err) != 0) return -1;
  w->pm.rewrites = cfg->rewrites;
  w->pm.nrewrites = cfg->nrewrites;
  w->pm.table_dir = table_dir;
  w->pm.location = m.location;
  int rc = 0;
  for (size_t i = 0; i < m.nsnapshots && rc == 0; i++)
    rc = walk_snapshot(w, &m.snapshots[i], i, err);
  stats->data_files = w->files.n;
  ice_meta_free(&m);
  free(table_dir);
  return rc;
}

int br_iceberg_list_files(const br_iceberg_table_config *cfg, br_iceberg_file_fn fn, void *ud,
                          br_iceberg_stats *stats, br_err *err) {
  walk w;
  br_iceberg_stats local;
  int rc = run_walk(&w, cfg, fn, ud, stats ? stats : &local, err);
  walk_free(&w);
  return rc;
}

int br_iceberg_list_snapshots(const br_iceberg_table_config *cfg, br_iceberg_snapshot_fn fn,
                              void *ud, br_err *err) {
  ice_meta m;
  char *table_dir = NULL;
  if (ice_load_table(cfg, &m, &table_dir, err) != 0) return -1;
  int rc = 0;
  for (size_t i = 0; i < m.nsnapshots && rc == 0; i++)
    rc = fn(ud, m.snapshots[i].id, m.snapshots[i].timestamp_ms);
  ice_meta_free(&m);
  free(table_dir);
  return rc;
}

/* --- reading the hash column --------------------------------------------------------------- */

typedef struct value_ctx {
  br_hashset *out;
  br_iceberg_hash_fn fn; /* when out is NULL */
  void *ud;
  br_iceberg_stats *stats;
  const br_iceberg_table_config *cfg;
  const char *file;
  int oom;
} value_ctx;

static int on_value(void *ud, const uint8_t *data, size_t len, int is_null) {
  value_ctx *vc = ud;
  if (is_null) {
    vc->stats->nulls++;
    return 0;
  }
  vc->stats->values++;
  uint8_t d[BR_SHA256_LEN];
  if (br_iceberg_parse_hash(vc->cfg->form, data, len, d) != 0) {
    if (vc->stats->invalid++ == 0) {
      char shown[65];
      size_t n = len < 64 ? len : 64;
      for (size_t i = 0; i < n; i++)
        shown[i] = data[i] >= 0x20 && data[i] < 0x7f ? (char)data[i] : '?';
      shown[n] = 0;
      snprintf(vc->stats->first_invalid, sizeof vc->stats->first_invalid, "%s: '%s'", vc->file,
               shown);
    }
    return vc->cfg->fail_on_invalid ? 2 : 0;
  }
  if (vc->out ? br_hashset_add(vc->out, d) < 0 : vc->fn(vc->ud, d) != 0) {
    vc->oom = 1;
    return 3;
  }
  return 0;
}

/* Parquet: reads the hash column of src into vc. -1 with err (path included) when the file or
 * column cannot be read; otherwise the reader's result (callback codes 2/3, or -1 + bare err). */
static int read_parquet_hashes(const br_iceberg_table_config *cfg, const char *path, br_source *src,
                               value_ctx *vc, int *opened, br_err *err) {
  int rc = -1;
  br_parquet_file *pf = br_parquet_open(src, err);
  if (!pf) return -1;
  *opened = 1;
  int ci = br_parquet_find_column(pf, cfg->column);
  br_parquet_column_info info;
  if (ci < 0) {
    br_fail(err, "%s: no column '%s'", path, cfg->column);
  } else if (br_parquet_column(pf, (size_t)ci, &info) != 0) {
    br_fail(err, "%s: column '%s' is unreadable", path, cfg->column);
  } else if (info.type != BR_PQ_BYTE_ARRAY &&
             !(info.type == BR_PQ_FIXED_LEN_BYTE_ARRAY &&
               (cfg->form != BR_FORM_BINARY || info.type_length == BR_SHA256_LEN))) {
    br_fail(err, "%s: column '%s' has a physical type that cannot hold a hash in this form", path,
            cfg->column);
  } else {
    rc = br_parquet_read_column_at(pf, (size_t)ci, on_value, vc, err);
    if (rc == -1) rc = -4; /* a read error: the caller adds the path */
  }
  br_parquet_close(pf);
  return rc;
}

/* ORC: as read_parquet_hashes, for a top-level string, varchar, char or binary column. */
static int read_orc_hashes(const br_iceberg_table_config *cfg, const char *path, br_source *src,
                           value_ctx *vc, int *opened, br_err *err) {
  int rc = -1;
  br_orc_file *of = br_orc_open(src, err);
  if (!of) return -1;
  *opened = 1;
  int ci = br_orc_find_column(of, cfg->column);
  if (ci < 0) {
    br_fail(err, "%s: no column '%s'", path, cfg->column);
  } else {
    rc = br_orc_read_column_at(of, (size_t)ci, on_value, vc, err);
    if (rc == -1) rc = -4;
  }
  br_orc_close(of);
  return rc;
}

static int read_hashes_of(const br_iceberg_table_config *cfg, const char *path, int format,
                          br_hashset *out, br_iceberg_hash_fn fn, void *ud, br_iceberg_stats *stats,
                          br_err *err) {
  br_iceberg_open_fn open = cfg->open ? cfg->open : br_iceberg_open_local;
  br_source *src = open(cfg->open_ud, path, err);
  if (!src) return -1;
  int rc = -1, opened = 0;
  if (format == 0) { /* the manifest names another format: the file's magic decides */
    uint8_t magic[4] = {0};
    if (src->size >= 4 && src->pread(src, magic, 4, 0, err) != 0) goto done;
    format = !memcmp(magic, "PAR1", 4)  ? BR_ICEBERG_PARQUET
             : !memcmp(magic, "ORC", 3) ? BR_ICEBERG_ORC
                                        : 0;
    if (!format) {
      br_fail(err, "%s: live data file is neither Parquet nor ORC (only those are read)", path);
      goto done;
    }
  }
  value_ctx vc = {out, fn, ud, stats, cfg, path, 0};
  rc = format == BR_ICEBERG_ORC ? read_orc_hashes(cfg, path, src, &vc, &opened, err)
                                : read_parquet_hashes(cfg, path, src, &vc, &opened, err);
  if (rc == 2) {
    br_fail(err, "%s: column '%s' holds a value that is not a hash: %s", path, cfg->column,
            stats->first_invalid);
    rc = -1;
  } else if (rc == 3 || vc.oom) {
    if (out) br_fail(err, "out of memory"); /* a callback failure left its own message */
    rc = -1;
  } else if (rc == -4 || (rc == -1 && !opened)) {
    char tmp[sizeof err->msg];
    snprintf(tmp, sizeof tmp, "%s", err ? err->msg : "");
    br_fail(err, "%s: %s", path, tmp);
    rc = -1;
  } else if (rc != 0) {
    rc = -1;
  }
done:
  br_source_close(src);
  return rc;
}

int br_iceberg_collect_refs(const br_iceberg_table_config *cfg, br_hashset *out,
                            br_iceberg_stats *stats, br_err *err) {
  walk w;
  br_iceberg_stats local;
  if (!stats) stats = &local;
  if (!cfg->column || !*cfg->column) return br_fail(err, "no hash column configured");
  int rc = run_walk(&w, cfg, NULL, NULL, stats, err);
  for (size_t i = 0; i < w.files.n && rc == 0; i++)
    rc = read_hashes_of(cfg, w.files.strs[i], w.parquet[i], out, NULL, NULL, stats, err);
  walk_free(&w);
  return rc == 0 ? 0 : -1;
}

int br_iceberg_walk_data_files(const br_iceberg_table_config *cfg, br_iceberg_data_file_fn fn,
                               void *ud, br_iceberg_stats *stats, br_err *err) {
  walk w;
  br_iceberg_stats local;
  if (!stats) stats = &local;
  int rc = run_walk(&w, cfg, NULL, NULL, stats, err);
  for (size_t i = 0; i < w.files.n && rc == 0; i++) {
    br_iceberg_data_file f = {w.files.strs[i], w.parquet[i], w.fsize[i], w.fcount[i]};
    rc = fn(ud, &f);
  }
  walk_free(&w);
  return rc;
}

int br_iceberg_read_file_hashes(const br_iceberg_table_config *cfg, const br_iceberg_data_file *f,
                                br_iceberg_hash_fn fn, void *ud, br_iceberg_stats *stats,
                                br_err *err) {
  br_iceberg_stats local;
  if (!stats) {
    memset(&local, 0, sizeof local);
    stats = &local;
  }
  if (!cfg->column || !*cfg->column) return br_fail(err, "no hash column configured");
  return read_hashes_of(cfg, f->path, f->parquet, NULL, fn, ud, stats, err) == 0 ? 0 : -1;
}
