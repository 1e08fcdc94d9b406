// ImageImpl: the qcow2 runtime engine behind qcow2::Image (image.h).
// Private to src/qcow2/; split over one-concept files:
//   image_open.cc    opening, header rewrite, close
//   image_map.cc     L1/L2 lookup and mapping updates (L2 allocation, L2 COW)
//   image_read.cc    read path (plain, subclusters, compressed, backing)
//   image_write.cc   write path (in place, allocating, copy-on-write)
//   image_zero.cc    write-zeroes and discard
//   image_status.cc  block status
//   image_flush.cc   the ordered write-back flush (docs/engine.md)
//   image_resize.cc  grow and shrink
//   image_compress.cc WriteCompressed
//   image_bitmaps.cc  persistent bitmaps: load at open, keep tracked ones
//                     allocated, store the directory (qcow2/bitmaps.h has
//                     the operations, qcow2/bitmap_tracker.h the marking)
//
// Locking (docs/engine.md "Concurrency"):
//   flush_mu_  serializes Flush/Resize/Close.
//   free_gate_ readers hold it shared for the whole request; stage 5 of the
//              flush takes it exclusively (and instantly releases it) before
//              applying frees, so no reader can still be using a cluster
//              when it becomes reusable. A read plan (PlanRead) pins its
//              mappings in planned_readers_ instead, which the same stage
//              waits for (WaitForReaders).
//   range_lock_ one guest cluster per writer piece.
//   mu_        metadata: L1, both caches, allocator, header copy. Never held
//              across data I/O; held across table loads except a request's
//              L2 load (LookupLoadingUnlocked).
//   tracker_   its own lock, taken by Mark before a request takes any other
//              (bitmap_tracker.h); never while holding mu_ during requests.
// Lock order: flush_mu_ > range lock > free_gate_ > mu_ > compressed_mu_.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "qcow2/allocator.h"
#include "qcow2/bitmap_tracker.h"
#include "qcow2/image.h"
#include "qcow2/range_lock.h"
#include "qcow2/reader_epochs.h"
#include "qcow2/table_cache.h"

namespace thindisk::qcow2 {

// The state of one subcluster (or, for standard L2, of the whole cluster).
enum class SubState : uint8_t { kUnallocated, kZero, kData, kCompressed };

class ImageImpl final : public Image {
 public:
  ImageImpl(std::unique_ptr<io::Storage> storage, Header header, bool read_only);
  ~ImageImpl() override;

  Status Init(const OpenOptions& options, uint64_t file_size);
  // After a failed Init: destroy without flushing.
  void Abandon() { closed_ = true; }

  // block::Device
  uint64_t size() const override { return size_.load(); }
  const block::DeviceInfo& info() const override { return info_; }
  Status Read(uint64_t offset, std::span<uint8_t> buf) override;
  Status Write(uint64_t offset, std::span<const uint8_t> buf, block::WriteFlags flags) override;
  Status WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) override;
  Status Discard(uint64_t offset, uint64_t length) override;
  Status Flush() override;
  Result<block::Extent> GetStatus(uint64_t offset, uint64_t max_length) override;
  Status Resize(uint64_t new_size, bool shrink) override;
  Status Close() override;
  Result<block::ReadPlan> PlanRead(uint64_t offset, uint64_t length) override;

  // Image
  const Header& header() const override { return header_; }
  io::Storage& storage() override { return *storage_; }
  block::Device* backing() override { return backing_.get(); }
  Status WriteCompressed(uint64_t offset, std::span<const uint8_t> data) override;
  Status Deallocate(uint64_t offset, uint64_t length) override;  // image_deallocate.cc
  Status GrowPreallocated(uint64_t new_size, Preallocation mode,
                          std::string* warning) override;  // image_preallocate.cc

  // The enabled bitmaps' tracker (null on read-only opens): set in Init,
  // never replaced; its methods lock themselves.
  BitmapTracker* bitmap_tracker() const { return tracker_.get(); }

 private:
  // Internal snapshots (snapshot.cc) rewrite the L1 table, refcounts and
  // header with the engine's own caches and ordered flush.
  friend class SnapshotEditor;
  // Persistent bitmaps (bitmaps.cc) likewise, with the directory below.
  friend class BitmapEditor;

