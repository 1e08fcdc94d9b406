#include "bench/stats.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace thindisk::bench {
namespace {

TEST(PercentileTest, NearestRankOnOneToHundred) {
  std::vector<uint64_t> v;
  for (uint64_t i = 100; i >= 1; --i) v.push_back(i);  // unsorted on purpose
  EXPECT_EQ(Percentile(v, 50), 50u);
  EXPECT_EQ(Percentile(v, 99), 99u);
  EXPECT_EQ(Percentile(v, 100), 100u);
  EXPECT_EQ(Percentile(v, 1), 1u);
}

TEST(PercentileTest, SmallAndEmptySets) {
  EXPECT_EQ(Percentile({}, 50), 0u);
  EXPECT_EQ(Percentile({7}, 50), 7u);
  EXPECT_EQ(Percentile({7}, 99), 7u);
  // Ten samples: p50 is the 5th smallest, p99 the 10th (ceil(9.9)).
  std::vector<uint64_t> ten = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  EXPECT_EQ(Percentile(ten, 50), 5u);
  EXPECT_EQ(Percentile(ten, 99), 10u);
}

TEST(PercentileTest, AgreesWithSortedDefinitionOnRandomData) {
  std::mt19937_64 rng(3);
  std::vector<uint64_t> v(1001);
  for (uint64_t& x : v) x = rng() % 100000;
  std::vector<uint64_t> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  for (double p : {10.0, 50.0, 90.0, 99.0, 99.9}) {
    size_t rank = size_t(std::ceil(p / 100 * double(v.size())));
    EXPECT_EQ(Percentile(v, p), sorted[rank - 1]) << "p" << p;
  }
}

TEST(SummarizeTest, RatesAndLatencies) {
  LatencyLog log;
  for (uint64_t i = 1; i <= 100; ++i) log.Add(i * 1000);  // 1..100 us
  PhaseFigures f = Summarize(100, 400 * 1000 * 1000ull, 2.0, log);
  EXPECT_DOUBLE_EQ(f.mb_per_s, 200.0);
  EXPECT_DOUBLE_EQ(f.iops, 50.0);
  EXPECT_DOUBLE_EQ(f.p50_us, 50.0);
  EXPECT_DOUBLE_EQ(f.p99_us, 99.0);
  PhaseFigures zero = Summarize(0, 0, 0, LatencyLog{});
  EXPECT_EQ(zero.mb_per_s, 0);
  EXPECT_EQ(zero.p99_us, 0);
}

TEST(LatencyLogTest, MergeKeepsAllSamples) {
  LatencyLog a, b;
  a.Add(1);
  b.Add(2);
  b.Add(3);
  a.Merge(b);
  EXPECT_EQ(a.count(), 3u);
  EXPECT_EQ(Percentile(a.samples(), 100), 3u);
}

}  // namespace
}  // namespace thindisk::bench
