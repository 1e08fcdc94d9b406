// Internal snapshots (snapshot.h), done with the engine's own caches,
// allocator and ordered flush. The order of every write is
// docs/write-ordering.md "Snapshots"; each step below names its rule.
#include "qcow2/snapshot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <set>

#include "qcow2/image_impl.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// Snapshot table entry layout (spec "Snapshots").
constexpr uint64_t kEntryFixedSize = 40;
// The whole table: QEMU refuses tables larger than 64 MiB; so do we, before
// allocating a buffer for one.
constexpr uint64_t kMaxTableBytes = 64ull << 20;
// Extra data we write: vm_state_size_large, disk_size, icount (qemu 7.2's).
// An icount of all ones means "not recorded".
constexpr size_t kExtraSize = 24;
constexpr size_t kIcountOffset = 16;
constexpr uint64_t kNoIcount = ~0ull;  // "icount not valid"
// Id and name lengths are 16-bit fields.
constexpr size_t kMaxNameBytes = 65535;

struct TableOnDisk {
  std::vector<Snapshot> snapshots;
  uint64_t bytes = 0;  // size of the table as stored
};

Result<TableOnDisk> ReadTable(io::Storage& storage, const Header& h) {
  TableOnDisk t;
  if (h.nb_snapshots == 0) return t;
  if (h.nb_snapshots > kMaxSnapshots) {
    return Status::Corrupt(
        fmt::format("nb_snapshots {} exceeds {}", h.nb_snapshots, kMaxSnapshots));
  }
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage.Size());
  // Entry sizes vary: walk the fixed parts to learn the table size first.
  uint64_t pos = h.snapshots_offset;
  for (uint32_t i = 0; i < h.nb_snapshots; ++i) {
    uint8_t fixed[kEntryFixedSize];
    if (pos - h.snapshots_offset > kMaxTableBytes || pos + kEntryFixedSize > file_size) {
      return Status::Corrupt(
          fmt::format("snapshot table entry {} lies past the end of the file", i));
    }
    TD_RETURN_IF_ERROR(storage.ReadAt(pos, fixed));
    uint64_t len = kEntryFixedSize + uint64_t{LoadBe16(fixed + 12)} +
                   LoadBe16(fixed + 14) + LoadBe32(fixed + 36);
    pos += (len + 7) & ~uint64_t{7};
  }
  t.bytes = pos - h.snapshots_offset;
  if (t.bytes > kMaxTableBytes || pos > file_size + 7) {
    return Status::Corrupt("the snapshot table runs past the end of the file");
  }
  std::vector<uint8_t> raw(t.bytes);
  TD_RETURN_IF_ERROR(storage.ReadAt(h.snapshots_offset, raw));
  TD_ASSIGN_OR_RETURN(t.snapshots,
                      DecodeSnapshotTable(raw, h.nb_snapshots, h.cluster_bits));
  return t;
}

uint64_t ClustersFor(uint64_t bytes, uint64_t cluster_size) {
  return (bytes + cluster_size - 1) / cluster_size;
}

// qemu's lookup: an exact id match first, then a name.
int FindSnapshot(const std::vector<Snapshot>& snaps, const std::string& id_or_name) {
  for (size_t i = 0; i < snaps.size(); ++i) {
    if (snaps[i].id == id_or_name) return int(i);
  }
  for (size_t i = 0; i < snaps.size(); ++i) {
    if (snaps[i].name == id_or_name) return int(i);
  }
  return -1;
}

std::string NextId(const std::vector<Snapshot>& snaps) {
  uint64_t max_id = 0;
  for (const Snapshot& s : snaps)
    max_id = std::max<uint64_t>(max_id, strtoull(s.id.c_str(), nullptr, 10));
  return std::to_string(max_id + 1);
}

}  // namespace

std::optional<uint64_t> SnapshotIcount(const Snapshot& s) {
  if (s.extra.size() < kIcountOffset + 8) return std::nullopt;
  uint64_t v = LoadBe64(&s.extra[kIcountOffset]);
  if (v == kNoIcount) return std::nullopt;
  return v;
}

