// qcow2 persistent bitmaps, on disk: the bitmaps header extension, the
// bitmap directory and bitmap table entries, encoded and decoded as the
// specification lays them out (docs/interop/qcow2.txt in QEMU, "Bitmaps
// extension" and "Bitmaps"). Pure functions, no I/O: what an image holds
// is untrusted and checked against the limits below before it is used to
// size anything. Tracking writes in bitmaps is qcow2/bitmap_tracker.h; the
// operations on them (add, remove, merge, ...) are qcow2/bitmaps.h.
//
// Included by qcow2/format.h. Thread safety: stateless, safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/result.h"

namespace thindisk::qcow2 {

// Autoclear bit 0: the bitmaps extension is consistent. Software that does
// not maintain the bitmaps clears it when it writes the image.
inline constexpr uint64_t kAutoclearBitmaps = 1ull << 0;

// Limits, each with its reason (QEMU's, so every bitmap we accept or write
// also opens in qemu).
inline constexpr uint32_t kMaxBitmaps = 65535;
inline constexpr uint32_t kMaxBitmapNameSize = 1023;
inline constexpr uint32_t kMinBitmapGranularityBits = 9;   // 512 bytes a bit
inline constexpr uint32_t kMaxBitmapGranularityBits = 31;  // 2 GiB a bit
// A directory entry is at most 24 + 1023 bytes of name, padded; QEMU bounds
// the directory at 1 KiB an entry.
inline constexpr uint64_t kMaxBitmapDirectorySize = 1024ull * kMaxBitmaps;
// The data of a tracked bitmap lives in memory: at most 512 MiB of it (a
// 1 TiB disk at 512-byte granularity needs 256 MiB; at 64 KiB, 2 MiB), and
// a table of at most 2^27 entries.
inline constexpr uint64_t kMaxBitmapDataBytes = 512ull << 20;
inline constexpr uint64_t kMaxBitmapTableEntries = 1ull << 27;

// Directory entry flags.
inline constexpr uint32_t kBitmapInUse = 1u << 0;  // not saved correctly: inconsistent
inline constexpr uint32_t kBitmapAuto = 1u << 1;   // enabled: tracks every change
inline constexpr uint32_t kBitmapExtraDataCompatible = 1u << 2;
inline constexpr uint32_t kBitmapKnownFlags = kBitmapInUse | kBitmapAuto | kBitmapExtraDataCompatible;
inline constexpr uint8_t kBitmapTypeDirtyTracking = 1;

// Bitmap table entries: bits 9-55 the data cluster's host offset; with the
// offset 0, bit 0 says whether the cluster reads as all ones.
inline constexpr uint64_t kBitmapTableOffsetMask = 0x00fffffffffffe00ull;
inline constexpr uint64_t kBitmapTableReserved = 0xff000000000001feull;
inline constexpr uint64_t kBitmapTableAllOnes = 1ull << 0;

// The header extension's fields (24 bytes on disk).
inline constexpr uint32_t kBitmapsExtensionSize = 24;
struct BitmapsExtension {
  uint32_t nb_bitmaps = 0;
  uint64_t bitmap_directory_size = 0;
  uint64_t bitmap_directory_offset = 0;
};

// Decodes and validates the extension: exactly 24 bytes, reserved bytes
// zero, 1 <= nb_bitmaps <= kMaxBitmaps, a directory no larger than
// kMaxBitmapDirectorySize, cluster aligned, not at 0, inside the file.
// kCorrupt naming the field otherwise.
Result<BitmapsExtension> DecodeBitmapsExtension(std::span<const uint8_t> data,
                                                uint64_t cluster_size, uint64_t file_size);
std::vector<uint8_t> EncodeBitmapsExtension(const BitmapsExtension& ext);

struct BitmapDirectoryEntry {
  uint64_t bitmap_table_offset = 0;
  uint32_t bitmap_table_size = 0;  // entries
  uint32_t flags = 0;
  uint8_t type = kBitmapTypeDirtyTracking;
  uint8_t granularity_bits = 16;
  std::string name;
  std::vector<uint8_t> extra_data;  // kept as read

  bool in_use() const { return flags & kBitmapInUse; }
  bool enabled() const { return flags & kBitmapAuto; }
  uint64_t granularity() const { return uint64_t{1} << granularity_bits; }
};

// Decodes `nb_bitmaps` entries that must fill `bytes` exactly (the
// directory size of the extension). Per entry: the fixed fields, name_size
// 1..kMaxBitmapNameSize, padding to 8 bytes all zeros; names are unique.
// What is wrong with one bitmap but not with the directory's shape (flags,
// type, granularity, table place and size) is left to
// CheckBitmapEntry, so one bad bitmap does not hide the others.
Result<std::vector<BitmapDirectoryEntry>> DecodeBitmapDirectory(std::span<const uint8_t> bytes,
                                                                uint32_t nb_bitmaps);
// Encodes entries (names and extra data must be within the limits above;
// the caller validated them).
std::vector<uint8_t> EncodeBitmapDirectory(const std::vector<BitmapDirectoryEntry>& entries);

// Bits, bytes of data, and table entries of a bitmap of `granularity_bits`
// over a disk of `virtual_size` bytes, with clusters of `cluster_size`.
uint64_t BitmapBits(uint64_t virtual_size, uint32_t granularity_bits);
uint64_t BitmapDataBytes(uint64_t virtual_size, uint32_t granularity_bits);
uint64_t BitmapTableEntries(uint64_t virtual_size, uint32_t granularity_bits,
                            uint64_t cluster_size);

// Whether a bitmap of this granularity over this disk stays within the
// limits (kInvalidArgument with the reason when not): for `bitmap --add`.
Status CheckBitmapGeometry(uint64_t virtual_size, uint32_t granularity_bits,
                           uint64_t cluster_size);

// Checks one directory entry against the image: reserved flags, type,
// granularity, the table's size for this virtual size and its place in the
// file. "" when the bitmap is usable; otherwise why not (the bitmap is then
// left as it is and reported, never tracked).
std::string CheckBitmapEntry(const BitmapDirectoryEntry& e, uint64_t virtual_size,
                             uint64_t cluster_size, uint64_t file_size);

// One table entry: where its data cluster is (0: none), and how a missing
// cluster reads. kCorrupt for reserved bits, an unaligned offset, the
// all-ones bit beside an offset, or a cluster outside the file.
struct BitmapTableEntry {
  uint64_t host_offset = 0;
  bool all_ones = false;
};
Result<BitmapTableEntry> DecodeBitmapTableEntry(uint64_t raw, uint64_t cluster_size,
                                                uint64_t file_size);
uint64_t EncodeBitmapTableEntry(const BitmapTableEntry& e);

}  // namespace thindisk::qcow2
