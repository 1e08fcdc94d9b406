// FaultyStorage: an io::Storage wrapper that injects faults and simulates
// power loss, for crash tests of the format drivers.
//
// Reads and writes pass through to the wrapped storage (usually a
// MemoryStorage). On top of that:
//
//  Injected errors (armed until fired or ClearFaults()):
//   - FailNthWrite(n, e): the n-th WriteAt from now (n = 1: the next one)
//     fails with errno `e` and writes nothing. `persistent`: it and every
//     later mutation (WriteAt, ZeroRange, PunchHole, Resize, Allocate)
//     fail too, as a dead disk would.
//   - FailNthFlush(n, e): the same for Flush. A failed Flush makes nothing
//     durable; the writes stay unflushed.
//   - FailAfterBytes(n): a full disk. WriteAt and Allocate consume a budget
//     of n bytes; one that does not fit fails with ENOSPC and writes nothing,
//     and so does every later one until ClearFaults() (space restored).
//
//  Event faults (see io::Event): the driver announces named steps; FailAtEvent
//  arms "fail the mutation that follows the n-th announcement of X" (once,
//  or from then on with `persistent`; with `freeze` Flush fails too from
//  then on, so nothing more becomes durable: SimulatePowerLoss afterwards
//  is a power cut at that very step; with `freeze_after_next`, right after
//  the step's own write). Announcements are counted per event.
//
//  Power loss: every mutation that completed since the last successful
//  Flush is "unflushed" (WriteAt, ZeroRange, PunchHole, Resize, Allocate
//  alike). The durable state is the state at construction with every
//  flushed mutation applied in order. SimulatePowerLoss(mode, seed) returns
//  a NEW MemoryStorage holding the durable state plus, per mode:
//   - kDropUnflushed:    nothing unflushed;
//   - kKeepRandomSubset: each unflushed mutation kept with probability 1/2
//                        (seeded), applied in their original order;
//   - kTearOne:          all unflushed mutations, except that one randomly
//                        chosen unflushed WriteAt is kept only up to a random
//                        512-byte boundary inside it (possibly none of it);
//   - kTearLast:         the same, but the torn write is the last unflushed
//                        WriteAt (a power cut during the write in progress).
//  The wrapper itself is unchanged; keep writing or discard it.
//
// Memory: keeps a copy of the durable state and of unflushed data, so it
// costs about twice what was written. Meant for tests.
//
// Thread safety: all methods may be called concurrently. Mutations and
// Flush are serialized by one mutex (so the log order is the order applied
// to the base); reads go straight to the base.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/memory_storage.h"
#include "io/storage.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace thindisk::io {

enum class PowerLossMode { kDropUnflushed, kKeepRandomSubset, kTearOne, kTearLast };

class FaultyStorage final : public Storage {
 public:
  // The sector grain at which kTearOne tears a write.
  static constexpr uint64_t kTearGrain = 512;

  // Use NewFaultyStorage(); public for make_unique.
  FaultyStorage(std::shared_ptr<Storage> base, std::unique_ptr<MemoryStorage> durable);

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override;
  Result<uint64_t> Size() override;
  Status Resize(uint64_t size) override;
  Status Allocate(uint64_t offset, uint64_t length) override;
  Status PunchHole(uint64_t offset, uint64_t length) override;
  Status ZeroRange(uint64_t offset, uint64_t length) override;
  Result<uint64_t> NextData(uint64_t offset) override;
  Result<uint64_t> NextHole(uint64_t offset) override;
  Result<uint64_t> AllocatedBytes() override;
  uint64_t bytes_written() const override { return bytes_written_.load(); }
  const std::string& name() const override { return base_->name(); }
  void Announce(Event e) override;

