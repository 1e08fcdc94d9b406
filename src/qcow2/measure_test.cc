// Measure: the replay on metadata-only storage gives the same file size as
// the same writes with real data; fully-allocated equals what create lays
// out with preallocation; an empty image measures what create writes;
// MeasureBitmaps gives qemu-img measure's "bitmaps" figures.
#include "qcow2/measure.h"

#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <string>
#include <vector>

#include "qcow2/image_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::CreateMem;
using testing::MemImage;
using testing::Pattern;

constexpr uint64_t kMiB = 1 << 20;

CreateOptions Opts(uint32_t cluster, bool extended, uint32_t refcount_bits, uint64_t size) {
  CreateOptions o;
  o.size = size;
  o.cluster_size = cluster;
  o.extended_l2 = extended;
  o.refcount_bits = refcount_bits;
  return o;
}

// A source with scattered data, zero runs inside data, and holes.
MemImage MakeSource(uint64_t size, uint64_t seed) {
  MemImage src = CreateMem(Opts(65536, false, 16, size));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 64; ++i) {
    uint64_t len = 512 * (1 + rng() % 400);
    uint64_t off = (rng() % (size - len)) / 512 * 512;
    auto data = Pattern(seed + i, len);
    if (i % 5 == 0) std::fill(data.begin() + len / 4, data.begin() + len / 2, 0);
    EXPECT_TRUE(src.image->Write(off, data).ok());
  }
  return src;
}

// What `thindisk convert` writes, with the real bytes, onto memory.
uint64_t ConvertedSize(block::Device& src, const CreateOptions& o) {
  CreateOptions t = o;
  t.size = src.size();
  MemImage dst = CreateMem(t);
  const uint64_t size = src.size();
  std::vector<uint8_t> buf(kConvertChunk);
  for (uint64_t off = 0; off < size;) {
    auto e = src.GetStatus(off, size - off);
    EXPECT_TRUE(e.has_value());
    uint64_t n = std::min(e->length, size - off);
    if (!e->zero) {
      n = std::min(n, kConvertChunk);
      std::span<uint8_t> data(buf.data(), n);
      EXPECT_TRUE(src.Read(off, data).ok());
      for (uint64_t p = 0; p < n; p += kConvertSparseGrain) {
        auto piece = data.subspan(p, std::min(kConvertSparseGrain, n - p));
        bool zero = std::all_of(piece.begin(), piece.end(), [](uint8_t b) { return b == 0; });
        if (!zero) {
          EXPECT_TRUE(dst.image->Write(off + p, piece).ok());
        }
      }
    }
    off += n;
  }
  EXPECT_TRUE(dst.image->Close().ok());
  auto s = dst.storage->Size();
  EXPECT_TRUE(s.has_value());
  return *s;
}

class MeasureTest
    : public ::testing::TestWithParam<std::tuple<uint32_t, bool, uint32_t>> {};

TEST_P(MeasureTest, RequiredIsTheConvertedFileSize) {
  auto [cluster, extended, refbits] = GetParam();
  MemImage src = MakeSource(64 * kMiB, 7);
  CreateOptions o = Opts(cluster, extended, refbits, 0);
  auto m = Measure(src.image.get(), o);
  ASSERT_TRUE(m.has_value()) << m.error().ToString();
  EXPECT_EQ(m->required, ConvertedSize(*src.image, o));
  EXPECT_LE(m->required, m->fully_allocated);
}

TEST_P(MeasureTest, FullyAllocatedIsThePreallocatedFileSize) {
  auto [cluster, extended, refbits] = GetParam();
  for (uint64_t size : {uint64_t{0}, uint64_t{512 * 1000}, 64 * kMiB + 512, 300 * kMiB}) {
    CreateOptions o = Opts(cluster, extended, refbits, size);
    o.preallocation = Preallocation::kMetadata;
    auto storage = io::NewMemoryStorage();
    ASSERT_TRUE(Create(*storage, o).ok());
    auto m = Measure(nullptr, o);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->fully_allocated, *storage->Size()) << "size " << size;
    EXPECT_EQ(m->required, m->fully_allocated);
    // Without preallocation, an empty image measures what create writes.
    o.preallocation = Preallocation::kOff;
    auto empty = io::NewMemoryStorage();
    ASSERT_TRUE(Create(*empty, o).ok());
    m = Measure(nullptr, o);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->required, *empty->Size()) << "size " << size;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, MeasureTest,
                         ::testing::Values(std::make_tuple(65536u, false, 16u),
                                           std::make_tuple(131072u, true, 16u),
                                           std::make_tuple(4096u, false, 16u),
                                           std::make_tuple(512u, false, 16u),
                                           std::make_tuple(65536u, true, 1u),
                                           std::make_tuple(2097152u, true, 64u)));

