#include "qcow2/table_cache.h"

#include <gtest/gtest.h>

#include "io/memory_storage.h"

namespace thindisk::qcow2 {
namespace {

constexpr uint64_t kTable = 512;

TEST(TableCacheTest, LoadsFromStorageOnMiss) {
  auto storage = io::NewMemoryStorage();
  std::vector<uint8_t> bytes(kTable, 0x5a);
  ASSERT_TRUE(storage->WriteAt(kTable * 3, bytes).ok());
  TableCache cache(*storage, kTable, 4, nullptr);
  auto t = cache.Get(kTable * 3);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ((*t)->data, bytes);
  EXPECT_FALSE((*t)->dirty);
}

TEST(TableCacheTest, DirtyTablesReachStorageOnlyOnWriteDirty) {
  auto storage = io::NewMemoryStorage();
  TableCache cache(*storage, kTable, 4, nullptr);
  auto t = cache.New(kTable);
  ASSERT_TRUE(t.has_value());
  (*t)->data[7] = 0x42;
  cache.MarkDirty(**t);
  EXPECT_TRUE(cache.HasDirty());
  EXPECT_EQ(storage->bytes_written(), 0u);
  ASSERT_TRUE(cache.WriteDirty().ok());
  EXPECT_FALSE(cache.HasDirty());
  uint8_t b = 0;
  ASSERT_TRUE(storage->ReadAt(kTable + 7, {&b, 1}).ok());
  EXPECT_EQ(b, 0x42);
}

TEST(TableCacheTest, EvictingDirtyTableRunsFlushHookFirst) {
  auto storage = io::NewMemoryStorage();
  int flushes = 0;
  TableCache* cache_ptr = nullptr;
  TableCache cache(*storage, kTable, 2, [&] {
    ++flushes;
    return cache_ptr->WriteDirty();
  });
  cache_ptr = &cache;
  for (uint64_t i = 1; i <= 2; ++i) {
    auto t = cache.New(i * kTable);
    ASSERT_TRUE(t.has_value());
    (*t)->data[0] = uint8_t(i);
  }
  EXPECT_EQ(flushes, 0);
  auto third = cache.Get(3 * kTable);  // must evict one of two dirty tables
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(flushes, 1);
  EXPECT_LE(cache.size(), 2u);
  // The evicted table's content survived through storage.
  for (uint64_t i = 1; i <= 2; ++i) {
    auto t = cache.Get(i * kTable);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ((*t)->data[0], uint8_t(i));
  }
}

TEST(TableCacheTest, PinnedTablesAreNotEvicted) {
  auto storage = io::NewMemoryStorage();
  TableCache cache(*storage, kTable, 2, nullptr);
  auto a = cache.Get(kTable);
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(cache.Get(2 * kTable).has_value());  // not held: evictable
  (*a)->data[0] = 9;  // pinned and changed in memory
  auto c = cache.Get(3 * kTable);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(cache.size(), 2u);
  auto again = cache.Get(kTable);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->get(), a->get());
  EXPECT_EQ((*again)->data[0], 9);
}

TEST(TableCacheTest, DropForgetsDirtyTable) {
  auto storage = io::NewMemoryStorage();
  TableCache cache(*storage, kTable, 4, nullptr);
  ASSERT_TRUE(cache.New(kTable).has_value());
  EXPECT_TRUE(cache.HasDirty());
  cache.Drop(kTable);
  EXPECT_FALSE(cache.HasDirty());
  ASSERT_TRUE(cache.WriteDirty().ok());
  EXPECT_EQ(storage->bytes_written(), 0u);
}

}  // namespace
}  // namespace thindisk::qcow2