  // Fault knobs; `error` is an errno (EIO, ENOSPC, ...). n >= 1.
  void FailNthWrite(uint64_t n, int error = EIO, bool persistent = false);
  void FailNthFlush(uint64_t n, int error = EIO, bool persistent = false);
  void FailAfterBytes(uint64_t n);
  struct EventFault {
    Event event = Event::kDataWrite;
    uint64_t nth = 1;        // which announcement (1 = the next one)
    int error = EIO;         // errno of the failed mutation(s)
    bool persistent = false;  // every later mutation fails too
    bool freeze = false;      // and every later Flush (power cut at the step)
    // With freeze: the mutation after the step still happens (unflushed,
    // so a torn or partial power loss may keep any prefix of it); the
    // power cut comes right after it.
    bool freeze_after_next = false;
  };
  void FailAtEvent(const EventFault& fault);
  // True once an armed event fault has fired (a mutation failed, or the
  // freeze began).
  bool event_fault_fired();
  // Announcements of `e` since construction.
  uint64_t event_count(Event e) const { return event_counts_[int(e)].load(); }

  // Disarms every fault and restores space; counters are kept.
  void ClearFaults();

  Result<std::unique_ptr<MemoryStorage>> SimulatePowerLoss(PowerLossMode mode, uint64_t seed);

  // Successful operations since construction.
  uint64_t writes() const { return writes_.load(); }
  uint64_t flushes() const { return flushes_.load(); }
  // Faults fired (failed calls).
  uint64_t faults_injected() const { return faults_.load(); }
  // Mutations completed since the last successful Flush.
  size_t unflushed_ops();

  Storage& base() { return *base_; }

 private:
  enum class OpKind { kWrite, kPunch, kZero, kResize, kAllocate };
  struct Op {
    OpKind kind;
    uint64_t offset;  // kResize: the new size
    uint64_t length;
    std::vector<uint8_t> data;  // kWrite only
  };
  struct Trigger {
    bool armed = false;
    uint64_t countdown = 0;  // calls left until it fires (1 = next)
    int error = 0;
    bool persistent = false;
    bool fired = false;  // persistent and already fired: fail everything
  };

  // Counts one call against `t` (a member guarded by mu_); returns the
  // errno to fail with, or 0.
  static int Tick(Trigger& t);
  // Fails non-write mutations once a persistent write fault has fired.
  Status DeadDiskCheck(const char* op) TD_REQUIRES(mu_);
  // Fails a mutation per the event fault, if one is due.
  Status EventFaultCheck(const char* op) TD_REQUIRES(mu_);
  Status Injected(int error, const char* op);
  static Status Apply(MemoryStorage& target, const Op& op, uint64_t write_limit);

  const std::shared_ptr<Storage> base_;
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> writes_{0};
  std::atomic<uint64_t> flushes_{0};
  std::atomic<uint64_t> faults_{0};
  std::atomic<uint64_t> event_counts_[kEventCount] = {};

  util::Mutex mu_;
  std::unique_ptr<MemoryStorage> durable_ TD_GUARDED_BY(mu_);
  std::vector<Op> unflushed_ TD_GUARDED_BY(mu_);
  Trigger write_fault_ TD_GUARDED_BY(mu_);
  Trigger flush_fault_ TD_GUARDED_BY(mu_);
  EventFault event_fault_ TD_GUARDED_BY(mu_);
  bool event_armed_ TD_GUARDED_BY(mu_) = false;  // waiting for the n-th event
  uint64_t event_countdown_ TD_GUARDED_BY(mu_) = 0;
  bool event_pending_ TD_GUARDED_BY(mu_) = false;  // next mutation fails
  bool event_dead_ TD_GUARDED_BY(mu_) = false;     // every mutation fails
  bool event_frozen_ TD_GUARDED_BY(mu_) = false;   // every Flush fails
  bool event_fired_ TD_GUARDED_BY(mu_) = false;
  bool space_limited_ TD_GUARDED_BY(mu_) = false;
  bool space_exhausted_ TD_GUARDED_BY(mu_) = false;
  uint64_t space_left_ TD_GUARDED_BY(mu_) = 0;
};

// Wraps `base`, copying its current content as the initial durable state
// (sparse-aware: only data ranges are read). Errors: those of reading base.
Result<std::unique_ptr<FaultyStorage>> NewFaultyStorage(std::shared_ptr<Storage> base);

}  // namespace thindisk::io
