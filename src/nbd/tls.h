// TLS on the NBD server: NBD_OPT_STARTTLS (doc/proto.md, "TLS support"),
// on GnuTLS.
//
// The GnuTLS code (nbd/tls_gnutls.h) lives in a module, thindisk-tls.so,
// loaded by TlsServer::Create (util/module_loader.h says where it is looked
// for): GnuTLS and the eight libraries it brings cost a cold start about
// 10 ms, which every command would pay though only a server with TLS
// credentials uses them. Without the module, or without GnuTLS, a server
// asked for TLS fails to start saying why; everything else works.
//
// TlsServer holds what every session needs: the credentials (X.509 from a
// directory with qemu's file names, or a GnuTLS PSK file), whether client
// certificates are required, and the authorization list (tls_authz.h).
// Handshake() runs the server's side of the TLS handshake on a connection
// whose STARTTLS was just acknowledged and hands back the session as a
// Transport, so the rest of the connection reads and writes through it as
// it would through the plain socket.
//
// Credentials: X.509 reads DIR/ca-cert.pem (the CA that signs clients),
// DIR/server-cert.pem, DIR/server-key.pem and, when present, DIR/ca-crl.pem.
// With verify_peer (the default, as in qemu) a client must present a
// certificate that the CA signed, valid now and not revoked. PSK reads a
// file of `username:hexkey` lines (GnuTLS psktool's format, as qemu and
// nbdkit use); the user name is the client's identity. Reload() (SIGHUP)
// reads everything again: new sessions get the new credentials, sessions
// already running keep theirs; a reload that fails keeps the old ones.
//
// Authorization happens after the handshake: an identity the list refuses
// ends the connection (kBusy "not authorized", naming it), before any NBD
// option is read under TLS.
//
// The session is read by the connection's reader and written by its writer
// thread at once, which GnuTLS allows for one sender and one receiver
// (manual, "Thread safety"); renegotiation does not exist in TLS 1.3 and is
// refused for older versions. Reads poll the cancel descriptor too, so a
// handshake or a read stalled mid-record still ends at shutdown, and the
// server's handshake timeout (shutdown(2) of the socket) covers the TLS
// handshake as well.
//
// Thread safety: TlsServer's methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nbd/transport.h"
#include "util/result.h"

namespace thindisk::nbd {

// --tls: off (STARTTLS refused), on (offered, plaintext allowed too),
// require (nothing but STARTTLS and ABORT before TLS; nbdkit's meaning).
enum class TlsMode { kOff, kOn, kRequire };
Result<TlsMode> ParseTlsMode(std::string_view text);
std::string_view TlsModeName(TlsMode mode);

// Records sent under one TLS 1.3 key before the server renews it: GnuTLS's
// own interval (2^24), within RFC 8446's limit for AES-GCM (5.5: 2^24.5
// full-size records), about 256 GiB of replies.
inline constexpr uint64_t kTlsRekeyRecords = uint64_t{1} << 24;

struct TlsSettings {
  TlsMode mode = TlsMode::kRequire;
  std::string x509_dir;  // --tls-creds DIR
  std::string psk_file;  // --tls-psk FILE (exactly one of the two)
  bool verify_peer = true;  // X.509: require and verify client certificates
  std::string authz_file;   // --tls-authz FILE (qemu authz-list-file JSON)
  std::vector<std::string> allow;  // --tls-allow PATTERN (globs)
  // GnuTLS priority string (--tls-priority; qemu's priority=); empty:
  // kDefaultTlsPriority, plus the PSK key exchanges with a PSK file.
  std::string priority;
  // TLS 1.3: the server renews its sending keys (KeyUpdate) after this many
  // records under one key (0: never). Tests set it low.
  uint64_t rekey_records = kTlsRekeyRecords;
};

// GnuTLS's defaults, with AES-128-GCM preferred over AES-256-GCM: the
// bulk cipher of every byte served, 128-bit security, and about a third
// less CPU for both ends of the connection.
inline constexpr const char* kDefaultTlsPriority =
    "NORMAL:%SERVER_PRECEDENCE:-AES-256-GCM:-CHACHA20-POLY1305:+AES-256-GCM:+CHACHA20-POLY1305";

class TlsServer {
 public:
  // Loads the TLS module, then reads the credentials and the authz file;
  // errors name the file (or say why the module cannot be loaded).
  static Result<std::shared_ptr<TlsServer>> Create(TlsSettings settings);
  virtual ~TlsServer() = default;

  TlsMode mode() const { return settings().mode; }
  virtual const TlsSettings& settings() const = 0;
  // Reads credentials and authz again; on error keeps the current ones.
  virtual Status Reload() = 0;

  // The TLS handshake on (in_fd, out_fd), then authorization. Errors:
  // kIoError for a failed handshake (with GnuTLS's reason), kBusy for a
  // refused identity (named in the message) or a cancelled wait, kNotFound
  // when the client hung up.
  virtual Result<std::unique_ptr<Transport>> Handshake(int in_fd, int out_fd,
                                                       int cancel_fd) const = 0;
};

}  // namespace thindisk::nbd
