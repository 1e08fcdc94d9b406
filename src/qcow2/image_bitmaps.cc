// Persistent bitmaps in the engine: the directory loaded at open, tracked
// bitmaps with every data cluster allocated, and the two ordered writes
// every bitmap operation is made of (docs/write-ordering.md "Bitmaps"):
// bits into data clusters (new ones refcounted first, table entries after
// the data), and a new directory named by one header write.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "qcow2/bitmaps.h"
#include "qcow2/header_update.h"
#include "qcow2/image_impl.h"
#include "qcow2/snapshot.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

uint64_t DivUp(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

bool AllZero(std::span<const uint8_t> bytes) {
  for (uint8_t b : bytes) {
    if (b != 0) return false;
  }
  return true;
}

}  // namespace

Result<std::vector<BitmapTableEntry>> ImageImpl::ReadBitmapTableLocked(
    const BitmapDirectoryEntry& e) {
  // Clusters allocated but not yet written lie past the file's end: the
  // allocator's end bounds what an entry may name.
  TD_ASSIGN_OR_RETURN(uint64_t file_size, storage_->Size());
  const uint64_t end = std::max(file_size, allocator_->host_end());
  std::string bad = CheckBitmapEntry(e, size_.load(), cs(), end);
  if (!bad.empty()) return Status::Corrupt("bitmap '" + e.name + "': " + bad);
  std::vector<uint8_t> raw(uint64_t{e.bitmap_table_size} * 8);
  TD_RETURN_IF_ERROR(storage_->ReadAt(e.bitmap_table_offset, raw));
  std::vector<BitmapTableEntry> table(e.bitmap_table_size);
  for (uint64_t i = 0; i < table.size(); ++i) {
    auto entry = DecodeBitmapTableEntry(LoadBe64(&raw[i * 8]), cs(), end);
    if (!entry) return entry.error().WithContext("bitmap '" + e.name + "'");
    table[i] = *entry;
  }
  std::string overlap = BitmapClustersProblemLocked(e, table);
  if (!overlap.empty()) return Status::Corrupt("bitmap '" + e.name + "': " + overlap);
  return table;
}

std::string ImageImpl::BitmapClustersProblemLocked(const BitmapDirectoryEntry& e,
                                                   const std::vector<BitmapTableEntry>& table) {
  // 1. The clusters the image's metadata holds, as [first, last] ranges.
  std::vector<std::pair<uint64_t, uint64_t>> meta;
  auto add = [&](uint64_t offset, uint64_t bytes) {
    if (bytes == 0) return;
    meta.push_back({offset >> cluster_bits_, (offset + bytes - 1) >> cluster_bits_});
  };
  add(0, 1);
  add(l1_moved_ ? new_l1_offset_ : header_.l1_table_offset, uint64_t(l1_.size()) * 8);
  for (uint64_t entry : l1_) add(L1Offset(entry), cs());
  add(allocator_->table_offset(), uint64_t{allocator_->table_clusters()} * cs());
  for (uint64_t block : allocator_->block_offsets()) add(block, cs());
  if (header_.nb_snapshots != 0) {
    auto snaps = ReadSnapshotTable(*storage_, header_);
    if (!snaps) return "the snapshot table does not read: " + snaps.error().message();
    add(header_.snapshots_offset, EncodeSnapshotTable(*snaps).size());
    for (const Snapshot& sn : *snaps) add(sn.l1_table_offset, uint64_t{sn.l1_size} * 8);
  }
  if (header_.bitmaps) {
    add(header_.bitmaps->bitmap_directory_offset, header_.bitmaps->bitmap_directory_size);
  }
  for (const BitmapDirectoryEntry& other : bitmap_dir_) {
    if (other.name != e.name) add(other.bitmap_table_offset, uint64_t{other.bitmap_table_size} * 8);
  }
  // Merged into disjoint ranges, so one binary search answers.
  std::sort(meta.begin(), meta.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& r : meta) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  auto is_meta = [&](uint64_t c) {
    auto it = std::upper_bound(merged.begin(), merged.end(), std::make_pair(c, UINT64_MAX));
    return it != merged.begin() && std::prev(it)->second >= c;
  };
  // 2. The bitmap's own clusters: each once, refcount 1, no metadata.
  std::vector<uint64_t> mine;
  const uint64_t table_bytes = uint64_t{e.bitmap_table_size} * 8;
  for (uint64_t off = e.bitmap_table_offset & ~(cs() - 1);
       off < e.bitmap_table_offset + table_bytes; off += cs()) {
    mine.push_back(off >> cluster_bits_);
  }
  for (const BitmapTableEntry& t : table) {
    if (t.host_offset != 0) mine.push_back(t.host_offset >> cluster_bits_);
  }
  std::vector<uint64_t> sorted = mine;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return "a cluster is named twice by its table";
  }
  for (uint64_t c : mine) {
    if (is_meta(c)) return fmt::format("cluster {:#x} is also the image's metadata", c << cluster_bits_);
    auto rc = allocator_->GetRefcount(c << cluster_bits_);
    if (!rc) return "its refcounts do not read: " + rc.error().message();
    if (*rc != 1) return fmt::format("cluster {:#x} has refcount {}, not 1", c << cluster_bits_, *rc);
  }
  return "";
}

