// qcow2::Check: offline consistency check and repair, like `qemu-img check`.
//
// 1. Decode the header (an undecodable header is an error, not a finding).
// 2. Count references: header cluster, refcount table and blocks, active L1
//    and its L2 tables and data, the snapshot table and every snapshot's L1
//    and L2 tables and data, the bitmap directory and tables. Each cluster
//    also gets a role (data, L2 table, exclusive metadata): two roles, or an
//    exclusive cluster referenced twice, is overlapping metadata.
// 3. Compare with the refcount blocks: refcount < references is corruption,
//    refcount > references a leak. Repair lowers leaks (kLeaks, kAll) and
//    raises too-low refcounts (kAll), allocating a refcount block at the end
//    of the file when the cluster has none.
// 4. With the refcounts now final, check the COPIED flags of the active L1
//    and L2 entries (set iff refcount == 1); kAll fixes them.
// 5. Write back what repair changed, then clear the dirty bit (and, for
//    kAll, the corrupt bit) when nothing is left to fix.
//
// Reported counts are what remains after repair (as qemu-img reports after
// `-r`); *_fixed count what repair changed.
#include "qcow2/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "qcow2/format.h"
#include "qcow2/header_update.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// One byte per cluster: role in the low bits, "overlap reported" flag.
enum Role : uint8_t { kNoRole = 0, kDataRole = 1, kL2Role = 2, kExclusiveRole = 3 };
constexpr uint8_t kRoleMask = 3;
constexpr uint8_t kOverlapReported = 0x80;
// Clusters the check tracks in memory (4 bytes + 1 byte each): 2^28 is
// 32 TiB of 128 KiB clusters and 1.25 GiB of memory.
constexpr uint64_t kMaxCheckedClusters = 1ull << 28;

const char* RoleName(uint8_t role) {
  switch (role) {
    case kDataRole: return "data";
    case kL2Role: return "L2 table";
    case kExclusiveRole: return "metadata";
    default: return "nothing";
  }
}

class Checker {
 public:
  Checker(io::Storage& storage, RepairMode mode) : s_(storage), mode_(mode) {}

  Result<CheckReport> Run() {
    TD_RETURN_IF_ERROR(LoadHeader());
    Reference(0, cs_, kExclusiveRole, "header");
    LoadRefcountTable();
    WalkL1(h_.l1_table_offset, h_.l1_size, /*active=*/true);
    WalkSnapshots();
    WalkBitmaps();
    CompareRefcounts();
    CheckCopiedFlags();
    Status st = WriteBack();
    if (!st.ok()) {
      ++r_.check_errors;
      r_.messages.push_back("ERROR writing repairs: " + st.message());
    }
    return std::move(r_);
  }

 private:
  // ---- step 1 ----
  Status LoadHeader() {
    TD_ASSIGN_OR_RETURN(file_size_, s_.Size());
    std::vector<uint8_t> bytes(std::min<uint64_t>(file_size_, 2ull << 20));
    TD_RETURN_IF_ERROR(s_.ReadAt(0, bytes));
    TD_ASSIGN_OR_RETURN(h_, DecodeHeader(bytes, file_size_));
    cs_ = h_.cluster_size();
    nb_clusters_ = (file_size_ + cs_ - 1) / cs_;
    if (nb_clusters_ > kMaxCheckedClusters) {
      return Status::NotSupported(fmt::format("{}: {} clusters are too many to check in memory",
                                              s_.name(), nb_clusters_));
    }
    next_free_cluster_ = nb_clusters_;
    rb_entries_ = cs_ * 8 >> h_.refcount_order;
    refs_.assign(nb_clusters_, 0);
    roles_.assign(nb_clusters_, kNoRole);
    r_.total_clusters = (h_.size + cs_ - 1) / cs_;
    return Status::Ok();
  }

  void Corruption(std::string message) {
    ++r_.corruptions;
    r_.messages.push_back(std::move(message));
  }

  // Reads [offset, offset + n); a failure is a check error, reported here.
  bool ReadOrReport(uint64_t offset, std::span<uint8_t> buf, const std::string& what) {
    Status st = s_.ReadAt(offset, buf);
    if (st.ok()) return true;
    ++r_.check_errors;
    r_.messages.push_back(fmt::format("ERROR reading {}: {}", what, st.message()));
    return false;
  }

  // ---- step 2: references ----

