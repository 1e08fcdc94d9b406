// The ordered write-back flush (docs/engine.md "Metadata is written back at
// flush, in order"). Each stage ends with a sync so the next stage's writes
// can only reach the disk after it.
#include <cstring>

#include "qcow2/image_impl.h"
#include "util/endian.h"

namespace thindisk::qcow2 {

Status ImageImpl::WriteHeaderLocked() {
  TD_ASSIGN_OR_RETURN(auto bytes, EncodeHeader(header_));
  storage_->Announce(io::Event::kHeaderUpdate);
  return storage_->WriteAt(0, bytes);
}

Status ImageImpl::FlushMetadataLocked(OwedTail* owed) {
  if (read_only_) return Status::Ok();
  if (in_metadata_flush_) return Status::Ok();  // re-entered through a cache eviction
  // Waits for the tables a FlushAll is writing without mu_, if any: what
  // this flush writes and syncs comes after them.
  std::unique_lock order(table_write_mu_);
  in_metadata_flush_ = true;
  struct Reset {
    bool* flag;
    ~Reset() { *flag = false; }
  } reset{&in_metadata_flush_};

  // When nothing follows stages 1 and 3 but the flush's end, the caller
  // writes and syncs them without the lock (FlushAll).
  if (owed && !allocator_->HasDirtyTable() && !l1_moved_ && l1_dirty_.empty() &&
      !header_dirty_ && (allocator_->HasDirtyBlocks() || l2_cache_->HasDirty())) {
    TakeTailLocked(owed);
    owed->order = std::move(order);
    return Status::Ok();
  }

  bool synced = false;
  // Stage 1: refcount blocks (and a relocated refcount table); the sync also
  // makes every data write issued so far durable.
  // Rule: a refcount is raised before anything points at the cluster.
  if (allocator_->HasDirtyBlocks() || allocator_->table_moved()) {
    TD_RETURN_IF_ERROR(allocator_->WriteBlocks());
    TD_RETURN_IF_ERROR(storage_->Flush());
    synced = true;
  }
  if (allocator_->HasDirtyTable() && !allocator_->table_moved()) {
    // New blocks are durable (above) before table entries point at them.
    TD_RETURN_IF_ERROR(allocator_->WriteTableEntries());
    TD_RETURN_IF_ERROR(storage_->Flush());
    synced = true;
  }
  // Stage 2: the header, if the refcount table moved.
  if (allocator_->table_moved()) {
    Header h = header_;
    h.refcount_table_offset = allocator_->table_offset();
    h.refcount_table_clusters = allocator_->table_clusters();
    header_ = h;
    TD_RETURN_IF_ERROR(WriteHeaderLocked());
    TD_RETURN_IF_ERROR(storage_->Flush());
    allocator_->TableCommitted();
  }
  // Stage 3: L2 tables. Rule: data is durable before the L2 entry that
  // points at it — guaranteed by a sync before this stage.
  // FlushAll's sync counts when no table changed since it began.
  if (l2_cache_->HasDirty()) {
    if (!synced && l2_cache_->changes() != l2_changes_synced_) {
      TD_RETURN_IF_ERROR(storage_->Flush());
    }
    TD_RETURN_IF_ERROR(l2_cache_->WriteDirty());
    TD_RETURN_IF_ERROR(storage_->Flush());
    synced = true;
  }
  // Stage 4: L1 entries, or a whole new L1 table and then the header.
  if (l1_moved_) {
    std::vector<uint8_t> raw(uint64_t(l1_.size()) * 8);
    for (size_t i = 0; i < l1_.size(); ++i) StoreBe64(&raw[i * 8], l1_[i]);
    uint64_t padded = (raw.size() + cluster_size_ - 1) & ~(cluster_size_ - 1);
    raw.resize(padded, 0);
    storage_->Announce(io::Event::kL1Grow);
    TD_RETURN_IF_ERROR(storage_->WriteAt(new_l1_offset_, raw));
    TD_RETURN_IF_ERROR(storage_->Flush());
    header_.l1_table_offset = new_l1_offset_;
    header_.l1_size = uint32_t(l1_.size());
    header_dirty_ = true;
    l1_moved_ = false;
    l1_dirty_.clear();
    synced = true;
  } else if (!l1_dirty_.empty()) {
    if (!synced) TD_RETURN_IF_ERROR(storage_->Flush());
    for (uint64_t i : l1_dirty_) {
      uint8_t raw[8];
      StoreBe64(raw, l1_[i]);
      storage_->Announce(io::Event::kL1Update);
      TD_RETURN_IF_ERROR(storage_->WriteAt(header_.l1_table_offset + i * 8, raw));
    }
    l1_dirty_.clear();
    TD_RETURN_IF_ERROR(storage_->Flush());
    synced = true;
  }
  if (header_dirty_) {
    if (!synced) TD_RETURN_IF_ERROR(storage_->Flush());
    header_.size = size_.load();
    // A resize's bitmaps are named by the same one-sector write as the
    // size (image_bitmaps.cc): their stage-1 sync made them durable.
    const std::optional<BitmapsExtension> bitmaps = header_.bitmaps;
    if (resized_bitmaps_) header_.bitmaps = resized_bitmaps_->ext;
    Status st = WriteHeaderLocked();
    if (st.ok()) st = storage_->Flush();
    if (!st.ok()) {
      header_.bitmaps = bitmaps;
      return st;
    }
    header_dirty_ = false;
    synced = true;
    if (resized_bitmaps_) ApplyResizedBitmapsLocked();
  }
  // Nothing dirty: the flush is one fdatasync.
  if (!synced && owed) {
    owed->sync = true;
  } else if (!synced) {
    TD_RETURN_IF_ERROR(storage_->Flush());
  }
  return Status::Ok();
}

void ImageImpl::TakeTailLocked(OwedTail* owed) {
  // Stage 1: the refcount blocks. Rule: a refcount is raised before
  // anything points at the cluster (their sync comes before the tables).
  // That sync also makes every data write issued so far durable.
  if (allocator_->HasDirtyBlocks()) {
    TableCache& blocks = allocator_->block_cache();
    owed->blocks = blocks.Take();
    owed->block_cache = &blocks;
  }
  // Stage 3: the L2 tables. Rule: data is durable before the L2 entry that
  // points at it: stage 1's sync, or FlushAll's when no table changed
  // since it began, or one of their own.
  if (l2_cache_->HasDirty()) {
    owed->sync_before_tables =
        owed->block_cache != nullptr || l2_cache_->changes() != l2_changes_synced_;
    owed->tables = l2_cache_->Take();
    owed->l2_cache = l2_cache_.get();
  }
  owed->sync = true;
}

Status ImageImpl::WriteTail(OwedTail& owed) {
  Status s = owed.block_cache ? owed.block_cache->Write(owed.blocks) : Status::Ok();
  if (s.ok() && owed.l2_cache) {
    if (owed.sync_before_tables) s = storage_->Flush();
    if (s.ok()) s = owed.l2_cache->Write(owed.tables);
  }
  if (owed.order.owns_lock()) owed.order.unlock();
  return s;
}

bool ImageImpl::MetadataDirtyLocked() const {
  return allocator_->HasDirtyBlocks() || allocator_->HasDirtyTable() ||
         l2_cache_->HasDirty() || l1_moved_ || !l1_dirty_.empty() || header_dirty_;
}

Status ImageImpl::FlushAll() {
  std::vector<Allocator::Range> frees;
  OwedTail owed;
  bool clean = false;
  bool sync_first = false;
  uint64_t l2_changes = 0;
  {
    util::MutexLock lock(mu_);
    clean = !MetadataDirtyLocked();
    // Stage 1's sync covers the data when refcounts are to be written.
    sync_first =
        !read_only_ && !allocator_->HasDirtyBlocks() && !allocator_->HasDirtyTable();
    l2_changes = l2_cache_->changes();
  }
  // The data sync, without the metadata lock: requests that look up
  // mappings (every read, every write) go on while it waits for the disk,
  // as they would on a raw file. It covers the data of every write whose
  // mapping is in the cache by now (a write changes its mapping after its
  // data is written). When nothing was dirty, that is all the flush owes:
  // the mapping of every write that completed before it is durable.
  if (sync_first) TD_RETURN_IF_ERROR(storage_->Flush());
  {
    util::MutexLock lock(mu_);
    // Metadata changed during the unlocked sync (a discard, say) is written
    // now too, though the flush does not owe it: the frees taken below may
    // belong to it, and a refcount must never drop while an L2 entry on
    // disk still names the cluster. (Skipping this let a discard racing a
    // clean flush free its cluster with the old mapping only in memory
    // removed: a kill then left an L2 entry naming a free cluster.)
    if (!clean || !sync_first || MetadataDirtyLocked()) {
      if (sync_first) l2_changes_synced_ = l2_changes;
      TD_RETURN_IF_ERROR(FlushMetadataLocked(&owed));
    }
    frees = allocator_->TakeDeferredFrees();
  }
  // Stage 1's and stage 3's writes and syncs, when nothing but the frees
  // comes after them, are made without the lock too: requests go on beside
  // them, even when a write goes to the disk (RewriteAt, --cache=none).
  // The taken blocks and tables stay in their caches, pinned, until their
  // copies are written; a metadata flush (a cache eviction's) waits for the
  // writes on table_write_mu_, not for the last sync.
  const Status written = WriteTail(owed);
  if (!written.ok()) {
    // No table was written after a failure: the next flush writes the
    // blocks and tables again, and frees the clusters after them.
    util::MutexLock lock(mu_);
    if (owed.block_cache) allocator_->block_cache().Restore(owed.blocks);
    if (owed.l2_cache) l2_cache_->Restore(owed.tables);
    for (const Allocator::Range& r : frees) allocator_->DeferFree(r.offset, r.n);
    return written;
  }
  owed.blocks = {};  // unpins
  owed.tables = {};
  if (owed.sync) TD_RETURN_IF_ERROR(storage_->Flush());
  if (frees.empty()) return Status::Ok();
  // Stage 5. Rule: a refcount is lowered only after nothing points at the
  // cluster — nothing on disk (stages 3-4 above) and no reader in flight:
  // taking the gate exclusively waits for every reader that might still
  // use an old mapping.
  WaitForReaders();
  std::vector<uint64_t> freed;
  for (const Allocator::Range& r : frees) {
    util::MutexLock lock(mu_);
    // The refcount blocks it changes are loaded without the lock (a few
    // tries each; then ApplyFrees loads under it), as a discard of a cold
    // part of a large image needs blocks no request has read yet.
    for (uint64_t block : allocator_->UncachedBlocks(r)) {
      for (int loads = 0; loads < 3 && !allocator_->block_cache().Cached(block);) {
        TD_ASSIGN_OR_RETURN(bool ours,
                            LoadTableUnlocked(allocator_->block_cache(), block));
        loads += ours;
      }
    }
    const size_t before = freed.size();
    TD_RETURN_IF_ERROR(allocator_->ApplyFrees({r}, &freed));
    // A freed L2 table must never be written back over its next use.
    for (size_t i = before; i < freed.size(); ++i) l2_cache_->DropCluster(freed[i]);
  }
  if (!freed.empty()) DropCompressedCache();
  return Status::Ok();
}

Status ImageImpl::Flush() {
  if (closed_.load()) return Status::InvalidArgument("image is closed");
  if (read_only_) return storage_->Flush();
  util::MutexLock flush_lock(flush_mu_);
  return FlushAll();
}

}  // namespace thindisk::qcow2
