/* Unit tests for `blobref token new`: the printed token and section, scope lists and names
 * (tools/cmd_token.c, built in here). */
/* br_cli_bad_option, which cmd_token.c calls for a mistyped option */
#include "../../tools/http_client.c"
#include "../../tools/cmd_token.c"
#include "unit.h"

/* "br_" + hex(00 01 .. 1f) and its SHA-256 */
#define TOKEN "br_000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define DIGEST "916f0558219d93476959c7b1d26934fc31f96e4c290d8d196b8bd467f1dd6e76"

static void test_format(void) {
  uint8_t random[TOKEN_RANDOM_BYTES];
  for (int i = 0; i < TOKEN_RANDOM_BYTES; i++) random[i] = (uint8_t)i;
  static const struct {
    const char *name, *scopes;
    const char *want; /* NULL = rejected */
  } cases[] = {
      {"ci", "read,write",
       TOKEN "\n\n; for the server's config (it keeps only the token's SHA-256)\n"
             "[token ci]\nsha256 = " DIGEST "\nscopes = read, write\n"},
      {NULL, "write, read ,write",
       TOKEN "\n\n; for the server's config (it keeps only the token's SHA-256)\n"
             "[token t-916f0558]\nsha256 = " DIGEST "\nscopes = read, write\n"},
      {"a.b_c-1", "admin",
       TOKEN "\n\n; for the server's config (it keeps only the token's SHA-256)\n"
             "[token a.b_c-1]\nsha256 = " DIGEST "\nscopes = admin\n"},
      {"x", "admin write read", NULL},
      {"x", "", NULL},
      {"x", ",", NULL},
      {"m", "metrics",
       TOKEN "\n\n; for the server's config (it keeps only the token's SHA-256)\n"
             "[token m]\nsha256 = " DIGEST "\nscopes = metrics\n"},
      {"x", "reads", NULL},
      {"x", "read,none", NULL},
      {"x", "READ", NULL},
      {"", "read", NULL},
      {"a b", "read", NULL},
      {"a]", "read", NULL},
      {"0123456789012345678901234567890123456789012345678901234567890123", "read", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[512] = "";
    br_err err = {{0}};
    int rc = token_format(random, cases[i].name, cases[i].scopes, out, sizeof out, &err);
    if (i == 3) { /* every scope, any order: canonical order */
      CHECK(rc == 0 && strstr(out, "\nscopes = read, write, admin\n"), "case %zu: %s", i, out);
      continue;
    }
    if (cases[i].want)
      CHECK(rc == 0 && !strcmp(out, cases[i].want), "case %zu: rc %d: '%s' %s", i, rc, out,
            err.msg);
    else
      CHECK(rc == -1 && err.msg[0], "case %zu accepted: '%s'", i, out);
  }
  char small[64];
  br_err err = {{0}};
  CHECK(token_format(random, "ci", "read", small, sizeof small, &err) == -1, "small buffer");
}

int main(void) {
  test_format();
  return unit_summary("cli_token");
}
