#include "qcow2/allocator.h"

#include <set>

#include <gtest/gtest.h>

#include "io/memory_storage.h"
#include "qcow2/image.h"

namespace thindisk::qcow2 {
namespace {

struct Fixture {
  std::unique_ptr<io::MemoryStorage> storage;
  Header header;
  std::unique_ptr<Allocator> alloc;
};

Fixture Make(uint32_t cluster, uint32_t refcount_bits, size_t cache_tables = 16) {
  Fixture f;
  f.storage = io::NewMemoryStorage();
  CreateOptions o;
  o.size = 64 << 20;
  o.cluster_size = cluster;
  o.extended_l2 = false;
  o.refcount_bits = refcount_bits;
  EXPECT_TRUE(Create(*f.storage, o).ok());
  uint64_t size = *f.storage->Size();
  std::vector<uint8_t> head(std::min<uint64_t>(size, 2 << 20));
  EXPECT_TRUE(f.storage->ReadAt(0, head).ok());
  auto h = DecodeHeader(head, size);
  EXPECT_TRUE(h.has_value());
  f.header = *h;
  auto a = Allocator::Open(*f.storage, f.header, size, cache_tables, nullptr);
  EXPECT_TRUE(a.has_value()) << a.status().ToString();
  f.alloc = std::move(*a);
  return f;
}

TEST(AllocatorTest, FirstAllocationIsFreshSpacePastTheFile) {
  auto f = Make(65536, 16);
  uint64_t file_size = *f.storage->Size();
  auto a = f.alloc->AllocateClusters(2);
  ASSERT_TRUE(a.has_value());
  EXPECT_GE(a->offset, file_size);
  EXPECT_TRUE(a->fresh);
  EXPECT_EQ(*f.alloc->GetRefcount(a->offset), 1u);
  EXPECT_EQ(*f.alloc->GetRefcount(a->offset + 65536), 1u);
  EXPECT_EQ(*f.alloc->GetRefcount(0), 1u);  // the header cluster is in use
}

TEST(AllocatorTest, DeferredFreeIsNotReusedUntilApplied) {
  auto f = Make(65536, 16);
  auto a = f.alloc->AllocateClusters(1);
  ASSERT_TRUE(a.has_value());
  f.alloc->DeferFree(a->offset, 1);
  auto b = f.alloc->AllocateClusters(1);
  ASSERT_TRUE(b.has_value());
  EXPECT_NE(b->offset, a->offset);
  EXPECT_EQ(*f.alloc->GetRefcount(a->offset), 1u);
  std::vector<uint64_t> freed;
  ASSERT_TRUE(f.alloc->ApplyFrees(f.alloc->TakeDeferredFrees(), &freed).ok());
  EXPECT_EQ(freed, std::vector<uint64_t>{a->offset});
  auto c = f.alloc->AllocateClusters(1);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->offset, a->offset);
  EXPECT_FALSE(c->fresh);  // reused: may hold old bytes
}

TEST(AllocatorTest, GrowsBlocksAndTableWithoutDoubleAllocation) {
  // 512-byte clusters, 64-bit refcounts: a block covers 64 clusters and a
  // one-cluster table 64 blocks, so 6000 clusters need both to grow.
  auto f = Make(512, 64, 4);
  uint64_t table_before = f.alloc->table_offset();
  std::set<uint64_t> seen;
  for (int i = 0; i < 6000; ++i) {
    auto a = f.alloc->AllocateClusters(1 + i % 3);
    ASSERT_TRUE(a.has_value()) << a.status().ToString();
    for (int k = 0; k < 1 + i % 3; ++k) {
      EXPECT_TRUE(seen.insert(a->offset + k * 512).second) << "allocated twice";
    }
  }
  EXPECT_TRUE(f.alloc->table_moved());
  EXPECT_NE(f.alloc->table_offset(), table_before);
  for (uint64_t off : seen) ASSERT_EQ(*f.alloc->GetRefcount(off), 1u);
  // The new table and blocks never overlap allocated clusters.
  uint64_t t = f.alloc->table_offset();
  for (uint64_t k = 0; k < f.alloc->table_clusters(); ++k) {
    EXPECT_EQ(seen.count(t + k * 512), 0u);
    EXPECT_EQ(*f.alloc->GetRefcount(t + k * 512), 1u);
  }
  ASSERT_TRUE(f.alloc->WriteBlocks().ok());
}

TEST(AllocatorTest, CompressedBytesShareAClusterWithOneReferenceEach) {
  auto f = Make(65536, 16);
  auto a = f.alloc->AllocateBytes(1000);
  auto b = f.alloc->AllocateBytes(2000);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(*b, *a + 1000);
  EXPECT_EQ(*f.alloc->GetRefcount(*a), 2u);
}

// The qcow2 spec lets compressed data continue into the next contiguous
// host cluster; every cluster it touches counts one reference for it.
TEST(AllocatorTest, CompressedBytesRunOnIntoTheNextFreeCluster) {
  auto f = Make(65536, 16);
  auto a = f.alloc->AllocateBytes(60000);
  auto b = f.alloc->AllocateBytes(10000);  // 5536 bytes left: runs on
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(*b, *a + 60000);
  const uint64_t first = *a & ~uint64_t{65535};
  EXPECT_EQ(*f.alloc->GetRefcount(first), 2u);
  EXPECT_EQ(*f.alloc->GetRefcount(first + 65536), 1u);
  auto c = f.alloc->AllocateBytes(100);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, *b + 10000);
  EXPECT_EQ(*f.alloc->GetRefcount(first + 65536), 2u);
}

