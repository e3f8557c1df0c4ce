/* The record's stored form (format versions 1 and 2): the encoding both index backends keep,
 * pure. */
#include <stdio.h>
#include <string.h>

#include "blobref/index.h"

/* ---- record encoding (version 1) ------------------------------------------------------------
 * u8 version=1, u8 state, u64 size, u64 created_ms, u64 last_upload_ms, u64 state_ms,
 * str reason, str content_type, u8 nlocations, then per location:
 * u8 role, u64 verified_at_ms, str store, str key.   (str = u16 length + bytes, little-endian)
 * Version 2 is the same with u64 dev, u64 ino after each location's key (an in-place file's
 * identity). A record is written as version 1 when no location has an identity, so the records
 * of older servers and those without in-place files keep their bytes; a version 2 record where
 * none has one is not canonical and refused (one encoding per record). */

#define RECORD_VERSION 1
#define RECORD_VERSION_IDENTITY 2

struct wbuf {
  uint8_t *p;
  size_t len, cap;
  int overflow;
};

static void put_bytes(struct wbuf *b, const void *src, size_t n) {
  if (b->overflow || n > b->cap - b->len) {
    b->overflow = 1;
    return;
  }
  memcpy(b->p + b->len, src, n);
  b->len += n;
}

static void put_u8(struct wbuf *b, uint8_t v) { put_bytes(b, &v, 1); }

static void put_u64(struct wbuf *b, uint64_t v) {
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(v >> (8 * i));
  put_bytes(b, le, 8);
}

static void put_str(struct wbuf *b, const char *s, size_t max) {
  size_t n = strnlen(s, max + 1);
  if (n > max) {
    b->overflow = 1;
    return;
  }
  uint8_t le[2] = {(uint8_t)n, (uint8_t)(n >> 8)};
  put_bytes(b, le, 2);
  put_bytes(b, s, n);
}

size_t br_record_encode(const br_record *rec, uint8_t *buf, size_t cap) {
  struct wbuf b = {buf, 0, cap, 0};
  if (rec->nlocations < 0 || rec->nlocations > BR_MAX_LOCATIONS) return 0;
  if (rec->state != BR_STATE_LIVE && rec->state != BR_STATE_QUARANTINED &&
      rec->state != BR_STATE_HELD && rec->state != BR_STATE_DELETING)
    return 0;
  int ident = 0;
  for (int i = 0; i < rec->nlocations; i++)
    ident |= rec->locations[i].dev != 0 || rec->locations[i].ino != 0;
  put_u8(&b, ident ? RECORD_VERSION_IDENTITY : RECORD_VERSION);
  put_u8(&b, (uint8_t)rec->state);
  put_u64(&b, rec->size);
  put_u64(&b, rec->created_ms);
  put_u64(&b, rec->last_upload_ms);
  put_u64(&b, rec->state_ms);
  put_str(&b, rec->reason, BR_MAX_REASON);
  put_str(&b, rec->content_type, BR_MAX_CONTENT_TYPE);
  put_u8(&b, (uint8_t)rec->nlocations);
  for (int i = 0; i < rec->nlocations; i++) {
    const br_location *l = &rec->locations[i];
    if (l->role > BR_ROLE_DRAINING) return 0;
    put_u8(&b, (uint8_t)l->role);
    put_u64(&b, l->verified_at_ms);
    put_str(&b, l->store, BR_MAX_STORE_NAME);
    put_str(&b, l->key, BR_MAX_KEY);
    if (ident) {
      put_u64(&b, l->dev);
      put_u64(&b, l->ino);
    }
  }
  return b.overflow ? 0 : b.len;
}

struct rbuf {
  const uint8_t *p;
  size_t len, off;
  int bad;
};

static int get_bytes(struct rbuf *b, void *dst, size_t n) {
  if (b->bad || n > b->len - b->off) {
    b->bad = 1;
    return -1;
  }
  memcpy(dst, b->p + b->off, n);
  b->off += n;
  return 0;
}

