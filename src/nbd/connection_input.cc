// The reader's input: the read-ahead buffer of the transmission phase,
// and waiting for the client's next bytes (the ring's reads reaped
// meanwhile, or a spin for a lone client's next request).
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "nbd/connection.h"

namespace thindisk::nbd {

Status Connection::Buffer(size_t need) {
  if (rend_ - rpos_ >= need) return Status::Ok();
  if (rpos_ > 0) {
    std::memmove(rbuf_.data(), rbuf_.data() + rpos_, rend_ - rpos_);
    rend_ -= rpos_;
    rpos_ = 0;
  }
  TD_RETURN_IF_ERROR(WaitForRequest());
  Result<size_t> n =
      transport_->ReadAtLeast(std::span<uint8_t>(rbuf_).subspan(rend_), need - rend_);
  if (!n.has_value()) {
    if (n.error().code() == Code::kNotFound && rend_ > 0)
      return Status(Code::kIoError, "connection closed mid-message");
    return n.error();
  }
  rend_ += *n;
  return Status::Ok();
}

Status Connection::TakeInto(std::span<uint8_t> out) {
  const size_t have = std::min(out.size(), rend_ - rpos_);
  if (have > 0) std::memcpy(out.data(), rbuf_.data() + rpos_, have);
  rpos_ += have;
  std::span<uint8_t> rest = out.subspan(have);
  if (rest.empty()) return Status::Ok();
  if (rest.size() > rbuf_.size() / 2) return transport_->ReadExact(rest);
  TD_RETURN_IF_ERROR(Buffer(rest.size()));
  std::memcpy(rest.data(), rbuf_.data() + rpos_, rest.size());
  rpos_ += rest.size();
  return Status::Ok();
}

Status Connection::Drop(uint64_t length) {
  const size_t have = size_t(std::min<uint64_t>(length, rend_ - rpos_));
  rpos_ += have;
  return transport_->Skip(length - have);
}

Status Connection::WaitForRequest() {
  if (async_) TD_RETURN_IF_ERROR(async_->Submit());
  // Spin only for a client that sends one request at a time and waits for
  // its reply (lone_requests_), and only when it has every reply: its next
  // request is then what ends the wait, and it comes soon. With requests
  // out (on the pool or the ring) it may come only after a reply; and a
  // client that pipelines keeps the CPUs busy itself (with workers and the
  // kernel's writeback beside it, a spinning reader was seen to cost 4 KiB
  // writes at QD16 a third and more in some runs).
  if (spin_ && lone_requests_ >= kLoneRequests &&
      on_pool_.load(std::memory_order_acquire) == 0)
    SpinForRequest();
  if (!async_) return Status::Ok();
  while (async_->pending() > 0) {
    pollfd fds[3] = {
        {in_fd_, POLLIN, 0}, {async_->fd(), POLLIN, 0}, {cancel_fd_, POLLIN, 0}};
    const int n = poll(fds, cancel_fd_ >= 0 ? 3 : 2, -1);
    if (n < 0 && errno != EINTR) return Status::FromErrno(errno, "poll");
    if (n <= 0) continue;
    if (fds[1].revents != 0) ReapRing(0);
    if (fds[0].revents != 0) return Status::Ok();  // the transport reads it (or its end)
    if (cancel_fd_ >= 0 && fds[2].revents != 0) return Status::Busy("cancelled");
  }
  return Status::Ok();
}

void Connection::SpinForRequest() {
  busy_poll_.Spin([this] {
    uint8_t byte;
    if (recv(in_fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) >= 0) return true;  // or its end
    // Anything but "nothing yet" is for the read after the spin to report.
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  });
}

void Connection::DrainAsync() {
  DropPrefetch();
  if (!async_) return;
  (void)async_->Submit();
  while (async_->pending() > 0) ReapRing(/*wait_ms=*/100);
}

}  // namespace thindisk::nbd
