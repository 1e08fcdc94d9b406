#include "qcow2/range_lock.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace thindisk::qcow2 {
namespace {

TEST(RangeLockTest, DisjointRangesAreHeldTogether) {
  RangeLock lock;
  auto a = lock.Lock(0, 4);
  auto b = lock.Lock(4, 4);  // would deadlock if [0,4) and [4,8) overlapped
  EXPECT_EQ(lock.held(), 2u);
}

TEST(RangeLockTest, ReleasedOnGuardDestruction) {
  RangeLock lock;
  { auto a = lock.Lock(10, 1); EXPECT_EQ(lock.held(), 1u); }
  EXPECT_EQ(lock.held(), 0u);
}

TEST(RangeLockTest, OverlappingWritersAreSerialized) {
  RangeLock lock;
  std::atomic<int> inside{0};
  std::atomic<int> max_inside{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        // All ranges contain cluster 5.
        auto g = lock.Lock(uint64_t(t % 3), uint64_t(6 + t));
        int now = ++inside;
        int seen = max_inside.load();
        while (now > seen && !max_inside.compare_exchange_weak(seen, now)) {}
        --inside;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(max_inside.load(), 1);
  EXPECT_EQ(lock.held(), 0u);
}

TEST(RangeLockTest, WaiterProceedsAfterRelease) {
  RangeLock lock;
  std::atomic<bool> started{false};
  std::atomic<bool> acquired{false};
  std::thread waiter;
  {
    auto g = lock.Lock(0, 2);
    waiter = std::thread([&] {
      started = true;
      auto g2 = lock.Lock(1, 1);
      acquired = true;
    });
    // The waiter must have reached Lock(): a check made before it ran
    // would pass whatever Lock() does.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!started.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    ASSERT_TRUE(started.load()) << "the waiter thread never ran";
    // Lock() without exclusion returns in microseconds; give it 50 ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(acquired.load());
    EXPECT_EQ(lock.held(), 1u);
  }
  waiter.join();
  EXPECT_TRUE(acquired.load());
  EXPECT_EQ(lock.held(), 0u);
}

}  // namespace
}  // namespace thindisk::qcow2
