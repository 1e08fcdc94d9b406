// Compact: same guest content, clean metadata, smaller file; crash at every
// step of CompactFile (the process is killed) leaves a complete image at
// the path; a locked image is refused.
#include "qcow2/compact.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

#include "qcow2/bitmaps.h"
#include "qcow2/check.h"
#include "qcow2/image_test_util.h"
#include "util/temp_dir_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::CreateMem;
using testing::MemImage;
using testing::Pattern;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSize = 16 * kMiB;

CreateOptions Opts(uint32_t cluster, bool extended) {
  CreateOptions o;
  o.size = kSize;
  o.cluster_size = cluster;
  o.extended_l2 = extended;
  o.backing_file = "";
  return o;
}

// A long-lived image: written, mostly discarded, rewritten, with zero and
// compressed clusters. Returns the guest content.
std::vector<uint8_t> Age(Image& img) {
  std::vector<uint8_t> model = Pattern(11, kSize);
  EXPECT_TRUE(img.Write(0, model).ok());
  const uint64_t cs = img.header().cluster_size();
  for (uint64_t off = 0; off + 9 * cs <= kSize; off += 10 * cs) {
    EXPECT_TRUE(img.Discard(off + cs, 7 * cs + 4096).ok());
    std::fill(model.begin() + off + cs, model.begin() + off + 8 * cs + 4096, 0);
  }
  EXPECT_TRUE(img.WriteZeroes(3 * cs, 2 * cs, {}).ok());
  std::fill(model.begin() + 3 * cs, model.begin() + 5 * cs, 0);
  std::vector<uint8_t> text(cs, 'x');
  for (uint64_t i = 0; i < 6; ++i) {
    uint64_t off = (kSize / cs / 2 + i * 5) * cs;
    text[i] = 'a' + i;
    EXPECT_TRUE(img.WriteCompressed(off, text).ok());
    std::copy(text.begin(), text.end(), model.begin() + off);
  }
  EXPECT_TRUE(img.Flush().ok());
  return model;
}

std::vector<uint8_t> ReadAll(std::unique_ptr<io::Storage> s) {
  OpenOptions ro;
  ro.read_only = true;
  auto img = Image::Open(std::move(s), ro);
  EXPECT_TRUE(img.has_value()) << img.error().ToString();
  if (!img) return {};
  std::vector<uint8_t> got((*img)->size());
  EXPECT_TRUE((*img)->Read(0, got).ok());
  return got;
}

void ExpectClean(io::Storage& s) {
  auto report = Check(s, RepairMode::kNone);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->corruptions, 0u);
  EXPECT_EQ(report->leaks, 0u);
  for (const auto& m : report->messages) ADD_FAILURE() << m;
}

class CompactTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {};

TEST_P(CompactTest, KeepsContentAndDropsDeadSpace) {
  auto [cluster, extended] = GetParam();
  MemImage m = CreateMem(Opts(cluster, extended));
  std::vector<uint8_t> model = Age(*m.image);
  ASSERT_TRUE(m.image->Close().ok());
  auto dst = io::NewMemoryStorage("compacted");
  auto stats = CompactImage(*m.storage, *dst);
  ASSERT_TRUE(stats.has_value()) << stats.error().ToString();
  EXPECT_LT(stats->new_file_size, stats->old_file_size);
  EXPECT_EQ(stats->compressed_clusters, 6u);
  ExpectClean(*dst);
  auto dst_alloc = dst->AllocatedBytes();
  auto src_alloc = m.storage->AllocatedBytes();
  EXPECT_LT(*dst_alloc, *src_alloc);
  EXPECT_EQ(ReadAll(dst->Clone()), model);
  // The copy is writable by the engine: allocation continues cleanly.
  auto img = Image::Open(dst->Clone(), {});
  ASSERT_TRUE(img.has_value());
  auto more = Pattern(12, 3 * cluster);
  ASSERT_TRUE((*img)->Write(kMiB + 512, more).ok());
  ASSERT_TRUE((*img)->Close().ok());
}

