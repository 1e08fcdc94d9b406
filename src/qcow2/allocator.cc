#include "qcow2/allocator.h"

#include <algorithm>
#include <string>

#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

std::string Hex(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Guards against a table-growth loop on hostile or absurd geometry.
constexpr int kMaxGrowthDepth = 8;

}  // namespace

Allocator::Allocator(io::Storage& storage, const Header& h, uint64_t file_size,
                     size_t cache_tables, std::function<Status()> flush_hook)
    : storage_(storage),
      cluster_bits_(h.cluster_bits),
      cluster_size_(h.cluster_size()),
      refcount_order_(h.refcount_order),
      entries_per_block_(h.cluster_size() * 8 / h.refcount_bits()),
      max_refcount_(MaxRefcount(h.refcount_order)),
      // While the table grows its in-memory state is half-built: an eviction
      // then lets the cache overshoot instead of flushing it.
      blocks_(storage, h.cluster_size(), cache_tables,
              [this, hook = std::move(flush_hook)]() {
                return growing_ || !hook ? Status::Ok() : hook();
              },
              io::Event::kRefblockAlloc, io::Event::kRefblockUpdate) {
  uint64_t rounded = (file_size + cluster_size_ - 1) & ~(cluster_size_ - 1);
  fresh_from_ = rounded;
  host_end_ = rounded;
}

Result<std::unique_ptr<Allocator>> Allocator::Open(io::Storage& storage, const Header& h,
                                                   uint64_t file_size, size_t cache_tables,
                                                   std::function<Status()> flush_hook) {
  std::unique_ptr<Allocator> a(
      new Allocator(storage, h, file_size, cache_tables, std::move(flush_hook)));
  a->table_offset_ = h.refcount_table_offset;
  a->table_clusters_ = h.refcount_table_clusters;
  uint64_t bytes = uint64_t(h.refcount_table_clusters) * a->cluster_size_;
  if (bytes > kMaxRefcountTableBytes) {
    return Status::Corrupt("refcount table of " + std::to_string(bytes) + " bytes exceeds limit");
  }
  std::vector<uint8_t> raw(bytes);
  TD_RETURN_IF_ERROR(storage.ReadAt(h.refcount_table_offset, raw));
  a->table_.resize(bytes / 8);
  for (uint64_t i = 0; i < a->table_.size(); ++i) {
    uint64_t e = LoadBe64(&raw[i * 8]);
    if (e & 0x1ff) {
      return Status::Corrupt("refcount table entry " + std::to_string(i) + " (" + Hex(e) +
                             ") has reserved bits set");
    }
    TD_RETURN_IF_ERROR(a->ValidateBlockOffset(i, e));
    a->table_[i] = e;
  }
  return a;
}

Status Allocator::ValidateBlockOffset(uint64_t block_index, uint64_t offset) const {
  if (offset == 0) return Status::Ok();
  if (offset & (cluster_size_ - 1)) {
    return Status::Corrupt("refcount block " + std::to_string(block_index) + " at " + Hex(offset) +
                           " is not cluster aligned");
  }
  if (offset + cluster_size_ > host_end_) {
    return Status::Corrupt("refcount block " + std::to_string(block_index) + " at " + Hex(offset) +
                           " lies past the end of the file");
  }
  return Status::Ok();
}

Result<uint64_t> Allocator::RefcountOfCluster(uint64_t cluster) {
  uint64_t bi = cluster / entries_per_block_;
  if (bi >= table_.size() || table_[bi] == 0) return uint64_t{0};
  TD_ASSIGN_OR_RETURN(auto block, blocks_.Get(table_[bi]));
  return qcow2::GetRefcount(block->data, refcount_order_, cluster % entries_per_block_);
}

Status Allocator::SetRefcountOfCluster(uint64_t cluster, uint64_t value) {
  uint64_t bi = cluster / entries_per_block_;
  TD_RETURN_IF_ERROR(EnsureBlock(bi, 0));
  TD_ASSIGN_OR_RETURN(auto block, blocks_.Get(table_[bi]));
  const uint64_t index = cluster % entries_per_block_;
  qcow2::SetRefcount(block->data, refcount_order_, index, value);
  const uint64_t bits = uint64_t{1} << refcount_order_;
  blocks_.MarkDirty(*block, index * bits / 8, (bits + 7) / 8);
  return Status::Ok();
}

Result<uint64_t> Allocator::GetRefcount(uint64_t host_offset) {
  return RefcountOfCluster(ClusterIndex(host_offset));
}

