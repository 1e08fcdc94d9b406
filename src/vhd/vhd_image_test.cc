#include "vhd/vhd_image.h"

#include <gtest/gtest.h>

#include <array>
#include <map>
#include <string>
#include <vector>

#include "io/memory_storage.h"
#include "util/endian.h"

namespace thindisk::vhd {
namespace {

constexpr uint32_t kBlock = 4096;  // 8 sectors per block: one bitmap sector

Footer FooterFor(DiskType type, uint64_t size) {
  Footer f;
  f.file_format_version = 0x00010000;
  f.data_offset = type == DiskType::kFixed ? kNoDataOffset : kFooterSize;
  std::memcpy(f.creator_application, "test", 4);
  f.original_size = size;
  f.current_size = size;
  f.disk_type = type;
  return f;
}

std::array<uint8_t, kFooterSize> EncodedFooter(const Footer& f) {
  std::array<uint8_t, kFooterSize> b{};
  EncodeFooter(f, b);
  return b;
}

// A dynamic vhd: footer copy, dynamic header (sector 1), BAT (sector 3),
// blocks in index order, footer. `blocks` maps block index to the sector
// bitmap's first byte (bit 7 = first sector) and the fill byte of the data.
struct Dyn {
  std::unique_ptr<io::MemoryStorage> storage;
  std::vector<uint8_t> expected;
  uint64_t bat_offset = 3 * kSectorSize;
  std::map<uint32_t, uint64_t> block_offset;
};

Dyn BuildDynamic(uint64_t size, const std::map<uint32_t, std::pair<uint8_t, uint8_t>>& blocks) {
  Dyn d;
  d.storage = io::NewMemoryStorage("test.vhd");
  d.expected.assign(size, 0);
  const uint32_t entries = uint32_t((size + kBlock - 1) / kBlock);
  Footer f = FooterFor(DiskType::kDynamic, size);
  auto footer = EncodedFooter(f);
  EXPECT_TRUE(d.storage->WriteAt(0, footer).ok());
  DynamicHeader h;
  h.table_offset = d.bat_offset;
  h.header_version = 0x00010000;
  h.max_table_entries = entries;
  h.block_size = kBlock;
  std::array<uint8_t, kDynamicHeaderSize> header{};
  EncodeDynamicHeader(h, header);
  EXPECT_TRUE(d.storage->WriteAt(kFooterSize, header).ok());
  std::vector<uint8_t> bat((entries * 4 + kSectorSize - 1) / kSectorSize * kSectorSize, 0xff);
  uint64_t next = d.bat_offset + bat.size();
  for (auto [index, bits_fill] : blocks) {
    auto [bits, fill] = bits_fill;
    EXPECT_LT(index, entries);
    if (index >= entries) continue;
    StoreBe32(bat.data() + 4 * index, uint32_t(next / kSectorSize));
    d.block_offset[index] = next;
    std::vector<uint8_t> bitmap(kSectorSize, 0);
    bitmap[0] = bits;
    EXPECT_TRUE(d.storage->WriteAt(next, bitmap).ok());
    // Every sector of the block holds `fill`, even those whose bit is
    // clear: such bytes must never be seen.
    std::vector<uint8_t> data(kBlock, fill);
    EXPECT_TRUE(d.storage->WriteAt(next + kSectorSize, data).ok());
    for (int s = 0; s < 8; ++s) {
      if (bits & (0x80 >> s)) {
        uint64_t at = uint64_t(index) * kBlock + s * kSectorSize;
        std::fill(d.expected.begin() + at, d.expected.begin() + at + kSectorSize, fill);
      }
    }
    next += kSectorSize + kBlock;
  }
  EXPECT_TRUE(d.storage->WriteAt(d.bat_offset, bat).ok());
  EXPECT_TRUE(d.storage->WriteAt(next, footer).ok());
  return d;
}

Result<std::unique_ptr<VhdImage>> OpenStorage(std::unique_ptr<io::MemoryStorage> s) {
  return VhdImage::Open(std::move(s), "test.vhd");
}

std::map<uint32_t, std::pair<uint8_t, uint8_t>> SampleBlocks() {
  // Block 0 full, block 2 first half, block 3 sectors 1 and 7, block 9 full.
  return {{0, {0xff, 0xa1}}, {2, {0xf0, 0xb2}}, {3, {0x41, 0xc3}}, {9, {0xff, 0xd4}}};
}

// For 4-block disks: block 0 full, block 2 first half.
std::map<uint32_t, std::pair<uint8_t, uint8_t>> SmallBlocks() {
  return {{0, {0xff, 0xa1}}, {2, {0xf0, 0xb2}}};
}

TEST(VhdImageTest, ReadsDynamicHonouringBitmaps) {
  Dyn d = BuildDynamic(16 * kBlock, SampleBlocks());
  auto expected = d.expected;
  auto image = OpenStorage(std::move(d.storage));
  ASSERT_TRUE(image.has_value()) << image.error().ToString();
  VhdImage& img = **image;
  EXPECT_EQ(img.info().format, "vpc");
  EXPECT_EQ(img.info().cluster_size, kBlock);
  EXPECT_EQ(img.size(), expected.size());
  for (uint64_t step : {uint64_t(512), uint64_t(700), uint64_t(10000)}) {
    std::vector<uint8_t> got(expected.size());
    for (uint64_t off = 0; off < got.size(); off += step) {
      uint64_t n = std::min<uint64_t>(step, got.size() - off);
      ASSERT_TRUE(img.Read(off, std::span(got.data() + off, n)).ok());
    }
    EXPECT_TRUE(got == expected) << "step " << step;
  }
}

TEST(VhdImageTest, StatusFollowsBatAndBitmaps) {
  Dyn d = BuildDynamic(16 * kBlock, SampleBlocks());
  uint64_t block2 = d.block_offset.at(2);
  auto image = OpenStorage(std::move(d.storage));
  ASSERT_TRUE(image.has_value());
  VhdImage& img = **image;
  auto e = img.GetStatus(0, img.size());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->data && e->present);
  EXPECT_EQ(e->length, kBlock);
  // Block 1 unallocated: a hole to the start of block 2.
  e = img.GetStatus(kBlock, img.size());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->zero && !e->data && !e->present);
  EXPECT_EQ(e->length, kBlock);
  // Block 2: first 4 sectors data at their host place, then clear bits.
  e = img.GetStatus(2 * kBlock + 100, img.size());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->data);
  EXPECT_EQ(e->length, 4 * kSectorSize - 100);
  EXPECT_EQ(e->host_offset, block2 + kSectorSize + 100);
  e = img.GetStatus(2 * kBlock + 4 * kSectorSize, img.size());
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->zero && !e->data);
  EXPECT_EQ(e->length, 4 * kSectorSize);
  // Blocks 4-8 unallocated, one extent.
  e = img.GetStatus(4 * kBlock, img.size());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->length, 5 * kBlock);
}