  // Counts one reference to every cluster touched by [offset, offset+bytes).
  // Returns false (after reporting) when the range lies past the file end.
  bool Reference(uint64_t offset, uint64_t bytes, Role role, const std::string& what) {
    if (bytes == 0) return true;
    uint64_t first = offset / cs_;
    uint64_t last = (offset + bytes - 1) / cs_;
    if (offset + bytes < offset || last >= nb_clusters_) {
      Corruption(fmt::format("ERROR {} at {:#x} ({} bytes) is past the end of the file", what,
                             offset, bytes));
      return false;
    }
    for (uint64_t c = first; c <= last; ++c) {
      if (refs_[c] != std::numeric_limits<uint32_t>::max()) ++refs_[c];
      uint8_t old = roles_[c] & kRoleMask;
      bool overlap = old != kNoRole && (old != role || role == kExclusiveRole);
      if (old == kNoRole) roles_[c] = role;
      if (overlap && !(roles_[c] & kOverlapReported)) {
        roles_[c] |= kOverlapReported;
        Corruption(fmt::format("ERROR cluster {} is used as {} and also as {} ({}): overlapping "
                               "metadata",
                               c, RoleName(old), RoleName(role), what));
      }
    }
    return true;
  }

  void LoadRefcountTable() {
    uint64_t bytes = uint64_t{h_.refcount_table_clusters} * cs_;
    Reference(h_.refcount_table_offset, bytes, kExclusiveRole, "refcount table");
    rt_.assign(bytes / 8, 0);
    std::vector<uint8_t> raw(bytes);
    if (!ReadOrReport(h_.refcount_table_offset, raw, "the refcount table")) return;
    for (uint64_t i = 0; i < rt_.size(); ++i) {
      uint64_t e = LoadBe64(&raw[i * 8]);
      if (e == 0) continue;
      if (e & (cs_ - 1)) {  // includes the reserved bits 0-8
        Corruption(fmt::format("ERROR refcount block {} at {:#x} is not cluster aligned; refcount "
                               "table entry corrupted",
                               i, e));
        continue;  // treated as missing; repair may allocate a new block
      }
      if (e / cs_ >= nb_clusters_) {
        Corruption(fmt::format("ERROR refcount block {} at {:#x} is outside the image", i, e));
        continue;
      }
      Reference(e, cs_, kExclusiveRole, fmt::format("refcount block {}", i));
      rt_[i] = e;
    }
  }

  void WalkL1(uint64_t l1_offset, uint32_t l1_size, bool active) {
    std::string what = active ? std::string("active L1 table")
                              : fmt::format("snapshot L1 table at {:#x}", l1_offset);
    if (l1_size == 0) return;
    if (!Reference(l1_offset, uint64_t{l1_size} * 8, kExclusiveRole, what)) return;
    std::vector<uint8_t> raw(uint64_t{l1_size} * 8);
    if (!ReadOrReport(l1_offset, raw, what)) return;
    if (active) {
      active_l1_.resize(l1_size);
      for (uint32_t i = 0; i < l1_size; ++i) active_l1_[i] = LoadBe64(&raw[i * 8]);
    }
    for (uint32_t i = 0; i < l1_size; ++i) {
      uint64_t e = LoadBe64(&raw[i * 8]);
      if (e & kL1Reserved) {
        Corruption(fmt::format("ERROR {} entry {} ({:#x}) has reserved bits set", what, i, e));
      }
      uint64_t l2 = L1Offset(e);
      if (l2 == 0) continue;
      if (l2 & (cs_ - 1)) {
        Corruption(fmt::format("ERROR l2_offset={:#x}: L2 table is not cluster aligned; {} entry "
                               "{} corrupted",
                               l2, what, i));
        continue;
      }
      if (!Reference(l2, cs_, kL2Role, fmt::format("L2 table ({} entry {})", what, i))) continue;
      WalkL2(l2, active);
    }
  }