Status Allocator::AddRefcount(uint64_t host_offset, uint64_t n, int64_t delta) {
  uint64_t first = ClusterIndex(host_offset);
  for (uint64_t c = first; c < first + n; ++c) {
    TD_ASSIGN_OR_RETURN(uint64_t rc, RefcountOfCluster(c));
    if (delta < 0 && rc < uint64_t(-delta)) {
      return Status::Corrupt("refcount of host cluster " + Hex(c << cluster_bits_) +
                             " would drop below zero");
    }
    if (delta > 0 && max_refcount_ - rc < uint64_t(delta)) {
      return Status::NotSupported("refcount of host cluster " + Hex(c << cluster_bits_) +
                                  " would overflow " + std::to_string(1u << refcount_order_) +
                                  " bits");
    }
    uint64_t value = uint64_t(int64_t(rc) + delta);
    TD_RETURN_IF_ERROR(SetRefcountOfCluster(c, value));
    if (value == 0) {
      free_hint_ = std::min(free_hint_, c);
      // A single allocation would take this cluster next: so must the
      // first one after the reserve is given back.
      if (!reserve_.empty() && c < ClusterIndex(reserve_.front().offset)) {
        TD_RETURN_IF_ERROR(ReleaseReserve());
      }
    }
  }
  return Status::Ok();
}

Status Allocator::EnsureBlock(uint64_t block_index, int depth) {
  if (block_index >= table_.size()) TD_RETURN_IF_ERROR(GrowTable(block_index + 1, depth));
  if (table_[block_index] != 0) return Status::Ok();
  // All clusters this block covers are free (it does not exist), so the
  // block takes the first of them and counts itself.
  uint64_t offset = (block_index * entries_per_block_) << cluster_bits_;
  if (offset == 0) return Status::Corrupt("refcount table has no block for the header cluster");
  TD_ASSIGN_OR_RETURN(auto block, blocks_.New(offset));
  qcow2::SetRefcount(block->data, refcount_order_, 0, 1);
  table_[block_index] = offset;
  if (!table_moved_) dirty_entries_.insert(block_index);
  host_end_ = std::max(host_end_, offset + cluster_size_);
  fresh_from_ = std::max(fresh_from_, offset + cluster_size_);
  return Status::Ok();
}

Status Allocator::GrowTable(uint64_t min_entries, int depth) {
  if (depth > kMaxGrowthDepth) return Status::Internal("refcount table growth does not converge");
  uint64_t per_cluster = cluster_size_ / 8;
  uint64_t want = std::max<uint64_t>(min_entries + 1, table_.size() * 2);
  want = (want + per_cluster - 1) / per_cluster * per_cluster;
  if (want * 8 > kMaxRefcountTableBytes) {
    return Status(Code::kNoSpace, "refcount table would exceed " +
                                      std::to_string(kMaxRefcountTableBytes) + " bytes");
  }
  struct Restore {
    bool* flag;
    bool previous;
    ~Restore() { *flag = previous; }
  } restore{&growing_, growing_};
  growing_ = true;
  uint64_t old_offset = table_offset_;
  uint64_t old_clusters = table_clusters_;
  table_.resize(want, 0);
  // Entries now describe the new table as a whole; it is written entirely.
  table_moved_ = true;
  dirty_entries_.clear();
  uint64_t clusters = want * 8 / cluster_size_;
  TD_ASSIGN_OR_RETURN(Allocation a, AllocateClustersAt(clusters, depth + 1));
  table_offset_ = a.offset;
  table_clusters_ = uint32_t(clusters);
  if (old_offset != 0) DeferFree(old_offset, old_clusters);
  return Status::Ok();
}

Result<uint64_t> Allocator::FindFree(uint64_t n) {
  uint64_t run_start = free_hint_;
  uint64_t run = 0;
  for (uint64_t c = free_hint_;; ++c) {
    uint64_t bi = c / entries_per_block_;
    if (bi >= table_.size() || table_[bi] == 0) {
      // A missing block: everything it covers is free.
      if (run == 0) run_start = c;
      uint64_t block_end = (bi + 1) * entries_per_block_;
      run += block_end - c;
      if (run >= n) return run_start;
      c = block_end - 1;
      continue;
    }
    TD_ASSIGN_OR_RETURN(uint64_t rc, RefcountOfCluster(c));
    if (rc != 0) {
      run = 0;
      continue;
    }
    if (run == 0) run_start = c;
    if (++run >= n) return run_start;
  }
}

uint64_t Allocator::ColdBlockAhead() {
  if (!reserve_.empty()) return 0;  // the next single cluster is reserved
  const uint64_t want = std::max<uint64_t>(reserve_target_, 1);
  uint64_t found = 0;
  for (uint64_t bi = free_hint_ / entries_per_block_; bi < table_.size(); ++bi) {
    // The blocks from the hint's on must all stay in memory for the search:
    // past what the cache holds, a load would drop one loaded before.
    if (bi - free_hint_ / entries_per_block_ >= blocks_.capacity()) return 0;
    if (table_[bi] == 0) return 0;  // a missing block: free, nothing to read
    if (!blocks_.Cached(table_[bi])) return table_[bi];
    Result<std::shared_ptr<Table>> block = blocks_.Get(table_[bi]);
    if (!block.has_value()) return 0;  // the search itself says why
    const uint64_t first =
        std::max(free_hint_, bi * entries_per_block_) % entries_per_block_;
    for (uint64_t i = first; i < entries_per_block_ && found < want; ++i) {
      found += qcow2::GetRefcount((*block)->data, refcount_order_, i) == 0;
    }
    if (found >= want) return 0;
    if (found == 0) free_hint_ = (bi + 1) * entries_per_block_;  // full from the hint on
  }
  return 0;
}

