/* A set of SHA-256 digests (open addressing, linear probing) and hash extraction from column
 * values in the hex, binary and url forms. */
#include <stdlib.h>
#include <string.h>

#include "blobref/iceberg.h"

struct br_hashset {
  uint8_t *slots; /* cap * 32 bytes */
  uint8_t *used;  /* cap flags */
  size_t cap;     /* power of two */
  size_t count;
};

br_hashset *br_hashset_new(void) {
  br_hashset *set = calloc(1, sizeof *set);
  if (!set) return NULL;
  set->cap = 1024;
  set->slots = malloc(set->cap * BR_SHA256_LEN);
  set->used = calloc(set->cap, 1);
  if (!set->slots || !set->used) {
    br_hashset_free(set);
    return NULL;
  }
  return set;
}

void br_hashset_free(br_hashset *set) {
  if (!set) return;
  free(set->slots);
  free(set->used);
  free(set);
}

/* Digests are uniformly distributed already: their first 8 bytes are a fine hash. */
static size_t slot_of(const uint8_t *d, size_t cap) {
  uint64_t h;
  memcpy(&h, d, sizeof h);
  return (size_t)(h & (cap - 1));
}

static size_t find(const uint8_t *slots, const uint8_t *used, size_t cap, const uint8_t *d) {
  size_t i = slot_of(d, cap);
  while (used[i] && memcmp(slots + i * BR_SHA256_LEN, d, BR_SHA256_LEN) != 0)
    i = (i + 1) & (cap - 1);
  return i;
}

static int grow(br_hashset *set) {
  size_t ncap = set->cap * 2;
  uint8_t *nslots = malloc(ncap * BR_SHA256_LEN);
  uint8_t *nused = calloc(ncap, 1);
  if (!nslots || !nused || ncap < set->cap) {
    free(nslots);
    free(nused);
    return -1;
  }
  for (size_t i = 0; i < set->cap; i++) {
    if (!set->used[i]) continue;
    size_t j = find(nslots, nused, ncap, set->slots + i * BR_SHA256_LEN);
    memcpy(nslots + j * BR_SHA256_LEN, set->slots + i * BR_SHA256_LEN, BR_SHA256_LEN);
    nused[j] = 1;
  }
  free(set->slots);
  free(set->used);
  set->slots = nslots;
  set->used = nused;
  set->cap = ncap;
  return 0;
}

int br_hashset_add(br_hashset *set, const uint8_t digest[BR_SHA256_LEN]) {
  if ((set->count + 1) * 4 > set->cap * 3 && grow(set) != 0) return -1; /* load <= 3/4 */
  size_t i = find(set->slots, set->used, set->cap, digest);
  if (set->used[i]) return 0;
  memcpy(set->slots + i * BR_SHA256_LEN, digest, BR_SHA256_LEN);
  set->used[i] = 1;
  set->count++;
  return 1;
}

int br_hashset_contains(const br_hashset *set, const uint8_t digest[BR_SHA256_LEN]) {
  return set->used[find(set->slots, set->used, set->cap, digest)] ? 1 : 0;
}

size_t br_hashset_count(const br_hashset *set) { return set->count; }

static int cmp_digest(const void *a, const void *b) { return memcmp(a, b, BR_SHA256_LEN); }

uint8_t *br_hashset_sorted(const br_hashset *set, size_t *count) {
  *count = 0;
  if (set->count == 0) return NULL;
  uint8_t *out = malloc(set->count * BR_SHA256_LEN);
  if (!out) return NULL;
  size_t n = 0;
  for (size_t i = 0; i < set->cap; i++)
    if (set->used[i])
      memcpy(out + BR_SHA256_LEN * n++, set->slots + i * BR_SHA256_LEN, BR_SHA256_LEN);
  qsort(out, n, BR_SHA256_LEN, cmp_digest);
  *count = n;
  return out;
}

static int is_hex(uint8_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

int br_iceberg_parse_hash(enum br_table_form form, const uint8_t *data, size_t len,
                          uint8_t digest[BR_SHA256_LEN]) {
  if (form == BR_FORM_BINARY) {
    if (len != BR_SHA256_LEN) return -1;
    memcpy(digest, data, BR_SHA256_LEN);
    return 0;
  }
  if (form == BR_FORM_HEX) {
    if (len == 7 + BR_HEX_LEN && memcmp(data, "sha256:", 7) == 0) {
      data += 7;
      len -= 7;
    }
    if (len != BR_HEX_LEN) return -1;
    return br_hex_decode((const char *)data, len, digest);
  }
  if (form != BR_FORM_URL) return -1;
  /* Scan maximal hex runs from the end; the first (= last in the string) of length 64 wins. */
  size_t end = len;
  while (end > 0) {
    while (end > 0 && !is_hex(data[end - 1])) end--;
    size_t start = end;
    while (start > 0 && is_hex(data[start - 1])) start--;
    if (end - start == BR_HEX_LEN)
      return br_hex_decode((const char *)data + start, BR_HEX_LEN, digest);
    end = start;
  }
  return -1;
}
