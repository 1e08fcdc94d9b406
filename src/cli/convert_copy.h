// The copy engine of thindisk convert: a source's guest content into a
// target device, writing only what the target does not already read
// (cli/convert_cmd.cc opens both and says what the target holds).
#pragma once

#include <string>
#include <vector>

#include "block/device.h"
#include "cli/common.h"
#include "cli/writeback.h"
#include "util/result.h"

namespace thindisk::cli {

// What the target reads as before the copy, which decides what must be
// written into it.
enum class Target {
  kZero,      // a new image without a backing file (or -n --target-is-zero)
  kBacking,   // a new image over -B: the source's backing chain
  kExisting,  // -n: an existing image, holding anything
};

// qemu-img convert -C: what the source stores plainly in its own file
// (block status gives a host offset at depth 0) is copied file to file by
// the kernel (copy_file_range: a reflink on XFS and btrfs, a server-side
// copy on NFS 4.2) instead of through this process. A range the kernel
// refuses (another file system, no support) is read and written as without
// -C. Zero and unallocated ranges are still skipped; all-zero runs inside
// data are not looked for.
struct CopyOffload {
  int src_fd = -1;  // the source's own file, readable
  int dst_fd = -1;  // the raw destination file, writable
};

// qemu-img convert's -S: all-zero runs of `sparse` bytes inside data are
// not written (written as zeroes unless the target reads as zeros); 0
// writes every byte the target needs as data, zero extents included, so
// the output is fully allocated.
struct CopyOptions {
  Target target = Target::kZero;
  uint64_t sparse = 4096;  // qcow2::kConvertSparseGrain
  // qemu-img convert --salvage: a source read (or block status) that fails
  // does not stop the copy. The failed range is read again in halves down
  // to 512-byte sectors; what still fails is written as zeros and listed
  // in `unreadable`.
  bool salvage = false;
  // qemu-img convert -r: the source's data is read at most this fast (holes
  // and zero extents cost nothing); nullptr: no limit.
  RateLimit* rate_limit = nullptr;
  // -C, or nullptr. Used by CopyPlain only.
  const CopyOffload* offload = nullptr;
};

// A source range --salvage could not read (written as zeros), and why.
struct UnreadableRange {
  uint64_t offset = 0, length = 0;
  std::string error;
};

// What a copy found: the unreadable ranges, in order, neighbours with the
// same error merged.
struct CopyReport {
  std::vector<UnreadableRange> unreadable;
};

// Copies `src` into `dst` (at least as large) in guest order: 8 readers
// fetch runs of block status and data ahead of this thread, which writes
// them in order. `progress` is drawn and `writeback` (optional) told what
// each run wrote.
Status CopyPlain(block::Device& src, block::Device& dst, const CopyOptions& options,
                 Progress& progress, BackgroundWriteback* writeback,
                 CopyReport* report = nullptr);

// The same into a qcow2 `dst` as compressed clusters, on up to 8 threads
// (zero clusters are skipped, or with sparse 0 written compressed too);
// InvalidArgument when `dst` is not qcow2.
Status CopyCompressed(block::Device& src, block::Device& dst, const CopyOptions& options,
                      Progress& progress, BackgroundWriteback* writeback,
                      CopyReport* report = nullptr);

}  // namespace thindisk::cli