int MatchSnapshot(const std::vector<Snapshot>& snaps, const SnapshotSelector& sel) {
  if (!sel.id_or_name.empty()) return FindSnapshot(snaps, sel.id_or_name);
  if (sel.empty()) return -1;
  for (size_t i = 0; i < snaps.size(); ++i) {
    if ((sel.id.empty() || snaps[i].id == sel.id) &&
        (sel.name.empty() || snaps[i].name == sel.name))
      return int(i);
  }
  return -1;
}

Result<std::vector<Snapshot>> ReadSnapshotTable(io::Storage& storage, const Header& h) {
  TD_ASSIGN_OR_RETURN(TableOnDisk t, ReadTable(storage, h));
  return std::move(t.snapshots);
}

// Friend of ImageImpl: the snapshot operations, on the engine's state.
class SnapshotEditor {
 public:
  explicit SnapshotEditor(ImageImpl& img) : img_(img) {}

  Result<std::vector<Snapshot>> List() {
    util::MutexLock lock(img_.mu_);
    return ReadSnapshotTable(*img_.storage_, img_.header_);
  }

  Status Create(const SnapshotCreateOptions& o);
  Status Apply(const std::string& id_or_name);
  Status Delete(const std::string& id_or_name);

 private:
  Status CheckWritable() const;
  // The dirty bit (version 3 only) covers windows in which refcounts and
  // COPIED flags disagree on disk. Written and synced.
  Status SetDirtyLocked(bool dirty) TD_REQUIRES(img_.mu_);
  // Reads and validates an L1 table.
  Result<std::vector<uint64_t>> ReadL1(uint64_t offset, uint32_t entries)
      TD_REQUIRES(img_.mu_);
  // Calls fn(host_offset, clusters) for every L2 table reachable from `l1`
  // and every host cluster range its entries use (a compressed cluster: each
  // host cluster its bytes touch, as check counts them).
  template <typename Fn>
  Status ForEachReference(const std::vector<uint64_t>& l1, Fn fn) TD_REQUIRES(img_.mu_);
  // Sets QCOW_OFLAG_COPIED on L1 entries of `l1` and the entries of their L2
  // tables exactly where the refcount is 1; changed L1 indices go to
  // `changed_l1` (may be null).
  Status FixCopiedLocked(std::vector<uint64_t>& l1, std::set<uint64_t>* changed_l1)
      TD_REQUIRES(img_.mu_);
  // Allocates clusters for `table`; returns the offset (0 when empty). The
  // allocation is durable only after the next FlushMetadataLocked.
  Result<uint64_t> AllocateTable(const std::vector<uint8_t>& table) TD_REQUIRES(img_.mu_);
  // Writes `bytes` at `offset`, announced as a snapshot_table step.
  Status WriteSnapshotStep(uint64_t offset, const std::vector<uint8_t>& bytes);
  // After FlushAll applied frees: write the lowered refcounts.
  Status FlushFrees() TD_REQUIRES(img_.flush_mu_);
  // One header write naming the snapshot table at `offset` with `nb`
  // entries, the dirty bit set as `dirty` (version 3), then a sync. On
  // failure the in-memory header is left as it was, since the disk may still
  // hold the old one.
  Status SwitchTableLocked(uint64_t offset, uint32_t nb, bool dirty)
      TD_REQUIRES(img_.mu_);

  ImageImpl& img_;
};

Status SnapshotEditor::CheckWritable() const {
  if (img_.closed_.load()) return Status::InvalidArgument("image is closed");
  if (img_.read_only_) {
    return Status::ReadOnly(img_.info_.filename + ": image is opened read-only");
  }
  util::MutexLock lock(img_.mu_);
  if (img_.header_.refcount_order == 0) {
    return Status::NotSupported(
        img_.info_.filename +
        ": refcount_bits=1 cannot count clusters shared with a snapshot");
  }
  return Status::Ok();
}

