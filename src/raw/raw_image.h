// raw::RawImage: a raw image file as a block::Device.
//
// Guest offset N is host offset N. Holes in the host file are reported as
// zero extents without data (GetStatus; present, with host_offset = guest
// offset, as qemu reports raw holes) so map/convert/NBD block status can
// skip them; everything else is data stored in place.
//
// A read-only image (a backing file) remembers the last run of host data it
// found, so the block status of a clone's reads, which asks its backing file
// for every unallocated cluster, costs no seeks once the run is known. Only
// data runs are remembered: if another process punches the file meanwhile,
// "data" is still a correct answer (reads return what is there), whereas a
// remembered hole could hide bytes written since.
//
// Thread safety: all methods may be called concurrently (block::Device
// contract); the storage serializes nothing we depend on except Resize,
// which callers must not race with I/O past the new end.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "block/device.h"
#include "io/storage.h"
#include "util/mutex.h"
#include "util/result.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace thindisk::raw {

// Preallocation modes a raw file can honour (metadata has no meaning here).
enum class RawPrealloc {
  kOff,     // sparse: Resize only
  kFalloc,  // reserve host space (falls back to writing zeros)
  kFull,    // write zeros over the whole size
};

class RawImage final : public block::Device {
 public:
  // Preferred I/O grain: the common host page / filesystem block size.
  static constexpr uint32_t kPreferredBlock = 4096;

  RawImage(std::unique_ptr<io::Storage> storage, uint64_t size, bool read_only,
           std::string filename);
  ~RawImage() override;

  uint64_t size() const override { return size_.load(); }
  const block::DeviceInfo& info() const override { return info_; }

  Status Read(uint64_t offset, std::span<uint8_t> buf) override;
  Status Write(uint64_t offset, std::span<const uint8_t> buf,
               block::WriteFlags flags = {}) override;
  Status WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags = {}) override;
  Status Discard(uint64_t offset, uint64_t length) override;
  Status Flush() override;
  Result<block::Extent> GetStatus(uint64_t offset, uint64_t max_length) override;
  Status Resize(uint64_t new_size, bool shrink = false) override;
  Status Close() override;
  // One piece: the same range of the host file.
  Result<block::ReadPlan> PlanRead(uint64_t offset, uint64_t length) override;

  // The host file, for space accounting (info's actual-size).
  io::Storage& storage() { return *storage_; }

 private:
  // kOutOfRange unless [offset, offset+length) lies inside the device.
  Status CheckRange(uint64_t offset, uint64_t length) const;
  // kReadOnly if opened read-only, kInvalidArgument after Close.
  Status CheckWritable() const;

  std::unique_ptr<io::Storage> storage_;
  std::atomic<uint64_t> size_;
  // Read-only images: the last host data run found, [begin, end); empty
  // when begin == end.
  util::Mutex data_run_mu_;
  uint64_t data_run_begin_ TD_GUARDED_BY(data_run_mu_) = 0;
  uint64_t data_run_end_ TD_GUARDED_BY(data_run_mu_) = 0;
  block::DeviceInfo info_;
  std::atomic<bool> closed_{false};
};

// Opens `storage` as a raw device; its size is the storage's size.
// `filename` is what info().filename reports.
Result<std::unique_ptr<block::Device>> OpenRaw(std::unique_ptr<io::Storage> storage,
                                               bool read_only, std::string filename);

// Sizes an empty storage to `size` bytes with the given preallocation.
// kFalloc where the host can't reserve space falls back to writing zeros and
// sets *warning (when non-null) to say so, so the user learns why it was slow.
Status CreateRaw(io::Storage& storage, uint64_t size, RawPrealloc mode,
                 std::string* warning = nullptr);

}  // namespace thindisk::raw
