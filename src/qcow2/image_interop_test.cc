// Interoperability with qemu-img on real files: images qemu-img made are
// read correctly (plain and compressed), and images this engine wrote pass
// `qemu-img check` and `qemu-img compare` against a raw file of the
// expected content. Skips when qemu-img is missing, unless $CI is set.
#include "qcow2/image_interop_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::InteropTest;
using testing::Pattern;
using testing::Shell;

// Data with compressible text, zeros and incompressible runs.
std::vector<uint8_t> MixedContent(size_t size) {
  std::vector<uint8_t> v(size, 0);
  const std::string text = "thindisk compresses this sentence rather well. ";
  for (size_t i = 0; i < size / 3; ++i) v[i] = uint8_t(text[i % text.size()]);
  auto random = Pattern(77, size / 4);
  std::copy(random.begin(), random.end(), v.begin() + size / 2);
  return v;
}

TEST_F(InteropTest, ReadsCompressedImagesFromQemuImg) {
  REQUIRE_QEMU_IMG();
  const auto content = MixedContent(3 << 20);
  WriteFile(Path("src.raw"), content);
  for (const char* type : {"zlib", "zstd"}) {
    std::string img = Path(std::string("c_") + type + ".qcow2");
    auto r = Shell("qemu-img convert -c -f raw -O qcow2 -o compression_type=" + std::string(type) +
                 " " + Path("src.raw") + " " + img);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    {
      auto image = OpenImage(img, true);
      ASSERT_TRUE(image);
      std::vector<uint8_t> got(content.size());
      // Odd-sized reads exercise partial reads of compressed clusters.
      for (size_t off = 0; off < got.size(); off += 100000) {
        size_t n = std::min<size_t>(100000, got.size() - off);
        ASSERT_TRUE(image->Read(off, std::span(got).subspan(off, n)).ok());
      }
      EXPECT_TRUE(got == content) << type;
    }
    // Overwrite part of a compressed cluster: copy-on-write out of it.
    auto want = content;
    {
      auto image = OpenImage(img, false);
      ASSERT_TRUE(image);
      auto patch = Pattern(5, 3000);
      ASSERT_TRUE(image->Write(70000, patch).ok());
      std::copy(patch.begin(), patch.end(), want.begin() + 70000);
      ASSERT_TRUE(image->Discard(0, 65536).ok());
      std::fill(want.begin(), want.begin() + 65536, 0);
      ASSERT_TRUE(image->Close().ok());
    }
    ExpectQemuAgrees(img, want);
  }
}

struct Matrix {
  uint32_t cluster;
  bool ext;
  const char* compat;
  uint32_t refcount_bits;
};

class InteropMatrixTest : public InteropTest, public ::testing::WithParamInterface<Matrix> {};

TEST_P(InteropMatrixTest, OurWritesPassQemuCheckAndCompare) {
  REQUIRE_QEMU_IMG();
  const Matrix& p = GetParam();
  const uint64_t size = 16 << 20;
  std::string img = Path("m.qcow2");
  std::string opts = "cluster_size=" + std::to_string(p.cluster) + ",compat=" + p.compat +
                     ",refcount_bits=" + std::to_string(p.refcount_bits) +
                     ",extended_l2=" + (p.ext ? "on" : "off");
  auto r = Shell("qemu-img create -q -f qcow2 -o " + opts + " " + img + " " + std::to_string(size));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<uint8_t> want(size, 0);
  {
    auto image = OpenImage(img, false);
    ASSERT_TRUE(image);
    std::mt19937_64 rng(p.cluster + p.ext + p.refcount_bits);
    for (int i = 0; i < 300; ++i) {
      uint64_t off = rng() % size;
      uint64_t len = std::min<uint64_t>(1 + rng() % (3 * p.cluster + 5000), size - off);
      int op = int(rng() % 10);
      if (op < 6) {
        auto data = Pattern(i, len);
        ASSERT_TRUE(image->Write(off, data).ok());
        std::copy(data.begin(), data.end(), want.begin() + off);
      } else if (op < 8) {
        ASSERT_TRUE(image->Discard(off, len).ok());
        std::fill(want.begin() + off, want.begin() + off + len, 0);
      } else {
        block::ZeroFlags f;
        f.may_unmap = op == 9;
        ASSERT_TRUE(image->WriteZeroes(off, len, f).ok());
        std::fill(want.begin() + off, want.begin() + off + len, 0);
      }
      if (i % 50 == 49) {
        ASSERT_TRUE(image->Flush().ok());
      }
    }
    std::vector<uint8_t> got(size);
    ASSERT_TRUE(image->Read(0, got).ok());
    EXPECT_TRUE(got == want);
    ASSERT_TRUE(image->Close().ok());
  }
  ExpectQemuAgrees(img, want);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, InteropMatrixTest,
    ::testing::Values(Matrix{512, false, "1.1", 16}, Matrix{512, false, "0.10", 16},
                      Matrix{512, false, "1.1", 64}, Matrix{4096, false, "1.1", 1},
                      Matrix{4096, false, "0.10", 16}, Matrix{65536, false, "1.1", 16},
                      Matrix{65536, true, "1.1", 16}, Matrix{65536, false, "0.10", 16},
                      Matrix{65536, true, "1.1", 64}, Matrix{131072, true, "1.1", 16},
                      Matrix{131072, false, "1.1", 1}, Matrix{2 << 20, true, "1.1", 16},
                      Matrix{2 << 20, false, "0.10", 16}),
    [](const ::testing::TestParamInfo<Matrix>& i) {
      std::string c = i.param.compat;
      for (char& ch : c) ch = ch == '.' ? '_' : ch;
      return "c" + std::to_string(i.param.cluster) + (i.param.ext ? "_ext" : "") + "_compat" +
             c + "_rc" + std::to_string(i.param.refcount_bits);
    });

}  // namespace
}  // namespace thindisk::qcow2
