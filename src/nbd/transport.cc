#include "nbd/transport.h"

#include <sys/socket.h>

#include <algorithm>

#include "nbd/fd_io.h"

namespace thindisk::nbd {

Status Transport::ReadExact(std::span<uint8_t> buf) {
  if (buf.empty()) return Status::Ok();
  Result<size_t> n = ReadAtLeast(buf, buf.size());
  return n.has_value() ? Status::Ok() : n.error();
}

Status Transport::Skip(uint64_t length) {
  uint8_t scratch[64 * 1024];
  while (length > 0) {
    const size_t n = size_t(std::min<uint64_t>(length, sizeof scratch));
    Status s = ReadExact(std::span<uint8_t>(scratch, n));
    if (!s.ok()) {
      return s.code() == Code::kNotFound
                 ? Status(Code::kIoError, "connection closed mid-message")
                 : s;
    }
    length -= n;
  }
  return Status::Ok();
}

Status Transport::WriteAll(std::span<const uint8_t> buf) {
  iovec iov{const_cast<uint8_t*>(buf.data()), buf.size()};
  return WriteAllV(std::span<const iovec>(&iov, 1));
}

Result<size_t> FdTransport::ReadAtLeast(std::span<uint8_t> buf, size_t min) {
  return nbd::ReadAtLeast(in_fd_, buf, min, cancel_fd_);
}

Status FdTransport::WriteAllV(std::span<const iovec> iov) { return nbd::WriteAllV(out_fd_, iov); }

Result<size_t> FdTransport::TrySendV(std::span<const iovec> iov) {
  return nbd::TrySendV(out_fd_, iov);
}

void FdTransport::Shutdown() {
  (void)shutdown(out_fd_, SHUT_RDWR);  // ENOTSOCK for pipes: nothing to cut
  if (in_fd_ != out_fd_) (void)shutdown(in_fd_, SHUT_RDWR);
}

}  // namespace thindisk::nbd
