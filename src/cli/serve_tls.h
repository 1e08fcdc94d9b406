// The TLS options of `thindisk serve`, in two spellings:
//
//  - thindisk's own (nbdkit-like): --tls-creds DIR (X.509: ca-cert.pem,
//    server-cert.pem, server-key.pem, optional ca-crl.pem), --tls-psk FILE,
//    --tls=off|on|require, --tls-verify-peer[=false], --tls-authz FILE
//    (qemu's authz-list-file JSON), --tls-allow PATTERN (repeatable glob);
//  - qemu-nbd's: --object tls-creds-x509,id=ID,dir=DIR,endpoint=server
//    [,verify-peer=on|off], --object tls-creds-psk,id=ID,dir=DIR,
//    endpoint=server (DIR/keys.psk), --object authz-simple,id=ID,
//    identity=DN, --object authz-list-file,id=ID,filename=FILE, with
//    --tls-creds ID and --tls-authz ID naming them.
//
// So a qemu-nbd TLS command line runs unchanged. docs/tls.md has the rest.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nbd/tls.h"
#include "nbdclient/list_exports.h"
#include "util/result.h"

namespace CLI {
class App;
}

namespace thindisk::cli {

class ServeTlsOptions {
 public:
  // Adds the options (and --object) to `sub`.
  void Register(CLI::App* sub);
  // What the options ask for: nullptr when TLS is off (no credentials, or
  // --tls=off). Errors name the option.
  Result<std::shared_ptr<nbd::TlsServer>> Build() const;
  // A description for the log line when serving ("TLS required (X.509,
  // client certificates verified)").
  static std::string Describe(const nbd::TlsServer& tls);
  // The same options read as a client's, for -L/--list (as qemu-nbd -L):
  // --tls-creds DIR (a client's layout) or the id of an --object
  // tls-creds-x509/tls-creds-psk with endpoint=client, --tls-hostname,
  // --tls, --tls-verify-peer. A server's options are refused by name.
  Result<nbdclient::ListTls> ListSettings() const;

 private:
  Result<nbd::TlsSettings> Settings() const;

  std::string creds_;  // DIR, or an --object's id
  std::string psk_;
  std::string mode_;
  bool verify_peer_ = true;
  std::string authz_;  // FILE, or an --object's id
  std::vector<std::string> allow_;
  std::string priority_;
  std::vector<std::string> objects_;
  std::string hostname_;  // qemu-nbd's --tls-hostname: a client's (-L) only
};

}  // namespace thindisk::cli
