// TableCache: a write-back LRU cache of cluster-sized metadata tables
// (L2 tables, refcount blocks), keyed by host offset.
//
// Tables are loaded on first use and changed in memory; a changed table is
// marked dirty and reaches the file only when the owner's ordered flush
// calls WriteDirty() (docs/engine.md: stage 1 for refcount blocks, stage 3
// for L2 tables). The cache remembers which 512-byte sectors of a table
// changed and writes only those (runs of them, joined across short clean
// gaps), so a flush after one new mapping writes one sector of the L2 table
// and one of the refcount block, not two whole clusters. A table made by
// New() is written whole the first time: its cluster may hold old bytes.
//
// When the cache is full and its least recently used unpinned table is
// dirty, the cache first calls the owner's flush hook (which runs the whole
// ordered flush, cleaning every table) and then evicts.
//
// A table is pinned while a caller holds its shared_ptr: pinned tables are
// never evicted, so a pointer stays valid across other cache calls.
//
// Thread safety: none. The owner serializes all calls (the image's metadata
// mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
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
  // Each table write is announced to the storage as `fresh_event` (first
  // write of a table made by New()) or `update_event`.
  TableCache(io::Storage& storage, uint64_t table_size, size_t capacity,
             std::function<Status()> flush_hook, io::Event fresh_event = io::Event::kL2Alloc,
             io::Event update_event = io::Event::kL2Update);

  // The table at `offset`, read from storage on a miss.
  Result<std::shared_ptr<Table>> Get(uint64_t offset);
  // A new all-zero table at `offset` (dirty; not read from storage): used
  // for freshly allocated tables. Replaces any cached table at that offset.
  Result<std::shared_ptr<Table>> New(uint64_t offset);
  // Drops a table without writing it (its cluster was freed).
  void Drop(uint64_t offset);

  // Writes every dirty table (no sync) and marks them clean.
  Status WriteDirty();
  bool HasDirty() const { return dirty_count_ > 0; }
  // Marks the whole table changed.
  void MarkDirty(Table& t);
  // Marks `len` bytes at `offset` within the table changed.
  void MarkDirty(Table& t, uint64_t offset, uint64_t len);

  // Tables are written in pieces of whole sectors of this size.
  static constexpr uint64_t kSector = 512;
  // Clean sectors between two changed ones are written too, rather than
  // split the write, when the gap is at most this long.
  static constexpr uint64_t kJoinGap = 4096;

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
  // Writes the changed sectors of one table (all of it when fresh).
  Status WriteTable(Table& t);

  io::Storage& storage_;
  const uint64_t table_size_;
  const size_t capacity_;
  std::function<Status()> flush_hook_;
  const io::Event fresh_event_;
  const io::Event update_event_;
  bool in_flush_hook_ = false;

  std::unordered_map<uint64_t, Entry> map_;
  std::list<uint64_t> lru_;  // front = most recently used
  size_t dirty_count_ = 0;
};

}  // namespace thindisk::qcow2
