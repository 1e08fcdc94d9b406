// qcow2 compaction: rewrite a long-lived image so its file holds only live
// clusters, metadata first, then data in guest order.
//
// Layout of the result, in clusters: header (with every header extension
// and the backing file name kept), refcount table, refcount blocks, the
// active L1 table, the snapshot table and each snapshot's L1 table, the L2
// tables (in the order the L1 tables reach them), the data clusters (in the
// same order: guest order for the active image), then compressed clusters
// packed at 512-byte grain. Clusters a snapshot shares keep being shared
// (one copy, the same reference count). Leaked clusters, zero clusters'
// preallocated space and host space of clusters with no allocated
// subcluster are dropped; all-zero 4 KiB blocks of data are left as holes.
//
// Persistent dirty bitmaps: CompactImage refuses them (their tables name
// host offsets this rewrite invalidates) unless told to leave them out;
// CompactFile carries them over: it reads each (name, granularity, enabled
// or not, bits) before the rewrite and adds it to the new image before that
// is checked and made durable, so the new image at the path always has
// them; an inconsistent bitmap (in use, damaged) is refused with its name.
// CompactFile refuses (kInvalidArgument) an image that is not a regular
// file, such as one on a block device: its node is never replaced.
// Also refused (kNotSupported, with the reason): images the codec refuses
// (encryption, external data file). kCorrupt when the image is marked
// corrupt or `check` finds corruptions (repair it first).
//
// Crash safety (CompactFile): the new image is built in a temporary file
// beside the original, checked, made durable, renamed over the original,
// and the directory is synced, so a crash at any step leaves either the old
// or the new image at the path, both complete. A crash may leave the
// temporary file (".NAME.compact-XXXXXX") behind; it is never the image.
//
// Thread safety: none; the image must be offline (CompactFile takes an
// exclusive lock and fails with kBusy when another process holds one).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "io/storage.h"
#include "util/result.h"

namespace thindisk::qcow2 {

struct CompactStats {
  uint64_t old_file_size = 0;
  uint64_t new_file_size = 0;
  uint64_t l2_tables = 0;
  uint64_t data_clusters = 0;
  uint64_t compressed_clusters = 0;  // compressed guest clusters copied
};

// `done` of `total` data clusters copied.
using CompactProgress = std::function<void(uint64_t done, uint64_t total)>;

// Writes a compacted copy of the qcow2 image on `src` onto `dst`, which
// must be empty. Does not flush `dst`. `src` is only read. With
// `drop_bitmaps`, the copy has no bitmaps (the caller adds them back).
Result<CompactStats> CompactImage(io::Storage& src, io::Storage& dst,
                                  const CompactProgress& progress = nullptr,
                                  bool drop_bitmaps = false);

// The steps of CompactFile, for crash tests (a hook may kill the process).
enum class CompactStep {
  kLocked,       // the original is locked, nothing written yet
  kTempWritten,  // the temporary file holds the whole new image
  kTempSynced,   // ... and is durable
  kRenamed,      // the new image is at the path (rename not yet durable)
  kDirSynced,    // the rename is durable
};

struct CompactFileOptions {
  CompactProgress progress;
  std::function<void(CompactStep)> on_step;  // test hook; null in production
};

// Compacts the qcow2 file at `path` in place (see the crash safety above).
// The lock is the one qemu takes on image files (open file description
// locks on bytes 100-299), held exclusively for the whole operation, so a
// qemu process using the image makes this fail with kBusy and cannot open
// the image meanwhile.
Result<CompactStats> CompactFile(const std::string& path, const CompactFileOptions& options);

}  // namespace thindisk::qcow2
