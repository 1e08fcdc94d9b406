// ReaderEpochs: readers that outlive the call that looked up their mapping
// (block::ReadPlan's pins), and a barrier that waits for those that began
// before it.
//
// A Read holds the image's free gate shared while it reads; a planned read
// is done by someone else, later, on another thread, so it cannot hold a
// lock. It enters an epoch instead and leaves it when its plan is
// destroyed. WaitForEarlier() starts a new epoch and waits until every
// reader of the previous one has left: readers that enter meanwhile count
// in the new epoch, so a steady stream of new readers cannot hold the
// barrier off. Barriers run one at a time (a second waits for the first),
// so one epoch is drained before its counter is used again.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>

#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace thindisk::qcow2 {

class ReaderEpochs {
 public:
  // Counts a reader in the current epoch; pass the result to Leave.
  unsigned Enter() {
    util::MutexLock lock(mu_);
    ++count_[current_];
    return current_;
  }

  void Leave(unsigned epoch) {
    util::MutexLock lock(mu_);
    if (--count_[epoch] == 0 && epoch != current_) left_.NotifyAll();
  }

  // Returns once every reader that entered before the call has left.
  void WaitForEarlier() {
    util::MutexLock barrier(barrier_mu_);
    util::MutexLock lock(mu_);
    const unsigned old = current_;
    current_ ^= 1;
    while (count_[old] != 0) left_.Wait(mu_);
  }

  // Readers in either epoch (tests).
  uint64_t active() {
    util::MutexLock lock(mu_);
    return count_[0] + count_[1];
  }

 private:
  util::Mutex barrier_mu_;  // one barrier at a time
  util::Mutex mu_;
  util::CondVar left_;
  unsigned current_ TD_GUARDED_BY(mu_) = 0;
  uint64_t count_[2] TD_GUARDED_BY(mu_) = {0, 0};  // readers per epoch
};

}  // namespace thindisk::qcow2
