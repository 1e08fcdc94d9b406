#include "nbd/listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace thindisk::nbd {
namespace {

// Pending connections the kernel queues before accept().
constexpr int kBacklog = 128;

}  // namespace

Result<int> ListenUnix(const std::string& path, UnixListenOptions options) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    return Status::InvalidArgument("unix socket path must be 1.." +
                                   std::to_string(sizeof addr.sun_path - 1) +
                                   " bytes: " + path);
  struct stat st;
  const bool exists = lstat(path.c_str(), &st) == 0;
  if (exists && !S_ISSOCK(st.st_mode))
    return Status::InvalidArgument(path + " exists and is not a socket");
  // bind() makes the file before listen() lets clients in: one that sees
  // the file in between is refused (ECONNREFUSED). So the socket is bound
  // under a name of its own beside PATH and renamed onto it once it
  // listens, which also replaces a stale socket of an earlier server in
  // one step. A PATH too long for that suffix is bound directly.
  const std::string temp = path + ".td-" + std::to_string(getpid());
  const bool staged = temp.size() < sizeof addr.sun_path;
  const std::string& bound = staged ? temp : path;
  if (staged) {
    unlink(temp.c_str());  // left by a killed server that had our pid
  } else if (exists) {
    unlink(path.c_str());  // a stale socket from an earlier server
  }
  std::memcpy(addr.sun_path, bound.c_str(), bound.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "socket");
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0 ||
      (options.mode != 0 && chmod(bound.c_str(), options.mode) < 0) ||
      listen(fd, options.backlog) < 0 || (staged && rename(temp.c_str(), path.c_str()) < 0)) {
    int e = errno;
    close(fd);
    if (staged) unlink(temp.c_str());
    return Status::FromErrno(e, "listen on " + path);
  }
  return fd;
}

Result<int> ListenTcp(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  int rc =
      getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0)
    return Status::InvalidArgument("cannot resolve " + host + ": " + gai_strerror(rc));
  Status last = Status::NotFound("no address for " + host);
  int fd = -1;
  for (addrinfo* ai = list; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = Status::FromErrno(errno, "socket");
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, kBacklog) < 0) {
      last = Status::FromErrno(errno, "listen on " + host + ":" + service);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(list);
  if (fd < 0) return last;
  return fd;
}

Result<uint16_t> BoundPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) < 0)
    return Status::FromErrno(errno, "getsockname");
  if (ss.ss_family == AF_INET)
    return uint16_t(ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port));
  if (ss.ss_family == AF_INET6)
    return uint16_t(ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port));
  return Status::InvalidArgument("not a TCP socket");
}

std::string DescribePeer(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  const std::string fallback = "fd " + std::to_string(fd);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) < 0) return fallback;
  char host[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    if (!inet_ntop(AF_INET, &in->sin_addr, host, sizeof host)) return fallback;
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (!inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host)) return fallback;
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  if (ss.ss_family == AF_UNIX) {
    // Unix clients rarely bind a name; the kernel knows who connected.
    ucred cred{};
    socklen_t clen = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0 && cred.pid > 0)
      return "unix socket (pid " + std::to_string(cred.pid) + ", uid " +
             std::to_string(cred.uid) + ")";
    return "unix socket";
  }
  return fallback;
}

Result<std::vector<int>> SocketActivationFds() {
  // sd_listen_fds(3): descriptors start at 3 (SD_LISTEN_FDS_START).
  constexpr int kFirstFd = 3;
  std::vector<int> fds;
  const char* pid = getenv("LISTEN_PID");
  const char* count = getenv("LISTEN_FDS");
  if (!pid || !count) return fds;
  char* end = nullptr;
  const long listen_pid = strtol(pid, &end, 10);
  if (*end != '\0' || listen_pid != long(getpid())) return fds;
  const long n = strtol(count, &end, 10);
  if (*end != '\0' || n < 1 || n > 64)
    return Status::InvalidArgument(std::string("bad LISTEN_FDS: ") + count);
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  for (int fd = kFirstFd; fd < kFirstFd + n; ++fd) {
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    fds.push_back(fd);
  }
  return fds;
}

}  // namespace thindisk::nbd
