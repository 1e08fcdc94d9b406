// Transport: the byte stream one NBD connection talks over.
//
// A Connection reads requests and writes replies through a Transport and
// never sees what carries the bytes: FdTransport is a pair of plain
// descriptors (a socket twice, stdin/stdout, a test's socketpair),
// TlsTransport (tls.h) a TLS session on them after NBD_OPT_STARTTLS. So
// the request loop, the inline fast path, stdio mode and the fuzzer are one
// path whatever the transport.
//
// Every read also watches the connection's cancel descriptor: a read that
// would wait returns kBusy ("cancelled") once it becomes readable (server
// shutdown). End of stream before the first byte of a read is kNotFound (the
// peer closed cleanly), in the middle of one kIoError.
//
// Thread safety: one reader thread and one writer thread may use a
// transport at once (reads never touch what writes touch); two writers need
// a lock of their own (replies must not interleave).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>

#include "util/result.h"
#include "util/status.h"

namespace thindisk::nbd {

class Transport {
 public:
  virtual ~Transport() = default;

  // Reads at least `min` and at most buf.size() bytes: what has arrived,
  // without waiting for more once `min` is met. Returns how many.
  virtual Result<size_t> ReadAtLeast(std::span<uint8_t> buf, size_t min) = 0;
  // Writes every byte of every iovec (blocking).
  virtual Status WriteAllV(std::span<const iovec> iov) = 0;
  // Sends what goes out now without blocking: the bytes sent, 0 when the
  // stream is full; kNotSupported when this transport cannot (a pipe, a
  // TLS session): the caller then writes through WriteAllV only.
  virtual Result<size_t> TrySendV(std::span<const iovec> iov) = 0;
  // True when bytes a TrySendV consumed still wait inside the transport
  // (a TLS session's records the socket did not take): the next WriteAllV
  // sends them first, so someone must call it.
  virtual bool HasUnsent() const { return false; }
  // Ends the stream in both directions, so a reader blocked in it wakes
  // (a socket's shutdown(2); nothing for pipes).
  virtual void Shutdown() = 0;

  Status ReadExact(std::span<uint8_t> buf);
  // Reads and drops `length` bytes through a small buffer (the payload of a
  // rejected WRITE costs no memory).
  Status Skip(uint64_t length);
  Status WriteAll(std::span<const uint8_t> buf);
};

// Plain descriptors (fd_io.h). `cancel_fd` < 0: reads are not cancellable.
class FdTransport final : public Transport {
 public:
  FdTransport(int in_fd, int out_fd, int cancel_fd)
      : in_fd_(in_fd), out_fd_(out_fd), cancel_fd_(cancel_fd) {}

  Result<size_t> ReadAtLeast(std::span<uint8_t> buf, size_t min) override;
  Status WriteAllV(std::span<const iovec> iov) override;
  Result<size_t> TrySendV(std::span<const iovec> iov) override;
  void Shutdown() override;

 private:
  const int in_fd_;
  const int out_fd_;
  const int cancel_fd_;
};

}  // namespace thindisk::nbd
