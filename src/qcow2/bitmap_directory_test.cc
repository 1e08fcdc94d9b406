// The persistent bitmaps codec (bitmap_directory.h): the header extension,
// the directory, one entry's checks against the image, table entries and
// the geometry limits. Layouts and limits are QEMU 7.2's (docs/interop/
// qcow2.txt, and what qemu-img was seen to write and refuse).
#include "qcow2/bitmap_directory.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

constexpr uint64_t kCluster = 65536;
constexpr uint64_t kFile = 16 * kCluster;  // a small image's file
constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kTiB = 1ull << 40;

// ---- the header extension ----

BitmapsExtension ValidExtension() {
  return BitmapsExtension{.nb_bitmaps = 3,
                          .bitmap_directory_size = 96,
                          .bitmap_directory_offset = 5 * kCluster};
}

TEST(BitmapsExtension, RoundTripsWithQemusLayout) {
  std::vector<uint8_t> bytes = EncodeBitmapsExtension(ValidExtension());
  ASSERT_EQ(bytes.size(), kBitmapsExtensionSize);
  // nb_bitmaps u32 | reserved u32 | directory size u64 | offset u64.
  EXPECT_EQ(LoadBe32(&bytes[0]), 3u);
  EXPECT_EQ(LoadBe32(&bytes[4]), 0u);
  EXPECT_EQ(LoadBe64(&bytes[8]), 96u);
  EXPECT_EQ(LoadBe64(&bytes[16]), 5 * kCluster);

  auto ext = DecodeBitmapsExtension(bytes, kCluster, kFile);
  ASSERT_TRUE(ext.has_value()) << ext.status().ToString();
  EXPECT_EQ(ext->nb_bitmaps, 3u);
  EXPECT_EQ(ext->bitmap_directory_size, 96u);
  EXPECT_EQ(ext->bitmap_directory_offset, 5 * kCluster);
}

// Decodes `ext` after `edit` changed its bytes; expects kCorrupt.
void ExpectExtensionCorrupt(const BitmapsExtension& ext, uint64_t file_size,
                            void (*edit)(std::vector<uint8_t>&) = nullptr) {
  std::vector<uint8_t> bytes = EncodeBitmapsExtension(ext);
  if (edit) edit(bytes);
  auto got = DecodeBitmapsExtension(bytes, kCluster, file_size);
  ASSERT_FALSE(got.has_value());
  EXPECT_EQ(got.status().code(), Code::kCorrupt) << got.status().ToString();
}

TEST(BitmapsExtension, RejectsAnyLengthButTwentyFour) {
  for (size_t len : {0, 16, 23, 25, 32}) {
    std::vector<uint8_t> bytes = EncodeBitmapsExtension(ValidExtension());
    bytes.resize(len, 0);
    auto got = DecodeBitmapsExtension(bytes, kCluster, kFile);
    ASSERT_FALSE(got.has_value()) << len;
    EXPECT_EQ(got.status().code(), Code::kCorrupt);
  }
}

TEST(BitmapsExtension, RejectsNonzeroReserved) {
  ExpectExtensionCorrupt(ValidExtension(), kFile,
                         [](std::vector<uint8_t>& b) { b[7] = 1; });
  ExpectExtensionCorrupt(ValidExtension(), kFile,
                         [](std::vector<uint8_t>& b) { b[4] = 0x80; });
}

TEST(BitmapsExtension, RejectsZeroBitmaps) {
  BitmapsExtension ext = ValidExtension();
  ext.nb_bitmaps = 0;
  ExpectExtensionCorrupt(ext, kFile);
}

TEST(BitmapsExtension, AcceptsQemusMaximumCountButNotOneMore) {
  const uint64_t big_file = 1ull << 32;
  BitmapsExtension ext = ValidExtension();
  ext.nb_bitmaps = kMaxBitmaps;  // 65535
  ext.bitmap_directory_size = 24ull * kMaxBitmaps;
  std::vector<uint8_t> bytes = EncodeBitmapsExtension(ext);
  EXPECT_TRUE(DecodeBitmapsExtension(bytes, kCluster, big_file).has_value());

  ext.nb_bitmaps = kMaxBitmaps + 1;
  ext.bitmap_directory_size = 24ull * (kMaxBitmaps + 1);
  ExpectExtensionCorrupt(ext, big_file);
}

