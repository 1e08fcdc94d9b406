// qcow2::Image: a qcow2 file as a block::Device.
//
// Opening: Image::Open decodes and validates the header, loads the L1 table
// and refcount table, and opens the backing file (if any) through the
// caller's BackingOpener (block/open.cc resolves names and limits depth).
// An image with the corrupt bit opens read-only, with a warning naming why.
// An image with the dirty bit (lazy refcounts) has its refcounts rebuilt on
// a read-write open. OpenOptions::snapshot opens an internal snapshot's
// content read-only instead of the active image.
//
// Thread safety: all methods are safe for concurrent use (block::Device).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "block/device.h"
#include "io/storage.h"
#include "qcow2/format.h"
#include "qcow2/snapshot_selector.h"
#include "util/result.h"

namespace thindisk::qcow2 {

// Opens the backing image named in a header. `name` is as stored in the
// image, `format` empty when the header has no backing format extension.
using BackingOpener = std::function<Result<std::unique_ptr<block::Device>>(
    const std::string& name, const std::string& format)>;

struct OpenOptions {
  bool read_only = false;
  // Memory cap for the L2 and refcount caches together. The default covers
  // the metadata of a multi-TiB image with 128 KiB clusters.
  uint64_t cache_bytes = 64ull << 20;
  BackingOpener open_backing;  // null: an image with a backing file fails to open
  // Do not open the backing file even if the header names one (info, check,
  // rebase -u): reads of unallocated ranges then return zeros.
  bool no_backing = false;
  // Guest bytes an enabled bitmap marks ahead at once (rounded to its
  // granularity); 0: BitmapTracker::kMarkAheadBytes. Smaller costs more
  // syncs and leaves less marked after a crash: the crash suite sets it
  // small so that its coverage check has teeth.
  uint64_t bitmap_mark_ahead = 0;
  // Open this internal snapshot's view instead of the active image (qemu-nbd
  // -l): read-only whatever read_only says, with the snapshot's L1 table and
  // virtual size (its disk_size; the current size on images whose snapshot
  // table has no disk_size). kNotFound when no snapshot matches.
  SnapshotSelector snapshot;
};

// qemu's preallocation modes (create, resize): kMetadata maps every guest
// cluster to a host cluster; kFalloc also reserves that host space; kFull
// also writes zeros to it.
enum class Preallocation { kOff, kMetadata, kFalloc, kFull };

class Image : public block::Device {
 public:
  static Result<std::unique_ptr<Image>> Open(std::unique_ptr<io::Storage> storage,
                                             const OpenOptions& options);
  ~Image() override;

  // The decoded header as currently on disk.
  virtual const Header& header() const = 0;
  virtual io::Storage& storage() = 0;
  virtual block::Device* backing() = 0;  // null when none or not opened

  // Writes one whole cluster (offset cluster-aligned; data.size() ==
  // cluster_size, or the tail of the image) compressed with the image's
  // compression type, if that saves at least one 512-byte sector; otherwise
  // stores it plainly. Used by convert -c.
  virtual Status WriteCompressed(uint64_t offset, std::span<const uint8_t> data) = 0;

  // Makes [offset, offset + length) unallocated in this image, so reads fall
  // through to the backing file (zeros without one); unlike Discard, which
  // makes a clone's range read as zeros. offset and length are multiples of
  // the subcluster size (length may end at the end of the image), else
  // kInvalidArgument. Host space this image owns is punched only after the
  // new mappings are durable (the call flushes), so a crash at any point
  // leaves each range reading as before or as the backing file: commit
  // empties an overlay this way once its backing file holds the same data.
  virtual Status Deallocate(uint64_t offset, uint64_t length) = 0;

  // Grows the image to `new_size` as Resize does (the grown range reads as
  // zeros), then, unless mode is kOff, gives each guest cluster from the
  // one holding the old end up to the new end that has no host cluster
  // one, as qemu-img resize --preallocation does (image_preallocate.cc).
  // What every byte reads is unchanged: standard L2 maps zero-filled data
  // clusters; extended L2 keeps the subclusters' state (unallocated or
  // zero) and only reserves the host cluster, as qemu does. A cluster that
  // shows backing data through is left alone. kFalloc where the host can't
  // fallocate writes zeros and sets *warning (as Create). kInvalidArgument
  // when new_size < size() ("preallocation cannot be used when shrinking").
  virtual Status GrowPreallocated(uint64_t new_size, Preallocation mode,
                                  std::string* warning = nullptr) = 0;

 protected:
  Image() = default;
};

struct CreateOptions {
  uint64_t size = 0;
  uint32_t cluster_size = 128 * 1024;
  bool extended_l2 = true;
  Preallocation preallocation = Preallocation::kOff;
  CompressionType compression_type = CompressionType::kZstd;
  bool lazy_refcounts = false;
  uint32_t refcount_bits = 16;
  uint32_t version = 3;  // 2 = compat 0.10, 3 = compat 1.1
  std::string backing_file;
  std::string backing_format;
};

// Writes a new, empty qcow2 image onto `storage` (which must be empty).
// Validates the options (kInvalidArgument with the reason: cluster size not a
// power of two in [512, 2 MiB], extended_l2 with clusters < 16 KiB, zstd or
// extended_l2 or lazy_refcounts with compat 0.10, refcount_bits not a power of
// two <= 64 or != 16 with compat 0.10, ...). preallocation=falloc where the
// host can't fallocate falls back to kFull-style zero writes and sets
// *warning to say so (when warning is non-null).
Status Create(io::Storage& storage, const CreateOptions& options, std::string* warning = nullptr);

}  // namespace thindisk::qcow2
