/* The memory-bounded half of mark: digests are collected in a fixed buffer; each full buffer is
 * sorted, deduplicated and spilled as a run file; the runs are then merged (a small heap over
 * buffered readers) into one ascending stream without duplicates. Memory is the buffer plus
 * 64 KiB per run, whatever the number of references, plus a scratch buffer as large as the
 * first while sorting. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reconcile/internal.h"

#define D BR_SHA256_LEN
#define READ_BUF 2048   /* digests per run reader: 64 KiB */
#define NBUCKETS 65536  /* the counting sort's buckets: a digest's first two bytes */
#define SMALL_BUCKET 32 /* buckets up to this many digests are insertion-sorted */

struct run {
  FILE *f;
  uint8_t *buf;
  size_t n, pos;
  uint8_t cur[D];
};

struct dsort {
  char dir[4096];
  uint8_t *mem;
  size_t cap, n;
  uint8_t *tmp;    /* sort_unique's scratch, cap digests (glibc's qsort took as much) */
  size_t *buckets; /* sort_unique's NBUCKETS + 1 offsets */
  uint64_t added;
  struct run *runs;
  size_t nruns, runs_cap;
  size_t *heap; /* run indices ordered by their current digest */
  size_t nheap;
  int in_memory; /* one buffer only: merged straight from memory */
  size_t mem_pos;
  uint8_t last[D];
  int have_last;
};

static int cmp_digest(const void *a, const void *b) { return memcmp(a, b, D); }

/* Sorts the n digests of b (n > 1) in place: insertion sort for a few, qsort past that. */
static void sort_bucket(uint8_t *b, size_t n) {
  if (n > SMALL_BUCKET) {
    qsort(b, n, D, cmp_digest);
    return;
  }
  for (size_t i = 1; i < n; i++) {
    uint8_t x[D];
    memcpy(x, b + i * D, D);
    size_t j = i;
    while (j > 0 && memcmp(b + (j - 1) * D, x, D) > 0) {
      memcpy(b + j * D, b + (j - 1) * D, D);
      j--;
    }
    if (j != i) memcpy(b + j * D, x, D);
  }
}

/* Sorts mem[0..n) into tmp and writes it back to mem without duplicates; returns the new count.
 * Digests are spread evenly over the key space, so a counting sort on their first two bytes
 * leaves buckets of a few digests each (16 for 1M), each finished by sort_bucket: about 4x less
 * CPU than qsort over the whole buffer (issue 25: the sort was a third of a rerun's CPU at 10M
 * references). Any input is sorted right; a skewed one only makes its buckets qsort's. */
static size_t sort_unique(dsort *s, uint8_t *mem, size_t n) {
  if (n < 2) return n;
  uint8_t *tmp = s->tmp;
  size_t *at = s->buckets;
  memset(at, 0, (NBUCKETS + 1) * sizeof *at);
  for (size_t i = 0; i < n; i++) at[(mem[i * D] << 8 | mem[i * D + 1]) + 1]++;
  for (size_t k = 1; k <= NBUCKETS; k++) at[k] += at[k - 1]; /* at[k]: bucket k's start */
  for (size_t i = 0; i < n; i++) {
    size_t k = (size_t)(mem[i * D] << 8 | mem[i * D + 1]);
    memcpy(tmp + at[k]++ * D, mem + i * D, D); /* at[k] ends as bucket k + 1's start */
  }
  size_t start = 0, w = 0;
  for (size_t k = 0; k < NBUCKETS; k++) {
    size_t end = at[k];
    if (end - start > 1) sort_bucket(tmp + start * D, end - start);
    for (size_t i = start; i < end; i++)
      if (!w || memcmp(mem + (w - 1) * D, tmp + i * D, D) != 0)
        memcpy(mem + w++ * D, tmp + i * D, D);
    start = end;
  }
  return w;
}

dsort *dsort_new(const char *dir, size_t mem_digests, br_err *err) {
  dsort *s = calloc(1, sizeof *s);
  if (!s) {
    br_fail(err, "out of memory");
    return NULL;
  }
  snprintf(s->dir, sizeof s->dir, "%s", dir);
  s->cap = mem_digests < 1024 ? 1024 : mem_digests;
  s->mem = malloc(s->cap * D);
  s->tmp = malloc(s->cap * D);
  s->buckets = malloc((NBUCKETS + 1) * sizeof *s->buckets);
  if (!s->mem || !s->tmp || !s->buckets) {
    free(s->mem);
    free(s->tmp);
    free(s->buckets);
    free(s);
    br_fail(err, "out of memory for %zu digests", mem_digests);
    return NULL;
  }
  return s;
}