TEST(AllocatorTest, PlainClustersLeaveTheRunOnClusterFree) {
  auto f = Make(65536, 16);
  auto a = f.alloc->AllocateBytes(60000);
  ASSERT_TRUE(a.has_value());
  const uint64_t next = (*a & ~uint64_t{65535}) + 65536;
  auto plain = f.alloc->AllocateClusters(1);
  ASSERT_TRUE(plain.has_value());
  EXPECT_NE(plain->offset, next);
  auto b = f.alloc->AllocateBytes(10000);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, *a + 60000);
}

TEST(AllocatorTest, CompressedBytesStartAFreshClusterWhenTheNextIsTaken) {
  auto f = Make(65536, 16);
  auto a = f.alloc->AllocateBytes(60000);
  ASSERT_TRUE(a.has_value());
  const uint64_t next = (*a & ~uint64_t{65535}) + 65536;
  ASSERT_TRUE(f.alloc->AddRefcount(next, 1, +1).ok());  // someone else's
  auto b = f.alloc->AllocateBytes(10000);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b % 65536, 0u);
  EXPECT_NE(*b, next);
  EXPECT_EQ(*f.alloc->GetRefcount(next), 1u);
}

TEST(AllocatorTest, OneBitRefcountsNeverOverflowWhenPacking) {
  auto f = Make(65536, 1);
  auto a = f.alloc->AllocateBytes(1000);
  auto b = f.alloc->AllocateBytes(1000);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_NE(*a / 65536, *b / 65536);
  EXPECT_EQ(*f.alloc->GetRefcount(*a), 1u);
}

TEST(AllocatorTest, UnderflowIsCorruption) {
  auto f = Make(65536, 16);
  auto a = f.alloc->AllocateClusters(1);
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(f.alloc->AddRefcount(a->offset, 1, -1).ok());
  EXPECT_EQ(f.alloc->AddRefcount(a->offset, 1, -1).code(), Code::kCorrupt);
}

