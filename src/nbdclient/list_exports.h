// nbdclient::ListExports: `thindisk serve -L`, qemu-nbd's list mode.
// Connects to an NBD server as a client, lists its exports (NBD_OPT_LIST),
// asks each for its details
// (NBD_OPT_INFO, NBD_OPT_LIST_META_CONTEXT) and prints them in qemu-nbd
// -L's layout, so scripts that parse one parse the other:
//
//   exports available: 1
//    export: 'one'
//     description: text          (only when non-empty)
//     size:  16777216
//     flags: 0xced ( flush fua trim zeroes df cache fast-zero )
//     min block: 1               (these three when the server sends them)
//     opt block: 4096
//     max block: 33554432
//     available meta contexts: 1 (when there are any)
//      base:allocation
//
// The flags are rebuilt from what libnbd reports per flag (all of NBD's
// transmission flags but RESIZE, which libnbd does not expose).
//
// It lives in the NBD client module (nbdclient/nbd_module.h): the binary
// calls nbd_module::ListExports.
#pragma once

#include <cstdint>
#include <string>

#include "nbd/tls.h"  // TlsMode
#include "util/result.h"

namespace thindisk::nbdclient {

// -L's TLS, a client's (the server's certificate checked against the CA in
// x509_dir, a client certificate shown when there is one; or a PSK).
struct ListTls {
  // kOn: STARTTLS asked for, plaintext when the server has no TLS;
  // kRequire: nothing but TLS.
  nbd::TlsMode mode = nbd::TlsMode::kOff;
  std::string x509_dir;  // ca-cert.pem, client-cert.pem, client-key.pem
  std::string psk_file;  // username:hexkey lines
  std::string username;  // the PSK user
  std::string hostname;  // the name the server's certificate must carry
  bool verify_peer = true;
};

struct ListTarget {
  std::string unix_socket;  // when set, used instead of TCP
  std::string host = "127.0.0.1";
  uint16_t port = 10809;
  ListTls tls;

  // The server as errors name it: the socket's path, or HOST:PORT.
  std::string Server() const {
    return unix_socket.empty() ? host + ":" + std::to_string(port) : unix_socket;
  }
};

// Prints the listing on stdout. Errors name the server that could not be
// reached or listed.
Status ListExports(const ListTarget& target);

}  // namespace thindisk::nbdclient
