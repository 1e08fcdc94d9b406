#include "vhd/format.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "util/endian.h"

namespace thindisk::vhd {
namespace {

Footer SampleFooter() {
  Footer f;
  f.file_format_version = 0x00010000;
  f.data_offset = 512;
  std::memcpy(f.creator_application, "qemu", 4);
  f.original_size = f.current_size = 10514432;  // 302/4/17 CHS, as qemu-img rounds 10 MiB
  f.cylinders = 302;
  f.heads = 4;
  f.sectors_per_track = 17;
  f.disk_type = DiskType::kDynamic;
  return f;
}

TEST(VhdFormatTest, ChecksumIsOnesComplementOfByteSum) {
  std::array<uint8_t, 8> bytes = {1, 2, 0xff, 0xff, 0xff, 0xff, 3, 4};
  // The four bytes at offset 2 are the checksum field: not counted.
  EXPECT_EQ(Checksum(bytes, 2), ~uint32_t(1 + 2 + 3 + 4));
}

TEST(VhdFormatTest, FooterRoundTrips) {
  std::array<uint8_t, kFooterSize> b{};
  EncodeFooter(SampleFooter(), b);
  EXPECT_TRUE(HasFooterCookie(b));
  EXPECT_EQ(LoadBe32(b.data() + 8), 2u);  // the reserved feature bit is always set
  auto f = DecodeFooter(b);
  ASSERT_TRUE(f.has_value()) << f.error().ToString();
  EXPECT_EQ(f->current_size, 10514432u);
  EXPECT_EQ(f->disk_type, DiskType::kDynamic);
  EXPECT_EQ(f->cylinders, 302);
  EXPECT_EQ(std::memcmp(f->creator_application, "qemu", 4), 0);
}

TEST(VhdFormatTest, FooterRejectsDamageAndUnknowns) {
  std::array<uint8_t, kFooterSize> b{};
  EncodeFooter(SampleFooter(), b);
  b[200] ^= 0x10;  // reserved area: only the checksum notices
  EXPECT_EQ(DecodeFooter(b).status().code(), Code::kCorrupt);
  Footer v2 = SampleFooter();
  v2.file_format_version = 0x00020000;
  EncodeFooter(v2, b);
  EXPECT_EQ(DecodeFooter(b).status().code(), Code::kNotSupported);
  Footer odd = SampleFooter();
  odd.disk_type = DiskType(7);
  EncodeFooter(odd, b);
  EXPECT_EQ(DecodeFooter(b).status().code(), Code::kNotSupported);
  EXPECT_EQ(DecodeFooter(std::span<const uint8_t>(b.data(), 100)).status().code(),
            Code::kCorrupt);
}

TEST(VhdFormatTest, DynamicHeaderLimits) {
  Footer f = SampleFooter();
  DynamicHeader h;
  h.table_offset = 1536;
  h.header_version = 0x00010000;
  h.max_table_entries = 6;
  h.block_size = 2 << 20;
  std::array<uint8_t, kDynamicHeaderSize> b{};
  EncodeDynamicHeader(h, b);
  auto d = DecodeDynamicHeader(b, f, 1 << 20);
  ASSERT_TRUE(d.has_value()) << d.error().ToString();
  EXPECT_EQ(d->bitmap_bytes(), 512u);  // 4096 sectors -> 512 bitmap bytes
  // The BAT must fit in the file.
  EXPECT_EQ(DecodeDynamicHeader(b, f, 1540).status().code(), Code::kCorrupt);
  h.block_size = kMaxBlockSize * 2;
  EncodeDynamicHeader(h, b);
  EXPECT_EQ(DecodeDynamicHeader(b, f, 1 << 20).status().code(), Code::kCorrupt);
  b[0] = 'X';
  EXPECT_EQ(DecodeDynamicHeader(b, f, 1 << 20).status().code(), Code::kCorrupt);
}

}  // namespace
}  // namespace thindisk::vhd
