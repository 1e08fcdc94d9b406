#include "qcow2/compact.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <unordered_map>
#include <vector>

#include "io/qemu_lock.h"
#include "qcow2/bitmaps.h"
#include "qcow2/check.h"
#include "qcow2/format.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// The header, its extensions and the backing name lie in the first cluster.
constexpr uint64_t kMaxHeadBytes = 2ull << 20;
// Read at most this much of a snapshot table: 65536 entries with maximal
// names and extra data stay below it.
constexpr uint64_t kMaxSnapshotTableBytes = 64ull << 20;
// All-zero runs of this size in data clusters are left as holes.
constexpr uint64_t kSparseGrain = 4096;

uint64_t DivRoundUp(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

struct DataRef {
  uint64_t index = 0;  // position among the new data clusters (or blobs)
  uint64_t refs = 0;   // L1 paths that reach it (its refcount)
};

class Compactor {
 public:
  Compactor(io::Storage& src, io::Storage& dst, const CompactProgress& progress,
            bool drop_bitmaps)
      : src_(src), dst_(dst), progress_(progress), drop_bitmaps_(drop_bitmaps) {}

  Result<CompactStats> Run() {
    TD_RETURN_IF_ERROR(Load());
    TD_RETURN_IF_ERROR(Plan());
    Layout();
    TD_RETURN_IF_ERROR(WriteL2AndData());
    TD_RETURN_IF_ERROR(WriteTables());
    stats_.l2_tables = l2_old_.size();
    stats_.data_clusters = n_data_;
    stats_.compressed_clusters = n_blobs_;
    TD_ASSIGN_OR_RETURN(stats_.new_file_size, dst_.Size());
    return stats_;
  }

 private:
  // 1. Header, L1 tables and snapshots; what cannot be compacted is refused.
  Status Load() {
    TD_ASSIGN_OR_RETURN(uint64_t file_size, src_.Size());
    stats_.old_file_size = file_size;
    std::vector<uint8_t> head(std::min(file_size, kMaxHeadBytes));
    TD_RETURN_IF_ERROR(src_.ReadAt(0, head));
    TD_ASSIGN_OR_RETURN(h_, DecodeHeader(head, file_size));
    if (h_.incompatible_features & kIncompatCorrupt) {
      return Status::Corrupt("image is marked corrupt; repair it (check -r all) first");
    }
    if (h_.bitmaps && !drop_bitmaps_) {
      return Status::NotSupported(
          "image has persistent dirty bitmaps, which a rewrite would drop (CompactFile carries "
          "them over)");
    }
    auto report = Check(src_, RepairMode::kNone);
    if (!report) return report.error();
    if (report->corruptions != 0 || report->check_errors != 0) {
      return Status::Corrupt("check finds " + std::to_string(report->corruptions) +
                             " corruptions; repair the image (check -r all) first");
    }
    cs_ = h_.cluster_size();
    TD_ASSIGN_OR_RETURN(auto active, ReadL1(h_.l1_table_offset, h_.l1_size));
    l1s_.push_back(std::move(active));
    if (h_.nb_snapshots != 0) {
      uint64_t n = std::min(kMaxSnapshotTableBytes, file_size - std::min(file_size, h_.snapshots_offset));
      std::vector<uint8_t> raw(n);
      TD_RETURN_IF_ERROR(src_.ReadAt(h_.snapshots_offset, raw));
      TD_ASSIGN_OR_RETURN(snapshots_, DecodeSnapshotTable(raw, h_.nb_snapshots, h_.cluster_bits));
      for (const Snapshot& s : snapshots_) {
        TD_ASSIGN_OR_RETURN(auto l1, ReadL1(s.l1_table_offset, s.l1_size));
        l1s_.push_back(std::move(l1));
      }
    }
    return Status::Ok();
  }

  Result<std::vector<uint64_t>> ReadL1(uint64_t offset, uint32_t entries) {
    if (uint64_t(entries) * 8 > kMaxL1Bytes) return Status::Corrupt("L1 table too large");
    std::vector<uint8_t> raw(uint64_t(entries) * 8);
    TD_RETURN_IF_ERROR(src_.ReadAt(offset, raw));
    std::vector<uint64_t> l1(entries);
    for (uint64_t i = 0; i < entries; ++i) l1[i] = LoadBe64(&raw[i * 8]);
    return l1;
  }

  Status ReadL2(uint64_t offset, std::vector<uint8_t>* table) {
    table->resize(cs_);
    return src_.ReadAt(offset, *table);
  }

  bool HoldsData(const L2Mapping& m) const {
    return m.kind == ClusterKind::kNormal && m.host_offset != 0 &&
           (!h_.extended_l2() || m.alloc_bitmap != 0);
  }

  Result<L2Mapping> Entry(const std::vector<uint8_t>& table, uint64_t k) const {
    const uint8_t* p = &table[k * h_.l2_entry_size()];
    return DecodeL2Entry(LoadBe64(p), h_.extended_l2() ? LoadBe64(p + 8) : 0, h_.extended_l2(),
                         h_.cluster_bits);
  }

  // 2. Which L2 tables, data clusters and compressed clusters survive, in
  // the order they will be written, with their reference counts.
  Status Plan() {
    const bool shared = !snapshots_.empty();
    for (const auto& l1 : l1s_) {
      for (uint64_t e : l1) {
        uint64_t off = L1Offset(e);
        if (off == 0) continue;
        auto [it, added] = l2_index_.try_emplace(off, l2_old_.size());
        if (added) {
          l2_old_.push_back(off);
          l2_refs_.push_back(0);
        }
        ++l2_refs_[it->second];
      }
    }
    std::vector<uint8_t> table;
    for (size_t t = 0; t < l2_old_.size(); ++t) {
      TD_RETURN_IF_ERROR(ReadL2(l2_old_[t], &table));
      for (uint64_t k = 0; k < h_.l2_entries(); ++k) {
        TD_ASSIGN_OR_RETURN(L2Mapping m, Entry(table, k));
        if (HoldsData(m)) {
          if (!shared) {
            ++n_data_;
            continue;
          }
          auto [it, added] = data_map_.try_emplace(m.host_offset, DataRef{n_data_, 0});
          if (added) {
            ++n_data_;
            data_refs_.push_back(0);
          }
          data_refs_[it->second.index] += l2_refs_[t];
        } else if (m.kind == ClusterKind::kCompressed) {
          PlanBlob(m, l2_refs_[t], shared);
        }
      }
    }
    return Status::Ok();
  }

  // Compressed data keeps its offset inside a 512-byte sector, so the
  // entry's sector count (and the bytes it names) stay the same; a blob
  // starts a new cluster rather than straddle two when it can.
  void PlanBlob(const L2Mapping& m, uint64_t refs, bool shared) {
    uint64_t index = n_blobs_;
    if (shared) {
      auto [it, added] = blob_map_.try_emplace(m.host_offset, DataRef{n_blobs_, 0});
      index = it->second.index;
      if (!added) {
        AddBlobRefs(blob_place_[index], BlobSpan(m), refs);
        return;
      }
    }
    uint64_t span = BlobSpan(m);
    uint64_t p = blob_cursor_;
    if (p % cs_ != 0 && p % cs_ + span > cs_) p = DivRoundUp(p, cs_) * cs_;
    blob_place_.push_back(p);
    blob_cursor_ = p + span;
    ++n_blobs_;
    AddBlobRefs(p, span, refs);
    (void)index;
  }

  static uint64_t BlobSpan(const L2Mapping& m) {
    return DivRoundUp((m.host_offset & 511) + m.compressed_size, 512) * 512;
  }

  void AddBlobRefs(uint64_t place, uint64_t span, uint64_t refs) {
    uint64_t last = (place + span - 1) / cs_;
    if (blob_cluster_refs_.size() <= last) blob_cluster_refs_.resize(last + 1, 0);
    for (uint64_t c = place / cs_; c <= last; ++c) blob_cluster_refs_[c] += refs;
  }

  // 3. Where everything goes (cluster indices).
  void Layout() {
    const uint64_t l1_clusters = DivRoundUp(uint64_t(h_.l1_size) * 8, cs_);
    snapshot_table_ = EncodeSnapshotTable(snapshots_);
    uint64_t fixed = 1 + l1_clusters + DivRoundUp(snapshots_.empty() ? 0 : snapshot_table_.size(), cs_);
    for (const Snapshot& s : snapshots_) fixed += DivRoundUp(uint64_t(s.l1_size) * 8, cs_);
    const uint64_t blob_clusters = DivRoundUp(blob_cursor_, cs_);
    const uint64_t rb_entries = cs_ * 8 / h_.refcount_bits();
    rt_ = 1;
    rb_ = 1;
    while (true) {
      total_ = fixed + rt_ + rb_ + l2_old_.size() + n_data_ + blob_clusters;
      uint64_t rb = DivRoundUp(total_, rb_entries);
      uint64_t rt = DivRoundUp(rb * 8, cs_);
      if (rb == rb_ && rt == rt_) break;
      rb_ = std::max(rb_, rb);
      rt_ = std::max(rt_, rt);
    }
    rb_start_ = 1 + rt_;
    l1_start_ = rb_start_ + rb_;
    snap_start_ = l1_start_ + l1_clusters;
    l2_start_ = fixed + rt_ + rb_;
    data_start_ = l2_start_ + l2_old_.size();
    blob_start_ = data_start_ + n_data_;
  }

  // 4. L2 tables, each followed by copying the data it newly reaches.
  Status WriteL2AndData() {
    const bool shared = !snapshots_.empty();
    const uint64_t total_work = n_data_ + n_blobs_;
    uint64_t next_data = 0, next_blob = 0;
    std::vector<uint8_t> table, out(cs_), cluster(cs_);
    for (size_t t = 0; t < l2_old_.size(); ++t) {
      TD_RETURN_IF_ERROR(ReadL2(l2_old_[t], &table));
      std::fill(out.begin(), out.end(), 0);
      for (uint64_t k = 0; k < h_.l2_entries(); ++k) {
        TD_ASSIGN_OR_RETURN(L2Mapping m, Entry(table, k));
        L2Mapping n = m;
        n.copied = false;
        if (HoldsData(m)) {
          DataRef ref{next_data, l2_refs_[t]};
          if (shared) ref = {data_map_.at(m.host_offset).index, 0};
          if (shared) ref.refs = data_refs_[ref.index];
          n.host_offset = (data_start_ + ref.index) * cs_;
          n.copied = ref.refs == 1;
          if (ref.index == next_data) {
            TD_RETURN_IF_ERROR(CopyCluster(m, n.host_offset, &cluster));
            ++next_data;
          }
        } else if (m.kind == ClusterKind::kCompressed) {
          uint64_t index = shared ? blob_map_.at(m.host_offset).index : next_blob;
          uint64_t place = blob_start_ * cs_ + blob_place_[index];
          n.host_offset = place + (m.host_offset & 511);
          if (index == next_blob) {
            std::vector<uint8_t> bytes(BlobSpan(m));
            TD_RETURN_IF_ERROR(src_.ReadAt(m.host_offset & ~uint64_t{511}, bytes));
            TD_RETURN_IF_ERROR(dst_.WriteAt(place, bytes));
            ++next_blob;
          }
        } else if (m.host_offset != 0) {
          // Zero cluster or no allocated subcluster: its host space goes.
          n.host_offset = 0;
          if (m.kind == ClusterKind::kNormal) n.kind = ClusterKind::kUnallocated;
        }
        L2Words w = EncodeL2Entry(n, h_.extended_l2(), h_.cluster_bits);
        StoreBe64(&out[k * h_.l2_entry_size()], w.entry);
        if (h_.extended_l2()) StoreBe64(&out[k * h_.l2_entry_size() + 8], w.bitmap);
      }
      TD_RETURN_IF_ERROR(dst_.WriteAt((l2_start_ + t) * cs_, out));
      if (progress_) progress_(next_data + next_blob, total_work);
    }
    return Status::Ok();
  }

  // Copies one data cluster, leaving all-zero blocks (and, with extended
  // L2, subclusters that are not allocated) as holes.
  Status CopyCluster(const L2Mapping& m, uint64_t to, std::vector<uint8_t>* buf) {
    TD_RETURN_IF_ERROR(src_.ReadAt(m.host_offset, *buf));
    if (h_.extended_l2()) {
      uint64_t scs = h_.subcluster_size();
      for (uint32_t s = 0; s < 32; ++s) {
        if (!(m.alloc_bitmap >> s & 1)) std::fill_n(buf->begin() + s * scs, scs, 0);
      }
    }
    for (uint64_t pos = 0; pos < cs_;) {
      uint64_t n = std::min(kSparseGrain, cs_ - pos);
      auto piece = std::span<const uint8_t>(*buf).subspan(pos, n);
      if (std::any_of(piece.begin(), piece.end(), [](uint8_t b) { return b != 0; })) {
        TD_RETURN_IF_ERROR(dst_.WriteAt(to + pos, piece));
      }
      pos += n;
    }
    return Status::Ok();
  }

  uint64_t RefcountOf(uint64_t c) const {
    if (c < l2_start_) return 1;
    if (c < data_start_) return l2_refs_[c - l2_start_];
    if (c < blob_start_) return data_refs_.empty() ? 1 : data_refs_[c - data_start_];
    return blob_cluster_refs_[c - blob_start_];
  }

  Status WriteL1(uint64_t at, const std::vector<uint64_t>& l1) {
    if (l1.empty()) return Status::Ok();
    std::vector<uint8_t> raw(DivRoundUp(l1.size() * 8, cs_) * cs_, 0);
    for (size_t i = 0; i < l1.size(); ++i) {
      uint64_t off = L1Offset(l1[i]);
      if (off == 0) continue;
      uint64_t t = l2_index_.at(off);
      StoreBe64(&raw[i * 8], (l2_start_ + t) * cs_ | (l2_refs_[t] == 1 ? kCopied : 0));
    }
    return dst_.WriteAt(at, raw);
  }

  // 5. L1 tables, snapshot table, refcounts, and the header last.
  Status WriteTables() {
    TD_RETURN_IF_ERROR(WriteL1(l1_start_ * cs_, l1s_[0]));
    uint64_t at = snap_start_ * cs_;
    if (!snapshots_.empty()) at += DivRoundUp(snapshot_table_.size(), cs_) * cs_;
    for (size_t i = 0; i < snapshots_.size(); ++i) {
      snapshots_[i].l1_table_offset = snapshots_[i].l1_size ? at : 0;
      TD_RETURN_IF_ERROR(WriteL1(at, l1s_[i + 1]));
      at += DivRoundUp(uint64_t(snapshots_[i].l1_size) * 8, cs_) * cs_;
    }
    if (!snapshots_.empty()) {
      TD_RETURN_IF_ERROR(dst_.WriteAt(snap_start_ * cs_, EncodeSnapshotTable(snapshots_)));
    }
    // Refcounts.
    const uint64_t rb_entries = cs_ * 8 / h_.refcount_bits();
    const uint64_t max_rc = MaxRefcount(h_.refcount_order);
    std::vector<uint8_t> rt(rt_ * cs_, 0), block(cs_);
    for (uint64_t b = 0; b < rb_; ++b) {
      std::fill(block.begin(), block.end(), 0);
      for (uint64_t i = 0; i < rb_entries && b * rb_entries + i < total_; ++i) {
        uint64_t rc = RefcountOf(b * rb_entries + i);
        if (rc > max_rc) return Status::Internal("refcount exceeds the refcount width");
        SetRefcount(block, h_.refcount_order, i, rc);
      }
      TD_RETURN_IF_ERROR(dst_.WriteAt((rb_start_ + b) * cs_, block));
      StoreBe64(&rt[b * 8], (rb_start_ + b) * cs_);
    }
    TD_RETURN_IF_ERROR(dst_.WriteAt(cs_, rt));
    TD_ASSIGN_OR_RETURN(uint64_t size, dst_.Size());
    if (size < total_ * cs_) TD_RETURN_IF_ERROR(dst_.Resize(total_ * cs_));
    // The header: same fields and extensions, new table places. A bitmaps
    // extension without its autoclear bit is stale (spec) and goes.
    Header h = h_;
    h.l1_table_offset = h.l1_size ? l1_start_ * cs_ : 0;
    h.refcount_table_offset = cs_;
    h.refcount_table_clusters = uint32_t(rt_);
    h.snapshots_offset = snapshots_.empty() ? 0 : snap_start_ * cs_;
    h.incompatible_features &= ~kIncompatDirty;
    h.autoclear_features &= ~kAutoclearBitmaps;
    h.bitmaps.reset();  // dropped on request: the caller adds them back
    std::erase_if(h.unknown_extensions, [](const RawExtension& e) { return e.type == kExtBitmaps; });
    TD_ASSIGN_OR_RETURN(auto header, EncodeHeader(h));
    return dst_.WriteAt(0, header);
  }

  io::Storage& src_;
  io::Storage& dst_;
  const CompactProgress& progress_;
  const bool drop_bitmaps_;
  CompactStats stats_;
  Header h_;
  uint64_t cs_ = 0;
  std::vector<std::vector<uint64_t>> l1s_;  // active, then each snapshot's
  std::vector<Snapshot> snapshots_;
  std::vector<uint8_t> snapshot_table_;
  std::unordered_map<uint64_t, uint64_t> l2_index_;  // old L2 offset -> position
  std::vector<uint64_t> l2_old_;
  std::vector<uint64_t> l2_refs_;
  uint64_t n_data_ = 0;
  std::unordered_map<uint64_t, DataRef> data_map_;  // with snapshots only
  std::vector<uint64_t> data_refs_;                 // with snapshots only
  uint64_t n_blobs_ = 0;
  std::unordered_map<uint64_t, DataRef> blob_map_;  // with snapshots only
  std::vector<uint64_t> blob_place_;                // byte offset in the blob area
  std::vector<uint64_t> blob_cluster_refs_;
  uint64_t blob_cursor_ = 0;
  uint64_t rt_ = 0, rb_ = 0, total_ = 0;
  uint64_t rb_start_ = 0, l1_start_ = 0, snap_start_ = 0;
  uint64_t l2_start_ = 0, data_start_ = 0, blob_start_ = 0;
};

}  // namespace

