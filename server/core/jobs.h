/* Private to the daemon: the job engine (core/jobs.c): migrate and import jobs that run inside
 * blobrefd on their own threads, durable across restarts under DATA_DIR/jobs. */
#ifndef BLOBREF_CORE_JOBS_H
#define BLOBREF_CORE_JOBS_H

#include <jansson.h>

#include "core/server.h"

#define JOBS_KEPT 100      /* jobs remembered (the oldest ended ones are forgotten first) */
#define JOB_ERRORS_KEPT 20 /* the last errors of a job, with their items */
#define JOB_MAX_CONCURRENCY 32
#define JOB_IMPORT_MAX_KEYS 1000000 /* objects one import job lists */

/* What jobs_submit and jobs_cancel answer. */
enum jobs_rc { JOBS_OK = 0, JOBS_BAD, JOBS_CONFLICT, JOBS_NOT_FOUND, JOBS_FULL, JOBS_FAILED };

/* Loads the jobs kept under DATA_DIR/jobs and starts again those that were queued or running
 * (each resumes from its saved cursor). On a shared (PostgreSQL) index the jobs are rows of the
 * database instead: this starts the thread that renews this node's leases (job_lease) and claims
 * the jobs no live lease holds. -1 with err. */
int jobs_start(br_server *srv, br_err *err);
/* Asks every running job to stop after the items in flight and joins their threads; their
 * state stays running on disk, so the next start resumes them (shared: each is handed back,
 * its lease released, so that another node goes on at once). Safe after a failed start. */
void jobs_stop(br_server *srv);

/* Validates spec ({"kind":"migrate"|"import", ...}) and starts the job: JOBS_OK with *out the
 * job's JSON; JOBS_BAD with msg naming the field and *field set to it; JOBS_CONFLICT when an
 * active job has the same source store (msg names it, *out is that job's JSON); JOBS_FULL when
 * JOBS_KEPT jobs are all active; JOBS_FAILED with msg. */
enum jobs_rc jobs_submit(br_server *srv, json_t *spec, json_t **out, const char **field, char *msg,
                         size_t msglen);
/* Every job kept, newest first: {"jobs":[...]} (on a shared index every node's), or NULL when
 * the database cannot be read. */
json_t *jobs_list(br_server *srv);
/* The job id as JSON: JOBS_OK with *out, JOBS_NOT_FOUND, or JOBS_FAILED (the database). */
enum jobs_rc jobs_get(br_server *srv, uint64_t id, json_t **out);
/* Asks job id to stop (cancelled once its items in flight are done; an ended job is left as it
 * is; on a shared index from any node: its runner sees it at its next lease renewal): JOBS_OK
 * with *out its JSON, JOBS_NOT_FOUND, or JOBS_FAILED. */
enum jobs_rc jobs_cancel(br_server *srv, uint64_t id, json_t **out);

#endif
