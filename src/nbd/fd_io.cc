#include "nbd/fd_io.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace thindisk::nbd {
namespace {

// Waits until `fd` is readable (OK) or `cancel_fd` is (kBusy).
Status WaitReadable(int fd, int cancel_fd) {
  if (cancel_fd < 0) return Status::Ok();
  pollfd fds[2] = {{fd, POLLIN, 0}, {cancel_fd, POLLIN, 0}};
  for (;;) {
    int n = poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "poll");
    }
    if (fds[1].revents) return Status::Busy("cancelled");
    if (fds[0].revents) return Status::Ok();
  }
}

}  // namespace

bool IsSocket(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

Result<size_t> ReadAtLeast(int fd, std::span<uint8_t> buf, size_t min, int cancel_fd) {
  size_t done = 0;
  bool try_first = cancel_fd >= 0;
  while (done < min) {
    if (try_first) {
      // A busy client has its next bytes queued already: take them without
      // the poll (a syscall per read on the hot path). The poll below still
      // runs whenever the socket is empty, and connections check the
      // shutdown flag between requests, so cancellation is not delayed.
      ssize_t n = recv(fd, buf.data() + done, buf.size() - done, MSG_DONTWAIT);
      if (n > 0) {
        done += size_t(n);
        continue;
      }
      if (n == 0) {
        if (done == 0) return Status::NotFound("end of stream");
        return Status(Code::kIoError, "connection closed mid-message");
      }
      if (errno == ENOTSOCK) {
        try_first = false;  // a pipe (--stdio): poll, then read
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return Status::FromErrno(errno, "read");
      }
    }
    TD_RETURN_IF_ERROR(WaitReadable(fd, cancel_fd));
    ssize_t n = read(fd, buf.data() + done, buf.size() - done);
    if (n < 0) {
      // EAGAIN after poll said readable is spurious; without a cancel fd it
      // is a receive timeout (SO_RCVTIMEO) and ends the wait.
      if (errno == EINTR || (errno == EAGAIN && cancel_fd >= 0)) continue;
      return Status::FromErrno(errno, "read");
    }
    if (n == 0) {
      if (done == 0) return Status::NotFound("end of stream");
      return Status(Code::kIoError, "connection closed mid-message");
    }
    done += size_t(n);
  }
  return done;
}

Status ReadExact(int fd, std::span<uint8_t> buf, int cancel_fd) {
  if (buf.empty()) return Status::Ok();
  Result<size_t> n = ReadAtLeast(fd, buf, buf.size(), cancel_fd);
  return n.has_value() ? Status::Ok() : n.error();
}

Status WriteAllV(int fd, std::span<const iovec> iov_in) {
  std::vector<iovec> iov(iov_in.begin(), iov_in.end());
  size_t first = 0;
  bool is_socket = true;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    // IOV_MAX is at least 1024 on Linux; replies use a handful of pieces.
    const int count = int(std::min<size_t>(iov.size() - first, 1024));
    ssize_t n;
    if (is_socket) {
      msghdr msg{};
      msg.msg_iov = &iov[first];
      msg.msg_iovlen = size_t(count);
      n = sendmsg(fd, &msg, MSG_NOSIGNAL);
      if (n < 0 && errno == ENOTSOCK) {
        is_socket = false;
        continue;
      }
    } else {
      n = writev(fd, &iov[first], count);
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::FromErrno(errno, "write");
    }
    first += SkipIov(std::span<iovec>(iov).subspan(first), size_t(n));
  }
  return Status::Ok();
}

size_t SkipIov(std::span<iovec> iov, size_t n) {
  size_t first = 0;
  while (n > 0 && first < iov.size()) {
    iovec& v = iov[first];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      ++first;
    } else {
      v.iov_base = static_cast<uint8_t*>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
  return first;
}

Result<size_t> TrySendV(int fd, std::span<const iovec> iov) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov.data());
  msg.msg_iovlen = std::min<size_t>(iov.size(), 1024);
  for (;;) {
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return size_t(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t(0);
    if (errno == ENOTSOCK) return Status::NotSupported("not a socket");
    return Status::FromErrno(errno, "write");
  }
}

Status WriteAll(int fd, std::span<const uint8_t> buf) {
  iovec iov{const_cast<uint8_t*>(buf.data()), buf.size()};
  return WriteAllV(fd, std::span<const iovec>(&iov, 1));
}

}  // namespace thindisk::nbd
