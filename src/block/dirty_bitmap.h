// block::DirtyBitmap: a dirty bitmap as a reader sees it, one run of equal
// bits at a time: what an NBD server offers as the metadata context
// "qemu:dirty-bitmap:NAME" (docs/interop/nbd.rst in QEMU) and what a
// backup reads to copy only what changed. The format driver that keeps the
// bitmap implements it (qcow2/bitmaps.h: ExportBitmap).
//
// Thread safety: RunAt may be called concurrently with itself and with
// writes to the device, whose changes it shows as they are tracked.
#pragma once

#include <cstdint>
#include <string>

#include "util/result.h"

namespace thindisk::block {

class DirtyBitmap {
 public:
  virtual ~DirtyBitmap() = default;

  virtual const std::string& name() const = 0;
  // Bytes one bit covers.
  virtual uint64_t granularity() const = 0;

  struct Run {
    bool dirty = false;
    uint64_t length = 0;  // > 0 unless max_length is 0
  };
  // The run of equal state that starts at `offset` (below the device size),
  // cut at max_length and at the device's end.
  virtual Result<Run> RunAt(uint64_t offset, uint64_t max_length) = 0;
};

}  // namespace thindisk::block
