#include "qcow2/range_lock.h"

#include <algorithm>

namespace thindisk::qcow2 {

bool RangeLock::OverlapsLocked(uint64_t first, uint64_t count) const {
  return std::any_of(held_.begin(), held_.end(), [&](const Range& r) {
    return first < r.first + r.count && r.first < first + count;
  });
}

RangeLock::Guard RangeLock::Lock(uint64_t first, uint64_t count) {
  util::MutexLock lock(mu_);
  while (OverlapsLocked(first, count)) cv_.Wait(mu_);
  held_.push_back({first, count});
  return Guard(this, first, count);
}

void RangeLock::Unlock(uint64_t first, uint64_t count) {
  {
    util::MutexLock lock(mu_);
    auto it = std::find_if(held_.begin(), held_.end(), [&](const Range& r) {
      return r.first == first && r.count == count;
    });
    if (it != held_.end()) held_.erase(it);
  }
  // Waiters wait for different ranges, so wake them all to re-check.
  cv_.NotifyAll();
}

size_t RangeLock::held() const {
  util::MutexLock lock(mu_);
  return held_.size();
}

}  // namespace thindisk::qcow2
