// Steps shared by the commands that work on backing chains (commit, rebase,
// amend): finding a layer of a chain, listing what the upper layers hold,
// and copying ranges between devices in bounded chunks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "block/device.h"
#include "cli/common.h"
#include "cli/image_summary.h"
#include "util/result.h"

namespace thindisk::cli {

// Bytes moved per read/write step: large enough to stream, small enough to
// keep two buffers in memory.
inline constexpr uint64_t kChainChunk = 1ull << 20;

// Index in `chain` (top = 0) of the layer that is the same file as `path`
// (same device and inode; the names may differ). A relative `path` is tried
// relative to the top image's directory first, as qemu-img does, then as
// given. kInvalidArgument naming both files when it is not in the chain
// below the top.
Result<size_t> FindLayer(const std::vector<ImageSummary>& chain, const std::string& path);

// A guest range some layer above a given depth stores, as data or as zeros.
struct StoredRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool zero = false;  // reads as zeros (zero flag or zero bits)
};

// The ranges of `top` that layers 0 .. depth-1 provide (allocated as data
// or zeros), in order, neighbours of the same kind merged.
Result<std::vector<StoredRange>> RangesAbove(block::Device& top, uint32_t depth);

// Copies `ranges` from `src` to `dst`: data is read from src and written,
// zero ranges become WriteZeroes (no data written). Updates `progress` by
// bytes handled out of the ranges' total. With `rate_limit`, data is read
// no faster than it allows (qemu-img commit -r).
Status CopyRanges(block::Device& src, block::Device& dst,
                  const std::vector<StoredRange>& ranges, Progress& progress,
                  RateLimit* rate_limit = nullptr);

// The work of `commit` once both images are open, in the order that makes
// it crash safe: lists what layers 0 .. depth-1 of `top` store (before BASE
// changes), copies it into `base` (grown to the top's size first), flushes
// and closes `base`, and only then, with `empty_top`, makes the top's ranges
// unallocated so they read through to BASE (`top` must then be a qcow2
// image). `rate_limit` (optional) paces the copy, as in CopyRanges. A failure stops
// before the next step: the overlay is emptied only once BASE holds its data durably.
Status CommitInto(block::Device& top, block::Device& base, uint32_t depth, bool empty_top,
                  Progress& progress, RateLimit* rate_limit = nullptr);

}  // namespace thindisk::cli
