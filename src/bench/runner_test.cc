#include "bench/runner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>

namespace thindisk::bench {
namespace {

TEST(RunThreadedTest, RunsEveryOpOnceAcrossWorkersThenFinish) {
  std::vector<Op> ops = RandomOps(1 << 20, 4096, 3);
  std::mutex mu;
  std::multiset<uint64_t> seen;
  bool finished = false;
  auto run = RunThreaded(
      ops, 4, 1, RunLimits{}, nullptr,
      [&](const Op& op, std::span<uint8_t> buf) {
        EXPECT_EQ(buf.size(), op.length);
        std::lock_guard lock(mu);
        seen.insert(op.offset);
        return Status::Ok();
      },
      [&] {
        finished = true;
        return Status::Ok();
      });
  ASSERT_TRUE(run.has_value()) << run.error().ToString();
  EXPECT_TRUE(finished);
  EXPECT_EQ(run->executed, ops.size());
  EXPECT_EQ(run->bytes, ops.size() * 4096);
  EXPECT_EQ(run->latencies.count(), ops.size());
  ASSERT_EQ(seen.size(), ops.size());
  for (const Op& op : ops) EXPECT_EQ(seen.count(op.offset), 1u);
}

TEST(RunThreadedTest, OpLimitExecutesAPrefix) {
  std::vector<Op> ops = SequentialOps(0, 100 * 4096, 4096);
  std::mutex mu;
  std::set<uint64_t> seen;
  RunLimits limits;
  limits.max_ops = 10;
  auto run = RunThreaded(ops, 3, 1, limits, nullptr,
                         [&](const Op& op, std::span<uint8_t>) {
                           std::lock_guard lock(mu);
                           seen.insert(op.offset);
                           return Status::Ok();
                         },
                         nullptr);
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->executed, 10u);
  EXPECT_EQ(seen, (std::set<uint64_t>{0, 4096, 8192, 12288, 16384, 20480, 24576, 28672, 32768, 36864}));
}

TEST(RunThreadedTest, FirstErrorStopsTheRunAndNamesTheOffset) {
  std::vector<Op> ops = SequentialOps(0, 1000 * 4096, 4096);
  std::atomic<int> calls{0};
  auto run = RunThreaded(ops, 2, 1, RunLimits{}, nullptr,
                         [&](const Op& op, std::span<uint8_t>) {
                           ++calls;
                           return op.offset == 5 * 4096 ? Status::NotSupported("boom") : Status::Ok();
                         },
                         nullptr);
  ASSERT_FALSE(run.has_value());
  EXPECT_EQ(run.error().code(), Code::kNotSupported);
  EXPECT_NE(run.error().message().find("20480"), std::string::npos) << run.error().message();
  EXPECT_LT(calls.load(), 1000);
}

// A phase ends when its last op does: the 100 ms progress tick must not
// round it up (it did, and made short phases at high QD look slow).
TEST(RunThreadedTest, ProgressDoesNotPadTheTimedPhase) {
  std::vector<Op> ops = SequentialOps(0, 4 * 4096, 4096);
  uint64_t last_done = 0;
  auto run = RunThreaded(
      ops, 2, 1, RunLimits{}, [&](uint64_t done, uint64_t) { last_done = done; },
      [](const Op&, std::span<uint8_t>) { return Status::Ok(); }, nullptr);
  ASSERT_TRUE(run.has_value()) << run.error().ToString();
  EXPECT_EQ(last_done, ops.size());
  EXPECT_LT(run->seconds, 0.1);  // four no-ops; a tick alone is 0.1 s
}

}  // namespace
}  // namespace thindisk::bench
