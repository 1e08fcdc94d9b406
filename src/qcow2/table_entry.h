// qcow2 table entries: one entry of an L1, L2 or refcount table, encoded
// and decoded as the specification lays it out (docs/interop/qcow2.txt in
// QEMU, "Cluster mapping" and "Host cluster management"). Pure functions,
// no I/O; an L2 entry read from an image is untrusted and DecodeL2Entry
// validates it before any field is used.
//
// Included by qcow2/format.h, so code that includes format.h sees these too.
// Thread safety: stateless functions, safe from any thread.
#pragma once

#include <cstdint>
#include <span>

#include "util/result.h"

namespace thindisk::qcow2 {

// ---- L1 / L2 entries ----

inline constexpr uint64_t kOffsetMask = 0x00fffffffffffe00ull;  // bits 9-55
inline constexpr uint64_t kCopied = 1ull << 63;                // refcount == 1
inline constexpr uint64_t kCompressed = 1ull << 62;
inline constexpr uint64_t kZeroFlag = 1ull << 0;  // standard L2 only (v3)
inline constexpr uint64_t kL1Reserved = 0x7f000000000001ffull;  // must be zero

// L1 entry: offset of the L2 table (0 = unallocated) and the COPIED flag.
inline uint64_t L1Offset(uint64_t entry) { return entry & kOffsetMask; }

enum class ClusterKind : uint8_t {
  kUnallocated,  // reads from backing, or zeros
  kZero,         // reads as zeros (standard L2 zero flag; host offset may be kept)
  kNormal,       // data at host_offset (extended L2: per-subcluster state applies)
  kCompressed,   // compressed data at host_offset, compressed_size bytes
};

struct L2Mapping {
  ClusterKind kind = ClusterKind::kUnallocated;
  uint64_t host_offset = 0;      // cluster-aligned for kNormal/kZero; byte offset if compressed
  uint64_t compressed_size = 0;  // kCompressed: bytes to read starting at host_offset
  bool copied = false;
  // Extended L2 only: bit i of alloc = subcluster i allocated; bit i of zero
  // = subcluster i reads as zeros.
  uint32_t alloc_bitmap = 0;
  uint32_t zero_bitmap = 0;
};

// Decodes one L2 entry (and, for extended L2, its bitmap word). Validates
// reserved bits, alignment of host offsets (kCorrupt: "unaligned L2 entry").
// For compressed clusters the offset/size split depends on cluster_bits.
Result<L2Mapping> DecodeL2Entry(uint64_t entry, uint64_t bitmap, bool extended_l2,
                                uint32_t cluster_bits);
// Inverse of DecodeL2Entry: returns {entry, bitmap}.
struct L2Words {
  uint64_t entry = 0;
  uint64_t bitmap = 0;
};
L2Words EncodeL2Entry(const L2Mapping& m, bool extended_l2, uint32_t cluster_bits);

// ---- refcounts ----

// Reads/writes entry `index` of a refcount block of width 2^refcount_order
// bits (big-endian, spec layout). REQUIRES: index within the block, value fits.
uint64_t GetRefcount(std::span<const uint8_t> block, uint32_t refcount_order, uint64_t index);
void SetRefcount(std::span<uint8_t> block, uint32_t refcount_order, uint64_t index,
                 uint64_t value);
inline uint64_t MaxRefcount(uint32_t refcount_order) {
  return refcount_order == 6 ? ~0ull : (1ull << (1u << refcount_order)) - 1;
}

}  // namespace thindisk::qcow2