TEST(AllocatorTest, RejectsRefcountBlockPastEndOfFile) {
  auto storage = io::NewMemoryStorage();
  CreateOptions o;
  o.size = 1 << 20;
  ASSERT_TRUE(Create(*storage, o).ok());
  uint64_t size = *storage->Size();
  std::vector<uint8_t> head(size);
  ASSERT_TRUE(storage->ReadAt(0, head).ok());
  auto h = DecodeHeader(head, size);
  ASSERT_TRUE(h.has_value());
  // Point refcount table entry 1 far past the end of the file.
  uint8_t bad[8] = {0, 0, 0, 1, 0, 0, 0, 0};
  ASSERT_TRUE(storage->WriteAt(h->refcount_table_offset + 8, bad).ok());
  auto a = Allocator::Open(*storage, *h, size, 4, nullptr);
  ASSERT_FALSE(a.has_value());
  EXPECT_EQ(a.error().code(), Code::kCorrupt);
}


// The reserve hands out exactly the clusters single allocations would, in
// the same order, and after one flush of its refcounts the next ones need
// no refcount write at all.
TEST(AllocatorTest, ReserveKeepsTheOrderAndSparesRefcountWrites) {
  auto plain = Make(65536, 16);
  auto reserved = Make(65536, 16);
  reserved.alloc->SetReserve(8);
  std::vector<uint64_t> want, got;
  for (int i = 0; i < 20; ++i) {
    auto a = plain.alloc->AllocateClusters(1);
    auto b = reserved.alloc->AllocateClusters(1);
    ASSERT_TRUE(a.has_value() && b.has_value());
    EXPECT_EQ(a->fresh, b->fresh);
    want.push_back(a->offset);
    got.push_back(b->offset);
    if (i == 0) {
      // The first one creates no block itself, so the reserve fills now.
      EXPECT_GT(reserved.alloc->reserved(), 0u);
      ASSERT_TRUE(reserved.alloc->WriteBlocks().ok());
      EXPECT_FALSE(reserved.alloc->HasDirtyBlocks());
    } else if (i < 8) {
      EXPECT_FALSE(reserved.alloc->HasDirtyBlocks()) << "allocation " << i;
    }
  }
  EXPECT_EQ(got, want);
}

// Giving the reserve back restores everything: refcounts, the zero-reading
// tail, and where the next (larger) allocation goes.
TEST(AllocatorTest, ReleasedReserveIsFreeAndFreshAgain) {
  auto f = Make(65536, 16);
  f.alloc->SetReserve(8);
  const uint64_t end0 = f.alloc->host_end();
  auto a = f.alloc->AllocateClusters(1);
  ASSERT_TRUE(a.has_value());
  ASSERT_EQ(f.alloc->reserved(), 7u);
  EXPECT_EQ(f.alloc->host_end(), a->offset + 8 * 65536);
  ASSERT_TRUE(f.alloc->ReleaseReserve().ok());
  EXPECT_EQ(f.alloc->reserved(), 0u);
  EXPECT_EQ(f.alloc->host_end(), std::max(end0, a->offset + 65536));
  for (uint64_t i = 1; i < 8; ++i) EXPECT_EQ(*f.alloc->GetRefcount(a->offset + i * 65536), 0u);
  auto b = f.alloc->AllocateClusters(3);  // past nothing: right after `a`
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->offset, a->offset + 65536);
  EXPECT_TRUE(b->fresh);
}

// A larger allocation gives the reserve back first, so it lands where it
// would have without one; so does a cluster freed below the reserve.
TEST(AllocatorTest, ReserveYieldsToRunsAndToFreedClusters) {
  auto f = Make(65536, 16);
  f.alloc->SetReserve(8);
  auto a = f.alloc->AllocateClusters(1);
  auto b = f.alloc->AllocateClusters(1);
  ASSERT_TRUE(a.has_value() && b.has_value());
  auto run = f.alloc->AllocateClusters(2);
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->offset, b->offset + 65536);
  EXPECT_EQ(f.alloc->reserved(), 0u);
  auto c = f.alloc->AllocateClusters(1);  // fills the reserve again
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->offset, run->offset + 2 * 65536);
  ASSERT_GT(f.alloc->reserved(), 0u);
  ASSERT_TRUE(f.alloc->ApplyFrees({{a->offset, 1}}, nullptr).ok());
  EXPECT_EQ(f.alloc->reserved(), 0u);
  auto d = f.alloc->AllocateClusters(1);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->offset, a->offset);
}

