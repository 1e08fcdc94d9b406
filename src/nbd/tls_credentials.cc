#include "nbd/tls_credentials.h"

#include <gnutls/x509.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>

namespace thindisk::nbd {
namespace {

// A file the credentials need: missing or unreadable is the user's error.
Status Readable(const std::string& path, const std::string& what) {
  if (access(path.c_str(), R_OK) == 0) return Status::Ok();
  return Status::InvalidArgument(path + ": " + std::strerror(errno) + " (" + what + ")");
}

// A PSK file: `username:hexkey` lines, at least one (GnuTLS reads the file
// again at each handshake; this only makes a bad file an error at start).
Status CheckPskFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument(path + ": " + std::strerror(errno));
  std::string line;
  size_t entries = 0;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const size_t colon = line.find(':');
    const std::string key = colon == std::string::npos ? "" : line.substr(colon + 1);
    const bool hex = !key.empty() && key.size() % 2 == 0 &&
                     std::all_of(key.begin(), key.end(), [](unsigned char c) {
                       return std::isxdigit(c) != 0;
                     });
    if (colon == 0 || colon == std::string::npos || !hex) {
      return Status::InvalidArgument(path + ":" + std::to_string(n) +
                                     ": expected username:hexkey (psktool's format)");
    }
    ++entries;
  }
  if (entries == 0) return Status::InvalidArgument(path + ": no username:hexkey line");
  return Status::Ok();
}

// The server's certificate must be valid now: every client would refuse
// it otherwise (qemu refuses to start too).
Status CheckValidNow(gnutls_certificate_credentials_t creds, const std::string& path) {
  gnutls_datum_t der{};
  if (gnutls_certificate_get_crt_raw(creds, 0, 0, &der) < 0) return Status::Ok();
  gnutls_x509_crt_t crt;
  if (gnutls_x509_crt_init(&crt) < 0) return Status::Ok();
  Status out;
  if (gnutls_x509_crt_import(crt, &der, GNUTLS_X509_FMT_DER) >= 0) {
    const time_t now = time(nullptr);
    const time_t from = gnutls_x509_crt_get_activation_time(crt);
    const time_t until = gnutls_x509_crt_get_expiration_time(crt);
    auto when = [](time_t t) {
      char buf[64];
      struct tm tm {};
      gmtime_r(&t, &tm);
      strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
      return std::string(buf);
    };
    if (until != time_t(-1) && until < now)
      out = Status::InvalidArgument(path + ": the server's certificate expired on " + when(until));
    else if (from != time_t(-1) && from > now)
      out = Status::InvalidArgument(path + ": the server's certificate is not valid before " +
                                    when(from));
  }
  gnutls_x509_crt_deinit(crt);
  return out;
}

}  // namespace

Result<std::shared_ptr<const TlsCredentials>> TlsCredentials::Load(const TlsSettings& s) {
  std::shared_ptr<TlsCredentials> c(new TlsCredentials);
  auto fail = [](const std::string& what, int r) {
    return Status::InvalidArgument(what + ": " + GnutlsMessage(r));
  };
  std::string priority = s.priority.empty() ? kDefaultTlsPriority : s.priority;
  if (!s.x509_dir.empty()) {
    const std::string ca = s.x509_dir + "/ca-cert.pem";
    const std::string cert = s.x509_dir + "/server-cert.pem";
    const std::string key = s.x509_dir + "/server-key.pem";
    const std::string crl = s.x509_dir + "/ca-crl.pem";
    TD_RETURN_IF_ERROR(Readable(cert, "the server's certificate"));
    TD_RETURN_IF_ERROR(Readable(key, "the server's private key"));
    if (s.verify_peer) TD_RETURN_IF_ERROR(Readable(ca, "the CA that signs client certificates"));
    int r = gnutls_certificate_allocate_credentials(&c->x509_);
    if (r < 0) return fail("TLS credentials", r);
    if (access(ca.c_str(), R_OK) == 0) {
      r = gnutls_certificate_set_x509_trust_file(c->x509_, ca.c_str(), GNUTLS_X509_FMT_PEM);
      if (r < 0) return fail(ca, r);
      if (r == 0) return Status::InvalidArgument(ca + ": no certificate in it");
    }
    if (access(crl.c_str(), F_OK) == 0) {
      r = gnutls_certificate_set_x509_crl_file(c->x509_, crl.c_str(), GNUTLS_X509_FMT_PEM);
      if (r < 0) return fail(crl, r);
    }
    r = gnutls_certificate_set_x509_key_file(c->x509_, cert.c_str(), key.c_str(),
                                             GNUTLS_X509_FMT_PEM);
    if (r < 0) return fail(cert + " with " + key, r);
    TD_RETURN_IF_ERROR(CheckValidNow(c->x509_, cert));
    r = gnutls_certificate_set_known_dh_params(c->x509_, GNUTLS_SEC_PARAM_MEDIUM);
    if (r < 0) return fail("TLS DH parameters", r);
  } else {
    TD_RETURN_IF_ERROR(CheckPskFile(s.psk_file));
    int r = gnutls_psk_allocate_server_credentials(&c->psk_);
    if (r < 0) return fail("TLS PSK credentials", r);
    r = gnutls_psk_set_server_credentials_file(c->psk_, s.psk_file.c_str());
    if (r < 0) return fail(s.psk_file, r);
    r = gnutls_psk_set_server_known_dh_params(c->psk_, GNUTLS_SEC_PARAM_MEDIUM);
    if (r < 0) return fail("TLS DH parameters", r);
    if (s.priority.empty()) priority += ":+ECDHE-PSK:+DHE-PSK:+PSK";
  }
  const char* where = nullptr;
  int r = gnutls_priority_init(&c->priority_, priority.c_str(), &where);
  if (r < 0) {
    return fail("TLS priority '" + priority + "'" + (where ? " at '" + std::string(where) + "'" : ""),
                r);
  }
  return std::shared_ptr<const TlsCredentials>(std::move(c));
}

}  // namespace thindisk::nbd
