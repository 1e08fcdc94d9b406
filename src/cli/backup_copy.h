// CopyRanges: copies byte ranges of one device into another with several
// requests in flight, keeping the target sparse: the copy engine of
// `thindisk backup`.
//
// Each range is cut into chunks of at most kBackupChunk bytes, taken in
// order by `workers` threads; each chunk is read, and its all-zero 4 KiB
// runs are either skipped (a full backup: a new image reads as zeros) or
// written as zeroes (an incremental one: its backing file may hold older
// data there), the rest written as data.
//
// Thread safety: `src` and `dst` must take concurrent requests (every
// block::Device does). Errors: the first read or write error stops the
// copy and is returned naming the offset.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "block/device.h"
#include "cli/common.h"
#include "util/result.h"

namespace thindisk::cli {

inline constexpr uint64_t kBackupChunk = 1ull << 20;

struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct CopyRangesOptions {
  bool zeroes_as_writes = false;  // write zero runs (over a backing file) instead of skipping
  size_t workers = 16;
  Progress* progress = nullptr;   // told bytes done of the ranges' total
  // Told the data bytes each chunk wrote (one call at a time): a target's
  // BackgroundWriteback, so the copy's output is written back as it goes.
  std::function<void(uint64_t)> wrote;
};

struct CopyRangesStats {
  uint64_t bytes = 0;          // of the ranges
  uint64_t data_written = 0;   // written as data
  uint64_t zeroes = 0;         // written as zeroes or skipped as zeros
};

Result<CopyRangesStats> CopyRanges(block::Device& src, block::Device& dst,
                                   const std::vector<ByteRange>& ranges,
                                   const CopyRangesOptions& options);

// The ranges of `dev` that may hold something other than zeros (from its
// block status; what it cannot tell counts as data), merged.
Result<std::vector<ByteRange>> NonZeroRanges(block::Device& dev);

}  // namespace thindisk::cli