// ColdBlockAhead names, one at a time, the blocks a reserve refill's search
// reads and the cache lacks, in the search's order; blocks found full are
// not named again; the search then finds the same clusters it would have.
TEST(AllocatorTest, ColdBlockAheadNamesTheBlocksTheSearchReads) {
  // 512-byte clusters: a block counts 256 of them. Six blocks' worth in
  // use, one cluster of the fourth free, all on disk.
  auto f = Make(512, 16);
  for (int i = 0; i < 6 * 256; ++i) ASSERT_TRUE(f.alloc->AllocateClusters(1).has_value());
  const uint64_t hole = 3 * 256 * 512 + 100 * 512;
  ASSERT_TRUE(f.alloc->ApplyFrees({{hole, 1}}, nullptr).ok());
  ASSERT_TRUE(f.alloc->WriteBlocks().ok());
  ASSERT_TRUE(f.alloc->WriteTableEntries().ok());
  ASSERT_FALSE(f.alloc->table_moved());
  const std::vector<uint64_t> blocks = f.alloc->block_offsets();
  ASSERT_GE(blocks.size(), 7u);
  for (size_t i = 0; i < 7; ++i) ASSERT_NE(blocks[i], 0u) << "block " << i;

  // Opened again, with room for two blocks: none is in memory.
  auto cold = Allocator::Open(*f.storage, f.header, *f.storage->Size(), 2, nullptr);
  ASSERT_TRUE(cold.has_value());
  Allocator& a = **cold;
  a.SetReserve(8);
  // What the look ahead names until it names nothing (20 at most), each
  // loaded as an owner would.
  auto name_all = [](Allocator& alloc) {
    std::vector<uint64_t> named;
    for (uint64_t b; named.size() < 20 && (b = alloc.ColdBlockAhead()) != 0;) {
      named.push_back(b);
      EXPECT_TRUE(alloc.block_cache().Get(b).has_value());
    }
    return named;
  };
  std::vector<uint64_t> named = name_all(a);
  // Blocks 0-2 are full (skipped from then on, though the cache dropped
  // them), block 3 has one free cluster, and the search goes on for seven
  // more, through block 4 (full): block 5 would drop block 3 from the
  // cache, so the search loads it and 6 itself.
  EXPECT_EQ(named, (std::vector<uint64_t>{blocks[0], blocks[1], blocks[2], blocks[3],
                                          blocks[4]}));
  auto first = a.AllocateClusters(1);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->offset, hole)
      << "the freed cluster comes first, as without the look ahead";
  EXPECT_EQ(a.ColdBlockAhead(), 0u) << "the reserve holds the next clusters";

  // With room for sixteen blocks the look ahead reaches block 6, and the
  // search then reads nothing more.
  auto roomy = Allocator::Open(*f.storage, f.header, *f.storage->Size(), 16, nullptr);
  ASSERT_TRUE(roomy.has_value());
  Allocator& r = **roomy;
  r.SetReserve(8);
  EXPECT_EQ(name_all(r),
            (std::vector<uint64_t>{blocks[0], blocks[1], blocks[2], blocks[3], blocks[4],
                                   blocks[5], blocks[6]}));
  const size_t cached = r.block_cache().size();
  auto again = r.AllocateClusters(1);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->offset, hole);
  EXPECT_EQ(r.block_cache().size(), cached)
      << "the search read a block the look ahead missed";
}

}  // namespace
}  // namespace thindisk::qcow2