Status SnapshotEditor::SetDirtyLocked(bool dirty) {
  if (img_.header_.version < 3) return Status::Ok();
  uint64_t f = img_.header_.incompatible_features;
  uint64_t want = dirty ? (f | kIncompatDirty) : (f & ~kIncompatDirty);
  if (want == f) return Status::Ok();
  img_.header_.incompatible_features = want;
  TD_RETURN_IF_ERROR(img_.WriteHeaderLocked());
  return img_.storage_->Flush();
}

Result<std::vector<uint64_t>> SnapshotEditor::ReadL1(uint64_t offset, uint32_t entries) {
  std::vector<uint64_t> l1(entries);
  if (entries == 0) return l1;
  const uint64_t cs = img_.cs();
  if (offset == 0 || (offset & (cs - 1)) ||
      offset + uint64_t{entries} * 8 > img_.allocator_->host_end()) {
    return Status::Corrupt(
        fmt::format("snapshot L1 table at {:#x} lies outside the file", offset));
  }
  std::vector<uint8_t> raw(uint64_t{entries} * 8);
  TD_RETURN_IF_ERROR(img_.storage_->ReadAt(offset, raw));
  for (uint32_t i = 0; i < entries; ++i) {
    uint64_t e = LoadBe64(&raw[uint64_t{i} * 8]);
    uint64_t l2 = L1Offset(e);
    if ((e & kL1Reserved) || (l2 != 0 && ((l2 & (cs - 1)) || l2 < cs ||
                                          l2 + cs > img_.allocator_->host_end()))) {
      return Status::Corrupt(fmt::format(
          "snapshot L1 table at {:#x}: entry {} ({:#x}) is invalid", offset, i, e));
    }
    l1[i] = e;
  }
  return l1;
}

template <typename Fn>
Status SnapshotEditor::ForEachReference(const std::vector<uint64_t>& l1, Fn fn) {
  const uint32_t bits = img_.cluster_bits_;
  const uint64_t cs = img_.cs();
  for (uint64_t i = 0; i < l1.size(); ++i) {
    uint64_t l2 = L1Offset(l1[i]);
    if (l2 == 0) continue;
    if ((l2 & (cs - 1)) || l2 < cs || l2 + cs > img_.allocator_->host_end()) {
      return Status::Corrupt(
          fmt::format("L1 entry {} points at {:#x}, outside the file", i, l2));
    }
    TD_RETURN_IF_ERROR(fn(l2, uint64_t{1}));
    std::shared_ptr<Table> slice;
    for (uint64_t k = 0; k < img_.l2_entries_; ++k) {
      if (k % img_.l2_slice_entries_ == 0) {
        TD_ASSIGN_OR_RETURN(slice, img_.L2SliceLocked(l2, k));
      }
      const uint8_t* p = &slice->data[img_.L2SliceByte(k)];
      uint64_t bitmap = img_.extended_ ? LoadBe64(p + 8) : 0;
      auto m = DecodeL2Entry(LoadBe64(p), bitmap, img_.extended_, bits);
      if (!m) return m.error().WithContext(fmt::format("L2 table {:#x} entry {}", l2, k));
      TD_RETURN_IF_ERROR(img_.ValidateMapping(i * img_.l2_entries_ + k, *m));
      if (m->kind == ClusterKind::kCompressed) {
        uint64_t first = m->host_offset >> bits;
        uint64_t last =
            (m->host_offset + std::max<uint64_t>(m->compressed_size, 1) - 1) >> bits;
        TD_RETURN_IF_ERROR(fn(first << bits, last - first + 1));
      } else if (m->kind != ClusterKind::kUnallocated && m->host_offset != 0) {
        TD_RETURN_IF_ERROR(fn(m->host_offset, uint64_t{1}));
      }
    }
  }
  return Status::Ok();
}

