// Allocator: the refcount table and refcount blocks of one image, and the
// allocation of host clusters (and of byte ranges for compressed clusters).
//
// Refcount blocks live in their own TableCache; changes are made in memory
// and written by the owner's ordered flush (docs/engine.md stage 1 via
// WriteBlocks/WriteTable, stage 2 the header when the table moved).
//
// Frees are deferred: DeferFree() queues a decrement that the owner applies
// with ApplyFrees() only after the metadata that stopped pointing at the
// cluster is on disk (stage 5). Until then the cluster keeps its refcount,
// so it cannot be handed out again while a racing reader may still use it.
//
// Reserve: single clusters (data, L2 tables) are handed out from a small
// run allocated ahead (SetReserve): their refcounts are raised in one go and
// reach the disk in one flush, so the flushes that follow map new clusters
// without touching a refcount block. The reserve is taken in exactly the
// order single allocations would be, and only inside existing refcount
// blocks, so the image's layout does not change. Unused reserved clusters
// are given back (ReleaseReserve) before any larger allocation, when a
// cluster below them is freed (a single allocation would reuse it next)
// and on close; a crash leaks them (`check -r leaks` reclaims them).
//
// Growth: a missing refcount block is created at the first cluster of the
// range it covers (which is free, as the block is missing) and counts
// itself. A refcount table too small is copied to a new, larger place; the
// old place is freed deferred after the header points at the new one.
//
// Thread safety: none; the owner serializes all calls (the image's
// metadata mutex).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "io/storage.h"
#include "qcow2/format.h"
#include "qcow2/table_cache.h"
#include "util/result.h"

namespace thindisk::qcow2 {

class Allocator {
 public:
  struct Allocation {
    uint64_t offset = 0;  // host offset of the first cluster
    // True when every byte of the allocation is known to read as zeros
    // (space past everything this image ever used or wrote).
    bool fresh = false;
  };

  // Loads the refcount table named by `h` and validates its entries.
  // `file_size` is the host file size; `cache_tables` the refcount block
  // cache capacity; `flush_hook` runs the owner's ordered flush.
  static Result<std::unique_ptr<Allocator>> Open(io::Storage& storage, const Header& h,
                                                 uint64_t file_size, size_t cache_tables,
                                                 std::function<Status()> flush_hook);

  // Refcount of the host cluster holding `host_offset` (0 beyond the table).
  Result<uint64_t> GetRefcount(uint64_t host_offset);
  // Adds `delta` (may be negative) to the refcount of `n` clusters starting
  // at the cluster holding `host_offset`. kCorrupt on underflow,
  // kNotSupported on overflow of the refcount width.
  Status AddRefcount(uint64_t host_offset, uint64_t n, int64_t delta);

  // `n` contiguous free clusters, refcount set to 1 (a single one from the
  // reserve, when there is one).
  Result<Allocation> AllocateClusters(uint64_t n);
  // Allocate up to `clusters` single clusters ahead (0: none, the default).
  void SetReserve(uint64_t clusters) { reserve_target_ = clusters; }
  // The reserve an image opened for writing keeps: 8 MiB of clusters, 64 at
  // most (a crash leaks at most that much), at least one.
  static uint64_t DefaultReserve(uint64_t cluster_size) {
    return std::clamp<uint64_t>((uint64_t{8} << 20) / cluster_size, 1, 64);
  }
  // Gives every unused reserved cluster back (refcount 0 in memory, written
  // by the next flush; nothing ever pointed at them).
  Status ReleaseReserve();
  uint64_t reserved() const { return reserve_.size(); }
  // `bytes` (<= cluster size) packed right after the previous compressed
  // allocation: inside its host cluster, or running on into the next host
  // cluster when that one is free (it is then allocated). Every host
  // cluster the bytes touch gets one more reference per call (one per
  // compressed cluster, as the qcow2 spec counts them).
  Result<uint64_t> AllocateBytes(uint64_t bytes);

