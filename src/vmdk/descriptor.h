// The VMDK text descriptor: what kind of disk, its IDs and its extents.
//
// From the "Virtual Disk Format 5.0" specification: lines of `key=value`
// ("createType=\"monolithicSparse\"", "CID=fffffffe", "parentCID=ffffffff"),
// extent lines (`RW 20480 SPARSE "disk.vmdk"`, `RW 20480 FLAT "disk-flat.vmdk" 0`),
// comments starting with '#', and the disk database (`ddb.x = "y"`), which we
// skip. The descriptor is embedded in a monolithic sparse file or is a file
// of its own (monolithicFlat). Pure parsing, no I/O; input is untrusted.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.h"

namespace thindisk::vmdk {

// More extent lines than this is not a disk we could open anyway (we read
// single-extent images); the cap bounds the parse of a hostile descriptor.
inline constexpr size_t kMaxExtentLines = 4096;
inline constexpr uint32_t kNoParentCid = 0xffffffff;

struct ExtentLine {
  std::string access;    // "RW", "RDONLY", "NOACCESS"
  uint64_t sectors = 0;  // guest size of the extent
  std::string type;      // "SPARSE", "FLAT", "ZERO", "VMFS", ...
  std::string filename;  // as written (relative to the descriptor's directory)
  uint64_t offset = 0;   // sectors into the file (FLAT, VMFS)
};

struct Descriptor {
  std::string create_type;
  uint32_t cid = 0;
  uint32_t parent_cid = kNoParentCid;
  std::vector<ExtentLine> extents;
};

// True when `head` (the first bytes of a file) starts like a descriptor file:
// "# Disk DescriptorFile", as VMware and qemu write it.
bool LooksLikeDescriptor(std::span<const uint8_t> head);

// Parses descriptor text; it ends at the first NUL (embedded descriptors are
// zero-padded). Errors: kCorrupt (malformed extent line or ID, no
// createType, too many extents).
Result<Descriptor> ParseDescriptor(std::string_view text);

// Accepts exactly what thindisk reads: createType monolithicSparse or
// streamOptimized with one SPARSE extent, or monolithicFlat / vmfs with one
// FLAT / VMFS extent, readable, and no parent. Errors: kNotSupported (split
// or multi-extent images, delta links, other create types), kCorrupt
// (extent type contradicts the create type).
Status CheckSupported(const Descriptor& d);

// True for create types whose one extent is a sparse extent (this file).
bool IsSparseCreateType(const std::string& create_type);

}  // namespace thindisk::vmdk
