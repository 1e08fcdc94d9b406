// The header object of a thindisk image in RADOS ("<image>.header"): what
// the image is, encoded and decoded without I/O (io/rados_storage.h does the
// I/O and keeps the invariants).
//
// Layout, version 1: 64 bytes, big-endian, written whole with write_full
// (RADOS replaces an object's content atomically, so a reader sees the old
// header or the new one, never a mix):
//
//   offset size field
//    0      8   magic "TDRADOS\n"
//    8      4   version (1)
//   12      4   object_order: data objects are 1 << object_order bytes
//               (kMinObjectOrder..kMaxObjectOrder: 4 KiB..128 MiB, RADOS'
//               osd_max_object_size)
//   16      8   size: the image's byte size as last made durable
//   24      8   data_limit: a multiple of the object size; no data object
//               with index >= data_limit >> object_order exists, and bytes at
//               or past `size` but before data_limit may be stale (written
//               after the last durable size, before a crash). It bounds
//               what recovery, shrink, remove and NextData must visit.
//   32      8   incompatible_features: bits this version does not know make
//               the image unopenable (kNotSupported): none are defined
//   40      8   compatible_features: unknown bits are ignored: none defined
//   48     16   reserved, zero
//
// A longer object (a later version that appends fields) decodes if its
// version is 1; a version above 1 is refused as "from a newer thindisk".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/result.h"

namespace thindisk::io {

struct RadosHeader {
  static constexpr char kMagic[9] = "TDRADOS\n";
  static constexpr uint32_t kVersion = 1;
  static constexpr size_t kEncodedSize = 64;
  static constexpr uint32_t kMinObjectOrder = 12;      // 4 KiB
  static constexpr uint32_t kMaxObjectOrder = 27;      // 128 MiB: osd_max_object_size
  static constexpr uint32_t kDefaultObjectOrder = 22;  // 4 MiB, as RBD
  // Sizes stay far from 2^64 so offset + length and rounding never overflow.
  static constexpr uint64_t kMaxSize = 1ull << 62;

  uint32_t object_order = kDefaultObjectOrder;
  uint64_t size = 0;
  uint64_t data_limit = 0;
  uint64_t incompatible_features = 0;
  uint64_t compatible_features = 0;

  uint64_t object_size() const { return uint64_t(1) << object_order; }

  std::vector<uint8_t> Encode() const;
  // `what` names the image in errors ("rados://p/i"). kCorrupt for a bad
  // magic ("not a thindisk image"), short object or bad field;
  // kNotSupported for a newer version or unknown incompatible features.
  static Result<RadosHeader> Decode(std::span<const uint8_t> bytes,
                                    const std::string& what);
};

// log2(object_size) when it is a power of two within the limits above, else
// kInvalidArgument naming `what`.
Result<uint32_t> RadosObjectOrder(uint64_t object_size, const std::string& what);

}  // namespace thindisk::io