BitmapInfo Bitmap(uint64_t granularity, size_t name_size = 2) {
  BitmapInfo b;
  b.name = std::string(name_size, 'b');
  b.granularity_bits = uint32_t(std::countr_zero(granularity));
  return b;
}

struct BitmapCase {
  uint64_t virtual_size;
  uint64_t cluster_size;
  std::vector<BitmapInfo> bitmaps;
  uint64_t expected;  // what qemu-img 7.2 measure -O qcow2 printed
};

// Figures observed with qemu-img 7.2 (-o cluster_size=CLUSTER; the source's
// cluster size plays no part).
TEST(MeasureBitmapsTest, MatchesQemuImg) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  constexpr uint64_t k64 = 65536;
  const std::vector<BitmapCase> cases = {
      {kGiB, k64, {}, 0},
      {kGiB, k64, {Bitmap(k64)}, 196608},
      {kGiB, k64, {Bitmap(k64), Bitmap(k64)}, 327680},
      {kGiB, k64, {Bitmap(4096)}, 196608},
      {kGiB, k64, {Bitmap(512)}, 393216},
      {10 * kGiB, k64, {Bitmap(512)}, 2752512},
      {10 * kGiB, k64, {Bitmap(4096)}, 458752},
      {100 * kGiB, k64, {Bitmap(k64), Bitmap(4096), Bitmap(512)}, 30015488},
      {1024 * kGiB, k64, {Bitmap(512)}, 268566528},
      {1024 * kGiB, k64, {Bitmap(4096)}, 33685504},
      {3 * kGiB, k64, {Bitmap(k64)}, 196608},
      {1000001, k64, {Bitmap(512)}, 196608},
      {kGiB, 131072, {Bitmap(512)}, 524288},
      {100 * kGiB, 131072, {Bitmap(512)}, 26476544},
      {kGiB, 4096, {Bitmap(k64)}, 12288},
      {kGiB, 4096, {Bitmap(512)}, 270336},
      {kGiB, 2 * kMiB, {Bitmap(512)}, 6291456},
      {kGiB, 512, {Bitmap(k64)}, 3072},
      {kGiB, 512, {Bitmap(k64, 1023)}, 4096},
      // The directory is rounded up as a whole: 3 x 1048 bytes = 7 clusters.
      {kGiB, 512, {Bitmap(k64, 1023), Bitmap(k64, 1023), Bitmap(k64, 1023)}, 11264},
      {kGiB, 512, std::vector<BitmapInfo>(16, Bitmap(k64)), 41472},
      {kGiB, 512, {Bitmap(512)}, 266752},
  };
  for (const BitmapCase& c : cases) {
    EXPECT_EQ(MeasureBitmaps(c.bitmaps, c.virtual_size, c.cluster_size), c.expected)
        << c.bitmaps.size() << " bitmap(s), size " << c.virtual_size << ", cluster "
        << c.cluster_size;
  }
}

// Disabled and inconsistent bitmaps count like any other.
TEST(MeasureBitmapsTest, CountsEveryBitmap) {
  BitmapInfo in_use = Bitmap(65536);
  in_use.in_use = true;
  in_use.problem = "in use";
  BitmapInfo disabled = Bitmap(65536);
  disabled.enabled = false;
  EXPECT_EQ(MeasureBitmaps({in_use, disabled}, uint64_t{1} << 30, 65536), 327680u);
}

}  // namespace
}  // namespace thindisk::qcow2
