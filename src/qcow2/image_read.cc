// Read path: plain clusters, subclusters, zero clusters, backing data.
#include <algorithm>
#include <cstring>

#include "qcow2/image_impl.h"

namespace thindisk::qcow2 {

Status ImageImpl::ReadBacking(uint64_t guest_offset, std::span<uint8_t> out) {
  uint64_t avail = 0;
  if (backing_ && guest_offset < backing_->size()) {
    avail = std::min<uint64_t>(out.size(), backing_->size() - guest_offset);
    TD_RETURN_IF_ERROR(backing_->Read(guest_offset, out.first(avail)));
  }
  // Past the backing file's end (or without one) the image reads as zeros.
  std::memset(out.data() + avail, 0, out.size() - avail);
  return Status::Ok();
}

bool ImageImpl::BackingCovers(uint64_t gc) const {
  return backing_ && (gc << cluster_bits_) < backing_->size();
}

uint64_t ImageImpl::RunEnd(const L2Mapping& m, uint64_t pos, uint64_t end) const {
  const SubState state = StateOf(m, uint32_t(pos / scs()));
  uint64_t run_end = std::min<uint64_t>(end, (pos / scs() + 1) * scs());
  while (run_end < end && StateOf(m, uint32_t(run_end / scs())) == state) {
    run_end = std::min<uint64_t>(end, run_end + scs());
  }
  return run_end;
}

Status ImageImpl::ReadWithMapping(uint64_t gc, const L2Mapping& m, uint64_t in_off,
                                  std::span<uint8_t> out) {
  uint64_t guest_base = gc << cluster_bits_;
  if (m.kind == ClusterKind::kCompressed) {
    std::vector<uint8_t> cluster;
    TD_RETURN_IF_ERROR(ReadCompressedCluster(gc, m, &cluster));
    std::memcpy(out.data(), cluster.data() + in_off, out.size());
    return Status::Ok();
  }
  // Walk runs of subclusters in the same state; data runs are contiguous
  // on the host, so each run is one host read.
  uint64_t pos = in_off;
  uint64_t end = in_off + out.size();
  while (pos < end) {
    const SubState state = StateOf(m, uint32_t(pos / scs()));
    const uint64_t run_end = RunEnd(m, pos, end);
    std::span<uint8_t> piece = out.subspan(pos - in_off, run_end - pos);
    switch (state) {
      case SubState::kData:
        TD_RETURN_IF_ERROR(storage_->ReadAt(m.host_offset + pos, piece));
        break;
      case SubState::kZero:
        std::memset(piece.data(), 0, piece.size());
        break;
      case SubState::kUnallocated:
        TD_RETURN_IF_ERROR(ReadBacking(guest_base + pos, piece));
        break;
      case SubState::kCompressed:
        return Status::Internal("compressed state inside a plain cluster");
    }
    pos = run_end;
  }
  return Status::Ok();
}

bool ImageImpl::AllData(const L2Mapping& m, uint64_t in_off, uint64_t len) const {
  if (m.kind != ClusterKind::kNormal) return false;
  if (!extended_) return true;
  const uint32_t first = uint32_t(in_off / scs()), last = uint32_t((in_off + len - 1) / scs());
  for (uint32_t sub = first; sub <= last; ++sub) {
    if (StateOf(m, sub) != SubState::kData) return false;
  }
  return true;
}

Status ImageImpl::Read(uint64_t offset, std::span<uint8_t> buf) {
  TD_RETURN_IF_ERROR(CheckRange(offset, buf.size()));
  // Holding the gate shared keeps every cluster we look up from being
  // freed (and so reused) until we have read it.
  std::shared_lock gate(free_gate_);
  // Data pieces that follow each other on the host as in the guest are
  // read in one go: a 1 MiB read of clusters allocated in order is one
  // host read (and one readahead stream), not one per cluster.
  struct Run {
    uint64_t host = 0, done = 0, length = 0;  // host offset, offset in buf, bytes
  } run;
  auto read_run = [&]() -> Status {
    if (run.length == 0) return Status::Ok();
    Status s = storage_->ReadAt(run.host, buf.subspan(run.done, run.length));
    run.length = 0;
    return s;
  };
  uint64_t done = 0;
  while (done < buf.size()) {
    uint64_t pos = offset + done;
    uint64_t gc = pos >> cluster_bits_;
    uint64_t in_off = pos & (cluster_size_ - 1);
    uint64_t len = std::min<uint64_t>(buf.size() - done, cluster_size_ - in_off);
    L2Mapping m;
    {
      util::MutexLock lock(mu_);
      TD_ASSIGN_OR_RETURN(m, LookupLoadingUnlocked(gc));
    }
    if (AllData(m, in_off, len)) {
      const uint64_t host = m.host_offset + in_off;
      if (run.length > 0 && run.host + run.length == host) {
        run.length += len;
      } else {
        TD_RETURN_IF_ERROR(read_run());
        run = {host, done, len};
      }
    } else {
      TD_RETURN_IF_ERROR(read_run());
      TD_RETURN_IF_ERROR(ReadWithMapping(gc, m, in_off, buf.subspan(done, len)));
    }
    done += len;
  }
  return read_run();
}

void ImageImpl::WaitForReaders() {
  { std::unique_lock gate(free_gate_); }
  planned_readers_.WaitForEarlier();
}

namespace {

// Appends a piece, joining it to the last one when both are zeros or both
// continue each other in the buffer and on the same host file.
void AddPiece(block::ReadPlan* plan, block::ReadPiece piece) {
  if (!plan->pieces.empty()) {
    block::ReadPiece& last = plan->pieces.back();
    const bool follows =
        last.buf_offset + last.length == piece.buf_offset &&
        last.storage == piece.storage &&
        (piece.storage == nullptr || last.host_offset + last.length == piece.host_offset);
    if (follows) {
      last.length += piece.length;
      return;
    }
  }
  plan->pieces.push_back(piece);
}

}  // namespace

Status ImageImpl::PlanBacking(uint64_t guest_offset, uint64_t length, uint64_t buf_offset,
                              block::ReadPlan* plan) {
  uint64_t avail = 0;
  if (backing_ && guest_offset < backing_->size()) {
    avail = std::min<uint64_t>(length, backing_->size() - guest_offset);
    TD_ASSIGN_OR_RETURN(block::ReadPlan below, backing_->PlanRead(guest_offset, avail));
    for (block::ReadPiece piece : below.pieces) {
      piece.buf_offset += buf_offset;
      AddPiece(plan, piece);
    }
    for (auto& pin : below.pins) plan->pins.push_back(std::move(pin));
  }
  // Past the backing file's end (or without one) the image reads as zeros.
  if (avail < length) AddPiece(plan, {buf_offset + avail, length - avail, nullptr, 0});
  return Status::Ok();
}

Status ImageImpl::PlanWithMapping(uint64_t gc, const L2Mapping& m, uint64_t in_off,
                                  uint64_t length, uint64_t buf_offset,
                                  block::ReadPlan* plan) {
  if (m.kind == ClusterKind::kCompressed)
    return Status::NotSupported("a compressed cluster is read only through Read");
  const uint64_t guest_base = gc << cluster_bits_;
  // Runs of subclusters in the same state, as ReadWithMapping walks them.
  uint64_t pos = in_off;
  const uint64_t end = in_off + length;
  while (pos < end) {
    const SubState state = StateOf(m, uint32_t(pos / scs()));
    const uint64_t run_end = RunEnd(m, pos, end);
    const uint64_t at = buf_offset + (pos - in_off), n = run_end - pos;
    switch (state) {
      case SubState::kData:
        AddPiece(plan, {at, n, storage_.get(), m.host_offset + pos});
        break;
      case SubState::kZero:
        AddPiece(plan, {at, n, nullptr, 0});
        break;
      case SubState::kUnallocated:
        TD_RETURN_IF_ERROR(PlanBacking(guest_base + pos, n, at, plan));
        break;
      case SubState::kCompressed:
        return Status::Internal("compressed state inside a plain cluster");
    }
    pos = run_end;
  }
  return Status::Ok();
}

Result<block::ReadPlan> ImageImpl::PlanRead(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckRange(offset, length));
  block::ReadPlan plan;
  // The pin is taken under the gate, as a Read takes it: a flush about to
  // free a cluster either sees this lookup hold the gate or waits for the
  // pin (WaitForReaders), so whatever the plan names stays ours until the
  // plan is destroyed.
  std::shared_lock gate(free_gate_);
  const unsigned epoch = planned_readers_.Enter();
  plan.pins.push_back(std::shared_ptr<const void>(
      this, [this, epoch](const void*) { planned_readers_.Leave(epoch); }));
  uint64_t done = 0;
  while (done < length) {
    const uint64_t pos = offset + done;
    const uint64_t gc = pos >> cluster_bits_;
    const uint64_t in_off = pos & (cluster_size_ - 1);
    const uint64_t len = std::min<uint64_t>(length - done, cluster_size_ - in_off);
    L2Mapping m;
    {
      util::MutexLock lock(mu_);
      // A plan is made on a thread that must not wait for the disk.
      if (!L2InMemoryLocked(gc)) {
        return Status::NotSupported(GuestPos(gc) + ": its L2 table is not in memory");
      }
      TD_ASSIGN_OR_RETURN(m, LookupLocked(gc));
    }
    if (AllData(m, in_off, len)) {
      AddPiece(&plan, {done, len, storage_.get(), m.host_offset + in_off});
    } else {
      TD_RETURN_IF_ERROR(PlanWithMapping(gc, m, in_off, len, done, &plan));
    }
    done += len;
  }
  return plan;
}

}  // namespace thindisk::qcow2