  // ---- geometry ----
  uint64_t cs() const { return cluster_size_; }
  uint64_t scs() const { return subcluster_size_; }
  uint32_t SubclusterCount() const { return extended_ ? 32 : 1; }
  uint32_t AllSubclusters() const { return extended_ ? 0xffffffffu : 1u; }
  std::string GuestPos(uint64_t guest_cluster) const;
  Status CheckRange(uint64_t offset, uint64_t length) const;

  // ---- mapping (image_map.cc); all REQUIRE mu_ ----
  // The host offset of the cached slice of the L2 table at `l2_offset`
  // that holds entry `l2i`, and where the entry is within the slice.
  uint64_t L2SliceOffset(uint64_t l2_offset, uint64_t l2i) const {
    return l2_offset + l2i / l2_slice_entries_ * l2_slice_size_;
  }
  uint64_t L2SliceByte(uint64_t l2i) const {
    return l2i % l2_slice_entries_ * l2_entry_size_;
  }
  // The slice holding entry `l2i` of the L2 table at `l2_offset`.
  Result<std::shared_ptr<Table>> L2SliceLocked(uint64_t l2_offset, uint64_t l2i) {
    return l2_cache_->Get(L2SliceOffset(l2_offset, l2i));
  }
  Result<L2Mapping> LookupLocked(uint64_t guest_cluster);
  // LookupLocked for a request (a read, a write, zeroes, a discard): an L2
  // table not in memory is read with `lock` (on mu_) released meanwhile, so
  // lookups of other tables need not wait for the disk. One request loads a
  // table; others wanting it wait for that load. A writer may use it: the
  // range lock it holds keeps its cluster's mapping as it was looked up.
  Result<L2Mapping> LookupLoadingUnlocked(uint64_t guest_cluster,
                                          std::unique_lock<std::mutex>& lock);
  // Whether the L2 entry of `gc` is in memory (or there is no L2 table).
  bool L2InMemoryLocked(uint64_t guest_cluster) const;
  // One try at loading the table at `offset` into `cache` with `lock` (on
  // mu_) released during the read: true when this call read it, false when
  // it waited for another caller's load instead. The table may be missing
  // again afterwards (the load was outdated, or evicted): look again.
  Result<bool> LoadTableUnlocked(TableCache& cache, uint64_t offset,
                                 std::unique_lock<std::mutex>& lock);
  Status SetMappingLocked(uint64_t guest_cluster, const L2Mapping& m);
  // The slice of the L2 table that maps `gc`, ready to be changed: the
  // table allocated when there is none, copied when a snapshot shares it.
  Result<std::shared_ptr<Table>> WritableL2Locked(uint64_t gc);
  Status ValidateMapping(uint64_t guest_cluster, const L2Mapping& m);
  // Queues the release of whatever host space `m` holds.
  void FreeMappingLocked(const L2Mapping& m);
  SubState StateOf(const L2Mapping& m, uint32_t sub) const;
  // Where the run of subclusters in the state of the one holding cluster
  // offset `pos` ends (at most `end`), for a cluster mapped by `m`.
  uint64_t RunEnd(const L2Mapping& m, uint64_t pos, uint64_t end) const;
  // Whether [in_off, in_off + len) of a cluster mapped by `m` is all data
  // in place (one host range).
  bool AllData(const L2Mapping& m, uint64_t in_off, uint64_t len) const;

  // ---- read (image_read.cc) ----
  // Reads [in_off, in_off + out.size()) of guest cluster `gc` as mapped by m.
  Status ReadWithMapping(uint64_t gc, const L2Mapping& m, uint64_t in_off, std::span<uint8_t> out);
  Status ReadBacking(uint64_t guest_offset, std::span<uint8_t> out);
  Status ReadCompressedCluster(uint64_t gc, const L2Mapping& m, std::vector<uint8_t>* cluster);
  // PlanRead's pieces of [in_off, in_off + length) of guest cluster `gc`
  // as mapped by m, at buf_offset in the plan; and of a range the backing
  // file (or zeros past its end) provides.
  Status PlanWithMapping(uint64_t gc, const L2Mapping& m, uint64_t in_off,
                         uint64_t length, uint64_t buf_offset, block::ReadPlan* plan);
  Status PlanBacking(uint64_t guest_offset, uint64_t length, uint64_t buf_offset,
                     block::ReadPlan* plan);
  // Returns once no reader can still use a mapping replaced before the
  // call: Reads in progress (free_gate_) and live read plans
  // (planned_readers_). Before host space is freed.
  void WaitForReaders();
  void DropCompressedCache();

