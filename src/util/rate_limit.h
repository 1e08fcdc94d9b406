// util::RateLimit: a byte rate that several threads share, for qemu-img's
// -r RATE_LIMIT (convert, commit): each caller takes its bytes before it
// moves them and waits as long as the bytes taken before it need at the
// rate. The first request goes at once; over any stretch of a run, at most
// the rate's bytes plus one request pass. A caller that was idle gets no
// credit for the time it did not use, so there is no burst after a pause.
//
// Thread safety: Take and Reserve may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace thindisk {

class RateLimit {
 public:
  using Clock = std::chrono::steady_clock;

  // `bytes_per_second` must be > 0.
  explicit RateLimit(uint64_t bytes_per_second) : rate_(bytes_per_second) {}
  RateLimit(const RateLimit&) = delete;
  RateLimit& operator=(const RateLimit&) = delete;

  // Books `bytes` at time `now`: how long the caller must wait before
  // moving them.
  std::chrono::nanoseconds Reserve(uint64_t bytes, Clock::time_point now);

  // Books `bytes` now and sleeps for the wait.
  void Take(uint64_t bytes);

  uint64_t bytes_per_second() const { return rate_; }

 private:
  const uint64_t rate_;
  std::mutex mu_;
  Clock::time_point next_{};  // when the booked bytes are paid for; guarded by mu_
};

}  // namespace thindisk
