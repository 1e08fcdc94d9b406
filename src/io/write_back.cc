#include "io/write_back.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>

namespace thindisk::io {

namespace {

// The end of [offset, offset + length), clamped (Forget's "to the end").
uint64_t EndOf(uint64_t offset, uint64_t length) {
  return length > std::numeric_limits<uint64_t>::max() - offset
             ? std::numeric_limits<uint64_t>::max()
             : offset + length;
}

// The first run that may overlap [offset, ...): the one before offset when
// it reaches past it.
template <typename Map>
auto FirstOverlap(Map& m, uint64_t offset) -> decltype(m.begin()) {
  auto it = m.lower_bound(offset);
  if (it != m.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size() > offset) return prev;
  }
  return it;
}

// Drops the held bytes of [offset, end) from `m`, cutting runs that
// straddle either edge; `bytes` follows.
void Erase(WriteBack::Extents& m, uint64_t& bytes, uint64_t offset, uint64_t end) {
  auto it = FirstOverlap(m, offset);
  while (it != m.end() && it->first < end) {
    const uint64_t start = it->first;
    std::vector<uint8_t>& run = it->second;
    const uint64_t run_end = start + run.size();
    // The part past `end` stays, as a run of its own.
    if (run_end > end) {
      std::vector<uint8_t> tail(run.begin() + std::ptrdiff_t(end - start), run.end());
      m.emplace(end, std::move(tail));
    }
    const uint64_t cut_from = std::max(start, offset);
    bytes -= std::min(run_end, end) - cut_from;
    if (start < offset) {
      run.resize(offset - start);  // the part before `offset` stays
      ++it;
    } else {
      it = m.erase(it);
    }
  }
}

// Copies the bytes of `m` inside [offset, end) into `held`.
void CollectFrom(const WriteBack::Extents& m, uint64_t offset, uint64_t end,
                 WriteBack::Held& held) {
  for (auto it = FirstOverlap(m, offset); it != m.end() && it->first < end; ++it) {
    const uint64_t from = std::max(it->first, offset);
    const uint64_t to = std::min<uint64_t>(it->first + it->second.size(), end);
    const auto first = it->second.begin() + std::ptrdiff_t(from - it->first);
    held.emplace_back(from,
                      std::vector<uint8_t>(first, first + std::ptrdiff_t(to - from)));
  }
}

}  // namespace

WriteBack::WriteBack(BatchWriter writer, Limits limits)
    : writer_(std::move(writer)), limits_(limits), thread_([this] { Run(); }) {}

WriteBack::~WriteBack() {
  {
    util::MutexLock lock(mu_);
    stopping_ = true;
  }
  work_cv_.NotifyAll();
  space_cv_.NotifyAll();
  thread_.join();
}

Status WriteBack::Add(uint64_t offset, std::span<const uint8_t> data) {
  if (data.empty()) return Status::Ok();
  std::vector<uint8_t> copy(data.begin(), data.end());  // outside the lock
  util::UniqueLock lock(mu_);
  while (dirty_bytes_ >= limits_.limit && error_.ok() && !stopping_) space_cv_.Wait(mu_);
  if (!error_.ok()) return error_;
  const uint64_t before = dirty_bytes_;
  Erase(dirty_, dirty_bytes_, offset, EndOf(offset, data.size()));
  dirty_.emplace(offset, std::move(copy));
  dirty_bytes_ += data.size();
  if (before == 0) dirty_since_ = std::chrono::steady_clock::now();
  // The thread needs to hear of the first held byte (its age clock) and of
  // crossing `start`; not of every write.
  const bool wake =
      before == 0 || (before < limits_.start && dirty_bytes_ >= limits_.start);
  lock.Unlock();
  if (wake) work_cv_.NotifyOne();
  return Status::Ok();
}

WriteBack::Held WriteBack::Collect(uint64_t offset, uint64_t length) const {
  Held held;
  const uint64_t end = EndOf(offset, length);
  util::MutexLock lock(mu_);
  // Older first: Apply lays them in this order.
  CollectFrom(writing_, offset, end, held);
  CollectFrom(dirty_, offset, end, held);
  return held;
}

void WriteBack::Apply(const Held& held, uint64_t offset, std::span<uint8_t> buf) {
  for (const auto& [at, bytes] : held) {
    std::memcpy(buf.data() + (at - offset), bytes.data(), bytes.size());
  }
}

void WriteBack::Forget(uint64_t offset, uint64_t length) {
  util::MutexLock batch(wb_mu_);  // the batch in progress ends first
  util::MutexLock lock(mu_);
  Erase(dirty_, dirty_bytes_, offset, EndOf(offset, length));
}

Status WriteBack::Drain() {
  {
    util::MutexLock batch(wb_mu_);
    WriteBatchLocked();
  }
  util::MutexLock lock(mu_);
  return error_;
}

uint64_t WriteBack::held_bytes() const {
  util::MutexLock lock(mu_);
  return dirty_bytes_ + writing_bytes_;
}

void WriteBack::WriteBatchLocked() {
  const Extents* batch = nullptr;
  {
    util::MutexLock lock(mu_);
    if (dirty_.empty()) return;
    writing_.swap(dirty_);  // writing_ is empty between batches
    writing_bytes_ = dirty_bytes_;
    dirty_bytes_ = 0;
    batch = &writing_;
  }
  space_cv_.NotifyAll();
  // writing_ changes only under wb_mu_, which this thread holds: the writer
  // reads it without mu_ (through a pointer taken under it, since the
  // analysis knows one guard per member).
  Status st = writer_(*batch);
  util::MutexLock lock(mu_);
  writing_.clear();
  writing_bytes_ = 0;
  if (!st.ok() && error_.ok()) error_ = std::move(st);
}

void WriteBack::Run() {
  util::UniqueLock lock(mu_);
  while (!stopping_) {
    if (dirty_bytes_ == 0) {
      while (!stopping_ && dirty_bytes_ == 0) work_cv_.Wait(mu_);
      continue;
    }
    if (dirty_bytes_ < limits_.start) {
      // Not enough to start a batch yet: wait until the oldest byte is due,
      // unless more arrives (or a drain empties the buffer) first.
      auto woken = [this]() TD_REQUIRES(mu_) {
        return stopping_ || dirty_bytes_ == 0 || dirty_bytes_ >= limits_.start;
      };
      const auto due = dirty_since_ + limits_.max_age;
      while (!woken()) {
        if (!work_cv_.WaitUntil(mu_, due)) break;  // the oldest byte is due
      }
      if (woken()) continue;
    }
    lock.Unlock();
    {
      util::MutexLock batch(wb_mu_);
      WriteBatchLocked();
    }
    lock.Lock();
  }
}

}  // namespace thindisk::io