Status SnapshotEditor::FixCopiedLocked(std::vector<uint64_t>& l1,
                                       std::set<uint64_t>* changed_l1) {
  Allocator& alloc = *img_.allocator_;
  for (uint64_t i = 0; i < l1.size(); ++i) {
    uint64_t l2 = L1Offset(l1[i]);
    if (l2 == 0) continue;
    TD_ASSIGN_OR_RETURN(uint64_t rc, alloc.GetRefcount(l2));
    uint64_t want = rc == 1 ? kCopied : 0;
    if ((l1[i] & kCopied) != want) {
      l1[i] = (l1[i] & ~kCopied) | want;
      if (changed_l1) changed_l1->insert(i);
    }
    std::shared_ptr<Table> slice;
    for (uint64_t k = 0; k < img_.l2_entries_; ++k) {
      if (k % img_.l2_slice_entries_ == 0) {
        TD_ASSIGN_OR_RETURN(slice, img_.L2SliceLocked(l2, k));
      }
      uint8_t* p = &slice->data[img_.L2SliceByte(k)];
      uint64_t entry = LoadBe64(p);
      uint64_t bitmap = img_.extended_ ? LoadBe64(p + 8) : 0;
      auto m = DecodeL2Entry(entry, bitmap, img_.extended_, img_.cluster_bits_);
      if (!m) return m.error().WithContext(fmt::format("L2 table {:#x} entry {}", l2, k));
      // Compressed and unallocated entries never carry the flag (the codec
      // refuses a compressed one that does).
      if (m->kind == ClusterKind::kCompressed || m->host_offset == 0) continue;
      TD_ASSIGN_OR_RETURN(uint64_t data_rc, alloc.GetRefcount(m->host_offset));
      uint64_t want_data = data_rc == 1 ? kCopied : 0;
      if ((entry & kCopied) != want_data) {
        StoreBe64(p, (entry & ~kCopied) | want_data);
        img_.l2_cache_->MarkDirty(*slice, img_.L2SliceByte(k), img_.l2_entry_size_);
      }
    }
  }
  return Status::Ok();
}

Result<uint64_t> SnapshotEditor::AllocateTable(const std::vector<uint8_t>& table) {
  if (table.empty()) return uint64_t{0};
  TD_ASSIGN_OR_RETURN(
      auto a, img_.allocator_->AllocateClusters(ClustersFor(table.size(), img_.cs())));
  return a.offset;
}

Status SnapshotEditor::WriteSnapshotStep(uint64_t offset,
                                         const std::vector<uint8_t>& bytes) {
  if (bytes.empty()) return Status::Ok();
  img_.storage_->Announce(io::Event::kSnapshotTable);
  return img_.storage_->WriteAt(offset, bytes);
}

Status SnapshotEditor::FlushFrees() {
  TD_RETURN_IF_ERROR(img_.FlushAll());  // stage 5: refcounts lowered in memory
  util::MutexLock lock(img_.mu_);
  return img_.FlushMetadataLocked();
}

Status SnapshotEditor::SwitchTableLocked(uint64_t offset, uint32_t nb, bool dirty) {
  Header& h = img_.header_;
  const Header old = h;
  h.snapshots_offset = offset;
  h.nb_snapshots = nb;
  if (h.version >= 3) {
    h.incompatible_features = dirty ? (h.incompatible_features | kIncompatDirty)
                                    : (h.incompatible_features & ~kIncompatDirty);
  }
  Status s = img_.WriteHeaderLocked();
  if (s.ok()) s = img_.storage_->Flush();
  if (!s.ok()) h = old;
  return s;
}

