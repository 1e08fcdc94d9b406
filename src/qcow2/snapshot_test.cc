// Internal snapshots on in-memory images: content kept and restored,
// refcounts and COPIED flags exactly right (qcow2::Check clean, no leaks),
// space returned on delete, and the errors callers see.
#include "qcow2/snapshot.h"

#include "qcow2/check.h"
#include "qcow2/image_test_util.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

using testing::CreateMem;
using testing::MemImage;
using testing::Pattern;
using testing::Reopen;

constexpr uint64_t kSize = 4 << 20;

struct Layout {
  uint32_t cluster;
  bool ext;
  uint32_t version;
  uint32_t refcount_bits;
};

CreateOptions OptionsFor(const Layout& l) {
  CreateOptions o;
  o.size = kSize;
  o.cluster_size = l.cluster;
  o.extended_l2 = l.ext;
  o.version = l.version;
  o.refcount_bits = l.refcount_bits;
  if (l.version == 2) o.compression_type = CompressionType::kZlib;
  return o;
}

// Closes, checks the bytes left behind (no corruption, no leaks), reopens.
MemImage CheckedReopen(MemImage& m) {
  MemImage r = Reopen(m);
  auto report = Check(*r.storage, RepairMode::kNone);
  EXPECT_TRUE(report.has_value());
  if (report) {
    std::string all;
    for (auto& line : report->messages) all += line + "\n";
    EXPECT_EQ(report->corruptions, 0u) << all;
    EXPECT_EQ(report->leaks, 0u) << all;
  }
  return r;
}

std::vector<uint8_t> ReadAll(Image& img) {
  std::vector<uint8_t> got(img.size());
  Status s = img.Read(0, got);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return got;
}

void WriteModel(Image& img, std::vector<uint8_t>& model, uint64_t off,
                const std::vector<uint8_t>& data) {
  ASSERT_TRUE(img.Write(off, data).ok());
  std::copy(data.begin(), data.end(), model.begin() + off);
}

class SnapshotLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(SnapshotLayoutTest, CreateApplyDeleteKeepContentAndRefcounts) {
  MemImage m = CreateMem(OptionsFor(GetParam()));
  std::vector<uint8_t> a(kSize, 0);
  WriteModel(*m.image, a, 0, Pattern(1, 300000));
  WriteModel(*m.image, a, 2 << 20, Pattern(2, 70000));
  ASSERT_TRUE(CreateSnapshot(*m.image, {"s1"}).ok());
  m = CheckedReopen(m);

  // Overwrite part of the snapshot's clusters, partially and wholly, and
  // write where it had nothing.
  std::vector<uint8_t> b = a;
  WriteModel(*m.image, b, 1000, Pattern(3, 5000));
  WriteModel(*m.image, b, 100000, Pattern(4, 250000));
  WriteModel(*m.image, b, 3 << 20, Pattern(5, 9000));
  ASSERT_TRUE(m.image->Discard(2 << 20, 65536).ok());
  std::fill(b.begin() + (2 << 20), b.begin() + (2 << 20) + 65536, 0);
  EXPECT_EQ(ReadAll(*m.image), b);
  m = CheckedReopen(m);
  EXPECT_EQ(ReadAll(*m.image), b);

  auto list = ListSnapshots(*m.image);
  ASSERT_TRUE(list.has_value());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "s1");
  EXPECT_EQ((*list)[0].id, "1");
  EXPECT_EQ((*list)[0].disk_size, kSize);
  EXPECT_EQ(SnapshotIcount((*list)[0]), std::optional<uint64_t>(0));

  ASSERT_TRUE(ApplySnapshot(*m.image, "s1").ok());
  EXPECT_EQ(ReadAll(*m.image), a);
  m = CheckedReopen(m);
  EXPECT_EQ(ReadAll(*m.image), a);

  // Writes after the apply must not reach the snapshot: apply it again.
  std::vector<uint8_t> c = a;
  WriteModel(*m.image, c, 4096, Pattern(6, 200000));
  m = CheckedReopen(m);
  EXPECT_EQ(ReadAll(*m.image), c);
  ASSERT_TRUE(ApplySnapshot(*m.image, "1").ok());  // by id
  EXPECT_EQ(ReadAll(*m.image), a);

  ASSERT_TRUE(DeleteSnapshot(*m.image, "s1").ok());
  m = CheckedReopen(m);
  EXPECT_EQ(ReadAll(*m.image), a);
  list = ListSnapshots(*m.image);
  ASSERT_TRUE(list.has_value());
  EXPECT_TRUE(list->empty());
  // With the snapshot gone every cluster is COPIED again: writes go in place.
  uint64_t before = m.storage->bytes_written();
  ASSERT_TRUE(m.image->Write(0, Pattern(7, 512)).ok());
  EXPECT_EQ(m.storage->bytes_written() - before, 512u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SnapshotLayoutTest,
                         ::testing::Values(Layout{65536, false, 3, 16},
                                           Layout{131072, true, 3, 16},
                                           Layout{4096, false, 3, 2},
                                           Layout{512, false, 3, 64},
                                           Layout{65536, false, 2, 16}));

