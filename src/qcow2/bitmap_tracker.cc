// BitmapTracker (bitmap_tracker.h): marks ahead of every change, group
// committed; writes the exact bits back at close.
#include "qcow2/bitmap_tracker.h"

#include <algorithm>

namespace thindisk::qcow2 {
namespace {

constexpr uint64_t kSector = 512;

}  // namespace

void BitmapTracker::Add(Bitmap b) {
  util::MutexLock lock(mu_);
  State s;
  s.exact = b.bits;
  s.disk = b.bits;
  s.region_bits = std::max<uint64_t>(1, mark_ahead_ >> b.granularity_bits);
  const uint64_t regions = (b.bits.size() + s.region_bits - 1) / s.region_bits;
  s.durable.Resize(regions);
  s.pending.Resize(regions);
  s.b = std::move(b);
  bitmaps_.push_back(std::move(s));
  tracked_ = bitmaps_.size();
}

void BitmapTracker::Remove(const std::string& name) {
  util::MutexLock lock(mu_);
  std::erase_if(bitmaps_, [&](const State& s) { return s.b.name == name; });
  tracked_ = bitmaps_.size();
}

void BitmapTracker::Rename(const std::string& from, const std::string& to) {
  util::MutexLock lock(mu_);
  for (State& s : bitmaps_) {
    if (s.b.name == from) s.b.name = to;
  }
}

bool BitmapTracker::Tracks(const std::string& name) const {
  util::MutexLock lock(mu_);
  return std::any_of(bitmaps_.begin(), bitmaps_.end(),
                     [&](const State& s) { return s.b.name == name; });
}

bool BitmapTracker::CopyExact(const std::string& name, BitVector* out) const {
  util::MutexLock lock(mu_);
  for (const State& s : bitmaps_) {
    if (s.b.name == name) {
      *out = s.exact;
      return true;
    }
  }
  return false;
}

bool BitmapTracker::RunAt(const std::string& name, uint64_t bit, bool* dirty,
                          uint64_t* bits) const {
  util::MutexLock lock(mu_);
  for (const State& s : bitmaps_) {
    if (s.b.name != name) continue;
    *dirty = bit < s.exact.size() && s.exact.Test(bit);
    const uint64_t end = *dirty ? s.exact.NextClear(bit) : s.exact.NextSet(bit);
    *bits = end - std::min(bit, end);
    return true;
  }
  return false;
}

void BitmapTracker::Done() {
  in_flight_.fetch_sub(1);
  if (tracked_.load() == 0) return;
  util::MutexLock lock(mu_);
  for (State& s : bitmaps_) ++s.generation;
}

bool BitmapTracker::Generation(const std::string& name, uint64_t* generation) const {
  util::MutexLock lock(mu_);
  for (const State& s : bitmaps_) {
    if (s.b.name == name) {
      *generation = s.generation;
      return true;
    }
  }
  return false;
}

Status BitmapTracker::ClearExact(const std::string& name, const uint64_t* if_generation) {
  util::MutexLock lock(mu_);
  for (State& s : bitmaps_) {
    if (s.b.name != name) continue;
    if (const uint64_t n = in_flight_.load(); n != 0) {
      return Status::Busy(std::to_string(n) + " change(s) of the disk are in flight");
    }
    if (if_generation && *if_generation != s.generation) {
      return Status::Busy("bitmap '" + name + "' tracked " +
                          std::to_string(s.generation - *if_generation) +
                          " change(s) since generation " + std::to_string(*if_generation));
    }
    s.exact.ClearAll();
    return Status::Ok();
  }
  return Status::NotFound("bitmap '" + name + "' is not tracked");
}

BitVector* BitmapTracker::ExactBits(const std::string& name) {
  util::MutexLock lock(mu_);
  for (State& s : bitmaps_) {
    if (s.b.name == name) return &s.exact;
  }
  return nullptr;
}

const std::vector<uint64_t>* BitmapTracker::DataClusters(const std::string& name) const {
  util::MutexLock lock(mu_);
  for (const State& s : bitmaps_) {
    if (s.b.name == name) return &s.b.data_clusters;
  }
  return nullptr;
}

std::vector<BitmapTracker::RegionRef> BitmapTracker::Missing(uint64_t offset,
                                                             uint64_t length) const {
  std::vector<RegionRef> out;
  for (size_t i = 0; i < bitmaps_.size(); ++i) {
    const State& s = bitmaps_[i];
    const uint64_t bits = s.exact.size();
    const uint64_t first = offset >> s.b.granularity_bits;
    if (first >= bits) continue;  // past this bitmap's disk (a resize in progress)
    const uint64_t last = std::min(bits - 1, (offset + length - 1) >> s.b.granularity_bits);
    for (uint64_t r = first / s.region_bits; r <= last / s.region_bits; ++r) {
      if (!s.durable.Test(r)) out.push_back({i, r});
    }
  }
  return out;
}

bool BitmapTracker::AllDurable(const std::vector<RegionRef>& regions) const {
  return std::all_of(regions.begin(), regions.end(),
                     [&](const RegionRef& r) TD_REQUIRES(mu_) {
                       return bitmaps_[r.bitmap].durable.Test(r.region);
                     });
}

Status BitmapTracker::Mark(uint64_t offset, uint64_t length) {
  // Counted before anything is looked at, so a bitmap added meanwhile
  // cannot be cleared under this change (the Done that follows uncounts).
  in_flight_.fetch_add(1);
  Status s = MarkCounted(offset, length);
  if (!s.ok()) in_flight_.fetch_sub(1);
  return s;
}

Status BitmapTracker::MarkCounted(uint64_t offset, uint64_t length) {
  if (length == 0 || tracked_.load() == 0) return Status::Ok();
  util::MutexLock lock(mu_);
  if (bitmaps_.empty()) return Status::Ok();
  for (State& s : bitmaps_) {
    const uint64_t first = offset >> s.b.granularity_bits;
    const uint64_t last = (offset + length - 1) >> s.b.granularity_bits;
    s.exact.SetRange(first, last - first + 1);
    ++s.generation;
  }
  const std::vector<RegionRef> need = Missing(offset, length);
  // Rule: the bits covering a change are durable before the change is
  // written. A writer's round that fails leaves its regions not durable;
  // a waiter then runs a round of its own, and returns only the error of
  // a round it ran.
  while (!AllDurable(need)) {
    for (const RegionRef& r : need) {
      State& s = bitmaps_[r.bitmap];
      if (!s.durable.Test(r.region)) s.pending.SetRange(r.region, 1);
    }
    if (writing_) {
      round_done_.Wait(mu_);
      continue;
    }
    TD_RETURN_IF_ERROR(WriteRound());
  }
  return Status::Ok();
}

Status BitmapTracker::WriteRound() {
  // 1. Take every pending region: its bits go into disk, and the sectors
  //    holding them are copied out for writing.
  std::vector<Run> runs;
  std::vector<RegionRef> taken;
  for (size_t i = 0; i < bitmaps_.size(); ++i) {
    State& s = bitmaps_[i];
    std::vector<uint64_t> sectors;
    for (uint64_t r = s.pending.NextSet(0); r < s.pending.size(); r = s.pending.NextSet(r + 1)) {
      const uint64_t first = r * s.region_bits;
      const uint64_t count = std::min(s.region_bits, s.disk.size() - first);
      s.disk.SetRange(first, count);
      for (uint64_t sec = first / 8 / kSector; sec <= (first + count - 1) / 8 / kSector; ++sec) {
        if (sectors.empty() || sectors.back() != sec) sectors.push_back(sec);
      }
      taken.push_back({i, r});
    }
    s.pending.ClearAll();
    CollectRuns(s, s.disk, sectors, &runs);
  }
  writing_ = true;
  // 2. The writes and one sync, without the lock: other requests keep
  //    marking (their regions wait for the next round) and running.
  mu_.Unlock();
  Status st = WriteRuns(runs, io::Event::kBitmapMark);
  if (st.ok()) st = storage_.Flush();
  mu_.Lock();
  // 3. Only a synced round makes its regions durable.
  writing_ = false;
  if (st.ok()) {
    for (const RegionRef& r : taken) bitmaps_[r.bitmap].durable.SetRange(r.region, 1);
  }
  round_done_.NotifyAll();
  return st;
}

void BitmapTracker::CollectRuns(const State& s, const BitVector& bits,
                                const std::vector<uint64_t>& sectors, std::vector<Run>* runs) const {
  const uint64_t per_cluster = cs_ / kSector;
  for (size_t i = 0; i < sectors.size();) {
    // Consecutive sectors inside one data cluster: one write.
    size_t j = i + 1;
    while (j < sectors.size() && sectors[j] == sectors[j - 1] + 1 &&
           sectors[j] / per_cluster == sectors[i] / per_cluster) {
      ++j;
    }
    Run run;
    run.host_offset = s.b.data_clusters[sectors[i] / per_cluster] + (sectors[i] % per_cluster) * kSector;
    run.bytes.resize((j - i) * kSector);
    bits.ReadBytes(sectors[i] * kSector, run.bytes);
    runs->push_back(std::move(run));
    i = j;
  }
}

Status BitmapTracker::WriteRuns(const std::vector<Run>& runs, io::Event event) {
  for (const Run& r : runs) {
    storage_.Announce(event);
    TD_RETURN_IF_ERROR(storage_.WriteAt(r.host_offset, r.bytes));
  }
  return Status::Ok();
}

Status BitmapTracker::WriteBack() {
  util::MutexLock lock(mu_);
  bool wrote = false;
  for (State& s : bitmaps_) {
    // The sectors where exact and disk differ.
    std::vector<uint64_t> sectors;
    std::vector<uint8_t> a(kSector), b(kSector);
    for (uint64_t sec = 0; sec * kSector < s.exact.ByteSize(); ++sec) {
      s.exact.ReadBytes(sec * kSector, a);
      s.disk.ReadBytes(sec * kSector, b);
      if (a != b) sectors.push_back(sec);
    }
    if (sectors.empty()) continue;
    std::vector<Run> runs;
    CollectRuns(s, s.exact, sectors, &runs);
    TD_RETURN_IF_ERROR(WriteRuns(runs, io::Event::kBitmapUpdate));
    wrote = true;
    s.disk = s.exact;
    s.durable.ClearAll();  // regions are no longer all set on disk
  }
  if (wrote) TD_RETURN_IF_ERROR(storage_.Flush());
  return Status::Ok();
}

}  // namespace thindisk::qcow2
