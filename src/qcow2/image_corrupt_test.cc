// Hostile or damaged metadata gives kCorrupt naming the guest offset, never
// a crash or a read of someone else's bytes.
#include "qcow2/image_test_util.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

using testing::Pattern;

struct Damaged {
  std::unique_ptr<io::MemoryStorage> storage;
  Header header;
  uint64_t l2_offset = 0;
};

// A 64 KiB-cluster image with guest cluster 0 written, flushed and closed.
Damaged MakeWritten() {
  Damaged d;
  auto storage = io::NewMemoryStorage("bad.qcow2");
  CreateOptions o;
  o.size = 16 << 20;
  o.cluster_size = 65536;
  o.extended_l2 = false;
  EXPECT_TRUE(Create(*storage, o).ok());
  auto img = Image::Open(storage->Clone(), {});
  EXPECT_TRUE(img.has_value());
  EXPECT_TRUE((*img)->Write(0, Pattern(1, 65536)).ok());
  EXPECT_TRUE((*img)->Close().ok());
  d.header = (*img)->header();
  // The image owns its storage: take a copy of the bytes.
  d.storage = static_cast<io::MemoryStorage&>((*img)->storage()).Clone();
  uint8_t raw[8];
  EXPECT_TRUE(d.storage->ReadAt(d.header.l1_table_offset, raw).ok());
  d.l2_offset = L1Offset(LoadBe64(raw));
  return d;
}

TEST(ImageCorruptTest, DataClusterPastEndOfFile) {
  auto d = MakeWritten();
  uint8_t entry[8];
  StoreBe64(entry, kCopied | (1ull << 40));  // 1 TiB: far past the file
  ASSERT_TRUE(d.storage->WriteAt(d.l2_offset, entry).ok());
  auto img = Image::Open(std::move(d.storage), {});
  ASSERT_TRUE(img.has_value());
  std::vector<uint8_t> buf(4096);
  Status s = (*img)->Read(0, buf);
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find("guest offset 0x0"), std::string::npos) << s.message();
  EXPECT_EQ((*img)->Write(100, buf).code(), Code::kCorrupt);
}

TEST(ImageCorruptTest, DataClusterInTheHeader) {
  auto d = MakeWritten();
  uint8_t entry[8];
  StoreBe64(entry, kCopied | 512);  // unaligned and inside cluster 0
  ASSERT_TRUE(d.storage->WriteAt(d.l2_offset, entry).ok());
  auto img = Image::Open(std::move(d.storage), {});
  ASSERT_TRUE(img.has_value());
  std::vector<uint8_t> buf(4096);
  EXPECT_EQ((*img)->Read(0, buf).code(), Code::kCorrupt);
}

TEST(ImageCorruptTest, GarbageCompressedCluster) {
  auto d = MakeWritten();
  // Compressed flag, offset inside the file, bytes that are not a stream.
  uint8_t entry[8];
  StoreBe64(entry, kCompressed | d.l2_offset);
  ASSERT_TRUE(d.storage->WriteAt(d.l2_offset + 8, entry).ok());
  auto img = Image::Open(std::move(d.storage), {});
  ASSERT_TRUE(img.has_value());
  std::vector<uint8_t> buf(4096);
  Status s = (*img)->Read(65536, buf);
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find("guest offset 0x10000"), std::string::npos) << s.message();
}

TEST(ImageCorruptTest, L2TablePastEndOfFileFailsOpen) {
  auto d = MakeWritten();
  uint8_t entry[8];
  StoreBe64(entry, kCopied | (1ull << 41));
  ASSERT_TRUE(d.storage->WriteAt(d.header.l1_table_offset, entry).ok());
  auto img = Image::Open(std::move(d.storage), {});
  ASSERT_FALSE(img.has_value());
  EXPECT_EQ(img.error().code(), Code::kCorrupt);
}

}  // namespace
}  // namespace thindisk::qcow2

namespace thindisk::qcow2 {
namespace {

TEST(ImageHeaderBitsTest, UnknownAutoclearBitsAreClearedOnReadWriteOpen) {
  auto storage = io::NewMemoryStorage("ac.qcow2");
  CreateOptions o;
  o.size = 1 << 20;
  ASSERT_TRUE(Create(*storage, o).ok());
  uint8_t raw[8];
  ASSERT_TRUE(storage->ReadAt(88, raw).ok());
  StoreBe64(raw, LoadBe64(raw) | (1ull << 5));
  ASSERT_TRUE(storage->WriteAt(88, raw).ok());
  // Read-only: left alone.
  OpenOptions ro;
  ro.read_only = true;
  auto a = Image::Open(storage->Clone(), ro);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ((*a)->header().autoclear_features, 1ull << 5);
  // Read-write: cleared on disk before anything else happens.
  auto b = Image::Open(std::move(storage), {});
  ASSERT_TRUE(b.has_value());
  ASSERT_TRUE((*b)->storage().ReadAt(88, raw).ok());
  EXPECT_EQ(LoadBe64(raw), 0u);
  EXPECT_EQ((*b)->header().autoclear_features, 0u);
}

}  // namespace
}  // namespace thindisk::qcow2