static uint8_t get_u8(struct rbuf *b) {
  uint8_t v = 0;
  get_bytes(b, &v, 1);
  return v;
}

static uint64_t get_u64(struct rbuf *b) {
  uint8_t le[8] = {0};
  get_bytes(b, le, 8);
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | le[i];
  return v;
}

static void get_str(struct rbuf *b, char *dst, size_t max) {
  uint8_t le[2] = {0, 0};
  get_bytes(b, le, 2);
  size_t n = (size_t)le[0] | (size_t)le[1] << 8;
  if (n > max) b->bad = 1;
  if (b->bad) {
    dst[0] = '\0';
    return;
  }
  get_bytes(b, dst, n);
  dst[b->bad ? 0 : n] = '\0';
  if (!b->bad && memchr(dst, '\0', n)) b->bad = 1;
}

int br_record_decode(const uint8_t *buf, size_t len, br_record *rec, br_err *err) {
  struct rbuf b = {buf, len, 0, 0};
  /* every field is set below (strings are terminated); the location slots, 9 KB of the record,
   * are not cleared: a memset of the whole record was a noticeable part of every read */
  memset(rec, 0, offsetof(br_record, locations));
  uint8_t version = get_u8(&b);
  if (b.bad || (version != RECORD_VERSION && version != RECORD_VERSION_IDENTITY))
    return br_fail(err, "index record: unknown format version %u", version);
  int ident = version == RECORD_VERSION_IDENTITY, any_ident = 0;
  uint8_t state = get_u8(&b);
  rec->size = get_u64(&b);
  rec->created_ms = get_u64(&b);
  rec->last_upload_ms = get_u64(&b);
  rec->state_ms = get_u64(&b);
  get_str(&b, rec->reason, BR_MAX_REASON);
  get_str(&b, rec->content_type, BR_MAX_CONTENT_TYPE);
  uint8_t n = get_u8(&b);
  if (state > BR_STATE_DELETING || n > BR_MAX_LOCATIONS) b.bad = 1;
  rec->state = (enum br_state)state;
  for (int i = 0; i < n && !b.bad; i++) {
    br_location *l = &rec->locations[i];
    uint8_t role = get_u8(&b);
    if (role > BR_ROLE_DRAINING) b.bad = 1;
    l->role = (enum br_role)role;
    l->verified_at_ms = get_u64(&b);
    get_str(&b, l->store, BR_MAX_STORE_NAME);
    get_str(&b, l->key, BR_MAX_KEY);
    l->dev = ident ? get_u64(&b) : 0;
    l->ino = ident ? get_u64(&b) : 0;
    any_ident |= l->dev != 0 || l->ino != 0;
  }
  rec->nlocations = n;
  if (ident && !any_ident) b.bad = 1; /* version 1 encodes it: not canonical */
  if (b.bad || b.off != len) return br_fail(err, "index record: malformed (%zu bytes)", len);
  return 0;
}

void br_record_init(br_record *rec, uint64_t size, const char *content_type, const char *store,
                    const char *key, uint64_t created_ms, uint64_t verified_ms) {
  *rec = (br_record){.size = size,
                     .created_ms = created_ms,
                     .last_upload_ms = created_ms,
                     .state = BR_STATE_LIVE,
                     .state_ms = created_ms,
                     .nlocations = 1};
  snprintf(rec->content_type, sizeof rec->content_type, "%s", content_type);
  br_location *loc = &rec->locations[0];
  snprintf(loc->store, sizeof loc->store, "%s", store);
  snprintf(loc->key, sizeof loc->key, "%s", key);
  loc->role = BR_ROLE_PRIMARY;
  loc->verified_at_ms = verified_ms;
}

const br_location *br_record_primary(const br_record *rec) {
  for (int i = 0; i < rec->nlocations; i++)
    if (rec->locations[i].role == BR_ROLE_PRIMARY) return &rec->locations[i];
  return rec->nlocations ? &rec->locations[0] : NULL;
}
