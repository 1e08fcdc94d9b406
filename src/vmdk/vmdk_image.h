// vmdk::VmdkImage: a VMware VMDK image as a read-only block::Device.
//
// Reads the single-extent ("monolithic") layouts of the Virtual Disk Format
// 5.0 specification:
//  - monolithicSparse: one file, "KDMV" sparse header, embedded descriptor,
//    grain directory and tables; unallocated grains are holes.
//  - streamOptimized: the same with deflate-compressed grains behind
//    markers, the grain directory possibly found through the footer.
//  - monolithicFlat (and vmfs): a text descriptor file naming one flat
//    extent file, read in place; host holes are holes.
// Split (twoGbMaxExtent*), multi-extent, delta-link (parentCID) and ESX
// "COWD" images are refused with kNotSupported. Writes are refused:
// thindisk imports vmdk with convert, it does not maintain vmdk images.
//
// Thread safety: block::Device contract (all methods concurrently).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "block/read_only_image.h"
#include "io/storage.h"
#include "util/result.h"
#include "vmdk/descriptor.h"
#include "vmdk/sparse_extent.h"

namespace thindisk::vmdk {

// What qemu-img info reports under format-specific for a vmdk.
struct ExtentDescription {
  std::string filename;  // path of the extent file
  uint64_t virtual_size = 0;
  uint32_t cluster_size = 0;  // grain size; 0 for flat extents
  std::string format;         // "" for sparse (as qemu prints it), "FLAT", "VMFS"
  bool compressed = false;
};
struct Description {
  std::string create_type;
  uint32_t cid = 0;
  uint32_t parent_cid = kNoParentCid;
  std::vector<ExtentDescription> extents;
};

// An extent file opened for a descriptor, and the path it was opened as.
struct OpenedExtent {
  std::unique_ptr<io::Storage> storage;
  std::string path;
};
// Opens (read-only) the extent file a descriptor names, as written in the
// descriptor; the caller resolves it relative to the descriptor's directory.
using OpenExtentFn = std::function<Result<OpenedExtent>(const std::string& name)>;

class VmdkImage final : public block::ReadOnlyImage {
 public:
  // Opens the vmdk in `storage` (what the user named, `filename`).
  // Errors: kCorrupt (malformed header, descriptor, tables), kNotSupported
  // (layouts listed above), errors of `open_extent`, each naming the file.
  static Result<std::unique_ptr<VmdkImage>> Open(std::unique_ptr<io::Storage> storage,
                                                 const std::string& filename,
                                                 const OpenExtentFn& open_extent);

  Status Read(uint64_t offset, std::span<uint8_t> buf) override;
  Result<block::Extent> GetStatus(uint64_t offset, uint64_t max_length) override;

  const Description& description() const { return description_; }
  // Host bytes allocated by every file of the image (descriptor and
  // extent), for info's actual-size.
  Result<uint64_t> AllocatedBytes();

 private:
  VmdkImage(block::DeviceInfo info, uint64_t size) : ReadOnlyImage(std::move(info), size) {}

  std::unique_ptr<io::Storage> file_;    // what was opened
  std::unique_ptr<io::Storage> extent_;  // a separate extent file, if any
  io::Storage* data_ = nullptr;          // the extent: file_ or extent_
  std::unique_ptr<SparseExtent> sparse_;  // sparse layouts
  uint64_t flat_offset_ = 0;             // flat layouts: bytes into data_
  Description description_;
};

// True when `storage` starts like a vmdk: the "KDMV" or "COWD" magic, or a
// text descriptor ("# Disk DescriptorFile") in a file no larger than
// kMaxDescriptorBytes. The size cap keeps a raw disk whose guest wrote
// that line from being taken for a descriptor that names host files.
Result<bool> Probe(io::Storage& storage);

}  // namespace thindisk::vmdk
