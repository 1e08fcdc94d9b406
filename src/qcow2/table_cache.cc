#include "qcow2/table_cache.h"

#include <algorithm>

namespace thindisk::qcow2 {

TableCache::TableCache(io::Storage& storage, uint64_t table_size, size_t capacity,
                       std::function<Status()> flush_hook, io::Event fresh_event,
                       io::Event update_event, uint64_t cluster_size)
    : storage_(storage),
      table_size_(table_size),
      cluster_size_(std::max(cluster_size, table_size)),
      capacity_(std::max<size_t>(capacity, 2)),
      flush_hook_(std::move(flush_hook)),
      fresh_event_(fresh_event),
      update_event_(update_event) {}

void TableCache::Touch(Entry& e) { lru_.splice(lru_.begin(), lru_, e.lru_pos); }

void TableCache::MarkDirty(Table& t) { MarkDirty(t, 0, t.data.size()); }

void TableCache::MarkDirty(Table& t, uint64_t offset, uint64_t len) {
  if (len == 0) return;
  ++changes_;
  const uint64_t sectors = (t.data.size() + kSector - 1) / kSector;
  t.dirty_sectors.resize(sectors, false);
  const uint64_t last = std::min((offset + len - 1) / kSector, sectors - 1);
  for (uint64_t s = offset / kSector; s <= last; ++s) t.dirty_sectors[s] = true;
  if (!t.dirty) {
    t.dirty = true;
    ++dirty_count_;
  }
}

void TableCache::AddPieces(const Table& t, std::vector<Piece>* out) const {
  const std::span<const uint8_t> bytes(t.data);
  if (t.fresh) {
    out->push_back({t.offset, bytes, true});
    return;
  }
  const uint64_t sectors = (t.data.size() + kSector - 1) / kSector;
  auto is_dirty = [&](uint64_t s) {
    return s < t.dirty_sectors.size() && t.dirty_sectors[s];
  };
  uint64_t s = 0;
  while (s < sectors) {
    if (!is_dirty(s)) {
      ++s;
      continue;
    }
    // A run of changed sectors, continued across clean gaps up to kJoinGap.
    uint64_t end = s + 1;
    for (uint64_t next = end; next < sectors && (next - end) * kSector <= kJoinGap; ++next) {
      if (is_dirty(next)) end = next + 1;
    }
    const uint64_t from = s * kSector;
    const uint64_t to = std::min<uint64_t>(end * kSector, t.data.size());
    out->push_back({t.offset + from, bytes.subspan(from, to - from), false});
    s = end;
  }
}

Status TableCache::MakeRoom() {
  if (map_.size() < capacity_) return Status::Ok();
  // Prefer a clean unpinned table, oldest first.
  for (int pass = 0; pass < 2; ++pass) {
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      auto found = map_.find(*it);
      const auto& t = found->second.table;
      if (t.use_count() > 1 || t->dirty) continue;
      Erase(found);
      return Status::Ok();
    }
    // Everything unpinned is dirty: run the ordered flush, which cleans all
    // tables, then retry once. Re-entry (the flush itself loading tables)
    // simply lets the cache grow past capacity for the duration.
    if (pass == 0) {
      if (in_flush_hook_ || !flush_hook_) return Status::Ok();
      in_flush_hook_ = true;
      Status s = flush_hook_();
      in_flush_hook_ = false;
      TD_RETURN_IF_ERROR(s);
    }
  }
  // All tables pinned: grow temporarily rather than fail.
  return Status::Ok();
}

Status TableCache::Insert(std::shared_ptr<Table> t) {
  TD_RETURN_IF_ERROR(MakeRoom());
  const uint64_t offset = t->offset;
  lru_.push_front(offset);
  map_.emplace(offset, Entry{std::move(t), lru_.begin()});
  if (sliced()) ++cached_slices_[ClusterOf(offset)];
  return Status::Ok();
}

void TableCache::Erase(std::unordered_map<uint64_t, Entry>::iterator it) {
  if (sliced()) {
    auto group = cached_slices_.find(ClusterOf(it->first));
    if (--group->second == 0) cached_slices_.erase(group);
  }
  lru_.erase(it->second.lru_pos);
  map_.erase(it);
}

void TableCache::Outdate(uint64_t offset) {
  auto it = loading_.find(offset);
  if (it != loading_.end()) it->second = true;
}

Result<std::shared_ptr<Table>> TableCache::Get(uint64_t offset) {
  auto it = map_.find(offset);
  if (it != map_.end()) {
    Touch(it->second);
    return it->second.table;
  }
  Outdate(offset);  // this copy is the cache's now, whatever a reader loads
  auto t = std::make_shared<Table>();
  t->offset = offset;
  t->data.resize(table_size_);
  TD_RETURN_IF_ERROR(storage_.ReadAt(offset, t->data));
  TD_RETURN_IF_ERROR(Insert(t));
  return t;
}

