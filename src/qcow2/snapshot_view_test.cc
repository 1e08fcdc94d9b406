// Opening an internal snapshot's view (OpenOptions::snapshot, qemu-nbd -l):
// it reads the snapshot's content and size, is read-only, finds snapshots
// by qemu's id/name rules, and leaves the image untouched.
#include "qcow2/check.h"
#include "qcow2/image_test_util.h"
#include "qcow2/snapshot.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

using testing::CreateMem;
using testing::MemImage;
using testing::Pattern;

constexpr uint64_t kSize = 4 << 20;

std::vector<uint8_t> ReadAll(Image& img) {
  std::vector<uint8_t> got(img.size());
  Status s = img.Read(0, got);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return got;
}

Result<std::unique_ptr<Image>> OpenView(MemImage& m, SnapshotSelector sel) {
  OpenOptions o;
  o.snapshot = std::move(sel);
  return Image::Open(m.storage->Clone(), o);
}

// Two snapshots with different content, then the active image changed and
// grown: each view shows its snapshot, never the active content.
class SnapshotViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CreateOptions co;
    co.size = kSize;
    co.cluster_size = 65536;
    m_ = CreateMem(co);
    first_.assign(kSize, 0);
    Write(first_, 0, Pattern(1, 300000));
    ASSERT_TRUE(CreateSnapshot(*m_.image, {"first"}).ok());
    second_ = first_;
    Write(second_, 100000, Pattern(2, 50000));
    Write(second_, 3 << 20, Pattern(3, 9000));
    ASSERT_TRUE(CreateSnapshot(*m_.image, {"second"}).ok());
    // The active image moves on: overwritten and grown past one L2 table.
    ASSERT_TRUE(m_.image->Write(0, Pattern(4, 8192)).ok());
    ASSERT_TRUE(m_.image->Resize(1ull << 30, false).ok());
    ASSERT_TRUE(m_.image->Write((1ull << 30) - 4096, Pattern(5, 4096)).ok());
    ASSERT_TRUE(m_.image->Close().ok());
    before_ = m_.storage->Contents();
  }
  void Write(std::vector<uint8_t>& model, uint64_t off, const std::vector<uint8_t>& data) {
    ASSERT_TRUE(m_.image->Write(off, data).ok());
    std::copy(data.begin(), data.end(), model.begin() + off);
  }

  MemImage m_;
  std::vector<uint8_t> first_, second_, before_;
};

TEST_F(SnapshotViewTest, ReadsEachSnapshotsContentAndSize) {
  for (auto [sel, want] : {std::pair{SnapshotSelector{"first", "", ""}, &first_},
                           std::pair{SnapshotSelector{"", "", "second"}, &second_},
                           std::pair{SnapshotSelector{"", "1", ""}, &first_},
                           std::pair{SnapshotSelector{"", "2", "second"}, &second_}}) {
    auto img = OpenView(m_, sel);
    ASSERT_TRUE(img.has_value()) << sel.Describe() << ": " << img.status().ToString();
    EXPECT_EQ((*img)->size(), kSize) << sel.Describe();
    EXPECT_TRUE((*img)->info().read_only);
    EXPECT_EQ(ReadAll(**img), *want) << sel.Describe();
    auto st = (*img)->GetStatus(kSize - 4096, 4096);
    ASSERT_TRUE(st.has_value());
    EXPECT_FALSE(st->data);
    EXPECT_TRUE((*img)->Close().ok());
  }
}

TEST_F(SnapshotViewTest, IsReadOnlyAndLeavesTheImageAlone) {
  auto copy = m_.storage->Clone();
  io::MemoryStorage* bytes = copy.get();
  OpenOptions o;
  o.snapshot.name = "second";
  auto img = Image::Open(std::move(copy), o);
  ASSERT_TRUE(img.has_value());
  EXPECT_EQ((*img)->Write(0, Pattern(9, 4096)).code(), Code::kReadOnly);
  EXPECT_EQ((*img)->Discard(0, 65536).code(), Code::kReadOnly);
  ASSERT_TRUE((*img)->Close().ok());
  // Not one byte under the view changed; the active image still opens
  // read-write with its own content and size, and is clean.
  EXPECT_TRUE(bytes->Contents() == before_);
  auto reopened = Image::Open(m_.storage->Clone(), {});
  ASSERT_TRUE(reopened.has_value());
  EXPECT_EQ((*reopened)->size(), 1ull << 30);
  std::vector<uint8_t> head(8192);
  ASSERT_TRUE((*reopened)->Read(0, head).ok());
  EXPECT_EQ(head, Pattern(4, 8192));
  ASSERT_TRUE((*reopened)->Close().ok());
  auto report = Check(*m_.storage, RepairMode::kNone);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->corruptions + report->leaks, 0u);
}

TEST_F(SnapshotViewTest, FindsByQemuRules) {
  // A bare NAME tries ids first: "2" is snapshot "second"'s id.
  auto by_id = OpenView(m_, {"2", "", ""});
  ASSERT_TRUE(by_id.has_value());
  EXPECT_EQ(ReadAll(**by_id), second_);
  // id and name must name the same snapshot.
  auto mismatch = OpenView(m_, {"", "1", "second"});
  ASSERT_FALSE(mismatch.has_value());
  EXPECT_EQ(mismatch.error().code(), Code::kNotFound);
  EXPECT_NE(mismatch.error().message().find("id '1' name 'second'"), std::string::npos)
      << mismatch.error().message();
  auto missing = OpenView(m_, {"nope", "", ""});
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), Code::kNotFound);
  EXPECT_NE(missing.error().message().find("test.qcow2"), std::string::npos);
}

TEST_F(SnapshotViewTest, HostileSnapshotL1IsRefused) {
  Header h;
  {
    OpenOptions ro;
    ro.read_only = true;
    auto img = Image::Open(m_.storage->Clone(), ro);
    ASSERT_TRUE(img.has_value());
    h = (*img)->header();
  }
  // The first entry's l1_table_offset, pointed far past the end of the file.
  uint8_t far[8];
  StoreBe64(far, 1ull << 40);
  auto copy = m_.storage->Clone();
  ASSERT_TRUE(copy->WriteAt(h.snapshots_offset, far).ok());
  OpenOptions o;
  o.snapshot.id_or_name = "first";
  auto img = Image::Open(std::move(copy), o);
  ASSERT_FALSE(img.has_value());
  EXPECT_EQ(img.error().code(), Code::kCorrupt);
}

}  // namespace
}  // namespace thindisk::qcow2
