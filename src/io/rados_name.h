// RadosName: a thindisk image in Ceph RADOS, as users write it:
//
//   rados://POOL/IMAGE[?conf=PATH][&id=CLIENT]
//
//  - POOL: the RADOS pool (must exist; thindisk never creates pools).
//  - IMAGE: the image's name inside the pool; its objects are named after it
//    (io/rados_storage.h), so it is limited to kMaxImageLength characters of
//    [A-Za-z0-9._+=@,-], not "." or "..", not starting with '.'.
//  - conf: the ceph.conf to read; without it librados reads $CEPH_CONF, then
//    its default places (/etc/ceph/ceph.conf, ...).
//  - id: the client name without "client." (default "admin"), whose keyring
//    ceph.conf names.
// There is no percent-decoding: a conf path holding '&', '#' or '?' cannot
// be written (use $CEPH_CONF). Each key may appear once; unknown keys are
// errors, so a typo never silently means "the default".
//
// Pure parsing, no I/O. Thread safety: a value type.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "util/result.h"

namespace thindisk::io {

inline constexpr std::string_view kRadosScheme = "rados://";

struct RadosName {
  // An image name leaves room in RADOS's object name limit (2048 bytes by
  // default) for the ".header" / ".<16 hex digits>" suffixes, and keeps
  // messages readable.
  static constexpr size_t kMaxImageLength = 200;
  // Ceph itself accepts longer pool names; 255 is where a name stops being
  // a name.
  static constexpr size_t kMaxPoolLength = 255;

  std::string pool;
  std::string image;
  std::string conf;  // empty: librados' default search ($CEPH_CONF, /etc/ceph)
  std::string id;    // empty: librados' default client ("admin")

  // "rados://POOL/IMAGE", the name errors use (no query: the conf path and
  // client are where to connect, not which image).
  std::string ToString() const;
  // The pool's URI, "rados://POOL" (messages about the pool itself).
  std::string PoolUri() const;
  // The full name, query included ("rados://POOL/IMAGE?conf=PATH&id=ID",
  // keys only when set): parses back to an equal RadosName.
  std::string Uri() const;
};

// True when `name` starts with "rados://" (the name is meant for RADOS,
// whether or not the rest parses).
bool IsRadosName(std::string_view name);

// Parses a rados:// name. kInvalidArgument with the reason and the name
// ("rados://pool: no image name (want rados://POOL/IMAGE)").
Result<RadosName> ParseRadosName(std::string_view name);

// Parses a pool's name, rados://POOL[/][?conf=PATH][&id=CLIENT] (thindisk
// ls): the result's image is empty.
Result<RadosName> ParseRadosPool(std::string_view name);

}  // namespace thindisk::io
