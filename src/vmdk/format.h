// VMDK on-disk structures: pure decode and validation, no I/O.
//
// Written from VMware's "Virtual Disk Format 5.0" specification: the hosted
// sparse extent header (magic "KDMV"), grain directory and grain tables, the
// stream-optimized markers and footer. All fields are little-endian. Field
// names follow the specification. Everything decoded is untrusted and
// checked against the named limits below before it sizes anything.
#pragma once

#include <cstdint>
#include <span>

#include "util/result.h"

namespace thindisk::vmdk {

inline uint32_t LoadLe32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
inline uint64_t LoadLe64(const uint8_t* p) { return LoadLe32(p) | uint64_t(LoadLe32(p + 4)) << 32; }
inline void StoreLe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
inline void StoreLe64(uint8_t* p, uint64_t v) {
  StoreLe32(p, uint32_t(v));
  StoreLe32(p + 4, uint32_t(v >> 32));
}

inline constexpr uint32_t kSectorSize = 512;
inline constexpr uint32_t kSparseMagic = 0x564d444b;  // "KDMV" read little-endian
inline constexpr uint32_t kCowdMagic = 0x434f5744;    // "COWD": ESX/GSX sparse (VMDK3)
inline constexpr uint32_t kHeaderSize = 512;

// Header flags (spec: "flags").
inline constexpr uint32_t kFlagNewlineTest = 1u << 0;
inline constexpr uint32_t kFlagRedundantGt = 1u << 1;
inline constexpr uint32_t kFlagZeroedGrainGte = 1u << 2;
inline constexpr uint32_t kFlagCompressed = 1u << 16;
inline constexpr uint32_t kFlagMarkers = 1u << 17;

inline constexpr uint16_t kCompressionNone = 0;
inline constexpr uint16_t kCompressionDeflate = 1;

// gdOffset of a stream-optimized header whose grain directory is found
// through the footer at the end of the file.
inline constexpr uint64_t kGdAtEnd = ~0ull;

// Grain table entries with a meaning other than "sector of the grain".
inline constexpr uint32_t kGteUnallocated = 0;
inline constexpr uint32_t kGteZeroed = 1;  // spec: zeroed-grain GTE

// Marker types (stream-optimized), in a marker whose size field is 0.
inline constexpr uint32_t kMarkerEndOfStream = 0;
inline constexpr uint32_t kMarkerGrainTable = 1;
inline constexpr uint32_t kMarkerGrainDirectory = 2;
inline constexpr uint32_t kMarkerFooter = 3;
// A compressed grain starts with lba (8 bytes) and the compressed size (4).
inline constexpr uint32_t kGrainMarkerSize = 12;

// Limits, each with its reason.
// Versions 1-3 are what the spec and VMware/qemu write.
inline constexpr uint32_t kMaxVersion = 3;
// The spec asks for a power of two above 8 sectors; small powers are
// accepted (qemu does) but grains above 64 MiB would let one request size
// a huge buffer.
inline constexpr uint64_t kMaxGrainSectors = 1ull << 17;
// The spec fixes numGTEsPerGT at 512; anything up to 512 Ki entries (2 MiB
// tables) is read, larger is how a hostile header asks for memory.
inline constexpr uint32_t kMaxGtesPerGt = 512 * 1024;
// 64 TiB: 32-bit sector pointers cap a sparse extent file at 2 TiB, and
// anything far beyond that can only serve a hostile header.
inline constexpr uint64_t kMaxCapacitySectors = (64ull << 40) / kSectorSize;
// Embedded descriptors are a few KiB; 1 MiB is generous.
inline constexpr uint64_t kMaxDescriptorBytes = 1ull << 20;
// A compressed grain larger than deflate's worst case for a whole grain is
// corrupt (deflate adds at most ~0.1% plus a few bytes of framing).
inline uint64_t MaxCompressedGrainBytes(uint64_t grain_bytes) {
  return grain_bytes + grain_bytes / 64 + 1024;
}

struct SparseHeader {
  uint32_t version = 0;
  uint32_t flags = 0;
  uint64_t capacity = 0;    // sectors
  uint64_t grain_size = 0;  // sectors
  uint64_t descriptor_offset = 0;  // sectors; 0 = none
  uint64_t descriptor_size = 0;    // sectors
  uint32_t num_gtes_per_gt = 0;
  uint64_t rgd_offset = 0;  // redundant grain directory (sectors): ignored
  uint64_t gd_offset = 0;   // sectors, or kGdAtEnd
  uint64_t over_head = 0;   // sectors
  bool unclean_shutdown = false;
  uint16_t compress_algorithm = 0;

  uint64_t grain_bytes() const { return grain_size * kSectorSize; }
  uint64_t capacity_bytes() const { return capacity * kSectorSize; }
  bool compressed() const { return (flags & kFlagCompressed) != 0; }
  // Guest bytes one grain table covers.
  uint64_t gt_coverage_bytes() const { return grain_bytes() * num_gtes_per_gt; }
  // Entries in the grain directory: one per grain table the capacity needs.
  uint64_t gd_entries() const {
    uint64_t per_gt = grain_size * num_gtes_per_gt;
    return (capacity + per_gt - 1) / per_gt;
  }
};

// Decodes and validates the 512-byte header at `bytes` (at least
// kHeaderSize) of a file of `file_size` bytes: magic, version, grain size,
// table geometry, descriptor and grain directory inside the file (unless
// gd_offset is kGdAtEnd), compression. Errors: kCorrupt (bad magic, field out
// of its limit, past the end of file), kNotSupported (unknown version or
// compression algorithm).
Result<SparseHeader> DecodeSparseHeader(std::span<const uint8_t> bytes, uint64_t file_size);

// Encodes `h` as a 512-byte header (tests and tools build images with it).
void EncodeSparseHeader(const SparseHeader& h, std::span<uint8_t> out);

// A marker (stream-optimized): value (lba or sector count), size (0 for a
// metadata marker, else the compressed grain's byte count) and, for
// metadata markers, the type.
struct Marker {
  uint64_t value = 0;
  uint32_t size = 0;
  uint32_t type = 0;
};
// Decodes the first 16 bytes of a marker. REQUIRES: bytes.size() >= 16.
Marker DecodeMarker(std::span<const uint8_t> bytes);

}  // namespace thindisk::vmdk
