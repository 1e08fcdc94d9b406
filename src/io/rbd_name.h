// RbdName: an existing RBD image (Ceph's block layer), as qemu names it:
//
//   rbd:POOL/IMAGE[@SNAP][:conf=PATH][:id=CLIENT]
//   rbd:POOL/NAMESPACE/IMAGE[@SNAP][:...]
//
//  - POOL, NAMESPACE, IMAGE: where the image is; no '/', '@' or ':' in them.
//  - SNAP: a snapshot of the image, always read-only.
//  - conf, id: as in rados:// names (io/rados_name.h): the ceph.conf to read
//    and the client name without "client.".
// Options are qemu's colon syntax (a ':' inside a value is written "\:").
// Unknown options are errors, so a typo never silently means "the default".
//
// Pure parsing, no I/O. Thread safety: a value type.
#pragma once

#include <string>
#include <string_view>

#include "util/result.h"

namespace thindisk::io {

inline constexpr std::string_view kRbdPrefix = "rbd:";

struct RbdName {
  std::string pool;
  std::string ns;  // empty: the pool's default namespace
  std::string image;
  std::string snap;  // empty: the image's head
  std::string conf;
  std::string id;

  // "rbd:POOL/[NS/]IMAGE[@SNAP]", the name errors use.
  std::string ToString() const;
};

// True when `name` starts with "rbd:".
bool IsRbdName(std::string_view name);

// kInvalidArgument with the reason and the name.
Result<RbdName> ParseRbdName(std::string_view name);

}  // namespace thindisk::io
