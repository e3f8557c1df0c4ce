/* The Delta log replay: lists `_delta_log/`, picks the retained versions (oldest usable checkpoint
 * or commit 0, up to the latest), replays commits and checkpoints into the set of referenced files,
 * and fails closed on a log it cannot read completely. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "blobref/parquet.h"
#include "delta/internal.h"
#include "iceberg/internal.h"

/* --- the local lister ---------------------------------------------------------------------- */

static void free_names(char **names, size_t n) {
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
}

int br_delta_list_local(void *ud, const char *log_dir, char ***names_out, size_t *n_out,
                        br_err *err) {
  (void)ud;
  char **names = NULL;
  size_t n = 0, cap = 0;
  DIR *d = opendir(log_dir);
  if (!d) return br_fail(err, "%s: %s", log_dir, strerror(errno));
  struct dirent *de;
  errno = 0;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.') continue;
    if (n == DL_MAX_LOG_FILES) {
      closedir(d);
      free_names(names, n);
      return br_fail(err, "%s: more than %d files", log_dir, DL_MAX_LOG_FILES);
    }
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 64;
      char **nn = realloc(names, ncap * sizeof *nn);
      if (!nn) break;
      names = nn;
      cap = ncap;
    }
    if (!(names[n] = strdup(de->d_name))) break;
    n++;
    errno = 0;
  }
  int bad = de != NULL || errno != 0;
  closedir(d);
  if (bad) {
    free_names(names, n);
    return br_fail(err, "%s: listing failed", log_dir);
  }
  *names_out = names;
  *n_out = n;
  return 0;
}

