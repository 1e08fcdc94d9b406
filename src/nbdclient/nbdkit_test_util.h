// Test helper: an `nbdkit` process serving a plugin on a Unix socket, for
// the tests of any layer that need a real NBD server (nbdclient, block).
// Header-only; nbdkit runs with --exit-with-parent, so it never outlives
// the test, and is killed by the destructor.
#pragma once

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "util/capability_test_util.h"

namespace thindisk::test_env {

// Whether `tool` is on PATH (and not denied by THINDISK_TEST_DENY).
inline bool HaveTool(const char* tool) {
  if (CapabilityDenied(tool)) return false;
  std::string cmd = std::string("command -v ") + tool + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// An nbdkit process serving `args` on a socket in `dir`.
class Nbdkit {
 public:
  Nbdkit(const std::string& dir, std::vector<std::string> args) : socket_(dir + "/nbd.sock") {
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<std::string> argv = {"nbdkit", "-f", "--exit-with-parent", "-U", socket_};
      argv.insert(argv.end(), args.begin(), args.end());
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execvp("nbdkit", cargv.data());
      _exit(127);
    }
    // The socket file appears at bind(), before listen(): wait until a
    // connection is accepted (at most 5 s).
    for (int i = 0; i < 500 && !Accepts(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~Nbdkit() { Kill(); }
  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  bool ready() const { return Accepts(); }
  std::string uri() const { return "nbd+unix:///?socket=" + socket_; }

 private:
  bool Accepts() const {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_.c_str());
    bool ok = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (fd >= 0) ::close(fd);
    return ok;
  }

  std::string socket_;
  pid_t pid_ = -1;
};

}  // namespace thindisk::test_env
