// Opening one export of `thindisk serve` the way qemu-nbd's options ask:
// the image (or an internal snapshot of it, -l), a temporary overlay that
// takes the writes (-s), a byte window of it (-o, --image-opts
// driver=raw,offset=,size=), writes made durable one by one
// (--cache=writethrough|directsync) and the discard/detect-zeroes filter.
//
// Layers, bottom up: image [-> temporary overlay] [-> window]
// [-> write-through] [-> filter]. Closing `device` closes the whole stack.
//
// The -s overlay is a qcow2 file in $TMPDIR (else /tmp) whose backing file
// is the image, opened read-only. It is unlinked as soon as it is open, so
// it disappears when the server exits, however it exits, and also when
// opening fails half way; the image itself is never written.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "block/device.h"
#include "block/dirty_bitmap.h"
#include "block/open.h"
#include "nbd/filter_device.h"
#include "util/result.h"

namespace thindisk::cli {

struct ExportSettings {
  block::OpenOptions open;  // format, read_only, cache, snapshot (-l), ...
  bool temp_overlay = false;     // -s/--snapshot
  uint64_t offset = 0;           // -o/--offset (plus --image-opts offset=)
  std::optional<uint64_t> size;  // --image-opts size=: the window's length
  bool write_through = false;    // FUA on every write
  nbd::FilterOptions filter;
  // -B: persistent bitmaps of the image to offer (a qcow2 image served
  // whole: not with -s, -l or a window).
  std::vector<std::string> bitmaps;
};

struct OpenedExport {
  std::shared_ptr<block::Device> device;
  std::shared_ptr<block::Device> image;  // the image (or -s overlay) under the views
  std::vector<std::shared_ptr<block::DirtyBitmap>> bitmaps;  // as settings.bitmaps names them
};

// Opens `file` per `settings`. Errors name the file and, for a window that
// does not fit, the offset and the image size; for -B, the bitmap (not
// found, inconsistent, not a qcow2 image, or a view -B cannot follow).
Result<OpenedExport> OpenExportDevice(const std::string& file, const ExportSettings& settings);

}  // namespace thindisk::cli
