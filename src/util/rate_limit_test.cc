#include "util/rate_limit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace thindisk {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

TEST(RateLimitTest, FirstRequestGoesAtOnceAndLaterOnesWaitForTheBytesBeforeThem) {
  RateLimit limit(1000);  // bytes per second
  const RateLimit::Clock::time_point t0{seconds(100)};
  EXPECT_EQ(limit.Reserve(500, t0), nanoseconds::zero());
  // The 500 bytes take 0.5 s: the next request waits until then.
  EXPECT_EQ(limit.Reserve(250, t0), milliseconds(500));
  EXPECT_EQ(limit.Reserve(1, t0 + milliseconds(100)), milliseconds(650));
}

TEST(RateLimitTest, IdleTimeGivesNoCredit) {
  RateLimit limit(1 << 20);
  const RateLimit::Clock::time_point t0{seconds(5)};
  EXPECT_EQ(limit.Reserve(1 << 20, t0), nanoseconds::zero());
  // Ten seconds later the booked second is long paid: the next request
  // goes at once, and the one after it waits its full cost again.
  const auto later = t0 + seconds(10);
  EXPECT_EQ(limit.Reserve(1 << 20, later), nanoseconds::zero());
  EXPECT_EQ(limit.Reserve(1, later), seconds(1));
}

TEST(RateLimitTest, LargeRequestsDoNotOverflow) {
  RateLimit limit(1 << 20);  // 1 MiB/s
  const RateLimit::Clock::time_point t0{seconds(1)};
  // 1 TiB: its cost in nanoseconds times 1e9 is past 64 bits.
  EXPECT_EQ(limit.Reserve(uint64_t{1} << 40, t0), nanoseconds::zero());
  EXPECT_EQ(limit.Reserve(1, t0), seconds(uint64_t{1} << 20));
  // At one byte a second, 2^62 bytes would wait past the clock's range:
  // the wait stops at about 36 years instead of wrapping around.
  RateLimit slow(1);
  EXPECT_EQ(slow.Reserve(uint64_t{1} << 62, t0), nanoseconds::zero());
  const nanoseconds wait = slow.Reserve(1, t0);
  EXPECT_GT(wait, std::chrono::hours(24 * 365 * 30));
}

// Threads sharing one limit: every booking gets its own slot, so the waits
// are all different and the last one is the whole booked time but one
// request's.
TEST(RateLimitTest, ThreadsShareOneSchedule) {
  RateLimit limit(1000);
  const RateLimit::Clock::time_point t0{seconds(1)};
  constexpr int kThreads = 4, kEach = 50;
  std::vector<std::vector<nanoseconds>> waits(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < kEach; ++j) waits[i].push_back(limit.Reserve(10, t0));
    });
  }
  for (auto& t : threads) t.join();
  std::vector<nanoseconds> all;
  for (auto& w : waits) all.insert(all.end(), w.begin(), w.end());
  std::sort(all.begin(), all.end());
  for (size_t k = 0; k < all.size(); ++k) EXPECT_EQ(all[k], milliseconds(10) * k);
}

TEST(RateLimitTest, TakeSleepsForTheBookedBytes) {
  RateLimit limit(100 << 10);  // 100 KiB/s
  const auto start = RateLimit::Clock::now();
  for (int i = 0; i < 3; ++i) limit.Take(10 << 10);
  // The third request waits for the first two: 20 KiB at 100 KiB/s.
  EXPECT_GE(RateLimit::Clock::now() - start, milliseconds(200));
}

}  // namespace
}  // namespace thindisk
