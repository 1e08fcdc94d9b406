// Guest cluster -> host mapping: L1/L2 lookup and updates.
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "qcow2/image_impl.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

std::string Hex(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

}  // namespace

SubState ImageImpl::StateOf(const L2Mapping& m, uint32_t sub) const {
  switch (m.kind) {
    case ClusterKind::kCompressed:
      return SubState::kCompressed;
    case ClusterKind::kZero:
      return SubState::kZero;
    case ClusterKind::kUnallocated:
      return extended_ && (m.zero_bitmap >> sub & 1) ? SubState::kZero : SubState::kUnallocated;
    case ClusterKind::kNormal:
      if (!extended_) return SubState::kData;
      if (m.alloc_bitmap >> sub & 1) return SubState::kData;
      return (m.zero_bitmap >> sub & 1) ? SubState::kZero : SubState::kUnallocated;
  }
  return SubState::kUnallocated;
}

Status ImageImpl::ValidateMapping(uint64_t gc, const L2Mapping& m) {
  uint64_t end = allocator_->host_end();
  if (m.kind == ClusterKind::kCompressed) {
    // The stored size is rounded up to a sector and may reach past the end
    // of the file by less than one sector.
    if (m.host_offset < cluster_size_ || m.host_offset >= end ||
        m.compressed_size > cluster_size_ + 1024) {
      return Status::Corrupt(GuestPos(gc) + ": compressed cluster at host offset " +
                             Hex(m.host_offset) + " (" + std::to_string(m.compressed_size) +
                             " bytes) lies outside the image file");
    }
    return Status::Ok();
  }
  if (m.host_offset != 0 && (m.host_offset < cluster_size_ || m.host_offset + cluster_size_ > end)) {
    return Status::Corrupt(GuestPos(gc) + ": host offset " + Hex(m.host_offset) +
                           " lies outside the image file or in its header");
  }
  return Status::Ok();
}

Result<L2Mapping> ImageImpl::LookupLocked(uint64_t gc) {
  uint64_t l1i = gc / l2_entries_;
  uint64_t l2i = gc % l2_entries_;
  if (l1i >= l1_.size() || L1Offset(l1_[l1i]) == 0) return L2Mapping{};
  uint64_t l2_offset = L1Offset(l1_[l1i]);
  if (l2_offset + cluster_size_ > allocator_->host_end()) {
    return Status::Corrupt(GuestPos(gc) + ": L2 table at " + Hex(l2_offset) +
                           " lies past the end of the file");
  }
  TD_ASSIGN_OR_RETURN(auto slice, L2SliceLocked(l2_offset, l2i));
  const uint8_t* p = &slice->data[L2SliceByte(l2i)];
  uint64_t entry = LoadBe64(p);
  uint64_t bitmap = extended_ ? LoadBe64(p + 8) : 0;
  auto m = DecodeL2Entry(entry, bitmap, extended_, cluster_bits_);
  if (!m) return m.error().WithContext(GuestPos(gc));
  if (version_ < 3 && m->kind == ClusterKind::kZero) {
    return Status::Corrupt(GuestPos(gc) + ": zero flag in a version 2 image");
  }
  TD_RETURN_IF_ERROR(ValidateMapping(gc, *m));
  return m;
}

bool ImageImpl::L2InMemoryLocked(uint64_t gc) const {
  const uint64_t l1i = gc / l2_entries_;
  if (l1i >= l1_.size()) return true;
  const uint64_t l2_offset = L1Offset(l1_[l1i]);
  return l2_offset == 0 || l2_cache_->Cached(L2SliceOffset(l2_offset, gc % l2_entries_));
}

Result<bool> ImageImpl::LoadTableUnlocked(TableCache& cache, uint64_t offset) {
  if (!cache.BeginLoad(offset)) {
    table_loaded_.Wait(mu_);  // another request loads it
    return false;
  }
  // The caller's hold of mu_ (a scope of its own) is let go here and taken
  // again before the return: nothing the caller looked up under it before
  // the call may be used after it without looking again.
  mu_.Unlock();
  std::vector<uint8_t> data(cache.table_size());
  Status read = storage_->ReadAt(offset, data);
  mu_.Lock();
  Status kept = cache.FinishLoad(offset, std::move(data), read.ok());
  table_loaded_.NotifyAll();
  TD_RETURN_IF_ERROR(read);
  TD_RETURN_IF_ERROR(kept);
  return true;
}

