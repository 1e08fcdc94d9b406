// qcow2::Measure: how large the qcow2 file is that `thindisk convert -O
// qcow2` makes of a source (or `thindisk create` of an empty image), as
// `qemu-img measure` answers it.
//
// qemu-img estimates (it counts L2 tables for the whole virtual size); this
// is exact for what thindisk writes: it replays the conversion's writes
// through the real engine onto a storage that keeps only the metadata
// (all-zero writes, i.e. the replayed data, are not stored), and reports
// the file size that results. So the figure tracks the engine's allocation
// order, refcount block placement and table growth by construction. Like
// convert, it reads the source's allocated data to find the all-zero
// 4 KiB runs convert does not write.
//
// MeasureBitmaps is qemu-img's "bitmaps" figure: what the persistent
// bitmaps of the source take in the new image (`convert --bitmaps`).
//
// Thread safety: none needed (no shared state); the source is only read.
// Errors: kInvalidArgument (options create would refuse), the source's read
// errors.
#pragma once

#include <cstdint>
#include <vector>

#include "block/device.h"
#include "qcow2/bitmaps.h"
#include "qcow2/image.h"
#include "util/result.h"

namespace thindisk::qcow2 {

struct MeasureResult {
  // File size a conversion (or creation, without a source) produces.
  uint64_t required = 0;
  // File size with every guest cluster allocated (preallocation=full).
  uint64_t fully_allocated = 0;
};

// The copy grain of `thindisk convert`: the source is read in chunks of
// kConvertChunk and all-zero kConvertSparseGrain runs are not written. The
// conversion and the measurement must agree on these.
inline constexpr uint64_t kConvertChunk = 2ull << 20;
inline constexpr uint64_t kConvertSparseGrain = 4096;

// Measures a qcow2 image made with `options` (its size is the source's when
// `source` is non-null, else options.size). With preallocation, or with a
// backing file (what the backing file covers is unknown, so every cluster
// is counted, as qemu-img does), required == fully_allocated.
Result<MeasureResult> Measure(block::Device* source, const CreateOptions& options);

// The bytes `bitmaps` (a qcow2 source's, ListBitmaps) take in a qcow2 image
// of `virtual_size` with clusters of `cluster_size`, as qemu-img measure
// counts them: every data cluster of each bitmap (as if all of it were
// dirty) and its table, plus the directory, rounded up to whole clusters;
// 0 without bitmaps. Disabled and inconsistent (in_use) bitmaps count too.
// Pure arithmetic. REQUIRES: cluster_size a power of two >= 512.
uint64_t MeasureBitmaps(const std::vector<BitmapInfo>& bitmaps, uint64_t virtual_size,
                        uint64_t cluster_size);

// The file size of an image created with `options` and preallocation=full
// (every L2 table and data cluster present). Pure arithmetic: the layout
// qcow2::Create uses.
Result<uint64_t> FullyAllocatedSize(const CreateOptions& options);

}  // namespace thindisk::qcow2
