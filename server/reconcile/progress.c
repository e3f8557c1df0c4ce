/* The reconcile run in progress: its phase and counts for this node's readers, published in the
 * shared state of a PostgreSQL index for the other nodes' (which show it while its node holds the
 * cluster-wide reconcile lease: a node killed mid-run leaves a record nobody shows). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "blobref/index.h"
#include "reconcile/internal.h"

#define PUBLISH_EVERY_MS 1000

struct rprogress {
  rstate *st;
  br_index *index; /* shared: published, and the lease consulted */
  pthread_mutex_t lock;
  json_t *run; /* the running report; NULL when no run is in progress here */
  char phase[16];
  uint64_t published_ms;
};

rprogress *rprogress_new(rstate *st, br_index *index, br_err *err) {
  rprogress *p = calloc(1, sizeof *p);
  if (!p) {
    br_fail(err, "out of memory");
    return NULL;
  }
  p->st = st;
  p->index = index;
  pthread_mutex_init(&p->lock, NULL);
  return p;
}

void rprogress_free(rprogress *p) {
  if (!p) return;
  json_decref(p->run);
  pthread_mutex_destroy(&p->lock);
  free(p);
}

/* Publishes the running report (lock held). A failure is logged: other nodes see less. */
static void publish(rprogress *p) {
  if (!p->index || !p->run) return;
  char *text = json_dumps(p->run, JSON_COMPACT);
  br_err err;
  if (!text || rstate_put_current(p->st, text, &err) < 0)
    br_warn("reconcile: publishing the run's progress: %s", text ? err.msg : "out of memory");
  free(text);
  p->published_ms = br_now_ms();
}

void rprogress_start(rprogress *p, uint64_t id, int dry_run, int force, int full,
                     const char *started_at, const char *phase) {
  pthread_mutex_lock(&p->lock);
  json_decref(p->run);
  p->run = json_pack("{s:I,s:s,s:b,s:b,s:b,s:s,s:s,s:{s:I,s:I,s:I,s:I}}", "id", (json_int_t)id,
                     "state", "running", "dry_run", dry_run, "force", force, "full", full,
                     "started_at", started_at, "phase", phase, "progress", "data_files",
                     (json_int_t)0, "data_files_read", (json_int_t)0, "data_files_cached",
                     (json_int_t)0, "records_swept", (json_int_t)0);
  snprintf(p->phase, sizeof p->phase, "%s", phase);
  publish(p);
  pthread_mutex_unlock(&p->lock);
}

void rprogress_update(rprogress *p, const char *phase, uint64_t files, uint64_t read,
                      uint64_t cached, uint64_t swept) {
  pthread_mutex_lock(&p->lock);
  if (p->run) {
    int changed = strcmp(p->phase, phase) != 0;
    snprintf(p->phase, sizeof p->phase, "%s", phase);
    json_object_set_new(p->run, "phase", json_string(phase));
    json_object_set_new(p->run, "progress",
                        json_pack("{s:I,s:I,s:I,s:I}", "data_files", (json_int_t)files,
                                  "data_files_read", (json_int_t)read, "data_files_cached",
                                  (json_int_t)cached, "records_swept", (json_int_t)swept));
    if (changed || br_now_ms() - p->published_ms >= PUBLISH_EVERY_MS) publish(p);
  }
  pthread_mutex_unlock(&p->lock);
}

void rprogress_publish(rprogress *p) {
  pthread_mutex_lock(&p->lock);
  publish(p);
  pthread_mutex_unlock(&p->lock);
}

void rprogress_end(rprogress *p) {
  pthread_mutex_lock(&p->lock);
  json_decref(p->run); /* the published record stays: its stored report says it ended */
  p->run = NULL;
  pthread_mutex_unlock(&p->lock);
}

/* The run another node published, when it is id (0: any), its node still holds the reconcile
 * lease and (unless ended) no report of it is stored yet. */
static json_t *published(rprogress *p, uint64_t id, int ended) {
  br_err err;
  int found = 0;
  char *text = rstate_get_current(p->st, &found, &err);
  json_t *run = text ? json_loads(text, 0, NULL) : NULL;
  free(text);
  uint64_t rid = (uint64_t)json_integer_value(json_object_get(run, "id"));
  if (!run || !rid || (id && rid != id) ||
      br_index_lease_held(p->index, BR_INDEX_LEASE_RECONCILE, &err) != 1) {
    json_decref(run);
    return NULL;
  }
  if (!ended) free(rstate_get_report(p->st, rid, &found, &err));
  if (!ended && found) { /* ended; its record not cleared yet */
    json_decref(run);
    return NULL;
  }
  return run;
}

json_t *rprogress_get(rprogress *p, uint64_t id) {
  pthread_mutex_lock(&p->lock);
  json_t *run = NULL;
  int mine = p->run != NULL;
  if (mine && (!id || (uint64_t)json_integer_value(json_object_get(p->run, "id")) == id))
    run = json_deep_copy(p->run);
  pthread_mutex_unlock(&p->lock);
  if (run || mine || !p->index) return run;
  return published(p, id, 0);
}

uint64_t rprogress_holder(rprogress *p) {
  pthread_mutex_lock(&p->lock);
  uint64_t id = p->run ? (uint64_t)json_integer_value(json_object_get(p->run, "id")) : 0;
  pthread_mutex_unlock(&p->lock);
  if (id || !p->index) return id;
  json_t *run = published(p, 0, 1);
  id = (uint64_t)json_integer_value(json_object_get(run, "id"));
  json_decref(run);
  return id;
}
