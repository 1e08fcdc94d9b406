// Persistent dirty bitmaps of a qcow2 image: list, read, add, remove,
// clear, enable, disable and merge, compatible both ways with `qemu-img
// bitmap` (the on-disk format is qcow2/bitmap_directory.h).
//
// A bitmap marks, one bit per granule of the disk, what changed since it
// was created or last cleared. An enabled bitmap (qemu's "auto" flag)
// tracks every change the engine makes (qcow2/bitmap_tracker.h: its copy
// on disk is a superset of the changes whatever a crash leaves); a
// disabled one keeps its bits. A bitmap flagged in_use (a qemu that
// crashed while it had the image open) or malformed is inconsistent: it is
// listed with the reason, and can only be removed.
//
// Requirements: the operations that change bitmaps need the image opened
// read-write by qcow2::Image::Open with no request in flight (the caller
// holds it exclusively, as `thindisk bitmap` does); each starts by making
// every earlier change durable. ListBitmaps and ReadBitmap work on any
// open, read-only too.
//
// Errors: kReadOnly, kNotSupported (not a qcow2 image, or version 2, which
// has no place for bitmaps), kNotFound (no such bitmap), kInvalidArgument
// (bad or duplicate name, granularity out of range, too many bitmaps),
// kCorrupt (an inconsistent bitmap, or a directory that does not decode),
// and I/O errors. A failure part-way leaves the old or the new state on
// disk, plus leaked clusters at most.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "block/dirty_bitmap.h"
#include "qcow2/image.h"
#include "util/bit_vector.h"
#include "util/result.h"

namespace thindisk::qcow2 {

struct BitmapInfo {
  std::string name;
  uint32_t granularity_bits = 16;
  bool enabled = false;  // "auto": tracks every change
  bool in_use = false;   // the flag as on disk
  // "" when the bitmap can be used; otherwise why not (in_use included).
  std::string problem;

  uint64_t granularity() const { return uint64_t{1} << granularity_bits; }
  bool consistent() const { return problem.empty(); }
};

// The bitmap directory `h` names on `storage`, without opening the image
// (info): empty without a consistent bitmaps extension; kCorrupt when it
// does not decode.
Result<std::vector<BitmapDirectoryEntry>> ReadBitmapDirectory(io::Storage& storage,
                                                              const Header& h);

// The bitmaps of the image, in directory order (none for a raw image, a
// version 2 image, or an extension a program without bitmap support left
// inconsistent).
Result<std::vector<BitmapInfo>> ListBitmaps(block::Device& image);

// The bits of bitmap `name` (one per granule of the current disk size):
// the live ones of an enabled bitmap the image tracks, else as stored.
Result<BitVector> ReadBitmap(block::Device& image, const std::string& name);

// Bitmap `name` as a reader sees it (block::DirtyBitmap: an NBD export's
// "qemu:dirty-bitmap:NAME", a backup's source): an enabled bitmap of an
// image open for writing shows every change as it is tracked; any other
// shows its bits as stored. The view keeps `image` alive. kNotFound,
// kCorrupt for an inconsistent bitmap (qemu-nbd -B refuses it too),
// kNotSupported for an image that is not qcow2.
Result<std::shared_ptr<block::DirtyBitmap>> ExportBitmap(std::shared_ptr<block::Device> image,
                                                        const std::string& name);

// Live operations, safe while requests run (thindisk serve's control
// socket; a backup): they act on an enabled bitmap the image tracks
// (opened read-write), else kNotSupported naming why.
struct BitmapLiveState {
  std::string name;
  uint32_t granularity_bits = 16;
  uint64_t generation = 0;   // changes tracked since the image was opened
  uint64_t dirty_bytes = 0;  // marked bytes, whole granules (the disk's end cuts the last)
};
Result<BitmapLiveState> QueryBitmapLive(block::Device& image, const std::string& name);
// Clears `name` in memory; its copy on disk keeps a superset of the
// changes (so a crash loses nothing) until the image is closed or a bitmap
// operation writes it back. With `if_generation`, only if no change was
// tracked since then: kBusy otherwise.
Status ClearBitmapLive(block::Device& image, const std::string& name,
                       std::optional<uint64_t> if_generation);

// qemu-img's default granularity for a new bitmap on this image: the
// cluster size, kept within 4 KiB..64 KiB.
uint32_t DefaultBitmapGranularityBits(Image& image);

struct BitmapAddOptions {
  std::string name;
  uint32_t granularity_bits = 16;
  bool enabled = true;
};
Status AddBitmap(Image& image, const BitmapAddOptions& options);
Status RemoveBitmap(Image& image, const std::string& name);
Status ClearBitmap(Image& image, const std::string& name);
Status SetBitmapEnabled(Image& image, const std::string& name, bool enabled);
// Sets in bitmap `dst` every granule that `src` marks; `src` has one bit
// per 2^src_granularity_bits bytes of a disk of the same size (granularities
// may differ: a source granule marks every destination granule it touches).
Status MergeIntoBitmap(Image& image, const std::string& dst, const BitVector& src,
                       uint32_t src_granularity_bits);

}  // namespace thindisk::qcow2