bool TableCache::BeginLoad(uint64_t offset) {
  return loading_.emplace(offset, false).second;
}

Status TableCache::FinishLoad(uint64_t offset, std::vector<uint8_t> data, bool read_ok) {
  auto it = loading_.find(offset);
  const bool outdated = it == loading_.end() || it->second;
  if (it != loading_.end()) loading_.erase(it);
  if (!read_ok || outdated || map_.count(offset) != 0) return Status::Ok();
  auto t = std::make_shared<Table>();
  t->offset = offset;
  t->data = std::move(data);
  return Insert(std::move(t));
}

Result<std::shared_ptr<Table>> TableCache::New(uint64_t offset) {
  Drop(offset);
  auto t = std::make_shared<Table>();
  t->offset = offset;
  t->data.assign(table_size_, 0);
  t->fresh = true;
  TD_RETURN_IF_ERROR(Insert(t));
  MarkDirty(*t);
  return t;
}

void TableCache::Drop(uint64_t offset) {
  Outdate(offset);
  auto it = map_.find(offset);
  if (it == map_.end()) return;
  if (it->second.table->dirty) {
    it->second.table->dirty = false;
    it->second.table->dirty_sectors.clear();
    --dirty_count_;
  }
  Erase(it);
}

void TableCache::DropCluster(uint64_t offset) {
  if (!sliced()) return Drop(offset);
  // Most freed clusters are data, with nothing cached and nothing loading:
  // one lookup each.
  if (loading_.empty() && cached_slices_.count(offset) == 0) return;
  for (uint64_t at = offset; at < offset + cluster_size_; at += table_size_) Drop(at);
}

Status TableCache::WriteDirty() {
  if (dirty_count_ == 0) return Status::Ok();
  const Taken taken = Take();
  Status s = Write(taken);
  if (!s.ok()) Restore(taken);
  return s;
}

TableCache::Taken TableCache::Take() {
  Taken taken;
  if (dirty_count_ == 0) return taken;
  for (auto& [off, e] : map_) {
    if (e.table->dirty) taken.pins.push_back({e.table, e.table->fresh});
  }
  // Write in offset order: sequential for the host.
  std::sort(taken.pins.begin(), taken.pins.end(),
            [](const Taken::Pin& a, const Taken::Pin& b) {
              return a.table->offset < b.table->offset;
            });
  std::vector<Piece> pieces;
  for (const Taken::Pin& pin : taken.pins) AddPieces(*pin.table, &pieces);
  // Pieces that meet (the slices of a new table, above all) go in one write.
  for (size_t i = 0; i < pieces.size();) {
    Taken::Write w{pieces[i].offset, {}, pieces[i].fresh};
    uint64_t end = pieces[i].offset + pieces[i].bytes.size();
    size_t last = i + 1;
    for (; last < pieces.size() && pieces[last].offset == end &&
           end + pieces[last].bytes.size() - pieces[i].offset <= kMaxJoin;
         ++last) {
      end += pieces[last].bytes.size();
      w.fresh = w.fresh || pieces[last].fresh;
    }
    w.bytes.reserve(end - w.offset);
    for (size_t k = i; k < last; ++k)
      w.bytes.insert(w.bytes.end(), pieces[k].bytes.begin(), pieces[k].bytes.end());
    taken.writes.push_back(std::move(w));
    i = last;
  }
  taken.rewrite = taken.writes.size() <= kMaxRewrites;
  for (const Taken::Pin& pin : taken.pins) {
    Table& t = *pin.table;
    t.dirty = false;
    t.fresh = false;
    t.dirty_sectors.clear();
    --dirty_count_;
  }
  return taken;
}

Status TableCache::Write(const Taken& taken) const {
  for (const Taken::Write& w : taken.writes) {
    storage_.Announce(w.fresh ? fresh_event_ : update_event_);
    TD_RETURN_IF_ERROR(taken.rewrite && !w.fresh ? storage_.RewriteAt(w.offset, w.bytes)
                                                 : storage_.WriteAt(w.offset, w.bytes));
  }
  return Status::Ok();
}

void TableCache::Restore(const Taken& taken) {
  for (const Taken::Pin& pin : taken.pins) {
    Table& t = *pin.table;
    auto it = map_.find(t.offset);
    if (it == map_.end() || it->second.table != pin.table) continue;  // dropped
    if (pin.fresh) {
      t.fresh = true;
      MarkDirty(t);
      continue;
    }
    for (const Taken::Write& w : taken.writes) {
      const uint64_t from = std::max(w.offset, t.offset);
      const uint64_t to = std::min(w.offset + w.bytes.size(), t.offset + t.data.size());
      if (from < to) MarkDirty(t, from - t.offset, to - from);
    }
  }
}

}  // namespace thindisk::qcow2
