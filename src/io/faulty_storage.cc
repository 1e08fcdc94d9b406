#include "io/faulty_storage.h"

#include <algorithm>
#include <random>

namespace thindisk::io {
namespace {

constexpr size_t kCopyChunk = 1 << 20;

// Copies base's content into `out`, reading only what NextData/NextHole
// call data.
Status CopyInto(Storage& base, MemoryStorage& out) {
  TD_ASSIGN_OR_RETURN(uint64_t size, base.Size());
  std::vector<uint8_t> buf;
  TD_ASSIGN_OR_RETURN(uint64_t pos, base.NextData(0));
  while (pos < size) {
    TD_ASSIGN_OR_RETURN(uint64_t hole, base.NextHole(pos));
    if (hole <= pos) hole = size;  // defensive: a stuck map means "data"
    while (pos < hole) {
      buf.resize(std::min<uint64_t>(kCopyChunk, hole - pos));
      TD_RETURN_IF_ERROR(base.ReadAt(pos, buf));
      TD_RETURN_IF_ERROR(out.WriteAt(pos, buf));
      pos += buf.size();
    }
    TD_ASSIGN_OR_RETURN(pos, base.NextData(pos));
  }
  return out.Resize(size);
}

}  // namespace

Result<std::unique_ptr<FaultyStorage>> NewFaultyStorage(std::shared_ptr<Storage> base) {
  auto durable = NewMemoryStorage(base->name());
  TD_RETURN_IF_ERROR(CopyInto(*base, *durable));
  return std::make_unique<FaultyStorage>(std::move(base), std::move(durable));
}

FaultyStorage::FaultyStorage(std::shared_ptr<Storage> base, std::unique_ptr<MemoryStorage> durable)
    : base_(std::move(base)), durable_(std::move(durable)) {}

int FaultyStorage::Tick(Trigger& t) {
  if (t.fired) return t.error;  // persistent and already fired
  if (!t.armed) return 0;
  if (--t.countdown > 0) return 0;
  t.armed = false;
  t.fired = t.persistent;
  return t.error;
}

Status FaultyStorage::Injected(int error, const char* op) {
  ++faults_;
  return Status::FromErrno(error, base_->name() + ": injected fault in " + op);
}

Status FaultyStorage::DeadDiskCheck(const char* op) {
  if (write_fault_.fired) return Injected(write_fault_.error, op);
  return Status::Ok();
}

void FaultyStorage::Announce(Event e) {
  event_counts_[int(e)].fetch_add(1);
  util::MutexLock lock(mu_);
  if (!event_armed_ || e != event_fault_.event) return;
  if (--event_countdown_ > 0) return;
  event_armed_ = false;
  event_pending_ = true;
  if (event_fault_.freeze && !event_fault_.freeze_after_next) {
    event_frozen_ = true;
    event_fired_ = true;
  }
}

void FaultyStorage::FailAtEvent(const EventFault& fault) {
  util::MutexLock lock(mu_);
  event_fault_ = fault;
  event_armed_ = true;
  event_countdown_ = std::max<uint64_t>(fault.nth, 1);
  event_pending_ = event_dead_ = event_frozen_ = event_fired_ = false;
}

bool FaultyStorage::event_fault_fired() {
  util::MutexLock lock(mu_);
  return event_fired_;
}

Status FaultyStorage::EventFaultCheck(const char* op) {
  if (event_dead_) return Injected(event_fault_.error, op);
  if (!event_pending_) return Status::Ok();
  event_pending_ = false;
  event_fired_ = true;
  if (event_fault_.freeze && event_fault_.freeze_after_next) {
    // This mutation goes through; everything after it fails.
    event_dead_ = event_frozen_ = true;
    return Status::Ok();
  }
  event_dead_ = event_fault_.persistent || event_fault_.freeze;
  return Injected(event_fault_.error, op);
}

void FaultyStorage::FailNthWrite(uint64_t n, int error, bool persistent) {
  util::MutexLock lock(mu_);
  write_fault_ = Trigger{true, std::max<uint64_t>(n, 1), error, persistent, false};
}

void FaultyStorage::FailNthFlush(uint64_t n, int error, bool persistent) {
  util::MutexLock lock(mu_);
  flush_fault_ = Trigger{true, std::max<uint64_t>(n, 1), error, persistent, false};
}

void FaultyStorage::FailAfterBytes(uint64_t n) {
  util::MutexLock lock(mu_);
  space_limited_ = true;
  space_exhausted_ = false;
  space_left_ = n;
}

void FaultyStorage::ClearFaults() {
  util::MutexLock lock(mu_);
  write_fault_ = Trigger{};
  flush_fault_ = Trigger{};
  space_limited_ = false;
  space_exhausted_ = false;
  space_left_ = 0;
  event_armed_ = event_pending_ = event_dead_ = event_frozen_ = false;
}

size_t FaultyStorage::unflushed_ops() {
  util::MutexLock lock(mu_);
  return unflushed_.size();
}

Status FaultyStorage::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  return base_->ReadAt(offset, buf);
}