TEST(SnapshotTest, SeveralSnapshotsEachKeepTheirContent) {
  MemImage m = CreateMem(OptionsFor({65536, false, 3, 16}));
  std::vector<std::vector<uint8_t>> states;
  std::vector<uint8_t> model(kSize, 0);
  for (int i = 0; i < 4; ++i) {
    WriteModel(*m.image, model, uint64_t(i) * 300000, Pattern(10 + i, 400000));
    ASSERT_TRUE(CreateSnapshot(*m.image, {"snap" + std::to_string(i)}).ok());
    states.push_back(model);
  }
  m = CheckedReopen(m);
  // Delete one in the middle, then every remaining one is still intact.
  ASSERT_TRUE(DeleteSnapshot(*m.image, "snap1").ok());
  m = CheckedReopen(m);
  for (int i : {3, 0, 2}) {
    ASSERT_TRUE(ApplySnapshot(*m.image, "snap" + std::to_string(i)).ok());
    EXPECT_EQ(ReadAll(*m.image), states[size_t(i)]) << "snap" << i;
    m = CheckedReopen(m);
  }
  // Ids keep growing past deleted ones.
  ASSERT_TRUE(CreateSnapshot(*m.image, {"again"}).ok());
  auto list = ListSnapshots(*m.image);
  ASSERT_TRUE(list.has_value());
  ASSERT_EQ(list->size(), 4u);
  EXPECT_EQ(list->back().id, "5");
}

TEST(SnapshotTest, DeleteReturnsSpaceAcrossCycles) {
  MemImage m = CreateMem(OptionsFor({65536, false, 3, 16}));
  std::vector<uint8_t> model(kSize, 0);
  WriteModel(*m.image, model, 0, Pattern(1, kSize));
  uint64_t end_after_first = 0;
  for (int cycle = 0; cycle < 4; ++cycle) {
    ASSERT_TRUE(CreateSnapshot(*m.image, {"cycle"}).ok());
    WriteModel(*m.image, model, 0, Pattern(100 + cycle, kSize));  // all clusters COW
    ASSERT_TRUE(DeleteSnapshot(*m.image, "cycle").ok());
    m = CheckedReopen(m);
    EXPECT_EQ(ReadAll(*m.image), model);
    auto report = Check(*m.storage, RepairMode::kNone);
    ASSERT_TRUE(report.has_value());
    if (cycle == 0) end_after_first = report->image_end_offset;
    EXPECT_LE(report->image_end_offset, end_after_first) << "cycle " << cycle;
  }
}

TEST(SnapshotTest, CompressedClustersAreSharedAndFreed) {
  CreateOptions o = OptionsFor({65536, false, 3, 16});
  MemImage m = CreateMem(o);
  std::vector<uint8_t> model(kSize, 0);
  std::vector<uint8_t> text(65536);
  for (size_t i = 0; i < text.size(); ++i) text[i] = uint8_t("snapshot "[i % 9]);
  for (uint64_t c = 0; c < 8; ++c) {
    ASSERT_TRUE(m.image->WriteCompressed(c * 65536, text).ok());
    std::copy(text.begin(), text.end(), model.begin() + c * 65536);
  }
  m = CheckedReopen(m);
  ASSERT_TRUE(CreateSnapshot(*m.image, {"z"}).ok());
  std::vector<uint8_t> after = model;
  WriteModel(*m.image, after, 3 * 65536 + 100, Pattern(9, 70000));
  m = CheckedReopen(m);
  EXPECT_EQ(ReadAll(*m.image), after);
  ASSERT_TRUE(ApplySnapshot(*m.image, "z").ok());
  EXPECT_EQ(ReadAll(*m.image), model);
  m = CheckedReopen(m);
  ASSERT_TRUE(DeleteSnapshot(*m.image, "z").ok());
  m = CheckedReopen(m);
  EXPECT_EQ(ReadAll(*m.image), model);
}