Result<Allocator::Allocation> Allocator::AllocateClustersAt(uint64_t n, int depth) {
  if (n == 0) return Status::Internal("allocation of zero clusters");
  for (int attempt = 0; attempt < 64; ++attempt) {
    TD_ASSIGN_OR_RETURN(uint64_t first, FindFree(n));
    // Creating the blocks that count this run may take clusters of the run
    // itself (a new block sits at the start of its range); re-check after.
    for (uint64_t bi = first / entries_per_block_; bi <= (first + n - 1) / entries_per_block_;
         ++bi) {
      TD_RETURN_IF_ERROR(EnsureBlock(bi, depth));
    }
    bool still_free = true;
    for (uint64_t c = first; c < first + n && still_free; ++c) {
      TD_ASSIGN_OR_RETURN(uint64_t rc, RefcountOfCluster(c));
      still_free = rc == 0;
    }
    if (!still_free) continue;
    for (uint64_t c = first; c < first + n; ++c) TD_RETURN_IF_ERROR(SetRefcountOfCluster(c, 1));
    uint64_t offset = first << cluster_bits_;
    uint64_t end = offset + (n << cluster_bits_);
    Allocation a{offset, offset >= fresh_from_};
    fresh_from_ = std::max(fresh_from_, end);
    host_end_ = std::max(host_end_, end);
    if (n == 1 || first == free_hint_) free_hint_ = first + n;
    return a;
  }
  return Status::Internal("cluster allocation did not converge");
}

Result<Allocator::Allocation> Allocator::AllocateClusters(uint64_t n) {
  if (n == 1 && reserve_target_ > 0) {
    if (reserve_.empty()) TD_RETURN_IF_ERROR(FillReserve());
    if (reserve_.empty()) return AllocateUnreserved(1);
    Allocation a = reserve_.front();
    reserve_.pop_front();
    return a;
  }
  // A larger run would otherwise be placed past the reserve.
  TD_RETURN_IF_ERROR(ReleaseReserve());
  return AllocateUnreserved(n);
}

Status Allocator::FillReserve() {
  while (reserve_.size() < reserve_target_) {
    // Only where a refcount block already counts the cluster: a block
    // created for the reserve would outlive a release and move the layout.
    TD_ASSIGN_OR_RETURN(uint64_t next, FindFree(1));
    const uint64_t bi = next / entries_per_block_;
    if (bi >= table_.size() || table_[bi] == 0) break;
    TD_ASSIGN_OR_RETURN(Allocation a, AllocateUnreserved(1));
    reserve_.push_back(a);
  }
  return Status::Ok();
}

Status Allocator::ReleaseReserve() {
  // Newest first, so the space past everything in use shrinks back too.
  while (!reserve_.empty()) {
    const Allocation a = reserve_.back();
    reserve_.pop_back();
    const uint64_t c = ClusterIndex(a.offset);
    TD_RETURN_IF_ERROR(SetRefcountOfCluster(c, 0));
    free_hint_ = std::min(free_hint_, c);
    const uint64_t end = a.offset + cluster_size_;
    if (a.fresh && fresh_from_ == end) fresh_from_ = a.offset;
    if (a.fresh && host_end_ == end) host_end_ = a.offset;
  }
  return Status::Ok();
}

Result<Allocator::Allocation> Allocator::AllocateUnreserved(uint64_t n) {
  // The host cluster after a partly filled compressed cluster is left for
  // the next compressed cluster to run on into (AllocateBytes): plain data
  // there would waste the partly filled cluster's tail.
  if (compressed_cursor_ & (cluster_size_ - 1)) {
    const uint64_t spill = ClusterIndex(compressed_cursor_) + 1;
    if (free_hint_ == spill) free_hint_ = spill + 1;
  }
  return AllocateClustersAt(n, 0);
}