Result<CompactStats> CompactImage(io::Storage& src, io::Storage& dst,
                                  const CompactProgress& progress, bool drop_bitmaps) {
  TD_ASSIGN_OR_RETURN(uint64_t dst_size, dst.Size());
  if (dst_size != 0) return Status::InvalidArgument(dst.name() + ": target is not empty");
  Compactor c(src, dst, progress, drop_bitmaps);
  auto r = c.Run();
  if (!r) return r.error().WithContext(src.name());
  return r;
}

namespace {

// Closes the fd when it goes out of scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string DirOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseOf(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A bitmap as CompactFile carries it over.
struct SavedBitmap {
  BitmapInfo info;
  BitVector bits;
};

// The bitmaps of the image at `path`, bits included; kNotSupported naming
// an inconsistent one (it cannot be carried over, and is not dropped
// silently).
Result<std::vector<SavedBitmap>> SaveBitmaps(const std::string& path) {
  io::OpenOptions ro;
  ro.read_only = true;
  TD_ASSIGN_OR_RETURN(auto storage, io::OpenFile(path, ro));
  OpenOptions o;
  o.read_only = true;
  o.no_backing = true;
  TD_ASSIGN_OR_RETURN(auto image, Image::Open(std::move(storage), o));
  TD_ASSIGN_OR_RETURN(std::vector<BitmapInfo> list, ListBitmaps(*image));
  std::vector<SavedBitmap> saved;
  for (const BitmapInfo& b : list) {
    if (!b.consistent()) {
      return Status::NotSupported("bitmap '" + b.name + "' is inconsistent (" + b.problem +
                                  "): remove it before compacting");
    }
    TD_ASSIGN_OR_RETURN(BitVector bits, ReadBitmap(*image, b.name));
    saved.push_back({b, std::move(bits)});
  }
  TD_RETURN_IF_ERROR(image->Close());
  return saved;
}

// Adds `saved` to the image at `path`, as they were.
Status RestoreBitmaps(const std::string& path, const std::vector<SavedBitmap>& saved) {
  TD_ASSIGN_OR_RETURN(auto storage, io::OpenFile(path, io::OpenOptions{}));
  OpenOptions o;
  o.no_backing = true;
  TD_ASSIGN_OR_RETURN(auto image, Image::Open(std::move(storage), o));
  Status s;
  for (const SavedBitmap& b : saved) {
    s = AddBitmap(*image, {b.info.name, b.info.granularity_bits, false});
    if (s.ok() && b.bits.NextSet(0) < b.bits.size()) {
      s = MergeIntoBitmap(*image, b.info.name, b.bits, b.info.granularity_bits);
    }
    if (s.ok() && b.info.enabled) s = SetBitmapEnabled(*image, b.info.name, true);
    if (!s.ok()) break;
  }
  Status closed = image->Close();
  if (!s.ok()) return s.WithContext("carrying bitmap over");
  return closed;
}

Result<CompactStats> BuildTemp(const std::string& path, const std::string& temp,
                               const CompactFileOptions& options, mode_t mode) {
  TD_ASSIGN_OR_RETURN(std::vector<SavedBitmap> bitmaps, SaveBitmaps(path));
  io::OpenOptions ro;
  ro.read_only = true;
  TD_ASSIGN_OR_RETURN(auto src, io::OpenFile(path, ro));
  io::OpenOptions rw;
  TD_ASSIGN_OR_RETURN(auto dst, io::OpenFile(temp, rw));
  TD_ASSIGN_OR_RETURN(CompactStats stats,
                      CompactImage(*src, *dst, options.progress, !bitmaps.empty()));
  if (!bitmaps.empty()) {
    TD_RETURN_IF_ERROR(dst->Flush());
    TD_RETURN_IF_ERROR(RestoreBitmaps(temp, bitmaps));
    TD_ASSIGN_OR_RETURN(stats.new_file_size, dst->Size());
  }
  if (options.on_step) options.on_step(CompactStep::kTempWritten);
  // The new image must be complete and consistent before it may replace
  // the old one.
  auto report = Check(*dst, RepairMode::kNone);
  if (!report) return report.error().WithContext("checking the compacted image");
  if (report->corruptions || report->leaks || report->check_errors) {
    return Status::Internal("the compacted image fails its check (" +
                            std::to_string(report->corruptions) + " corruptions, " +
                            std::to_string(report->leaks) + " leaks); the original is unchanged");
  }
  if (::chmod(temp.c_str(), mode & 07777) != 0) {
    return Status::FromErrno(errno, temp + ": chmod");
  }
  TD_RETURN_IF_ERROR(dst->Flush());
  return stats;
}

}  // namespace

