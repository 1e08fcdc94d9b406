// Grow with preallocation (qemu-img resize --preallocation=MODE).
//
//  1. Resize grows the image first (the grown range reads as zeros).
//  2. In batches of guest clusters, each held with the range lock so no
//     writer races it: the clusters with no host cluster that can take one
//     without changing what they read (PreallocatableLocked) get one.
//  3. That host space reads as zeros before anything maps it: the file is
//     extended over it (sparse), space reused from freed clusters is
//     overwritten with zeros, then falloc reserves and full writes zeros.
//  4. The mappings change in memory; the ordered flush makes the zeros and
//     the raised refcounts durable before the L2 entries (docs/engine.md).
#include <algorithm>
#include <vector>

#include "io/zero_fill.h"
#include "qcow2/image_impl.h"
#include "qcow2/preallocate.h"

namespace thindisk::qcow2 {
namespace {

// Guest clusters per batch: bounds the range lock's span and the memory
// of one batch (128 MiB of guest space with 128 KiB clusters).
constexpr uint64_t kBatchClusters = 1024;

}  // namespace

bool ImageImpl::PreallocatableLocked(uint64_t gc, const L2Mapping& m) const {
  if (m.host_offset != 0 || m.kind == ClusterKind::kCompressed) return false;
  if (extended_) {
    // Unallocated and zero subclusters read the same with a host cluster
    // reserved behind them (qemu's "unallocated, allocated host" state).
    return m.alloc_bitmap == 0;
  }
  // Standard L2: the cluster becomes data reading its zero-filled host
  // cluster, so it must read zeros now (zero flag, or nothing below it).
  return m.kind == ClusterKind::kZero ||
         (m.kind == ClusterKind::kUnallocated && !BackingCovers(gc));
}

Status ImageImpl::PreallocateBatch(uint64_t first, uint64_t count, Preallocation mode,
                                   std::string* warning) {
  // 2. Which clusters, and a host cluster for each. One at a time: a long
  // contiguous run would have to step over the refcount blocks that small
  // clusters need every few hundred clusters. Consecutive ones are merged
  // into runs for step 3.
  struct Planned {
    uint64_t gc;
    L2Mapping m;
  };
  struct Run {
    uint64_t offset, length;
    bool fresh;
  };
  std::vector<Planned> todo;
  std::vector<Run> runs;
  {
    util::MutexLock lock(mu_);
    for (uint64_t gc = first; gc < first + count; ++gc) {
      TD_ASSIGN_OR_RETURN(L2Mapping m, LookupLocked(gc));
      if (!PreallocatableLocked(gc, m)) continue;
      TD_ASSIGN_OR_RETURN(Allocator::Allocation a, allocator_->AllocateClusters(1));
      m.kind = ClusterKind::kNormal;  // extended: the subclusters' bits still apply
      m.host_offset = a.offset;
      m.copied = true;
      todo.push_back({gc, m});
      if (!runs.empty() && runs.back().fresh == a.fresh &&
          runs.back().offset + runs.back().length == a.offset) {
        runs.back().length += cs();
      } else {
        runs.push_back({a.offset, cs(), a.fresh});
      }
    }
  }
  if (todo.empty()) return Status::Ok();
  // 3. Zero-reading host space, then the mode's reservation.
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage_->Size());
  for (const Run& r : runs) {
    if (file_size < r.offset + r.length) {
      file_size = r.offset + r.length;
      TD_RETURN_IF_ERROR(storage_->Resize(file_size));
    }
    if (!r.fresh) {
      // Freed clusters keep their old bytes: standard L2 would read them.
      TD_RETURN_IF_ERROR(io::WriteZeroBytes(*storage_, r.offset, r.length));
    } else {
      TD_RETURN_IF_ERROR(PreallocateHostRange(*storage_, r.offset, r.length, mode, warning));
    }
  }
  // 4. Map them.
  util::MutexLock lock(mu_);
  for (const Planned& p : todo) TD_RETURN_IF_ERROR(SetMappingLocked(p.gc, p.m));
  return Status::Ok();
}

Status ImageImpl::GrowPreallocated(uint64_t new_size, Preallocation mode, std::string* warning) {
  const uint64_t old_size = size_.load();
  if (new_size < old_size) {
    return Status::InvalidArgument("preallocation cannot be used when shrinking an image");
  }
  // 1. Grow (checks read-only, limits; flushes).
  TD_RETURN_IF_ERROR(Resize(new_size, false));
  if (mode == Preallocation::kOff || new_size == old_size) return Status::Ok();
  util::MutexLock flush_lock(flush_mu_);
  const uint64_t end = std::min(new_size, size_.load());  // a racing shrink wins
  const uint64_t end_gc = (end + cs() - 1) >> cluster_bits_;
  for (uint64_t gc = old_size >> cluster_bits_; gc < end_gc;) {
    uint64_t n = std::min(kBatchClusters, end_gc - gc);
    {
      auto guard = range_lock_.Lock(gc, n);
      TD_RETURN_IF_ERROR(PreallocateBatch(gc, n, mode, warning));
    }
    gc += n;
  }
  return FlushAll();
}

}  // namespace thindisk::qcow2
