#include "qcow2/table_entry.h"

#include <gtest/gtest.h>

#include <vector>

#include "qcow2/format.h"  // kMinClusterBits, kMaxClusterBits

namespace thindisk::qcow2 {
namespace {

// ---- L2 entries ----

TEST(L2Entry, StandardKindsRoundTrip) {
  for (uint32_t bits = kMinClusterBits; bits <= kMaxClusterBits; ++bits) {
    uint64_t off = 7ull << bits;
    for (ClusterKind kind : {ClusterKind::kNormal, ClusterKind::kZero}) {
      for (bool copied : {false, true}) {
        L2Mapping m{.kind = kind, .host_offset = off, .copied = copied};
        L2Words w = EncodeL2Entry(m, false, bits);
        EXPECT_EQ(w.bitmap, 0u);
        auto d = DecodeL2Entry(w.entry, 0, false, bits);
        ASSERT_TRUE(d.has_value()) << d.status().ToString();
        EXPECT_EQ(d->kind, kind);
        EXPECT_EQ(d->host_offset, off);
        EXPECT_EQ(d->copied, copied);
      }
    }
  }
  auto u = DecodeL2Entry(0, 0, false, 16);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->kind, ClusterKind::kUnallocated);
  auto z = DecodeL2Entry(kZeroFlag, 0, false, 16);
  ASSERT_TRUE(z.has_value());
  EXPECT_EQ(z->kind, ClusterKind::kZero);
  EXPECT_EQ(z->host_offset, 0u);
}

TEST(L2Entry, CompressedRoundTripAtEveryClusterSize) {
  for (uint32_t bits = kMinClusterBits; bits <= kMaxClusterBits; ++bits) {
    uint32_t x = 62 - (bits - 8);
    for (uint64_t offset : {uint64_t{0x10000} + 37, uint64_t{0x123456789}}) {
      for (uint64_t size : {uint64_t{1}, uint64_t{475}, uint64_t{512}, uint64_t{1} << bits}) {
        L2Mapping m{.kind = ClusterKind::kCompressed, .host_offset = offset,
                    .compressed_size = size};
        L2Words w = EncodeL2Entry(m, true, bits);
        EXPECT_EQ(w.entry & kCopied, 0u);
        EXPECT_EQ(w.entry & ((1ull << x) - 1), offset) << "offset in bits 0..x-1";
        auto d = DecodeL2Entry(w.entry, w.bitmap, true, bits);
        ASSERT_TRUE(d.has_value()) << d.status().ToString();
        EXPECT_EQ(d->kind, ClusterKind::kCompressed);
        EXPECT_EQ(d->host_offset, offset);
        // The decoded size covers the data and ends on a sector boundary.
        EXPECT_GE(d->compressed_size, size);
        EXPECT_LT(d->compressed_size, size + 512);
        EXPECT_EQ((d->host_offset + d->compressed_size) % 512, 0u);
      }
    }
  }
}

TEST(L2Entry, CompressedSizeFollowsTheSpecFormula) {
  // cluster_bits 16: x = 54; 3 additional sectors, offset 0x20100.
  uint64_t entry = kCompressed | (3ull << 54) | 0x20100;
  auto d = DecodeL2Entry(entry, 0, false, 16);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->host_offset, 0x20100u);
  EXPECT_EQ(d->compressed_size, 4u * 512 - 0x100);
}

TEST(L2Entry, ExtendedBitmapsRoundTrip) {
  L2Mapping m{.kind = ClusterKind::kNormal, .host_offset = 5 << 17, .copied = true,
              .alloc_bitmap = 0x0000ffff, .zero_bitmap = 0xff000000};
  L2Words w = EncodeL2Entry(m, true, 17);
  EXPECT_EQ(w.bitmap, 0xff0000000000ffffull);
  auto d = DecodeL2Entry(w.entry, w.bitmap, true, 17);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->kind, ClusterKind::kNormal);
  EXPECT_EQ(d->alloc_bitmap, 0x0000ffffu);
  EXPECT_EQ(d->zero_bitmap, 0xff000000u);
  EXPECT_TRUE(d->copied);
  // All-zero cluster without host space.
  auto z = DecodeL2Entry(0, 0xffffffff00000000ull, true, 17);
  ASSERT_TRUE(z.has_value());
  EXPECT_EQ(z->kind, ClusterKind::kUnallocated);
  EXPECT_EQ(z->zero_bitmap, 0xffffffffu);
}

