// Host-space preallocation shared by Create and Image::GrowPreallocated:
// what preallocation=falloc and =full do to a byte range of the file once
// the metadata mapping it (the part preallocation=metadata does) is decided.
#pragma once

#include <cstdint>
#include <string>

#include "io/storage.h"
#include "qcow2/image.h"
#include "util/status.h"

namespace thindisk::qcow2 {

// Prepares the host range [offset, offset + length) per `mode`: kOff and
// kMetadata do nothing; kFalloc reserves the space (fallocate), and where
// the host cannot (kNotSupported) writes zeros as kFull does and sets
// *warning (when non-null) to say so; kFull writes zeros. Other errors are
// returned as they are.
Status PreallocateHostRange(io::Storage& storage, uint64_t offset, uint64_t length,
                            Preallocation mode, std::string* warning);

}  // namespace thindisk::qcow2
