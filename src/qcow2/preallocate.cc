// Host-space preallocation (preallocate.h).
#include "qcow2/preallocate.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <vector>

namespace thindisk::qcow2 {
namespace {

constexpr uint64_t kZeroChunk = 1ull << 20;  // zero-fill write size

}  // namespace

Status WriteZeroBytes(io::Storage& storage, uint64_t offset, uint64_t length) {
  std::vector<uint8_t> zeros(std::min(length, kZeroChunk), 0);
  while (length > 0) {
    uint64_t n = std::min<uint64_t>(length, zeros.size());
    TD_RETURN_IF_ERROR(storage.WriteAt(offset, std::span<const uint8_t>(zeros.data(), n)));
    offset += n;
    length -= n;
  }
  return Status::Ok();
}

Status PreallocateHostRange(io::Storage& storage, uint64_t offset, uint64_t length,
                            Preallocation mode, std::string* warning) {
  if (length == 0) return Status::Ok();
  if (mode == Preallocation::kFalloc) {
    Status s = storage.Allocate(offset, length);
    if (s.ok()) return s;
    if (s.code() != Code::kNotSupported) return s;
    if (warning) {
      *warning = fmt::format(
          "{}: the host file system cannot preallocate (fallocate: {}); wrote zeros instead, "
          "as preallocation=full does",
          storage.name(), s.message());
    }
    mode = Preallocation::kFull;
  }
  if (mode == Preallocation::kFull) return WriteZeroBytes(storage, offset, length);
  return Status::Ok();
}

}  // namespace thindisk::qcow2
