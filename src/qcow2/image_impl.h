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
#include "util/mutex.h"
#include "util/thread_annotations.h"

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
  // The header's fields a tool reads (geometry, version, backing file)
  // change only under flush_mu_ with no request in flight (resize,
  // amend), so the caller that owns the image reads them without mu_.
  const Header& header() const override TD_NO_THREAD_SAFETY_ANALYSIS { return header_; }
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

  // ---- mapping (image_map.cc) ----
  // The host offset of the cached slice of the L2 table at `l2_offset`
  // that holds entry `l2i`, and where the entry is within the slice.
  uint64_t L2SliceOffset(uint64_t l2_offset, uint64_t l2i) const {
    return l2_offset + l2i / l2_slice_entries_ * l2_slice_size_;
  }
  uint64_t L2SliceByte(uint64_t l2i) const {
    return l2i % l2_slice_entries_ * l2_entry_size_;
  }
  // The slice holding entry `l2i` of the L2 table at `l2_offset`.
  Result<std::shared_ptr<Table>> L2SliceLocked(uint64_t l2_offset, uint64_t l2i)
      TD_REQUIRES(mu_) {
    return l2_cache_->Get(L2SliceOffset(l2_offset, l2i));
  }
  Result<L2Mapping> LookupLocked(uint64_t guest_cluster) TD_REQUIRES(mu_);
  // LookupLocked for a request (a read, a write, zeroes, a discard): an L2
  // table not in memory is read with mu_ released meanwhile, so
  // lookups of other tables need not wait for the disk. One request loads a
  // table; others wanting it wait for that load. A writer may use it: the
  // range lock it holds keeps its cluster's mapping as it was looked up.
  Result<L2Mapping> LookupLoadingUnlocked(uint64_t guest_cluster) TD_REQUIRES(mu_);
  // Whether the L2 entry of `gc` is in memory (or there is no L2 table).
  bool L2InMemoryLocked(uint64_t guest_cluster) const TD_REQUIRES(mu_);
  // Loads, with mu_ released meanwhile, the refcount blocks that the next
  // single cluster's allocation would read (Allocator::ColdBlockAhead), so
  // that a search for free space through a cold part of a large image
  // does not hold the lock across the disk. As many loads as the image has
  // blocks at most; whatever is still not in memory then is loaded by the
  // allocation, under the lock.
  Status LoadAllocationBlocksUnlocked() TD_REQUIRES(mu_);
  // One try at loading the table at `offset` into `cache` with mu_
  // released during the read: true when this call read it, false when
  // it waited for another caller's load instead. The table may be missing
  // again afterwards (the load was outdated, or evicted): look again.
  Result<bool> LoadTableUnlocked(TableCache& cache, uint64_t offset) TD_REQUIRES(mu_);
  Status SetMappingLocked(uint64_t guest_cluster, const L2Mapping& m) TD_REQUIRES(mu_);
  // The slice of the L2 table that maps `gc`, ready to be changed: the
  // table allocated when there is none, copied when a snapshot shares it.
  Result<std::shared_ptr<Table>> WritableL2Locked(uint64_t gc) TD_REQUIRES(mu_);
  Status ValidateMapping(uint64_t guest_cluster, const L2Mapping& m) TD_REQUIRES(mu_);
  // Queues the release of whatever host space `m` holds.
  void FreeMappingLocked(const L2Mapping& m) TD_REQUIRES(mu_);
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
  Status DropMappingsPastLocked(uint64_t new_size, uint64_t old_size) TD_REQUIRES(mu_);
  Status TruncateUnusedTail() TD_REQUIRES(flush_mu_);

  // ---- grow with preallocation (image_preallocate.cc) ----
  // Whether guest cluster gc, mapped as m, can be given a host cluster
  // without changing what it reads.
  bool PreallocatableLocked(uint64_t gc, const L2Mapping& m) const TD_REQUIRES(mu_);
  // Preallocates guest clusters [first, first + count); REQUIRES the range
  // lock on them too.
  Status PreallocateBatch(uint64_t first, uint64_t count, Preallocation mode,
                          std::string* warning) TD_REQUIRES(flush_mu_);

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
  // them). REQUIRES no request in flight.
  Status OpenBitmapsLocked() TD_REQUIRES(mu_);
  // Writes `entries` as the new directory (or drops the extension when
  // empty) and switches the header to it; the old directory is freed
  // deferred. A failure before the header write changes nothing; one in
  // it or its sync leaves `entries` the engine's view, written again by
  // the next flush (callers keep tracking what they were to drop, and free
  // nothing). REQUIRES no request in flight.
  Status StoreBitmapDirectoryLocked(std::vector<BitmapDirectoryEntry> entries)
      TD_REQUIRES(mu_);
  // Makes entry `e`'s data hold `bits`: in place where a data cluster
  // exists, in new clusters where one must (all of them with
  // `allocate_all`), then the changed table entries in place. Ends synced.
  // REQUIRES no request in flight.
  Status StoreBitmapBitsLocked(const BitmapDirectoryEntry& e, const BitVector& bits,
                               bool allocate_all) TD_REQUIRES(mu_);
  // Writes `bits` as a new bitmap like `e`: data clusters (every one with
  // `allocate_all`, else only those with a bit set) and a table, all newly
  // allocated; nothing names them yet and nothing is synced. Returns `e`
  // with the new table; `data_clusters` (optional) gets each entry's
  // cluster (0: none).
  Result<BitmapDirectoryEntry> WriteNewBitmapLocked(const BitmapDirectoryEntry& e,
                                                    const BitVector& bits,
                                                    bool allocate_all,
                                                    std::vector<uint64_t>* data_clusters)
      TD_REQUIRES(mu_);
  // A resize's bitmaps: every bitmap written anew at the new size (tracked
  // ones with all data clusters, holding their exact bits), and a new
  // directory, none named yet. The header write that carries the new size
  // names them too (FlushMetadataLocked), so no crash can pair a size with
  // bitmaps of another size; ApplyResizedBitmapsLocked then frees the old
  // ones and tracks the new. kInvalidArgument when a bitmap is
  // inconsistent or would exceed the limits at the new size.
  // Until then each tracked bitmap's new copy is tracked too, under
  // ResizeShadowName, so no change made meanwhile is missing from it
  // whenever the switch comes; DropResizedBitmapsLocked gives up a resize
  // that will not happen (its clusters leak).
  Status PrepareResizedBitmapsLocked(uint64_t new_size) TD_REQUIRES(mu_);
  void ApplyResizedBitmapsLocked() TD_REQUIRES(mu_);
  void DropResizedBitmapsLocked() TD_REQUIRES(mu_);
  static std::string ResizeShadowName(const std::string& name) { return "\x01resize:" + name; }
  // Why the clusters of bitmap `e` (its table, and the data clusters
  // `table` names) may be neither written nor freed: "" when each has
  // refcount 1 and none is the image's metadata (header, L1 and L2
  // tables, refcount table and blocks, snapshot table and snapshot L1s,
  // the directory, another bitmap's table) or named twice. qemu keeps such
  // an overlap from being written; a bitmap that has one is inconsistent.
  std::string BitmapClustersProblemLocked(const BitmapDirectoryEntry& e,
                                          const std::vector<BitmapTableEntry>& table)
      TD_REQUIRES(mu_);
  // The table entries of `e` (validated, overlaps included) and its bits as stored.
  Result<std::vector<BitmapTableEntry>> ReadBitmapTableLocked(
      const BitmapDirectoryEntry& e) TD_REQUIRES(mu_);
  Result<BitVector> ReadBitmapBitsLocked(const BitmapDirectoryEntry& e) TD_REQUIRES(mu_);

  // ---- flush (image_flush.cc) ----
  // What FlushAll finishes without mu_ when nothing else is ordered after
  // stage 1's refcount blocks and stage 3's L2 tables (no refcount table
  // entry, L1 entry or header to write): their writes (copies taken under
  // mu_, the tables marked clean), each stage's sync, then the last sync.
  struct OwedTail {
    // The caches the blocks and tables were taken from: their Write reads
    // no cache state, so it is called without mu_.
    const TableCache* block_cache = nullptr;
    TableCache::Taken blocks;
    const TableCache* l2_cache = nullptr;
    TableCache::Taken tables;
    // A sync between the blocks (or the data) and the tables.
    bool sync_before_tables = false;
    bool sync = false;
    // table_write_mu_, held until the blocks and tables are written.
    std::unique_lock<std::mutex> order;
  };
  // Stages 1-4. With `owed`, stage 1's and stage 3's writes and syncs, when
  // nothing else follows them, are left to the caller.
  Status FlushMetadataLocked(OwedTail* owed = nullptr) TD_REQUIRES(mu_);
  // Takes what stages 1 and 3 write into `owed` (FlushMetadataLocked).
  void TakeTailLocked(OwedTail* owed) TD_REQUIRES(mu_);
  // Writes what `owed` holds, with the sync before the tables (without
  // mu_), and lets table_write_mu_ go. The last sync is the caller's.
  Status WriteTail(OwedTail& owed) TD_EXCLUDES(mu_);
  bool MetadataDirtyLocked() const TD_REQUIRES(mu_);  // anything for stages 1-4 to write
  Status WriteHeaderLocked() TD_REQUIRES(mu_);        // encodes header_ at offset 0
  Status FlushAll() TD_REQUIRES(flush_mu_);           // stages 1-5

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

  util::Mutex flush_mu_;
  std::shared_mutex free_gate_;
  ReaderEpochs planned_readers_;  // the pins of live read plans
  RangeLock range_lock_;

  util::Mutex mu_;
  // Orders writes of L2 tables and refcount blocks: held by every metadata
  // flush (taken under mu_) and by FlushAll from stage 1 until its taken
  // blocks and tables are written without mu_, so no flush writes a table,
  // or syncs what it wrote, while an older copy of it is still on its way
  // (docs/engine.md). It guards no
  // member, and its hold leaves FlushMetadataLocked in OwedTail, which the
  // analysis cannot follow: a plain std::mutex.
  std::mutex table_write_mu_;
  Header header_ TD_GUARDED_BY(mu_);              // the header as on disk
  bool header_dirty_ TD_GUARDED_BY(mu_) = false;  // size or features changed
  std::vector<uint64_t> l1_ TD_GUARDED_BY(mu_);
  std::set<uint64_t> l1_dirty_ TD_GUARDED_BY(mu_);  // entries changed in place
  bool l1_moved_ TD_GUARDED_BY(mu_) = false;        // l1_ lives at new_l1_offset_
  uint64_t new_l1_offset_ TD_GUARDED_BY(mu_) = 0;
  std::unique_ptr<TableCache> l2_cache_ TD_GUARDED_BY(mu_);
  util::CondVar table_loaded_;  // with mu_: a LoadTableUnlocked ended
  std::unique_ptr<Allocator> allocator_ TD_GUARDED_BY(mu_);
  bool in_metadata_flush_ TD_GUARDED_BY(mu_) = false;
  // The L2 cache's changes() when a sync that FlushAll made without the
  // lock began. Every data write whose mapping was in the cache
  // by then is durable, so while the count is unchanged stage 3 needs no
  // sync of its own before it writes L2 tables.
  uint64_t l2_changes_synced_ TD_GUARDED_BY(mu_) = ~uint64_t{0};
  // The bitmap directory as on disk (empty without a consistent bitmaps
  // extension), and the tracker of the enabled bitmaps (every read-write
  // open has one, set in Init and never replaced; it may track none).
  std::vector<BitmapDirectoryEntry> bitmap_dir_ TD_GUARDED_BY(mu_);
  // Why a read-only open could not read the directory.
  std::string bitmap_error_ TD_GUARDED_BY(mu_);
  std::unique_ptr<BitmapTracker> tracker_;
  struct ResizedBitmaps {
    BitmapsExtension ext;
    std::vector<BitmapDirectoryEntry> dir;
    std::vector<Allocator::Range> frees;  // the old bitmaps' clusters
    std::vector<std::string> tracked;     // names whose new copy the tracker has as a shadow
  };
  std::unique_ptr<ResizedBitmaps> resized_bitmaps_ TD_GUARDED_BY(mu_);

  // Last decompressed clusters, keyed by host offset.
  util::Mutex compressed_mu_;
  struct Decompressed {
    uint64_t host_offset;
    std::shared_ptr<const std::vector<uint8_t>> data;
  };
  std::list<Decompressed> compressed_cache_ TD_GUARDED_BY(compressed_mu_);
};

}  // namespace thindisk::qcow2