INSTANTIATE_TEST_SUITE_P(Layouts, CompactTest,
                         ::testing::Values(std::make_tuple(65536u, false),
                                           std::make_tuple(131072u, true),
                                           std::make_tuple(4096u, false)));

TEST(CompactTest, KeepsBackingNameAndExtensions) {
  CreateOptions o = Opts(65536, true);
  o.backing_file = "base.qcow2";
  o.backing_format = "qcow2";
  auto src = io::NewMemoryStorage("src");
  ASSERT_TRUE(Create(*src, o).ok());
  auto dst = io::NewMemoryStorage("dst");
  ASSERT_TRUE(CompactImage(*src, *dst).has_value());
  std::vector<uint8_t> head(65536);
  ASSERT_TRUE(dst->ReadAt(0, head).ok());
  auto h = DecodeHeader(head, *dst->Size());
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->backing_file, "base.qcow2");
  EXPECT_EQ(h->backing_format, "qcow2");
  EXPECT_FALSE(h->feature_names.empty());
  EXPECT_TRUE(h->extended_l2());
  ExpectClean(*dst);
}

// ---- CompactFile on real files ----

using test_env::TempDir;

std::vector<uint8_t> MakeImageFile(const std::string& path) {
  io::OpenOptions create;
  create.create = true;
  auto storage = io::OpenFile(path, create);
  EXPECT_TRUE(storage.has_value());
  EXPECT_TRUE(Create(**storage, Opts(65536, false)).ok());
  auto img = Image::Open(std::move(*storage), {});
  EXPECT_TRUE(img.has_value());
  auto model = Age(**img);
  EXPECT_TRUE((*img)->Close().ok());
  return model;
}

std::unique_ptr<io::Storage> OpenRo(const std::string& path) {
  io::OpenOptions ro;
  ro.read_only = true;
  auto s = io::OpenFile(path, ro);
  EXPECT_TRUE(s.has_value());
  return s ? std::move(*s) : nullptr;
}

TEST(CompactFileTest, KilledAtEveryStepLeavesACompleteImage) {
  for (int step = 0; step <= int(CompactStep::kDirSynced); ++step) {
    TempDir dir("/tmp", "thindisk-compact");
    const std::string path = dir.path() + "/disk.qcow2";
    auto model = MakeImageFile(path);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      CompactFileOptions o;
      o.on_step = [step](CompactStep s) {
        if (int(s) == step) ::_exit(0);  // killed right after this step
      };
      (void)CompactFile(path, o);
      ::_exit(3);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0) << "step " << step << " was not reached";
    auto s = OpenRo(path);
    ASSERT_NE(s, nullptr);
    ExpectClean(*s);
    EXPECT_EQ(ReadAll(OpenRo(path)), model) << "step " << step;
  }
}

TEST(CompactFileTest, CompactsInPlaceAndRefusesALockedImage) {
  TempDir dir("/tmp", "thindisk-compact");
  const std::string path = dir.path() + "/disk.qcow2";
  auto model = MakeImageFile(path);
  uint64_t before = std::filesystem::file_size(path);
  {
    // Another process (another open file description) holds a qemu-style
    // shared lock on the image.
    int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    struct flock fl {};
    fl.l_type = F_RDLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 100;
    fl.l_len = 1;
    ASSERT_EQ(::fcntl(fd, F_OFD_SETLK, &fl), 0);
    auto r = CompactFile(path, {});
    EXPECT_EQ(r.status().code(), Code::kBusy);
    ::close(fd);
  }
  auto r = CompactFile(path, {});
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_LT(std::filesystem::file_size(path), before);
  EXPECT_EQ(ReadAll(OpenRo(path)), model);
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename(), "disk.qcow2") << "left behind: " << e.path();
  }
}

