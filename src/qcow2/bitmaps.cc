// Persistent bitmap operations (bitmaps.h), on the engine's state: each is
// made of the two ordered writes of image_bitmaps.cc (bits into data
// clusters; a new directory named by one header write), after a flush that
// makes every earlier change durable (docs/write-ordering.md "Bitmaps").
#include "qcow2/bitmaps.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "qcow2/image_impl.h"

namespace thindisk::qcow2 {
namespace {

uint64_t DivUp(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

}  // namespace

// Friend of ImageImpl: the bitmap operations, on the engine's state.
class BitmapEditor {
 public:
  explicit BitmapEditor(ImageImpl& img) : img_(img) {}

  Result<std::vector<BitmapInfo>> List();
  Result<BitVector> Read(const std::string& name);
  Status Add(const BitmapAddOptions& o);
  Status Remove(const std::string& name);
  Status Clear(const std::string& name);
  Status SetEnabled(const std::string& name, bool enabled);
  Status Merge(const std::string& dst, const BitVector& src, uint32_t src_bits);

 private:
  Status CheckWritable() const;
  // The directory index of `name`; kNotFound.
  Result<size_t> FindLocked(const std::string& name) const TD_REQUIRES(img_.mu_);
  // Why bitmap `e` cannot be used ("" when it can).
  std::string ProblemLocked(const BitmapDirectoryEntry& e) const TD_REQUIRES(img_.mu_);
  // FindLocked, and kCorrupt for an inconsistent bitmap.
  Result<size_t> FindUsableLocked(const std::string& name) const TD_REQUIRES(img_.mu_);
  // Starts tracking entry `e` (its data clusters all allocated).
  Status TrackLocked(const BitmapDirectoryEntry& e, BitVector bits) TD_REQUIRES(img_.mu_);
  // After a directory switch: apply the deferred frees and write them.
  // REQUIRES mu_ not held.
  Status FlushFrees() TD_REQUIRES(img_.flush_mu_);

