// Deallocate: ranges become unallocated (reads fall through to the backing
// file), for commit's emptying of an overlay. Unlike discard, the host space
// is punched only after the new mappings are on disk: until then the old L2
// entries still point at the data, which must stay readable.
#include <algorithm>

#include "qcow2/image_impl.h"

namespace thindisk::qcow2 {
namespace {

uint32_t SubMask(uint32_t first, uint32_t last) {
  return uint32_t((uint64_t{1} << (last + 1)) - (uint64_t{1} << first));
}

bool SameMapping(const L2Mapping& a, const L2Mapping& b) {
  return a.kind == b.kind && a.host_offset == b.host_offset &&
         a.alloc_bitmap == b.alloc_bitmap && a.zero_bitmap == b.zero_bitmap;
}

}  // namespace

Status ImageImpl::Deallocate(uint64_t offset, uint64_t length) {
  if (read_only_) return Status::ReadOnly(info_.filename + ": image is opened read-only");
  TD_RETURN_IF_ERROR(CheckRange(offset, length));
  const uint64_t end = offset + length;
  if (offset % scs() != 0 || (end % scs() != 0 && end != size_.load())) {
    return Status::InvalidArgument("deallocate: range is not aligned to the subcluster size " +
                                   std::to_string(scs()));
  }
  // What the range reads may change (to the backing file's content).
  TD_RETURN_IF_ERROR(MarkChanged(offset, length));
  ChangeDone change_done(tracker_.get());
  // What the changed mappings released: punched, then freed, after the flush.
  struct Released {
    L2Mapping old;
    uint64_t gc = 0;
    uint32_t mask = 0;        // subclusters released from a kept cluster
    bool free = false;        // the whole cluster left the mapping
    uint64_t punch_offset = 0;
    uint64_t punch_length = 0;  // 0: nothing of ours to punch
  };
  std::vector<Released> released;
  for (uint64_t pos = offset; pos < end;) {
    const uint64_t gc = pos >> cluster_bits_;
    const uint64_t in_off = pos & (cs() - 1);
    const uint64_t len = std::min<uint64_t>(end - pos, cs() - in_off);
    pos += len;
    auto guard = range_lock_.Lock(gc, 1);
    util::MutexLock lock(mu_);
    uint64_t l1i = gc / l2_entries_;
    if (l1i >= l1_.size() || L1Offset(l1_[l1i]) == 0) continue;  // nothing mapped here
    TD_ASSIGN_OR_RETURN(L2Mapping m, LookupLoadingUnlocked(gc));
    const bool owned = (m.kind == ClusterKind::kNormal || m.kind == ClusterKind::kZero) &&
                       m.copied && m.host_offset != 0;
    L2Mapping n;  // unallocated
    uint32_t first = 0, last = 0;
    const bool whole = in_off == 0 && len >= ClusterBytes(gc);
    if (!whole && extended_) {
      if (m.kind == ClusterKind::kCompressed) {
        return Status::InvalidArgument(GuestPos(gc) +
                                       ": cannot deallocate part of a compressed cluster");
      }
      first = uint32_t(in_off / scs());
      last = uint32_t((in_off + len - 1) / scs());
      uint32_t mask = SubMask(first, last);
      n = m;
      n.alloc_bitmap &= ~mask;
      n.zero_bitmap &= ~mask;
      // A cluster left with no allocated or zero subcluster is freed whole.
      if (n.alloc_bitmap == 0 && n.zero_bitmap == 0) n = L2Mapping{};
    }
    if (SameMapping(n, m)) continue;
    TD_RETURN_IF_ERROR(SetMappingLocked(gc, n));
    Released r;
    r.old = m;
    r.gc = gc;
    r.mask = whole || !extended_ ? 0 : SubMask(first, last);
    r.free = n.kind == ClusterKind::kUnallocated && m.kind != ClusterKind::kUnallocated;
    if (owned && r.free) {
      r.punch_offset = m.host_offset;
      r.punch_length = cs();
    } else if (owned) {
      r.punch_offset = m.host_offset + uint64_t(first) * scs();
      r.punch_length = uint64_t(last - first + 1) * scs();
    }
    released.push_back(r);
  }
  if (released.empty()) return Status::Ok();

  // 1. The new mappings reach the disk (ordered flush). Until this returns,
  //    the old entries on disk still point at intact data.
  TD_RETURN_IF_ERROR(Flush());
  // 2. Wait for readers that looked up an old mapping; later ones see the new.
  WaitForReaders();
  // 3. Nothing points at the released space any more: give it back. Whole
  //    clusters of ours go in runs (ZeroRange's: one punch for those that
  //    follow each other on the host, their frees queued after it).
  PunchRun run;
  for (const Released& r : released) {
    if (r.punch_length == 0) continue;
    if (r.free) {
      TD_RETURN_IF_ERROR(QueuePunch(&run, r.old));
      continue;
    }
    auto guard = range_lock_.Lock(r.gc, 1);
    // Part of a cluster that stays ours: a write since step 1 may have put
    // data back into these subclusters; punch only if none did.
    L2Mapping now;
    {
      util::MutexLock lock(mu_);
      TD_ASSIGN_OR_RETURN(now, LookupLocked(r.gc));
    }
    if (now.kind != ClusterKind::kNormal || now.host_offset != r.old.host_offset ||
        (now.alloc_bitmap & r.mask) != 0) {
      continue;
    }
    TD_RETURN_IF_ERROR(PunchHost(r.punch_offset, r.punch_length));
  }
  TD_RETURN_IF_ERROR(PunchNow(&run));
  // 4. Only now may the clusters nothing was punched for (shared or
  //    compressed ones) be reused: queue their refcount decrements.
  util::MutexLock lock(mu_);
  for (const Released& r : released) {
    if (r.free && r.punch_length == 0) FreeMappingLocked(r.old);
  }
  return Status::Ok();
}

}  // namespace thindisk::qcow2
