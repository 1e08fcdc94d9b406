#pragma once
// TLS credentials of the NBD server (private to src/nbd: tls_gnutls.cc and
// tls_credentials.cc): --tls-creds DIR or --tls-psk FILE, loaded and
// checked, and the GnuTLS priority they are used with.

#include <gnutls/gnutls.h>

#include <memory>
#include <string>

#include "nbd/tls.h"
#include "util/result.h"

namespace thindisk::nbd {

inline std::string GnutlsMessage(int r) { return gnutls_strerror(r); }

// GnuTLS credentials and the priority they are used with. Immutable after
// Load: sessions running on old credentials keep them alive.
class TlsCredentials {
 public:
  static Result<std::shared_ptr<const TlsCredentials>> Load(const TlsSettings& s);
  ~TlsCredentials() {
    if (x509_) gnutls_certificate_free_credentials(x509_);
    if (psk_) gnutls_psk_free_server_credentials(psk_);
    if (priority_) gnutls_priority_deinit(priority_);
  }

  // Sets this credential's priority and credentials on `session`.
  int Apply(gnutls_session_t session, bool verify_peer) const {
    int r = gnutls_priority_set(session, priority_);
    if (r < 0) return r;
    if (x509_) {
      r = gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, x509_);
      if (r < 0) return r;
      gnutls_certificate_server_set_request(session,
                                            verify_peer ? GNUTLS_CERT_REQUIRE : GNUTLS_CERT_IGNORE);
      if (verify_peer) gnutls_session_set_verify_cert(session, nullptr, 0);
      return 0;
    }
    return gnutls_credentials_set(session, GNUTLS_CRD_PSK, psk_);
  }
  bool psk() const { return psk_ != nullptr; }

 private:
  TlsCredentials() = default;
  gnutls_certificate_credentials_t x509_ = nullptr;
  gnutls_psk_server_credentials_t psk_ = nullptr;
  gnutls_priority_t priority_ = nullptr;
};

}  // namespace thindisk::nbd