  ImageImpl& img_;
};

Status BitmapEditor::CheckWritable() const {
  if (img_.closed_.load()) return Status::InvalidArgument("image is closed");
  if (img_.read_only_) {
    return Status::ReadOnly(img_.info_.filename + ": image is opened read-only");
  }
  if (img_.version_ < 3) {
    return Status::NotSupported(img_.info_.filename +
                                ": version 2 images (compat=0.10) cannot hold bitmaps");
  }
  return Status::Ok();
}

Result<size_t> BitmapEditor::FindLocked(const std::string& name) const {
  if (!img_.bitmap_error_.empty()) {
    return Status::Corrupt("the bitmap directory does not decode: " + img_.bitmap_error_);
  }
  for (size_t i = 0; i < img_.bitmap_dir_.size(); ++i) {
    if (img_.bitmap_dir_[i].name == name) return i;
  }
  return Status::NotFound(fmt::format("no bitmap '{}' in {}", name, img_.info_.filename));
}

std::string BitmapEditor::ProblemLocked(const BitmapDirectoryEntry& e) const {
  if (e.in_use()) return "in use (not saved correctly)";
  Result<uint64_t> file_size = img_.storage_->Size();
  uint64_t end = file_size.has_value() ? *file_size : 0;
  if (img_.allocator_) end = std::max(end, img_.allocator_->host_end());
  return CheckBitmapEntry(e, img_.size_.load(), img_.cs(), end);
}

Result<size_t> BitmapEditor::FindUsableLocked(const std::string& name) const {
  TD_ASSIGN_OR_RETURN(size_t i, FindLocked(name));
  std::string problem = ProblemLocked(img_.bitmap_dir_[i]);
  if (!problem.empty()) {
    return Status::Corrupt(
        fmt::format("bitmap '{}' is {}; it can only be removed", name, problem));
  }
  return i;
}

Status BitmapEditor::TrackLocked(const BitmapDirectoryEntry& e, BitVector bits) {
  TD_ASSIGN_OR_RETURN(std::vector<BitmapTableEntry> table, img_.ReadBitmapTableLocked(e));
  BitmapTracker::Bitmap b;
  b.name = e.name;
  b.granularity_bits = e.granularity_bits;
  for (const BitmapTableEntry& t : table) {
    if (t.host_offset == 0) return Status::Internal("tracked bitmap without a data cluster");
    b.data_clusters.push_back(t.host_offset);
  }
  b.bits = std::move(bits);
  img_.tracker_->Add(std::move(b));
  return Status::Ok();
}

Status BitmapEditor::FlushFrees() {
  TD_RETURN_IF_ERROR(img_.FlushAll());  // stage 5: refcounts lowered in memory
  util::MutexLock lock(img_.mu_);
  return img_.FlushMetadataLocked();
}

Result<std::vector<BitmapInfo>> BitmapEditor::List() {
  util::MutexLock lock(img_.mu_);
  if (!img_.bitmap_error_.empty()) {
    return Status::Corrupt("the bitmap directory does not decode: " + img_.bitmap_error_);
  }
  std::vector<BitmapInfo> out;
  for (const BitmapDirectoryEntry& e : img_.bitmap_dir_) {
    BitmapInfo info;
    info.name = e.name;
    info.granularity_bits = e.granularity_bits;
    info.enabled = e.enabled();
    info.in_use = e.in_use();
    info.problem = ProblemLocked(e);
    out.push_back(std::move(info));
  }
  return out;
}

Result<BitVector> BitmapEditor::Read(const std::string& name) {
  util::MutexLock lock(img_.mu_);
  TD_ASSIGN_OR_RETURN(size_t i, FindUsableLocked(name));
  BitVector bits;
  if (img_.tracker_ && img_.tracker_->CopyExact(name, &bits)) return bits;
  return img_.ReadBitmapBitsLocked(img_.bitmap_dir_[i]);
}

Status BitmapEditor::Add(const BitmapAddOptions& o) {
  TD_RETURN_IF_ERROR(CheckWritable());
  if (o.name.empty() || o.name.size() > kMaxBitmapNameSize) {
    return Status::InvalidArgument(
        fmt::format("a bitmap name is 1 to {} bytes long", kMaxBitmapNameSize));
  }
  util::MutexLock flush_lock(img_.flush_mu_);
  TD_RETURN_IF_ERROR(img_.FlushAll());
  {
    util::MutexLock lock(img_.mu_);
    const uint64_t size = img_.size_.load();
    if (size == 0) {
      return Status::InvalidArgument("an empty disk (0 bytes) has nothing for a bitmap to track");
    }
    TD_RETURN_IF_ERROR(CheckBitmapGeometry(size, o.granularity_bits, img_.cs()));
    if (!img_.bitmap_error_.empty()) {
      return Status::Corrupt("the bitmap directory does not decode: " + img_.bitmap_error_);
    }
    for (const BitmapDirectoryEntry& e : img_.bitmap_dir_) {
      if (e.name == o.name) {
        return Status::InvalidArgument(fmt::format("bitmap '{}' already exists", o.name));
      }
    }
    if (img_.bitmap_dir_.size() >= kMaxBitmaps) {
      return Status::InvalidArgument(
          fmt::format("the image already has {} bitmaps, the most it can hold", kMaxBitmaps));
    }
    // 1. Table and data clusters, all new: an enabled bitmap is tracked,
    //    so every data cluster exists (zeros); a disabled one has none.
    BitmapDirectoryEntry e;
    e.name = o.name;
    e.granularity_bits = uint8_t(o.granularity_bits);
    e.flags = o.enabled ? kBitmapAuto : 0;
    BitVector bits(BitmapBits(size, o.granularity_bits));
    TD_ASSIGN_OR_RETURN(e, img_.WriteNewBitmapLocked(e, bits, o.enabled, nullptr));
    // 2. Tracked before the directory names it, so no change can slip
    //    between the two; until then its marks go to clusters nothing names.
    if (o.enabled) TD_RETURN_IF_ERROR(TrackLocked(e, bits));
    // 3. The directory names it (its flush makes table and data durable first).
    std::vector<BitmapDirectoryEntry> entries = img_.bitmap_dir_;
    entries.push_back(e);
    Status s = img_.StoreBitmapDirectoryLocked(std::move(entries));
    if (!s.ok()) {
      // Not named (the view is unchanged): stop tracking. Named on the
      // engine's view (the header write failed): keep tracking it.
      if (FindLocked(o.name).status().code() == Code::kNotFound) img_.tracker_->Remove(o.name);
      return s;
    }
  }
  return FlushFrees();
}

Status BitmapEditor::Remove(const std::string& name) {
  TD_RETURN_IF_ERROR(CheckWritable());
  util::MutexLock flush_lock(img_.flush_mu_);
  TD_RETURN_IF_ERROR(img_.FlushAll());
  {
    util::MutexLock lock(img_.mu_);
    TD_ASSIGN_OR_RETURN(size_t i, FindLocked(name));
    const BitmapDirectoryEntry e = img_.bitmap_dir_[i];
    // What it holds is freed once the directory no longer names it. A
    // table that does not validate names nothing we may free: its
    // clusters leak (check -r leaks reclaims them), never a cluster in use.
    auto table = img_.ReadBitmapTableLocked(e);
    std::vector<BitmapDirectoryEntry> entries = img_.bitmap_dir_;
    entries.erase(entries.begin() + std::ptrdiff_t(i));
    // A failure may leave the disk naming it still: it stays tracked then,
    // and nothing it holds is freed.
    TD_RETURN_IF_ERROR(img_.StoreBitmapDirectoryLocked(std::move(entries)));
    img_.tracker_->Remove(name);
    // Rule: a refcount is lowered only after nothing points at the cluster.
    if (table) {
      for (const BitmapTableEntry& t : *table) {
        if (t.host_offset != 0) img_.allocator_->DeferFree(t.host_offset, 1);
      }
      img_.allocator_->DeferFree(e.bitmap_table_offset,
                                 DivUp(uint64_t{e.bitmap_table_size} * 8, img_.cs()));
    }
  }
  return FlushFrees();
}

Status BitmapEditor::Clear(const std::string& name) {
  TD_RETURN_IF_ERROR(CheckWritable());
  util::MutexLock flush_lock(img_.flush_mu_);
  // Every change so far is durable before the bits that cover it go.
  TD_RETURN_IF_ERROR(img_.FlushAll());
  util::MutexLock lock(img_.mu_);
  TD_ASSIGN_OR_RETURN(size_t i, FindUsableLocked(name));
  if (BitVector* exact = img_.tracker_->ExactBits(name)) {
    exact->ClearAll();
    return img_.tracker_->WriteBack();
  }
  const BitmapDirectoryEntry& e = img_.bitmap_dir_[i];
  return img_.StoreBitmapBitsLocked(e, BitVector(BitmapBits(img_.size_.load(), e.granularity_bits)),
                                    false);
}

Status BitmapEditor::SetEnabled(const std::string& name, bool enabled) {
  TD_RETURN_IF_ERROR(CheckWritable());
  util::MutexLock flush_lock(img_.flush_mu_);
  TD_RETURN_IF_ERROR(img_.FlushAll());
  {
    util::MutexLock lock(img_.mu_);
    TD_ASSIGN_OR_RETURN(size_t i, FindUsableLocked(name));
    std::vector<BitmapDirectoryEntry> entries = img_.bitmap_dir_;
    BitmapDirectoryEntry& e = entries[i];
    if (e.enabled() == enabled) return Status::Ok();
    if (enabled) {
      // Tracked from before the directory says so: every data cluster
      // allocated, holding its bits.
      TD_ASSIGN_OR_RETURN(BitVector bits, img_.ReadBitmapBitsLocked(e));
      TD_RETURN_IF_ERROR(img_.StoreBitmapBitsLocked(e, bits, true));
      e.flags |= kBitmapAuto;
      TD_RETURN_IF_ERROR(TrackLocked(e, std::move(bits)));
      Status s = img_.StoreBitmapDirectoryLocked(std::move(entries));
      if (!s.ok() && !img_.bitmap_dir_[i].enabled()) img_.tracker_->Remove(name);
      TD_RETURN_IF_ERROR(s);
    } else {
      // Its exact bits are what it keeps from now on; tracked until the
      // directory no longer says it is enabled, whatever fails.
      TD_RETURN_IF_ERROR(img_.tracker_->WriteBack());
      e.flags &= ~kBitmapAuto;
      TD_RETURN_IF_ERROR(img_.StoreBitmapDirectoryLocked(std::move(entries)));
      img_.tracker_->Remove(name);
    }
  }
  return FlushFrees();
}

Status BitmapEditor::Merge(const std::string& dst, const BitVector& src, uint32_t src_bits) {
  TD_RETURN_IF_ERROR(CheckWritable());
  if (src_bits < kMinBitmapGranularityBits || src_bits > kMaxBitmapGranularityBits) {
    return Status::InvalidArgument("the source bitmap's granularity is out of range");
  }
  util::MutexLock flush_lock(img_.flush_mu_);
  TD_RETURN_IF_ERROR(img_.FlushAll());
  util::MutexLock lock(img_.mu_);
  TD_ASSIGN_OR_RETURN(size_t i, FindUsableLocked(dst));
  const BitmapDirectoryEntry& e = img_.bitmap_dir_[i];
  // Each run of source granules marks the destination granules its bytes touch.
  const uint64_t size = img_.size_.load();
  BitVector add(BitmapBits(size, e.granularity_bits));
  for (uint64_t a = src.NextSet(0); a < src.size();) {
    const uint64_t b = src.NextClear(a);
    const uint64_t first = (a << src_bits) >> e.granularity_bits;
    const uint64_t end = std::min(size, b << src_bits);
    if ((a << src_bits) < end) add.SetRange(first, ((end - 1) >> e.granularity_bits) - first + 1);
    a = src.NextSet(b);
  }
  if (BitVector* exact = img_.tracker_->ExactBits(dst)) {
    exact->Or(add);
    return img_.tracker_->WriteBack();
  }
  TD_ASSIGN_OR_RETURN(BitVector bits, img_.ReadBitmapBitsLocked(e));
  bits.Or(add);
  return img_.StoreBitmapBitsLocked(e, bits, false);
}

namespace {

Result<ImageImpl*> Impl(block::Device& image) {
  auto* impl = dynamic_cast<ImageImpl*>(&image);
  if (impl == nullptr) return Status::NotSupported("bitmaps need a qcow2 image");
  return impl;
}

}  // namespace

Result<std::vector<BitmapDirectoryEntry>> ReadBitmapDirectory(io::Storage& storage,
                                                              const Header& h) {
  if (!h.bitmaps) return std::vector<BitmapDirectoryEntry>{};
  std::vector<uint8_t> raw(h.bitmaps->bitmap_directory_size);
  TD_RETURN_IF_ERROR(storage.ReadAt(h.bitmaps->bitmap_directory_offset, raw));
  return DecodeBitmapDirectory(raw, h.bitmaps->nb_bitmaps);
}

Result<std::vector<BitmapInfo>> ListBitmaps(block::Device& image) {
  auto* impl = dynamic_cast<ImageImpl*>(&image);
  if (impl == nullptr) return std::vector<BitmapInfo>{};
  return BitmapEditor(*impl).List();
}

Result<BitVector> ReadBitmap(block::Device& image, const std::string& name) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  return BitmapEditor(*impl).Read(name);
}

namespace {

// A bitmap of a qcow2 image as a block::DirtyBitmap: live through the
// tracker when the image tracks it, else the bits read when it was made.
class Qcow2BitmapView final : public block::DirtyBitmap {
 public:
  Qcow2BitmapView(std::shared_ptr<block::Device> device, ImageImpl& img, std::string name,
                  uint32_t granularity_bits, std::optional<BitVector> stored)
      : device_(std::move(device)),
        img_(img),
        name_(std::move(name)),
        granularity_bits_(granularity_bits),
        stored_(std::move(stored)) {}

