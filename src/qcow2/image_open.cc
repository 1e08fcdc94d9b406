// Opening and closing a qcow2 image.
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "qcow2/check.h"
#include "qcow2/image_impl.h"
#include "qcow2/snapshot.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

// The header, its extensions and the backing name all lie in the first
// cluster, which is at most 2 MiB.
constexpr uint64_t kMaxHeadBytes = 2ull << 20;

std::string Hex(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

Result<Header> ReadHeader(io::Storage& storage, uint64_t* file_size) {
  TD_ASSIGN_OR_RETURN(*file_size, storage.Size());
  std::vector<uint8_t> head(std::min(*file_size, kMaxHeadBytes));
  TD_RETURN_IF_ERROR(storage.ReadAt(0, head));
  return DecodeHeader(head, *file_size);
}

// Points `h` at the snapshot `sel` names: its L1 table and virtual size
// (the current one when the table entry has no disk_size, as in old
// version 2 images). The snapshot table was validated when decoded; the L1
// table's place and the size are checked here against the file and the
// format's limits.
Status UseSnapshotView(io::Storage& storage, uint64_t file_size, const SnapshotSelector& sel,
                       Header* h) {
  TD_ASSIGN_OR_RETURN(std::vector<Snapshot> snaps, ReadSnapshotTable(storage, *h));
  int idx = MatchSnapshot(snaps, sel);
  if (idx < 0) return Status::NotFound("no snapshot " + sel.Describe() + " in the image");
  const Snapshot& sn = snaps[size_t(idx)];
  uint64_t size = sn.extra.size() >= 16 ? sn.disk_size : h->size;
  uint64_t l1_bytes = uint64_t{sn.l1_size} * 8;
  if (size > kMaxVirtualSize || l1_bytes > kMaxL1Bytes ||
      (sn.l1_size != 0 && (sn.l1_table_offset > file_size ||
                           l1_bytes > file_size - sn.l1_table_offset))) {
    return Status::Corrupt("snapshot " + sn.id + " has an invalid L1 table or disk size");
  }
  h->l1_table_offset = sn.l1_table_offset;
  h->l1_size = sn.l1_size;
  h->size = size;
  return Status::Ok();
}

}  // namespace

Image::~Image() = default;

Result<std::unique_ptr<Image>> Image::Open(std::unique_ptr<io::Storage> storage,
                                           const OpenOptions& options) {
  if (!storage) return Status::InvalidArgument("no storage");
  const std::string name = storage->name();
  uint64_t file_size = 0;
  auto header = ReadHeader(*storage, &file_size);
  if (!header) return header.error().WithContext(name);

  bool read_only = options.read_only;
  if (!options.snapshot.empty()) {
    // A snapshot's view is only read: its clusters are shared with the
    // active image and other snapshots, and the header names another L1.
    read_only = true;
    Status s = UseSnapshotView(*storage, file_size, options.snapshot, &*header);
    if (!s.ok()) return s.WithContext(name);
  }
  if (header->incompatible_features & kIncompatCorrupt) {
    if (!read_only) {
      fprintf(stderr, "thindisk: %s: image is marked corrupt; opened read-only\n", name.c_str());
    }
    read_only = true;
  }
  if (!read_only && (header->incompatible_features & kIncompatDirty)) {
    // Lazy refcounts left the refcounts stale: rebuild them before use.
    auto report = Check(*storage, RepairMode::kAll);
    if (!report) return report.error().WithContext(name + ": repairing dirty image");
    header = ReadHeader(*storage, &file_size);
    if (!header) return header.error().WithContext(name);
  }

  auto image = std::make_unique<ImageImpl>(std::move(storage), std::move(*header), read_only);
  Status s = image->Init(options, file_size);
  if (!s.ok()) {
    image->Abandon();  // half-initialized: nothing to flush
    return s.WithContext(name);
  }
  return std::unique_ptr<Image>(std::move(image));
}