Result<L2Mapping> ImageImpl::LookupLoadingUnlocked(uint64_t gc) {
  // A few loads of our own at most: one that was outdated (the table was
  // loaded under the lock, made or dropped meanwhile) is tried again, and
  // after that LookupLocked loads under the lock. Waiting for another
  // request's load costs nothing: that load ends.
  for (int loads = 0; loads < 3 && !L2InMemoryLocked(gc);) {
    const uint64_t l2_offset = L1Offset(l1_[gc / l2_entries_]);
    if (l2_offset + cluster_size_ > allocator_->host_end())
      break;  // LookupLocked says why
    const uint64_t slice = L2SliceOffset(l2_offset, gc % l2_entries_);
    TD_ASSIGN_OR_RETURN(bool ours, LoadTableUnlocked(*l2_cache_, slice));
    loads += ours;
  }
  return LookupLocked(gc);
}

Status ImageImpl::LoadAllocationBlocksUnlocked() {
  const size_t limit = allocator_->block_offsets().size();
  for (size_t loads = 0; loads < limit; ++loads) {
    const uint64_t block = allocator_->ColdBlockAhead();
    if (block == 0) break;
    TD_RETURN_IF_ERROR(LoadTableUnlocked(allocator_->block_cache(), block).status());
  }
  return Status::Ok();
}

Result<std::shared_ptr<Table>> ImageImpl::WritableL2Locked(uint64_t gc) {
  uint64_t l1i = gc / l2_entries_;
  if (l1i >= l1_.size()) return Status::Internal(GuestPos(gc) + ": beyond the L1 table");
  const uint64_t l2i = gc % l2_entries_;
  uint64_t l1e = l1_[l1i];
  if (L1Offset(l1e) == 0) {
    // A new, empty L2 table, every slice of it made in the cache (its
    // cluster may hold old bytes). It reaches the disk in stage 3, the L1
    // entry pointing at it only in stage 4.
    TD_ASSIGN_OR_RETURN(auto a, allocator_->AllocateClusters(1));
    for (uint64_t at = 0; at < cluster_size_; at += l2_slice_size_) {
      TD_RETURN_IF_ERROR(l2_cache_->New(a.offset + at).status());
    }
    l1_[l1i] = a.offset | kCopied;
    l1_dirty_.insert(l1i);
  } else if (!(l1e & kCopied)) {
    // Shared with a snapshot (or the flag is merely missing): copy the
    // table before changing it, unless we are its only user.
    uint64_t old_offset = L1Offset(l1e);
    TD_ASSIGN_OR_RETURN(uint64_t rc, allocator_->GetRefcount(old_offset));
    if (rc == 1) {
      l1_[l1i] = old_offset | kCopied;
    } else {
      TD_ASSIGN_OR_RETURN(auto a, allocator_->AllocateClusters(1));
      for (uint64_t at = 0; at < cluster_size_; at += l2_slice_size_) {
        TD_ASSIGN_OR_RETURN(auto old_slice, l2_cache_->Get(old_offset + at));
        TD_ASSIGN_OR_RETURN(auto slice, l2_cache_->New(a.offset + at));
        slice->data = old_slice->data;
      }
      l1_[l1i] = a.offset | kCopied;
      allocator_->DeferFree(old_offset, 1);
    }
    l1_dirty_.insert(l1i);
  }
  return L2SliceLocked(L1Offset(l1_[l1i]), l2i);
}

Status ImageImpl::SetMappingLocked(uint64_t gc, const L2Mapping& m) {
  TD_ASSIGN_OR_RETURN(std::shared_ptr<Table> slice, WritableL2Locked(gc));
  const uint64_t at = L2SliceByte(gc % l2_entries_);
  L2Words w = EncodeL2Entry(m, extended_, cluster_bits_);
  uint8_t* p = &slice->data[at];
  StoreBe64(p, w.entry);
  if (extended_) StoreBe64(p + 8, w.bitmap);
  l2_cache_->MarkDirty(*slice, at, l2_entry_size_);
  return Status::Ok();
}

void ImageImpl::FreeMappingLocked(const L2Mapping& m) {
  switch (m.kind) {
    case ClusterKind::kUnallocated:
      return;
    case ClusterKind::kZero:
    case ClusterKind::kNormal:
      if (m.host_offset != 0) allocator_->DeferFree(m.host_offset, 1);
      return;
    case ClusterKind::kCompressed: {
      // One reference on every host cluster the compressed bytes touch.
      uint64_t first = m.host_offset >> cluster_bits_;
      uint64_t last = (m.host_offset + std::max<uint64_t>(m.compressed_size, 1) - 1) >> cluster_bits_;
      allocator_->DeferFree(first << cluster_bits_, last - first + 1);
      return;
    }
  }
}

}  // namespace thindisk::qcow2
