// LatencyStorage: an io::Storage that is slow on purpose. It waits a set
// latency before passing each request to the storage it wraps, so tests
// and `thindisk bench --latency` can show what requests in flight gain on
// network or distributed storage (NFS, RADOS: about 1 ms a request)
// without a network.
//
// Which calls wait, as real network storage behaves:
//  - Delayed (one round trip each): ReadAt, WriteAt, Flush, ZeroRange,
//    PunchHole, Allocate, Resize, NextData, NextHole. Every one of them is
//    a request the server must answer (NBD: read, write, flush, zeroes,
//    trim, cache/resize, block status).
//  - Not delayed: Size (a network client learns it at connect and after
//    its own Resize, and caches it), AllocatedBytes (space accounting,
//    not on any I/O path), bytes_written and name (local bookkeeping) and
//    Announce (a hint that never reaches the host).
// The wait happens before the inner call, with no lock held, so N
// concurrent requests overlap and all finish after about one latency,
// not N; the inner storage's own locking is unchanged. A zero latency
// forwards directly, without sleeping.
//
// Thread safety: as the wrapped storage (the wrapper has no state but
// constants). Lifetime: owns the wrapped storage.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "io/forwarding_storage.h"

namespace thindisk::io {

class LatencyStorage final : public ForwardingStorage {
 public:
  LatencyStorage(std::unique_ptr<Storage> inner, std::chrono::microseconds latency)
      : ForwardingStorage(std::move(inner)), latency_(latency) {}

  std::chrono::microseconds latency() const { return latency_; }

  // The requests that wait; Size, AllocatedBytes and the bookkeeping
  // calls are forwarded at once (ForwardingStorage).
  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override;
  Status Resize(uint64_t size) override;
  Status Allocate(uint64_t offset, uint64_t length) override;
  Status PunchHole(uint64_t offset, uint64_t length) override;
  Status ZeroRange(uint64_t offset, uint64_t length) override;
  Result<uint64_t> NextData(uint64_t offset) override;
  Result<uint64_t> NextHole(uint64_t offset) override;

 private:
  // One round trip: sleeps the latency on the calling thread (no lock).
  void Wait() const;

  const std::chrono::microseconds latency_;
};

}  // namespace thindisk::io
