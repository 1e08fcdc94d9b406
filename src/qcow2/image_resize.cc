// Resize: grow (relocating the L1 table when it must grow) or shrink.
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

}  // namespace

Status ImageImpl::Resize(uint64_t new_size, bool shrink) {
  if (read_only_) return Status::ReadOnly(info_.filename + ": image is opened read-only");
  if (closed_.load()) return Status::InvalidArgument("image is closed");
  if (new_size > kMaxVirtualSize) {
    return Status::InvalidArgument("size " + std::to_string(new_size) + " exceeds the limit");
  }
  std::lock_guard flush_lock(flush_mu_);
  const uint64_t old_size = size_.load();
  if (new_size == old_size) return Status::Ok();

  if (new_size < old_size) {
    if (!shrink) return Status::InvalidArgument("shrinking the image needs shrink=true");
    std::lock_guard lock(mu_);
    // Refuse while any cluster past the new end stores something.
    uint64_t first = (new_size + cs() - 1) >> cluster_bits_;
    uint64_t last = (old_size + cs() - 1) >> cluster_bits_;
    for (uint64_t gc = first; gc < last;) {
      uint64_t l1i = gc / l2_entries_;
      if (l1i >= l1_.size()) break;
      if (L1Offset(l1_[l1i]) == 0) {
        gc = (l1i + 1) * l2_entries_;
        continue;
      }
      TD_ASSIGN_OR_RETURN(L2Mapping m, LookupLocked(gc));
      if (m.kind == ClusterKind::kNormal || m.kind == ClusterKind::kCompressed ||
          m.host_offset != 0) {
        return Status::InvalidArgument("cannot shrink: " + GuestPos(gc) +
                                       " is allocated (discard it first)");
      }
      ++gc;
    }
    size_ = new_size;
    header_dirty_ = true;
  } else {
    std::lock_guard lock(mu_);
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
    size_ = new_size;
    header_dirty_ = true;
  }
  // New space must read as zeros: neither backing data nor bytes left in
  // the old last cluster may show through.
  if (new_size > old_size) {
    uint64_t end = std::min(new_size, (old_size + cs() - 1) / cs() * cs());
    if (backing_) end = std::max(end, std::min(new_size, backing_->size()));
    if (end > old_size) {
      Status z = ZeroRange(old_size, end - old_size, false, false, false);
      if (!z.ok()) return z.WithContext("zeroing grown space at " + Hex(old_size));
    }
  }
  return FlushAll();
}

}  // namespace thindisk::qcow2
