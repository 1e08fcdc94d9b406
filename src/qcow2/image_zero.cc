// Write-zeroes and discard (docs/engine.md "Zeroes and discard"): whole
// (sub)clusters become zero flags or zero bits, never data writes.
#include <algorithm>

#include "qcow2/image_impl.h"

namespace thindisk::qcow2 {
namespace {

uint32_t SubMask(uint32_t first, uint32_t last) {
  return uint32_t((uint64_t{1} << (last + 1)) - (uint64_t{1} << first));
}

}  // namespace

Status ImageImpl::WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) {
  TD_RETURN_IF_ERROR(ZeroRange(offset, length, flags.may_unmap, flags.fast_only, false));
  if (flags.fua) return Flush();
  return Status::Ok();
}

Status ImageImpl::Discard(uint64_t offset, uint64_t length) {
  return ZeroRange(offset, length, true, false, true);
}

uint64_t ImageImpl::ClusterBytes(uint64_t gc) const {
  return std::min<uint64_t>(cs(), size_.load() - (gc << cluster_bits_));
}

Status ImageImpl::ZeroRange(uint64_t offset, uint64_t length, bool unmap, bool fast_only,
                            bool discard, bool mark) {
  if (read_only_) return Status::ReadOnly(info_.filename + ": image is opened read-only");
  TD_RETURN_IF_ERROR(CheckRange(offset, length));
  if (fast_only) {
    // Only requests that need no data writes qualify.
    uint64_t end = offset + length;
    bool aligned = offset % scs() == 0 && (end % scs() == 0 || end == size_.load());
    if (!aligned || (version_ < 3 && backing_)) {
      return Status::NotSupported("zeroing this range would need data writes");
    }
  }
  if (mark) TD_RETURN_IF_ERROR(MarkChanged(offset, length));
  ChangeDone change_done(mark ? tracker_.get() : nullptr);
  PunchRun run;
  Status s = ZeroPieces(offset, length, unmap || discard, discard, &run);
  // Punched and freed even after an error: the released clusters are no
  // longer mapped, so they would otherwise leak.
  Status p = PunchNow(&run);
  return s.ok() ? p : s;
}

Status ImageImpl::ZeroPieces(uint64_t offset, uint64_t length, bool unmap, bool discard,
                             PunchRun* run) {
  uint64_t done = 0;
  const uint64_t l2_span = l2_entries_ * cs();
  while (done < length) {
    uint64_t pos = offset + done;
    uint64_t gc = pos >> cluster_bits_;
    uint64_t in_off = pos & (cluster_size_ - 1);
    uint64_t len = std::min<uint64_t>(length - done, cluster_size_ - in_off);
    // Whole L2 ranges with no table and nothing below already read as
    // zeros: skip them without touching metadata (mkfs discards whole disks).
    if (pos % l2_span == 0 && length - done >= l2_span && !backing_) {
      util::MutexLock lock(mu_);
      uint64_t l1i = pos / l2_span;
      if (l1i < l1_.size() && L1Offset(l1_[l1i]) == 0) {
        done += l2_span;
        continue;
      }
    }
    auto guard = range_lock_.Lock(gc, 1);
    TD_RETURN_IF_ERROR(ZeroPieceLocked(gc, in_off, len, unmap, discard, run));
    done += len;
  }
  return Status::Ok();
}

Status ImageImpl::QueuePunch(PunchRun* run, const L2Mapping& m) {
  // A run of 4096 clusters (512 MiB at 128 KiB) bounds what it holds.
  constexpr size_t kMaxRun = 4096;
  if (!run->released.empty() && (m.host_offset != run->end || run->released.size() >= kMaxRun))
    TD_RETURN_IF_ERROR(PunchNow(run));
  if (run->released.empty()) run->start = run->end = m.host_offset;
  run->end += cs();
  run->released.push_back(m);
  return Status::Ok();
}

Status ImageImpl::PunchHost(uint64_t offset, uint64_t length) {
  storage_->Announce(io::Event::kDiscardPunch);
  Status p = storage_->PunchHole(offset, length);
  return p.code() == Code::kNotSupported ? Status::Ok() : p;
}

Status ImageImpl::PunchNow(PunchRun* run) {
  if (run->released.empty()) return Status::Ok();
  Status p = PunchHost(run->start, run->end - run->start);
  std::vector<L2Mapping> released;
  released.swap(run->released);
  // A failed punch leaves the clusters unfreed (leaked, never reused with
  // their old bytes); `check -r leaks` reclaims them.
  TD_RETURN_IF_ERROR(p);
  util::MutexLock lock(mu_);
  for (const L2Mapping& m : released) FreeMappingLocked(m);
  return Status::Ok();
}