int br_delta_is_local_table(const char *location) {
  char p[PATH_MAX];
  const char *loc = location;
  if (!strncmp(loc, "file://", 7)) loc += 7;
  if (loc[0] != '/' && strstr(loc, "://")) return 0;
  if ((size_t)snprintf(p, sizeof p, "%s/_delta_log", loc) >= sizeof p) return 0;
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* --- the file table: mapped path -> index -------------------------------------------------- */

typedef struct dfile {
  char *path;
  int64_t size;
  uint8_t alive, cdc, referenced;
  size_t mark; /* version index + 1 that last emitted it (files mode) */
} dfile;

typedef struct ftab {
  dfile *v;
  size_t n, cap;
  size_t *slots; /* index + 1 */
  size_t nslots;
} ftab;

static uint64_t fnv(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static void ftab_free(ftab *t) {
  for (size_t i = 0; i < t->n; i++) free(t->v[i].path);
  free(t->v);
  free(t->slots);
  memset(t, 0, sizeof *t);
}

static long ftab_put(ftab *t, const char *path) {
  if ((t->n + 1) * 2 > t->nslots) {
    size_t ns = t->nslots ? t->nslots * 2 : 1024;
    size_t *slots = calloc(ns, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < t->n; i++) {
      size_t j = fnv(t->v[i].path) & (ns - 1);
      while (slots[j]) j = (j + 1) & (ns - 1);
      slots[j] = i + 1;
    }
    free(t->slots);
    t->slots = slots;
    t->nslots = ns;
  }
  size_t j = fnv(path) & (t->nslots - 1);
  while (t->slots[j]) {
    if (!strcmp(t->v[t->slots[j] - 1].path, path)) return (long)(t->slots[j] - 1);
    j = (j + 1) & (t->nslots - 1);
  }
  if (t->n == t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 256;
    dfile *nv = realloc(t->v, nc * sizeof *nv);
    if (!nv) return -1;
    t->v = nv;
    t->cap = nc;
  }
  dfile *f = &t->v[t->n];
  memset(f, 0, sizeof *f);
  f->size = -1;
  if (!(f->path = strdup(path))) return -1;
  t->slots[j] = ++t->n;
  return (long)(t->n - 1);
}

/* --- the log listing ----------------------------------------------------------------------- */

typedef struct logent {
  dl_name nm;
  char *name;
} logent;

static int cmp_logent(const void *a, const void *b) {
  const logent *x = a, *y = b;
  if (x->nm.version != y->nm.version) return x->nm.version < y->nm.version ? -1 : 1;
  if (x->nm.kind != y->nm.kind) return x->nm.kind < y->nm.kind ? -1 : 1;
  if (x->nm.nparts != y->nm.nparts) return x->nm.nparts < y->nm.nparts ? -1 : 1;
  if (x->nm.part != y->nm.part) return x->nm.part < y->nm.part ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* A checkpoint usable at one version: one file, or all parts of a multi-part one. */
typedef struct ckpt {
  int64_t version;
  enum dl_name_kind kind;
  size_t first, count; /* range in the sorted log entries */
} ckpt;

/* --- the replay ---------------------------------------------------------------------------- */

typedef struct replay {
  const br_iceberg_table_config *cfg;
  br_iceberg_stats *stats;
  ice_pathmap pm;
  char root[DL_MAX_PATH + 1];   /* table folder or URL, no trailing slash */
  char logdir[DL_MAX_PATH + 1]; /* root + "/_delta_log" */
  logent *ents;
  size_t nents;
  ftab files;
  /* per commit being applied */
  size_t *adds, nadds, adds_cap;
  size_t *removes, nremoves, removes_cap;
  size_t *cdcs, ncdcs, cdcs_cap;
  int state_only;       /* reading a commit only for its cdc files and protocol */
  char *schema;         /* latest metaData.schemaString (malloc'd) */
  char incomplete[160]; /* the newest multi-part checkpoint missing parts, for messages */
  br_iceberg_file_fn fn;
  void *ud;
  int64_t commit_ts;              /* the commit being read: its commitInfo time, -1 if none */
  br_iceberg_snapshot_fn snap_fn; /* per retained version, with commit_ts (or NULL) */
  void *snap_ud;
} replay;

static int push(size_t **v, size_t *n, size_t *cap, size_t x) {
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 64;
    size_t *nv = realloc(*v, nc * sizeof *nv);
    if (!nv) return -1;
    *v = nv;
    *cap = nc;
  }
  (*v)[(*n)++] = x;
  return 0;
}

/* Maps a recorded path (percent-encoded URI or relative path) to an openable one. */
static int map_path(replay *r, const char *raw, size_t len, const char *base, char *out,
                    size_t outlen, br_err *err) {
  char dec[DL_MAX_PATH + 1];
  if (dl_percent_decode(raw, len, dec, sizeof dec) < 0)
    return br_fail(err, "path '%.200s' is not a valid percent-encoded URI", raw);
  ice_pathmap pm = r->pm;
  pm.table_dir = base;
  return ice_map_path(&pm, dec, out, outlen, err);
}

static long file_index(replay *r, const char *raw, size_t len, br_err *err) {
  char mapped[DL_MAX_PATH + 1];
  if (map_path(r, raw, len, r->root, mapped, sizeof mapped, err) != 0) return -1;
  long fi = ftab_put(&r->files, mapped);
  if (fi < 0) br_fail(err, "out of memory");
  return fi;
}

static int set_schema(replay *r, const char *schema, br_err *err) {
  free(r->schema);
  r->schema = schema ? strdup(schema) : NULL;
  return schema && !r->schema ? br_fail(err, "out of memory") : 0;
}

/* A commit's actions: collected, applied when the commit has been read completely. */
static int on_commit_action(void *ud, const dl_action *a, br_err *err) {
  replay *r = ud;
  long fi;
  switch (a->kind) {
    case DL_ADD:
      if (a->has_dv) r->stats->delete_files++;
      if (r->state_only) return 0;
      if ((fi = file_index(r, a->path, a->path_len, err)) < 0) return -1;
      if (a->size >= 0) r->files.v[fi].size = a->size;
      return push(&r->adds, &r->nadds, &r->adds_cap, (size_t)fi) ? br_fail(err, "out of memory")
                                                                 : 0;
    case DL_REMOVE:
      if (r->state_only) return 0;
      if ((fi = file_index(r, a->path, a->path_len, err)) < 0) return -1;
      return push(&r->removes, &r->nremoves, &r->removes_cap, (size_t)fi)
                 ? br_fail(err, "out of memory")
                 : 0;
    case DL_CDC:
      if ((fi = file_index(r, a->path, a->path_len, err)) < 0) return -1;
      if (a->size >= 0) r->files.v[fi].size = a->size;
      return push(&r->cdcs, &r->ncdcs, &r->cdcs_cap, (size_t)fi) ? br_fail(err, "out of memory")
                                                                 : 0;
    case DL_METADATA:
      return set_schema(r, a->schema, err);
    case DL_SIDECAR:
      return br_fail(err, "sidecar action in a commit");
    case DL_COMMITINFO:
      r->commit_ts = a->timestamp;
      return 0;
    case DL_PROTOCOL:
      return 0; /* checked by the parser */
  }
  return 0;
}

static int read_all(replay *r, const char *path, uint8_t **data, size_t *len, br_err *err) {
  br_iceberg_open_fn open = r->cfg->open ? r->cfg->open : br_iceberg_open_local;
  br_source *src = open(r->cfg->open_ud, path, err);
  if (!src) return -1;
  int rc = br_source_read_all(src, DL_MAX_COMMIT, data, len, err);
  br_source_close(src);
  return rc;
}

/* Prefixes err with the file it is about. */
static int fail_in(br_err *err, const char *what) {
  char why[sizeof err->msg];
  snprintf(why, sizeof why, "%s", err ? err->msg : "");
  return br_fail(err, "%s: %s", what, why);
}

static int read_commit(replay *r, const logent *e, int state_only, br_err *err) {
  char path[DL_MAX_PATH + 1];
  if ((size_t)snprintf(path, sizeof path, "%s/%s", r->logdir, e->name) >= sizeof path)
    return br_fail(err, "path too long");
  uint8_t *data = NULL;
  size_t len = 0;
  if (read_all(r, path, &data, &len, err) != 0) return fail_in(err, path);
  r->nadds = r->nremoves = r->ncdcs = 0;
  r->state_only = state_only;
  int rc = dl_parse_commit(data, len, on_commit_action, r, err);
  free(data);
  if (rc != 0) return fail_in(err, path);
  r->stats->manifests++;
  /* A remove and an add of the same path in one commit (a new deletion vector) leave it live. */
  for (size_t i = 0; i < r->nremoves; i++) r->files.v[r->removes[i]].alive = 0;
  for (size_t i = 0; i < r->nadds; i++) r->files.v[r->adds[i]].alive = 1;
  for (size_t i = 0; i < r->ncdcs; i++) r->files.v[r->cdcs[i]].cdc = 1;
  return 0;
}

/* --- checkpoints --------------------------------------------------------------------------- */

typedef struct pq_strings {
  char **v;
  size_t n, cap;
  int oom;
} pq_strings;

typedef struct pq_rows {
  pq_strings vals; /* per row: strdup'd value or NULL */
} pq_rows;

static int on_pq_string(void *ud, const uint8_t *data, size_t len, int is_null) {
  pq_strings *s = ud;
  if (s->n == s->cap) {
    size_t nc = s->cap ? s->cap * 2 : 256;
    char **nv = realloc(s->v, nc * sizeof *nv);
    if (!nv) return s->oom = 1, 3;
    s->v = nv;
    s->cap = nc;
  }
  char *v = NULL;
  if (!is_null) {
    if (len > DL_MAX_COMMIT) return s->oom = 1, 3;
    /* zero padding: fixed-width readers (INT32, INT64) below never read past the buffer */
    if (!(v = calloc(1, len + 9))) return s->oom = 1, 3;
    memcpy(v, data, len);
  }
  s->v[s->n++] = v;
  return 0;
}

static void pq_strings_free(pq_strings *s) {
  for (size_t i = 0; i < s->n; i++) free(s->v[i]);
  free(s->v);
  memset(s, 0, sizeof *s);
}

/* Reads every value of a leaf (NULL-able) as strings; a missing column gives no rows. */
static int pq_read(br_parquet_file *pf, const char *col, int prefix, pq_strings *out, br_err *err) {
  int ci = -1;
  if (prefix) {
    size_t k = strlen(col);
    for (size_t i = 0; i < br_parquet_num_columns(pf) && ci < 0; i++) {
      br_parquet_column_info info;
      if (br_parquet_column(pf, i, &info) == 0 && !strncmp(info.path, col, k)) ci = (int)i;
    }
  } else {
    ci = br_parquet_find_column(pf, col);
  }
  if (ci < 0) return 0;
  int rc = br_parquet_read_column_at(pf, (size_t)ci, on_pq_string, out, err);
  if (rc == 3 || out->oom) return br_fail(err, "out of memory or value too long in %s", col);
  if (rc != 0) return fail_in(err, col);
  return 0;
}

static int read_checkpoint_file(replay *r, const char *path, int sidecar, br_err *err);

/* One Parquet checkpoint (or sidecar) file: its adds become live, its protocol is checked, its
 * sidecars (v2) are read. */
static int read_checkpoint_parquet(replay *r, const char *path, int sidecar, br_err *err) {
  br_iceberg_open_fn open = r->cfg->open ? r->cfg->open : br_iceberg_open_local;
  br_source *src = open(r->cfg->open_ud, path, err);
  if (!src) return -1;
  int rc = -1;
  pq_strings paths = {0}, sizes = {0}, minr = {0}, feats = {0}, side = {0}, schema = {0};
  br_parquet_file *pf = br_parquet_open(src, err);
  if (!pf) goto done;
  if (pq_read(pf, "add.path", 0, &paths, err) || pq_read(pf, "add.size", 0, &sizes, err) ||
      pq_read(pf, "protocol.minReaderVersion", 0, &minr, err) ||
      pq_read(pf, "protocol.readerFeatures.", 1, &feats, err) ||
      pq_read(pf, "sidecar.path", 0, &side, err) ||
      pq_read(pf, "metaData.schemaString", 0, &schema, err))
    goto done;
  for (size_t i = 0; i < minr.n; i++) {
    if (!minr.v[i]) continue;
    int32_t v;
    memcpy(&v, minr.v[i], sizeof v); /* INT32, little-endian */
    if (dl_check_protocol(v, NULL, 0, err) != 0) goto done;
  }
  for (size_t i = 0; i < feats.n; i++)
    if (feats.v[i] && dl_check_protocol(3, (const char *const *)&feats.v[i], 1, err) != 0)
      goto done;
  for (size_t i = 0; i < schema.n; i++)
    if (schema.v[i] && set_schema(r, schema.v[i], err) != 0) goto done;
  for (size_t i = 0; i < paths.n; i++) {
    if (!paths.v[i]) continue;
    long fi = file_index(r, paths.v[i], strlen(paths.v[i]), err);
    if (fi < 0) goto done;
    r->files.v[fi].alive = 1;
    if (i < sizes.n && sizes.v[i]) memcpy(&r->files.v[fi].size, sizes.v[i], 8);
  }
  for (size_t i = 0; sidecar && i < side.n; i++)
    if (side.v[i]) {
      br_fail(err, "a sidecar names sidecars");
      goto done;
    }
  br_parquet_close(pf);
  pf = NULL;
  br_source_close(src);
  src = NULL;
  r->stats->manifests++;
  for (size_t i = 0; i < side.n; i++) {
    if (!side.v[i]) continue;
    if (read_checkpoint_file(r, side.v[i], 1, err) != 0) goto done;
  }
  rc = 0;
done:
  if (rc != 0 && err && !strstr(err->msg, path)) fail_in(err, path);
  if (pf) br_parquet_close(pf);
  br_source_close(src);
  pq_strings_free(&paths);
  pq_strings_free(&sizes);
  pq_strings_free(&minr);
  pq_strings_free(&feats);
  pq_strings_free(&side);
  pq_strings_free(&schema);
  return rc;
}

/* A JSON checkpoint (v2): like a commit, but its adds are the state and sidecars are read. */
typedef struct json_ckpt {
  replay *r;
  pq_strings sidecars;
} json_ckpt;

static int on_json_ckpt_action(void *ud, const dl_action *a, br_err *err) {
  json_ckpt *jc = ud;
  if (a->kind == DL_SIDECAR) {
    char *copy = strndup(a->path, a->path_len);
    if (!copy) return br_fail(err, "out of memory");
    int rc = on_pq_string(&jc->sidecars, (const uint8_t *)copy, a->path_len, 0);
    free(copy);
    return rc ? br_fail(err, "out of memory") : 0;
  }
  if (a->kind == DL_ADD) {
    long fi = file_index(jc->r, a->path, a->path_len, err);
    if (fi < 0) return -1;
    jc->r->files.v[fi].alive = 1;
    if (a->size >= 0) jc->r->files.v[fi].size = a->size;
    return 0;
  }
  if (a->kind == DL_METADATA) return set_schema(jc->r, a->schema, err);
  return 0; /* removes are tombstones; protocol checked by the parser */
}

/* path: a `_delta_log/` file (sidecar = 0) or a sidecar's recorded path (sidecar = 1, relative
 * to `_delta_log/_sidecars/`). */
static int read_checkpoint_file(replay *r, const char *path, int sidecar, br_err *err) {
  char full[DL_MAX_PATH + 1];
  if (sidecar) {
    char base[DL_MAX_PATH + 1];
    if ((size_t)snprintf(base, sizeof base, "%s/_sidecars", r->logdir) >= sizeof base)
      return br_fail(err, "path too long");
    if (map_path(r, path, strlen(path), base, full, sizeof full, err) != 0) return -1;
  } else if ((size_t)snprintf(full, sizeof full, "%s/%s", r->logdir, path) >= sizeof full) {
    return br_fail(err, "path too long");
  }
  size_t n = strlen(full);
  if (n >= 5 && !strcmp(full + n - 5, ".json")) {
    if (sidecar) return br_fail(err, "%s: a sidecar must be Parquet", full);
    uint8_t *data = NULL;
    size_t len = 0;
    if (read_all(r, full, &data, &len, err) != 0) return fail_in(err, full);
    json_ckpt jc = {r, {0}};
    int rc = dl_parse_commit(data, len, on_json_ckpt_action, &jc, err);
    free(data);
    if (rc != 0) {
      pq_strings_free(&jc.sidecars);
      return fail_in(err, full);
    }
    r->stats->manifests++;
    for (size_t i = 0; i < jc.sidecars.n && rc == 0; i++)
      rc = read_checkpoint_file(r, jc.sidecars.v[i], 1, err);
    pq_strings_free(&jc.sidecars);
    return rc;
  }
  return read_checkpoint_parquet(r, full, sidecar, err);
}

/* Replaces the live state with the checkpoint's. */
static int load_checkpoint(replay *r, const ckpt *c, br_err *err) {
  for (size_t i = 0; i < r->files.n; i++) r->files.v[i].alive = 0;
  for (size_t i = 0; i < c->count; i++)
    if (read_checkpoint_file(r, r->ents[c->first + i].name, 0, err) != 0) return -1;
  return 0;
}

/* --- choosing the retained versions -------------------------------------------------------- */

/* Finds the checkpoints usable at each version; ckpts is sorted by version, one per version (the
 * preferred kind: v2, then classic, then a complete multi-part set). */
static int find_checkpoints(replay *r, ckpt **out, size_t *nout, br_err *err) {
  ckpt *v = NULL;
  size_t n = 0;
  for (size_t i = 0; i < r->nents;) {
    const dl_name *nm = &r->ents[i].nm;
    if (nm->kind == DL_NAME_COMMIT || nm->kind == DL_NAME_OTHER) {
      i++;
      continue;
    }
    ckpt c = {nm->version, nm->kind, i, 1};
    if (nm->kind == DL_NAME_MULTIPART) {
      /* the entries of this (version, nparts) set, sorted by part */
      size_t j = i;
      uint32_t want = 1;
      int complete = 1;
      while (j < r->nents && r->ents[j].nm.kind == DL_NAME_MULTIPART &&
             r->ents[j].nm.version == nm->version && r->ents[j].nm.nparts == nm->nparts) {
        if (r->ents[j].nm.part != want) complete = 0; /* a gap or a duplicate part */
        want++;
        j++;
      }
      if (want - 1 != nm->nparts) complete = 0;
      c.count = j - i;
      i = j;
      if (!complete) {
        snprintf(r->incomplete, sizeof r->incomplete,
                 " (the multi-part checkpoint at version %lld has %zu of its %u parts)",
                 (long long)c.version, c.count, (unsigned)nm->nparts);
        continue;
      }
    } else {
      i++;
    }
    int better = n == 0 || v[n - 1].version != c.version;
    if (!better) {
      /* prefer v2 (it names sidecars), then classic, then multi-part */
      int rank_new = c.kind == DL_NAME_MULTIPART ? 0 : c.kind == DL_NAME_CHECKPOINT ? 1 : 2;
      ckpt *o = &v[n - 1];
      int rank_old = o->kind == DL_NAME_MULTIPART ? 0 : o->kind == DL_NAME_CHECKPOINT ? 1 : 2;
      if (rank_new > rank_old) *o = c;
      continue;
    }
    ckpt *nv = realloc(v, (n + 1) * sizeof *nv);
    if (!nv) {
      free(v);
      return br_fail(err, "out of memory");
    }
    v = nv;
    v[n++] = c;
  }
  *out = v;
  *nout = n;
  return 0;
}

static const logent *commit_at(const replay *r, int64_t version) {
  size_t lo = 0, hi = r->nents;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const dl_name *m = &r->ents[mid].nm;
    if (m->version < version || (m->version == version && m->kind < DL_NAME_COMMIT))
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < r->nents && r->ents[lo].nm.version == version && r->ents[lo].nm.kind == DL_NAME_COMMIT)
    return &r->ents[lo];
  return NULL;
}

static const ckpt *ckpt_at(const ckpt *c, size_t n, int64_t version) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c[mid].version < version)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && c[lo].version == version ? &c[lo] : NULL;
}