TEST(BitmapsExtension, DirectoryMustHoldTwentyFourBytesPerBitmap) {
  BitmapsExtension ext = ValidExtension();
  ext.bitmap_directory_size = 3 * 24 - 1;
  ExpectExtensionCorrupt(ext, kFile);
  ext.bitmap_directory_size = 3 * 24;
  EXPECT_TRUE(
      DecodeBitmapsExtension(EncodeBitmapsExtension(ext), kCluster, kFile).has_value());
}

TEST(BitmapsExtension, DirectoryLimitIsQemus) {
  // qemu: "bitmap directory size (67108872) exceeds the maximum supported
  // size (67107840)".
  EXPECT_EQ(kMaxBitmapDirectorySize, 67107840u);
  const uint64_t big_file = 1ull << 32;
  BitmapsExtension ext = ValidExtension();
  ext.bitmap_directory_size = kMaxBitmapDirectorySize;
  EXPECT_TRUE(DecodeBitmapsExtension(EncodeBitmapsExtension(ext), kCluster, big_file)
                  .has_value());
  ext.bitmap_directory_size = kMaxBitmapDirectorySize + 8;
  ExpectExtensionCorrupt(ext, big_file);
  ext.bitmap_directory_size = 67108872;
  ExpectExtensionCorrupt(ext, big_file);
}

TEST(BitmapsExtension, RejectsOffsetZeroOrUnaligned) {
  BitmapsExtension ext = ValidExtension();
  ext.bitmap_directory_offset = 0;
  ExpectExtensionCorrupt(ext, kFile);
  ext.bitmap_directory_offset = 5 * kCluster + 8;
  ExpectExtensionCorrupt(ext, kFile);
  ext.bitmap_directory_offset = 512;
  ExpectExtensionCorrupt(ext, kFile);
}

TEST(BitmapsExtension, RejectsDirectoryPastTheEndOfTheFile) {
  BitmapsExtension ext = ValidExtension();
  ext.bitmap_directory_offset = kFile;  // starts at the end
  ExpectExtensionCorrupt(ext, kFile);
  ext.bitmap_directory_offset = 0x10000000;  // far past it (qemu's test)
  ExpectExtensionCorrupt(ext, kFile);
  // Starts inside, ends outside.
  ext.bitmap_directory_offset = kFile - kCluster;
  ext.bitmap_directory_size = kCluster + 8;
  ExpectExtensionCorrupt(ext, kFile);
  // Ends exactly at the end: fine.
  ext.bitmap_directory_size = kCluster;
  EXPECT_TRUE(
      DecodeBitmapsExtension(EncodeBitmapsExtension(ext), kCluster, kFile).has_value());
}

// ---- the directory ----

BitmapDirectoryEntry Entry(std::string name, uint64_t table_offset = 4 * kCluster,
                           uint32_t flags = kBitmapAuto, uint8_t granularity_bits = 16) {
  BitmapDirectoryEntry e;
  e.bitmap_table_offset = table_offset;
  e.bitmap_table_size = 1;
  e.flags = flags;
  e.granularity_bits = granularity_bits;
  e.name = std::move(name);
  return e;
}

void ExpectSameEntry(const BitmapDirectoryEntry& got, const BitmapDirectoryEntry& want) {
  EXPECT_EQ(got.bitmap_table_offset, want.bitmap_table_offset);
  EXPECT_EQ(got.bitmap_table_size, want.bitmap_table_size);
  EXPECT_EQ(got.flags, want.flags);
  EXPECT_EQ(got.type, want.type);
  EXPECT_EQ(got.granularity_bits, want.granularity_bits);
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.extra_data, want.extra_data);
}

