// TableCache: a write-back LRU cache of metadata tables (L2 tables,
// refcount blocks), keyed by host offset. A cached table is a whole
// cluster (refcount blocks) or a slice of one (L2 tables are cached in
// 4 KiB slices, as qemu's L2 cache works: a lookup in a cold table reads
// 4 KiB, not the whole cluster, and the same memory holds tables of more
// of the disk).
//
// Tables are loaded on first use and changed in memory; a changed table is
// marked dirty and reaches the file only when the owner's ordered flush
// calls WriteDirty() (docs/engine.md: stage 1 for refcount blocks, stage 3
// for L2 tables). The cache remembers which 512-byte sectors of a table
// changed and writes only those (runs of them, joined across short clean
// gaps, and runs of neighbouring tables that meet joined into one write),
// so a flush after one new mapping writes one sector of the L2 table and
// one of the refcount block, not two whole clusters. A table made by New()
// is written whole the first time: its cluster may hold old bytes.
//
// When the cache is full and its least recently used unpinned table is
// dirty, the cache first calls the owner's flush hook (which runs the whole
// ordered flush, cleaning every table) and then evicts.
//
// A table is pinned while a caller holds its shared_ptr: pinned tables are
// never evicted, so a pointer stays valid across other cache calls.
//
// Thread safety: none. The owner serializes all calls (the image's metadata
// mutex); only the read between BeginLoad and FinishLoad happens without it.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "io/storage.h"
#include "util/result.h"
#include "util/status.h"

namespace thindisk::qcow2 {

struct Table {
  uint64_t offset = 0;  // host offset, cluster-aligned
  std::vector<uint8_t> data;
  bool dirty = false;
  bool fresh = false;  // created by New() and not yet written
  // Per 512-byte sector: changed since the last write (all of them for a
  // fresh table).
  std::vector<bool> dirty_sectors;
};

class TableCache {
 public:
  // `capacity` tables (at least 2). `flush_hook` writes every dirty table of
  // this cache (and whatever must precede it); it is called with the owner's
  // lock held, and must not call back into Get()/New() of this cache in a way
  // that loads more than it frees.
  // Each write is announced to the storage as `fresh_event` (it holds the
  // first write of a table made by New()) or `update_event`.
  // `cluster_size`, when larger than `table_size`, makes each table a slice
  // of a cluster (DropCluster drops them all); 0 means tables are clusters.
  TableCache(io::Storage& storage, uint64_t table_size, size_t capacity,
             std::function<Status()> flush_hook,
             io::Event fresh_event = io::Event::kL2Alloc,
             io::Event update_event = io::Event::kL2Update, uint64_t cluster_size = 0);

  // The table at `offset`, read from storage on a miss.
  Result<std::shared_ptr<Table>> Get(uint64_t offset);
  // Whether the table at `offset` is in memory (a Get would not read it).
  bool Cached(uint64_t offset) const { return map_.count(offset) != 0; }

  // A load without the owner's lock, for readers that must not hold it
  // across the disk. Under the lock, BeginLoad makes the caller the one
  // loading `offset` (false: another caller is, so wait for its FinishLoad
  // and look again). The caller reads the table unlocked; under the lock
  // again, FinishLoad caches the bytes read, unless the table was made
  // (New), loaded (Get) or dropped in the meantime: those bytes may be
  // stale then, and the caller finds the cache's own table when it looks
  // again. `read_ok` false (the read failed) only ends the load. An error
  // is the cache's flush hook's, when making room.
  bool BeginLoad(uint64_t offset);
  Status FinishLoad(uint64_t offset, std::vector<uint8_t> data, bool read_ok);

  // A new all-zero table at `offset` (dirty; not read from storage): used
  // for freshly allocated tables. Replaces any cached table at that offset.
  Result<std::shared_ptr<Table>> New(uint64_t offset);
  // Drops a table without writing it (its cluster was freed).
  void Drop(uint64_t offset);
  // Drops every table (every slice) of the cluster at `offset`.
  void DropCluster(uint64_t offset);

  // Writes every dirty table (no sync) and marks them clean. When that
  // takes at most kMaxRewrites writes, those of tables already on disk go
  // through io::Storage::RewriteAt (a file writes just those sectors).
  // Take, Write and (when Write fails) Restore, in one go.
  Status WriteDirty();