/* Marks what version `version` references (every live file, the commit's cdc files) and, in
 * files mode, reports each once. all: the live set was just replaced (a checkpoint); otherwise
 * only this commit's adds can be newly referenced. */
static int emit_version(replay *r, int64_t version, size_t vi, int all) {
  for (size_t k = 0; k < r->ncdcs; k++) r->files.v[r->cdcs[k]].referenced = 1;
  if (!r->fn) {
    if (all) {
      for (size_t i = 0; i < r->files.n; i++)
        if (r->files.v[i].alive) r->files.v[i].referenced = 1;
    }
    for (size_t k = 0; k < r->nadds; k++) r->files.v[r->adds[k]].referenced = 1;
    return 0;
  }
  for (size_t i = 0; i < r->files.n; i++) {
    dfile *f = &r->files.v[i];
    if (!f->alive || f->mark == vi + 1) continue;
    f->referenced = 1;
    f->mark = vi + 1;
    int rc = r->fn(r->ud, version, f->path);
    if (rc != 0) return rc;
  }
  for (size_t k = 0; k < r->ncdcs; k++) {
    dfile *f = &r->files.v[r->cdcs[k]];
    if (f->mark == vi + 1) continue;
    f->mark = vi + 1;
    int rc = r->fn(r->ud, version, f->path);
    if (rc != 0) return rc;
  }
  return 0;
}