Result<BitVector> ImageImpl::ReadBitmapBitsLocked(const BitmapDirectoryEntry& e) {
  TD_ASSIGN_OR_RETURN(std::vector<BitmapTableEntry> table, ReadBitmapTableLocked(e));
  BitVector bits(BitmapBits(size_.load(), e.granularity_bits));
  std::vector<uint8_t> buf(cs());
  for (uint64_t i = 0; i < table.size(); ++i) {
    if (table[i].host_offset != 0) {
      TD_RETURN_IF_ERROR(storage_->ReadAt(table[i].host_offset, buf));
    } else {
      std::fill(buf.begin(), buf.end(), table[i].all_ones ? 0xff : 0);
    }
    bits.WriteBytes(i * cs(), buf);  // tail bits past the disk are dropped
  }
  return bits;
}

Status ImageImpl::StoreBitmapBitsLocked(const BitmapDirectoryEntry& e, const BitVector& bits,
                                        bool allocate_all) {
  TD_ASSIGN_OR_RETURN(std::vector<BitmapTableEntry> table, ReadBitmapTableLocked(e));
  std::vector<uint64_t> fresh;    // clusters allocated here, not yet in the table on disk
  std::vector<uint64_t> changed;  // table indices to rewrite
  auto give_back = [&]() TD_REQUIRES(mu_) {
    for (uint64_t off : fresh) allocator_->DeferFree(off, 1);
  };
  std::vector<uint8_t> buf(cs());
  // 1. The data: in place, or into new clusters (refcounted in memory).
  for (uint64_t i = 0; i < table.size(); ++i) {
    bits.ReadBytes(i * cs(), buf);  // zeros past the data: the spec's zero tail
    BitmapTableEntry& t = table[i];
    if (t.host_offset == 0 && !allocate_all && AllZero(buf)) {
      if (t.all_ones) {
        t.all_ones = false;
        changed.push_back(i);
      }
      continue;
    }
    if (t.host_offset == 0) {
      auto a = allocator_->AllocateClusters(1);
      if (!a) {
        give_back();
        return a.error();
      }
      fresh.push_back(a->offset);
      t = {a->offset, false};
      changed.push_back(i);
    }
    storage_->Announce(io::Event::kBitmapUpdate);
    Status s = storage_->WriteAt(t.host_offset, buf);
    if (!s.ok()) {
      give_back();
      return s;
    }
  }
  // 2. Rule: a refcount is raised before anything points at the cluster,
  //    and the data is durable before the table entry that names it: both
  //    by the flush (stage 1 and its sync).
  Status s = FlushMetadataLocked();
  if (!s.ok()) {
    give_back();
    return s;
  }
  // 3. The changed entries, in place: each is 8 bytes inside one sector,
  //    so a crash leaves it old (zeros, or ones, as the data it now names
  //    holds the same) or new.
  for (size_t k = 0; k < changed.size();) {
    size_t j = k + 1;
    while (j < changed.size() && changed[j] == changed[j - 1] + 1) ++j;
    std::vector<uint8_t> raw((j - k) * 8);
    for (size_t n = k; n < j; ++n) {
      StoreBe64(&raw[(n - k) * 8], EncodeBitmapTableEntry(table[changed[n]]));
    }
    storage_->Announce(io::Event::kBitmapTable);
    TD_RETURN_IF_ERROR(storage_->WriteAt(e.bitmap_table_offset + changed[k] * 8, raw));
    k = j;
  }
  return storage_->Flush();
}