  // ---- write (image_write.cc); REQUIRE the range lock on gc ----
  // `src` null writes zeros.
  Status WritePieceLocked(uint64_t gc, uint64_t in_off, uint64_t len, const uint8_t* src);
  // Writes whole clusters gc.. (at most `count`, from `src`) that hold no
  // host space yet, when at least two lead the run: allocated one by one in
  // the order the per-cluster path allocates (so the file's layout is the
  // same), written with one host write per contiguous host range; returns
  // how many (0: none, for the per-cluster path).
  Result<uint64_t> WriteFreshRun(uint64_t gc, uint64_t count, const uint8_t* src);
  Status WriteInPlace(uint64_t gc, const L2Mapping& m, uint64_t in_off, uint64_t len,
                      const uint8_t* src);
  Status WriteAllocating(uint64_t gc, const L2Mapping& m, uint64_t in_off, uint64_t len,
                         const uint8_t* src);
  // Builds [start, end) of the new content of gc: old content (per `m`)
  // overlaid with `src` at [in_off, in_off + len).
  Status BuildContent(uint64_t gc, const L2Mapping& m, uint64_t start, uint64_t end,
                      uint64_t in_off, uint64_t len, const uint8_t* src,
                      std::vector<uint8_t>* out);
  bool BackingCovers(uint64_t gc) const;
  // Whether the bytes of subcluster `sub` that a partial write leaves
  // uncovered may stay unwritten: the subcluster reads as zeros (zero flag,
  // or unallocated with no backing data under it) and so do its host bytes
  // (`host_zero`: fresh space, or past the end of the file).
  bool FillNeedless(uint64_t gc, const L2Mapping& m, uint32_t sub, bool host_zero) const;

  // ---- zeroes / discard (image_zero.cc) ----
  // `mark`: the bitmaps track the change (not for space a resize adds or
  // cuts, which is outside what they cover).
  Status ZeroRange(uint64_t offset, uint64_t length, bool unmap, bool fast_only, bool discard,
                   bool mark = true);
  // Whole host clusters that a zero or discard released, kept until they
  // are punched together: clusters that follow each other on the host go
  // in one PunchHole (one fallocate for a file; whole objects removed
  // from a RADOS pool, where a cluster alone is only zeroed inside its
  // object). Their frees are queued only after the punch.
  struct PunchRun {
    uint64_t start = 0, end = 0;  // host bytes [start, end)
    std::vector<L2Mapping> released;
  };
  Status ZeroPieces(uint64_t offset, uint64_t length, bool unmap, bool discard, PunchRun* run);
  Status ZeroPieceLocked(uint64_t gc, uint64_t in_off, uint64_t len, bool unmap, bool discard,
                         PunchRun* run);
  // Adds `m`'s host cluster to `run`, punching the run first when the
  // cluster does not extend it (or it is full).
  Status QueuePunch(PunchRun* run, const L2Mapping& m);
  // Punches the run and queues its clusters' frees; leaves it empty.
  Status PunchNow(PunchRun* run);
  // Gives host bytes back (the `discard_punch` step); a storage that cannot
  // punch is no error.
  Status PunchHost(uint64_t offset, uint64_t length);
  uint64_t ClusterBytes(uint64_t gc) const;  // cs, or less for the image's last cluster

  // ---- shrink (image_resize.cc) ----
  // First byte and end of the data this layer holds in [from, to); both 0
  // when none. Allocated clusters count as data; in the partly kept cluster
  // only non-zero bytes do.
  Status FindDataPast(uint64_t from, uint64_t to, uint64_t* first, uint64_t* end);
  Status DropMappingsPastLocked(uint64_t new_size, uint64_t old_size);  // REQUIRES mu_
  Status TruncateUnusedTail();  // REQUIRES flush_mu_

  // ---- grow with preallocation (image_preallocate.cc) ----
  // Whether guest cluster gc, mapped as m, can be given a host cluster
  // without changing what it reads; REQUIRES mu_.
  bool PreallocatableLocked(uint64_t gc, const L2Mapping& m) const;
  // Preallocates guest clusters [first, first + count); REQUIRES flush_mu_
  // and the range lock on them.
  Status PreallocateBatch(uint64_t first, uint64_t count, Preallocation mode,
                          std::string* warning);