Status SnapshotEditor::Create(const SnapshotCreateOptions& o) {
  TD_RETURN_IF_ERROR(CheckWritable());
  if (o.name.empty()) return Status::InvalidArgument("a snapshot needs a name");
  if (o.name.size() > kMaxNameBytes)
    return Status::InvalidArgument("snapshot name is too long");
  util::MutexLock flush_lock(img_.flush_mu_);
  TD_RETURN_IF_ERROR(img_.FlushAll());
  {
    util::MutexLock lock(img_.mu_);
    TD_ASSIGN_OR_RETURN(TableOnDisk old, ReadTable(*img_.storage_, img_.header_));
    std::vector<Snapshot> snaps = old.snapshots;
    for (const Snapshot& s : snaps) {
      if (s.name == o.name) {
        return Status::InvalidArgument(
            fmt::format("a snapshot named '{}' already exists (id {})", o.name, s.id));
      }
    }
    if (snaps.size() >= kMaxSnapshots) {
      return Status::InvalidArgument(
          fmt::format("the image already has {} snapshots", snaps.size()));
    }
    Snapshot sn;
    sn.id = NextId(snaps);
    sn.name = o.name;
    sn.date_sec = o.date_sec;
    sn.date_nsec = o.date_nsec;
    if (sn.date_sec == 0 && sn.date_nsec == 0) {
      timespec now{};
      clock_gettime(CLOCK_REALTIME, &now);
      sn.date_sec = uint32_t(now.tv_sec);
      sn.date_nsec = uint32_t(now.tv_nsec);
    }
    sn.disk_size = img_.size_.load();
    sn.l1_size = uint32_t(img_.l1_.size());
    // icount 0, as qemu-img writes it (no guest ran, so no instructions).
    sn.extra.assign(kExtraSize, 0);

    // 1. Refcounts and COPIED flags are about to disagree on disk.
    TD_RETURN_IF_ERROR(SetDirtyLocked(true));
    // 2. In memory: the L1 copy's clusters, one more reference to every
    //    cluster the active L1 reaches, COPIED cleared where now shared,
    //    and the new table's clusters.
    std::vector<uint8_t> l1_copy(uint64_t{sn.l1_size} * 8);
    for (uint64_t i = 0; i < img_.l1_.size(); ++i)
      StoreBe64(&l1_copy[i * 8], img_.l1_[i] & ~kCopied);
    TD_ASSIGN_OR_RETURN(sn.l1_table_offset, AllocateTable(l1_copy));
    l1_copy.resize(ClustersFor(l1_copy.size(), img_.cs()) * img_.cs(), 0);
    TD_RETURN_IF_ERROR(
        ForEachReference(img_.l1_, [&](uint64_t off, uint64_t n) TD_REQUIRES(img_.mu_) {
          return img_.allocator_->AddRefcount(off, n, +1);
        }));
    TD_RETURN_IF_ERROR(FixCopiedLocked(img_.l1_, &img_.l1_dirty_));
    snaps.push_back(sn);
    std::vector<uint8_t> table = EncodeSnapshotTable(snaps);
    TD_ASSIGN_OR_RETURN(uint64_t table_offset, AllocateTable(table));
    // 3. Rule: a refcount is raised before anything points at the cluster
    //    (stage 1), then the active L2 tables and L1 lose COPIED (3, 4).
    TD_RETURN_IF_ERROR(img_.FlushMetadataLocked());
    // 4. The L1 copy and the new table, durable before the header names them.
    TD_RETURN_IF_ERROR(WriteSnapshotStep(sn.l1_table_offset, l1_copy));
    TD_RETURN_IF_ERROR(WriteSnapshotStep(table_offset, table));
    TD_RETURN_IF_ERROR(img_.storage_->Flush());
    // 5. One header write switches to the new table and clears dirty.
    const uint64_t old_offset = img_.header_.snapshots_offset;
    TD_RETURN_IF_ERROR(SwitchTableLocked(table_offset, uint32_t(snaps.size()), false));
    // 6. Rule: a refcount is lowered only after nothing points at it.
    if (old.bytes != 0)
      img_.allocator_->DeferFree(old_offset, ClustersFor(old.bytes, img_.cs()));
  }
  return FlushFrees();
}