Result<BitmapDirectoryEntry> ImageImpl::WriteNewBitmapLocked(const BitmapDirectoryEntry& e,
                                                             const BitVector& bits,
                                                             bool allocate_all,
                                                             std::vector<uint64_t>* data_clusters) {
  BitmapDirectoryEntry out = e;
  const uint64_t entries = DivUp(bits.ByteSize(), cs());
  std::vector<uint8_t> table(entries * 8, 0);
  std::vector<uint64_t> taken;  // given back if anything fails
  auto fail = [&](const Status& s) TD_REQUIRES(mu_) {
    for (uint64_t off : taken) allocator_->DeferFree(off, 1);
    return s;
  };
  std::vector<uint8_t> buf(cs());
  for (uint64_t i = 0; i < entries; ++i) {
    bits.ReadBytes(i * cs(), buf);
    if (!allocate_all && AllZero(buf)) {
      if (data_clusters) data_clusters->push_back(0);
      continue;
    }
    auto a = allocator_->AllocateClusters(1);
    if (!a) return fail(a.error());
    taken.push_back(a->offset);
    storage_->Announce(io::Event::kBitmapUpdate);
    Status s = storage_->WriteAt(a->offset, buf);
    if (!s.ok()) return fail(s);
    StoreBe64(&table[i * 8], EncodeBitmapTableEntry({a->offset, false}));
    if (data_clusters) data_clusters->push_back(a->offset);
  }
  const uint64_t table_clusters = std::max<uint64_t>(1, DivUp(table.size(), cs()));
  auto a = allocator_->AllocateClusters(table_clusters);
  if (!a) return fail(a.error());
  storage_->Announce(io::Event::kBitmapTable);
  Status s = storage_->WriteAt(a->offset, table);
  if (!s.ok()) {
    allocator_->DeferFree(a->offset, table_clusters);
    return fail(s);
  }
  out.bitmap_table_offset = a->offset;
  out.bitmap_table_size = uint32_t(entries);
  return out;
}

Status ImageImpl::StoreBitmapDirectoryLocked(std::vector<BitmapDirectoryEntry> entries) {
  const Header before = header_;
  if (entries.empty()) {
    header_.bitmaps.reset();
    header_.autoclear_features &= ~kAutoclearBitmaps;
  } else {
    std::vector<uint8_t> bytes = EncodeBitmapDirectory(entries);
    const uint64_t clusters = DivUp(bytes.size(), cs());
    TD_ASSIGN_OR_RETURN(Allocator::Allocation a, allocator_->AllocateClusters(clusters));
    // Rule: the directory's refcount, then the directory itself, are
    // durable before the header names it.
    Status s = FlushMetadataLocked();
    if (s.ok()) {
      storage_->Announce(io::Event::kBitmapTable);
      s = storage_->WriteAt(a.offset, bytes);
    }
    if (s.ok()) s = storage_->Flush();
    if (!s.ok()) {
      allocator_->DeferFree(a.offset, clusters);  // nothing names it
      return s;
    }
    header_.bitmaps = BitmapsExtension{uint32_t(entries.size()), bytes.size(), a.offset};
    header_.autoclear_features |= kAutoclearBitmaps;
  }
  // The switch. While the extension stays, it is one write of the first
  // sector, where EncodeHeader puts the extension: count, size and offset
  // change together. When it comes or goes, everything after it moves:
  // RewriteHeader's ordered steps then keep the old or the new header
  // readable whatever a crash tears.
  bitmap_dir_ = std::move(entries);
  Status s;
  if (before.bitmaps.has_value() == header_.bitmaps.has_value()) {
    s = WriteHeaderLocked();
    if (s.ok()) s = storage_->Flush();
  } else {
    s = RewriteHeader(*storage_, header_);
  }
  if (!s.ok()) {
    // The disk may hold either header now. The new one is the engine's view
    // from here on, and the next flush writes it again (stage 4), so disk
    // and engine converge; the old directory is not freed (a leak at worst).
    header_dirty_ = true;
    return s;
  }
  // Rule: a refcount is lowered only after nothing points at the cluster.
  if (before.bitmaps) {
    allocator_->DeferFree(before.bitmaps->bitmap_directory_offset,
                          DivUp(before.bitmaps->bitmap_directory_size, cs()));
  }
  return Status::Ok();
}

