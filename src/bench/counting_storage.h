// CountingStorage: an io::Storage that passes everything to the storage it
// wraps and counts what the format driver asked the host to do: bytes
// written (WriteAt and ZeroRange), split by the step the driver announced
// before each write (guest data, fill/copy around it, metadata), and
// flushes. The bench reads the counters to
// compute host write amplification without trusting any one storage
// implementation's own accounting, and for every layer of a backing chain.
//
// Thread safety: as the wrapped storage; the counters are atomics shared
// with whoever holds the Counters pointer (they outlive the storage).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "io/forwarding_storage.h"

namespace thindisk::bench {

struct HostCounters {
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> data_bytes{0};      // kDataWrite, kCompressedWrite
  std::atomic<uint64_t> fill_bytes{0};      // kCowWrite: new bytes with zeros/copies around them
  std::atomic<uint64_t> metadata_bytes{0};  // every other write (tables, header)
  std::atomic<uint64_t> flushes{0};
};

class CountingStorage final : public io::ForwardingStorage {
 public:
  CountingStorage(std::unique_ptr<io::Storage> inner, std::shared_ptr<HostCounters> counters)
      : ForwardingStorage(std::move(inner)), counters_(std::move(counters)) {}

  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override;
  Status ZeroRange(uint64_t offset, uint64_t length) override;
  uint64_t bytes_written() const override { return counters_->bytes_written.load(); }
  // Remembers the step (per thread: the write it names follows on the same thread).
  void Announce(io::Event e) override;

 private:
  std::shared_ptr<HostCounters> counters_;
};

}  // namespace thindisk::bench
