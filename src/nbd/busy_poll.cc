#include "nbd/busy_poll.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace thindisk::nbd {

int BusyPoll::Slots::DefaultLimit() {
  const int cpus = int(std::thread::hardware_concurrency());
  return std::max(1, cpus - 1);
}

bool BusyPoll::Admit() {
  if (budget_.count() <= 0) return false;
  if (credits_ == 0) {
    if (++skipped_ < kProbeEvery) return false;
    skipped_ = 0;  // a probe
  }
  if (slots_ == nullptr) return true;
  if (slots_->spinning.fetch_add(1, std::memory_order_acq_rel) < slots_->limit)
    return true;
  slots_->spinning.fetch_sub(1, std::memory_order_acq_rel);
  return false;
}

void BusyPoll::Done(bool hit) {
  if (slots_ != nullptr) {
    slots_->spinning.fetch_sub(1, std::memory_order_acq_rel);
    (hit ? slots_->hits : slots_->misses).fetch_add(1, std::memory_order_relaxed);
  }
  credits_ = hit ? std::min(kMaxCredits, credits_ + kGain) : std::max(0, credits_ - 1);
}

// Lets a runnable thread of this CPU (a worker, the client) go first; on an
// idle CPU it returns at once, and the CPU stays awake.
void BusyPoll::Relax() { sched_yield(); }

}  // namespace thindisk::nbd
