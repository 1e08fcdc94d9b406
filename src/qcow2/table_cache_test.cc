#include "qcow2/table_cache.h"

#include <gtest/gtest.h>

#include "io/forwarding_storage.h"
#include "io/memory_storage.h"

namespace thindisk::qcow2 {
namespace {

constexpr uint64_t kTable = 512;

// Remembers the extent of every write after it was made with `len` bytes
// of `fill` at `offset`.
class WriteLog final : public io::ForwardingStorage {
 public:
  WriteLog(uint64_t offset, uint64_t len, uint8_t fill)
      : ForwardingStorage(io::NewMemoryStorage()) {
    EXPECT_TRUE(inner().WriteAt(offset, std::vector<uint8_t>(len, fill)).ok());
  }
  std::vector<uint8_t> Stored(uint64_t offset, uint64_t len) {
    std::vector<uint8_t> back(len);
    EXPECT_TRUE(inner().ReadAt(offset, back).ok());
    return back;
  }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    writes.push_back({offset, buf.size()});
    return inner().WriteAt(offset, buf);
  }
  // A rewrite is logged in both lists.
  Status RewriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    rewrites.push_back({offset, buf.size()});
    return WriteAt(offset, buf);
  }
  void Announce(io::Event e) override { events.push_back(e); }
  std::vector<std::pair<uint64_t, uint64_t>> writes;  // offset, length
  std::vector<std::pair<uint64_t, uint64_t>>
      rewrites;  // those of writes made by RewriteAt
  std::vector<io::Event> events;
};

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

// A table read from storage and changed in a few places writes only the
// sectors that changed, joining those a short gap apart into one write.
TEST(TableCacheTest, WritesOnlyChangedSectors) {
  constexpr uint64_t kBig = 65536;
  WriteLog log(kBig, kBig, 0x11);
  TableCache cache(log, kBig, 4, nullptr);
  auto t = cache.Get(kBig);
  ASSERT_TRUE(t.has_value());
  Table& table = **t;
  auto change = [&](uint64_t at, uint64_t len) {
    for (uint64_t i = at; i < at + len; ++i) table.data[i] = 0x22;
    cache.MarkDirty(table, at, len);
  };
  change(100, 16);        // sector 0
  change(1024 + 510, 4);  // sectors 2 and 3: joined with sector 0 (gap of one)
  change(32768, 8);       // sector 64: far away, a write of its own
  change(kBig - 8, 8);    // the last sector
  ASSERT_TRUE(cache.WriteDirty().ok());
  std::vector<std::pair<uint64_t, uint64_t>> want = {
      {kBig, 4 * 512}, {kBig + 32768, 512}, {kBig + kBig - 512, 512}};
  EXPECT_EQ(log.writes, want);
  EXPECT_FALSE(cache.HasDirty());
  // What reached storage is exactly the table in memory.
  EXPECT_EQ(log.Stored(kBig, kBig), table.data);
  // Written sectors are clean again: the next write-back writes only what
  // changed since.
  log.writes.clear();
  change(40000, 1);
  ASSERT_TRUE(cache.WriteDirty().ok());
  want = {{kBig + 40000 / 512 * 512, 512}};
  EXPECT_EQ(log.writes, want);
}

// Changed sectors of tables already on disk are rewrites (a file sends
// them around its page cache) when the write-back takes at most
// kMaxRewrites writes; a new table's first write never is one, and a
// write-back of many pieces writes them all through the page cache.
TEST(TableCacheTest, FewChangedPiecesOfTablesOnDiskAreRewrites) {
  constexpr uint64_t kBig = 65536;
  static_assert(TableCache::kMaxRewrites == 2, "the cases below count on two");
  WriteLog log(kBig, 2 * kBig, 0x11);
  TableCache cache(log, kBig, 4, nullptr);
  auto t = cache.Get(kBig);
  ASSERT_TRUE(t.has_value());
  auto change = [&](uint64_t at) {
    (*t)->data[at] ^= 0xff;
    cache.MarkDirty(**t, at, 1);
  };
  using Extents = std::vector<std::pair<uint64_t, uint64_t>>;
  auto write_back = [&](const Extents& writes, const Extents& rewrites) {
    log.writes.clear();
    log.rewrites.clear();
    ASSERT_TRUE(cache.WriteDirty().ok());
    EXPECT_EQ(log.writes, writes);
    EXPECT_EQ(log.rewrites, rewrites);
    EXPECT_EQ(log.Stored(kBig, kBig), (*t)->data);
  };
  change(1000);
  write_back({{kBig + 512, 512}}, {{kBig + 512, 512}});
  change(1000);
  change(40000);
  write_back({{kBig + 512, 512}, {kBig + 39936, 512}},
             {{kBig + 512, 512}, {kBig + 39936, 512}});
  change(1000);
  change(40000);
  change(60000);
  write_back({{kBig + 512, 512}, {kBig + 39936, 512}, {kBig + 59904, 512}}, {});
  // A new table beside one changed sector: two writes, the new one a write.
  auto fresh = cache.New(2 * kBig);
  ASSERT_TRUE(fresh.has_value());
  change(1000);
  write_back({{kBig + 512, 512}, {2 * kBig, kBig}}, {{kBig + 512, 512}});
  EXPECT_EQ(log.Stored(2 * kBig, kBig), std::vector<uint8_t>(kBig, 0));
}

