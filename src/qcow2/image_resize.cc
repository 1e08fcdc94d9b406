// Resize: grow (relocating the L1 table when it must grow) or shrink.
//
// Shrinking keeps the engine's rules (docs/engine.md):
//  1. It refuses while this layer holds data past the new end (the caller
//     discards that range first when it means to lose it).
//  2. The tail of the last kept cluster is zeroed (zero bits, punched
//     subclusters or written zeros), so a later grow, by us or by qemu,
//     never shows the bytes that were cut off (no stale bytes).
//  3. Mappings past the end and L2 tables whose whole range is cut are
//     dropped in memory; their clusters are freed deferred.
//  4. The ordered flush writes L2 tables, L1 entries and the header before
//     it lowers refcounts (stage 5), and the refcounts are written too.
//  5. Only then is the host file truncated after its last cluster in use.
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "qcow2/image_impl.h"

namespace thindisk::qcow2 {
namespace {

std::string Hex(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

bool HoldsData(const L2Mapping& m, bool extended) {
  if (m.kind == ClusterKind::kCompressed) return true;
  if (m.kind != ClusterKind::kNormal) return false;
  return !extended || m.alloc_bitmap != 0;
}

bool IsEmpty(const L2Mapping& m) {
  return m.kind == ClusterKind::kUnallocated && m.host_offset == 0 && m.zero_bitmap == 0;
}

}  // namespace

Status ImageImpl::FindDataPast(uint64_t from, uint64_t to, uint64_t* first, uint64_t* end) {
  *first = *end = 0;
  auto note = [&](uint64_t b, uint64_t e) {
    if (*end == 0) *first = b;
    *end = std::max(*end, e);
  };
  // The partly kept cluster: only non-zero bytes of data subclusters count.
  uint64_t whole_from = (from + cs() - 1) / cs() * cs();
  if (from % cs() != 0 && from < to) {
    uint64_t gc = from >> cluster_bits_;
    L2Mapping m;
    {
      util::MutexLock lock(mu_);
      TD_ASSIGN_OR_RETURN(m, LookupLocked(gc));
    }
    uint64_t base = gc << cluster_bits_;
    uint64_t tail_end = std::min(whole_from, to) - base;
    for (uint64_t pos = from - base; pos < tail_end;) {
      uint64_t next = std::min(tail_end, (pos / scs() + 1) * scs());
      SubState st = StateOf(m, uint32_t(pos / scs()));
      if (st == SubState::kData || st == SubState::kCompressed) {
        std::vector<uint8_t> bytes(next - pos);
        TD_RETURN_IF_ERROR(ReadWithMapping(gc, m, pos, bytes));
        auto nz = std::find_if(bytes.begin(), bytes.end(), [](uint8_t b) { return b != 0; });
        if (nz != bytes.end()) note(base + pos + uint64_t(nz - bytes.begin()), base + next);
      }
      pos = next;
    }
  }
  // Whole clusters: anything allocated holds data.
  util::MutexLock lock(mu_);
  for (uint64_t gc = whole_from >> cluster_bits_; (gc << cluster_bits_) < to;) {
    uint64_t l1i = gc / l2_entries_;
    if (l1i >= l1_.size()) break;
    if (L1Offset(l1_[l1i]) == 0) {
      gc = (l1i + 1) * l2_entries_;
      continue;
    }
    TD_ASSIGN_OR_RETURN(L2Mapping m, LookupLocked(gc));
    if (HoldsData(m, extended_)) {
      uint64_t b = gc << cluster_bits_;
      note(b, std::min(to, b + cs()));
    }
    ++gc;
  }
  return Status::Ok();
}

Status ImageImpl::DropMappingsPastLocked(uint64_t new_size, uint64_t old_size) {
  const uint64_t first_gc = (new_size + cs() - 1) >> cluster_bits_;
  const uint64_t end_gc = (old_size + cs() - 1) >> cluster_bits_;
  const uint64_t keep_l1 = (first_gc + l2_entries_ - 1) / l2_entries_;
  // The L2 table that keeps some entries: clear the cut ones (copying the
  // table first if a snapshot shares it).
  if (first_gc % l2_entries_ != 0) {
    uint64_t stop = std::min(end_gc, keep_l1 * l2_entries_);
    for (uint64_t gc = first_gc; gc < stop && L1Offset(l1_[keep_l1 - 1]) != 0; ++gc) {
      TD_ASSIGN_OR_RETURN(L2Mapping m, LookupLocked(gc));
      if (IsEmpty(m)) continue;
      TD_RETURN_IF_ERROR(SetMappingLocked(gc, L2Mapping{}));
      FreeMappingLocked(m);
    }
  }
  // Whole L2 tables past the end: one reference on the table and one on
  // every cluster it maps go away with the L1 entry (also for a table a
  // snapshot shares: refcounts count L1 paths).
  for (uint64_t l1i = keep_l1; l1i < l1_.size(); ++l1i) {
    uint64_t l2_offset = L1Offset(l1_[l1i]);
    if (l2_offset == 0) continue;
    for (uint64_t k = 0; k < l2_entries_; ++k) {
      TD_ASSIGN_OR_RETURN(L2Mapping m, LookupLocked(l1i * l2_entries_ + k));
      FreeMappingLocked(m);
    }
    allocator_->DeferFree(l2_offset, 1);
    l1_[l1i] = 0;
    if (!l1_moved_) l1_dirty_.insert(l1i);
  }
  return Status::Ok();
}

Status ImageImpl::TruncateUnusedTail() {
  util::MutexLock lock(mu_);
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage_->Size());
  uint64_t c = (file_size + cs() - 1) >> cluster_bits_;
  while (c > 1) {
    TD_ASSIGN_OR_RETURN(uint64_t rc, allocator_->GetRefcount((c - 1) << cluster_bits_));
    if (rc != 0) break;
    --c;
  }
  uint64_t end = c << cluster_bits_;
  if (end >= file_size) return Status::Ok();
  // Every cluster from `end` on has refcount 0 on disk (written by the
  // flush before this), so nothing refers to the bytes we cut.
  TD_RETURN_IF_ERROR(storage_->Resize(end));
  return storage_->Flush();
}

Status ImageImpl::Resize(uint64_t new_size, bool shrink) {
  if (read_only_) return Status::ReadOnly(info_.filename + ": image is opened read-only");
  if (closed_.load()) return Status::InvalidArgument("image is closed");
  if (new_size > kMaxVirtualSize) {
    return Status::InvalidArgument("size " + std::to_string(new_size) + " exceeds the limit");
  }
  util::MutexLock flush_lock(flush_mu_);
  const uint64_t old_size = size_.load();
  if (new_size == old_size) return Status::Ok();
  {
    // The file's tail may be cut below: no reserved cluster may stay there.
    util::MutexLock lock(mu_);
    TD_RETURN_IF_ERROR(allocator_->ReleaseReserve());
  }

  uint32_t snapshots = 0;
  {
    util::MutexLock lock(mu_);
    snapshots = header_.nb_snapshots;
  }
  if (version_ < 3 && snapshots != 0) {
    // Version 2 snapshots need not record their disk size (qemu refuses too).
    return Status::NotSupported("cannot resize a version 2 image that has snapshots");
  }
  if (new_size < old_size) {
    if (!shrink) return Status::InvalidArgument("shrinking the image needs shrink=true");
    // 1. Refuse while anything past the new end holds data.
    uint64_t first = 0, end = 0;
    TD_RETURN_IF_ERROR(FindDataPast(new_size, old_size, &first, &end));
    if (end != 0) {
      return Status::InvalidArgument("cannot shrink to " + std::to_string(new_size) +
                                     " bytes: data at guest offset " + Hex(first) + " (up to " +
                                     Hex(end) + ") lies past the new end (discard it first)");
    }
    // 2. The tail of the last kept cluster reads as zeros from now on.
    uint64_t tail_end = std::min(old_size, (new_size + cs() - 1) / cs() * cs());
    bool tail_held = false;
    if (tail_end > new_size) {
      util::MutexLock lock(mu_);
      TD_ASSIGN_OR_RETURN(L2Mapping m, LookupLocked(new_size >> cluster_bits_));
      tail_held = HoldsData(m, extended_);  // else it reads as zeros or backing
    }
    if (tail_held) {
      Status z = ZeroRange(new_size, tail_end - new_size, true, false, false, /*mark=*/false);
      if (!z.ok()) return z.WithContext("zeroing the cut tail at " + Hex(new_size));
    }
    // 3. Drop what lies past the end; the bitmaps shrink with the disk.
    {
      util::MutexLock lock(mu_);
      TD_RETURN_IF_ERROR(PrepareResizedBitmapsLocked(new_size));
      Status dropped = DropMappingsPastLocked(new_size, old_size);
      if (!dropped.ok()) {
        DropResizedBitmapsLocked();  // never named: their clusters leak at worst
        return dropped;
      }
      size_ = new_size;
      header_dirty_ = true;
    }
    // 4. Metadata before frees (FlushAll), then the lowered refcounts.
    TD_RETURN_IF_ERROR(FlushAll());
    {
      util::MutexLock lock(mu_);
      TD_RETURN_IF_ERROR(FlushMetadataLocked());
    }
    // 5. Give the host file's unused tail back.
    return TruncateUnusedTail();
  }

  {
    util::MutexLock lock(mu_);
    uint64_t per_l1 = l2_entries_ * cs();
    uint64_t needed = (new_size + per_l1 - 1) / per_l1;
    if (needed * 8 > kMaxL1Bytes) {
      return Status::InvalidArgument("size " + std::to_string(new_size) +
                                     " needs an L1 table larger than the limit");
    }
    if (needed > l1_.size()) {
      // A larger L1 goes to a new place; stage 4 writes it, then the header.
      uint64_t clusters = (needed * 8 + cs() - 1) / cs();
      TD_ASSIGN_OR_RETURN(auto a, allocator_->AllocateClusters(clusters));
      uint64_t old_offset = l1_moved_ ? new_l1_offset_ : header_.l1_table_offset;
      uint64_t old_clusters = (uint64_t(l1_.size()) * 8 + cs() - 1) / cs();
      if (old_offset != 0 && old_clusters != 0) allocator_->DeferFree(old_offset, old_clusters);
      l1_.resize(needed, 0);
      new_l1_offset_ = a.offset;
      l1_moved_ = true;
    }
    // The bitmaps grow with the disk, named by the header write of its size.
    TD_RETURN_IF_ERROR(PrepareResizedBitmapsLocked(new_size));
    size_ = new_size;
    header_dirty_ = true;
  }
  // New space must read as zeros: neither backing data nor bytes left in
  // the old last cluster (by an image shrunk elsewhere) may show through.
  uint64_t end = std::min(new_size, (old_size + cs() - 1) / cs() * cs());
  if (backing_) end = std::max(end, std::min(new_size, backing_->size()));
  if (end > old_size) {
    Status z = ZeroRange(old_size, end - old_size, false, false, false, /*mark=*/false);
    if (!z.ok()) return z.WithContext("zeroing grown space at " + Hex(old_size));
  }
  return FlushAll();
}

}  // namespace thindisk::qcow2
