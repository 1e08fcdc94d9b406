// libFuzzer target: hostile bytes as everything an NBD client sends (the
// handshake and then transmission), fed to one server Connection over a
// socketpair, with a 1 MiB in-memory export. The server's replies are
// drained and dropped. Any outcome but a crash, a sanitizer report or a
// hang is fine (DESIGN.md rule 4).
//
// TLS: the input's size picks the server's --tls mode (size % 3: off, on,
// require), so the corpus explores plaintext sessions, the pre-TLS option
// handling of both TLS modes, and STARTTLS followed by hostile bytes as a
// TLS handshake (PSK credentials from a file written at start-up).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "nbd/connection.h"
#include "nbd/tls.h"
#include "nbd/tls_gnutls.h"
#include "nbd/testing/memory_device.h"

namespace {

using namespace thindisk;

struct World {
  std::vector<nbd::Export> exports;
  nbd::WorkerPool pool{2};
  std::atomic<bool> shutting_down{false};
  int cancel_pipe[2] = {-1, -1};

  World() {
    auto dev = std::make_shared<nbd::testing::MemoryDevice>(1 << 20);
    exports.push_back({"", "default export", dev, false});
    exports.push_back({"ro", "read-only export", dev, true});
    if (pipe2(cancel_pipe, O_CLOEXEC) != 0) abort();
    char dir[] = "/tmp/td-fuzz-tls-XXXXXX";
    if (!mkdtemp(dir)) abort();
    const std::string psk = std::string(dir) + "/keys.psk";
    FILE* f = std::fopen(psk.c_str(), "w");
    if (!f || std::fputs("fuzz:00112233445566778899aabbccddeeff\n", f) < 0 || std::fclose(f) != 0)
      abort();
    // GnuTLS reads the file at each handshake: it goes at exit.
    static std::string dir_at_exit, psk_at_exit;
    dir_at_exit = dir;
    psk_at_exit = psk;
    std::atexit([] {
      std::remove(psk_at_exit.c_str());
      std::remove(dir_at_exit.c_str());
    });
    for (nbd::TlsMode mode : {nbd::TlsMode::kOn, nbd::TlsMode::kRequire}) {
      nbd::TlsSettings settings;
      settings.mode = mode;
      settings.psk_file = psk;
      // The GnuTLS code itself, not the module TlsServer::Create loads: its
      // coverage is the fuzzer's.
      auto server = nbd::CreateGnutlsServer(settings);
      if (!server.has_value()) abort();
      tls.push_back(*server);
    }
  }
  std::vector<std::shared_ptr<nbd::TlsServer>> tls;  // --tls=on, --tls=require
};

World& TheWorld() {
  static World* w = new World;
  return *w;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = TheWorld();
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) abort();
  // The client: sends everything, then half-closes; its reader drains the
  // server's replies so the server never blocks on a full socket.
  std::thread sender([&] {
    size_t done = 0;
    while (done < size) {
      ssize_t n = send(sv[1], data + done, size - done, MSG_NOSIGNAL);
      if (n <= 0) break;
      done += size_t(n);
    }
    shutdown(sv[1], SHUT_WR);
  });
  std::thread drainer([&] {
    char buf[65536];
    while (recv(sv[1], buf, sizeof buf, 0) > 0) {
    }
  });
  {
    nbd::ConnectionOptions opts;
    if (size % 3 != 0) opts.tls = w.tls[size % 3 - 1];
    nbd::Connection conn(sv[0], sv[0], &w.exports, &w.pool, w.cancel_pipe[0], &w.shutting_down,
                         opts);
    (void)conn.Run();
  }
  shutdown(sv[0], SHUT_RDWR);
  sender.join();
  drainer.join();
  close(sv[0]);
  close(sv[1]);
  return 0;
}