  void WalkL2(uint64_t l2_offset, bool active) {
    std::vector<uint8_t> table(cs_);
    if (!ReadOrReport(l2_offset, table, fmt::format("L2 table at {:#x}", l2_offset))) return;
    const uint32_t esize = h_.l2_entry_size();
    bool changed = false;
    for (uint64_t k = 0; k < h_.l2_entries(); ++k) {
      uint64_t entry = LoadBe64(&table[k * esize]);
      uint64_t bitmap = h_.extended_l2() ? LoadBe64(&table[k * esize + 8]) : 0;
      if ((entry & kCompressed) && (entry & kCopied)) {
        std::string m = fmt::format("ERROR coffset={:#x}: COPIED flag must never be set for "
                                    "compressed clusters (L2 table {:#x} entry {})",
                                    entry & ~(kCompressed | kCopied), l2_offset, k);
        entry &= ~kCopied;
        if (mode_ == RepairMode::kAll) {
          StoreBe64(&table[k * esize], entry);
          changed = true;
          ++r_.corruptions_fixed;
          r_.messages.push_back("Repairing: " + m);
        } else {
          Corruption(m);
        }
      }
      auto m = DecodeL2Entry(entry, bitmap, h_.extended_l2(), h_.cluster_bits);
      if (!m.has_value()) {
        Corruption(fmt::format("ERROR L2 table {:#x} entry {}: {}", l2_offset, k,
                               m.error().message()));
        continue;
      }
      std::string what = fmt::format("cluster of L2 table {:#x} entry {}", l2_offset, k);
      switch (m->kind) {
        case ClusterKind::kUnallocated:
          break;
        case ClusterKind::kZero:
          if (m->host_offset == 0) break;
          [[fallthrough]];
        case ClusterKind::kNormal:
          Reference(m->host_offset, cs_, kDataRole, "data " + what);
          if (active) {
            ++r_.allocated_clusters;
            if (next_contiguous_ != 0 && m->host_offset != next_contiguous_) {
              ++r_.fragmented_clusters;
            }
            next_contiguous_ = m->host_offset + cs_;
          }
          break;
        case ClusterKind::kCompressed:
          Reference(m->host_offset, m->compressed_size, kDataRole, "compressed " + what);
          if (active) {
            ++r_.allocated_clusters;
            ++r_.compressed_clusters;
            ++r_.fragmented_clusters;  // compressed clusters are fragmented by nature
          }
          break;
      }
    }
    if (changed) dirty_l2_[l2_offset] = std::move(table);
  }

  void WalkSnapshots() {
    if (h_.nb_snapshots == 0) return;
    // Entry sizes are variable: walk the fixed parts to find the table size.
    uint64_t pos = h_.snapshots_offset;
    for (uint32_t i = 0; i < h_.nb_snapshots; ++i) {
      uint8_t fixed[40];
      if (pos + sizeof fixed > file_size_) {
        Corruption(fmt::format("ERROR snapshot table entry {} is past the end of the file", i));
        return;
      }
      if (!ReadOrReport(pos, fixed, "the snapshot table")) return;
      uint64_t len = 40 + uint64_t{LoadBe16(fixed + 12)} + LoadBe16(fixed + 14) +
                     LoadBe32(fixed + 36);
      pos += (len + 7) & ~uint64_t{7};
    }
    uint64_t bytes = std::min(pos, file_size_) - h_.snapshots_offset;
    if (!Reference(h_.snapshots_offset, bytes, kExclusiveRole, "snapshot table")) return;
    std::vector<uint8_t> raw(bytes);
    if (!ReadOrReport(h_.snapshots_offset, raw, "the snapshot table")) return;
    auto snaps = DecodeSnapshotTable(raw, h_.nb_snapshots, h_.cluster_bits);
    if (!snaps.has_value()) {
      Corruption("ERROR snapshot table: " + snaps.error().message());
      return;
    }
    for (const Snapshot& sn : *snaps) {
      if (sn.l1_size > 0 && sn.l1_table_offset == 0) {
        Corruption(fmt::format("ERROR snapshot {} has its L1 table at offset 0", sn.id));
        continue;
      }
      WalkL1(sn.l1_table_offset, sn.l1_size, /*active=*/false);
    }
  }

