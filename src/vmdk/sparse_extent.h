// vmdk::SparseExtent: guest reads and block status of one hosted sparse
// extent (monolithicSparse or streamOptimized) through its grain directory
// and grain tables.
//
// Grain table entries: 0 = unallocated (a hole, reads zeros), 1 = zeroed
// grain (reads zeros, present), otherwise the sector of the grain; in a
// compressed extent, the sector of the grain's marker (lba, size) followed
// by a zlib stream. The redundant grain directory is ignored. Every pointer
// is checked against the file size before it is followed, and a compressed
// grain's lba must be the grain it is filed under.
//
// Thread safety: Read and GetStatus may be called concurrently; grain tables
// are cached under a mutex and shared read-only.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "block/device.h"
#include "io/storage.h"
#include "util/result.h"
#include "vmdk/format.h"

namespace thindisk::vmdk {

// Grain tables kept in memory at most (2 KiB each at the spec's geometry).
inline constexpr uint64_t kGtCacheBytes = 32ull << 20;

class SparseExtent {
 public:
  // `storage` must outlive the extent. `header` was decoded from it by
  // DecodeSparseHeader; a kGdAtEnd header is resolved through the footer
  // (footer marker, footer header, end-of-stream marker at the file's end).
  // Errors: kCorrupt (footer or grain directory malformed), I/O errors.
  static Result<std::unique_ptr<SparseExtent>> Open(io::Storage& storage, SparseHeader header);

  const SparseHeader& header() const { return h_; }

  // Guest bytes [offset, offset + buf.size()) of the extent, which the
  // caller has checked lie inside its capacity.
  Status Read(uint64_t offset, std::span<uint8_t> buf);
  // The extent of equal state starting at `offset`, ending by `end`.
  Result<block::Extent> GetStatus(uint64_t offset, uint64_t end);

 private:
  enum class Kind { kUnallocated, kZero, kData, kCompressed };
  struct Grain {
    Kind kind = Kind::kUnallocated;
    uint64_t sector = 0;  // kData, kCompressed: where the grain (marker) is
    bool table_missing = false;  // the whole grain table is unallocated
  };

  SparseExtent(io::Storage& storage, const SparseHeader& h, uint64_t file_size,
               std::vector<uint32_t> gd)
      : storage_(storage), h_(h), file_size_(file_size), gd_(std::move(gd)) {}

  Result<Grain> Lookup(uint64_t grain_index);
  Result<std::shared_ptr<const std::vector<uint32_t>>> LoadTable(uint64_t gt_index);
  // The whole decompressed grain (zeros after the stream's end).
  Status ReadCompressed(uint64_t grain_index, uint64_t sector, std::vector<uint8_t>& out);

  io::Storage& storage_;
  const SparseHeader h_;
  const uint64_t file_size_;
  const std::vector<uint32_t> gd_;

  std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<const std::vector<uint32_t>>> tables_;  // by mu_
};

}  // namespace thindisk::vmdk