Result<uint64_t> Allocator::AllocateBytes(uint64_t bytes) {
  if (bytes == 0 || bytes > cluster_size_) return Status::Internal("bad compressed allocation size");
  // Compressed data runs on into the clusters after it: the reserve
  // would hold them.
  TD_RETURN_IF_ERROR(ReleaseReserve());
  if (compressed_cursor_ != 0) {
    uint64_t used = compressed_cursor_ & (cluster_size_ - 1);
    uint64_t cluster = compressed_cursor_ & ~(cluster_size_ - 1);
    if (used != 0) {
      // Only reuse a cluster still counted by a compressed neighbour, with
      // room left in the refcount width.
      TD_ASSIGN_OR_RETURN(uint64_t rc, GetRefcount(cluster));
      const bool shareable = rc > 0 && rc < max_refcount_;
      bool room = shareable && cluster_size_ - used >= bytes;
      // Compressed data may continue into the next contiguous host cluster
      // (qcow2 spec): without that, a cluster's tail too short for the next
      // compressed cluster is wasted, ~20% of a compressed image.
      if (shareable && !room) {
        TD_ASSIGN_OR_RETURN(room, TakeIfFree(ClusterIndex(cluster) + 1));
      }
      if (room) {
        TD_RETURN_IF_ERROR(AddRefcount(cluster, 1, +1));
        uint64_t offset = compressed_cursor_;
        compressed_cursor_ += bytes;
        return offset;
      }
    }
  }
  TD_ASSIGN_OR_RETURN(Allocation a, AllocateUnreserved(1));
  compressed_cursor_ = a.offset + bytes;
  return a.offset;
}

Result<bool> Allocator::TakeIfFree(uint64_t cluster) {
  TD_ASSIGN_OR_RETURN(uint64_t rc, RefcountOfCluster(cluster));
  if (rc != 0) return false;
  // Creating the block that counts it may take this very cluster.
  TD_RETURN_IF_ERROR(EnsureBlock(cluster / entries_per_block_, 0));
  TD_ASSIGN_OR_RETURN(rc, RefcountOfCluster(cluster));
  if (rc != 0) return false;
  TD_RETURN_IF_ERROR(SetRefcountOfCluster(cluster, 1));
  const uint64_t end = (cluster + 1) << cluster_bits_;
  fresh_from_ = std::max(fresh_from_, end);
  host_end_ = std::max(host_end_, end);
  if (cluster == free_hint_) free_hint_ = cluster + 1;
  return true;
}

void Allocator::DeferFree(uint64_t host_offset, uint64_t n) {
  if (n == 0) return;
  deferred_.push_back({host_offset & ~(cluster_size_ - 1), n});
}

std::vector<Allocator::Range> Allocator::TakeDeferredFrees() {
  std::vector<Range> out;
  out.swap(deferred_);
  return out;
}

Status Allocator::ApplyFrees(const std::vector<Range>& frees, std::vector<uint64_t>* freed) {
  for (const Range& r : frees) {
    for (uint64_t i = 0; i < r.n; ++i) {
      uint64_t off = r.offset + (i << cluster_bits_);
      TD_RETURN_IF_ERROR(AddRefcount(off, 1, -1));
      TD_ASSIGN_OR_RETURN(uint64_t rc, GetRefcount(off));
      if (rc == 0) {
        if ((compressed_cursor_ & ~(cluster_size_ - 1)) == off) compressed_cursor_ = 0;
        if (freed) freed->push_back(off);
      }
    }
  }
  return Status::Ok();
}

std::vector<uint64_t> Allocator::UncachedBlocks(const Range& r) const {
  std::vector<uint64_t> out;
  if (r.n == 0) return out;
  const uint64_t first = ClusterIndex(r.offset) / entries_per_block_;
  const uint64_t last = (ClusterIndex(r.offset) + r.n - 1) / entries_per_block_;
  for (uint64_t bi = first; bi <= last && bi < table_.size(); ++bi) {
    if (table_[bi] != 0 && !blocks_.Cached(table_[bi])) out.push_back(table_[bi]);
  }
  return out;
}

Status Allocator::WriteBlocks() {
  TD_RETURN_IF_ERROR(blocks_.WriteDirty());
  if (table_moved_) {
    std::vector<uint8_t> raw(uint64_t(table_clusters_) * cluster_size_, 0);
    for (uint64_t i = 0; i < table_.size() && i * 8 < raw.size(); ++i) {
      StoreBe64(&raw[i * 8], table_[i]);
    }
    storage_.Announce(io::Event::kReftableGrow);
    TD_RETURN_IF_ERROR(storage_.WriteAt(table_offset_, raw));
  }
  return Status::Ok();
}

Status Allocator::WriteTableEntries() {
  if (table_moved_) return Status::Ok();
  for (uint64_t i : dirty_entries_) {
    uint8_t raw[8];
    StoreBe64(raw, table_[i]);
    storage_.Announce(io::Event::kReftableUpdate);
    TD_RETURN_IF_ERROR(storage_.WriteAt(table_offset_ + i * 8, raw));
  }
  dirty_entries_.clear();
  return Status::Ok();
}

}  // namespace thindisk::qcow2
