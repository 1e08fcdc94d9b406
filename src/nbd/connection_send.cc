// The sending side of a Connection: replies sent by the thread that
// finished them when the socket is free, otherwise queued for the writer
// thread, which sends them in batches (see connection.h).
#include <sys/uio.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "nbd/connection.h"
#include "nbd/fd_io.h"

namespace thindisk::nbd {
namespace {

// Skips `n` bytes at the front of `iov` (bytes a partial send already took).
void AdvanceIov(std::vector<iovec>* iov, size_t n) {
  iov->erase(iov->begin(), iov->begin() + ptrdiff_t(SkipIov(*iov, n)));
}

size_t IovBytes(const std::vector<iovec>& iov) {
  size_t total = 0;
  for (const iovec& v : iov) total += v.iov_len;
  return total;
}

iovec Iov(const void* p, size_t n) { return iovec{const_cast<void*>(p), n}; }

}  // namespace

void Connection::Send(OutgoingReply reply, size_t cost) {
  std::vector<Queued> one;
  one.push_back({std::move(reply), cost, 0});
  SendAll(std::move(one));
}

void Connection::Answer(OutgoingReply reply, size_t cost) {
  if (!holding_) return Send(std::move(reply), cost);
  held_.push_back({std::move(reply), cost, 0});
}

void Connection::ReapRing(int wait_ms) {
  holding_ = true;
  async_->Reap(wait_ms);
  holding_ = false;
  if (!held_.empty()) SendAll(std::exchange(held_, {}));
}

void Connection::SendAll(std::vector<Queued> batch) {
  Count(options_.reply_counters, &ReplyCounters::replies, batch.size());
  util::UniqueLock lock(write_mu_);
  if (sending_ || !replies_.empty() || !direct_ok_ || write_failed_) {
    // Notify under the lock: once the writer sends these replies, Run() may
    // return and destroy the connection, so this thread must be done with
    // write_cv_ before the writer can see them.
    for (Queued& q : batch) replies_.push_back(std::move(q));
    write_cv_.NotifyOne();
    return;
  }
  sending_ = true;  // the socket is ours until we give it back
  lock.Unlock();
  Count(options_.reply_counters, &ReplyCounters::writes);
  std::vector<iovec> iov;
  for (const Queued& q : batch) q.reply.AppendIovecs(&iov);
  const size_t total = IovBytes(iov);
  size_t sent = 0;
  Status error;
  while (sent < total) {
    Result<size_t> n = transport_->TrySendV(iov);
    if (!n.has_value()) {
      error = n.error();
      break;
    }
    if (*n == 0) break;  // full: the writer finishes it
    sent += *n;
    AdvanceIov(&iov, *n);
  }
  // A transport that consumed the replies but holds some of them (TLS
  // records the socket did not take) needs the writer to finish: an empty
  // reply makes it call WriteAllV, which sends them first.
  const bool unsent = error.ok() && sent == total && transport_->HasUnsent();
  lock.Lock();
  sending_ = false;
  if (unsent) {
    replies_.push_back({OutgoingReply(), 0, 0});
    write_cv_.NotifyOne();
  }
  if (error.code() == Code::kNotSupported) {
    direct_ok_ = false;  // not a socket: blocking writes on the writer only
  } else if (!error.ok()) {
    write_failed_ = true;
    replies_lost_.store(true, std::memory_order_relaxed);
  }
  if (sent < total && (error.ok() || error.code() == Code::kNotSupported)) {
    // The rest must go before any other reply, in order; the writer
    // releases their room. `whole` replies went out whole, the next one
    // (which starts at byte `at`) in part.
    size_t whole = 0, at = 0;
    while (at + batch[whole].reply.size() <= sent) at += batch[whole++].reply.size();
    batch[whole].sent = sent - at;
    for (size_t i = batch.size(); i-- > whole;) replies_.push_front(std::move(batch[i]));
    write_cv_.NotifyOne();
    batch.resize(whole);
  } else if (!replies_.empty()) {
    write_cv_.NotifyOne();
  }
  lock.Unlock();
  if (!error.ok() && error.code() != Code::kNotSupported) {
    Log("nbd: cannot send reply: " + error.message());
    // Wake the reader if out_fd_ is a socket: there is no one to answer.
    transport_->Shutdown();
  }
  // Last: after the final Release, Run() may return and destroy *this.
  for (const Queued& q : batch) Release(q.cost);
}

void Connection::WriterLoop() {
  for (;;) {
    std::deque<Queued> batch;
    bool failed;
    {
      util::MutexLock lock(write_mu_);
      while (sending_ || (!writer_stop_ && replies_.empty())) write_cv_.Wait(write_mu_);
      if (replies_.empty()) return;  // stopping, and nothing is owed
      batch.swap(replies_);
      sending_ = true;
      failed = write_failed_;
    }
    // Everything that piled up goes out in one writev; only the first reply
    // can have been sent in part (by a direct send).
    Count(options_.reply_counters, &ReplyCounters::writes);
    std::vector<iovec> iov;
    for (const Queued& q : batch) q.reply.AppendIovecs(&iov);
    AdvanceIov(&iov, batch.front().sent);
    Status s = failed ? Status::Ok() : transport_->WriteAllV(iov);
    {
      util::MutexLock lock(write_mu_);
      sending_ = false;
      if (!s.ok()) {
        write_failed_ = true;
        replies_lost_.store(true, std::memory_order_relaxed);
      }
    }
    if (!s.ok()) {
      Log("nbd: cannot send reply: " + s.message());
      // Wake the reader if out_fd_ is a socket: there is no one to answer.
      transport_->Shutdown();
    }
    for (const Queued& q : batch) Release(q.cost);
  }
}

void Connection::StopWriter() {
  if (!writer_.joinable()) return;
  {
    util::MutexLock lock(write_mu_);
    writer_stop_ = true;
  }
  write_cv_.NotifyOne();
  writer_.join();
}

void OutgoingReply::AddHead(std::span<const uint8_t> bytes) {
  pieces_.push_back({false, head_.size(), bytes.size()});
  head_.insert(head_.end(), bytes.begin(), bytes.end());
}

void OutgoingReply::AddData(size_t offset, size_t length) {
  pieces_.push_back({true, offset, length});
}

size_t OutgoingReply::size() const {
  size_t total = 0;
  for (const Piece& p : pieces_) total += p.length;
  return total;
}

void OutgoingReply::AppendIovecs(std::vector<iovec>* out) const {
  for (const Piece& p : pieces_) {
    const uint8_t* base = p.in_data ? data_.data() : head_.data();
    out->push_back(Iov(base + p.offset, p.length));
  }
}

}  // namespace thindisk::nbd