  const std::string& name() const override { return name_; }
  uint64_t granularity() const override { return uint64_t{1} << granularity_bits_; }

  Result<Run> RunAt(uint64_t offset, uint64_t max_length) override {
    const uint64_t size = device_->size();
    if (offset >= size) return Status::OutOfRange("block status past the end of the bitmap");
    const uint64_t bit = offset >> granularity_bits_;
    bool dirty = false;
    uint64_t bits = 0;
    if (stored_) {
      dirty = bit < stored_->size() && stored_->Test(bit);
      const uint64_t end = dirty ? stored_->NextClear(bit) : stored_->NextSet(bit);
      bits = end - std::min(bit, end);
    } else if (!img_.bitmap_tracker() || !img_.bitmap_tracker()->RunAt(name_, bit, &dirty, &bits)) {
      return Status::NotFound("bitmap '" + name_ + "' is no longer tracked");
    }
    const uint64_t run_end = std::min(size, (bit + std::max<uint64_t>(bits, 1)) << granularity_bits_);
    return Run{dirty, std::min(max_length, run_end - offset)};
  }

 private:
  std::shared_ptr<block::Device> device_;
  ImageImpl& img_;
  const std::string name_;
  const uint32_t granularity_bits_;
  const std::optional<BitVector> stored_;
};

}  // namespace

Result<std::shared_ptr<block::DirtyBitmap>> ExportBitmap(std::shared_ptr<block::Device> image,
                                                        const std::string& name) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(*image));
  TD_ASSIGN_OR_RETURN(std::vector<BitmapInfo> list, BitmapEditor(*impl).List());
  auto it = std::find_if(list.begin(), list.end(),
                         [&](const BitmapInfo& b) { return b.name == name; });
  if (it == list.end()) return Status::NotFound("bitmap '" + name + "' is not found");
  if (!it->consistent()) {
    return Status::Corrupt("bitmap '" + name + "' is inconsistent (" + it->problem +
                           ") and cannot be used");
  }
  std::optional<BitVector> stored;
  if (!impl->bitmap_tracker() || !impl->bitmap_tracker()->Tracks(name)) {
    TD_ASSIGN_OR_RETURN(stored, BitmapEditor(*impl).Read(name));
  }
  return std::shared_ptr<block::DirtyBitmap>(std::make_shared<Qcow2BitmapView>(
      std::move(image), *impl, name, it->granularity_bits, std::move(stored)));
}

