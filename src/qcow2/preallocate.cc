// Host-space preallocation (preallocate.h).
#include "qcow2/preallocate.h"

#include <fmt/format.h>

#include "io/zero_fill.h"

namespace thindisk::qcow2 {

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
  if (mode == Preallocation::kFull) return io::WriteZeroBytes(storage, offset, length);
  return Status::Ok();
}

}  // namespace thindisk::qcow2
