// Locating and patching qcow2 structures inside an image held in memory, to
// build hostile images from valid ones. Offsets and masks are taken from the
// qcow2 specification (docs/interop/qcow2.txt in QEMU), independently of the
// engine's codec, so a codec bug cannot hide a test bug.
//
// The images patched here were just made by qemu-img, so they are trusted;
// the helpers assert (gtest ASSERTs in callers) rather than validate.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "util/endian.h"

namespace thindisk::testing {

using Bytes = std::vector<uint8_t>;

// Header field offsets (spec, "Header").
inline constexpr size_t kMagicAt = 0;
inline constexpr size_t kVersionAt = 4;
inline constexpr size_t kBackingFileOffsetAt = 8;
inline constexpr size_t kBackingFileSizeAt = 16;
inline constexpr size_t kClusterBitsAt = 20;
inline constexpr size_t kSizeAt = 24;
inline constexpr size_t kCryptMethodAt = 32;
inline constexpr size_t kL1SizeAt = 36;
inline constexpr size_t kL1TableOffsetAt = 40;
inline constexpr size_t kRefcountTableOffsetAt = 48;
inline constexpr size_t kRefcountTableClustersAt = 56;
inline constexpr size_t kIncompatibleFeaturesAt = 72;
inline constexpr size_t kRefcountOrderAt = 96;
inline constexpr size_t kHeaderLengthAt = 100;
inline constexpr size_t kCompressionTypeAt = 104;

inline constexpr uint64_t kOffsetMask = 0x00fffffffffffe00ull;  // L1/L2 bits 9-55
inline constexpr uint64_t kCopiedFlag = 1ull << 63;
inline constexpr uint64_t kCompressedFlag = 1ull << 62;
inline constexpr uint64_t kIncompatDataFile = 1ull << 2;
inline constexpr uint64_t kIncompatCompression = 1ull << 3;
inline constexpr uint32_t kExtEnd = 0;
inline constexpr uint32_t kExtFeatureNameTable = 0x6803f857;
inline constexpr uint32_t kExtBitmaps = 0x23852875;

inline uint32_t Get32(const Bytes& b, size_t at) { return LoadBe32(b.data() + at); }
inline uint64_t Get64(const Bytes& b, size_t at) { return LoadBe64(b.data() + at); }
inline void Put32(Bytes& b, size_t at, uint32_t v) { StoreBe32(b.data() + at, v); }
inline void Put64(Bytes& b, size_t at, uint64_t v) { StoreBe64(b.data() + at, v); }

inline uint32_t ClusterBits(const Bytes& b) { return Get32(b, kClusterBitsAt); }
inline uint64_t ClusterSize(const Bytes& b) { return 1ull << ClusterBits(b); }
inline bool ExtendedL2(const Bytes& b) {
  return Get32(b, kVersionAt) >= 3 && (Get64(b, kIncompatibleFeaturesAt) & (1ull << 4));
}

// Byte position of L1 entry `index`.
inline size_t L1EntryAt(const Bytes& b, uint64_t index) {
  return Get64(b, kL1TableOffsetAt) + 8 * index;
}

// Byte position of the L2 entry for guest cluster `cluster` (in the first L2
// table's range). REQUIRES: that L2 table is allocated.
inline size_t L2EntryAt(const Bytes& b, uint64_t cluster) {
  uint64_t l2 = Get64(b, L1EntryAt(b, 0)) & kOffsetMask;
  return l2 + cluster * (ExtendedL2(b) ? 16 : 8);
}

// Header extensions, in order, without the end marker.
struct Extension {
  uint32_t type = 0;
  Bytes data;
};

inline std::vector<Extension> ReadExtensions(const Bytes& b) {
  std::vector<Extension> exts;
  size_t at = Get32(b, kVersionAt) >= 3 ? Get32(b, kHeaderLengthAt) : 72;
  while (at + 8 <= b.size()) {
    uint32_t type = Get32(b, at);
    uint32_t length = Get32(b, at + 4);
    if (type == kExtEnd) break;
    exts.push_back({type, Bytes(b.begin() + at + 8, b.begin() + at + 8 + length)});
    at += 8 + (length + 7) / 8 * 8;
  }
  return exts;
}

// Rewrites the extension area (plus an end marker) right after the header.
// Returns the offset just past the end marker. The caller keeps it clear of
// the backing file name.
inline size_t WriteExtensions(Bytes& b, const std::vector<Extension>& exts) {
  size_t at = Get32(b, kVersionAt) >= 3 ? Get32(b, kHeaderLengthAt) : 72;
  for (const Extension& e : exts) {
    Put32(b, at, e.type);
    Put32(b, at + 4, uint32_t(e.data.size()));
    size_t padded = (e.data.size() + 7) / 8 * 8;
    std::fill(b.begin() + at + 8, b.begin() + at + 8 + padded, 0);
    std::copy(e.data.begin(), e.data.end(), b.begin() + at + 8);
    at += 8 + padded;
  }
  Put32(b, at, kExtEnd);
  Put32(b, at + 4, 0);
  return at + 8;
}

// One 48-byte feature name table entry (type 0 = incompatible).
inline Bytes FeatureNameEntry(uint8_t type, uint8_t bit, const std::string& name) {
  Bytes e(48, 0);
  e[0] = type;
  e[1] = bit;
  std::copy(name.begin(), name.end(), e.begin() + 2);
  return e;
}

}  // namespace thindisk::testing