struct BadL2 {
  const char* name;
  uint64_t entry, bitmap;
  bool extended;
  uint32_t cluster_bits;
  const char* message_part;
};

const BadL2 kBadL2[] = {
    {"ReservedLowBits", 0x30000 | 0x2, 0, false, 16, "reserved bits"},
    {"ReservedHighBits", 0x30000 | (1ull << 57), 0, false, 16, "reserved bits"},
    {"ZeroFlagInExtendedL2", 0x30000 | kZeroFlag, 0, true, 16, "reserved bits"},
    {"UnalignedOffset", 0x30200, 0, false, 16, "unaligned L2 entry"},
    {"AllocAndZero", 0x30000, 0x0000000100000001ull, true, 16, "both allocated and zero"},
    {"AllocWithoutOffset", 0, 0x1, true, 16, "no host offset"},
    {"CompressedWithBitmap", kCompressed | 0x10000, 0x1, true, 16, "non-zero subcluster bitmap"},
    {"CompressedCopied", kCompressed | kCopied | 0x10000, 0, false, 16, "COPIED"},
    {"CompressedOffsetBeyond56Bits", kCompressed | (1ull << 57), 0, false, 9, "beyond 56 bits"},
};

class BadL2Entry : public testing::TestWithParam<BadL2> {};

TEST_P(BadL2Entry, IsCorrupt) {
  const BadL2& c = GetParam();
  auto r = DecodeL2Entry(c.entry, c.bitmap, c.extended, c.cluster_bits);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kCorrupt);
  EXPECT_NE(r.error().message().find(c.message_part), std::string::npos) << r.error().message();
}

INSTANTIATE_TEST_SUITE_P(Defects, BadL2Entry, testing::ValuesIn(kBadL2),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- refcounts ----

uint64_t RefcountPattern(uint64_t i) { return i * 0x9e3779b97f4a7c15ull; }

TEST(Refcount, EveryOrderStoresAndIsolatesEntries) {
  for (uint32_t order = 0; order <= 6; ++order) {
    std::vector<uint8_t> block(512, 0);
    uint64_t entries = block.size() * 8 >> order;
    uint64_t max = MaxRefcount(order);
    for (uint64_t i = 0; i < entries; ++i) SetRefcount(block, order, i, RefcountPattern(i) & max);
    for (uint64_t i = 0; i < entries; ++i) {
      ASSERT_EQ(GetRefcount(block, order, i), RefcountPattern(i) & max) << order << " " << i;
    }
    SetRefcount(block, order, 3, max);
    EXPECT_EQ(GetRefcount(block, order, 3), max);
    EXPECT_EQ(GetRefcount(block, order, 2), RefcountPattern(2) & max);
    EXPECT_EQ(GetRefcount(block, order, 4), RefcountPattern(4) & max);
  }
}

TEST(Refcount, SpecBitLayout) {
  std::vector<uint8_t> block(16, 0);
  SetRefcount(block, 0, 0, 1);  // 1-bit: bit 0 is the least significant bit
  SetRefcount(block, 0, 9, 1);
  EXPECT_EQ(block[0], 0x01);
  EXPECT_EQ(block[1], 0x02);
  std::fill(block.begin(), block.end(), 0);
  SetRefcount(block, 2, 1, 0xa);  // 4-bit: entry 1 in the high nibble
  EXPECT_EQ(block[0], 0xa0);
  std::fill(block.begin(), block.end(), 0);
  SetRefcount(block, 4, 1, 0x1234);  // 16-bit big-endian
  EXPECT_EQ(block[2], 0x12);
  EXPECT_EQ(block[3], 0x34);
  EXPECT_EQ(MaxRefcount(4), 0xffffu);
  EXPECT_EQ(MaxRefcount(6), ~0ull);
}

}  // namespace
}  // namespace thindisk::qcow2
