// Blocking whole-buffer reads and writes on a file descriptor (socket, pipe
// or stdio), interruptible by a cancel descriptor.
//
// A connection is a pair of descriptors, so the same code serves sockets,
// stdin/stdout and socket-activated listeners. Writes to sockets use
// MSG_NOSIGNAL so a vanished client is an error, not a SIGPIPE.
//
// Thread safety: plain functions; concurrent writers on one fd must hold a
// lock of their own (replies must not interleave).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <span>

#include "util/result.h"
#include "util/status.h"

namespace thindisk::nbd {

// Reads exactly buf.size() bytes. Returns kNotFound on end of file before
// the first byte (the peer closed cleanly), kIoError on a short stream or a
// read error, and kBusy ("cancelled") when `cancel_fd` (if >= 0) becomes
// readable while waiting.
Status ReadExact(int fd, std::span<uint8_t> buf, int cancel_fd = -1);

// Reads at least `min` and at most buf.size() bytes (what is already
// queued, without waiting for more once `min` is met); returns how many.
// Errors as ReadExact. The connection reads several requests per call.
Result<size_t> ReadAtLeast(int fd, std::span<uint8_t> buf, size_t min, int cancel_fd = -1);

// Whether `fd` is a socket (not a pipe or a file: --stdio).
bool IsSocket(int fd);

// Writes every byte of every iovec, resuming after partial writes.
Status WriteAllV(int fd, std::span<const iovec> iov);
Status WriteAll(int fd, std::span<const uint8_t> buf);

// Moves past the first `n` bytes of `iov` (a partial write's share): the
// iovecs they cover whole are passed over, and the one they end inside
// starts after them. Returns how many iovecs were passed over.
size_t SkipIov(std::span<iovec> iov, size_t n);

// Sends what the socket takes now without blocking (MSG_DONTWAIT): returns
// the bytes sent, 0 when the socket is full; kNotSupported when `fd` is not
// a socket (a pipe: the caller falls back to blocking writes).
Result<size_t> TrySendV(int fd, std::span<const iovec> iov);

}  // namespace thindisk::nbd