static int spill(dsort *s, br_err *err) {
  size_t n = sort_unique(s, s->mem, s->n);
  if (s->nruns == s->runs_cap) {
    size_t ncap = s->runs_cap ? s->runs_cap * 2 : 16;
    struct run *nr = realloc(s->runs, ncap * sizeof *nr);
    if (!nr) return br_fail(err, "out of memory");
    s->runs = nr;
    s->runs_cap = ncap;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/run-XXXXXX", s->dir);
  int fd = mkstemp(path);
  if (fd < 0) return br_fail(err, "reconcile: spill file in %s: %s", s->dir, strerror(errno));
  unlink(path); /* anonymous: gone with the descriptor, even after a crash */
  FILE *f = fdopen(fd, "w+");
  if (!f) {
    close(fd);
    return br_fail(err, "reconcile: spill file: %s", strerror(errno));
  }
  if (fwrite(s->mem, D, n, f) != n || fflush(f) != 0) {
    fclose(f);
    return br_fail(err, "reconcile: writing a spill file: %s", strerror(errno));
  }
  s->runs[s->nruns++] = (struct run){.f = f};
  s->n = 0;
  return 0;
}

int dsort_add(dsort *s, const uint8_t d[D], br_err *err) {
  if (s->n == s->cap && spill(s, err) < 0) return -1;
  memcpy(s->mem + s->n * D, d, D);
  s->n++;
  s->added++;
  return 0;
}

/* Loads the run's next digest into cur: 1, or 0 at its end, -1 on a read error. */
static int run_advance(struct run *r) {
  if (r->pos == r->n) {
    r->n = fread(r->buf, D, READ_BUF, r->f);
    r->pos = 0;
    if (r->n == 0) return ferror(r->f) ? -1 : 0;
  }
  memcpy(r->cur, r->buf + r->pos * D, D);
  r->pos++;
  return 1;
}

static int heap_less(dsort *s, size_t a, size_t b) {
  return memcmp(s->runs[s->heap[a]].cur, s->runs[s->heap[b]].cur, D) < 0;
}

static void heap_down(dsort *s, size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < s->nheap && heap_less(s, l, m)) m = l;
    if (r < s->nheap && heap_less(s, r, m)) m = r;
    if (m == i) return;
    size_t t = s->heap[i];
    s->heap[i] = s->heap[m];
    s->heap[m] = t;
    i = m;
  }
}

int dsort_finish(dsort *s, br_err *err) {
  if (s->nruns == 0) { /* everything fits: no files at all */
    s->n = sort_unique(s, s->mem, s->n);
    s->in_memory = 1;
    free(s->tmp); /* the stream is read from mem */
    s->tmp = NULL;
    return 0;
  }
  if (s->n && spill(s, err) < 0) return -1;
  free(s->mem); /* the merge needs only the readers */
  s->mem = NULL;
  free(s->tmp);
  s->tmp = NULL;
  s->heap = calloc(s->nruns, sizeof *s->heap);
  if (!s->heap) return br_fail(err, "out of memory");
  for (size_t i = 0; i < s->nruns; i++) {
    struct run *r = &s->runs[i];
    r->buf = malloc((size_t)READ_BUF * D);
    if (!r->buf) return br_fail(err, "out of memory");
    rewind(r->f);
    int rc = run_advance(r);
    if (rc < 0) return br_fail(err, "reconcile: reading a spill file: %s", strerror(errno));
    if (rc > 0) s->heap[s->nheap++] = i;
  }
  for (size_t i = s->nheap; i-- > 0;) heap_down(s, i);
  return 0;
}

int dsort_next(dsort *s, uint8_t out[D], br_err *err) {
  if (s->in_memory) {
    if (s->mem_pos == s->n) return 0;
    memcpy(out, s->mem + s->mem_pos * D, D);
    s->mem_pos++;
    return 1;
  }
  while (s->nheap) {
    struct run *r = &s->runs[s->heap[0]];
    uint8_t d[D];
    memcpy(d, r->cur, D);
    int rc = run_advance(r);
    if (rc < 0) return br_fail(err, "reconcile: reading a spill file: %s", strerror(errno));
    if (rc == 0) s->heap[0] = s->heap[--s->nheap];
    if (s->nheap) heap_down(s, 0);
    if (s->have_last && memcmp(d, s->last, D) == 0) continue; /* the same digest in two runs */
    memcpy(s->last, d, D);
    s->have_last = 1;
    memcpy(out, d, D);
    return 1;
  }
  return 0;
}

size_t dsort_runs(const dsort *s) { return s->nruns; }
uint64_t dsort_added(const dsort *s) { return s->added; }

void dsort_free(dsort *s) {
  if (!s) return;
  for (size_t i = 0; i < s->nruns; i++) {
    if (s->runs[i].f) fclose(s->runs[i].f);
    free(s->runs[i].buf);
  }
  free(s->runs);
  free(s->heap);
  free(s->mem);
  free(s->tmp);
  free(s->buckets);
  free(s);
}