  // Queues a refcount decrement of `n` clusters from `host_offset`.
  void DeferFree(uint64_t host_offset, uint64_t n);
  bool HasDeferredFrees() const { return !deferred_.empty(); }
  struct Range {
    uint64_t offset;
    uint64_t n;
  };
  std::vector<Range> TakeDeferredFrees();
  // Applies decrements; `freed` (optional) receives host offsets of
  // clusters whose refcount reached zero.
  Status ApplyFrees(const std::vector<Range>& frees, std::vector<uint64_t>* freed);
  // The refcount blocks (host offsets) that applying `r` reads and that are
  // not in memory: an owner may load them into block_cache() first,
  // without its lock (TableCache::BeginLoad).
  std::vector<uint64_t> UncachedBlocks(const Range& r) const;
  // The first refcount block (host offset) that the next single cluster's
  // allocation would read in its search for free clusters (a reserve
  // refill's: as many as the reserve takes) and that is not in memory; 0
  // when it reads none. An owner may load it into block_cache() without
  // its lock and ask again. Blocks found full on the way are skipped by
  // later searches (the free hint moves past them); a search that needs
  // more blocks than the cache holds gets 0 past them (it loads the rest).
  uint64_t ColdBlockAhead();
  TableCache& block_cache() { return blocks_; }

  // ---- ordered flush support ----
  bool HasDirtyBlocks() const { return blocks_.HasDirty(); }
  bool HasDirtyTable() const { return table_moved_ || !dirty_entries_.empty(); }
  bool table_moved() const { return table_moved_; }
  // Writes dirty refcount blocks and, if the table moved, the whole new
  // table at its new place (nothing points at it yet). No sync.
  Status WriteBlocks();
  // Writes changed entries of a table that did not move. No sync.
  Status WriteTableEntries();
  // The header now points at the current table.
  void TableCommitted() { table_moved_ = false; }
  uint64_t table_offset() const { return table_offset_; }
  // Host offsets of the refcount blocks (0: none), by table index.
  const std::vector<uint64_t>& block_offsets() const { return table_; }
  uint32_t table_clusters() const { return table_clusters_; }

  // End of the highest cluster in use or allocated (>= the file size at open).
  uint64_t host_end() const { return host_end_; }
  uint64_t cluster_size() const { return cluster_size_; }

 private:
  Allocator(io::Storage& storage, const Header& h, uint64_t file_size, size_t cache_tables,
            std::function<Status()> flush_hook);

  uint64_t ClusterIndex(uint64_t host_offset) const { return host_offset >> cluster_bits_; }
  Result<uint64_t> RefcountOfCluster(uint64_t cluster);
  Status SetRefcountOfCluster(uint64_t cluster, uint64_t value);
  // Ensures refcount block `block_index` exists (creating it, and growing the
  // table, as needed).
  Status EnsureBlock(uint64_t block_index, int depth);
  Status GrowTable(uint64_t min_entries, int depth);
  Result<uint64_t> FindFree(uint64_t n);
  // Allocates host cluster number `cluster` (refcount 1) if it is free.
  Result<bool> TakeIfFree(uint64_t cluster);
  Result<Allocation> AllocateClustersAt(uint64_t n, int depth);
  // AllocateClusters without the reserve.
  Result<Allocation> AllocateUnreserved(uint64_t n);
  Status FillReserve();
  Status ValidateBlockOffset(uint64_t block_index, uint64_t offset) const;

  io::Storage& storage_;
  const uint32_t cluster_bits_;
  const uint64_t cluster_size_;
  const uint32_t refcount_order_;
  const uint64_t entries_per_block_;  // clusters covered by one block
  const uint64_t max_refcount_;

  TableCache blocks_;
  std::vector<uint64_t> table_;  // refcount table entries (block offsets)
  uint64_t table_offset_ = 0;
  uint32_t table_clusters_ = 0;
  bool table_moved_ = false;
  bool growing_ = false;  // GrowTable in progress (nested growth is allowed)
  std::set<uint64_t> dirty_entries_;  // table indices changed in place

  uint64_t free_hint_ = 0;   // no free cluster below this index... usually
  uint64_t fresh_from_ = 0;  // host bytes at/after this offset read as zeros
  uint64_t host_end_ = 0;
  uint64_t compressed_cursor_ = 0;  // next free byte in the compressed area (0 = none)

  std::vector<Range> deferred_;

  uint64_t reserve_target_ = 0;
  std::deque<Allocation> reserve_;  // in the order they are handed out
};

}  // namespace thindisk::qcow2