Result<CompactStats> CompactFile(const std::string& path, const CompactFileOptions& options) {
  // 1. Lock the original for the whole operation, exclusively: no qemu
  // process may use it now or open it until we are done.
  auto lock = io::QemuImageLock::Acquire(path, io::QemuLockMode::kExclusive);
  if (!lock) {
    const Status& s = lock.error();
    if (s.code() != Code::kBusy) return s;
    return Status::Busy(s.message() + "; compact needs the image offline", s.error_number());
  }
  struct stat st {};
  if (::fstat(lock->fd(), &st) != 0) return Status::FromErrno(errno, path + ": stat");
  // The rename below would put a file where the node is.
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(
        path + " is not a regular file (" +
        (S_ISBLK(st.st_mode) ? "a block device" : "a special file") +
        "): compact rewrites an image into a new file beside it; "
        "convert it into a file instead");
  }
  if (options.on_step) options.on_step(CompactStep::kLocked);

  // 2. The new image, beside the original (same file system: rename is
  // atomic), complete, checked and durable before anything else happens.
  const std::string dir = DirOf(path);
  std::string temp = dir + "/." + BaseOf(path) + ".compact-XXXXXX";
  Fd temp_fd;
  temp_fd.fd = ::mkostemp(temp.data(), O_CLOEXEC);
  if (temp_fd.fd < 0) return Status::FromErrno(errno, temp + ": creating");
  auto stats = BuildTemp(path, temp, options, st.st_mode);
  if (!stats) {
    ::unlink(temp.c_str());
    return stats.error();
  }
  if (options.on_step) options.on_step(CompactStep::kTempSynced);

  // 3. Switch: rename over the original, then make the rename durable.
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(temp.c_str());
    return Status::FromErrno(e, path + ": renaming the compacted image into place");
  }
  if (options.on_step) options.on_step(CompactStep::kRenamed);
  Fd dir_fd;
  dir_fd.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd.fd < 0 || ::fsync(dir_fd.fd) != 0) {
    return Status::FromErrno(errno, dir + ": syncing the directory");
  }
  if (options.on_step) options.on_step(CompactStep::kDirSynced);
  return stats;
}

}  // namespace thindisk::qcow2