  // Bitmaps: directory, bitmap tables and the clusters they name. An
  // inconsistent extension (autoclear bit clear) is walked too: its
  // clusters stay referenced until something removes it.
  void WalkBitmaps() {
    std::optional<BitmapsExtension> ext = h_.bitmaps;
    for (const RawExtension& e : h_.unknown_extensions) {
      if (e.type != kExtBitmaps) continue;
      auto decoded = DecodeBitmapsExtension(e.data, cs_, file_size_);
      if (!decoded) return BadBitmaps(decoded.error().message(), std::nullopt);
      ext = *decoded;
    }
    if (!ext) return;
    const uint64_t dir_offset = ext->bitmap_directory_offset;
    const uint64_t dir_size = ext->bitmap_directory_size;
    std::vector<uint8_t> dir(dir_size);
    if (!ReadOrReport(dir_offset, dir, "the bitmap directory")) {
      Reference(dir_offset, dir_size, kExclusiveRole, "bitmap directory");
      return;
    }
    auto entries = DecodeBitmapDirectory(dir, ext->nb_bitmaps);
    if (!entries) return BadBitmaps(entries.error().message(), ext);
    if (!Reference(dir_offset, dir_size, kExclusiveRole, "bitmap directory")) return;
    for (const BitmapDirectoryEntry& e : *entries) {
      std::string bad = CheckBitmapEntry(e, h_.size, cs_, file_size_);
      if (!bad.empty()) Corruption(fmt::format("ERROR bitmap '{}': {}", e.name, bad));
      WalkBitmapTable(e);
    }
  }

  // A bitmaps extension or directory that does not decode: its bitmaps
  // are lost either way. kAll drops the extension (as a program without
  // bitmap support would), and the clusters it held come back as leaks of
  // this same repair; otherwise the directory's clusters stay referenced.
  void BadBitmaps(const std::string& why, const std::optional<BitmapsExtension>& ext) {
    if (mode_ == RepairMode::kAll) {
      drop_bitmaps_ = true;
      ++r_.corruptions_fixed;
      r_.messages.push_back("Repairing the bitmaps extension: " + why +
                            "; the bitmaps are dropped");
      return;
    }
    Corruption("ERROR " + why);
    if (ext) {
      Reference(ext->bitmap_directory_offset, ext->bitmap_directory_size, kExclusiveRole,
                "bitmap directory");
    }
  }

  // Counts the table's clusters and its data clusters, as long as the
  // table itself can be read (so a bitmap with a wrong size still keeps
  // the clusters it names from being taken for leaks).
  void WalkBitmapTable(const BitmapDirectoryEntry& e) {
    const std::string what = fmt::format("bitmap '{}' table", e.name);
    const uint64_t offset = e.bitmap_table_offset;
    const uint64_t entries = e.bitmap_table_size;
    if (entries == 0) return;
    if (entries > kMaxBitmapTableEntries || (offset & (cs_ - 1)) || offset == 0) {
      return Corruption(
          fmt::format("ERROR {} at {:#x} ({} entries) is invalid", what, offset, entries));
    }
    if (!Reference(offset, entries * 8, kExclusiveRole, what)) return;
    std::vector<uint8_t> raw(entries * 8);
    if (!ReadOrReport(offset, raw, what)) return;
    for (uint64_t i = 0; i < entries; ++i) {
      auto entry = DecodeBitmapTableEntry(LoadBe64(&raw[i * 8]), cs_, file_size_);
      if (!entry) {
        Corruption(fmt::format("ERROR {} entry {}: {}", what, i, entry.error().message()));
        continue;
      }
      if (entry->host_offset != 0) {
        Reference(entry->host_offset, cs_, kExclusiveRole, fmt::format("{} data", what));
      }
    }
  }

  // ---- on-disk refcounts ----

  std::vector<uint8_t>* Block(uint64_t rt_index) {
    if (rt_index >= rt_.size() || rt_[rt_index] == 0) return nullptr;
    auto it = blocks_.find(rt_index);
    if (it != blocks_.end()) return &it->second;
    std::vector<uint8_t> block(cs_);
    if (!ReadOrReport(rt_[rt_index], block, fmt::format("refcount block {}", rt_index))) {
      std::fill(block.begin(), block.end(), 0);
    }
    return &(blocks_[rt_index] = std::move(block));
  }

  uint64_t OnDiskRefcount(uint64_t cluster) {
    std::vector<uint8_t>* b = Block(cluster / rb_entries_);
    return b ? GetRefcount(*b, h_.refcount_order, cluster % rb_entries_) : 0;
  }

  // Appends a zeroed refcount block for table slot `rt_index` at the end of
  // the file; the block's own refcount goes into itself or an existing block.
  bool AllocateBlock(uint64_t rt_index) {
    uint64_t cluster = next_free_cluster_;
    uint64_t own = cluster / rb_entries_;
    if (own != rt_index && !Block(own)) return false;
    ++next_free_cluster_;
    rt_[rt_index] = cluster * cs_;
    rt_dirty_ = true;
    blocks_[rt_index] = std::vector<uint8_t>(cs_, 0);
    dirty_blocks_.insert(rt_index);
    SetRefcount(*Block(own), h_.refcount_order, cluster % rb_entries_, 1);
    dirty_blocks_.insert(own);
    highest_cluster_ = std::max(highest_cluster_, cluster);
    r_.messages.push_back(fmt::format("Allocated refcount block {} at {:#x}", rt_index,
                                      cluster * cs_));
    return true;
  }

