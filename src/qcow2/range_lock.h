// RangeLock: exclusion between writers of the same guest clusters.
//
// A writer (write, write-zeroes, discard) holds the lock on the guest
// clusters it is changing, so two requests that allocate or copy-on-write
// the same cluster are serialized while requests on different clusters run
// in parallel (DESIGN.md rule 3). Readers take no range lock: they see the
// old mapping or the new one, never a half-updated one, because a mapping is
// published only after its data is written.
//
// Thread safety: all methods may be called concurrently.
// Deadlock freedom: a thread must hold at most one range at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace thindisk::qcow2 {

class RangeLock {
 public:
  // Holds [first, first + count) until destroyed.
  class Guard {
   public:
    Guard(RangeLock* lock, uint64_t first, uint64_t count)
        : lock_(lock), first_(first), count_(count) {}
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    ~Guard() { lock_->Unlock(first_, count_); }

   private:
    RangeLock* lock_;
    uint64_t first_;
    uint64_t count_;
  };

  // Blocks until no held range overlaps [first, first + count), then holds it.
  // REQUIRES: count > 0 and the caller holds no other range.
  [[nodiscard]] Guard Lock(uint64_t first, uint64_t count);

  // Number of ranges currently held (for tests).
  size_t held() const;

 private:
  struct Range {
    uint64_t first;
    uint64_t count;
  };
  bool OverlapsLocked(uint64_t first, uint64_t count) const TD_REQUIRES(mu_);
  void Unlock(uint64_t first, uint64_t count);

  mutable util::Mutex mu_;
  util::CondVar cv_;
  std::vector<Range> held_ TD_GUARDED_BY(mu_);  // short: one entry per active writer
};

}  // namespace thindisk::qcow2
