// Writing zeros the slow way: for hosts that can neither punch nor zero a
// range, and for preallocation=full, which must write them.
#pragma once

#include <cstdint>

#include "io/storage.h"
#include "util/status.h"

namespace thindisk::io {

// Writes zeros over [offset, offset + length) of `storage` with plain
// WriteAt calls, 1 MiB at a time (big enough to stream, small enough to
// allocate). Returns the first write's error; bytes before it are written.
Status WriteZeroBytes(Storage& storage, uint64_t offset, uint64_t length);

}  // namespace thindisk::io
