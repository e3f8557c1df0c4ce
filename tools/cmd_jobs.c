/* `blobref jobs [ID] [--json]`, `blobref jobs cancel ID`: the server's migrate and import jobs
 * (GET /v1/jobs, POST /v1/jobs/{id}/cancel), and cli_job_follow, which the migrate and import
 * commands use to show a job's progress until it ends. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "http_client.h"

static const char jobs_usage[] =
    "usage: blobref jobs [ID] [--json]     the server's jobs (newest first), or job ID\n"
    "       blobref jobs cancel ID         ask job ID to stop (it ends cancelled)\n";

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
  (void)sig;
  interrupted = 1;
}

static void human_bytes(double b, char *out, size_t n) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  snprintf(out, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void human_duration(double s, char *out, size_t n) {
  if (s < 0 || s > 1e7) {
    snprintf(out, n, "?");
    return;
  }
  unsigned long t = (unsigned long)(s + 0.5);
  if (t >= 3600)
    snprintf(out, n, "%lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(out, n, "%lu:%02lu", t / 60, t % 60);
}

static json_int_t geti(json_t *j, const char *k) {
  return json_integer_value(json_object_get(j, k));
}

/* One progress line of job j on stderr: a bar on a terminal, plain text in a pipe. */
static void progress_line(json_t *j, int tty, int final) {
  double done = (double)geti(j, "bytes_done"), total = (double)geti(j, "bytes_total");
  json_int_t items = geti(j, "items_done") + geti(j, "items_skipped") + geti(j, "items_failed");
  json_int_t nitems = geti(j, "items_total");
  double frac = total > 0 ? done / total : nitems ? (double)items / (double)nitems : 1;
  if (frac > 1) frac = 1;
  json_t *eta = json_object_get(j, "eta_s");
  char done_b[32], total_b[32], rate_b[32], eta_s[32];
  human_bytes(done, done_b, sizeof done_b);
  human_bytes(total, total_b, sizeof total_b);
  human_bytes(json_number_value(json_object_get(j, "rate_bytes_per_s")), rate_b, sizeof rate_b);
  human_duration(json_is_number(eta) ? json_number_value(eta) : -1, eta_s, sizeof eta_s);
  const char *kind = json_string_value(json_object_get(j, "kind"));
  if (tty) {
    char bar[31];
    int fill = (int)(frac * 30);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    fprintf(stderr,
            "\r[%s] %3d%% %" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT
            " items %s/%s %s/s ETA %s %s",
            bar, (int)(frac * 100), items, nitems, done_b, total_b, rate_b, eta_s,
            final ? "\n" : "\033[K");
  } else {
    fprintf(stderr,
            "%s: job %" JSON_INTEGER_FORMAT " %s: %" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT
            " items, %s of %s, %s/s, ETA %s, %" JSON_INTEGER_FORMAT " errors\n",
            kind ? kind : "job", geti(j, "id"),
            json_string_value(json_object_get(j, "state")) ?: "?", items, nitems, done_b, total_b,
            rate_b, eta_s, geti(j, "items_failed"));
  }
  fflush(stderr);
}

static int ended(json_t *j) {
  const char *s = json_string_value(json_object_get(j, "state"));
  return s && strcmp(s, "queued") && strcmp(s, "running");
}

