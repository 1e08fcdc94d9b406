// Write path: in place, or into a newly allocated cluster, copying only
// what must be copied (docs/engine.md "Writes").
#include <algorithm>
#include <cstring>

#include "qcow2/image_impl.h"

namespace thindisk::qcow2 {
namespace {

// Bits first..last (inclusive) of a subcluster bitmap.
uint32_t SubMask(uint32_t first, uint32_t last) {
  uint64_t bits = (uint64_t{1} << (last + 1)) - (uint64_t{1} << first);
  return uint32_t(bits);
}

}  // namespace

Status ImageImpl::Write(uint64_t offset, std::span<const uint8_t> buf, block::WriteFlags flags) {
  if (read_only_) return Status::ReadOnly(info_.filename + ": image is opened read-only");
  TD_RETURN_IF_ERROR(CheckRange(offset, buf.size()));
  TD_RETURN_IF_ERROR(MarkChanged(offset, buf.size()));
  ChangeDone change_done(tracker_.get());
  uint64_t done = 0;
  while (done < buf.size()) {
    uint64_t pos = offset + done;
    uint64_t gc = pos >> cluster_bits_;
    uint64_t in_off = pos & (cluster_size_ - 1);
    const uint64_t whole = in_off == 0 ? (buf.size() - done) >> cluster_bits_ : 0;
    if (whole >= 2) {
      TD_ASSIGN_OR_RETURN(uint64_t n, WriteFreshRun(gc, whole, buf.data() + done));
      if (n > 0) {
        done += n << cluster_bits_;
        continue;
      }
    }
    uint64_t len = std::min<uint64_t>(buf.size() - done, cluster_size_ - in_off);
    auto guard = range_lock_.Lock(gc, 1);
    TD_RETURN_IF_ERROR(WritePieceLocked(gc, in_off, len, buf.data() + done));
    done += len;
  }
  if (flags.fua) return Flush();
  return Status::Ok();
}

Result<uint64_t> ImageImpl::WriteFreshRun(uint64_t gc, uint64_t count, const uint8_t* src) {
  auto guard = range_lock_.Lock(gc, count);
  // The leading clusters that hold no host space: unallocated (whatever
  // their subclusters or the backing file say: every byte is overwritten)
  // or zero without kept space. Each gets a host cluster as the
  // per-cluster path would give it (its data cluster, then the L2 table
  // if it has none yet), so the layout does not depend on how the guest
  // cut its writes.
  std::vector<uint64_t> hosts;
  auto give_back = [&](size_t from) TD_REQUIRES(mu_) {
    for (size_t i = from; i < hosts.size(); ++i) allocator_->DeferFree(hosts[i], 1);
  };
  {
    util::MutexLock lock(mu_);
    uint64_t n = 0;
    for (; n < count; ++n) {
      TD_ASSIGN_OR_RETURN(L2Mapping m, LookupLoadingUnlocked(gc + n));
      const bool no_space = m.kind == ClusterKind::kUnallocated ||
                            (m.kind == ClusterKind::kZero && m.host_offset == 0);
      if (!no_space) break;
    }
    if (n < 2) return uint64_t{0};  // the per-cluster path does it
    for (uint64_t i = 0; i < n; ++i) {
      // The range lock keeps the run's mappings while the lock is let go.
      Status loaded = LoadAllocationBlocksUnlocked();
      if (!loaded.ok()) {
        give_back(0);
        return loaded;
      }
      Result<Allocator::Allocation> a = allocator_->AllocateClusters(1);
      if (!a.has_value()) {
        give_back(0);
        return a.status();
      }
      hosts.push_back(a->offset);
      Result<std::shared_ptr<Table>> table = WritableL2Locked(gc + i);
      if (!table.has_value()) {
        give_back(0);
        return table.status();
      }
    }
  }
  // Rule: the data is in place before any L2 entry points at it (a new
  // L2 table above holds no entry for it until SetMappingLocked below).
  Status s;
  for (size_t i = 0; i < hosts.size() && s.ok();) {
    size_t j = i + 1;
    while (j < hosts.size() && hosts[j] == hosts[j - 1] + cluster_size_) ++j;
    storage_->Announce(io::Event::kDataWrite);
    s = storage_->WriteAt(hosts[i], std::span<const uint8_t>(src + (i << cluster_bits_),
                                                             (j - i) << cluster_bits_));
    i = j;
  }
  util::MutexLock lock(mu_);
  size_t mapped = 0;
  for (; s.ok() && mapped < hosts.size(); ++mapped) {
    L2Mapping m;
    m.kind = ClusterKind::kNormal;
    m.host_offset = hosts[mapped];
    m.copied = true;
    m.alloc_bitmap = extended_ ? AllSubclusters() : 0;
    s = SetMappingLocked(gc + mapped, m);
    if (!s.ok()) break;
  }
  if (!s.ok()) {
    // Clusters already mapped keep their (written) data; the rest goes back.
    give_back(mapped);
    return s;
  }
  return uint64_t{hosts.size()};
}

Status ImageImpl::WritePieceLocked(uint64_t gc, uint64_t in_off, uint64_t len,
                                   const uint8_t* src) {
  L2Mapping m;
  {
    util::MutexLock lock(mu_);
    TD_ASSIGN_OR_RETURN(m, LookupLoadingUnlocked(gc));
  }
  if (m.kind == ClusterKind::kNormal && m.copied) return WriteInPlace(gc, m, in_off, len, src);
  if (m.kind == ClusterKind::kZero && m.copied && m.host_offset != 0) {
    // A zeroed cluster that kept its host space: fill it in place.
    std::vector<uint8_t> buf;
    TD_RETURN_IF_ERROR(BuildContent(gc, m, 0, cs(), in_off, len, src, &buf));
    storage_->Announce(io::Event::kCowWrite);
    TD_RETURN_IF_ERROR(storage_->WriteAt(m.host_offset, buf));
    L2Mapping n = m;
    n.kind = ClusterKind::kNormal;
    util::MutexLock lock(mu_);
    return SetMappingLocked(gc, n);
  }
  return WriteAllocating(gc, m, in_off, len, src);
}

Status ImageImpl::BuildContent(uint64_t gc, const L2Mapping& m, uint64_t start, uint64_t end,
                               uint64_t in_off, uint64_t len, const uint8_t* src,
                               std::vector<uint8_t>* out) {
  out->resize(end - start);
  std::span<uint8_t> buf(*out);
  if (in_off > start || end > in_off + len) storage_->Announce(io::Event::kCowRead);
  if (in_off > start) {
    TD_RETURN_IF_ERROR(ReadWithMapping(gc, m, start, buf.first(in_off - start)));
  }
  if (src) {
    std::memcpy(buf.data() + (in_off - start), src, len);
  } else {
    std::memset(buf.data() + (in_off - start), 0, len);
  }
  if (end > in_off + len) {
    TD_RETURN_IF_ERROR(ReadWithMapping(gc, m, in_off + len, buf.subspan(in_off + len - start)));
  }
  return Status::Ok();
}

Status ImageImpl::WriteInPlace(uint64_t gc, const L2Mapping& m, uint64_t in_off, uint64_t len,
                               const uint8_t* src) {
  uint64_t start = in_off;
  uint64_t end = in_off + len;
  uint32_t first = uint32_t(in_off / scs());
  uint32_t last = uint32_t((end - 1) / scs());
  if (extended_) {
    // A subcluster that held no data gets its uncovered head and tail
    // filled (zeros or backing data) before it is marked allocated, unless
    // its host bytes lie past the end of the file and zeros are what it
    // must read as: then they already do (a dd-style run of 1 KiB writes
    // costs 1 KiB each, not a 4 KiB fill per subcluster).
    auto past_eof = [&](uint32_t sub) {
      Result<uint64_t> size = storage_->Size();
      return size.has_value() && *size <= m.host_offset + uint64_t(sub) * scs();
    };
    // (Asked only when the write leaves part of the subcluster uncovered:
    // the file size costs a system call.)
    const uint64_t head = uint64_t(first) * scs();
    const uint64_t tail = std::min<uint64_t>(uint64_t(last + 1) * scs(), cs());
    if (start > head && StateOf(m, first) != SubState::kData &&
        !FillNeedless(gc, m, first, past_eof(first))) {
      start = head;
    }
    if (end < tail && StateOf(m, last) != SubState::kData &&
        !FillNeedless(gc, m, last, past_eof(last))) {
      end = tail;
    }
  }
  if (src && start == in_off && end == in_off + len) {
    storage_->Announce(io::Event::kDataWrite);
    TD_RETURN_IF_ERROR(storage_->WriteAt(m.host_offset + start, std::span(src, len)));
  } else {
    std::vector<uint8_t> buf;
    TD_RETURN_IF_ERROR(BuildContent(gc, m, start, end, in_off, len, src, &buf));
    storage_->Announce(io::Event::kCowWrite);
    TD_RETURN_IF_ERROR(storage_->WriteAt(m.host_offset + start, buf));
  }
  if (!extended_) return Status::Ok();
  uint32_t mask = SubMask(first, last);
  if ((m.alloc_bitmap & mask) == mask && (m.zero_bitmap & mask) == 0) return Status::Ok();
  // Publish only now that the data is in place.
  L2Mapping n = m;
  n.alloc_bitmap |= mask;
  n.zero_bitmap &= ~mask;
  util::MutexLock lock(mu_);
  return SetMappingLocked(gc, n);
}

bool ImageImpl::FillNeedless(uint64_t gc, const L2Mapping& m, uint32_t sub, bool host_zero) const {
  if (!host_zero) return false;
  SubState state = StateOf(m, sub);
  return state == SubState::kZero || (state == SubState::kUnallocated && !BackingCovers(gc));
}

Status ImageImpl::WriteAllocating(uint64_t gc, const L2Mapping& m, uint64_t in_off, uint64_t len,
                                  const uint8_t* src) {
  Allocator::Allocation a;
  {
    util::MutexLock lock(mu_);
    TD_RETURN_IF_ERROR(LoadAllocationBlocksUnlocked());
    TD_ASSIGN_OR_RETURN(a, allocator_->AllocateClusters(1));
  }
  L2Mapping n;
  n.kind = ClusterKind::kNormal;
  n.host_offset = a.offset;
  n.copied = true;
  uint64_t start = 0;
  uint64_t end = cs();
  bool plain_old = m.kind == ClusterKind::kUnallocated || m.kind == ClusterKind::kZero;
  if (extended_ && plain_old) {
    // Only the touched subclusters are written; the others keep their
    // state (unallocated or zero), so a 4 KiB first write costs 4 KiB.
    uint32_t first = uint32_t(in_off / scs());
    uint32_t last = uint32_t((in_off + len - 1) / scs());
    uint32_t mask = SubMask(first, last);
    // Fresh host space reads as zeros: where the touched subclusters must
    // too, only the new bytes are written.
    start = FillNeedless(gc, m, first, a.fresh) ? in_off : first * scs();
    end = FillNeedless(gc, m, last, a.fresh) ? in_off + len
                                             : std::min<uint64_t>((last + 1) * scs(), cs());
    n.alloc_bitmap = mask;
    uint32_t old_zero = m.kind == ClusterKind::kZero ? AllSubclusters() : m.zero_bitmap;
    n.zero_bitmap = old_zero & ~mask;
  } else if (!extended_ && plain_old && a.fresh &&
             (m.kind == ClusterKind::kZero || !BackingCovers(gc))) {
    // Fresh host space reads as zeros, which is what the rest of the
    // cluster must read as: write just the new bytes.
    start = in_off;
    end = in_off + len;
  } else {
    // Compressed, shared, or reused space under a standard L2 entry: the
    // whole cluster is written, old content around the new bytes.
    n.alloc_bitmap = extended_ ? AllSubclusters() : 0;
  }
  Status s;
  if (src && start == in_off && end == in_off + len) {
    storage_->Announce(io::Event::kDataWrite);
    s = storage_->WriteAt(a.offset + start, std::span<const uint8_t>(src, len));  // no copy
  } else {
    std::vector<uint8_t> buf;
    s = BuildContent(gc, m, start, end, in_off, len, src, &buf);
    if (s.ok()) {
      storage_->Announce(io::Event::kCowWrite);
      s = storage_->WriteAt(a.offset + start, buf);
    }
  }
  util::MutexLock lock(mu_);
  if (s.ok()) s = SetMappingLocked(gc, n);
  if (!s.ok()) {
    allocator_->DeferFree(a.offset, 1);
    return s;
  }
  FreeMappingLocked(m);
  return Status::Ok();
}

}  // namespace thindisk::qcow2
