/* HTTPS: the certificate and key of [server] tls_cert / tls_key, checked with OpenSSL (the key
 * matches, the certificate is within its validity period) and handed to libmicrohttpd's GnuTLS
 * per handshake through MHD_OPTION_HTTPS_CERT_CALLBACK. A reload (SIGHUP) publishes a new pair
 * for the handshakes that follow; connections already open keep theirs and are never dropped.
 * (libmicrohttpd 0.9.75 cannot swap the certificate of a running daemon, and a second daemon on
 * the same port would need MHD_quiesce_daemon, which races the thread pool's epoll sets.)
 * Protocol versions and cipher suites are [server] tls_priorities (a GnuTLS priority string
 * checked when the config loads; by default TLS 1.2 and 1.3, AEAD, ECDHE), which start_daemon
 * passes as MHD_OPTION_HTTPS_PRIORITIES; a reload cannot change them. */
#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/httpd.h"

#define MAX_CHAIN 16
#define MAX_PEM (1u << 20)

/* One certificate chain and its key, immutable once published. Retired pairs are freed when the
 * server stops (a handshake may still be using one). */
struct tls_pair {
  gnutls_pcert_st chain[MAX_CHAIN];
  unsigned nchain;
  gnutls_privkey_t key;
  struct tls_pair *retired_next;
};

static _Atomic(struct tls_pair *) current;
static struct tls_pair *retired;

static void pair_free(struct tls_pair *p) {
  if (!p) return;
  for (unsigned i = 0; i < p->nchain; i++) gnutls_pcert_deinit(&p->chain[i]);
  if (p->key) gnutls_privkey_deinit(p->key);
  free(p);
}

static int read_pem(const char *what, const char *path, char **text, size_t *len, br_err *err) {
  br_source *src = br_source_open_file(path, err);
  if (!src) return br_fail(err, "[server] %s: %s", what, err->msg);
  uint8_t *buf = NULL;
  int rc = br_source_read_all(src, MAX_PEM, &buf, len, err);
  br_source_close(src);
  if (rc < 0) return br_fail(err, "[server] %s: %s: %s", what, path, err->msg);
  *text = (char *)buf;
  return 0;
}

/* The OpenSSL checks that give a clear message: a PEM certificate and key, the key belongs to
 * the certificate, and now is within the certificate's validity period. */
static int check_pair(const char *cert_path, const char *cert, size_t cert_len,
                      const char *key_path, const char *key, size_t key_len, br_err *err) {
  int rc = -1;
  BIO *cb = BIO_new_mem_buf(cert, (int)cert_len), *kb = BIO_new_mem_buf(key, (int)key_len);
  X509 *x = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
  EVP_PKEY *pk = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
  if (!x) {
    br_fail(err, "[server] tls_cert: %s holds no PEM certificate", cert_path);
  } else if (!pk) {
    br_fail(err, "[server] tls_key: %s holds no PEM private key (or it is encrypted)", key_path);
  } else if (X509_check_private_key(x, pk) != 1) {
    br_fail(err, "[server] tls_key: %s does not match the certificate in %s", key_path, cert_path);
  } else if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0) {
    char when[64] = "?";
    BIO *m = BIO_new(BIO_s_mem());
    if (m && ASN1_TIME_print(m, X509_get0_notAfter(x)) == 1) {
      int n = BIO_read(m, when, sizeof when - 1);
      when[n > 0 ? n : 0] = '\0';
    }
    BIO_free(m);
    br_fail(err, "[server] tls_cert: the certificate in %s expired (%s)", cert_path, when);
  } else if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0) {
    br_fail(err, "[server] tls_cert: the certificate in %s is not valid yet", cert_path);
  } else {
    rc = 0;
  }
  X509_free(x);
  EVP_PKEY_free(pk);
  BIO_free(cb);
  BIO_free(kb);
  return rc;
}

static struct tls_pair *load_pair(const char *cert_path, const char *key_path, br_err *err) {
  char *cert = NULL, *key = NULL;
  size_t cert_len = 0, key_len = 0;
  struct tls_pair *p = NULL;
  if (read_pem("tls_cert", cert_path, &cert, &cert_len, err) < 0 ||
      read_pem("tls_key", key_path, &key, &key_len, err) < 0 ||
      check_pair(cert_path, cert, cert_len, key_path, key, key_len, err) < 0)
    goto done;
  p = calloc(1, sizeof *p);
  if (!p) {
    br_fail(err, "out of memory");
    goto done;
  }
  gnutls_datum_t cd = {(unsigned char *)cert, (unsigned)cert_len};
  gnutls_datum_t kd = {(unsigned char *)key, (unsigned)key_len};
  p->nchain = MAX_CHAIN;
  int g = gnutls_pcert_list_import_x509_raw(p->chain, &p->nchain, &cd, GNUTLS_X509_FMT_PEM, 0);
  if (g < 0) {
    p->nchain = 0;
    br_fail(err, "[server] tls_cert: %s: %s", cert_path, gnutls_strerror(g));
  } else if ((g = gnutls_privkey_init(&p->key)) < 0 ||
             (g = gnutls_privkey_import_x509_raw(p->key, &kd, GNUTLS_X509_FMT_PEM, NULL, 0)) < 0) {
    br_fail(err, "[server] tls_key: %s: %s", key_path, gnutls_strerror(g));
  }
  if (g < 0) {
    pair_free(p);
    p = NULL;
  }
done:
  if (key) OPENSSL_cleanse(key, key_len);
  free(cert);
  free(key);
  return p;
}

/* gnutls_certificate_retrieve_function2: the pair current at this handshake. */
static int retrieve(gnutls_session_t session, const gnutls_datum_t *req_ca_dn, int nreqs,
                    const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
                    gnutls_pcert_st **pcert, unsigned int *pcert_length, gnutls_privkey_t *pkey) {
  (void)session, (void)req_ca_dn, (void)nreqs, (void)pk_algos, (void)pk_algos_length;
  struct tls_pair *p = atomic_load(&current);
  if (!p) return -1;
  *pcert = p->chain;
  *pcert_length = p->nchain;
  *pkey = p->key;
  return 0;
}

void *tls_cert_callback(void) { return (void *)retrieve; }

int tls_load(const char *cert_path, const char *key_path, br_err *err) {
  struct tls_pair *p = load_pair(cert_path, key_path, err);
  if (!p) return -1;
  struct tls_pair *old = atomic_exchange(&current, p);
  if (old) {
    old->retired_next = retired;
    retired = old;
  }
  return 0;
}

void tls_unload(void) {
  pair_free(atomic_exchange(&current, NULL));
  while (retired) {
    struct tls_pair *p = retired;
    retired = p->retired_next;
    pair_free(p);
  }
}
