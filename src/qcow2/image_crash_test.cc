// Power loss at random points of a seeded workload: the surviving image
// must have no metadata corruption (leaks are allowed: DESIGN.md rule 1),
// and every block not written since the last completed flush must read
// back as it was at that flush. The failing seed is printed.
#include <set>

#include "io/faulty_storage.h"
#include "qcow2/check.h"
#include "qcow2/image_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::Pattern;

struct CrashCase {
  uint32_t cluster;
  bool ext;
  uint32_t refcount_bits;
  io::PowerLossMode mode;
};

class CrashTest : public ::testing::TestWithParam<CrashCase> {};

TEST_P(CrashTest, SurvivesPowerLossWithLeaksAtMost) {
  const CrashCase& c = GetParam();
  constexpr uint64_t kSize = 8 << 20;
  constexpr uint64_t kBlock = 4096;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    auto mem = std::shared_ptr<io::Storage>(io::NewMemoryStorage("crash.qcow2"));
    CreateOptions o;
    o.size = kSize;
    o.cluster_size = c.cluster;
    o.extended_l2 = c.ext;
    o.refcount_bits = c.refcount_bits;
    ASSERT_TRUE(Create(*mem, o).ok());
    auto faulty_or = io::NewFaultyStorage(mem);
    ASSERT_TRUE(faulty_or.has_value());
    io::FaultyStorage* faulty = faulty_or->get();
    OpenOptions oo;
    oo.cache_bytes = 6 * uint64_t(c.cluster);  // small: evictions flush too
    auto img = Image::Open(std::move(*faulty_or), oo);
    ASSERT_TRUE(img.has_value()) << img.status().ToString();

    std::vector<uint8_t> current(kSize, 0), flushed(kSize, 0);
    std::set<uint64_t> touched;  // blocks changed since the last flush
    std::mt19937_64 rng(seed * 7919 + c.cluster);
    int ops = 20 + int(rng() % 120);
    for (int i = 0; i < ops; ++i) {
      uint64_t off = rng() % kSize;
      uint64_t len = std::min<uint64_t>(1 + rng() % (2 * c.cluster + 3000), kSize - off);
      int kind = int(rng() % 10);
      Status s;
      if (kind < 6) {
        auto data = Pattern(seed * 1000 + i, len);
        s = (*img)->Write(off, data);
        std::copy(data.begin(), data.end(), current.begin() + off);
      } else if (kind < 8) {
        s = (*img)->Discard(off, len);
        std::fill(current.begin() + off, current.begin() + off + len, 0);
      } else if (kind < 9) {
        s = (*img)->WriteZeroes(off, len, {});
        std::fill(current.begin() + off, current.begin() + off + len, 0);
      } else {
        s = (*img)->Flush();
        flushed = current;
        touched.clear();
        continue;
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (uint64_t b = off / kBlock; b <= (off + len - 1) / kBlock; ++b) touched.insert(b);
    }
    auto after = faulty->SimulatePowerLoss(c.mode, seed);
    ASSERT_TRUE(after.has_value());
    (*img).reset();  // the process "dies": destroy without caring

    auto report = Check(**after, RepairMode::kNone);
    ASSERT_TRUE(report.has_value()) << report.status().ToString();
    EXPECT_EQ(report->corruptions, 0u) << [&] {
      std::string all;
      for (auto& m : report->messages) all += m + "\n";
      return all;
    }();
    OpenOptions ro;
    ro.read_only = true;
    auto survivor = Image::Open(std::move(*after), ro);
    ASSERT_TRUE(survivor.has_value()) << survivor.status().ToString();
    std::vector<uint8_t> got(kSize);
    ASSERT_TRUE((*survivor)->Read(0, got).ok());
    for (uint64_t b = 0; b < kSize / kBlock; ++b) {
      if (touched.count(b)) continue;
      ASSERT_TRUE(std::equal(got.begin() + b * kBlock, got.begin() + (b + 1) * kBlock,
                             flushed.begin() + b * kBlock))
          << "block " << b << " lost flushed data";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CrashTest,
    ::testing::Values(CrashCase{65536, false, 16, io::PowerLossMode::kDropUnflushed},
                      CrashCase{65536, true, 16, io::PowerLossMode::kKeepRandomSubset},
                      CrashCase{4096, false, 16, io::PowerLossMode::kKeepRandomSubset},
                      CrashCase{512, false, 64, io::PowerLossMode::kTearOne},
                      CrashCase{131072, true, 1, io::PowerLossMode::kTearOne}));

}  // namespace
}  // namespace thindisk::qcow2