static void replay_free(replay *r) {
  for (size_t i = 0; i < r->nents; i++) free(r->ents[i].name);
  free(r->ents);
  ftab_free(&r->files);
  free(r->adds);
  free(r->removes);
  free(r->cdcs);
  free(r->schema);
}

/* Sets root/logdir from cfg->location. */
static int table_root(replay *r, br_err *err) {
  const char *loc = r->cfg->location;
  if (!loc || !*loc) return br_fail(err, "no table location");
  if (!strncmp(loc, "file://", 7)) loc += 7;
  if (loc[0] == '/' || !strstr(loc, "://")) {
    char *real = realpath(loc, NULL);
    if (!real) return br_fail(err, "%s: %s", loc, strerror(errno));
    int ok = (size_t)snprintf(r->root, sizeof r->root, "%s", real) < sizeof r->root;
    free(real);
    if (!ok) return br_fail(err, "%s: path too long", loc);
  } else {
    if ((size_t)snprintf(r->root, sizeof r->root, "%s", loc) >= sizeof r->root)
      return br_fail(err, "%s: location too long", loc);
  }
  size_t n = strlen(r->root);
  while (n > 1 && r->root[n - 1] == '/') r->root[--n] = 0;
  if ((size_t)snprintf(r->logdir, sizeof r->logdir, "%s/_delta_log", r->root) >= sizeof r->logdir)
    return br_fail(err, "%s: path too long", r->root);
  return 0;
}

