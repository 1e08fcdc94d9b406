#include "bench/workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "util/compress.h"

namespace thindisk::bench {
namespace {

TEST(RandomOpsTest, SameSeedSameOffsets) {
  std::vector<Op> a = RandomOps(8 << 20, 4096, 42);
  std::vector<Op> b = RandomOps(8 << 20, 4096, 42);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].offset, b[i].offset) << i;
}

TEST(RandomOpsTest, DifferentSeedDifferentOrder) {
  std::vector<Op> a = RandomOps(8 << 20, 4096, 1);
  std::vector<Op> b = RandomOps(8 << 20, 4096, 2);
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i].offset == b[i].offset;
  EXPECT_LT(same, a.size() / 10);
}

TEST(RandomOpsTest, EveryBlockExactlyOnceSoAllAreFirstWrites) {
  const uint64_t span = 4 << 20;
  std::vector<Op> ops = RandomOps(span, 4096, 7);
  ASSERT_EQ(ops.size(), span / 4096);
  std::set<uint64_t> seen;
  for (const Op& op : ops) {
    EXPECT_EQ(op.offset % 4096, 0u);
    EXPECT_LT(op.offset, span);
    EXPECT_EQ(op.length, 4096u);
    EXPECT_TRUE(seen.insert(op.offset).second) << op.offset;
  }
  EXPECT_FALSE(std::is_sorted(ops.begin(), ops.end(),
                              [](const Op& x, const Op& y) { return x.offset < y.offset; }));
}

TEST(RandomOpsTest, CountTruncatesToAPrefix) {
  std::vector<Op> all = RandomOps(4 << 20, 4096, 9);
  std::vector<Op> some = RandomOps(4 << 20, 4096, 9, 10);
  ASSERT_EQ(some.size(), 10u);
  for (size_t i = 0; i < some.size(); ++i) EXPECT_EQ(some[i].offset, all[i].offset);
}

TEST(SequentialOpsTest, CoversTheSpanInOrderWithAShortTail) {
  std::vector<Op> ops = SequentialOps(1000, 2500, 1024);
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_EQ(ops[0].offset, 1000u);
  EXPECT_EQ(ops[1].offset, 2024u);
  EXPECT_EQ(ops[2].offset, 3048u);
  EXPECT_EQ(ops[2].length, 452u);
}

TEST(ParseWorkloadsTest, AcceptsListsInAnyOrderAndCase) {
  auto w = ParseWorkloads("W3,w1,W3");
  ASSERT_TRUE(w.has_value());
  ASSERT_EQ(w->size(), 2u);
  EXPECT_EQ((*w)[0], Workload::kW1SeqRead);
  EXPECT_EQ((*w)[1], Workload::kW3Rewrite);
  EXPECT_EQ(WorkloadId((*w)[1]), "W3");
}

TEST(ParseWorkloadsTest, W9ComesAfterW6) {
  auto w = ParseWorkloads("w9,W2,W6");
  ASSERT_TRUE(w.has_value());
  ASSERT_EQ(w->size(), 3u);
  EXPECT_EQ((*w)[0], Workload::kW2FirstWrite);
  EXPECT_EQ((*w)[1], Workload::kW6Compress);
  EXPECT_EQ((*w)[2], Workload::kW9RandRead);
  EXPECT_EQ(WorkloadId(Workload::kW9RandRead), "W9");
}

TEST(ParseWorkloadsTest, RejectsUnknownNames) {
  for (const char* bad : {"W7", "W8", "W0", "X1", "", "W1,", "W12", "W99", "9"}) {
    auto w = ParseWorkloads(bad);
    ASSERT_FALSE(w.has_value()) << bad;
    EXPECT_EQ(w.error().code(), Code::kInvalidArgument);
  }
}

TEST(CorpusTest, TextIsDeterministicTextLikeAndCompressible) {
  std::vector<uint8_t> a = TextCorpus(5, 256 * 1024);
  std::vector<uint8_t> b = TextCorpus(5, 256 * 1024);
  std::vector<uint8_t> c = TextCorpus(6, 256 * 1024);
  ASSERT_EQ(a.size(), 256u * 1024);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (uint8_t ch : a) {
    ASSERT_TRUE(ch == ' ' || ch == '\n' || ch == '.' || ch == ',' || (ch >= 'a' && ch <= 'z') ||
                (ch >= 'A' && ch <= 'Z'))
        << int(ch);
  }
  // Prose-like redundancy: zlib gets well under half, and the entropy
  // guess does not call it incompressible.
  std::vector<uint8_t> out(a.size());
  auto n = Compress(Codec::kZlib, kDefaultCompressionLevel, a, out);
  ASSERT_TRUE(n.has_value());
  EXPECT_LT(*n, a.size() / 2);
  EXPECT_FALSE(LooksIncompressible(a));
}

TEST(CorpusTest, RandomFillIsDeterministicAndVaried) {
  std::vector<uint8_t> a(4096), b(4096), c(4096);
  FillRandom(1, a);
  FillRandom(1, b);
  FillRandom(2, c);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_TRUE(LooksIncompressible(a));
}

}  // namespace
}  // namespace thindisk::bench