  bool SetOnDiskRefcount(uint64_t cluster, uint64_t value) {
    uint64_t i = cluster / rb_entries_;
    if (i >= rt_.size()) return false;  // growing the refcount table is not done here
    if (value > MaxRefcount(h_.refcount_order)) return false;
    if (rt_[i] == 0 && !AllocateBlock(i)) return false;
    SetRefcount(*Block(i), h_.refcount_order, cluster % rb_entries_, value);
    dirty_blocks_.insert(i);
    return true;
  }

  // ---- step 3 ----
  void CompareRefcounts() {
    // Refcounts of clusters past the end of the file are leaks too.
    for (uint64_t i = nb_clusters_ / rb_entries_; i < rt_.size(); ++i) {
      if (!Block(i)) continue;
      for (uint64_t k = 0; k < rb_entries_; ++k) {
        uint64_t c = i * rb_entries_ + k;
        if (c < nb_clusters_) continue;
        uint64_t r = GetRefcount(*Block(i), h_.refcount_order, k);
        if (r != 0) Mismatch(c, r, 0);
      }
    }
    for (uint64_t c = 0; c < nb_clusters_; ++c) {
      uint64_t r = OnDiskRefcount(c);
      uint64_t e = refs_[c];
      uint64_t after = r;
      if (r != e) after = Mismatch(c, r, e);
      if (after > 0 || e > 0) highest_cluster_ = std::max(highest_cluster_, c);
    }
    r_.image_end_offset = (highest_cluster_ + 1) * cs_;
  }

  // Reports (and if allowed repairs) one refcount mismatch; returns the
  // refcount now on disk.
  uint64_t Mismatch(uint64_t c, uint64_t r, uint64_t e) {
    bool leak = r > e;
    bool may_fix = leak ? mode_ != RepairMode::kNone : mode_ == RepairMode::kAll;
    std::string line = fmt::format("cluster {} refcount={} reference={}", c, r, e);
    if (may_fix && SetOnDiskRefcount(c, e)) {
      ++(leak ? r_.leaks_fixed : r_.corruptions_fixed);
      r_.messages.push_back("Repairing " + line);
      return e;
    }
    ++(leak ? r_.leaks : r_.corruptions);
    r_.messages.push_back((leak ? "Leaked " : "ERROR ") + line);
    return r;
  }

  // ---- step 4 ----
  bool FixCopied(uint64_t& entry, uint64_t refcount, const std::string& what) {
    bool want = refcount == 1;
    if (bool(entry & kCopied) == want) return false;
    std::string line = fmt::format("OFLAG_COPIED {}={:#x} refcount={}", what, entry, refcount);
    if (mode_ == RepairMode::kAll) {
      entry ^= kCopied;
      ++r_.corruptions_fixed;
      r_.messages.push_back("Repairing " + line);
      return true;
    }
    Corruption("ERROR " + line);
    return false;
  }

  void CheckCopiedFlags() {
    const uint32_t esize = h_.l2_entry_size();
    for (uint64_t i = 0; i < active_l1_.size(); ++i) {
      uint64_t l2 = L1Offset(active_l1_[i]);
      if (l2 == 0 || (l2 & (cs_ - 1)) || l2 / cs_ >= nb_clusters_) continue;
      if (FixCopied(active_l1_[i], OnDiskRefcount(l2 / cs_),
                    fmt::format("L2 cluster: l1_index={} l1_entry", i))) {
        l1_dirty_ = true;
      }
      auto it = dirty_l2_.find(l2);
      std::vector<uint8_t> table;
      if (it != dirty_l2_.end()) {
        table = it->second;
      } else {
        table.resize(cs_);
        if (!ReadOrReport(l2, table, fmt::format("L2 table at {:#x}", l2))) continue;
      }
      bool changed = false;
      for (uint64_t k = 0; k < h_.l2_entries(); ++k) {
        uint64_t entry = LoadBe64(&table[k * esize]);
        uint64_t bitmap = h_.extended_l2() ? LoadBe64(&table[k * esize + 8]) : 0;
        auto m = DecodeL2Entry(entry, bitmap, h_.extended_l2(), h_.cluster_bits);
        if (!m.has_value() || m->kind == ClusterKind::kCompressed || m->host_offset == 0 ||
            m->host_offset / cs_ >= nb_clusters_) {
          continue;
        }
        if (FixCopied(entry, OnDiskRefcount(m->host_offset / cs_), "data cluster: l2_entry")) {
          StoreBe64(&table[k * esize], entry);
          changed = true;
        }
      }
      if (changed) dirty_l2_[l2] = std::move(table);
    }
  }

