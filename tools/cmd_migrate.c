/* `blobref migrate --from STORE --to STORE`: a migrate job in the server (POST /v1/jobs), which
 * moves every blob whose primary location is in FROM to TO without a failed read (copy, verify
 * by SHA-256, switch; the old copy drains), followed until it ends. It needs only the server URL
 * and an admin token: the server holds the stores' secrets. --detach returns at once with the
 * job's id; Ctrl-C detaches (the job goes on); a job already running on FROM is followed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "http_client.h"

static const char migrate_usage[] =
    "usage: blobref migrate --from STORE --to STORE [--verify sha256|size] [--concurrency N]\n"
    "                       [--rate MB/s] [--limit N] [--dry-run] [--detach]\n"
    "  --from, --to     store names; blobs whose primary location is in FROM move to TO\n"
    "  --verify         sha256 (default) or size: the copy's SHA-256 is always checked\n"
    "  --concurrency N  blobs in flight (default 4, at most 32)\n"
    "  --rate MB/s      at most this many megabytes per second copied (default: no limit)\n"
    "  --limit N        move at most N blobs in this job\n"
    "  --dry-run        count what would move, change nothing\n"
    "  --detach         print the job's id and return (follow it with blobref jobs ID)\n"
    "  -c CONFIG        accepted and ignored (the server opens the stores)\n"
    "The job runs in the server: Ctrl-C stops following it, not the job (blobref jobs cancel).\n";

static void human_bytes(double b, char *out, size_t n) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  snprintf(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static json_int_t geti(json_t *j, const char *k) {
  return json_integer_value(json_object_get(j, k));
}

int cmd_migrate(const cli_globals *g, int argc, char **argv) {
  const char *from = NULL, *to = NULL, *verify = "sha256";
  long concurrency = 4;
  double rate_mb = 0;
  unsigned long long limit = 0;
  int dry = 0, detach = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      fputs(migrate_usage, stdout);
      return CLI_EXIT_OK;
    } else if (!strcmp(a, "--dry-run")) {
      dry = 1;
      continue;
    } else if (!strcmp(a, "--detach")) {
      detach = 1;
      continue;
    }
    if (!v) {
      fprintf(stderr, "blobref migrate: %s needs a value\n%s", a, migrate_usage);
      return CLI_EXIT_USAGE;
    }
    i++;
    if (!strcmp(a, "-c") || !strcmp(a, "--config"))
      ; /* the stores are the server's */
    else if (!strcmp(a, "--from"))
      from = v;
    else if (!strcmp(a, "--to"))
      to = v;
    else if (!strcmp(a, "--verify") && (!strcmp(v, "sha256") || !strcmp(v, "size")))
      verify = v;
    else if (!strcmp(a, "--concurrency") && (concurrency = strtol(v, &end, 10)) >= 1 &&
             concurrency <= 32 && !*end)
      ;
    else if (!strcmp(a, "--rate") && (rate_mb = strtod(v, &end)) > 0 && !*end)
      ;
    else if (!strcmp(a, "--limit") && (limit = strtoull(v, &end, 10)) > 0 && !*end)
      ;
    else {
      fprintf(stderr, "blobref migrate: bad option %s %s\n%s", a, v, migrate_usage);
      return CLI_EXIT_USAGE;
    }
  }
  if (!from || !to) {
    fprintf(stderr, "blobref migrate: --from and --to are required\n%s", migrate_usage);
    return CLI_EXIT_USAGE;
  }
  if (!strcmp(from, to)) {
    fprintf(stderr, "blobref migrate: --from and --to are the same store\n");
    return CLI_EXIT_USAGE;
  }
  json_t *spec =
      json_pack("{s:s,s:s,s:s,s:s,s:I,s:b}", "kind", "migrate", "from", from, "to", to, "verify",
                verify, "concurrency", (json_int_t)concurrency, "dry_run", dry);
  if (rate_mb > 0) json_object_set_new(spec, "rate", json_real(rate_mb));
  if (limit) json_object_set_new(spec, "limit", json_integer((json_int_t)limit));
  long status = 0;
  json_t *reply = NULL;
  br_err err;
  int rc = br_http_json(g->server, g->token, "POST", "/v1/jobs", spec, &status, &reply, &err);
  json_decref(spec);
  long long id = 0;
  if (rc < 0 && status == 409) {
    /* a job on FROM already: follow it when it is this migration */
    json_t *body = NULL;
    rc = br_http_json(g->server, g->token, "GET", "/v1/jobs", NULL, &status, &body, &err);
    json_t *jobs = json_object_get(body, "jobs");
    for (size_t i = 0; rc == 0 && i < json_array_size(jobs); i++) {
      json_t *j = json_array_get(jobs, i), *p = json_object_get(j, "params");
      const char *st = json_string_value(json_object_get(j, "state")) ?: "";
      if ((!strcmp(st, "running") || !strcmp(st, "queued")) &&
          !strcmp(json_string_value(json_object_get(j, "kind")) ?: "", "migrate") &&
          !strcmp(json_string_value(json_object_get(p, "from")) ?: "", from) &&
          !strcmp(json_string_value(json_object_get(p, "to")) ?: "", to))
        id = (long long)geti(j, "id");
    }
    json_decref(body);
    if (!id) {
      fprintf(stderr, "blobref migrate: another job is running on store %s (blobref jobs)\n", from);
      return CLI_EXIT_FAILURE;
    }
    fprintf(stderr, "migrate: job %lld is already moving %s to %s: following it\n", id, from, to);
  } else if (rc < 0) {
    fprintf(stderr, "blobref migrate: %s\n", err.msg);
    return CLI_EXIT_FAILURE;
  } else {
    id = (long long)geti(reply, "id");
    json_decref(reply);
  }
  if (detach) {
    printf("%lld\n", id);
    return CLI_EXIT_OK;
  }
  json_t *j = NULL;
  if (cli_job_follow(g, id, &j) < 0 || !j) return CLI_EXIT_FAILURE;
  char moved_b[32], total_b[32];
  human_bytes((double)geti(j, "bytes_done"), moved_b, sizeof moved_b);
  human_bytes((double)geti(j, "bytes_total"), total_b, sizeof total_b);
  const char *state = json_string_value(json_object_get(j, "state")) ?: "?";
  json_int_t started = geti(j, "started_ms"), ended = geti(j, "ended_ms");
  double secs = ended > started ? (double)(ended - started) / 1000.0 : 0;
  json_t *steps = json_object_get(j, "steps");
  if (json_is_true(json_object_get(json_object_get(j, "params"), "dry_run"))) {
    printf("dry run: %" JSON_INTEGER_FORMAT
           " blobs (%s) would move from %s to %s; %" JSON_INTEGER_FORMAT
           " already in %s; %" JSON_INTEGER_FORMAT " elsewhere\n",
           geti(j, "items_total"), total_b, from, to, geti(j, "items_at_target"), to,
           geti(j, "items_elsewhere"));
  } else {
    printf("job %" JSON_INTEGER_FORMAT " %s: moved %" JSON_INTEGER_FORMAT
           " of %" JSON_INTEGER_FORMAT " blobs (%s) from %s to %s in %.1f s; %" JSON_INTEGER_FORMAT
           " already in %s; %" JSON_INTEGER_FORMAT " skipped; %" JSON_INTEGER_FORMAT " errors\n",
           geti(j, "id"), state, geti(j, "items_done") + geti(j, "items_skipped"),
           geti(j, "items_total"), moved_b, from, to, secs, geti(j, "items_at_target"), to,
           geti(j, "items_skipped"), geti(j, "items_failed"));
    printf("time per step (summed over %" JSON_INTEGER_FORMAT
           " workers): read+write (copy) "
           "%.2f s, verify %.2f s, switch %.2f s\n",
           geti(json_object_get(j, "params"), "concurrency"), (double)geti(steps, "copy_ms") / 1e3,
           (double)geti(steps, "verify_ms") / 1e3, (double)geti(steps, "switch_ms") / 1e3);
  }
  json_t *errs = json_object_get(j, "errors");
  for (size_t i = 0; i < json_array_size(errs); i++) {
    json_t *e = json_array_get(errs, i);
    fprintf(stderr, "migrate: %s: %s\n", json_string_value(json_object_get(e, "item")) ?: "",
            json_string_value(json_object_get(e, "message")) ?: "");
  }
  if (json_object_get(j, "message"))
    fprintf(stderr, "blobref migrate: job %s: %s\n", state,
            json_string_value(json_object_get(j, "message")));
  rc = !strcmp(state, "done") && geti(j, "items_failed") == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
  json_decref(j);
  return rc;
}