namespace {

// The tracker of `image` when it tracks `name`; else why not.
Result<BitmapTracker*> TrackerFor(block::Device& image, const std::string& name) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  TD_ASSIGN_OR_RETURN(std::vector<BitmapInfo> list, BitmapEditor(*impl).List());
  auto it = std::find_if(list.begin(), list.end(),
                         [&](const BitmapInfo& b) { return b.name == name; });
  if (it == list.end()) return Status::NotFound("bitmap '" + name + "' is not found");
  BitmapTracker* tracker = impl->bitmap_tracker();
  if (tracker == nullptr || !tracker->Tracks(name)) {
    return Status::NotSupported("bitmap '" + name + "' is not tracked here (" +
                                (tracker == nullptr ? "the image is open read-only"
                                                    : "the bitmap is disabled or inconsistent") +
                                ")");
  }
  return tracker;
}

}  // namespace

Result<BitmapLiveState> QueryBitmapLive(block::Device& image, const std::string& name) {
  TD_ASSIGN_OR_RETURN(BitmapTracker * tracker, TrackerFor(image, name));
  BitmapLiveState st;
  st.name = name;
  TD_ASSIGN_OR_RETURN(auto list, ListBitmaps(image));
  for (const BitmapInfo& b : list) {
    if (b.name == name) st.granularity_bits = b.granularity_bits;
  }
  BitVector bits;
  if (!tracker->Generation(name, &st.generation) || !tracker->CopyExact(name, &bits)) {
    return Status::NotFound("bitmap '" + name + "' is no longer tracked");
  }
  const uint64_t size = image.size();
  for (uint64_t a = bits.NextSet(0); a < bits.size();) {
    const uint64_t b = bits.NextClear(a);
    st.dirty_bytes += std::min(size, b << st.granularity_bits) - (a << st.granularity_bits);
    a = bits.NextSet(b);
  }
  return st;
}

