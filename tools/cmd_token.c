/* `blobref token new`: makes a bearer token and prints it with the `[token NAME]` section that
 * configures it on the server. Offline: the server is never asked, and only ever holds the
 * token's SHA-256. */
#include <getopt.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>

#include "blobref/common.h"
#include "commands.h"
#include "http_client.h"

#define TOKEN_PREFIX "br_"
#define TOKEN_RANDOM_BYTES 32 /* 256 bits, printed as 64 hex digits after the prefix */
#define TOKEN_NAME_MAX 63

static const char token_help[] =
    "usage: blobref token new --scopes SCOPES [--name NAME]\n"
    "\n"
    "Makes a new bearer token, 'br_' and 64 hex digits (32 random bytes), and prints it\n"
    "on the first line: it is shown only this once and stored nowhere. Then prints the\n"
    "[token NAME] section to paste into the server's config, which holds only the\n"
    "token's SHA-256. Clients send it as 'Authorization: Bearer TOKEN' (blobref --token\n"
    "or BLOBREF_TOKEN).\n"
    "\n"
    "  --scopes SCOPES  read, write, admin and/or metrics, comma-separated. Scopes are\n"
    "                   independent: write does not imply read. metrics: /metrics and\n"
    "                   /readyz's details when the server sets [auth] private_metrics.\n"
    "  --name NAME      the section's name (letters, digits, '-', '_', '.'); default\n"
    "                   t-<the first 8 hex digits of the token's SHA-256>\n"
    "\n"
    "Exit status: 0 printed, 1 no random bytes, 2 usage error.\n";

static const char *const scope_names[] = {"read", "write", "admin", "metrics"};
#define NSCOPES (sizeof scope_names / sizeof scope_names[0])

/* Parses a scope list ("write,read", commas and/or blanks) into its canonical spelling in out
 * ("read, write"; each scope once, in the order read, write, admin, metrics). Returns 0, or -1 for
 * an empty list or an unknown scope. */
static int token_scopes_canonical(const char *in, char *out, size_t outlen) {
  unsigned seen = 0;
  const char *p = in;
  while (*p) {
    while (*p == ',' || *p == ' ' || *p == '\t') p++;
    if (!*p) break;
    size_t n = strcspn(p, ", \t");
    size_t i = 0;
    while (i < NSCOPES && !(strlen(scope_names[i]) == n && !strncmp(p, scope_names[i], n))) i++;
    if (i == NSCOPES) return -1;
    seen |= 1u << i;
    p += n;
  }
  if (!seen) return -1;
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < NSCOPES; i++) {
    if (!(seen & 1u << i)) continue;
    int w = snprintf(out + used, outlen - used, "%s%s", used ? ", " : "", scope_names[i]);
    if (w < 0 || (size_t)w >= outlen - used) return -1;
    used += (size_t)w;
  }
  return 0;
}