/* The whole replay: on success every referenced file has referenced = 1. */
static int run_replay(replay *r, const br_iceberg_table_config *cfg, br_delta_list_fn lister,
                      void *list_ud, br_iceberg_file_fn fn, void *ud,
                      br_iceberg_snapshot_fn snap_fn, void *snap_ud, br_iceberg_stats *stats,
                      br_err *err) {
  memset(r, 0, sizeof *r);
  memset(stats, 0, sizeof *stats);
  r->cfg = cfg;
  r->stats = stats;
  r->fn = fn;
  r->ud = ud;
  r->snap_fn = snap_fn;
  r->snap_ud = snap_ud;
  r->pm.rewrites = cfg->rewrites;
  r->pm.nrewrites = cfg->nrewrites;
  if (table_root(r, err) != 0) return -1;
  char **names = NULL;
  size_t n = 0;
  if ((lister ? lister : br_delta_list_local)(list_ud, r->logdir, &names, &n, err) != 0) return -1;
  r->ents = calloc(n ? n : 1, sizeof *r->ents);
  if (!r->ents) {
    free_names(names, n);
    return br_fail(err, "out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    dl_name nm;
    dl_parse_name(names[i], &nm);
    if (nm.kind == DL_NAME_OTHER) {
      free(names[i]);
      continue;
    }
    r->ents[r->nents].nm = nm;
    r->ents[r->nents++].name = names[i];
  }
  free(names);
  qsort(r->ents, r->nents, sizeof *r->ents, cmp_logent);
  for (size_t i = 1; i < r->nents; i++)
    if (r->ents[i].nm.kind == DL_NAME_COMMIT && r->ents[i - 1].nm.kind == DL_NAME_COMMIT &&
        r->ents[i].nm.version == r->ents[i - 1].nm.version)
      return br_fail(err, "%s: two commit files for version %lld (%s, %s)", r->logdir,
                     (long long)r->ents[i].nm.version, r->ents[i - 1].name, r->ents[i].name);

  ckpt *cks = NULL;
  size_t ncks = 0;
  if (find_checkpoints(r, &cks, &ncks, err) != 0) return -1;
  int64_t latest = -1;
  for (size_t i = 0; i < r->nents; i++)
    if (r->ents[i].nm.kind == DL_NAME_COMMIT && r->ents[i].nm.version > latest)
      latest = r->ents[i].nm.version;
  if (ncks && cks[ncks - 1].version > latest) latest = cks[ncks - 1].version;
  int rc = 0;
  int64_t first;
  if (latest < 0) {
    rc = br_fail(err, "%s: no commit and no usable checkpoint%s", r->logdir, r->incomplete);
    goto out;
  }
  if (commit_at(r, 0))
    first = 0;
  else if (ncks)
    first = cks[0].version;
  else {
    rc = br_fail(err, "%s: no commit 0 and no usable checkpoint: no version can be reconstructed%s",
                 r->logdir, r->incomplete);
    goto out;
  }
  /* Every version from first to latest needs its commit or a checkpoint. */
  for (int64_t v = first + 1; v <= latest; v++)
    if (!commit_at(r, v) && !ckpt_at(cks, ncks, v)) {
      rc = br_fail(err,
                   "%s: commit %020lld.json is missing (versions %lld to %lld are in the log): "
                   "version %lld cannot be reconstructed%s",
                   r->logdir, (long long)v, (long long)first, (long long)latest, (long long)v,
                   r->incomplete);
      goto out;
    }
  for (int64_t v = first; v <= latest && rc == 0; v++) {
    const logent *c = commit_at(r, v);
    const ckpt *k = ckpt_at(cks, ncks, v);
    int from_ckpt = (v == first && first > 0) || !c;
    if (from_ckpt) {
      /* (v == first > 0 always has a checkpoint: first is then the oldest checkpoint) */
      if ((rc = load_checkpoint(r, k, err)) != 0) break;
    }
    r->nadds = r->nremoves = r->ncdcs = 0;
    r->commit_ts = -1;
    if (c && (rc = read_commit(r, c, from_ckpt, err)) != 0) break;
    stats->snapshots++;
    rc = emit_version(r, v, (size_t)(v - first), from_ckpt);
    if (rc == 0 && r->snap_fn) rc = r->snap_fn(r->snap_ud, v, r->commit_ts);
  }
out:
  free(cks);
  if (rc == 0) {
    size_t nref = 0;
    for (size_t i = 0; i < r->files.n; i++) nref += r->files.v[i].referenced;
    stats->data_files = nref;
  }
  return rc;
}

int br_delta_list_files(const br_iceberg_table_config *cfg, br_delta_list_fn lister, void *list_ud,
                        br_iceberg_file_fn fn, void *ud, br_iceberg_stats *stats, br_err *err) {
  replay r;
  br_iceberg_stats local;
  int rc = run_replay(&r, cfg, lister, list_ud, fn, ud, NULL, NULL, stats ? stats : &local, err);
  replay_free(&r);
  return rc;
}

int br_delta_list_versions(const br_iceberg_table_config *cfg, br_delta_list_fn lister,
                           void *list_ud, br_iceberg_snapshot_fn fn, void *ud, br_err *err) {
  replay r;
  br_iceberg_stats local;
  int rc = run_replay(&r, cfg, lister, list_ud, NULL, NULL, fn, ud, &local, err);
  replay_free(&r);
  return rc;
}

int br_delta_walk_data_files(const br_iceberg_table_config *cfg, br_delta_list_fn lister,
                             void *list_ud, br_iceberg_data_file_fn fn, void *ud,
                             br_iceberg_stats *stats, br_err *err) {
  return br_delta_walk_data_files_mapped(cfg, lister, list_ud, fn, ud, NULL, stats, err);
}

int br_delta_walk_data_files_mapped(const br_iceberg_table_config *cfg, br_delta_list_fn lister,
                                    void *list_ud, br_iceberg_data_file_fn fn, void *ud,
                                    char column[BR_DELTA_MAX_COLUMN], br_iceberg_stats *stats,
                                    br_err *err) {
  replay r;
  br_iceberg_stats local;
  int rc =
      run_replay(&r, cfg, lister, list_ud, NULL, NULL, NULL, NULL, stats ? stats : &local, err);
  if (rc == 0 && column &&
      dl_physical_column(r.schema, cfg->column ? cfg->column : "", column, BR_DELTA_MAX_COLUMN))
    rc = br_fail(err, "column '%.200s': physical name too long", cfg->column);
  for (size_t i = 0; i < r.files.n && rc == 0; i++) {
    if (!r.files.v[i].referenced) continue;
    br_iceberg_data_file f = {r.files.v[i].path, 1, r.files.v[i].size, -1};
    rc = fn(ud, &f);
  }
  replay_free(&r);
  return rc;
}

typedef struct collect_ctx {
  const br_iceberg_table_config *cfg;
  br_hashset *out;
  br_iceberg_stats *stats;
  br_err *err;
} collect_ctx;

static int add_hash(void *ud, const uint8_t d[BR_SHA256_LEN]) { return br_hashset_add(ud, d) < 0; }

static int collect_one(void *ud, const br_iceberg_data_file *f) {
  collect_ctx *c = ud;
  if (br_iceberg_read_file_hashes(c->cfg, f, add_hash, c->out, c->stats, c->err) != 0) {
    if (!strstr(c->err->msg, f->path)) fail_in(c->err, f->path);
    return -1;
  }
  return 0;
}

int br_delta_collect_refs(const br_iceberg_table_config *cfg, br_delta_list_fn lister,
                          void *list_ud, br_hashset *out, br_iceberg_stats *stats, br_err *err) {
  br_iceberg_stats local, fstats;
  if (!stats) stats = &local;
  if (!cfg->column || !*cfg->column) return br_fail(err, "no hash column configured");
  memset(&fstats, 0, sizeof fstats);
  char column[BR_DELTA_MAX_COLUMN];
  br_iceberg_table_config read_cfg = *cfg; /* the hash column under its physical name */
  read_cfg.column = column;
  collect_ctx c = {&read_cfg, out, &fstats, err};
  int rc =
      br_delta_walk_data_files_mapped(cfg, lister, list_ud, collect_one, &c, column, stats, err);
  stats->values = fstats.values;
  stats->nulls = fstats.nulls;
  stats->invalid = fstats.invalid;
  memcpy(stats->first_invalid, fstats.first_invalid, sizeof stats->first_invalid);
  return rc == 0 ? 0 : -1;
}
