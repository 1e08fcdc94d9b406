#include "vmdk/format.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

namespace thindisk::vmdk {
namespace {

// A 64 MiB monolithic sparse layout as qemu-img writes it: 64 KiB grains,
// 512-entry tables, descriptor at sector 1, grain directory at sector 21.
SparseHeader SampleHeader() {
  SparseHeader h;
  h.version = 1;
  h.flags = kFlagNewlineTest | kFlagRedundantGt;
  h.capacity = (64 << 20) / kSectorSize;
  h.grain_size = 128;
  h.descriptor_offset = 1;
  h.descriptor_size = 20;
  h.num_gtes_per_gt = 512;
  h.rgd_offset = 0;
  h.gd_offset = 21;
  h.over_head = 128;
  return h;
}

constexpr uint64_t kFileSize = 1 << 20;

std::array<uint8_t, kHeaderSize> Encode(const SparseHeader& h) {
  std::array<uint8_t, kHeaderSize> b{};
  EncodeSparseHeader(h, b);
  return b;
}

TEST(VmdkFormatTest, HeaderRoundTrips) {
  SparseHeader h = SampleHeader();
  auto bytes = Encode(h);
  EXPECT_EQ(bytes[0], 'K');
  EXPECT_EQ(bytes[3], 'V');
  auto d = DecodeSparseHeader(bytes, kFileSize);
  ASSERT_TRUE(d.has_value()) << d.error().ToString();
  EXPECT_EQ(d->capacity, h.capacity);
  EXPECT_EQ(d->grain_bytes(), 64u * 1024);
  EXPECT_EQ(d->gd_offset, 21u);
  EXPECT_EQ(d->gd_entries(), 2u);  // 64 MiB / (512 * 64 KiB) = 2 tables
  EXPECT_FALSE(d->compressed());
}

TEST(VmdkFormatTest, DeflateAlgorithmMeansCompressed) {
  SparseHeader h = SampleHeader();
  h.compress_algorithm = kCompressionDeflate;
  auto d = DecodeSparseHeader(Encode(h), kFileSize);
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->compressed());
}

void ExpectError(const SparseHeader& h, Code code, uint64_t file_size = kFileSize) {
  auto d = DecodeSparseHeader(Encode(h), file_size);
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code(), code) << d.error().ToString();
}

TEST(VmdkFormatTest, RejectsBadMagicAndTruncation) {
  auto bytes = Encode(SampleHeader());
  bytes[0] = 'X';
  auto d = DecodeSparseHeader(bytes, kFileSize);
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code(), Code::kCorrupt);
  auto good = Encode(SampleHeader());
  auto t = DecodeSparseHeader(std::span<const uint8_t>(good.data(), 100), kFileSize);
  ASSERT_FALSE(t.has_value());
  EXPECT_EQ(t.error().code(), Code::kCorrupt);
  ExpectError(SampleHeader(), Code::kCorrupt, /*file_size=*/200);
}

TEST(VmdkFormatTest, RejectsFieldsOutsideLimits) {
  SparseHeader h = SampleHeader();
  h.grain_size = 100;  // not a power of two
  ExpectError(h, Code::kCorrupt);
  h.grain_size = kMaxGrainSectors * 2;
  ExpectError(h, Code::kCorrupt);
  h = SampleHeader();
  h.capacity = ~0ull / 2;  // absurd size
  ExpectError(h, Code::kCorrupt);
  h = SampleHeader();
  h.num_gtes_per_gt = 0;
  ExpectError(h, Code::kCorrupt);
  h.num_gtes_per_gt = kMaxGtesPerGt + 1;
  ExpectError(h, Code::kCorrupt);
  h = SampleHeader();
  h.version = kMaxVersion + 1;
  ExpectError(h, Code::kNotSupported);
  h = SampleHeader();
  h.compress_algorithm = 7;
  ExpectError(h, Code::kNotSupported);
}

TEST(VmdkFormatTest, RejectsTablesAndDescriptorPastEndOfFile) {
  SparseHeader h = SampleHeader();
  h.gd_offset = kFileSize / kSectorSize;  // the directory starts at EOF
  ExpectError(h, Code::kCorrupt);
  h = SampleHeader();
  h.gd_offset = ~0ull / 4;  // sector * 512 would overflow
  ExpectError(h, Code::kCorrupt);
  h = SampleHeader();
  h.descriptor_offset = kFileSize / kSectorSize - 1;
  ExpectError(h, Code::kCorrupt);
  h = SampleHeader();
  h.descriptor_size = (kMaxDescriptorBytes / kSectorSize) + 1;
  ExpectError(h, Code::kCorrupt, /*file_size=*/8 << 20);
  h = SampleHeader();
  h.gd_offset = 0;
  ExpectError(h, Code::kCorrupt);
}

TEST(VmdkFormatTest, AcceptsGdAtEndWithoutCheckingIt) {
  SparseHeader h = SampleHeader();
  h.gd_offset = kGdAtEnd;
  h.flags |= kFlagCompressed | kFlagMarkers;
  h.compress_algorithm = kCompressionDeflate;
  auto d = DecodeSparseHeader(Encode(h), kFileSize);
  ASSERT_TRUE(d.has_value()) << d.error().ToString();
  EXPECT_EQ(d->gd_offset, kGdAtEnd);
}

TEST(VmdkFormatTest, DetectsTextModeDamage) {
  auto bytes = Encode(SampleHeader());
  bytes[75] = '\n';  // "\r\n" turned into "\n\n" by a text-mode copy
  auto d = DecodeSparseHeader(bytes, kFileSize);
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error().code(), Code::kCorrupt);
}

TEST(VmdkFormatTest, DecodesMarkers) {
  std::array<uint8_t, 16> b{};
  StoreLe64(b.data(), 0x1234);
  StoreLe32(b.data() + 8, 0);
  StoreLe32(b.data() + 12, kMarkerFooter);
  Marker m = DecodeMarker(b);
  EXPECT_EQ(m.value, 0x1234u);
  EXPECT_EQ(m.size, 0u);
  EXPECT_EQ(m.type, kMarkerFooter);
}

}  // namespace
}  // namespace thindisk::vmdk
