/* libFuzzer target: the metadata.json parser (plain and gzip'd) and metadata file choice. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "iceberg/internal.h"

/* libavro's schema parser leaks on some malformed schemas (e.g. a named type defined twice);
 * that is libavro's, bounded by the 1 MiB schema limit, and only on damaged files. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libavro.so\n"; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ice_meta m;
  br_err err;
  if (ice_meta_parse(data, size, &m, &err) == 0) {
    for (size_t i = 0; i < m.nsnapshots; i++) {
      char out[ICE_MAX_PATH + 1];
      ice_pathmap pm = {NULL, 0, "/t", m.location};
      if (m.snapshots[i].manifest_list)
        ice_map_path(&pm, m.snapshots[i].manifest_list, out, sizeof out, &err);
    }
    ice_meta_free(&m);
  }
  /* The same bytes as a version hint against a fixed folder listing. */
  char *names[] = {"v1.metadata.json", "v2.gz.metadata.json", "00003-x.metadata.json"};
  ice_pick_metadata((const char *)data, size, names, 3, &err);
  return 0;
}
