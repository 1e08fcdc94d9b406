#include "bench/counting_storage.h"

#include <gtest/gtest.h>

#include <vector>

#include "io/memory_storage.h"

namespace thindisk::bench {
namespace {

TEST(CountingStorageTest, CountsWritesZeroesAndFlushesAndPassesDataThrough) {
  auto counters = std::make_shared<HostCounters>();
  CountingStorage s(io::NewMemoryStorage(), counters);
  std::vector<uint8_t> data(3000, 0xab);
  ASSERT_TRUE(s.WriteAt(100, data).ok());
  ASSERT_TRUE(s.ZeroRange(8192, 4096).ok());
  ASSERT_TRUE(s.Flush().ok());
  ASSERT_TRUE(s.PunchHole(65536, 4096).ok());  // not a write
  EXPECT_EQ(counters->bytes_written.load(), 3000u + 4096u);
  EXPECT_EQ(s.bytes_written(), 3000u + 4096u);
  EXPECT_EQ(counters->flushes.load(), 1u);
  EXPECT_EQ(counters->metadata_bytes.load(), 3000u + 4096u);  // nothing announced

  s.Announce(io::Event::kDataWrite);
  ASSERT_TRUE(s.WriteAt(0, std::span<const uint8_t>(data.data(), 100)).ok());
  s.Announce(io::Event::kCowWrite);
  ASSERT_TRUE(s.WriteAt(0, std::span<const uint8_t>(data.data(), 10)).ok());
  ASSERT_TRUE(s.WriteAt(0, std::span<const uint8_t>(data.data(), 1)).ok());  // announcement used up
  EXPECT_EQ(counters->data_bytes.load(), 100u);
  EXPECT_EQ(counters->fill_bytes.load(), 10u);
  EXPECT_EQ(counters->metadata_bytes.load(), 3000u + 4096u + 1u);

  std::vector<uint8_t> back(100);
  ASSERT_TRUE(s.ReadAt(1000, back).ok());
  EXPECT_EQ(back, std::vector<uint8_t>(100, 0xab));
  auto size = s.Size();
  ASSERT_TRUE(size.has_value());
  EXPECT_EQ(*size, 8192u + 4096u);
}

}  // namespace
}  // namespace thindisk::bench
