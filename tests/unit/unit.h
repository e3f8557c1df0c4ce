/* A tiny table-test harness: CHECK counts, prints failures with file:line, and unit_summary()
 * prints the closing "N passed, N failed" line and returns the exit status. */
#ifndef BLOBREF_UNIT_H
#define BLOBREF_UNIT_H

#include <stdio.h>
#include <string.h>

static int unit_passed, unit_failed;

#define CHECK(cond, ...)                                               \
  do {                                                                 \
    if (cond) {                                                        \
      unit_passed++;                                                   \
    } else {                                                           \
      unit_failed++;                                                   \
      fprintf(stderr, "%s:%d: FAIL: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                    \
      fputc('\n', stderr);                                             \
    }                                                                  \
  } while (0)

static inline int unit_summary(const char *name) {
  printf("%s: %d passed, %d failed\n", name, unit_passed, unit_failed);
  return unit_failed ? 1 : 0;
}

#endif
