// Internal qcow2 snapshots: create, list, apply (revert to) and delete,
// compatible both ways with `qemu-img snapshot`.
//
// A snapshot is a copy of the active L1 table plus an entry in the snapshot
// table; every L2 table and data cluster reachable from it gets one more
// reference, so the engine's write path copies on write what the snapshot
// still uses (refcount > 1, QCOW_OFLAG_COPIED clear). The on-disk order of
// each operation is docs/write-ordering.md ("Snapshots"): the new snapshot
// table and L1 copies are durable before the one-sector header write that
// switches to them, and refcounts are lowered only after that switch. On
// version 3 images the header's dirty bit covers the short window in which
// refcounts and COPIED flags disagree, so a crash there is repaired on the
// next read-write open (by qemu and by thindisk) and loses nothing.
//
// Requirements: the image was opened read-write by qcow2::Image::Open and
// no other request is in flight on it (the caller holds it exclusively, as
// `thindisk snapshot` does). The operations take the engine's locks, so a
// stray concurrent request waits instead of corrupting anything.
//
// Errors: kReadOnly (image opened read-only), kNotSupported (not a qcow2
// image, or 1-bit refcounts, which cannot count a shared cluster),
// kInvalidArgument (empty or duplicate name), kNotFound (no snapshot with
// that id or name), kCorrupt (metadata found invalid on the way), and I/O
// errors. An I/O error in the middle leaves the old or the new snapshot set
// on disk, plus leaks at most (and the dirty bit on version 3 images).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/storage.h"
#include "qcow2/format.h"
#include "qcow2/image.h"
#include "util/result.h"

namespace thindisk::qcow2 {

// The icount field of a snapshot's extra data (bytes 16-23), when present
// and valid (qemu writes all ones when the guest ran without icount).
std::optional<uint64_t> SnapshotIcount(const Snapshot& s);

// Reads and decodes the snapshot table `h` names from `storage`. Works on
// any image, including one opened read-only. Errors: kCorrupt (table runs
// past the end of the file or does not decode), I/O errors.
Result<std::vector<Snapshot>> ReadSnapshotTable(io::Storage& storage, const Header& h);

// The index in `snapshots` of the one `selector` names (qemu's rules, see
// qcow2/snapshot_selector.h), or -1 when none does.
int MatchSnapshot(const std::vector<Snapshot>& snapshots, const SnapshotSelector& selector);

// The snapshots of an open image, in table order.
Result<std::vector<Snapshot>> ListSnapshots(Image& image);

struct SnapshotCreateOptions {
  std::string name;
  // Creation time; 0/0 means now (CLOCK_REALTIME).
  uint32_t date_sec = 0;
  uint32_t date_nsec = 0;
};

// Takes a snapshot of the image's current content. The new snapshot's id is
// one more than the largest numeric id in the table (qemu's rule).
Status CreateSnapshot(Image& image, const SnapshotCreateOptions& options);

// Makes the image's content (and virtual size) that of the snapshot named
// `id_or_name` (an exact id match wins over a name, as in qemu). The
// snapshot itself is kept.
Status ApplySnapshot(Image& image, const std::string& id_or_name);

// Deletes the snapshot `id_or_name`; clusters only it used are freed.
Status DeleteSnapshot(Image& image, const std::string& id_or_name);

}  // namespace thindisk::qcow2
