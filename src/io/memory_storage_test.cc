#include "io/memory_storage.h"

#include <gtest/gtest.h>

#include <numeric>
#include <thread>
#include <vector>

namespace thindisk::io {
namespace {

constexpr uint64_t kChunk = MemoryStorage::kChunkSize;

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

std::vector<uint8_t> Read(Storage& s, uint64_t offset, size_t n) {
  std::vector<uint8_t> v(n, 0xEE);
  EXPECT_TRUE(s.ReadAt(offset, v).ok());
  return v;
}

TEST(MemoryStorage, HugeVirtualSizeCostsNothingAndReadsZeros) {
  auto s = NewMemoryStorage();
  ASSERT_TRUE(s->Resize(uint64_t{1} << 40).ok());
  EXPECT_EQ(*s->Size(), uint64_t{1} << 40);
  EXPECT_EQ(*s->AllocatedBytes(), 0u);
  EXPECT_EQ(Read(*s, (uint64_t{1} << 40) - 100, 300), std::vector<uint8_t>(300, 0));
  EXPECT_EQ(*s->NextData(0), uint64_t{1} << 40);
  EXPECT_EQ(*s->NextHole(12345), 12345u);
}

TEST(MemoryStorage, WriteAcrossChunksRoundTripsAndExtends) {
  auto s = NewMemoryStorage("m");
  EXPECT_EQ(s->name(), "m");
  auto data = Pattern(3 * kChunk, 3);
  const uint64_t off = kChunk - 10;
  ASSERT_TRUE(s->WriteAt(off, data).ok());
  EXPECT_EQ(*s->Size(), off + data.size());
  EXPECT_EQ(Read(*s, off, data.size()), data);
  EXPECT_EQ(s->ChunkCount(), 4u);  // touches chunks 0..3
  EXPECT_EQ(*s->AllocatedBytes(), 4 * kChunk);
  EXPECT_EQ(s->bytes_written(), data.size());
  // Before the write and past the end read as zeros.
  EXPECT_EQ(Read(*s, 0, 10), std::vector<uint8_t>(10, 0));
  EXPECT_EQ(Read(*s, off + data.size(), 10), std::vector<uint8_t>(10, 0));
}

TEST(MemoryStorage, PunchDropsWholeChunksAndZeroesPartialOnes) {
  auto s = NewMemoryStorage();
  auto data = Pattern(4 * kChunk, 1);
  ASSERT_TRUE(s->WriteAt(0, data).ok());
  ASSERT_TRUE(s->PunchHole(kChunk / 2, 2 * kChunk).ok());  // half of 0, all of 1, half of 2
  EXPECT_EQ(*s->Size(), 4 * kChunk);
  EXPECT_EQ(s->ChunkCount(), 3u);
  auto got = s->Contents();
  auto want = data;
  std::fill(want.begin() + kChunk / 2, want.begin() + kChunk / 2 + 2 * kChunk, 0);
  EXPECT_EQ(got, want);
  EXPECT_EQ(*s->NextHole(0), kChunk);
  EXPECT_EQ(*s->NextData(kChunk), 2 * kChunk);
  EXPECT_EQ(s->bytes_written(), data.size());  // punches don't count
}

TEST(MemoryStorage, PunchPastEndKeepsSizeZeroRangeExtends) {
  auto s = NewMemoryStorage();
  ASSERT_TRUE(s->WriteAt(0, Pattern(100, 9)).ok());
  ASSERT_TRUE(s->PunchHole(50, 1000).ok());
  EXPECT_EQ(*s->Size(), 100u);
  ASSERT_TRUE(s->ZeroRange(80, 1000).ok());
  EXPECT_EQ(*s->Size(), 1080u);
  auto want = Pattern(100, 9);
  want.resize(1080, 0);
  std::fill(want.begin() + 50, want.end(), 0);
  EXPECT_EQ(s->Contents(), want);
  EXPECT_EQ(s->bytes_written(), 1100u);
}

TEST(MemoryStorage, ShrinkThenGrowExposesZerosNotStaleBytes) {
  auto s = NewMemoryStorage();
  ASSERT_TRUE(s->WriteAt(0, Pattern(2 * kChunk, 5)).ok());
  ASSERT_TRUE(s->Resize(100).ok());
  EXPECT_EQ(s->ChunkCount(), 1u);
  ASSERT_TRUE(s->Resize(2 * kChunk).ok());
  auto got = s->Contents();
  auto want = Pattern(100, 5);
  want.resize(2 * kChunk, 0);
  EXPECT_EQ(got, want);
}

TEST(MemoryStorage, AllocateExtendsSizeOnly) {
  auto s = NewMemoryStorage();
  ASSERT_TRUE(s->Allocate(0, 5 * kChunk).ok());
  EXPECT_EQ(*s->Size(), 5 * kChunk);
  EXPECT_EQ(s->ChunkCount(), 0u);
}

TEST(MemoryStorage, NextDataNextHoleAtChunkGrain) {
  auto s = NewMemoryStorage();
  ASSERT_TRUE(s->Resize(10 * kChunk).ok());
  ASSERT_TRUE(s->WriteAt(3 * kChunk + 5, Pattern(kChunk, 0)).ok());  // chunks 3 and 4
  EXPECT_EQ(*s->NextData(0), 3 * kChunk);
  EXPECT_EQ(*s->NextData(3 * kChunk + 17), 3 * kChunk + 17);
  EXPECT_EQ(*s->NextHole(3 * kChunk), 5 * kChunk);
  EXPECT_EQ(*s->NextData(5 * kChunk), 10 * kChunk);
  EXPECT_EQ(*s->NextHole(10 * kChunk), 10 * kChunk);
}

TEST(MemoryStorage, CloneIsIndependent) {
  auto s = NewMemoryStorage();
  ASSERT_TRUE(s->WriteAt(10, Pattern(1000, 2)).ok());
  auto c = s->Clone();
  ASSERT_TRUE(s->WriteAt(10, std::vector<uint8_t>(1000, 0xAB)).ok());
  EXPECT_EQ(Read(*c, 10, 1000), Pattern(1000, 2));
  EXPECT_EQ(*c->Size(), 1010u);
}

TEST(MemoryStorage, RejectsOverflowingRanges) {
  auto s = NewMemoryStorage();
  std::vector<uint8_t> b(10);
  EXPECT_EQ(s->WriteAt(UINT64_MAX - 4, b).code(), Code::kOutOfRange);
  EXPECT_EQ(s->ReadAt(UINT64_MAX - 4, b).code(), Code::kOutOfRange);
  EXPECT_EQ(s->PunchHole(1, UINT64_MAX).code(), Code::kOutOfRange);
}

TEST(MemoryStorage, ConcurrentWritersToDisjointRanges) {
  auto s = NewMemoryStorage();
  constexpr int kThreads = 4;
  constexpr int kBlocks = 64;
  constexpr size_t kBlock = 4096;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int b = 0; b < kBlocks; ++b) {
        auto data = Pattern(kBlock, static_cast<uint8_t>(t * 31 + b));
        EXPECT_TRUE(s->WriteAt((uint64_t(b) * kThreads + t) * kBlock, data).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (int b = 0; b < kBlocks; ++b) {
      EXPECT_EQ(Read(*s, (uint64_t(b) * kThreads + t) * kBlock, kBlock),
                Pattern(kBlock, static_cast<uint8_t>(t * 31 + b)));
    }
  }
  EXPECT_EQ(s->bytes_written(), uint64_t{kThreads} * kBlocks * kBlock);
}

}  // namespace
}  // namespace thindisk::io