Status ClearBitmapLive(block::Device& image, const std::string& name,
                       std::optional<uint64_t> if_generation) {
  TD_ASSIGN_OR_RETURN(BitmapTracker * tracker, TrackerFor(image, name));
  return tracker->ClearExact(name, if_generation ? &*if_generation : nullptr);
}

uint32_t DefaultBitmapGranularityBits(Image& image) {
  // qemu's rule: the cluster size, kept within 4 KiB..64 KiB.
  const uint32_t bits = image.header().cluster_bits;
  return std::clamp<uint32_t>(bits, 12, 16);
}

Status AddBitmap(Image& image, const BitmapAddOptions& options) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  return BitmapEditor(*impl).Add(options);
}

Status RemoveBitmap(Image& image, const std::string& name) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  return BitmapEditor(*impl).Remove(name);
}

Status ClearBitmap(Image& image, const std::string& name) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  return BitmapEditor(*impl).Clear(name);
}

Status SetBitmapEnabled(Image& image, const std::string& name, bool enabled) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  return BitmapEditor(*impl).SetEnabled(name, enabled);
}

Status MergeIntoBitmap(Image& image, const std::string& dst, const BitVector& src,
                       uint32_t src_granularity_bits) {
  TD_ASSIGN_OR_RETURN(ImageImpl * impl, Impl(image));
  return BitmapEditor(*impl).Merge(dst, src, src_granularity_bits);
}

}  // namespace thindisk::qcow2
