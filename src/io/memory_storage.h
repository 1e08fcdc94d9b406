// MemoryStorage: an io::Storage held in RAM, for tests and the fault injector.
//
// Sparse: bytes live in fixed 64 KiB chunks created on first write, so a
// 1 TiB virtual size costs nothing until written. A chunk that was never
// written (or was punched/zeroed whole) reads as zeros and counts as a hole.
//
// Semantics follow the io::Storage contract with these specifics:
//  - Flush is a no-op (RAM is "durable" for the life of the object).
//  - Allocate only extends Size() when the range ends past it (as
//    fallocate mode 0 does); it creates no chunks.
//  - PunchHole / ZeroRange drop whole chunks and zero partial ones;
//    ZeroRange extends Size() like a write of zeros, PunchHole never does.
//  - NextData / NextHole / AllocatedBytes work at chunk grain.
//
// Invariant: every byte at or past Size() inside a held chunk is zero, so
// growing the storage again exposes zeros (no stale bytes).
//
// Thread safety: all methods may be called concurrently (one mutex).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/storage.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace thindisk::io {

class MemoryStorage final : public Storage {
 public:
  static constexpr uint64_t kChunkSize = 64 * 1024;
  // Largest Size() accepted; keeps offset arithmetic far from overflow
  // and offsets representable as off_t like a real file.
  static constexpr uint64_t kMaxSize = uint64_t{1} << 62;

  explicit MemoryStorage(std::string name);

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
  const std::string& name() const override { return name_; }

  // The whole logical content (Size() bytes, holes as zeros). For tests of
  // small storages; a huge virtual size allocates that much.
  std::vector<uint8_t> Contents();
  // An independent deep copy (same chunks, size, name; bytes_written 0).
  std::unique_ptr<MemoryStorage> Clone();
  // Number of chunks currently held (AllocatedBytes() / kChunkSize).
  size_t ChunkCount();

 private:
  using Chunk = std::unique_ptr<uint8_t[]>;

  // Zeros [offset, offset+length) clipped to held chunks: whole chunks are
  // dropped, partial ones zeroed.
  void ZeroLocked(uint64_t offset, uint64_t length) TD_REQUIRES(mu_);

  const std::string name_;
  std::atomic<uint64_t> bytes_written_{0};

  util::Mutex mu_;
  uint64_t size_ TD_GUARDED_BY(mu_) = 0;
  // Chunk index -> kChunkSize bytes.
  std::map<uint64_t, Chunk> chunks_ TD_GUARDED_BY(mu_);
};

std::unique_ptr<MemoryStorage> NewMemoryStorage(std::string name = "memory");

}  // namespace thindisk::io
