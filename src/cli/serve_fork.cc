#include "cli/serve_fork.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>

namespace thindisk::cli {
namespace {

// The pipe protocol: the child writes one byte, kReadyByte, or kErrorByte
// followed by the message, then closes its end.
constexpr char kReadyByte = 'R';
constexpr char kErrorByte = 'E';

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the parent is gone: nobody to tell
    data += n;
    size -= size_t(n);
  }
}

// How a child that reported nothing ended.
Status ChildDied(pid_t pid) {
  int wstatus = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &wstatus, 0);
  } while (r < 0 && errno == EINTR);
  if (r < 0) return Status::FromErrno(errno, "--fork: waiting for the server process");
  if (WIFSIGNALED(wstatus)) {
    return Status::Internal("--fork: the server process was killed by signal " +
                            std::to_string(WTERMSIG(wstatus)) + " before it was ready");
  }
  return Status::Internal("--fork: the server process exited with status " +
                          std::to_string(WEXITSTATUS(wstatus)) + " before it was ready");
}

// The parent: reads the child's report until EOF.
Status AwaitChild(int fd, pid_t pid) {
  std::string report;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    report.append(buf, size_t(n));
    if (report[0] == kReadyByte) break;  // the child keeps running
  }
  ::close(fd);
  if (!report.empty() && report[0] == kReadyByte) return Status::Ok();
  if (!report.empty() && report[0] == kErrorByte) {
    (void)ChildDied(pid);  // reap it; its message says more than its status
    return Status::InvalidArgument(report.substr(1));
  }
  return ChildDied(pid);
}

}  // namespace

ForkReport::~ForkReport() {
  if (fd_ >= 0) ::close(fd_);
}

ForkReport& ForkReport::operator=(ForkReport&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void ForkReport::Ready() {
  if (fd_ < 0) return;
  // Nothing more goes to the caller's stdout: a $(...) around the command
  // must see EOF once the parent exits.
  std::fflush(stdout);
  int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0) {
    ::dup2(null, STDOUT_FILENO);
    ::close(null);
  }
  WriteAll(fd_, &kReadyByte, 1);
  ::close(fd_);
  fd_ = -1;
}

void ForkReport::Failed(const Status& status) {
  if (fd_ < 0) return;
  std::string msg = kErrorByte + status.message();
  WriteAll(fd_, msg.data(), msg.size());
  ::close(fd_);
  fd_ = -1;
}

Result<std::optional<ForkReport>> ForkServer() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "--fork: pipe");
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return Status::FromErrno(e, "--fork: fork");
  }
  if (pid > 0) {
    ::close(fds[1]);
    TD_RETURN_IF_ERROR(AwaitChild(fds[0], pid));
    return std::optional<ForkReport>();
  }
  // The child: its own session (no controlling terminal, no SIGHUP when
  // the caller's terminal goes), nothing to read on stdin.
  ::close(fds[0]);
  (void)::setsid();
  int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null >= 0) {
    ::dup2(null, STDIN_FILENO);
    ::close(null);
  }
  return std::optional<ForkReport>(ForkReport(fds[1]));
}

}  // namespace thindisk::cli
