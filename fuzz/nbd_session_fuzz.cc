// libFuzzer target: hostile bytes as everything an NBD client sends (the
// handshake and then transmission), fed to one server Connection over a
// socketpair, with a 1 MiB in-memory export. The server's replies are
// drained and dropped. Any outcome but a crash, a sanitizer report or a
// hang is fine (DESIGN.md rule 4).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "nbd/connection.h"
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
  }
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