Status ImageImpl::ZeroPieceLocked(uint64_t gc, uint64_t in_off, uint64_t len, bool unmap,
                                  bool /*discard*/, PunchRun* run) {
  L2Mapping m;
  {
    util::MutexLock lock(mu_);
    TD_ASSIGN_OR_RETURN(m, LookupLoadingUnlocked(gc));
  }
  const uint64_t cluster_bytes = ClusterBytes(gc);
  const bool whole = in_off == 0 && len >= cluster_bytes;
  const bool owned = m.kind == ClusterKind::kNormal && m.copied;

  // A piece that must be written as zeros, unless it already reads as zeros.
  auto write_zeros = [&](uint64_t from, uint64_t n) -> Status {
    L2Mapping cur;
    {
      util::MutexLock lock(mu_);
      TD_ASSIGN_OR_RETURN(cur, LookupLoadingUnlocked(gc));
    }
    bool reads_zero = true;
    for (uint64_t s = from / scs(); s <= (from + n - 1) / scs(); ++s) {
      SubState st = StateOf(cur, uint32_t(s));
      reads_zero = reads_zero && (st == SubState::kZero ||
                                  (st == SubState::kUnallocated && !BackingCovers(gc)));
    }
    if (reads_zero) return Status::Ok();
    return WritePieceLocked(gc, from, n, nullptr);
  };

  if (whole) {
    if (version_ < 3 && BackingCovers(gc)) {
      // Version 2 has no zero flag: a clone gets zeros written.
      return write_zeros(0, cluster_bytes);
    }
    L2Mapping n;  // unallocated: right when nothing below shows through
    // Version 2 has no zero flag: without backing data below, unallocated
    // reads as zeros.
    bool keep = !unmap && owned && version_ >= 3;
    if (keep) {
      n = m;
      if (extended_) {
        n.alloc_bitmap = 0;
        n.zero_bitmap = AllSubclusters();
      } else {
        n.kind = ClusterKind::kZero;  // keeps its host cluster preallocated
      }
    } else if (BackingCovers(gc)) {
      if (extended_) {
        n.zero_bitmap = AllSubclusters();
      } else {
        n.kind = ClusterKind::kZero;
      }
    }
    bool unchanged = n.kind == m.kind && n.host_offset == m.host_offset &&
                     n.alloc_bitmap == m.alloc_bitmap && n.zero_bitmap == m.zero_bitmap;
    if (unchanged) return Status::Ok();  // already reads as zeros, nothing to free
    {
      util::MutexLock lock(mu_);
      TD_RETURN_IF_ERROR(SetMappingLocked(gc, n));
    }
    if (keep) return Status::Ok();
    // Nothing in memory points at the old cluster now. Release its space
    // before its free is queued, so the free can never be applied (and the
    // cluster reused) before the punch: the run punches, then frees. A
    // shared or compressed host cluster is not ours to punch.
    bool ours = (m.kind == ClusterKind::kNormal || m.kind == ClusterKind::kZero) && m.copied &&
                m.host_offset != 0;
    if (ours) return QueuePunch(run, m);
    util::MutexLock lock(mu_);
    FreeMappingLocked(m);
    return Status::Ok();
  }

  if (!extended_) return write_zeros(in_off, len);

  // Extended L2, part of a cluster: whole subclusters get zero bits, the
  // partial ones at either end are written as zeros.
  uint64_t end = in_off + len;
  uint64_t full_start = (in_off + scs() - 1) / scs() * scs();
  uint64_t full_end = end == cluster_bytes ? (end + scs() - 1) / scs() * scs() : end / scs() * scs();
  if (m.kind == ClusterKind::kUnallocated && !BackingCovers(gc)) {
    return Status::Ok();  // reads as zeros already; no table needed
  }
  bool bits_ok = m.kind == ClusterKind::kUnallocated || owned;
  if (full_start >= full_end || !bits_ok) return write_zeros(in_off, len);

  uint32_t mask = SubMask(uint32_t(full_start / scs()), uint32_t(full_end / scs() - 1));
  L2Mapping n = m;
  bool had_data = (m.alloc_bitmap & mask) != 0;
  n.alloc_bitmap &= ~mask;
  n.zero_bitmap |= mask;
  {
    util::MutexLock lock(mu_);
    TD_RETURN_IF_ERROR(SetMappingLocked(gc, n));
  }
  if (unmap && had_data) {
    // Space comes back at subcluster grain; the cluster itself stays ours.
    uint64_t punch_end = std::min(full_end, cs());
    TD_RETURN_IF_ERROR(PunchHost(m.host_offset + full_start, punch_end - full_start));
  }
  if (in_off < full_start) TD_RETURN_IF_ERROR(write_zeros(in_off, full_start - in_off));
  if (end > full_end) TD_RETURN_IF_ERROR(write_zeros(full_end, end - full_end));
  return Status::Ok();
}

}  // namespace thindisk::qcow2