int cli_job_follow(const cli_globals *g, long long id, json_t **final) {
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old);
  interrupted = 0;
  int tty = isatty(2), ticks = 0, rc = -1;
  char path[64];
  snprintf(path, sizeof path, "/v1/jobs/%lld", id);
  *final = NULL;
  int failures = 0;
  while (!interrupted) {
    long status = 0;
    json_t *j = NULL;
    br_err err;
    if (br_http_json(g->server, g->token, "GET", path, NULL, &status, &j, &err) < 0) {
      if (status || ++failures > 20) { /* the server says no, or is gone for ~10 s */
        fprintf(stderr, "blobref: job %lld: %s\n", id, err.msg);
        break;
      }
    } else {
      failures = 0;
      if (ended(j)) {
        progress_line(j, tty, 1);
        *final = j;
        rc = 0;
        break;
      }
      if (tty || ++ticks % 8 == 1) progress_line(j, tty, 0);
      json_decref(j);
    }
    struct timespec ts = {0, 250 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (interrupted) {
    fprintf(stderr,
            "%sdetached: job %lld goes on in the server (blobref jobs %lld; blobref jobs "
            "cancel %lld)\n",
            tty ? "\n" : "", id, id, id);
    rc = 1;
  }
  sigaction(SIGINT, &old, NULL);
  return rc;
}

/* One line per job for the listing. */
static void job_row(json_t *j) {
  json_t *p = json_object_get(j, "params");
  const char *kind = json_string_value(json_object_get(j, "kind")) ?: "?";
  char what[300], done_b[32];
  if (!strcmp(kind, "migrate"))
    snprintf(what, sizeof what, "%s -> %s", json_string_value(json_object_get(p, "from")) ?: "",
             json_string_value(json_object_get(p, "to")) ?: "");
  else
    snprintf(what, sizeof what, "%s:%s (%s)", json_string_value(json_object_get(p, "store")) ?: "",
             json_string_value(json_object_get(p, "prefix")) ?: "",
             json_string_value(json_object_get(p, "mode")) ?: "");
  human_bytes((double)geti(j, "bytes_done"), done_b, sizeof done_b);
  printf("%-5" JSON_INTEGER_FORMAT " %-8s %-10s %" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT
         " items  %-10s %" JSON_INTEGER_FORMAT " failed  %s\n",
         geti(j, "id"), kind, json_string_value(json_object_get(j, "state")) ?: "?",
         geti(j, "items_done"), geti(j, "items_total"), done_b, geti(j, "items_failed"), what);
}

int cmd_jobs(const cli_globals *g, int argc, char **argv) {
  const char *id = NULL;
  int cancel = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      fputs(jobs_usage, stdout);
      return CLI_EXIT_OK;
    } else if (!strcmp(argv[i], "cancel") && !cancel && !id) {
      cancel = 1;
    } else if (!id && argv[i][0] >= '0' && argv[i][0] <= '9' &&
               strspn(argv[i], "0123456789") == strlen(argv[i]) && strlen(argv[i]) < 20) {
      id = argv[i];
    } else {
      fprintf(stderr, "blobref jobs: unexpected argument %s\n%s", argv[i], jobs_usage);
      return CLI_EXIT_USAGE;
    }
  }
  if (cancel && !id) {
    fprintf(stderr, "blobref jobs cancel: which job?\n%s", jobs_usage);
    return CLI_EXIT_USAGE;
  }
  char path[64];
  if (cancel)
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
  else if (id)
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
  else
    snprintf(path, sizeof path, "/v1/jobs");
  long status = 0;
  json_t *reply = NULL;
  br_err err;
  if (br_http_json(g->server, g->token, cancel ? "POST" : "GET", path, NULL, &status, &reply,
                   &err) < 0) {
    fprintf(stderr, "blobref jobs: %s\n", err.msg);
    return CLI_EXIT_FAILURE;
  }
  if (g->json || (id && !cancel)) {
    char *text = json_dumps(reply, g->json ? JSON_COMPACT : JSON_INDENT(2));
    if (text) puts(text);
    free(text);
  } else if (cancel) {
    printf("job %s: %s%s\n", id, json_string_value(json_object_get(reply, "state")) ?: "?",
           json_is_true(json_object_get(reply, "cancel_requested")) ? ", cancel asked for" : "");
  } else {
    json_t *jobs = json_object_get(reply, "jobs");
    printf("%-5s %-8s %-10s %s\n", "ID", "KIND", "STATE", "PROGRESS");
    for (size_t i = 0; i < json_array_size(jobs); i++) job_row(json_array_get(jobs, i));
  }
  json_decref(reply);
  return CLI_EXIT_OK;
}
