// BitmapTracker: the enabled persistent bitmaps of an image open for
// writing, kept up to date with every change of guest content, and kept
// crash-consistent on disk (docs/write-ordering.md "Bitmaps").
//
// The rule it keeps: whatever a crash leaves, each tracked bitmap on disk
// marks every granule whose content may differ from what it was when the
// bitmap was created or last cleared (a superset, never a subset), and it
// never needs its in_use flag.
//
// How: every data cluster of a tracked bitmap exists (the engine allocates
// them when it opens the image), so marking writes bitmap data in place and
// never allocates. Per bitmap, two sets of bits:
//   exact  the granules changed since creation or the last clear: what a
//          clean close writes, what an NBD export shows;
//   disk   what the data clusters hold, or are being written to hold: a
//          superset of exact.
// and, per mark-ahead region (kMarkAheadBytes of guest space, at least one
// granule), whether disk has the whole region set *durably*.
//
// Mark() runs before a request changes guest content. It sets exact, and
// returns once every region the range touches is durable: the region's
// bits set in its sectors of bitmap data, written and synced. Only then may
// the request write its data, so no change can reach the disk before the
// bits that cover it. Requests that need regions at the same time share one
// write round and one sync (the first becomes the writer; the others wait
// for its round). Once a region is durable, changes in it cost nothing more
// until the bitmap is cleared or written back: a crash shows at worst whole
// regions dirty that were only partly changed.
//
// Thread safety: Mark may be called concurrently from any thread. The other
// methods REQUIRE that no Mark runs (the engine calls them with no request
// in flight: close, and the bitmap operations of qcow2/bitmaps.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "io/storage.h"
#include "util/bit_vector.h"
#include "util/mutex.h"
#include "util/result.h"
#include "util/thread_annotations.h"

namespace thindisk::qcow2 {

class BitmapTracker {
 public:
  // Guest bytes a mark makes durable at once (rounded up to a granule).
  static constexpr uint64_t kMarkAheadBytes = 64ull << 20;

  struct Bitmap {
    std::string name;
    uint32_t granularity_bits = 16;
    // Host offset of each data cluster of the bitmap; none is 0.
    std::vector<uint64_t> data_clusters;
    // The bits as loaded (or cleared): exact and disk both start from them.
    BitVector bits;
  };

  // `mark_ahead` overrides kMarkAheadBytes (0: the default).
  BitmapTracker(io::Storage& storage, uint64_t cluster_size, uint64_t mark_ahead = 0)
      : storage_(storage), cs_(cluster_size), mark_ahead_(mark_ahead ? mark_ahead : kMarkAheadBytes) {}

  // Starts tracking `b` (its data clusters hold b.bits, durably).
  void Add(Bitmap b);
  // Stops tracking `name` (no-op when it is not tracked).
  void Remove(const std::string& name);
  // Tracks `from` under the name `to` from now on (a resize's new bitmap,
  // tracked beside the old one until the header names it).
  void Rename(const std::string& from, const std::string& to);
  bool Tracks(const std::string& name) const;
  bool empty() const { return tracked_.load() == 0; }

  // Before a change to guest bytes [offset, offset + length): see above.
  // Errors are the storage's: the request must then fail without writing.
  Status Mark(uint64_t offset, uint64_t length);

  // Writes exact over disk where they differ, then syncs: every tracked
  // bitmap then holds exactly its changes (close, and after a clear or a
  // merge). REQUIRES that every change it covers is durable already.
  Status WriteBack();

  // A copy of the exact bits of a tracked bitmap, taken under the lock
  // (safe beside Mark); false when `name` is not tracked.
  bool CopyExact(const std::string& name, BitVector* out) const;
  // The run of equal exact bits of tracked bitmap `name` from `bit`: its
  // state and how many bits it spans (to the bitmap's end). False when
  // `name` is not tracked. Safe beside Mark.
  bool RunAt(const std::string& name, uint64_t bit, bool* dirty, uint64_t* bits) const;
  // After a change that Mark announced has completed (or failed): counted
  // in every generation again, so a change in flight while a backup read
  // the disk moves the generation whenever it ends. Every successful Mark
  // is followed by exactly one Done (a failed Mark needs none).
  void Done();
  // How many changes bitmap `name` has tracked since it was first tracked
  // here: a backup reads it before it copies and clears only if it has not
  // moved (ClearExact). False when `name` is not tracked.
  bool Generation(const std::string& name, uint64_t* generation) const;
  // Clears the exact bits of `name` in memory, safely beside Mark: its copy
  // on disk keeps what it has (a superset is always allowed) until a
  // write-back. kBusy while any change is in flight (between its Mark and
  // its Done: its data may land after a backup read the range, so its bit
  // must stay), and, with `if_generation`, when a change was tracked since
  // that generation (the disk changed while it was being backed up).
  // kNotFound when `name` is not tracked.
  Status ClearExact(const std::string& name, const uint64_t* if_generation);
  // The exact bits of a tracked bitmap (nullptr when not tracked); the
  // caller may change them (clear, merge) and then calls WriteBack.
  BitVector* ExactBits(const std::string& name);
  // The data clusters of a tracked bitmap (nullptr when not tracked).
  const std::vector<uint64_t>* DataClusters(const std::string& name) const;

 private:
  struct State {
    Bitmap b;
    BitVector exact;
    BitVector disk;
    BitVector durable;  // per region
    BitVector pending;  // per region: in the next write round
    uint64_t region_bits = 1;
    uint64_t generation = 0;  // marks and completions of changes
  };
  struct RegionRef {
    size_t bitmap;
    uint64_t region;
  };

  // Mark, once the change is counted in flight.
  Status MarkCounted(uint64_t offset, uint64_t length);
  // The regions of [offset, offset + length) not yet durable.
  std::vector<RegionRef> Missing(uint64_t offset, uint64_t length) const TD_REQUIRES(mu_);
  bool AllDurable(const std::vector<RegionRef>& regions) const TD_REQUIRES(mu_);
  // One write round of every pending region: sets their bits in disk,
  // writes the sectors holding them and syncs. Lets mu_ go for the I/O.
  Status WriteRound() TD_REQUIRES(mu_);
  // Bytes to write at one host offset.
  struct Run {
    uint64_t host_offset;
    std::vector<uint8_t> bytes;
  };
  // The given 512-byte sectors of a bitmap's data, taken from `bits` and
  // merged into runs inside each data cluster.
  void CollectRuns(const State& s, const BitVector& bits,
                   const std::vector<uint64_t>& sectors, std::vector<Run>* runs) const
      TD_REQUIRES(mu_);
  // Writes the runs, each announced as `event`. No sync; no lock needed.
  Status WriteRuns(const std::vector<Run>& runs, io::Event event);

  io::Storage& storage_;
  const uint64_t cs_;
  const uint64_t mark_ahead_;

  mutable util::Mutex mu_;
  util::CondVar round_done_;
  std::vector<State> bitmaps_ TD_GUARDED_BY(mu_);
  bool writing_ TD_GUARDED_BY(mu_) = false;  // a write round is in progress
  // bitmaps_.size(), readable without mu_: requests on an image that
  // tracks nothing pay no lock.
  std::atomic<size_t> tracked_{0};
  // Changes between their Mark and their Done, whatever is tracked.
  std::atomic<uint64_t> in_flight_{0};
};

}  // namespace thindisk::qcow2