TEST(VhdImageTest, ReadsFixed) {
  auto s = io::NewMemoryStorage("fixed.vhd");
  const uint64_t size = 256 * 1024;
  std::vector<uint8_t> data(1000, 0x77);
  ASSERT_TRUE(s->WriteAt(70000, data).ok());
  ASSERT_TRUE(s->WriteAt(size, EncodedFooter(FooterFor(DiskType::kFixed, size))).ok());
  // Its footer is only in the last sector, which a raw guest can write: it
  // probes as raw (as in qemu-img) and opens when named.
  auto probe = Probe(*s);
  ASSERT_TRUE(probe.has_value());
  EXPECT_FALSE(*probe);
  auto image = OpenStorage(std::move(s));
  ASSERT_TRUE(image.has_value()) << image.error().ToString();
  VhdImage& img = **image;
  EXPECT_EQ(img.size(), size);
  EXPECT_EQ(img.disk_type(), DiskType::kFixed);
  EXPECT_EQ(img.info().cluster_size, 0u);
  std::vector<uint8_t> got(2000);
  ASSERT_TRUE(img.Read(69500, got).ok());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], (i >= 500 && i < 1500) ? 0x77 : 0);
  // Memory storage chunks are 64 KiB: [0, 64K) is a host hole.
  auto e = img.GetStatus(0, size);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->zero && !e->data);
  EXPECT_EQ(e->length, 65536u);
  std::vector<uint8_t> one(1);
  EXPECT_EQ(img.Read(size, one).code(), Code::kOutOfRange);  // the footer is not guest data
}

