// qcow2 table entries: L2 entries (standard, extended, compressed) and
// refcount entries of every width. Every L2 entry is checked for reserved
// bits and alignment before its offset is used.
#include "qcow2/table_entry.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/endian.h"

namespace thindisk::qcow2 {

// ---- L2 entries ----

namespace {

// Compressed descriptor layout for a cluster size: offset in bits [0, x),
// additional sector count in bits [x, 62).
struct CompressedLayout {
  uint32_t x;
  uint64_t offset_mask;
  uint64_t sectors_mask;  // after shifting right by x
};

CompressedLayout LayoutFor(uint32_t cluster_bits) {
  uint32_t x = 62 - (cluster_bits - 8);
  return {x, (uint64_t{1} << x) - 1, (uint64_t{1} << (62 - x)) - 1};
}

constexpr uint64_t kStandardReserved = 0x3f000000000001feull;  // bits 1-8, 56-61

}  // namespace

Result<L2Mapping> DecodeL2Entry(uint64_t entry, uint64_t bitmap, bool extended_l2,
                                uint32_t cluster_bits) {
  L2Mapping m;
  m.copied = entry & kCopied;
  if (entry & kCompressed) {
    if (m.copied) return Status::Corrupt("compressed L2 entry has the COPIED flag set");
    if (extended_l2 && bitmap != 0) {
      return Status::Corrupt(fmt::format(
          "compressed L2 entry has a non-zero subcluster bitmap {:#x}", bitmap));
    }
    CompressedLayout c = LayoutFor(cluster_bits);
    m.kind = ClusterKind::kCompressed;
    m.host_offset = entry & c.offset_mask;
    if (m.host_offset & ~kOffsetMask & ~uint64_t{0x1ff}) {
      return Status::Corrupt(fmt::format(
          "compressed L2 entry has host offset {:#x} beyond 56 bits", m.host_offset));
    }
    uint64_t sectors = (entry >> c.x) & c.sectors_mask;
    m.compressed_size = (sectors + 1) * 512 - (m.host_offset & 511);
    return m;
  }
  uint64_t reserved = kStandardReserved | (extended_l2 ? kZeroFlag : 0);
  if (entry & reserved) {
    return Status::Corrupt(fmt::format("L2 entry {:#x} has reserved bits set", entry));
  }
  m.host_offset = entry & kOffsetMask;
  uint64_t cluster_mask = (uint64_t{1} << cluster_bits) - 1;
  if (m.host_offset & cluster_mask) {
    return Status::Corrupt(fmt::format(
        "unaligned L2 entry: host offset {:#x} is not cluster aligned", m.host_offset));
  }
  if (extended_l2) {
    m.alloc_bitmap = uint32_t(bitmap);
    m.zero_bitmap = uint32_t(bitmap >> 32);
    if (m.alloc_bitmap & m.zero_bitmap) {
      return Status::Corrupt(fmt::format(
          "extended L2 entry marks subclusters both allocated and zero (bitmap {:#x})", bitmap));
    }
    if (m.host_offset == 0 && m.alloc_bitmap != 0) {
      return Status::Corrupt(fmt::format(
          "extended L2 entry has allocated subclusters but no host offset (bitmap {:#x})",
          bitmap));
    }
    m.kind = m.host_offset ? ClusterKind::kNormal : ClusterKind::kUnallocated;
    return m;
  }
  if (entry & kZeroFlag) {
    m.kind = ClusterKind::kZero;
  } else {
    m.kind = m.host_offset ? ClusterKind::kNormal : ClusterKind::kUnallocated;
  }
  return m;
}

L2Words EncodeL2Entry(const L2Mapping& m, bool extended_l2, uint32_t cluster_bits) {
  L2Words w;
  switch (m.kind) {
    case ClusterKind::kCompressed: {
      CompressedLayout c = LayoutFor(cluster_bits);
      uint64_t end = m.host_offset + std::max<uint64_t>(m.compressed_size, 1);
      uint64_t sectors = (end + 511) / 512 - m.host_offset / 512 - 1;
      w.entry = kCompressed | (m.host_offset & c.offset_mask) |
                ((sectors & c.sectors_mask) << c.x);
      return w;  // never COPIED, bitmap unused
    }
    case ClusterKind::kUnallocated:
    case ClusterKind::kNormal:
      w.entry = m.host_offset & kOffsetMask;
      break;
    case ClusterKind::kZero:
      w.entry = m.host_offset & kOffsetMask;
      if (!extended_l2) w.entry |= kZeroFlag;
      break;
  }
  if (m.copied) w.entry |= kCopied;
  if (extended_l2) {
    uint32_t zero = m.zero_bitmap;
    uint32_t alloc = m.alloc_bitmap;
    if (m.kind == ClusterKind::kZero) {
      zero = ~0u;
      alloc = 0;
    }
    w.bitmap = uint64_t{zero} << 32 | alloc;
  }
  return w;
}

// ---- refcounts ----

uint64_t GetRefcount(std::span<const uint8_t> block, uint32_t refcount_order, uint64_t index) {
  if (refcount_order < 3) {
    uint32_t width = 1u << refcount_order;
    uint64_t bit = index * width;
    return (block[bit / 8] >> (bit % 8)) & ((1u << width) - 1);
  }
  const uint8_t* p = &block[index << (refcount_order - 3)];
  switch (refcount_order) {
    case 3: return p[0];
    case 4: return LoadBe16(p);
    case 5: return LoadBe32(p);
    default: return LoadBe64(p);
  }
}

void SetRefcount(std::span<uint8_t> block, uint32_t refcount_order, uint64_t index,
                 uint64_t value) {
  if (refcount_order < 3) {
    uint32_t width = 1u << refcount_order;
    uint64_t bit = index * width;
    uint8_t mask = uint8_t(((1u << width) - 1) << (bit % 8));
    uint8_t& b = block[bit / 8];
    b = uint8_t((b & ~mask) | ((value << (bit % 8)) & mask));
    return;
  }
  uint8_t* p = &block[index << (refcount_order - 3)];
  switch (refcount_order) {
    case 3: p[0] = uint8_t(value); break;
    case 4: StoreBe16(p, uint16_t(value)); break;
    case 5: StoreBe32(p, uint32_t(value)); break;
    default: StoreBe64(p, value); break;
  }
}

}  // namespace thindisk::qcow2
