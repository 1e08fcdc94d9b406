// vhd::VhdImage: a Microsoft VHD image ("vpc" in qemu) as a read-only
// block::Device.
//
// Reads the two self-contained disk types of the VHD specification:
//  - fixed: the guest's bytes, then the footer in the last 512 bytes; host
//    holes are reported as holes.
//  - dynamic: footer copy, dynamic header, block allocation table (BAT);
//    each allocated block is a sector bitmap followed by the block's data.
//    Unallocated blocks, and sectors whose bitmap bit is clear, are holes
//    that read as zeros.
// The disk's size is the footer's current_size (what the footer states; for
// images qemu-img writes it equals the CHS geometry's size). Differencing
// disks (they need a parent) are refused with kNotSupported; writes are
// refused: thindisk imports vhd with convert.
//
// Thread safety: block::Device contract (all methods concurrently); the BAT
// is read once at open and never changes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "block/read_only_image.h"
#include "io/storage.h"
#include "util/result.h"
#include "vhd/format.h"

namespace thindisk::vhd {

class VhdImage final : public block::ReadOnlyImage {
 public:
  // Opens the vhd in `storage`; `filename` is what info().filename reports.
  // The footer at the end of the file is used, or for dynamic disks the copy
  // at the start when the end one is damaged. Errors: kCorrupt (bad cookie,
  // checksum, field out of its limit, BAT entry or block past the end of the
  // file), kNotSupported (differencing disks, unknown versions), each naming
  // the file.
  static Result<std::unique_ptr<VhdImage>> Open(std::unique_ptr<io::Storage> storage,
                                                const std::string& filename);

  Status Read(uint64_t offset, std::span<uint8_t> buf) override;
  Result<block::Extent> GetStatus(uint64_t offset, uint64_t max_length) override;

  DiskType disk_type() const { return footer_.disk_type; }
  const Footer& footer() const { return footer_; }
  io::Storage& storage() { return *storage_; }

 private:
  VhdImage(block::DeviceInfo info, uint64_t size) : ReadOnlyImage(std::move(info), size) {}

  // Host byte offset of block `index`'s bitmap, or kBatUnused's meaning
  // (false) when the block has no storage.
  bool BlockStart(uint64_t index, uint64_t* start) const;
  // The sector bitmap of the block whose bitmap starts at `start`.
  Result<std::vector<uint8_t>> ReadBitmap(uint64_t start);
  // Reads [in_block, in_block + out.size()) of an allocated block.
  Status ReadFromBlock(uint64_t start, uint64_t in_block, std::span<uint8_t> out);

  std::unique_ptr<io::Storage> storage_;
  Footer footer_;
  DynamicHeader dynamic_;      // dynamic disks only
  std::vector<uint32_t> bat_;  // dynamic disks only: one entry per block of the disk
};

// True when `storage` is a vhd by its first sector: the footer cookie that
// dynamic disks keep a copy of there. A fixed disk has its footer only in the
// last sector, which a raw guest can write: probing it there would let a guest
// turn its raw disk into a read-only vhd 512 bytes shorter (and a conversion
// would silently drop its last sector). So, as with qemu-img, a fixed vhd
// probes as raw and is opened with `-f vpc`.
Result<bool> Probe(io::Storage& storage);

}  // namespace thindisk::vhd