TEST(SnapshotTest, ApplyRestoresTheDiskSize) {
  MemImage m = CreateMem(OptionsFor({65536, false, 3, 16}));
  std::vector<uint8_t> model(kSize, 0);
  WriteModel(*m.image, model, kSize - 5000, Pattern(1, 5000));
  ASSERT_TRUE(CreateSnapshot(*m.image, {"small"}).ok());
  // Grow past what one L2 table covers so the L1 table grows too.
  ASSERT_TRUE(m.image->Resize(1ull << 30, false).ok());
  ASSERT_TRUE(m.image->Write((1ull << 30) - 4096, Pattern(2, 4096)).ok());
  m = CheckedReopen(m);
  ASSERT_TRUE(ApplySnapshot(*m.image, "small").ok());
  EXPECT_EQ(m.image->size(), kSize);
  EXPECT_EQ(ReadAll(*m.image), model);
  m = CheckedReopen(m);
  EXPECT_EQ(m.image->size(), kSize);
  EXPECT_EQ(m.image->header().size, kSize);
}

TEST(SnapshotTest, ErrorsAreClear) {
  MemImage m = CreateMem(OptionsFor({65536, false, 3, 16}));
  ASSERT_TRUE(CreateSnapshot(*m.image, {"dup"}).ok());
  Status s = CreateSnapshot(*m.image, {"dup"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("already exists"), std::string::npos) << s.message();
  EXPECT_EQ(CreateSnapshot(*m.image, {""}).code(), Code::kInvalidArgument);
  EXPECT_EQ(ApplySnapshot(*m.image, "nope").code(), Code::kNotFound);
  EXPECT_EQ(DeleteSnapshot(*m.image, "nope").code(), Code::kNotFound);

  ASSERT_TRUE(m.image->Close().ok());
  OpenOptions ro;
  ro.read_only = true;
  auto img = Image::Open(m.storage->Clone(), ro);
  ASSERT_TRUE(img.has_value());
  EXPECT_EQ(CreateSnapshot(**img, {"x"}).code(), Code::kReadOnly);
  EXPECT_EQ(DeleteSnapshot(**img, "dup").code(), Code::kReadOnly);
  auto list = ListSnapshots(**img);  // listing needs no write access
  ASSERT_TRUE(list.has_value());
  EXPECT_EQ(list->size(), 1u);

  CreateOptions one_bit = OptionsFor({65536, false, 3, 1});
  MemImage tiny = CreateMem(one_bit);
  EXPECT_EQ(CreateSnapshot(*tiny.image, {"x"}).code(), Code::kNotSupported);
}

TEST(SnapshotTest, HostileSnapshotTableIsRefused) {
  MemImage m = CreateMem(OptionsFor({65536, false, 3, 16}));
  ASSERT_TRUE(CreateSnapshot(*m.image, {"s"}).ok());
  ASSERT_TRUE(m.image->Close().ok());
  // Point the snapshot's L1 table past the end of the file.
  Header h = m.image->header();
  uint8_t far[8];
  StoreBe64(far, 1ull << 40);
  auto copy = m.storage->Clone();
  ASSERT_TRUE(copy->WriteAt(h.snapshots_offset, far).ok());
  auto img = Image::Open(std::move(copy), {});
  ASSERT_TRUE(img.has_value());
  EXPECT_EQ(ApplySnapshot(**img, "s").code(), Code::kCorrupt);
  EXPECT_EQ(DeleteSnapshot(**img, "s").code(), Code::kCorrupt);
}

}  // namespace
}  // namespace thindisk::qcow2
