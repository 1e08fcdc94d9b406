#include "io/zero_fill.h"

#include <algorithm>
#include <span>
#include <vector>

namespace thindisk::io {
namespace {

constexpr uint64_t kZeroChunk = 1ull << 20;

}  // namespace

Status WriteZeroBytes(Storage& storage, uint64_t offset, uint64_t length) {
  std::vector<uint8_t> zeros(std::min(length, kZeroChunk), 0);
  while (length > 0) {
    uint64_t n = std::min<uint64_t>(length, zeros.size());
    TD_RETURN_IF_ERROR(storage.WriteAt(offset, std::span<const uint8_t>(zeros.data(), n)));
    offset += n;
    length -= n;
  }
  return Status::Ok();
}

}  // namespace thindisk::io
