// --fork for `thindisk serve`: run the server as a background process and
// let the command return once it serves, as qemu-nbd --fork does.
//
// ForkServer() forks; the child detaches (new session, stdin from
// /dev/null) and carries on starting the server, the parent waits on a
// pipe. The child reports exactly once:
//  - Ready(): the server listens, its pid file is written and its URIs are
//    printed. The child's stdout becomes /dev/null (so `$(thindisk serve
//    --fork ...)` returns) and the parent returns success (exit 0).
//  - Failed(status) (or exiting without a word): the parent returns that
//    error (the child's message, or how it died), so the command exits
//    non-zero with the reason on its stderr.
// The child keeps the parent's stderr for later warnings, as qemu-nbd does.
//
// REQUIRES: no thread has been started yet (fork copies only the calling
// thread: ForkServer runs before any image is opened or server created).
#pragma once

#include <optional>

#include "util/result.h"

namespace thindisk::cli {

// The child's end of the pipe.
class ForkReport {
 public:
  explicit ForkReport(int fd) : fd_(fd) {}
  ForkReport(ForkReport&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  ForkReport& operator=(ForkReport&& other) noexcept;
  ~ForkReport();

  // The server is up: the parent exits 0.
  void Ready();
  // Starting failed: the parent prints `status` and exits non-zero. Does
  // nothing after Ready() (the parent is gone).
  void Failed(const Status& status);
  bool reported() const { return fd_ < 0; }

 private:
  int fd_;
};

// In the child: the report to make. In the parent: nullopt once the child
// reported Ready, or the child's error. Errors of its own: fork or pipe
// failing.
Result<std::optional<ForkReport>> ForkServer();

}  // namespace thindisk::cli