  // ---- persistent bitmaps (image_bitmaps.cc) ----
  // Before a change to guest bytes [offset, offset + length): every
  // tracked bitmap marks it, durably (bitmap_tracker.h).
  Status MarkChanged(uint64_t offset, uint64_t length) {
    return tracker_ ? tracker_->Mark(offset, length) : Status::Ok();
  }
  // Tells the tracker, when it goes out of scope, that the change marked
  // before it has ended (BitmapTracker::Done).
  class ChangeDone {
   public:
    explicit ChangeDone(BitmapTracker* tracker) : tracker_(tracker) {}
    ~ChangeDone() {
      if (tracker_) tracker_->Done();
    }
    ChangeDone(const ChangeDone&) = delete;
    ChangeDone& operator=(const ChangeDone&) = delete;

   private:
    BitmapTracker* tracker_;
  };
  // At open: reads the directory; read-write, starts tracking the enabled
  // bitmaps (their data clusters all allocated first) and sets in_use on
  // enabled ones it cannot keep (an inconsistent bitmap, as qemu marks
  // them). REQUIRES mu_ and no request in flight.
  Status OpenBitmapsLocked();
  // Writes `entries` as the new directory (or drops the extension when
  // empty) and switches the header to it; the old directory is freed
  // deferred. A failure before the header write changes nothing; one in
  // it or its sync leaves `entries` the engine's view, written again by
  // the next flush (callers keep tracking what they were to drop, and free
  // nothing). REQUIRES mu_ and no request in flight.
  Status StoreBitmapDirectoryLocked(std::vector<BitmapDirectoryEntry> entries);
  // Makes entry `e`'s data hold `bits`: in place where a data cluster
  // exists, in new clusters where one must (all of them with
  // `allocate_all`), then the changed table entries in place. Ends synced.
  // REQUIRES mu_ and no request in flight.
  Status StoreBitmapBitsLocked(const BitmapDirectoryEntry& e, const BitVector& bits,
                               bool allocate_all);
  // Writes `bits` as a new bitmap like `e`: data clusters (every one with
  // `allocate_all`, else only those with a bit set) and a table, all newly
  // allocated; nothing names them yet and nothing is synced. Returns `e`
  // with the new table; `data_clusters` (optional) gets each entry's
  // cluster (0: none). REQUIRES mu_.
  Result<BitmapDirectoryEntry> WriteNewBitmapLocked(const BitmapDirectoryEntry& e,
                                                    const BitVector& bits, bool allocate_all,
                                                    std::vector<uint64_t>* data_clusters);
  // A resize's bitmaps: every bitmap written anew at the new size (tracked
  // ones with all data clusters, holding their exact bits), and a new
  // directory, none named yet. The header write that carries the new size
  // names them too (FlushMetadataLocked), so no crash can pair a size with
  // bitmaps of another size; ApplyResizedBitmapsLocked then frees the old
  // ones and tracks the new. kInvalidArgument when a bitmap is
  // inconsistent or would exceed the limits at the new size. REQUIRES mu_.
  // Until then each tracked bitmap's new copy is tracked too, under
  // ResizeShadowName, so no change made meanwhile is missing from it
  // whenever the switch comes; DropResizedBitmapsLocked gives up a resize
  // that will not happen (its clusters leak).
  Status PrepareResizedBitmapsLocked(uint64_t new_size);
  void ApplyResizedBitmapsLocked();
  void DropResizedBitmapsLocked();
  static std::string ResizeShadowName(const std::string& name) { return "\x01resize:" + name; }
  // Why the clusters of bitmap `e` (its table, and the data clusters
  // `table` names) may be neither written nor freed: "" when each has
  // refcount 1 and none is the image's metadata (header, L1 and L2
  // tables, refcount table and blocks, snapshot table and snapshot L1s,
  // the directory, another bitmap's table) or named twice. qemu keeps such
  // an overlap from being written; a bitmap that has one is inconsistent.
  // REQUIRES mu_.
  std::string BitmapClustersProblemLocked(const BitmapDirectoryEntry& e,
                                          const std::vector<BitmapTableEntry>& table);
  // The table entries of `e` (validated, overlaps included) and its bits as stored.
  Result<std::vector<BitmapTableEntry>> ReadBitmapTableLocked(const BitmapDirectoryEntry& e);
  Result<BitVector> ReadBitmapBitsLocked(const BitmapDirectoryEntry& e);

