#include "nbd/filter_device.h"

#include <cstring>

namespace thindisk::nbd {
namespace {

bool AllZero(std::span<const uint8_t> buf) {
  // Compare word-sized chunks; the tail byte by byte.
  size_t i = 0;
  const uint8_t* p = buf.data();
  for (; i + sizeof(uint64_t) <= buf.size(); i += sizeof(uint64_t)) {
    uint64_t w;
    std::memcpy(&w, p + i, sizeof w);
    if (w != 0) return false;
  }
  for (; i < buf.size(); ++i)
    if (p[i] != 0) return false;
  return true;
}

}  // namespace

Status FilterDevice::Write(uint64_t offset, std::span<const uint8_t> buf,
                           block::WriteFlags flags) {
  using DZ = FilterOptions::DetectZeroes;
  if (options_.detect_zeroes != DZ::kOff && !buf.empty() && AllZero(buf)) {
    block::ZeroFlags zf;
    zf.fua = flags.fua;
    zf.may_unmap = options_.detect_zeroes == DZ::kUnmap &&
                   options_.discard == FilterOptions::Discard::kUnmap;
    return inner().WriteZeroes(offset, buf.size(), zf);
  }
  return inner().Write(offset, buf, flags);
}

Status FilterDevice::WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) {
  if (options_.discard == FilterOptions::Discard::kIgnore) flags.may_unmap = false;
  return inner().WriteZeroes(offset, length, flags);
}

Status FilterDevice::Discard(uint64_t offset, uint64_t length) {
  if (options_.discard == FilterOptions::Discard::kIgnore) {
    // Still refuse what the device would refuse, so a client sees the same
    // errors with and without the filter.
    if (offset > size() || length > size() - offset)
      return Status::OutOfRange("discard past the end of the device");
    if (info().read_only) return Status::ReadOnly("read-only device");
    return Status::Ok();
  }
  return inner().Discard(offset, length);
}

}  // namespace thindisk::nbd