Status FaultyStorage::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  util::MutexLock lock(mu_);
  TD_RETURN_IF_ERROR(EventFaultCheck("write"));
  if (int e = Tick(write_fault_); e != 0) return Injected(e, "write");
  if (space_limited_) {
    // Once full, stays full until ClearFaults(), like a real disk whose
    // free space nobody releases.
    if (space_exhausted_ || buf.size() > space_left_) {
      space_exhausted_ = true;
      return Injected(ENOSPC, "write");
    }
  }
  TD_RETURN_IF_ERROR(base_->WriteAt(offset, buf));
  if (space_limited_) space_left_ -= buf.size();
  unflushed_.push_back(Op{OpKind::kWrite, offset, buf.size(), {buf.begin(), buf.end()}});
  ++writes_;
  bytes_written_ += buf.size();
  return Status::Ok();
}

Status FaultyStorage::Flush() {
  util::MutexLock lock(mu_);
  if (event_frozen_) return Injected(event_fault_.error, "flush");
  if (int e = Tick(flush_fault_); e != 0) return Injected(e, "flush");
  TD_RETURN_IF_ERROR(base_->Flush());
  // Everything completed before this Flush is now durable, in order.
  for (const Op& op : unflushed_) TD_RETURN_IF_ERROR(Apply(*durable_, op, op.length));
  unflushed_.clear();
  ++flushes_;
  return Status::Ok();
}

Result<uint64_t> FaultyStorage::Size() { return base_->Size(); }

Status FaultyStorage::Resize(uint64_t size) {
  util::MutexLock lock(mu_);
  TD_RETURN_IF_ERROR(DeadDiskCheck("resize"));
  TD_RETURN_IF_ERROR(EventFaultCheck("resize"));
  TD_RETURN_IF_ERROR(base_->Resize(size));
  unflushed_.push_back(Op{OpKind::kResize, size, 0, {}});
  return Status::Ok();
}

Status FaultyStorage::Allocate(uint64_t offset, uint64_t length) {
  util::MutexLock lock(mu_);
  TD_RETURN_IF_ERROR(DeadDiskCheck("allocate"));
  TD_RETURN_IF_ERROR(EventFaultCheck("allocate"));
  if (space_limited_ && (space_exhausted_ || length > space_left_)) {
    space_exhausted_ = true;
    return Injected(ENOSPC, "allocate");
  }
  TD_RETURN_IF_ERROR(base_->Allocate(offset, length));
  if (space_limited_) space_left_ -= length;
  unflushed_.push_back(Op{OpKind::kAllocate, offset, length, {}});
  return Status::Ok();
}

Status FaultyStorage::PunchHole(uint64_t offset, uint64_t length) {
  util::MutexLock lock(mu_);
  TD_RETURN_IF_ERROR(DeadDiskCheck("punch"));
  TD_RETURN_IF_ERROR(EventFaultCheck("punch"));
  TD_RETURN_IF_ERROR(base_->PunchHole(offset, length));
  unflushed_.push_back(Op{OpKind::kPunch, offset, length, {}});
  return Status::Ok();
}

