/* Private to the HTTP front: the certificate for HTTPS handshakes (tls.c). */
#ifndef BLOBREF_HTTP_TLS_H
#define BLOBREF_HTTP_TLS_H

#include "blobref/common.h"

/* Loads and checks (key matches, not expired) a PEM pair and makes it the one new handshakes
 * use. Returns -1 with err (the previous pair, if any, stays). Not thread-safe against itself. */
int tls_load(const char *cert_path, const char *key_path, br_err *err);
/* The gnutls_certificate_retrieve_function2 for MHD_OPTION_HTTPS_CERT_CALLBACK. */
void *tls_cert_callback(void);
void tls_unload(void);

#endif
