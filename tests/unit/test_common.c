/* Blob ids, hex, sizes and durations: tables of input -> expected output. */
#include "blobref/common.h"
#include "unit.h"

static const char *HEX = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";

int main(void) {
  static const struct {
    const char *in;
    int ok;
  } ids[] = {
      {"5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03", 1},
      {"sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03", 1},
      {"5891B5B522D5DF086D0FF0B110FBD9D21BB4FC7163AF34D08286A2E846F6BE03", 0},
      {"5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be0", 0},
      {"5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be033", 0},
      {"5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be0g", 0},
      {"sha256:", 0},
      {"", 0},
      {"sha512:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03", 0},
      {"SHA256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03", 0},
      {" 5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be0", 0},
  };
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
    uint8_t d[BR_SHA256_LEN];
    int rc = br_blob_id_parse(ids[i].in, strlen(ids[i].in), d);
    CHECK((rc == 0) == ids[i].ok, "blob id '%s': rc %d", ids[i].in, rc);
    if (rc == 0) {
      char back[BR_HEX_LEN + 1];
      br_hex_encode(d, back);
      CHECK(!strcmp(back, HEX), "round trip of '%s' gave %s", ids[i].in, back);
    }
  }
  uint8_t d[BR_SHA256_LEN];
  CHECK(
      br_hex_decode("5891B5B522D5DF086D0FF0B110FBD9D21BB4FC7163AF34D08286A2E846F6BE03", 64, d) == 0,
      "br_hex_decode accepts upper case");
  CHECK(d[0] == 0x58 && d[31] == 0x03, "decoded bytes %02x..%02x", d[0], d[31]);

  static const struct {
    const char *in;
    int ok;
    uint64_t bytes;
  } sizes[] = {
      {"0", 1, 0},
      {"1000", 1, 1000},
      {"10kB", 1, 10000},
      {"512KiB", 1, 524288},
      {"64MiB", 1, 67108864},
      {"5GiB", 1, 5368709120ull},
      {"1.5KiB", 1, 1536},
      {"2 MiB", 1, 2097152},
      {"1TiB", 1, 1099511627776ull},
      {"", 0, 0},
      {"MiB", 0, 0},
      {"-1", 0, 0},
      {"5XB", 0, 0},
      {"5 GiB x", 0, 0},
      {"99999999999TiB", 0, 0},
  };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    uint64_t v = 12345;
    int rc = br_parse_size(sizes[i].in, &v);
    CHECK((rc == 0) == sizes[i].ok, "size '%s': rc %d", sizes[i].in, rc);
    if (sizes[i].ok)
      CHECK(v == sizes[i].bytes, "size '%s' = %llu", sizes[i].in, (unsigned long long)v);
  }
  static const struct {
    const char *in;
    int ok;
    uint64_t ms;
  } durations[] = {
      {"15m", 1, 900000}, {"72h", 1, 259200000}, {"7d", 1, 604800000}, {"30s", 1, 30000},
      {"250ms", 1, 250},  {"10", 1, 10000},      {"1.5h", 1, 5400000}, {"2w", 1, 1209600000},
      {"", 0, 0},         {"h", 0, 0},           {"5y", 0, 0},         {"-5s", 0, 0},
  };
  for (size_t i = 0; i < sizeof durations / sizeof durations[0]; i++) {
    uint64_t v = 0;
    int rc = br_parse_duration_ms(durations[i].in, &v);
    CHECK((rc == 0) == durations[i].ok, "duration '%s': rc %d", durations[i].in, rc);
    if (durations[i].ok)
      CHECK(v == durations[i].ms, "duration '%s' = %llu ms", durations[i].in,
            (unsigned long long)v);
  }
  return unit_summary("common");
}