TEST(VhdImageTest, DamagedEndFooterFallsBackToCopy) {
  Dyn d = BuildDynamic(4 * kBlock, SmallBlocks());
  auto size = d.storage->Size();
  ASSERT_TRUE(size.has_value());
  std::array<uint8_t, 1> junk{0x99};
  ASSERT_TRUE(d.storage->WriteAt(*size - kFooterSize + 70, junk).ok());  // checksum now wrong
  auto image = OpenStorage(std::move(d.storage));
  ASSERT_TRUE(image.has_value()) << image.error().ToString();
  EXPECT_EQ((*image)->size(), 4 * kBlock);
}

TEST(VhdImageTest, WritesAreRefused) {
  Dyn d = BuildDynamic(4 * kBlock, SmallBlocks());
  auto image = OpenStorage(std::move(d.storage));
  ASSERT_TRUE(image.has_value());
  std::vector<uint8_t> data(512, 1);
  Status s = (*image)->Write(0, data);
  EXPECT_EQ(s.code(), Code::kReadOnly);
  EXPECT_NE(s.message().find("vpc images are read-only in thindisk"), std::string::npos);
  EXPECT_EQ((*image)->Discard(0, 512).code(), Code::kReadOnly);
}

void ExpectOpenFails(std::unique_ptr<io::MemoryStorage> s, Code code) {
  auto image = OpenStorage(std::move(s));
  ASSERT_FALSE(image.has_value());
  EXPECT_EQ(image.error().code(), code) << image.error().ToString();
  EXPECT_NE(image.error().message().find("test.vhd"), std::string::npos);
}

// Rewrites both footers of a dynamic image with `f` (checksum recomputed).
void PutFooters(io::MemoryStorage& s, const Footer& f) {
  auto size = s.Size();
  ASSERT_TRUE(size.has_value());
  auto b = EncodedFooter(f);
  ASSERT_TRUE(s.WriteAt(0, b).ok());
  ASSERT_TRUE(s.WriteAt(*size - kFooterSize, b).ok());
}

TEST(VhdImageTest, HostileTruncatedAndBadCookie) {
  auto tiny = io::NewMemoryStorage("t");
  ASSERT_TRUE(tiny->Resize(100).ok());
  ExpectOpenFails(std::move(tiny), Code::kCorrupt);
  auto raw = io::NewMemoryStorage("t");
  ASSERT_TRUE(raw->Resize(1 << 20).ok());
  ExpectOpenFails(std::move(raw), Code::kCorrupt);
}

TEST(VhdImageTest, HostileBadChecksums) {
  Dyn d = BuildDynamic(4 * kBlock, SmallBlocks());
  auto size = *d.storage->Size();
  std::array<uint8_t, 1> junk{0x99};
  ASSERT_TRUE(d.storage->WriteAt(70, junk).ok());
  ASSERT_TRUE(d.storage->WriteAt(size - kFooterSize + 70, junk).ok());
  ExpectOpenFails(std::move(d.storage), Code::kCorrupt);

  Dyn h = BuildDynamic(4 * kBlock, SmallBlocks());
  ASSERT_TRUE(h.storage->WriteAt(kFooterSize + 100, junk).ok());  // dynamic header
  ExpectOpenFails(std::move(h.storage), Code::kCorrupt);
}

TEST(VhdImageTest, HostileBatPastEof) {
  Dyn d = BuildDynamic(4 * kBlock, SmallBlocks());
  std::array<uint8_t, 4> entry{};
  StoreBe32(entry.data(), 0x00ffffff);
  ASSERT_TRUE(d.storage->WriteAt(d.bat_offset + 4, entry).ok());
  ExpectOpenFails(std::move(d.storage), Code::kCorrupt);
}