TEST(BitmapDirectory, EntryLayoutIsQemus) {
  BitmapDirectoryEntry e = Entry("b0", 0x50000, kBitmapAuto, 12);
  e.bitmap_table_size = 7;
  std::vector<uint8_t> bytes = EncodeBitmapDirectory({e});
  ASSERT_EQ(bytes.size(), 32u);  // 24 + 2, padded to 8
  EXPECT_EQ(LoadBe64(&bytes[0]), 0x50000u);
  EXPECT_EQ(LoadBe32(&bytes[8]), 7u);
  EXPECT_EQ(LoadBe32(&bytes[12]), kBitmapAuto);
  EXPECT_EQ(bytes[16], kBitmapTypeDirtyTracking);
  EXPECT_EQ(bytes[17], 12);
  EXPECT_EQ(LoadBe16(&bytes[18]), 2u);
  EXPECT_EQ(LoadBe32(&bytes[20]), 0u);
  EXPECT_EQ(bytes[24], 'b');
  EXPECT_EQ(bytes[25], '0');
  for (size_t i = 26; i < 32; ++i) EXPECT_EQ(bytes[i], 0) << i;
}

TEST(BitmapDirectory, RoundTripsSeveralEntries) {
  std::vector<BitmapDirectoryEntry> entries;
  entries.push_back(Entry("a"));                                      // 1-byte name
  entries.push_back(Entry(std::string(1023, 'x'), 5 * kCluster, 0));  // the longest name
  BitmapDirectoryEntry extra =
      Entry("with extra", 6 * kCluster, kBitmapAuto | kBitmapExtraDataCompatible, 9);
  extra.extra_data = {1, 2, 3, 4, 5};
  entries.push_back(extra);
  entries.push_back(Entry("\xc3\xa9t\xc3\xa9", 7 * kCluster, kBitmapInUse, 31));  // UTF-8

  std::vector<uint8_t> bytes = EncodeBitmapDirectory(entries);
  // 24+1 -> 32; 24+1023 -> 1048 (qemu's size for a 1023-byte name);
  // 24+5+10 -> 40; 24+6 -> 32: every entry padded, the last one too.
  EXPECT_EQ(bytes.size(), 32u + 1048u + 40u + 32u);

  auto got = DecodeBitmapDirectory(bytes, uint32_t(entries.size()));
  ASSERT_TRUE(got.has_value()) << got.status().ToString();
  ASSERT_EQ(got->size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    SCOPED_TRACE(i);
    ExpectSameEntry((*got)[i], entries[i]);
  }
  EXPECT_TRUE((*got)[0].enabled());
  EXPECT_FALSE((*got)[1].enabled());
  EXPECT_TRUE((*got)[3].in_use());
  EXPECT_EQ((*got)[2].granularity(), 512u);
}

void ExpectDirectoryCorrupt(const std::vector<uint8_t>& bytes, uint32_t nb) {
  auto got = DecodeBitmapDirectory(bytes, nb);
  ASSERT_FALSE(got.has_value());
  EXPECT_EQ(got.status().code(), Code::kCorrupt) << got.status().ToString();
}

TEST(BitmapDirectory, RejectsEmptyName) {
  std::vector<uint8_t> bytes = EncodeBitmapDirectory({Entry("n")});
  StoreBe16(&bytes[18], 0);
  bytes[24] = 0;
  ExpectDirectoryCorrupt(bytes, 1);
  // Also with the size fixed to the 24 bytes an empty name takes.
  bytes.resize(24);
  ExpectDirectoryCorrupt(bytes, 1);
}

TEST(BitmapDirectory, RejectsNameLongerThan1023Bytes) {
  std::vector<uint8_t> bytes = EncodeBitmapDirectory({Entry(std::string(1024, 'y'))});
  ASSERT_EQ(bytes.size(), 1048u);
  ExpectDirectoryCorrupt(bytes, 1);
}

TEST(BitmapDirectory, RejectsTruncatedEntries) {
  std::vector<uint8_t> bytes = EncodeBitmapDirectory({Entry("first"), Entry("second")});
  // Inside the second entry's fixed fields; inside its name.
  ExpectDirectoryCorrupt(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 32 + 20), 2);
  ExpectDirectoryCorrupt(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 32 + 26), 2);
  // More bitmaps announced than the directory holds.
  ExpectDirectoryCorrupt(bytes, 3);
  // An empty directory for one bitmap.
  ExpectDirectoryCorrupt({}, 1);
}

// qemu requires every entry, the last one too, to fit with its padding
// ("if next_dir_entry(e) > dir_end goto broken_dir": "Broken bitmap
// directory"). A directory whose size leaves out the last entry's padding
// is not one qemu opens.
TEST(BitmapDirectory, RejectsLastEntryWithoutItsPadding) {
  std::vector<uint8_t> bytes = EncodeBitmapDirectory({Entry("first"), Entry("abc")});
  ASSERT_EQ(bytes.size(), 64u);
  bytes.resize(32 + 24 + 3);  // the second entry's padding left out
  ExpectDirectoryCorrupt(bytes, 2);
}