Status ImageImpl::OpenBitmapsLocked() {
  if (!header_.bitmaps) return Status::Ok();
  // 1. The directory (the extension was validated with the header). One
  //    that does not decode can be neither kept up to date nor dropped
  //    without losing the bitmaps: a writer is refused, as qemu refuses.
  auto dir = ReadBitmapDirectory(*storage_, header_);
  if (!dir) {
    bitmap_error_ = dir.error().message();
    if (read_only_) return Status::Ok();
    return Status::Corrupt("the bitmap directory does not decode (" + bitmap_error_ +
                           "): the image cannot be written without losing track of its "
                           "bitmaps; thindisk check -r all drops them");
  }
  bitmap_dir_ = std::move(*dir);
  if (read_only_) return Status::Ok();

  // 2. Enabled bitmaps: tracked from now on, with every data cluster
  //    allocated so that marking never allocates. One that cannot be read
  //    is marked in_use (inconsistent, as qemu marks one it could not save).
  std::vector<BitmapDirectoryEntry> entries = bitmap_dir_;
  bool flags_changed = false;
  for (BitmapDirectoryEntry& e : entries) {
    if (!e.enabled() || e.in_use()) continue;
    auto table = ReadBitmapTableLocked(e);
    Result<BitVector> bits = table ? ReadBitmapBitsLocked(e) : Result<BitVector>(table.error());
    if (!bits) {
      fprintf(stderr, "thindisk: %s: %s; the bitmap is marked inconsistent\n",
              info_.filename.c_str(), bits.error().message().c_str());
      e.flags |= kBitmapInUse;
      flags_changed = true;
      continue;
    }
    bool complete = true;
    for (const BitmapTableEntry& t : *table) complete &= t.host_offset != 0;
    if (!complete) {
      TD_RETURN_IF_ERROR(StoreBitmapBitsLocked(e, *bits, /*allocate_all=*/true));
      TD_ASSIGN_OR_RETURN(table, ReadBitmapTableLocked(e));
    }
    BitmapTracker::Bitmap b;
    b.name = e.name;
    b.granularity_bits = e.granularity_bits;
    for (const BitmapTableEntry& t : *table) b.data_clusters.push_back(t.host_offset);
    b.bits = std::move(*bits);
    tracker_->Add(std::move(b));
  }
  if (flags_changed) TD_RETURN_IF_ERROR(StoreBitmapDirectoryLocked(std::move(entries)));
  return Status::Ok();
}