  // ---- step 5 ----
  Status WriteBack() {
    bool wrote = false;
    if (drop_bitmaps_) {
      // The header goes first: refcounts of what it named are lowered below
      // only once nothing names it.
      Header h = h_;
      h.bitmaps.reset();
      h.autoclear_features &= ~kAutoclearBitmaps;
      std::erase_if(h.unknown_extensions,
                    [](const RawExtension& e) { return e.type == kExtBitmaps; });
      TD_RETURN_IF_ERROR(RewriteHeader(s_, h));
      h_ = h;
    }
    for (uint64_t i : dirty_blocks_) {
      TD_RETURN_IF_ERROR(s_.WriteAt(rt_[i], blocks_[i]));
      wrote = true;
    }
    if (rt_dirty_) {
      std::vector<uint8_t> raw(rt_.size() * 8);
      for (uint64_t i = 0; i < rt_.size(); ++i) StoreBe64(&raw[i * 8], rt_[i]);
      // The refcount table points at the new blocks only once they are written.
      TD_RETURN_IF_ERROR(s_.Flush());
      TD_RETURN_IF_ERROR(s_.WriteAt(h_.refcount_table_offset, raw));
      wrote = true;
    }
    for (auto& [offset, table] : dirty_l2_) {
      TD_RETURN_IF_ERROR(s_.WriteAt(offset, table));
      wrote = true;
    }
    if (l1_dirty_) {
      std::vector<uint8_t> raw(active_l1_.size() * 8);
      for (uint64_t i = 0; i < active_l1_.size(); ++i) StoreBe64(&raw[i * 8], active_l1_[i]);
      TD_RETURN_IF_ERROR(s_.WriteAt(h_.l1_table_offset, raw));
      wrote = true;
    }
    if (mode_ != RepairMode::kNone && h_.version == 3 && r_.corruptions == 0 &&
        r_.check_errors == 0) {
      uint64_t features = h_.incompatible_features & ~kIncompatDirty;
      if (mode_ == RepairMode::kAll) features &= ~kIncompatCorrupt;
      if (features != h_.incompatible_features) {
        TD_RETURN_IF_ERROR(s_.Flush());
        uint8_t raw[8];
        StoreBe64(raw, features);
        TD_RETURN_IF_ERROR(s_.WriteAt(72, raw));
        wrote = true;
      }
    }
    return wrote ? s_.Flush() : Status::Ok();
  }

  io::Storage& s_;
  const RepairMode mode_;
  Header h_;
  uint64_t file_size_ = 0;
  uint64_t cs_ = 0;
  uint64_t nb_clusters_ = 0;
  uint64_t rb_entries_ = 0;
  uint64_t next_free_cluster_ = 0;  // where repair appends new refcount blocks
  uint64_t highest_cluster_ = 0;
  uint64_t next_contiguous_ = 0;  // fragmentation: where the next data cluster "should" be
  std::vector<uint32_t> refs_;    // references found, per cluster (saturating)
  std::vector<uint8_t> roles_;
  std::vector<uint64_t> rt_;  // refcount table; 0 also for invalid entries
  bool rt_dirty_ = false;
  std::map<uint64_t, std::vector<uint8_t>> blocks_;  // rt index -> refcount block
  std::set<uint64_t> dirty_blocks_;
  std::vector<uint64_t> active_l1_;
  bool l1_dirty_ = false;
  std::map<uint64_t, std::vector<uint8_t>> dirty_l2_;  // offset -> repaired L2 table
  bool drop_bitmaps_ = false;  // kAll: the bitmaps extension does not decode
  CheckReport r_;
};

}  // namespace

Result<CheckReport> Check(io::Storage& storage, RepairMode mode) {
  Checker checker(storage, mode);
  return checker.Run();
}

}  // namespace thindisk::qcow2
