#include "bench/in_process.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace thindisk::bench {
namespace {

InProcessOptions W9Options(uint32_t qd) {
  InProcessOptions o;
  o.dir = ::testing::TempDir();
  o.size = 1 << 20;
  o.qd = qd;
  o.seed = 3;
  o.workloads = {Workload::kW9RandRead};
  return o;
}

TEST(InProcessW9Test, ReadsEveryBlockAtQd1AndAtQd) {
  auto report = RunInProcess(W9Options(4));
  ASSERT_TRUE(report.has_value()) << report.error().message();
  EXPECT_EQ(report->latency_us, 0u);
  ASSERT_EQ(report->results.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const WorkloadResult& r = report->results[i];
    EXPECT_EQ(r.id, "W9");
    EXPECT_EQ(r.qd, i == 0 ? 1u : 4u);
    EXPECT_EQ(r.variant, i == 0 ? "qd1" : "qd4");
    EXPECT_EQ(r.figures.ops, 256u);  // every 4 KiB block of 1 MiB once
    EXPECT_EQ(r.figures.bytes, 1u << 20);
    EXPECT_GT(r.figures.iops, 0);
    // Reads: the set-up writes are not charged to the phase.
    EXPECT_FALSE(r.write_amplification.has_value());
    EXPECT_FALSE(r.host_bytes_written.has_value());
    // The set-up wrote every byte, so the image holds at least the data.
    ASSERT_TRUE(r.allocated_bytes.has_value());
    EXPECT_GE(*r.allocated_bytes, 1u << 20);
  }
}

TEST(InProcessW9Test, QueueDepthOneRunsOnce) {
  auto report = RunInProcess(W9Options(1));
  ASSERT_TRUE(report.has_value()) << report.error().message();
  ASSERT_EQ(report->results.size(), 1u);
  EXPECT_EQ(report->results[0].variant, "qd1");
}

// Not a timing benchmark: with a 5 ms latency every request waits at
// least that long, so QD 1 takes at least ops x latency whatever the
// machine does, and the op cap holds per phase.
TEST(InProcessW9Test, LatencyIsReportedAndEveryPhaseIsCapped) {
  InProcessOptions o = W9Options(8);
  o.latency = std::chrono::milliseconds(5);
  o.limits.max_ops = 8;
  auto report = RunInProcess(o);
  ASSERT_TRUE(report.has_value()) << report.error().message();
  EXPECT_EQ(report->latency_us, 5000u);
  ASSERT_EQ(report->results.size(), 2u);
  for (const WorkloadResult& r : report->results)
    EXPECT_EQ(r.figures.ops, 8u) << r.variant;
  const WorkloadResult& qd1 = report->results[0];
  EXPECT_GE(qd1.figures.seconds, 8 * 0.005);
  EXPECT_GE(qd1.figures.p50_us, 5000);
}

}  // namespace
}  // namespace thindisk::bench