  // What a write of the dirty tables takes: copies of their changed bytes,
  // and the tables themselves, pinned (so none leaves the cache and is read
  // back from storage before the copies are written).
  struct Taken {
    struct Write {
      uint64_t offset;
      std::vector<uint8_t> bytes;
      bool fresh;  // holds the first write of a table made by New()
    };
    std::vector<Write> writes;
    bool rewrite = false;  // few enough writes for RewriteAt
    struct Pin {
      std::shared_ptr<Table> table;
      bool fresh;
    };
    std::vector<Pin> pins;
  };
  // Copies what WriteDirty would write and marks the tables clean.
  Taken Take();
  // Writes what Take copied. It reads no state of the cache, so the owner
  // may call it without its lock; it must order it against every other
  // write of the same tables itself (no later Take's writes may start
  // before these end).
  Status Write(const Taken& taken) const;
  // After a failed Write: marks the taken tables dirty again (fresh ones
  // whole), so the next flush writes them. Tables dropped since are left.
  void Restore(const Taken& taken);
  bool HasDirty() const { return dirty_count_ > 0; }
  // How many times a table has been changed (MarkDirty, New) since the cache
  // was made: an owner that compares two readings knows whether anything
  // changed in between.
  uint64_t changes() const { return changes_; }
  // Marks the whole table changed.
  void MarkDirty(Table& t);
  // Marks `len` bytes at `offset` within the table changed.
  void MarkDirty(Table& t, uint64_t offset, uint64_t len);

  // Tables are written in pieces of whole sectors of this size.
  static constexpr uint64_t kSector = 512;
  // Clean sectors between two changed ones are written too, rather than
  // split the write, when the gap is at most this long.
  static constexpr uint64_t kJoinGap = 4096;
  // Pieces of neighbouring tables are joined into writes of at most this.
  static constexpr uint64_t kMaxJoin = 1 << 20;
  // A flush that writes more pieces than this writes them all through the
  // page cache: written around it, each is a device round trip of its own,
  // where the flush's sync sends the pages all at once.
  static constexpr size_t kMaxRewrites = 2;

  // What a cached table costs beyond its bytes, about: an owner that
  // sizes a cache of small tables by memory counts it.
  static constexpr uint64_t kBookkeeping = 256;

  size_t size() const { return map_.size(); }
  size_t capacity() const { return capacity_; }
  uint64_t table_size() const { return table_size_; }

 private:
  struct Entry {
    std::shared_ptr<Table> table;
    std::list<uint64_t>::iterator lru_pos;
  };
  // Makes room for one more table. May call flush_hook_.
  Status MakeRoom();
  void Touch(Entry& e);
  // A write of changed bytes of a table: `fresh` when it is the first of
  // a table made by New().
  struct Piece {
    uint64_t offset;  // host offset
    std::span<const uint8_t> bytes;
    bool fresh;
  };
  // The changed sectors of one table (all of it when fresh), as pieces.
  void AddPieces(const Table& t, std::vector<Piece>* out) const;
  // Caches `t` as the most recently used table.
  Status Insert(std::shared_ptr<Table> t);
  // Forgets the cached table `it` names.
  void Erase(std::unordered_map<uint64_t, Entry>::iterator it);
  // Whether tables are slices of clusters (cached_slices_ counts them).
  bool sliced() const { return cluster_size_ > table_size_; }
  uint64_t ClusterOf(uint64_t offset) const { return offset & ~(cluster_size_ - 1); }
  // A load begun by BeginLoad must not cache what it read.
  void Outdate(uint64_t offset);

  io::Storage& storage_;
  const uint64_t table_size_;
  const uint64_t cluster_size_;  // a power of two, at least table_size_
  const size_t capacity_;
  std::function<Status()> flush_hook_;
  const io::Event fresh_event_;
  const io::Event update_event_;
  bool in_flush_hook_ = false;

  std::unordered_map<uint64_t, Entry> map_;
  std::list<uint64_t> lru_;  // front = most recently used
  size_t dirty_count_ = 0;
  uint64_t changes_ = 0;
  // Loads in progress without the lock: offset -> outdated.
  std::unordered_map<uint64_t, bool> loading_;
  // With slices: cluster offset -> how many of its slices are cached.
  std::unordered_map<uint64_t, uint32_t> cached_slices_;
};

}  // namespace thindisk::qcow2