Status SnapshotEditor::Apply(const std::string& id_or_name) {
  TD_RETURN_IF_ERROR(CheckWritable());
  util::MutexLock flush_lock(img_.flush_mu_);
  TD_RETURN_IF_ERROR(img_.FlushAll());
  {
    util::MutexLock lock(img_.mu_);
    if (!img_.bitmap_dir_.empty()) {
      // The whole disk would change under them; qemu refuses the same.
      return Status::NotSupported(
          "cannot revert to a snapshot while the image has persistent bitmaps: remove them "
          "first (thindisk bitmap --remove IMAGE NAME)");
    }
    TD_ASSIGN_OR_RETURN(TableOnDisk t, ReadTable(*img_.storage_, img_.header_));
    int idx = FindSnapshot(t.snapshots, id_or_name);
    if (idx < 0)
      return Status::NotFound(fmt::format("no snapshot '{}' in the image", id_or_name));
    const Snapshot& sn = t.snapshots[size_t(idx)];
    // Without the disk_size field (old version 2 images) the size stays.
    uint64_t disk_size = sn.extra.size() >= 16 ? sn.disk_size : img_.size_.load();
    uint64_t per_l1 = img_.l2_entries_ * img_.cs();
    uint64_t needed = disk_size / per_l1 + (disk_size % per_l1 != 0);
    if (disk_size > kMaxVirtualSize || needed * 8 > kMaxL1Bytes) {
      return Status::Corrupt(
          fmt::format("snapshot {} has an invalid disk size {}", sn.id, disk_size));
    }
    TD_ASSIGN_OR_RETURN(std::vector<uint64_t> l1, ReadL1(sn.l1_table_offset, sn.l1_size));
    for (uint64_t& e : l1) e &= ~kCopied;
    if (l1.size() < needed) l1.resize(needed, 0);
    // 1. In memory: everything the snapshot reaches gets the active image's
    //    reference too (so all of it is shared and loses COPIED), and the
    //    new active L1 gets its own clusters.
    TD_RETURN_IF_ERROR(
        ForEachReference(l1, [&](uint64_t off, uint64_t n) TD_REQUIRES(img_.mu_) {
          return img_.allocator_->AddRefcount(off, n, +1);
        }));
    TD_RETURN_IF_ERROR(FixCopiedLocked(l1, nullptr));
    uint64_t l1_clusters = ClustersFor(std::max<uint64_t>(l1.size() * 8, 1), img_.cs());
    TD_ASSIGN_OR_RETURN(auto l1_space, img_.allocator_->AllocateClusters(l1_clusters));
    // 2. Rule: refcounts (stage 1) and L2 flags (stage 3) are durable before
    //    the L1 table that uses them is named by the header.
    TD_RETURN_IF_ERROR(img_.FlushMetadataLocked());
    // 3. The switch: stage 4 writes the new L1 at its own place, then one
    //    header write names it together with the snapshot's disk size.
    std::vector<uint64_t> old_l1 = std::move(img_.l1_);
    const uint64_t old_l1_offset = img_.header_.l1_table_offset;
    img_.l1_ = std::move(l1);
    img_.l1_dirty_.clear();
    img_.new_l1_offset_ = l1_space.offset;
    img_.l1_moved_ = true;
    img_.size_ = disk_size;
    img_.header_dirty_ = true;
    TD_RETURN_IF_ERROR(img_.FlushMetadataLocked());
    // 4. Rule: the old active tree loses its reference only now that
    //    nothing on disk points at it.
    TD_RETURN_IF_ERROR(
        ForEachReference(old_l1, [&](uint64_t off, uint64_t n) TD_REQUIRES(img_.mu_) {
          img_.allocator_->DeferFree(off, n);
          return Status::Ok();
        }));
    if (old_l1_offset != 0 && !old_l1.empty()) {
      img_.allocator_->DeferFree(old_l1_offset,
                                 ClustersFor(old_l1.size() * 8, img_.cs()));
    }
  }
  TD_RETURN_IF_ERROR(FlushFrees());
  // The snapshot keeps its reference, so nothing the image uses can have
  // dropped to one; recomputing the flags costs a walk and guards that.
  util::MutexLock lock(img_.mu_);
  TD_RETURN_IF_ERROR(FixCopiedLocked(img_.l1_, &img_.l1_dirty_));
  return img_.FlushMetadataLocked();
}