Status ImageImpl::PrepareResizedBitmapsLocked(uint64_t new_size) {
  if (resized_bitmaps_) DropResizedBitmapsLocked();  // an earlier resize that did not finish
  if (bitmap_dir_.empty()) return Status::Ok();
  if (new_size == 0) {
    return Status::InvalidArgument("cannot resize to 0 bytes while the image has bitmaps");
  }
  // qemu refuses too: an inconsistent bitmap has no size to carry over.
  for (const BitmapDirectoryEntry& e : bitmap_dir_) {
    TD_ASSIGN_OR_RETURN(uint64_t file_size, storage_->Size());
    std::string bad = e.in_use() ? "in use (not saved correctly)"
                                 : CheckBitmapEntry(e, size_.load(), cs(),
                                                    std::max(file_size, allocator_->host_end()));
    if (!bad.empty()) {
      return Status::InvalidArgument("bitmap '" + e.name + "' is inconsistent (" + bad +
                                     "); remove it before resizing");
    }
    Status fits = CheckBitmapGeometry(new_size, e.granularity_bits, cs());
    if (!fits.ok()) return fits.WithContext("bitmap '" + e.name + "' at the new size");
  }
  auto r = std::make_unique<ResizedBitmaps>();
  for (const BitmapDirectoryEntry& e : bitmap_dir_) {
    TD_ASSIGN_OR_RETURN(std::vector<BitmapTableEntry> table, ReadBitmapTableLocked(e));
    BitVector bits;
    const bool tracked = tracker_->CopyExact(e.name, &bits);
    if (!tracked) {
      TD_ASSIGN_OR_RETURN(bits, ReadBitmapBitsLocked(e));
    }
    // Bits past a smaller end go; a larger disk's new granules start clean.
    bits.Resize(BitmapBits(new_size, e.granularity_bits));
    std::vector<uint64_t> clusters;
    auto ne = WriteNewBitmapLocked(e, bits, tracked, &clusters);
    if (!ne) {
      for (const std::string& name : r->tracked) tracker_->Remove(ResizeShadowName(name));
      return ne.error();
    }
    r->dir.push_back(*ne);
    r->frees.push_back({e.bitmap_table_offset, DivUp(uint64_t{e.bitmap_table_size} * 8, cs())});
    for (const BitmapTableEntry& t : table) {
      if (t.host_offset != 0) r->frees.push_back({t.host_offset, 1});
    }
    if (tracked) {
      tracker_->Add({ResizeShadowName(e.name), e.granularity_bits, clusters, std::move(bits)});
      r->tracked.push_back(e.name);
    }
  }
  std::vector<uint8_t> dir = EncodeBitmapDirectory(r->dir);
  auto a = allocator_->AllocateClusters(DivUp(dir.size(), cs()));
  Status s = a.status();
  if (s.ok()) {
    storage_->Announce(io::Event::kBitmapTable);
    s = storage_->WriteAt(a->offset, dir);
  }
  if (!s.ok()) {
    for (const std::string& name : r->tracked) tracker_->Remove(ResizeShadowName(name));
    return s;
  }
  r->ext = BitmapsExtension{uint32_t(r->dir.size()), dir.size(), a->offset};
  // The old directory goes with the old bitmaps.
  r->frees.push_back({header_.bitmaps->bitmap_directory_offset,
                      DivUp(header_.bitmaps->bitmap_directory_size, cs())});
  resized_bitmaps_ = std::move(r);
  return Status::Ok();
}

void ImageImpl::ApplyResizedBitmapsLocked() {
  // Rule: a refcount is lowered only after nothing points at the cluster:
  // the header naming the new directory is durable (stage 5 applies these).
  for (const Allocator::Range& f : resized_bitmaps_->frees) allocator_->DeferFree(f.offset, f.n);
  bitmap_dir_ = std::move(resized_bitmaps_->dir);
  for (const std::string& name : resized_bitmaps_->tracked) {
    tracker_->Remove(name);
    tracker_->Rename(ResizeShadowName(name), name);
  }
  resized_bitmaps_.reset();
}

void ImageImpl::DropResizedBitmapsLocked() {
  if (!resized_bitmaps_) return;
  for (const std::string& name : resized_bitmaps_->tracked) {
    tracker_->Remove(ResizeShadowName(name));
  }
  resized_bitmaps_.reset();
}

}  // namespace thindisk::qcow2
