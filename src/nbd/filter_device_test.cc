#include "nbd/filter_device.h"

#include <gtest/gtest.h>

#include <vector>

#include "nbd/testing/memory_device.h"

namespace thindisk::nbd {
namespace {

using testing::MemoryDevice;
using DZ = FilterOptions::DetectZeroes;
using DI = FilterOptions::Discard;

constexpr uint64_t kSize = 1 << 20;

std::shared_ptr<MemoryDevice> Filled() {
  auto dev = std::make_shared<MemoryDevice>(kSize);
  std::vector<uint8_t> ones(kSize, 0xab);
  EXPECT_TRUE(dev->Write(0, ones, {}).ok());
  return dev;
}

TEST(FilterDeviceTest, DiscardIgnoreKeepsDataAndAllocation) {
  auto mem = Filled();
  FilterDevice f(mem, {DI::kIgnore, DZ::kOff});
  ASSERT_TRUE(f.Discard(0, 65536).ok());
  std::vector<uint8_t> buf(65536);
  ASSERT_TRUE(f.Read(0, buf).ok());
  EXPECT_EQ(buf, std::vector<uint8_t>(65536, 0xab));
  auto e = f.GetStatus(0, kSize);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->data);
  EXPECT_EQ(f.Discard(kSize - 4096, 8192).code(), Code::kOutOfRange);
}

TEST(FilterDeviceTest, DiscardUnmapPassesThrough) {
  auto mem = Filled();
  FilterDevice f(mem, {DI::kUnmap, DZ::kOff});
  ASSERT_TRUE(f.Discard(0, 65536).ok());
  auto e = f.GetStatus(0, kSize);
  ASSERT_TRUE(e.has_value());
  EXPECT_FALSE(e->data);
  EXPECT_EQ(e->length, 65536u);
}

TEST(FilterDeviceTest, DiscardIgnoreNeverUnmapsOnWriteZeroes) {
  auto mem = Filled();
  FilterDevice f(mem, {DI::kIgnore, DZ::kOff});
  block::ZeroFlags zf;
  zf.may_unmap = true;
  ASSERT_TRUE(f.WriteZeroes(0, 65536, zf).ok());
  auto e = f.GetStatus(0, kSize);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->data);  // zeroed in place, still allocated
  std::vector<uint8_t> buf(65536, 1);
  ASSERT_TRUE(f.Read(0, buf).ok());
  EXPECT_EQ(buf, std::vector<uint8_t>(65536, 0));
}

TEST(FilterDeviceTest, DetectZeroesUnmapTurnsZeroWriteIntoHole) {
  auto mem = Filled();
  FilterDevice f(mem, {DI::kUnmap, DZ::kUnmap});
  std::vector<uint8_t> zeros(65536, 0);
  ASSERT_TRUE(f.Write(0, zeros, {}).ok());
  auto e = f.GetStatus(0, kSize);
  ASSERT_TRUE(e.has_value());
  EXPECT_FALSE(e->data);
  EXPECT_EQ(e->length, 65536u);
  // A write with one non-zero byte is stored as given.
  zeros[100] = 7;
  ASSERT_TRUE(f.Write(0, zeros, {}).ok());
  std::vector<uint8_t> buf(65536);
  ASSERT_TRUE(f.Read(0, buf).ok());
  EXPECT_EQ(buf, zeros);
}

TEST(FilterDeviceTest, DetectZeroesOnZeroesWithoutUnmap) {
  auto mem = Filled();
  FilterDevice f(mem, {DI::kUnmap, DZ::kOn});
  std::vector<uint8_t> zeros(65536, 0);
  ASSERT_TRUE(f.Write(0, zeros, {}).ok());
  auto e = f.GetStatus(0, kSize);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->data);  // MemoryDevice allocates WriteZeroes without may_unmap
  std::vector<uint8_t> buf(65536, 1);
  ASSERT_TRUE(f.Read(0, buf).ok());
  EXPECT_EQ(buf, zeros);
}

TEST(FilterDeviceTest, DetectZeroesOffWritesZerosAsData) {
  auto mem = std::make_shared<MemoryDevice>(kSize);
  FilterDevice f(mem, {DI::kUnmap, DZ::kOff});
  std::vector<uint8_t> zeros(4096, 0);
  ASSERT_TRUE(f.Write(0, zeros, {}).ok());
  auto e = f.GetStatus(0, kSize);
  ASSERT_TRUE(e.has_value());
  EXPECT_TRUE(e->data);
}

}  // namespace
}  // namespace thindisk::nbd
