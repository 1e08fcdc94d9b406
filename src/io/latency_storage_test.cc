#include "io/latency_storage.h"

#include <gtest/gtest.h>

#include <chrono>
#include <latch>
#include <thread>
#include <vector>

#include "io/memory_storage.h"

namespace thindisk::io {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// A latency far above scheduler noise, so the bounds below cannot flip.
constexpr milliseconds kLatency{10};

struct Wrapped {
  MemoryStorage* inner;
  std::unique_ptr<LatencyStorage> slow;
};

Wrapped Wrap(microseconds latency) {
  auto inner = NewMemoryStorage("disk");
  MemoryStorage* raw = inner.get();
  return {raw, std::make_unique<LatencyStorage>(std::move(inner), latency)};
}

TEST(LatencyStorage, ResultsAreTheInnerStoragesResults) {
  auto [inner, slow] = Wrap(microseconds(100));
  EXPECT_EQ(slow->name(), "disk");
  std::vector<uint8_t> data(3 * MemoryStorage::kChunkSize, 7);
  ASSERT_TRUE(slow->WriteAt(MemoryStorage::kChunkSize, data).ok());
  ASSERT_TRUE(slow->ZeroRange(MemoryStorage::kChunkSize, 100).ok());
  ASSERT_TRUE(
      slow->PunchHole(2 * MemoryStorage::kChunkSize, MemoryStorage::kChunkSize).ok());
  ASSERT_TRUE(slow->Allocate(0, 10 * MemoryStorage::kChunkSize).ok());
  ASSERT_TRUE(slow->Flush().ok());

  EXPECT_EQ(*slow->Size(), *inner->Size());
  EXPECT_EQ(*slow->Size(), 10 * MemoryStorage::kChunkSize);
  EXPECT_EQ(*slow->NextData(0), *inner->NextData(0));
  EXPECT_EQ(*slow->NextHole(MemoryStorage::kChunkSize),
            *inner->NextHole(MemoryStorage::kChunkSize));
  EXPECT_EQ(*slow->AllocatedBytes(), *inner->AllocatedBytes());
  EXPECT_EQ(slow->bytes_written(), inner->bytes_written());
  EXPECT_GT(slow->bytes_written(), 0u);

  std::vector<uint8_t> a(5 * MemoryStorage::kChunkSize), b(a.size());
  ASSERT_TRUE(slow->ReadAt(0, a).ok());
  ASSERT_TRUE(inner->ReadAt(0, b).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(a[MemoryStorage::kChunkSize + 99], 0);
  EXPECT_EQ(a[MemoryStorage::kChunkSize + 100], 7);

  ASSERT_TRUE(slow->Resize(MemoryStorage::kChunkSize).ok());
  EXPECT_EQ(*inner->Size(), MemoryStorage::kChunkSize);
  // Errors pass through unchanged.
  Status too_big = slow->Resize(MemoryStorage::kMaxSize + 1);
  EXPECT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.code(), inner->Resize(MemoryStorage::kMaxSize + 1).code());
}

TEST(LatencyStorage, ConcurrentRequestsOverlap) {
  auto [inner, slow] = Wrap(kLatency);
  ASSERT_TRUE(inner->WriteAt(0, std::vector<uint8_t>(16 * 4096, 1)).ok());
  constexpr int kThreads = 16;
  std::latch start(kThreads + 1);
  std::vector<std::thread> threads;
  std::vector<Status> results(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      std::vector<uint8_t> buf(4096);
      start.arrive_and_wait();
      results[i] = slow->ReadAt(uint64_t(i) * 4096, buf);
    });
  }
  start.arrive_and_wait();
  Clock::time_point t0 = Clock::now();
  for (std::thread& t : threads) t.join();
  Clock::duration took = Clock::now() - t0;
  for (const Status& s : results) EXPECT_TRUE(s.ok());
  // Serialized they would take 16 latencies; overlapping, about one.
  EXPECT_LT(took, 8 * kLatency);
}

TEST(LatencyStorage, SequentialRequestsEachWaitTheLatency) {
  auto [inner, slow] = Wrap(kLatency);
  std::vector<uint8_t> buf(4096);
  Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(slow->WriteAt(0, buf).ok());
  ASSERT_TRUE(slow->ReadAt(0, buf).ok());
  ASSERT_TRUE(slow->Flush().ok());
  ASSERT_TRUE(slow->NextData(0).has_value());
  EXPECT_GE(Clock::now() - t0, 4 * kLatency);
}

TEST(LatencyStorage, MetadataCallsDoNotWait) {
  auto [inner, slow] = Wrap(std::chrono::seconds(10));
  // Each of these would take 10 s if it waited.
  EXPECT_EQ(*slow->Size(), 0u);
  EXPECT_EQ(*slow->AllocatedBytes(), 0u);
  EXPECT_EQ(slow->bytes_written(), 0u);
  slow->Announce(Event::kDataWrite);
  EXPECT_EQ(slow->latency(), std::chrono::seconds(10));
}

TEST(LatencyStorage, ZeroLatencyForwardsDirectly) {
  auto [inner, slow] = Wrap(microseconds(0));
  std::vector<uint8_t> buf(4096, 3), back(4096);
  Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(slow->WriteAt(uint64_t(i) * 4096, buf).ok());
    ASSERT_TRUE(slow->ReadAt(uint64_t(i) * 4096, back).ok());
  }
  EXPECT_EQ(back, buf);
  EXPECT_EQ(*inner->Size(), 1000u * 4096);
  // 2000 requests: even a 1 us sleep each would show; none at all is far below.
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1));
}

}  // namespace
}  // namespace thindisk::io
