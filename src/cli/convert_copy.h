// The copy engine of thindisk convert: a source's guest content into a
// target device, writing only what the target does not already read
// (cli/convert_cmd.cc opens both and says what the target holds).
#pragma once

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

// Copies `src` into `dst` (at least as large) in guest order: 8 readers
// fetch runs of block status and data ahead of this thread, which writes
// them in order; zero grains of 4 KiB inside data are not written (written
// as zeroes unless the target reads as zeros). `progress` is drawn and
// `writeback` (optional) told what each run wrote.
Status CopyPlain(block::Device& src, block::Device& dst, Target target, Progress& progress,
                 BackgroundWriteback* writeback);

// The same into a qcow2 `dst` as compressed clusters, on up to 8 threads;
// InvalidArgument when `dst` is not qcow2.
Status CopyCompressed(block::Device& src, block::Device& dst, Target target, Progress& progress,
                      BackgroundWriteback* writeback);

}  // namespace thindisk::cli