  // ---- flush (image_flush.cc) ----
  // What FlushAll finishes without mu_ when nothing else is ordered after
  // stage 3's L2 tables: their writes (copies taken under mu_, the tables
  // marked clean), then the last sync.
  struct OwedTail {
    bool sync = false;
    TableCache::Taken tables;
    // table_write_mu_, held until the tables are written.
    std::unique_lock<std::mutex> order;
  };
  // Stages 1-4; REQUIRES mu_. With `owed`, stage 3's writes and the last
  // sync, when nothing else follows them, are left to the caller.
  Status FlushMetadataLocked(OwedTail* owed = nullptr);
  bool MetadataDirtyLocked() const;  // anything for stages 1-4 to write; REQUIRES mu_
  Status WriteHeaderLocked();    // encodes header_ at offset 0; REQUIRES mu_
  Status FlushAll();             // stages 1-5; REQUIRES flush_mu_

  // ---- state ----
  std::unique_ptr<io::Storage> storage_;
  std::unique_ptr<block::Device> backing_;
  block::DeviceInfo info_;
  const bool read_only_;
  const uint32_t cluster_bits_;
  const uint64_t cluster_size_;
  const bool extended_;
  const uint64_t subcluster_size_;
  const uint64_t l2_entries_;
  const uint32_t l2_entry_size_;
  // The L2 cache holds tables in slices of this many bytes (entries).
  static constexpr uint64_t kL2SliceSize = 4096;
  const uint64_t l2_slice_size_;
  const uint64_t l2_slice_entries_;
  // Copies of header fields that never change while open, readable without mu_.
  const uint32_t version_;
  const CompressionType compression_type_;
  std::atomic<uint64_t> size_{0};
  std::atomic<bool> closed_{false};

  std::mutex flush_mu_;
  std::shared_mutex free_gate_;
  ReaderEpochs planned_readers_;  // the pins of live read plans
  RangeLock range_lock_;

  std::mutex mu_;
  // Orders writes of L2 tables: held by every metadata flush (taken under
  // mu_) and by FlushAll from stage 3 until its taken tables are written
  // without mu_, so no flush writes a table, or syncs what it wrote, while
  // an older copy of it is still on its way (docs/engine.md).
  std::mutex table_write_mu_;
  Header header_;                  // guarded by mu_: the header as on disk
  bool header_dirty_ = false;      // guarded by mu_: size or features changed
  std::vector<uint64_t> l1_;       // guarded by mu_
  std::set<uint64_t> l1_dirty_;    // guarded by mu_: entries changed in place
  bool l1_moved_ = false;          // guarded by mu_: l1_ lives at new_l1_offset_
  uint64_t new_l1_offset_ = 0;     // guarded by mu_
  std::unique_ptr<TableCache> l2_cache_;     // guarded by mu_
  std::condition_variable table_loaded_;     // with mu_: a LoadTableUnlocked ended
  std::unique_ptr<Allocator> allocator_;     // guarded by mu_
  bool in_metadata_flush_ = false;           // guarded by mu_
  // guarded by mu_: the L2 cache's changes() when a sync that FlushAll made
  // without the lock began. Every data write whose mapping was in the cache
  // by then is durable, so while the count is unchanged stage 3 needs no
  // sync of its own before it writes L2 tables.
  uint64_t l2_changes_synced_ = ~uint64_t{0};
  // The bitmap directory as on disk (empty without a consistent bitmaps
  // extension), and the tracker of the enabled bitmaps (every read-write
  // open has one, set in Init and never replaced; it may track none).
  std::vector<BitmapDirectoryEntry> bitmap_dir_;  // guarded by mu_
  std::string bitmap_error_;  // guarded by mu_: why a read-only open could not read the directory
  std::unique_ptr<BitmapTracker> tracker_;
  struct ResizedBitmaps {
    BitmapsExtension ext;
    std::vector<BitmapDirectoryEntry> dir;
    std::vector<Allocator::Range> frees;  // the old bitmaps' clusters
    std::vector<std::string> tracked;     // names whose new copy the tracker has as a shadow
  };
  std::unique_ptr<ResizedBitmaps> resized_bitmaps_;  // guarded by mu_

  // Last decompressed clusters, keyed by host offset.
  std::mutex compressed_mu_;
  struct Decompressed {
    uint64_t host_offset;
    std::shared_ptr<const std::vector<uint8_t>> data;
  };
  std::list<Decompressed> compressed_cache_;  // guarded by compressed_mu_
};

}  // namespace thindisk::qcow2
