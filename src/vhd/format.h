// VHD on-disk structures: pure decode and validation, no I/O.
//
// Written from Microsoft's "Virtual Hard Disk Image Format Specification"
// (v1.0): the 512-byte footer (cookie "conectix"), the 1024-byte dynamic
// disk header (cookie "cxsparse"), the block allocation table (BAT) and the
// per-block sector bitmaps. All fields are big-endian; both structures carry
// a one's-complement checksum that is verified. Everything decoded is
// untrusted and checked against the named limits below.
#pragma once

#include <cstdint>
#include <span>

#include "util/result.h"

namespace thindisk::vhd {

inline constexpr uint32_t kSectorSize = 512;
inline constexpr uint32_t kFooterSize = 512;
inline constexpr uint32_t kDynamicHeaderSize = 1024;

enum class DiskType : uint32_t { kFixed = 2, kDynamic = 3, kDifferencing = 4 };

// BAT entry of a block with no storage.
inline constexpr uint32_t kBatUnused = 0xffffffff;
// data_offset of a fixed disk's footer (no dynamic header).
inline constexpr uint64_t kNoDataOffset = ~0ull;

// Limits, each with its reason.
// The spec caps VHDs at 2040 GiB (the CHS geometry's reach); Hyper-V and
// qemu refuse larger ones.
inline constexpr uint64_t kMaxDiskSize = 2040ull << 30;
// Blocks are 2 MiB by default (spec) and 512 KiB..2 MiB in practice; a
// power of two from one sector to 256 MiB is accepted.
inline constexpr uint32_t kMinBlockSize = kSectorSize;
inline constexpr uint32_t kMaxBlockSize = 256u << 20;
// Enough entries for kMaxDiskSize at the smallest block size would be 4 Gi;
// the BAT must also fit in the file, which bounds it first in practice.
inline constexpr uint64_t kMaxBatBytes = 256ull << 20;

struct Footer {
  uint32_t features = 0;
  uint32_t file_format_version = 0;
  uint64_t data_offset = 0;  // dynamic header's byte offset, or kNoDataOffset
  uint32_t timestamp = 0;
  char creator_application[4] = {};
  uint64_t original_size = 0;
  uint64_t current_size = 0;  // the disk's size in bytes
  uint16_t cylinders = 0;
  uint8_t heads = 0;
  uint8_t sectors_per_track = 0;
  DiskType disk_type = DiskType::kFixed;
  uint32_t checksum = 0;
};

struct DynamicHeader {
  uint64_t table_offset = 0;  // BAT byte offset
  uint32_t header_version = 0;
  uint32_t max_table_entries = 0;
  uint32_t block_size = 0;
  uint32_t checksum = 0;

  // Bytes of the sector bitmap in front of each block (sector-rounded).
  uint64_t bitmap_bytes() const {
    uint64_t bits = block_size / kSectorSize;
    return ((bits + 7) / 8 + kSectorSize - 1) / kSectorSize * kSectorSize;
  }
};

// One's complement of the byte sum of `bytes` with the 4 checksum bytes at
// `checksum_at` counted as zero (the spec's checksum for both structures).
uint32_t Checksum(std::span<const uint8_t> bytes, size_t checksum_at);

// True when `bytes` (>= 8) start with the footer cookie "conectix".
bool HasFooterCookie(std::span<const uint8_t> bytes);

// Decodes and validates a footer (kFooterSize bytes): cookie, checksum,
// version, disk type, size. Errors: kCorrupt; kNotSupported for
// differencing disks (they need a parent) and unknown versions or types.
Result<Footer> DecodeFooter(std::span<const uint8_t> bytes);

// Decodes and validates the dynamic header (kDynamicHeaderSize bytes) of a
// disk of `footer.current_size` bytes in a file of `file_size` bytes: cookie,
// checksum, version, block size, BAT big enough for the disk and inside the
// file. Errors: kCorrupt, kNotSupported (unknown version).
Result<DynamicHeader> DecodeDynamicHeader(std::span<const uint8_t> bytes, const Footer& footer,
                                          uint64_t file_size);

// Encoders for tests and tools: fields as given, checksum computed.
void EncodeFooter(const Footer& f, std::span<uint8_t> out);
void EncodeDynamicHeader(const DynamicHeader& h, std::span<uint8_t> out);

}  // namespace thindisk::vhd