// Bitmaps come through a compaction as they were: names, granularity,
// enabled or not, bits; the enabled one keeps tracking afterwards. An
// inconsistent one is refused and the image left alone.
TEST(CompactFileTest, CarriesBitmapsOverAndRefusesAnInconsistentOne) {
  TempDir dir("/tmp", "thindisk-compact");
  const std::string path = dir.path() + "/disk.qcow2";
  auto model = MakeImageFile(path);
  auto open_rw = [&] {
    auto s = io::OpenFile(path, io::OpenOptions{});
    EXPECT_TRUE(s.has_value());
    auto img = Image::Open(std::move(*s), {});
    EXPECT_TRUE(img.has_value()) << img.status().ToString();
    return std::move(*img);
  };
  BitVector want_on, want_off;
  {
    auto img = open_rw();
    ASSERT_TRUE(AddBitmap(*img, {"on", 16, true}).ok());
    ASSERT_TRUE(AddBitmap(*img, {"off", 12, true}).ok());
    std::vector<uint8_t> buf(70000, 0x5a);
    ASSERT_TRUE(img->Write(123456, buf, {}).ok());
    ASSERT_TRUE(img->Write(3 << 20, buf, {}).ok());
    ASSERT_TRUE(SetBitmapEnabled(*img, "off", false).ok());
    for (size_t i = 0; i < buf.size(); ++i) model[123456 + i] = model[(3 << 20) + i] = 0x5a;
    want_on = *ReadBitmap(*img, "on");
    want_off = *ReadBitmap(*img, "off");
    ASSERT_TRUE(img->Close().ok());
  }
  auto r = CompactFile(path, {});
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  EXPECT_EQ(ReadAll(OpenRo(path)), model);
  {
    auto img = open_rw();
    auto list = ListBitmaps(*img);
    ASSERT_TRUE(list.has_value());
    ASSERT_EQ(list->size(), 2u);
    EXPECT_EQ((*list)[0].name, "on");
    EXPECT_TRUE((*list)[0].enabled);
    EXPECT_EQ((*list)[1].name, "off");
    EXPECT_FALSE((*list)[1].enabled);
    EXPECT_EQ((*list)[1].granularity_bits, 12u);
    EXPECT_EQ(*ReadBitmap(*img, "on"), want_on);
    EXPECT_EQ(*ReadBitmap(*img, "off"), want_off);
    ASSERT_TRUE(img->Write(7 << 20, std::vector<uint8_t>(10, 1), {}).ok());
    EXPECT_TRUE(ReadBitmap(*img, "on")->Test((7 << 20) >> 16));
    ASSERT_TRUE(img->Close().ok());
  }
  ExpectClean(*OpenRo(path));
  // Mark "off" in use, as a crashed qemu leaves it: refused, image unchanged.
  {
    auto s = OpenRo(path);
    auto h = DecodeHeader([&] {
      std::vector<uint8_t> head(65536);
      EXPECT_TRUE(s->ReadAt(0, head).ok());
      return head;
    }(), *s->Size());
    ASSERT_TRUE(h.has_value() && h->bitmaps.has_value());
    auto rw = io::OpenFile(path, io::OpenOptions{});
    const uint64_t dir_off = h->bitmaps->bitmap_directory_offset;
    std::vector<uint8_t> dirbytes(h->bitmaps->bitmap_directory_size);
    ASSERT_TRUE((*rw)->ReadAt(dir_off, dirbytes).ok());
    // The second entry follows the first: 24 bytes and "on", padded to 32.
    dirbytes[32 + 15] |= 1;
    ASSERT_TRUE((*rw)->WriteAt(dir_off, dirbytes).ok());
  }
  auto raw = [&] {
    auto s = OpenRo(path);
    std::vector<uint8_t> bytes(*s->Size());
    EXPECT_TRUE(s->ReadAt(0, bytes).ok());
    return bytes;
  };
  const auto before = raw();
  auto refused = CompactFile(path, {});
  EXPECT_EQ(refused.status().code(), Code::kNotSupported) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("'off'"), std::string::npos);
  EXPECT_TRUE(raw() == before) << "the refused compaction changed the file";
}

}  // namespace
}  // namespace thindisk::qcow2