Status SnapshotEditor::Delete(const std::string& id_or_name) {
  TD_RETURN_IF_ERROR(CheckWritable());
  util::MutexLock flush_lock(img_.flush_mu_);
  TD_RETURN_IF_ERROR(img_.FlushAll());
  {
    util::MutexLock lock(img_.mu_);
    TD_ASSIGN_OR_RETURN(TableOnDisk old, ReadTable(*img_.storage_, img_.header_));
    std::vector<Snapshot> snaps = old.snapshots;
    int idx = FindSnapshot(snaps, id_or_name);
    if (idx < 0)
      return Status::NotFound(fmt::format("no snapshot '{}' in the image", id_or_name));
    const Snapshot sn = snaps[size_t(idx)];
    TD_ASSIGN_OR_RETURN(std::vector<uint64_t> l1, ReadL1(sn.l1_table_offset, sn.l1_size));
    snaps.erase(snaps.begin() + idx);
    std::vector<uint8_t> table = EncodeSnapshotTable(snaps);
    TD_ASSIGN_OR_RETURN(uint64_t table_offset, AllocateTable(table));
    // 1. Rule: the new table's refcount is durable before the table, and
    //    the table before the header that names it.
    TD_RETURN_IF_ERROR(img_.FlushMetadataLocked());
    TD_RETURN_IF_ERROR(WriteSnapshotStep(table_offset, table));
    TD_RETURN_IF_ERROR(img_.storage_->Flush());
    // 2. One header write: the new table, and (version 3) the dirty bit,
    //    since COPIED flags will lag the refcounts lowered below.
    const uint64_t old_offset = img_.header_.snapshots_offset;
    TD_RETURN_IF_ERROR(SwitchTableLocked(table_offset, uint32_t(snaps.size()), true));
    // 3. Nothing on disk points at the snapshot any more: release what it held.
    TD_RETURN_IF_ERROR(
        ForEachReference(l1, [&](uint64_t off, uint64_t n) TD_REQUIRES(img_.mu_) {
          img_.allocator_->DeferFree(off, n);
          return Status::Ok();
        }));
    if (!l1.empty())
      img_.allocator_->DeferFree(sn.l1_table_offset,
                                 ClustersFor(l1.size() * 8, img_.cs()));
    if (old.bytes != 0)
      img_.allocator_->DeferFree(old_offset, ClustersFor(old.bytes, img_.cs()));
  }
  TD_RETURN_IF_ERROR(img_.FlushAll());  // stage 5: refcounts lowered in memory
  util::MutexLock lock(img_.mu_);
  // 4. Clusters the active image now holds alone get COPIED back; then the
  //    lowered refcounts, flags and L1 entries reach the disk in order, and
  //    the dirty bit goes.
  TD_RETURN_IF_ERROR(FixCopiedLocked(img_.l1_, &img_.l1_dirty_));
  TD_RETURN_IF_ERROR(img_.FlushMetadataLocked());
  return SetDirtyLocked(false);
}

namespace {

Result<ImageImpl*> Impl(Image& image) {
  auto* impl = dynamic_cast<ImageImpl*>(&image);
  if (impl == nullptr) return Status::NotSupported("snapshots need a qcow2 image");
  return impl;
}

}  // namespace

Result<std::vector<Snapshot>> ListSnapshots(Image& image) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  return SnapshotEditor(*impl).List();
}

Status CreateSnapshot(Image& image, const SnapshotCreateOptions& options) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  return SnapshotEditor(*impl).Create(options);
}

Status ApplySnapshot(Image& image, const std::string& id_or_name) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  return SnapshotEditor(*impl).Apply(id_or_name);
}

Status DeleteSnapshot(Image& image, const std::string& id_or_name) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  return SnapshotEditor(*impl).Delete(id_or_name);
}

}  // namespace thindisk::qcow2
