// Interop with qemu-img for the less common paths: snapshots (copy-on-write
// of shared L2 tables and clusters), resize, WriteCompressed, and the dirty
// and corrupt header bits.
#include "qcow2/image_interop_test_util.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

using testing::InteropTest;
using testing::Pattern;
using testing::Shell;

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

class SnapshotTest : public InteropTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(SnapshotTest, WritesCopyOnWriteAndKeepTheSnapshot) {
  REQUIRE_QEMU_IMG();
  const uint64_t size = 8 << 20;
  std::string img = Path("snap.qcow2");
  auto r = Shell("qemu-img create -q -f qcow2 -o " + std::string(GetParam()) + " " + img + " " +
                 std::to_string(size));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Shell("qemu-io -f qcow2 -c 'write -P 0x11 0 2M' -c 'write -P 0x22 4M 1M' " + img);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Shell("qemu-img snapshot -c snap1 " + img);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<uint8_t> before(size, 0);
  std::fill(before.begin(), before.begin() + (2 << 20), 0x11);
  std::fill(before.begin() + (4 << 20), before.begin() + (5 << 20), 0x22);
  std::vector<uint8_t> want = before;
  {
    auto image = OpenImage(img, false);
    ASSERT_TRUE(image);
    auto a = Pattern(1, 100000);
    ASSERT_TRUE(image->Write(500000, a).ok());
    std::copy(a.begin(), a.end(), want.begin() + 500000);
    ASSERT_TRUE(image->Discard(1 << 20, 65536).ok());
    std::fill(want.begin() + (1 << 20), want.begin() + (1 << 20) + 65536, 0);
    ASSERT_TRUE(image->WriteZeroes((4 << 20) + 1000, 3000, {}).ok());
    std::fill(want.begin() + (4 << 20) + 1000, want.begin() + (4 << 20) + 4000, 0);
    auto b = Pattern(2, 5000);
    ASSERT_TRUE(image->Write((6 << 20) + 7, b).ok());  // unallocated in both
    std::copy(b.begin(), b.end(), want.begin() + (6 << 20) + 7);
    ASSERT_TRUE(image->Close().ok());
  }
  ExpectQemuAgrees(img, want);
  // The snapshot still holds the old content.
  r = Shell("qemu-img convert -f qcow2 -O raw -l snapshot.name=snap1 " + img + " " +
            Path("snap1.raw"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(ReadFile(Path("snap1.raw")) == before);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SnapshotTest,
                         ::testing::Values("cluster_size=65536",
                                           "cluster_size=131072,extended_l2=on",
                                           "cluster_size=4096,compat=0.10"));

TEST_F(InteropTest, ResizeGrowsL1AndShrinksOnlyWhenFree) {
  REQUIRE_QEMU_IMG();
  std::string img = Path("grow.qcow2");
  // 512-byte clusters: each L1 entry covers 32 KiB, so growing relocates L1.
  auto r = Shell("qemu-img create -q -f qcow2 -o cluster_size=512 " + img + " 1M");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<uint8_t> want(1 << 20, 0);
  {
    auto image = OpenImage(img, false);
    ASSERT_TRUE(image);
    auto a = Pattern(1, 10000);
    ASSERT_TRUE(image->Write(1000, a).ok());
    std::copy(a.begin(), a.end(), want.begin() + 1000);
    ASSERT_TRUE(image->Resize(16 << 20).ok());
    EXPECT_EQ(image->size(), 16u << 20);
    want.resize(16 << 20, 0);
    auto b = Pattern(2, 20000);
    ASSERT_TRUE(image->Write((16 << 20) - 20000, b).ok());
    std::copy(b.begin(), b.end(), want.end() - 20000);
    // Shrinking over allocated data is refused and names the offset.
    Status s = image->Resize(4 << 20, true);
    EXPECT_EQ(s.code(), Code::kInvalidArgument);
    EXPECT_NE(s.message().find("guest offset"), std::string::npos) << s.message();
    EXPECT_EQ(image->Resize(4 << 20, false).code(), Code::kInvalidArgument);
    ASSERT_TRUE(image->Discard(4 << 20, (12 << 20)).ok());
    ASSERT_TRUE(image->Flush().ok());
    ASSERT_TRUE(image->Resize(4 << 20, true).ok());
    want.resize(4 << 20);
    ASSERT_TRUE(image->Close().ok());
  }
  ExpectQemuAgrees(img, want);
  auto info = Shell("qemu-img info " + img);
  EXPECT_NE(info.output.find("4 MiB"), std::string::npos) << info.output;
}

TEST_F(InteropTest, WriteCompressedIsReadableByQemu) {
  REQUIRE_QEMU_IMG();
  for (const char* type : {"zlib", "zstd"}) {
    std::string img = Path(std::string("wc_") + type + ".qcow2");
    auto r = Shell("qemu-img create -q -f qcow2 -o cluster_size=65536,compression_type=" +
                   std::string(type) + " " + img + " 1000K");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::vector<uint8_t> want(1000 << 10, 0);
    {
      auto image = OpenImage(img, false);
      ASSERT_TRUE(image);
      for (uint64_t c = 0; c * 65536 < want.size(); ++c) {
        uint64_t n = std::min<uint64_t>(65536, want.size() - c * 65536);
        std::vector<uint8_t> data(n);
        if (c % 3 == 2) {
          data = Pattern(c, n);  // incompressible: stored plainly
        } else {
          for (uint64_t i = 0; i < n; ++i) data[i] = uint8_t("abcabd"[(i + c) % 6]);
        }
        ASSERT_TRUE(image->WriteCompressed(c * 65536, data).ok()) << c;
        std::copy(data.begin(), data.end(), want.begin() + c * 65536);
      }
      std::vector<uint8_t> got(want.size());
      ASSERT_TRUE(image->Read(0, got).ok());
      EXPECT_TRUE(got == want);
      // Overwrite inside a compressed cluster.
      auto patch = Pattern(9, 1000);
      ASSERT_TRUE(image->Write(65536 + 10, patch).ok());
      std::copy(patch.begin(), patch.end(), want.begin() + 65536 + 10);
      ASSERT_TRUE(image->Close().ok());
    }
    ExpectQemuAgrees(img, want);
    auto check = Shell("qemu-img check " + img);
    EXPECT_NE(check.output.find("compressed"), std::string::npos) << check.output;
  }
}

// Compressed clusters of ~36 KiB each: every second one runs on from one
// host cluster into the next (the spec allows it; it is how the packing
// wastes nothing). qemu reads them, check counts every touched cluster, and
// overwriting or discarding them frees all of it.
TEST_F(InteropTest, CompressedClustersRunningIntoTheNextHostClusterAreSound) {
  REQUIRE_QEMU_IMG();
  for (const char* type : {"zlib", "zstd"}) {
    std::string img = Path(std::string("span_") + type + ".qcow2");
    auto r = Shell("qemu-img create -q -f qcow2 -o cluster_size=65536,compression_type=" +
                   std::string(type) + " " + img + " 1M");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    struct stat created {};
    ASSERT_EQ(::stat(img.c_str(), &created), 0);
    const uint64_t empty_size = uint64_t(created.st_size);
    std::vector<uint8_t> want(1 << 20, 0);
    {
      auto image = OpenImage(img, false);
      ASSERT_TRUE(image);
      for (uint64_t c = 0; c < 12; ++c) {
        // Half random, half a repeated phrase: compresses to a bit over half.
        std::vector<uint8_t> data = Pattern(100 + c, 65536);
        for (uint64_t i = 36864; i < 65536; ++i) data[i] = uint8_t("spanning"[(i + c) % 8]);
        ASSERT_TRUE(image->WriteCompressed(c * 65536, data).ok()) << c;
        std::copy(data.begin(), data.end(), want.begin() + c * 65536);
      }
      ASSERT_TRUE(image->Close().ok());
    }
    // 12 clusters of ~37 KiB packed take about 7 host clusters (plus an L2
    // table and refcount growth); without running on, each takes one: 13.
    auto info = Shell("qemu-img check " + img);
    EXPECT_NE(info.output.find("100.00% compressed"), std::string::npos) << info.output;
    struct stat st {};
    ASSERT_EQ(::stat(img.c_str(), &st), 0);
    EXPECT_LT(uint64_t(st.st_size) - empty_size, 11u * 65536) << "compressed clusters not packed";
    ExpectQemuAgrees(img, want);
    {
      auto image = OpenImage(img, false);
      ASSERT_TRUE(image);
      auto patch = Pattern(7, 65536);
      ASSERT_TRUE(image->Write(65536, patch).ok());  // a cluster that ran on
      std::copy(patch.begin(), patch.end(), want.begin() + 65536);
      ASSERT_TRUE(image->Discard(3 * 65536, 2 * 65536).ok());
      std::fill(want.begin() + 3 * 65536, want.begin() + 5 * 65536, 0);
      ASSERT_TRUE(image->Close().ok());
    }
    ExpectQemuAgrees(img, want);
  }
}

void SetIncompatibleBit(const std::string& path, uint64_t bit) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  uint8_t raw[8];
  f.seekg(72);
  f.read(reinterpret_cast<char*>(raw), 8);
  StoreBe64(raw, LoadBe64(raw) | bit);
  f.seekp(72);
  f.write(reinterpret_cast<const char*>(raw), 8);
}

TEST_F(InteropTest, DirtyImageIsRepairedAndCorruptImageIsReadOnly) {
  REQUIRE_QEMU_IMG();
  std::string img = Path("bits.qcow2");
  auto r = Shell("qemu-img create -q -f qcow2 -o lazy_refcounts=on " + img + " 4M");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = Shell("qemu-io -f qcow2 -c 'write -P 0x33 0 300k' " + img);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  SetIncompatibleBit(img, kIncompatDirty);
  {
    auto image = OpenImage(img, false);
    ASSERT_TRUE(image);
    EXPECT_EQ(image->header().incompatible_features & kIncompatDirty, 0u);
    ASSERT_TRUE(image->Write(1 << 20, Pattern(1, 4096)).ok());
    ASSERT_TRUE(image->Close().ok());
  }
  auto check = Shell("qemu-img check " + img);
  EXPECT_EQ(check.exit_code, 0) << check.output;

  SetIncompatibleBit(img, kIncompatCorrupt);
  auto image = OpenImage(img, false);
  ASSERT_TRUE(image);
  EXPECT_TRUE(image->info().read_only);
  std::vector<uint8_t> buf(4096);
  EXPECT_EQ(image->Write(0, buf).code(), Code::kReadOnly);
  ASSERT_TRUE(image->Read(0, buf).ok());
  EXPECT_EQ(buf[0], 0x33);
}

}  // namespace
}  // namespace thindisk::qcow2
