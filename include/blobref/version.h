/* The release version of blobrefd and blobref: the one place it is written (CHANGELOG's newest
 * "## X.Y.Z" heading must match it; tests/integration/test_cli_conventions.py checks both). */
#ifndef BLOBREF_VERSION_H
#define BLOBREF_VERSION_H

#define BLOBREF_VERSION "0.3.0"

#endif