TEST(VhdImageTest, HostileHeaderFields) {
  auto rewrite_header = [](Dyn& d, auto change) {
    DynamicHeader h;
    h.table_offset = d.bat_offset;
    h.header_version = 0x00010000;
    h.max_table_entries = 4;
    h.block_size = kBlock;
    change(h);
    std::array<uint8_t, kDynamicHeaderSize> b{};
    EncodeDynamicHeader(h, b);
    ASSERT_TRUE(d.storage->WriteAt(kFooterSize, b).ok());
  };
  Dyn a = BuildDynamic(4 * kBlock, SmallBlocks());
  rewrite_header(a, [](DynamicHeader& h) { h.block_size = 3000; });
  ExpectOpenFails(std::move(a.storage), Code::kCorrupt);
  Dyn b = BuildDynamic(4 * kBlock, SmallBlocks());
  rewrite_header(b, [](DynamicHeader& h) { h.max_table_entries = 2; });  // disk needs 4
  ExpectOpenFails(std::move(b.storage), Code::kCorrupt);
  Dyn c = BuildDynamic(4 * kBlock, SmallBlocks());
  rewrite_header(c, [](DynamicHeader& h) { h.table_offset = 1ull << 40; });
  ExpectOpenFails(std::move(c.storage), Code::kCorrupt);
  Dyn e = BuildDynamic(4 * kBlock, SmallBlocks());
  rewrite_header(e, [](DynamicHeader& h) { h.max_table_entries = 0xffffffff; });
  ExpectOpenFails(std::move(e.storage), Code::kCorrupt);
}

TEST(VhdImageTest, HostileFooterFields) {
  Dyn a = BuildDynamic(4 * kBlock, SmallBlocks());
  PutFooters(*a.storage, FooterFor(DiskType::kDynamic, 1ull << 50));  // absurd size
  ExpectOpenFails(std::move(a.storage), Code::kCorrupt);
  Dyn b = BuildDynamic(4 * kBlock, SmallBlocks());
  PutFooters(*b.storage, FooterFor(DiskType::kDifferencing, 4 * kBlock));
  ExpectOpenFails(std::move(b.storage), Code::kNotSupported);
  Dyn c = BuildDynamic(4 * kBlock, SmallBlocks());
  Footer far = FooterFor(DiskType::kDynamic, 4 * kBlock);
  far.data_offset = 1ull << 40;  // dynamic header past EOF
  PutFooters(*c.storage, far);
  ExpectOpenFails(std::move(c.storage), Code::kCorrupt);
  // A fixed footer claiming more than the file holds.
  auto fixed = io::NewMemoryStorage("f");
  ASSERT_TRUE(fixed->WriteAt(4096, EncodedFooter(FooterFor(DiskType::kFixed, 8192))).ok());
  ExpectOpenFails(std::move(fixed), Code::kCorrupt);
}

TEST(VhdImageTest, ProbeNeedsTheCookieInTheFirstSector) {
  Dyn d = BuildDynamic(4 * kBlock, SmallBlocks());
  EXPECT_TRUE(*Probe(*d.storage));
  auto raw = io::NewMemoryStorage("r");
  ASSERT_TRUE(raw->Resize(1 << 20).ok());
  EXPECT_FALSE(*Probe(*raw));
  // A raw disk whose guest wrote a valid fixed-vhd footer into its last
  // sector stays raw.
  auto guest = io::NewMemoryStorage("g");
  ASSERT_TRUE(guest->WriteAt(4096, EncodedFooter(FooterFor(DiskType::kFixed, 4096))).ok());
  EXPECT_FALSE(*Probe(*guest));
  auto tiny = io::NewMemoryStorage("t");
  ASSERT_TRUE(tiny->Resize(100).ok());
  EXPECT_FALSE(*Probe(*tiny));
}

}  // namespace
}  // namespace thindisk::vhd
