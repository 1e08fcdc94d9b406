#include "nbdclient/export_file.h"

#include <algorithm>
#include <cerrno>

namespace thindisk::nbdclient {

Result<std::unique_ptr<ExportFile>> ExportFile::Make(io::Storage& store) {
  TD_ASSIGN_OR_RETURN(uint64_t capacity, store.Size());
  return std::unique_ptr<ExportFile>(new ExportFile(store, capacity));
}

Status ExportFile::GrowTo(uint64_t end) {
  if (end > capacity_) {
    return Status(Code::kNoSpace,
                  store_.name() + ": the export is too small (" + std::to_string(capacity_) +
                      " bytes; the image needs at least " + std::to_string(end) + ")",
                  ENOSPC);
  }
  uint64_t old = size_.load();
  // Grown space must read as zeros, as a file's does.
  if (end > old) TD_RETURN_IF_ERROR(store_.PunchHole(old, end - old));
  while (old < end && !size_.compare_exchange_weak(old, end)) {
  }
  return Status::Ok();
}

Status ExportFile::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  const uint64_t size = size_.load();
  const uint64_t in = offset >= size ? 0 : std::min<uint64_t>(buf.size(), size - offset);
  std::fill(buf.begin() + ptrdiff_t(in), buf.end(), uint8_t{0});
  return in == 0 ? Status::Ok() : store_.ReadAt(offset, buf.first(in));
}

Status ExportFile::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  const uint64_t end = offset + buf.size();
  // Only the gap before the write needs zeroing; the write covers the rest.
  if (offset > size_.load()) TD_RETURN_IF_ERROR(GrowTo(offset));
  if (end > capacity_) TD_RETURN_IF_ERROR(GrowTo(end));  // the "too small" error
  TD_RETURN_IF_ERROR(store_.WriteAt(offset, buf));
  uint64_t old = size_.load();
  while (old < end && !size_.compare_exchange_weak(old, end)) {
  }
  return Status::Ok();
}

Status ExportFile::Resize(uint64_t size) {
  if (size >= size_.load()) return GrowTo(size);
  size_ = size;  // the cut bytes are zeroed when the view grows again
  return Status::Ok();
}

Status ExportFile::Allocate(uint64_t, uint64_t) {
  return Status::NotSupported(store_.name() + ": NBD exports cannot preallocate");
}

Status ExportFile::PunchHole(uint64_t offset, uint64_t length) {
  const uint64_t size = size_.load();
  if (offset >= size) return Status::Ok();
  return store_.PunchHole(offset, std::min(length, size - offset));
}

Status ExportFile::ZeroRange(uint64_t offset, uint64_t length) {
  const uint64_t size = size_.load();
  if (offset >= size) return Status::Ok();
  return store_.ZeroRange(offset, std::min(length, size - offset));
}

Result<uint64_t> ExportFile::NextData(uint64_t offset) {
  const uint64_t size = size_.load();
  if (offset >= size) return size;
  TD_ASSIGN_OR_RETURN(uint64_t next, store_.NextData(offset));
  return std::min(next, size);
}

Result<uint64_t> ExportFile::NextHole(uint64_t offset) {
  const uint64_t size = size_.load();
  if (offset >= size) return size;
  TD_ASSIGN_OR_RETURN(uint64_t next, store_.NextHole(offset));
  return std::min(next, size);
}

}  // namespace thindisk::nbdclient