TEST(BitmapDirectory, RejectsExtraSizesThatRunPastTheEnd) {
  std::vector<uint8_t> bytes = EncodeBitmapDirectory({Entry("name")});
  for (uint32_t extra : {0xffffffffu, 0xfffffff8u, 0x80000000u, 8u}) {
    SCOPED_TRACE(extra);
    std::vector<uint8_t> b = bytes;
    StoreBe32(&b[20], extra);
    ExpectDirectoryCorrupt(b, 1);
  }
}

TEST(BitmapDirectory, RejectsNonzeroPadding) {
  std::vector<uint8_t> bytes = EncodeBitmapDirectory({Entry("abc"), Entry("def")});
  bytes[24 + 3] = 1;  // the first entry's padding
  ExpectDirectoryCorrupt(bytes, 2);
  bytes = EncodeBitmapDirectory({Entry("abc"), Entry("def")});
  bytes.back() = 0xff;  // the last entry's padding
  ExpectDirectoryCorrupt(bytes, 2);
}

TEST(BitmapDirectory, RejectsDuplicateNames) {
  // qemu: "Bitmap already exists: e".
  ExpectDirectoryCorrupt(EncodeBitmapDirectory({Entry("e"), Entry("f"), Entry("e")}), 3);
  // Names differing only in case are different names.
  EXPECT_TRUE(DecodeBitmapDirectory(EncodeBitmapDirectory({Entry("e"), Entry("E")}), 2));
}

TEST(BitmapDirectory, RejectsTrailingBytes) {
  std::vector<uint8_t> bytes = EncodeBitmapDirectory({Entry("a"), Entry("b")});
  ExpectDirectoryCorrupt(bytes, 1);  // a whole entry more than announced
  bytes.resize(bytes.size() + 8, 0);
  ExpectDirectoryCorrupt(bytes, 2);  // zeros after the last entry
}

// ---- one entry against the image ----

constexpr uint64_t kDisk = kGiB;  // one table entry at 64 KiB granularity

BitmapDirectoryEntry UsableEntry() { return Entry("e", 4 * kCluster); }

std::string Problem(const BitmapDirectoryEntry& e) {
  return CheckBitmapEntry(e, kDisk, kCluster, kFile);
}

TEST(CheckBitmapEntry, AcceptsAWellFormedEntry) {
  EXPECT_EQ(Problem(UsableEntry()), "");
  BitmapDirectoryEntry e = UsableEntry();
  e.flags = kBitmapInUse;  // in_use is a known flag; the engine judges it
  EXPECT_EQ(Problem(e), "");
  e.flags = 0;
  EXPECT_EQ(Problem(e), "");
}

TEST(CheckBitmapEntry, ReportsReservedFlags) {
  for (uint32_t flag : {1u << 3, 1u << 8, 1u << 31}) {
    BitmapDirectoryEntry e = UsableEntry();
    e.flags |= flag;
    EXPECT_NE(Problem(e), "") << flag;
  }
}

TEST(CheckBitmapEntry, ReportsTypesOtherThanDirtyTracking) {
  for (uint8_t type : {0, 2, 255}) {
    BitmapDirectoryEntry e = UsableEntry();
    e.type = type;
    EXPECT_NE(Problem(e), "") << int(type);
  }
}

TEST(CheckBitmapEntry, GranularityIsFrom512BytesTo2GiB) {
  for (uint8_t bits : {0, 8, 32, 63}) {
    BitmapDirectoryEntry e = UsableEntry();
    e.granularity_bits = bits;
    EXPECT_NE(Problem(e), "") << int(bits);
  }
  for (uint8_t bits : {9, 31}) {
    BitmapDirectoryEntry e = UsableEntry();
    e.granularity_bits = bits;
    e.bitmap_table_size = uint32_t(BitmapTableEntries(kDisk, bits, kCluster));
    EXPECT_EQ(Problem(e), "") << int(bits);
  }
}

