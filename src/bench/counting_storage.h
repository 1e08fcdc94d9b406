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

#include "io/storage.h"

namespace thindisk::bench {

struct HostCounters {
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<uint64_t> data_bytes{0};      // kDataWrite, kCompressedWrite
  std::atomic<uint64_t> fill_bytes{0};      // kCowWrite: new bytes with zeros/copies around them
  std::atomic<uint64_t> metadata_bytes{0};  // every other write (tables, header)
  std::atomic<uint64_t> flushes{0};
};

class CountingStorage final : public io::Storage {
 public:
  CountingStorage(std::unique_ptr<io::Storage> inner, std::shared_ptr<HostCounters> counters)
      : inner_(std::move(inner)), counters_(std::move(counters)) {}

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override { return inner_->ReadAt(offset, buf); }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override;
  Result<uint64_t> Size() override { return inner_->Size(); }
  Status Resize(uint64_t size) override { return inner_->Resize(size); }
  Status Allocate(uint64_t offset, uint64_t length) override { return inner_->Allocate(offset, length); }
  Status PunchHole(uint64_t offset, uint64_t length) override { return inner_->PunchHole(offset, length); }
  Status ZeroRange(uint64_t offset, uint64_t length) override;
  Result<uint64_t> NextData(uint64_t offset) override { return inner_->NextData(offset); }
  Result<uint64_t> NextHole(uint64_t offset) override { return inner_->NextHole(offset); }
  Result<uint64_t> AllocatedBytes() override { return inner_->AllocatedBytes(); }
  uint64_t bytes_written() const override { return counters_->bytes_written.load(); }
  const std::string& name() const override { return inner_->name(); }
  // Remembers the step (per thread: the write it names follows on the same thread).
  void Announce(io::Event e) override;

 private:
  std::unique_ptr<io::Storage> inner_;
  std::shared_ptr<HostCounters> counters_;
};

}  // namespace thindisk::bench
