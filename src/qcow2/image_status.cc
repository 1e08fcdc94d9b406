// Block status (qemu-img map semantics).
#include <algorithm>

#include "qcow2/image_impl.h"

namespace thindisk::qcow2 {

Result<block::Extent> ImageImpl::GetStatus(uint64_t offset, uint64_t max_length) {
  uint64_t size = size_.load();
  if (offset >= size) return Status::OutOfRange("block status offset past the end of the image");
  if (closed_.load()) return Status::InvalidArgument("image is closed");
  if (max_length == 0) return Status::InvalidArgument("block status of an empty range");
  uint64_t limit = offset + std::min(max_length, size - offset);

  // The state of the unit (subcluster, cluster, or unallocated L2 range)
  // holding `pos`; data units also give the host offset of `pos`.
  struct Unit {
    SubState state;
    uint64_t host;
    uint64_t end;
  };
  // A table not in memory is loaded with the lock released meanwhile
  // (LookupLoadingUnlocked): the extent is a snapshot of a moment either way.
  auto unit_at = [&](uint64_t pos) TD_REQUIRES(mu_) -> Result<Unit> {
    uint64_t gc = pos >> cluster_bits_;
    uint64_t l1i = gc / l2_entries_;
    if (l1i >= l1_.size() || L1Offset(l1_[l1i]) == 0) {
      return Unit{SubState::kUnallocated, 0, (l1i + 1) * l2_entries_ * cs()};
    }
    TD_ASSIGN_OR_RETURN(L2Mapping m, LookupLoadingUnlocked(gc));
    uint64_t in_off = pos & (cs() - 1);
    if (m.kind == ClusterKind::kCompressed || !extended_ ||
        m.kind == ClusterKind::kZero) {
      SubState st = m.kind == ClusterKind::kCompressed ? SubState::kCompressed
                                                       : StateOf(m, 0);
      return Unit{st, m.host_offset + in_off, (gc + 1) << cluster_bits_};
    }
    uint32_t sub = uint32_t(in_off / scs());
    return Unit{StateOf(m, sub), m.host_offset + in_off,
                (gc << cluster_bits_) + (sub + 1) * scs()};
  };

  block::Extent e;
  e.offset = offset;
  SubState state;
  {
    util::MutexLock lock(mu_);
    TD_ASSIGN_OR_RETURN(Unit u, unit_at(offset));
    state = u.state;
    uint64_t first_host = u.host;
    uint64_t pos = std::min(u.end, limit);
    // Extend while the state stays the same (and data stays contiguous).
    while (pos < limit) {
      TD_ASSIGN_OR_RETURN(Unit v, unit_at(pos));
      if (v.state != state) break;
      if (state == SubState::kData && v.host != first_host + (pos - offset)) break;
      pos = std::min(v.end, limit);
    }
    e.length = pos - offset;
    if (state == SubState::kData) {
      e.has_host_offset = true;
      e.host_offset = first_host;
    }
  }
  switch (state) {
    case SubState::kData:
    case SubState::kCompressed:
      e.data = true;
      e.present = true;
      return e;
    case SubState::kZero:
      e.zero = true;
      e.present = true;
      return e;
    case SubState::kUnallocated:
      break;
  }
  if (backing_ && offset < backing_->size()) {
    uint64_t len = std::min(e.length, backing_->size() - offset);
    TD_ASSIGN_OR_RETURN(block::Extent below, backing_->GetStatus(offset, len));
    below.offset = offset;
    below.depth += 1;
    return below;
  }
  // Nothing in the chain stores it: a hole at the bottom. As qemu-img map
  // reports it, its depth is that of the bottom layer: 0 without backing,
  // 1 past the end of a (shorter) backing image.
  e.zero = true;
  e.depth = backing_ ? 1 : 0;
  return e;
}

}  // namespace thindisk::qcow2