// A table made by New() may sit on a cluster holding old bytes: its first
// write covers all of it, later ones only what changed.
TEST(TableCacheTest, NewTableIsWrittenWholeOnce) {
  constexpr uint64_t kBig = 8192;
  WriteLog log(kBig, kBig, 0xee);
  TableCache cache(log, kBig, 4, nullptr);
  auto t = cache.New(kBig);
  ASSERT_TRUE(t.has_value());
  (*t)->data[5] = 1;
  cache.MarkDirty(**t, 5, 1);
  ASSERT_TRUE(cache.WriteDirty().ok());
  std::vector<std::pair<uint64_t, uint64_t>> want = {{kBig, kBig}};
  EXPECT_EQ(log.writes, want);
  EXPECT_EQ(log.Stored(kBig, kBig), (*t)->data);
  log.writes.clear();
  (*t)->data[5000] = 2;
  cache.MarkDirty(**t, 5000, 1);
  ASSERT_TRUE(cache.WriteDirty().ok());
  want = {{kBig + 4608, 512}};
  EXPECT_EQ(log.writes, want);
}

// Tables that are slices of a cluster: a new cluster's slices, all
// changed, reach storage in one write (announced once, as a new table);
// changed pieces of neighbouring slices that meet are joined too, and
// pieces that do not meet are not.
TEST(TableCacheTest, PiecesOfNeighbouringSlicesThatMeetAreOneWrite) {
  constexpr uint64_t kCluster = 4 * kTable;
  WriteLog log(0, 4 * kCluster, 0xee);
  TableCache cache(log, kTable, 64, nullptr, io::Event::kL2Alloc, io::Event::kL2Update,
                   kCluster);
  for (uint64_t at = kCluster; at < 2 * kCluster; at += kTable) {
    ASSERT_TRUE(cache.New(at).has_value());
  }
  ASSERT_TRUE(cache.WriteDirty().ok());
  std::vector<std::pair<uint64_t, uint64_t>> want = {{kCluster, kCluster}};
  EXPECT_EQ(log.writes, want);
  EXPECT_EQ(log.events, std::vector<io::Event>{io::Event::kL2Alloc});
  EXPECT_EQ(log.Stored(kCluster, kCluster), std::vector<uint8_t>(kCluster, 0));

  log.writes.clear();
  log.events.clear();
  auto change = [&](uint64_t at) {
    auto t = cache.Get(at / kTable * kTable);
    ASSERT_TRUE(t.has_value());
    (*t)->data[at % kTable] = 0x33;
    cache.MarkDirty(**t, at % kTable, 1);
  };
  change(2 * kCluster + kTable - 1);  // the last sector of slice 0 ...
  change(2 * kCluster + kTable);      // ... meets the first of slice 1
  change(2 * kCluster + 3 * kTable);  // slice 3: a gap before it
  ASSERT_TRUE(cache.WriteDirty().ok());
  want = {{2 * kCluster, 2 * kTable}, {2 * kCluster + 3 * kTable, kTable}};
  EXPECT_EQ(log.writes, want);
  EXPECT_EQ(log.events, std::vector<io::Event>(2, io::Event::kL2Update));
  EXPECT_EQ(log.Stored(2 * kCluster + kTable - 1, 2), std::vector<uint8_t>(2, 0x33));
}

// DropCluster forgets every slice of the cluster, changed or not, and a
// load of one of them in progress; the slices of other clusters stay.
TEST(TableCacheTest, DropClusterForgetsEverySliceOfIt) {
  constexpr uint64_t kCluster = 4 * kTable;
  auto storage = io::NewMemoryStorage();
  TableCache cache(*storage, kTable, 64, nullptr, io::Event::kL2Alloc,
                   io::Event::kL2Update, kCluster);
  ASSERT_TRUE(cache.Get(kCluster).has_value());
  ASSERT_TRUE(cache.New(kCluster + 2 * kTable).has_value());
  ASSERT_TRUE(cache.Get(2 * kCluster + kTable).has_value());
  ASSERT_TRUE(cache.BeginLoad(kCluster + 3 * kTable));
  cache.DropCluster(kCluster);
  EXPECT_FALSE(cache.Cached(kCluster));
  EXPECT_FALSE(cache.Cached(kCluster + 2 * kTable));
  EXPECT_FALSE(cache.HasDirty());
  EXPECT_TRUE(cache.Cached(2 * kCluster + kTable));
  EXPECT_EQ(cache.size(), 1u);
  // The load that began before the drop must not cache what it read.
  ASSERT_TRUE(
      cache.FinishLoad(kCluster + 3 * kTable, std::vector<uint8_t>(kTable), true).ok());
  EXPECT_FALSE(cache.Cached(kCluster + 3 * kTable));
  // A cluster with nothing cached: nothing happens.
  cache.DropCluster(3 * kCluster);
  EXPECT_EQ(cache.size(), 1u);
  ASSERT_TRUE(cache.WriteDirty().ok());
  EXPECT_EQ(storage->bytes_written(), 0u);
}

}  // namespace
}  // namespace thindisk::qcow2