/* Is name usable as the NAME of a config section? (the rule of server/config.c) */
static int token_name_ok(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > TOKEN_NAME_MAX) return 0;
  for (const char *c = name; *c; c++)
    if (!(*c == '-' || *c == '_' || *c == '.' || (*c >= '0' && *c <= '9') ||
          (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')))
      return 0;
  return 1;
}

/* Writes what `token new` prints for a token made of these random bytes: the token on the first
 * line, a blank line, then the config section (a comment line, [token NAME], sha256, scopes).
 * name NULL = the default name; scopes is a list for token_scopes_canonical. Returns 0, or -1
 * with err for a bad name or scope list or an out buffer that is too small. */
static int token_format(const uint8_t random[TOKEN_RANDOM_BYTES], const char *name,
                        const char *scopes, char *out, size_t outlen, br_err *err) {
  char token[sizeof TOKEN_PREFIX + BR_HEX_LEN], digest_hex[BR_HEX_LEN + 1], canon[64];
  char default_name[16];
  uint8_t digest[BR_SHA256_LEN];
  memcpy(token, TOKEN_PREFIX, sizeof TOKEN_PREFIX - 1);
  br_hex_encode(random, token + sizeof TOKEN_PREFIX - 1); /* writes the NUL too */
  if (!EVP_Digest(token, strlen(token), digest, NULL, EVP_sha256(), NULL))
    return br_fail(err, "SHA-256 failed");
  br_hex_encode(digest, digest_hex);
  if (!name) {
    snprintf(default_name, sizeof default_name, "t-%.8s", digest_hex);
    name = default_name;
  }
  if (!token_name_ok(name))
    return br_fail(err, "--name: '%.80s' must be 1 to %d letters, digits, '-', '_' or '.'", name,
                   TOKEN_NAME_MAX);
  if (token_scopes_canonical(scopes, canon, sizeof canon) < 0)
    return br_fail(err, "--scopes: '%.80s' is not a list of read, write, admin, metrics", scopes);
  int w = snprintf(out, outlen,
                   "%s\n"
                   "\n"
                   "; for the server's config (it keeps only the token's SHA-256)\n"
                   "[token %s]\n"
                   "sha256 = %s\n"
                   "scopes = %s\n",
                   token, name, digest_hex, canon);
  if (w < 0 || (size_t)w >= outlen) return br_fail(err, "output buffer too small");
  return 0;
}

/* Prints token_format()'s text as one JSON object: token, name, sha256, scopes (a list) and
 * config (the section to paste). Returns 0, or -1 when the text is not token_format's. */
static int token_print_json(const char *text) {
  char token[128], name[TOKEN_NAME_MAX + 1], sha[BR_HEX_LEN + 1], scopes[64];
  const char *section = strstr(text, "\n[token ");
  if (sscanf(text, "%127s", token) != 1 || !section ||
      sscanf(section, "\n[token %63[^]]]\nsha256 = %64s\nscopes = %63[^\n]", name, sha, scopes) !=
          3)
    return -1;
  json_t *list = json_array();
  for (char *save = NULL, *s = strtok_r(scopes, ", ", &save); s; s = strtok_r(NULL, ", ", &save))
    json_array_append_new(list, json_string(s));
  json_t *doc = json_pack("{s:s, s:s, s:s, s:o, s:s}", "token", token, "name", name, "sha256", sha,
                          "scopes", list, "config", section + 1);
  int ok = doc && json_dumpf(doc, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) == 0 &&
           fputc('\n', stdout) != EOF;
  json_decref(doc);
  OPENSSL_cleanse(token, sizeof token);
  return ok ? 0 : -1;
}

int cmd_token(const cli_globals *g, int argc, char **argv) {
  static const struct option longopts[] = {{"scopes", required_argument, NULL, 's'},
                                           {"name", required_argument, NULL, 'n'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  const char *scopes = NULL, *name = NULL;
  int opt;
  optind = 0; /* glibc: full re-initialisation for the subcommand's argv */
  opterr = 0;
  if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    fputs(token_help, stdout);
    return 0;
  }
  if (argc < 2 || strcmp(argv[1], "new") != 0) {
    fprintf(stderr, "blobref token: expected 'new' (see 'blobref token --help')\n");
    return 2;
  }
  argc--, argv++; /* getopt from "new" on */
  while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (opt) {
      case 's':
        scopes = optarg;
        break;
      case 'n':
        name = optarg;
        break;
      case 'h':
        fputs(token_help, stdout);
        return 0;
      default:
        return br_cli_bad_option("token", argv, longopts);
    }
  }
  if (optind != argc) {
    fprintf(stderr, "blobref token: unexpected argument '%s' (see 'blobref token --help')\n",
            argv[optind]);
    return 2;
  }
  if (!scopes) {
    fprintf(stderr, "blobref token: --scopes is required (see 'blobref token --help')\n");
    return 2;
  }
  uint8_t random[TOKEN_RANDOM_BYTES];
  char out[512];
  br_err err = {{0}};
  if (token_format((const uint8_t[TOKEN_RANDOM_BYTES]){0}, name, scopes, out, sizeof out, &err) <
      0) {
    fprintf(stderr, "blobref token: %s\n", err.msg);
    return 2;
  }
  if (RAND_bytes(random, sizeof random) != 1) {
    fprintf(stderr, "blobref token: no random bytes from OpenSSL\n");
    return 1;
  }
  int rc = token_format(random, name, scopes, out, sizeof out, &err);
  OPENSSL_cleanse(random, sizeof random);
  if (rc < 0) {
    fprintf(stderr, "blobref token: %s\n", err.msg);
    return 1;
  }
  int ok = (g->json ? token_print_json(out) == 0 : fputs(out, stdout) >= 0) && fflush(stdout) == 0;
  OPENSSL_cleanse(out, sizeof out);
  if (!ok) {
    fprintf(stderr, "blobref token: cannot write to standard output\n");
    return 1;
  }
  return 0;
}