TEST(CheckBitmapEntry, ReportsATableSizeThatDoesNotFitTheDisk) {
  for (uint32_t size : {0u, 2u, 100u}) {
    BitmapDirectoryEntry e = UsableEntry();
    e.bitmap_table_size = size;
    EXPECT_NE(Problem(e), "") << size;
  }
  // The same entry fits a 10 GiB disk at 512-byte granularity only with 40.
  BitmapDirectoryEntry fine = UsableEntry();
  fine.granularity_bits = 9;
  fine.bitmap_table_size = 40;
  EXPECT_EQ(CheckBitmapEntry(fine, 10 * kGiB, kCluster, kFile), "");
  EXPECT_NE(CheckBitmapEntry(fine, kGiB, kCluster, kFile), "");
}

TEST(CheckBitmapEntry, ReportsATableOutOfPlace) {
  for (uint64_t offset :
       {uint64_t{0}, 4 * kCluster + 8, 4 * kCluster + 512, kFile, uint64_t{0x10000000}}) {
    BitmapDirectoryEntry e = UsableEntry();
    e.bitmap_table_offset = offset;
    EXPECT_NE(Problem(e), "") << offset;
  }
  // A table that starts inside the file but ends past it.
  BitmapDirectoryEntry e = UsableEntry();
  e.granularity_bits = 9;
  e.bitmap_table_size = 40;
  e.bitmap_table_offset = kFile - kCluster;
  EXPECT_EQ(CheckBitmapEntry(e, 10 * kGiB, kCluster, kFile), "");
  EXPECT_NE(CheckBitmapEntry(e, 10 * kGiB, kCluster, kFile - kCluster + 8 * 39), "");
}