Status FaultyStorage::ZeroRange(uint64_t offset, uint64_t length) {
  util::MutexLock lock(mu_);
  TD_RETURN_IF_ERROR(DeadDiskCheck("zero range"));
  TD_RETURN_IF_ERROR(EventFaultCheck("zero range"));
  TD_RETURN_IF_ERROR(base_->ZeroRange(offset, length));
  unflushed_.push_back(Op{OpKind::kZero, offset, length, {}});
  bytes_written_ += length;
  return Status::Ok();
}

Result<uint64_t> FaultyStorage::NextData(uint64_t offset) { return base_->NextData(offset); }
Result<uint64_t> FaultyStorage::NextHole(uint64_t offset) { return base_->NextHole(offset); }
Result<uint64_t> FaultyStorage::AllocatedBytes() { return base_->AllocatedBytes(); }

// Applies `op` to `target`; a write keeps only its first `write_limit` bytes
// (a torn write), other kinds ignore it.
Status FaultyStorage::Apply(MemoryStorage& target, const Op& op, uint64_t write_limit) {
  switch (op.kind) {
    case OpKind::kWrite: {
      const size_t n = std::min<uint64_t>(write_limit, op.data.size());
      if (n == 0) return Status::Ok();
      return target.WriteAt(op.offset, std::span<const uint8_t>(op.data).first(n));
    }
    case OpKind::kPunch: return target.PunchHole(op.offset, op.length);
    case OpKind::kZero: return target.ZeroRange(op.offset, op.length);
    case OpKind::kResize: return target.Resize(op.offset);
    case OpKind::kAllocate: return target.Allocate(op.offset, op.length);
  }
  return Status::Internal("unknown faulty-storage op");
}

Result<std::unique_ptr<MemoryStorage>> FaultyStorage::SimulatePowerLoss(PowerLossMode mode,
                                                                         uint64_t seed) {
  util::MutexLock lock(mu_);
  auto out = durable_->Clone();
  std::mt19937_64 rng(seed);

  // The torn write for kTearOne: index into unflushed_ and bytes kept.
  size_t torn = unflushed_.size();
  uint64_t torn_keep = 0;
  if (mode == PowerLossMode::kTearOne || mode == PowerLossMode::kTearLast) {
    std::vector<size_t> candidates;
    for (size_t i = 0; i < unflushed_.size(); ++i) {
      if (unflushed_[i].kind == OpKind::kWrite && !unflushed_[i].data.empty()) candidates.push_back(i);
    }
    if (!candidates.empty()) {
      torn = mode == PowerLossMode::kTearLast ? candidates.back()
                                              : candidates[rng() % candidates.size()];
      // Sector boundaries strictly inside the write, plus its start: the
      // write keeps a prefix that ends on one of them, never all of it.
      const Op& op = unflushed_[torn];
      const uint64_t first = (op.offset / kTearGrain + 1) * kTearGrain;
      const uint64_t end = op.offset + op.data.size();
      const uint64_t inner = first < end ? (end - 1 - first) / kTearGrain + 1 : 0;
      const uint64_t pick = rng() % (inner + 1);  // 0: keep nothing
      torn_keep = pick == 0 ? 0 : first + (pick - 1) * kTearGrain - op.offset;
    }
  }

  for (size_t i = 0; i < unflushed_.size(); ++i) {
    const Op& op = unflushed_[i];
    uint64_t limit = op.length;
    switch (mode) {
      case PowerLossMode::kDropUnflushed: continue;
      case PowerLossMode::kKeepRandomSubset:
        if (rng() % 2 == 0) continue;
        break;
      case PowerLossMode::kTearOne:
      case PowerLossMode::kTearLast:
        if (i == torn) limit = torn_keep;
        break;
    }
    TD_RETURN_IF_ERROR(Apply(*out, op, limit));
  }
  return out;
}

}  // namespace thindisk::io