ImageImpl::ImageImpl(std::unique_ptr<io::Storage> storage, Header header, bool read_only)
    : storage_(std::move(storage)),
      read_only_(read_only),
      cluster_bits_(header.cluster_bits),
      cluster_size_(header.cluster_size()),
      extended_(header.extended_l2()),
      subcluster_size_(header.subcluster_size()),
      l2_entries_(header.l2_entries()),
      l2_entry_size_(header.l2_entry_size()),
      l2_slice_size_(std::min<uint64_t>(cluster_size_, kL2SliceSize)),
      l2_slice_entries_(l2_slice_size_ / l2_entry_size_),
      version_(header.version),
      compression_type_(header.compression_type),
      header_(std::move(header)) {
  size_ = header_.size;
  info_.format = "qcow2";
  info_.filename = storage_->name();
  info_.cluster_size = uint32_t(cluster_size_);
  info_.preferred_block = uint32_t(std::max<uint64_t>(subcluster_size_, 512));
  info_.read_only = read_only_;
}

ImageImpl::~ImageImpl() {
  if (!closed_.load()) (void)Close();
}

Status ImageImpl::Init(const OpenOptions& options, uint64_t file_size) {
  // Nothing else can reach the image yet, so holding mu_ throughout costs
  // no one a wait; it keeps the members' one contract (image_impl.h).
  util::MutexLock lock(mu_);
  // 1. Feature bits a writer must settle before anything else.
  if (!read_only_) {
    bool rewrite = false;
    if (header_.autoclear_features & ~kAutoclearKnown) {
      // Spec: software that does not maintain an autoclear feature clears
      // its bit when it opens the image read-write.
      header_.autoclear_features &= kAutoclearKnown;
      rewrite = true;
    }
    if ((header_.autoclear_features & kAutoclearBitmaps) && !header_.bitmaps) {
      // The bitmaps bit without the extension is an error (spec): drop it.
      header_.autoclear_features &= ~kAutoclearBitmaps;
      rewrite = true;
    }
    if (header_.incompatible_features & kIncompatDirty) {
      header_.incompatible_features &= ~kIncompatDirty;  // repaired in Open
      rewrite = true;
    }
    if (rewrite) {
      TD_RETURN_IF_ERROR(WriteHeaderLocked());
      TD_RETURN_IF_ERROR(storage_->Flush());
    }
  }

  // 2. The L1 table; the codec validated its size, we validate entries.
  uint64_t per_l1 = l2_entries_ * cluster_size_;
  uint64_t needed = (header_.size + per_l1 - 1) / per_l1;
  // A snapshot taken before the image grew may have a shorter L1 (it was
  // given the disk size of the time): the missing entries are unallocated.
  const bool snapshot_view = !options.snapshot.empty();
  if (header_.l1_size < needed && !snapshot_view) {
    return Status::Corrupt("L1 table has " + std::to_string(header_.l1_size) +
                           " entries, the virtual size needs " + std::to_string(needed));
  }
  std::vector<uint8_t> raw(uint64_t(header_.l1_size) * 8);
  TD_RETURN_IF_ERROR(storage_->ReadAt(header_.l1_table_offset, raw));
  l1_.resize(header_.l1_size);
  uint64_t file_end = (file_size + cluster_size_ - 1) & ~(cluster_size_ - 1);
  for (uint64_t i = 0; i < l1_.size(); ++i) {
    uint64_t e = LoadBe64(&raw[i * 8]);
    uint64_t off = L1Offset(e);
    bool bad = (e & kL1Reserved) != 0;
    if (off != 0) {
      bad = bad || (off & (cluster_size_ - 1)) || off < cluster_size_ ||
            off + cluster_size_ > file_end;
    }
    if (bad) {
      return Status::Corrupt("L1 entry " + std::to_string(i) + " (" + Hex(e) +
                             ") is invalid: reserved bits, unaligned, or outside the file");
    }
    l1_[i] = e;
  }
  if (snapshot_view && l1_.size() < needed) l1_.resize(needed, 0);

  // 3. Caches and allocator: refcount blocks get an eighth of the budget.
  uint64_t tables = std::max<uint64_t>(options.cache_bytes / cluster_size_, 8);
  size_t rc_tables = size_t(std::max<uint64_t>(tables / 8, 2));
  size_t l2_tables = size_t(std::max<uint64_t>(tables - tables / 8, 4));
  // The caches call it to make room, from calls made with mu_ held.
  auto flush_hook = [this]() TD_REQUIRES(mu_) { return FlushMetadataLocked(); };
  // The L2 budget in slices, each charged its bookkeeping too (the Table,
  // its map and LRU entries: about 220 bytes, 5% of a 4 KiB slice), so the
  // cache stays within its bytes (docs/serve-limits.md).
  const uint64_t slices_per_table = cluster_size_ / l2_slice_size_;
  const uint64_t slices = slices_per_table == 1
                              ? l2_tables
                              : std::max(l2_tables * cluster_size_ /
                                             (l2_slice_size_ + TableCache::kBookkeeping),
                                         4 * slices_per_table);
  l2_cache_ = std::make_unique<TableCache>(*storage_, l2_slice_size_, size_t(slices),
                                           flush_hook, io::Event::kL2Alloc,
                                           io::Event::kL2Update, cluster_size_);
  TD_ASSIGN_OR_RETURN(allocator_,
                      Allocator::Open(*storage_, header_, file_size, rc_tables, flush_hook));
  // Single clusters come from a reserve: a flush then rarely writes a
  // refcount block.
  if (!read_only_) allocator_->SetReserve(Allocator::DefaultReserve(cluster_size_));

  // 4. Persistent bitmaps: a snapshot's view has none (they follow the
  // active disk); a writer tracks the enabled ones from here on.
  if (!read_only_) {
    tracker_ = std::make_unique<BitmapTracker>(*storage_, cluster_size_, options.bitmap_mark_ahead);
  }
  if (!snapshot_view) TD_RETURN_IF_ERROR(OpenBitmapsLocked());

  // 5. The backing file.
  if (!header_.backing_file.empty() && !options.no_backing) {
    if (!options.open_backing) {
      return Status::InvalidArgument("image has backing file '" + header_.backing_file +
                                     "' but no way to open it was given");
    }
    auto backing = options.open_backing(header_.backing_file, header_.backing_format);
    if (!backing) {
      return backing.error().WithContext("backing file '" + header_.backing_file + "'");
    }
    backing_ = std::move(*backing);
  }
  return Status::Ok();
}

