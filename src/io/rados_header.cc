#include "io/rados_header.h"

#include <bit>
#include <cstdio>
#include <cstring>

#include "util/endian.h"

namespace thindisk::io {

std::vector<uint8_t> RadosHeader::Encode() const {
  std::vector<uint8_t> b(kEncodedSize, 0);
  std::memcpy(b.data(), kMagic, 8);
  StoreBe32(&b[8], kVersion);
  StoreBe32(&b[12], object_order);
  StoreBe64(&b[16], size);
  StoreBe64(&b[24], data_limit);
  StoreBe64(&b[32], incompatible_features);
  StoreBe64(&b[40], compatible_features);
  return b;
}

Result<RadosHeader> RadosHeader::Decode(std::span<const uint8_t> b,
                                        const std::string& what) {
  const std::string object = "header object";
  if (b.size() < 8 || std::memcmp(b.data(), kMagic, 8) != 0) {
    return Status::Corrupt(what + ": not a thindisk image (its " + object +
                           " does not start with the thindisk RADOS magic)");
  }
  if (b.size() < 12) return Status::Corrupt(what + ": " + object + " truncated");
  const uint32_t version = LoadBe32(&b[8]);
  if (version > kVersion) {
    return Status::NotSupported(what + ": written by a newer thindisk (header version " +
                                std::to_string(version) + "; this one reads up to " +
                                std::to_string(kVersion) + ")");
  }
  if (version == 0) return Status::Corrupt(what + ": header version 0");
  if (b.size() < kEncodedSize) {
    return Status::Corrupt(what + ": " + object + " is " + std::to_string(b.size()) +
                           " bytes, version 1 needs " + std::to_string(kEncodedSize));
  }
  RadosHeader h;
  h.object_order = LoadBe32(&b[12]);
  h.size = LoadBe64(&b[16]);
  h.data_limit = LoadBe64(&b[24]);
  h.incompatible_features = LoadBe64(&b[32]);
  h.compatible_features = LoadBe64(&b[40]);
  if (h.object_order < kMinObjectOrder || h.object_order > kMaxObjectOrder) {
    return Status::Corrupt(what + ": object order " + std::to_string(h.object_order) +
                           " outside " + std::to_string(kMinObjectOrder) + ".." +
                           std::to_string(kMaxObjectOrder));
  }
  if (h.size > kMaxSize) {
    return Status::Corrupt(what + ": size " + std::to_string(h.size) + " exceeds 2^62");
  }
  if (h.data_limit > kMaxSize || (h.data_limit & (h.object_size() - 1)) != 0) {
    return Status::Corrupt(what + ": data limit " + std::to_string(h.data_limit) +
                           " is not a multiple of the object size below 2^62");
  }
  if (h.incompatible_features != 0) {
    char bits[20];
    std::snprintf(bits, sizeof bits, "%llx", (unsigned long long)h.incompatible_features);
    return Status::NotSupported(what +
                                ": image uses features this thindisk does not know " +
                                "(incompatible feature bits 0x" + bits + ")");
  }
  return h;
}

Result<uint32_t> RadosObjectOrder(uint64_t object_size, const std::string& what) {
  if (!std::has_single_bit(object_size) ||
      object_size < (uint64_t(1) << RadosHeader::kMinObjectOrder) ||
      object_size > (uint64_t(1) << RadosHeader::kMaxObjectOrder)) {
    return Status::InvalidArgument(what + ": object size " + std::to_string(object_size) +
                                   " is not a power of two from 4 KiB to 128 MiB");
  }
  return uint32_t(std::countr_zero(object_size));
}

}  // namespace thindisk::io
