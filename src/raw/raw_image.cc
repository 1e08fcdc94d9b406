#include "raw/raw_image.h"

#include <algorithm>
#include <vector>

#include "block/read_only_image.h"
#include "io/zero_fill.h"

namespace thindisk::raw {

using io::WriteZeroBytes;

RawImage::RawImage(std::unique_ptr<io::Storage> storage, uint64_t size, bool read_only,
                   std::string filename)
    : storage_(std::move(storage)), size_(size) {
  info_.format = "raw";
  info_.filename = std::move(filename);
  info_.cluster_size = 0;
  info_.preferred_block = kPreferredBlock;
  info_.read_only = read_only;
}

RawImage::~RawImage() {
  // Best effort, as the Device contract promises; errors have no one to go to.
  if (!closed_.load() && !info_.read_only) (void)storage_->Flush();
}

Status RawImage::CheckRange(uint64_t offset, uint64_t length) const {
  return block::CheckRange(size_.load(), offset, length);
}

Status RawImage::CheckWritable() const {
  if (closed_.load()) return Status::InvalidArgument(info_.filename + ": device is closed");
  if (info_.read_only) return Status::ReadOnly(info_.filename + ": opened read-only");
  return Status::Ok();
}

Status RawImage::Read(uint64_t offset, std::span<uint8_t> buf) {
  if (closed_.load()) return Status::InvalidArgument(info_.filename + ": device is closed");
  TD_RETURN_IF_ERROR(CheckRange(offset, buf.size()));
  return storage_->ReadAt(offset, buf);
}

Result<block::ReadPlan> RawImage::PlanRead(uint64_t offset, uint64_t length) {
  if (closed_.load())
    return Status::InvalidArgument(info_.filename + ": device is closed");
  TD_RETURN_IF_ERROR(CheckRange(offset, length));
  block::ReadPlan plan;
  if (length > 0) plan.pieces.push_back({0, length, storage_.get(), offset});
  return plan;
}

Status RawImage::Write(uint64_t offset, std::span<const uint8_t> buf, block::WriteFlags flags) {
  TD_RETURN_IF_ERROR(CheckWritable());
  TD_RETURN_IF_ERROR(CheckRange(offset, buf.size()));
  TD_RETURN_IF_ERROR(storage_->WriteAt(offset, buf));
  if (flags.fua) return storage_->Flush();
  return Status::Ok();
}

Status RawImage::WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) {
  TD_RETURN_IF_ERROR(CheckWritable());
  TD_RETURN_IF_ERROR(CheckRange(offset, length));
  if (length == 0) return Status::Ok();
  Status s;
  if (flags.may_unmap) {
    s = storage_->PunchHole(offset, length);
    if (s.code() == Code::kNotSupported && !flags.fast_only) {
      s = storage_->ZeroRange(offset, length);
    }
  } else if (flags.fast_only) {
    // ZeroRange may silently fall back to writing zeros, which is exactly
    // what a FAST_ZERO client asked us not to do; only a punch is known fast.
    return Status::NotSupported(info_.filename + ": fast zeroing needs may_unmap on raw");
  } else {
    s = storage_->ZeroRange(offset, length);
  }
  TD_RETURN_IF_ERROR(s);
  if (flags.fua) return storage_->Flush();
  return Status::Ok();
}

Status RawImage::Discard(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckWritable());
  TD_RETURN_IF_ERROR(CheckRange(offset, length));
  if (length == 0) return Status::Ok();
  Status s = storage_->PunchHole(offset, length);
  // Discard promises the range reads as zeros afterwards, so a host that
  // can't punch gets zeros written instead of keeping the old bytes.
  if (s.code() == Code::kNotSupported) s = storage_->ZeroRange(offset, length);
  if (s.code() == Code::kNotSupported) s = WriteZeroBytes(*storage_, offset, length);
  return s;
}

Status RawImage::Flush() {
  if (closed_.load()) return Status::InvalidArgument(info_.filename + ": device is closed");
  if (info_.read_only) return Status::Ok();
  return storage_->Flush();
}

Result<block::Extent> RawImage::GetStatus(uint64_t offset, uint64_t max_length) {
  if (closed_.load()) return Status::InvalidArgument(info_.filename + ": device is closed");
  TD_ASSIGN_OR_RETURN(uint64_t end, block::StatusRangeEnd(size_.load(), offset, max_length));
  // Guest offset N is host offset N, for holes too (qemu reports it the same).
  if (!info_.read_only) return block::PlainStatus(*storage_, offset, offset, end - offset);
  {
    util::MutexLock lock(data_run_mu_);
    if (offset >= data_run_begin_ && offset < data_run_end_) {
      block::Extent e;
      e.offset = e.host_offset = offset;
      e.length = std::min(end, data_run_end_) - offset;
      e.present = e.data = e.has_host_offset = true;
      return e;
    }
  }
  // Ask to the end of the image, so a data run is learnt whole, then clip.
  TD_ASSIGN_OR_RETURN(block::Extent e,
                      block::PlainStatus(*storage_, offset, offset, size_.load() - offset));
  if (e.data) {
    // A run found further down than the remembered one starts replaces it
    // and, when it is the same run (same end), covers it too.
    util::MutexLock lock(data_run_mu_);
    data_run_begin_ = offset;
    data_run_end_ = offset + e.length;
  }
  e.length = std::min(e.length, end - offset);
  return e;
}

Status RawImage::Resize(uint64_t new_size, bool shrink) {
  TD_RETURN_IF_ERROR(CheckWritable());
  if (new_size < size_.load() && !shrink) {
    return Status::InvalidArgument(info_.filename +
                                   ": shrinking would lose data; pass shrink to confirm");
  }
  TD_RETURN_IF_ERROR(storage_->Resize(new_size));
  size_.store(new_size);
  return Status::Ok();
}

Status RawImage::Close() {
  if (closed_.exchange(true)) return Status::Ok();
  if (info_.read_only) return Status::Ok();
  return storage_->Flush();
}

Result<std::unique_ptr<block::Device>> OpenRaw(std::unique_ptr<io::Storage> storage,
                                               bool read_only, std::string filename) {
  if (!storage) return Status::InvalidArgument("OpenRaw: null storage");
  TD_ASSIGN_OR_RETURN(uint64_t size, storage->Size());
  return std::unique_ptr<block::Device>(
      new RawImage(std::move(storage), size, read_only, std::move(filename)));
}

Status CreateRaw(io::Storage& storage, uint64_t size, RawPrealloc mode, std::string* warning) {
  TD_RETURN_IF_ERROR(storage.Resize(size));
  switch (mode) {
    case RawPrealloc::kOff:
      break;
    case RawPrealloc::kFalloc: {
      Status s = storage.Allocate(0, size);
      if (s.code() != Code::kNotSupported) {
        TD_RETURN_IF_ERROR(s);
        break;
      }
      if (warning) {
        *warning = storage.name() +
                   ": the host cannot reserve space (fallocate not supported); "
                   "wrote zeros instead (preallocation=full)";
      }
      TD_RETURN_IF_ERROR(WriteZeroBytes(storage, 0, size));
      break;
    }
    case RawPrealloc::kFull:
      TD_RETURN_IF_ERROR(WriteZeroBytes(storage, 0, size));
      break;
  }
  return storage.Flush();
}

}  // namespace thindisk::raw