std::string ImageImpl::GuestPos(uint64_t guest_cluster) const {
  return "guest offset " + Hex(guest_cluster << cluster_bits_);
}

Status ImageImpl::CheckRange(uint64_t offset, uint64_t length) const {
  uint64_t size = size_.load();
  if (offset > size || length > size - offset) {
    return Status::OutOfRange("request [" + Hex(offset) + ", +" + Hex(length) +
                              ") ends past the image size " + Hex(size));
  }
  if (closed_.load()) return Status::InvalidArgument("image is closed");
  return Status::Ok();
}

Status ImageImpl::Close() {
  util::MutexLock flush_lock(flush_mu_);
  if (closed_.load()) return Status::Ok();
  Status s = Status::Ok();
  if (!read_only_) {
    {
      util::MutexLock lock(mu_);
      s = allocator_->ReleaseReserve();
    }
    if (s.ok()) s = FlushAll();
  }
  // Frees applied by the last stage 5 are still dirty refcounts: write them.
  if (s.ok() && !read_only_) {
    util::MutexLock lock(mu_);
    s = FlushMetadataLocked();
  }
  // Every change is durable now: the bitmaps can hold exactly their
  // changes instead of the regions marked ahead.
  if (s.ok() && tracker_) s = tracker_->WriteBack();
  closed_ = true;
  if (backing_) {
    Status b = backing_->Close();
    if (s.ok()) s = b;
  }
  return s;
}

}  // namespace thindisk::qcow2
