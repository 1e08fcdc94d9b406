#include "cli/serve_devices.h"

#include <algorithm>
#include <string>

namespace thindisk::cli {

Status WindowDevice::Check(uint64_t offset, uint64_t length) const {
  if (offset > length_ || length > length_ - offset) {
    return Status::OutOfRange("request [" + std::to_string(offset) + ", +" +
                              std::to_string(length) + ") ends past the export size " +
                              std::to_string(length_));
  }
  return Status::Ok();
}

Status WindowDevice::Read(uint64_t offset, std::span<uint8_t> buf) {
  TD_RETURN_IF_ERROR(Check(offset, buf.size()));
  return inner().Read(offset_ + offset, buf);
}

Result<block::ReadPlan> WindowDevice::PlanRead(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(Check(offset, length));
  return inner().PlanRead(offset_ + offset, length);  // buffer offsets stay
}

Status WindowDevice::Write(uint64_t offset, std::span<const uint8_t> buf,
                           block::WriteFlags flags) {
  TD_RETURN_IF_ERROR(Check(offset, buf.size()));
  return inner().Write(offset_ + offset, buf, flags);
}

Status WindowDevice::WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) {
  TD_RETURN_IF_ERROR(Check(offset, length));
  return inner().WriteZeroes(offset_ + offset, length, flags);
}

Status WindowDevice::Discard(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(Check(offset, length));
  return inner().Discard(offset_ + offset, length);
}

Result<block::Extent> WindowDevice::GetStatus(uint64_t offset, uint64_t max_length) {
  TD_RETURN_IF_ERROR(Check(offset, 0));
  max_length = std::min(max_length, length_ - offset);
  TD_ASSIGN_OR_RETURN(block::Extent e, inner().GetStatus(offset_ + offset, max_length));
  // The inner extent starts where asked; shift it back into the window.
  e.offset -= offset_;
  e.length = std::min(e.length, length_ - e.offset);
  return e;
}

Status WindowDevice::Resize(uint64_t, bool) {
  return Status::NotSupported("an export with an offset or size window cannot be resized");
}

}  // namespace thindisk::cli
