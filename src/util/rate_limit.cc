// See rate_limit.h.
#include "util/rate_limit.h"

#include <algorithm>
#include <thread>

namespace thindisk {
namespace {

// About 36 years: longer than any copy, far from the clock's limit.
constexpr std::chrono::nanoseconds kMaxWait{int64_t{1} << 60};

}  // namespace

std::chrono::nanoseconds RateLimit::Reserve(uint64_t bytes, Clock::time_point now) {
  // In floating point (bytes * 1e9 overflows 64 bits past 18 GB), and at
  // most kMaxWait, so that the clock's arithmetic cannot overflow either.
  const long double ns = std::min(static_cast<long double>(bytes) * 1e9L / rate_,
                                  static_cast<long double>(kMaxWait.count()));
  const auto cost = std::chrono::nanoseconds(static_cast<int64_t>(ns));
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point start = std::max(now, next_);
  next_ = start + cost;
  return start - now;
}

void RateLimit::Take(uint64_t bytes) {
  const std::chrono::nanoseconds wait = Reserve(bytes, Clock::now());
  if (wait > std::chrono::nanoseconds::zero()) std::this_thread::sleep_for(wait);
}

}  // namespace thindisk