TEST(CheckBitmapEntry, ExtraDataNeedsTheCompatibleFlag) {
  BitmapDirectoryEntry e = UsableEntry();
  e.extra_data = {0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_NE(Problem(e), "");
  e.flags |= kBitmapExtraDataCompatible;
  EXPECT_EQ(Problem(e), "");
}

// ---- table entries ----

TEST(BitmapTableEntry, DecodesZeroAndAllOnes) {
  auto zero = DecodeBitmapTableEntry(0, kCluster, kFile);
  ASSERT_TRUE(zero.has_value());
  EXPECT_EQ(zero->host_offset, 0u);
  EXPECT_FALSE(zero->all_ones);
  EXPECT_EQ(EncodeBitmapTableEntry(*zero), 0u);

  auto ones = DecodeBitmapTableEntry(1, kCluster, kFile);
  ASSERT_TRUE(ones.has_value());
  EXPECT_EQ(ones->host_offset, 0u);
  EXPECT_TRUE(ones->all_ones);
  EXPECT_EQ(EncodeBitmapTableEntry(*ones), 1u);
}

TEST(BitmapTableEntry, DecodesAnOffsetAndEncodesItBack) {
  auto e = DecodeBitmapTableEntry(9 * kCluster, kCluster, kFile);
  ASSERT_TRUE(e.has_value()) << e.status().ToString();
  EXPECT_EQ(e->host_offset, 9 * kCluster);
  EXPECT_FALSE(e->all_ones);
  EXPECT_EQ(EncodeBitmapTableEntry(*e), 9 * kCluster);
  // The last cluster of the file, even if the file ends inside it.
  EXPECT_TRUE(DecodeBitmapTableEntry(15 * kCluster, kCluster, 15 * kCluster + 512));
}

void ExpectTableEntryCorrupt(uint64_t raw) {
  auto e = DecodeBitmapTableEntry(raw, kCluster, kFile);
  ASSERT_FALSE(e.has_value()) << std::hex << raw;
  EXPECT_EQ(e.status().code(), Code::kCorrupt);
}

TEST(BitmapTableEntry, RejectsReservedBits) {
  // qemu's corruptions: | 1 << 60 and | 2.
  ExpectTableEntryCorrupt(9 * kCluster | 1ull << 60);
  ExpectTableEntryCorrupt(9 * kCluster | 2);
  ExpectTableEntryCorrupt(1ull << 63);
  ExpectTableEntryCorrupt(1ull << 56);
  ExpectTableEntryCorrupt(0x100);
  ExpectTableEntryCorrupt(1 | 2);
}

TEST(BitmapTableEntry, RejectsAnOffsetWithTheAllOnesBit) {
  ExpectTableEntryCorrupt(9 * kCluster | kBitmapTableAllOnes);
}

TEST(BitmapTableEntry, RejectsAnUnalignedOffset) {
  ExpectTableEntryCorrupt(9 * kCluster + 0x200);  // qemu's: offset + 0x200
  ExpectTableEntryCorrupt(9 * kCluster + 0x8000);
}

TEST(BitmapTableEntry, RejectsAClusterOutsideTheFile) {
  ExpectTableEntryCorrupt(kFile);
  ExpectTableEntryCorrupt(0x10000000);
  ExpectTableEntryCorrupt(0x200);  // inside the header cluster, and unaligned
}

// ---- sizes and limits ----

TEST(BitmapGeometry, BitsBytesAndTableEntries) {
  // 1 GiB at 64 KiB: 16384 bits in 2048 bytes, one cluster.
  EXPECT_EQ(BitmapBits(kGiB, 16), 16384u);
  EXPECT_EQ(BitmapDataBytes(kGiB, 16), 2048u);
  EXPECT_EQ(BitmapTableEntries(kGiB, 16, kCluster), 1u);
  // A partial granule counts; so does a partial byte.
  EXPECT_EQ(BitmapBits(kGiB + 1, 16), 16385u);
  EXPECT_EQ(BitmapDataBytes(kGiB + 1, 16), 2049u);
  EXPECT_EQ(BitmapBits(1, 16), 1u);
  EXPECT_EQ(BitmapDataBytes(1, 16), 1u);
  EXPECT_EQ(BitmapTableEntries(1, 16, kCluster), 1u);
  // An empty disk has no bits at all.
  EXPECT_EQ(BitmapBits(0, 16), 0u);
  EXPECT_EQ(BitmapDataBytes(0, 16), 0u);
  EXPECT_EQ(BitmapTableEntries(0, 16, kCluster), 0u);
  // qemu's table sizes: 1 GiB at 512 bytes -> 4; 10 GiB -> 40.
  EXPECT_EQ(BitmapTableEntries(kGiB, 9, kCluster), 4u);
  EXPECT_EQ(BitmapTableEntries(10 * kGiB, 9, kCluster), 40u);
  EXPECT_EQ(BitmapTableEntries(kGiB, 9, 512), 512u);
  // 2 TiB at 512 bytes: 2^32 bits, 512 MiB.
  EXPECT_EQ(BitmapBits(2 * kTiB, 9), 1ull << 32);
  EXPECT_EQ(BitmapDataBytes(2 * kTiB, 9), 512ull << 20);
  EXPECT_EQ(BitmapTableEntries(2 * kTiB, 9, 2 << 20), 256u);
}

TEST(BitmapGeometry, TwoTiBAt512BytesFitsAndNotOneGranuleMore) {
  for (uint64_t cs : {uint64_t{512}, kCluster, uint64_t{2} << 20}) {
    SCOPED_TRACE(cs);
    EXPECT_TRUE(CheckBitmapGeometry(2 * kTiB, 9, cs).ok());
    Status s = CheckBitmapGeometry(2 * kTiB + 512, 9, cs);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
    // qemu's other case: 4 TiB at 1 KiB fits, 4 TiB + 1 KiB does not.
    EXPECT_TRUE(CheckBitmapGeometry(4 * kTiB, 10, cs).ok());
    EXPECT_EQ(CheckBitmapGeometry(4 * kTiB + 1024, 10, cs).code(),
              Code::kInvalidArgument);
  }
}

TEST(BitmapGeometry, RejectsGranularityOutside512BytesTo2GiB) {
  EXPECT_EQ(CheckBitmapGeometry(kGiB, 8, kCluster).code(), Code::kInvalidArgument);
  EXPECT_EQ(CheckBitmapGeometry(kGiB, 32, kCluster).code(), Code::kInvalidArgument);
  EXPECT_TRUE(CheckBitmapGeometry(kGiB, 9, kCluster).ok());
  EXPECT_TRUE(CheckBitmapGeometry(kGiB, 31, kCluster).ok());
  EXPECT_TRUE(CheckBitmapGeometry(0, 16, kCluster).ok());
}

}  // namespace
}  // namespace thindisk::qcow2
