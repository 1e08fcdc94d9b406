// qcow2 snapshot table: the list of internal snapshots the header points at
// (snapshots_offset, nb_snapshots), encoded and decoded as the
// specification lays it out (docs/interop/qcow2.txt in QEMU, "Snapshots").
// Pure functions, no I/O; the table read from an image is untrusted and
// validated against the limits in qcow2/format.h before use. Taking,
// applying and deleting snapshots is qcow2/snapshot.h.
//
// Included by qcow2/format.h, so code that includes format.h sees these too.
// Thread safety: stateless functions, safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/result.h"

namespace thindisk::qcow2 {

// Bytes of a table entry before its extra data, id and name; the header
// check uses it as the least a non-empty table can occupy.
inline constexpr uint32_t kSnapshotFixedSize = 40;

struct Snapshot {
  uint64_t l1_table_offset = 0;
  uint32_t l1_size = 0;
  std::string id;  // unique id string
  std::string name;
  uint32_t date_sec = 0;
  uint32_t date_nsec = 0;
  uint64_t vm_clock_nsec = 0;
  uint32_t vm_state_size = 0;
  // Extra data (spec: >= 16 bytes in v3): large vm state size, disk size,
  // icount; kept verbatim beyond what we interpret.
  uint64_t vm_state_size_large = 0;
  uint64_t disk_size = 0;
  std::vector<uint8_t> extra;  // full extra data as read (or built)
};

// Decodes `nb_snapshots` entries from the table bytes. Validates lengths,
// alignment (entries are 8-byte aligned), l1 offsets cluster-aligned.
Result<std::vector<Snapshot>> DecodeSnapshotTable(std::span<const uint8_t> bytes,
                                                  uint32_t nb_snapshots, uint32_t cluster_bits);
std::vector<uint8_t> EncodeSnapshotTable(const std::vector<Snapshot>& snapshots);

}  // namespace thindisk::qcow2
