#include "io/rados_storage.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "io/rados_aio.h"

namespace thindisk::io {

using rados_internal::AioSlot;
using rados_internal::RunAio;

namespace {

// One object's share of a request: bytes [in_object, in_object + length) of
// object `index`, at `in_request` in the caller's buffer.
struct Piece {
  uint64_t index;
  uint64_t in_object;
  uint64_t length;
  uint64_t in_request;
};

// The pieces of [offset, offset + length) (length > 0) on objects of
// 1 << order bytes.
class Pieces {
 public:
  Pieces(uint64_t offset, uint64_t length, uint32_t order)
      : offset_(offset),
        end_(offset + length),
        order_(order),
        first_(offset >> order),
        count_(((end_ - 1) >> order) - first_ + 1) {}
  uint64_t count() const { return count_; }
  Piece operator[](uint64_t i) const {
    const uint64_t index = first_ + i;
    const uint64_t start = std::max(offset_, index << order_);
    const uint64_t end = std::min(end_, (index + 1) << order_);
    return {index, start - (index << order_), end - start, start - offset_};
  }

 private:
  const uint64_t offset_, end_;
  const uint32_t order_;
  const uint64_t first_, count_;
};

// A bufferlist over caller memory, so librados reads into and writes from
// it without a copy. The caller keeps the memory alive until completion
// (RunAio waits for every operation it started).
void PointAt(librados::bufferlist& bl, const void* p, uint64_t length) {
  bl.push_back(ceph::buffer::ptr(ceph::buffer::create_static(
      unsigned(length), static_cast<char*>(const_cast<void*>(p)))));
}

}  // namespace

RadosStorage::RadosStorage(std::shared_ptr<RadosCluster> cluster, librados::IoCtx io,
                           const RadosName& name, const RadosHeader& header,
                           bool read_only)
    : cluster_(std::move(cluster)),
      io_(std::move(io)),
      rname_(name),
      uri_(name.ToString()),
      header_oid_(name.image + ".header"),
      object_order_(header.object_order),
      object_size_(header.object_size()),
      read_only_(read_only),
      size_(header.size),
      data_limit_(header.data_limit),
      durable_size_(header.size) {}

RadosStorage::~RadosStorage() {
  if (read_only_) return;
  (void)DrainHeld();
  // A clean close: the size made durable and the data limit lowered to it
  // (nothing exists past it within a session), so the next open has
  // nothing to recover. Errors cannot be reported here; a caller who needs
  // to know calls Flush first, and the next open recovers.
  std::lock_guard<std::mutex> lock(header_mu_);
  const uint64_t limit = RoundUpToObject(size_.load());
  if (size_.load() != durable_size_ || data_limit_.load() != limit) {
    (void)WriteHeaderLocked(limit);
  }
}

std::string RadosStorage::ObjectName(uint64_t index) const {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(index));
  return rname_.image + "." + hex;
}

Status RadosStorage::Error(int ret, const std::string& op) const {
  if (ret == -ESHUTDOWN) {  // librados' EBLOCKLISTED
    return Status::FromErrno(
        ESHUTDOWN, uri_ + ": " + op +
                       ": this client was fenced (blocklisted) after another took the "
                       "image's lock; nothing more it writes lands");
  }
  return Status::FromErrno(-ret, uri_ + ": " + op);
}

Status RadosStorage::CheckWritable() const {
  if (read_only_) return Status::ReadOnly(uri_ + ": opened read-only");
  return Status::Ok();
}

Status RadosStorage::WriteHeaderLocked(uint64_t data_limit) {
  RadosHeader h;
  h.object_order = object_order_;
  h.size = size_.load();
  h.data_limit = data_limit;
  const std::vector<uint8_t> bytes = h.Encode();
  librados::bufferlist bl;
  bl.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const int ret = io_.write_full(header_oid_, bl);
  if (ret < 0) return Error(ret, "write header object " + header_oid_);
  durable_size_ = h.size;
  data_limit_.store(data_limit);
  return Status::Ok();
}

Status RadosStorage::ExtendTo(uint64_t end) {
  uint64_t cur = size_.load();
  while (cur < end && !size_.compare_exchange_weak(cur, end)) {
  }
  if (end <= data_limit_.load()) return Status::Ok();
  // Past the data limit: raise it durably before the data may land there,
  // so a crash leaves nothing stale that the next open cannot find.
  std::lock_guard<std::mutex> lock(header_mu_);
  if (end <= data_limit_.load()) return Status::Ok();
  const uint64_t step = object_size_ * kLimitStepObjects;
  return WriteHeaderLocked((end + step - 1) / step * step);
}

Status RadosStorage::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  const uint64_t size = size_.load();
  // Bytes at or past Size() read as zeros without asking the cluster.
  const uint64_t readable =
      offset >= size ? 0 : std::min<uint64_t>(buf.size(), size - offset);
  std::memset(buf.data() + readable, 0, buf.size() - readable);
  if (readable == 0) return Status::Ok();
  // Held bytes are copied before the objects are read: a batch storing
  // them meanwhile changes nothing (io/write_back.h).
  WriteBack::Held held;
  if (write_back_) held = write_back_->Collect(offset, readable);
  const Pieces pieces(offset, readable, object_order_);
  TD_RETURN_IF_ERROR(RunAio(
      pieces.count(), kMaxInFlight,
      [&](uint64_t i, AioSlot& s) {
        const Piece p = pieces[i];
        PointAt(s.bl, buf.data() + p.in_request, p.length);
        return io_.aio_read(ObjectName(p.index), s.completion, &s.bl, p.length,
                            p.in_object);
      },
      [&](uint64_t i, AioSlot& s, int ret) {
        const Piece p = pieces[i];
        uint8_t* dst = buf.data() + p.in_request;
        if (ret == -ENOENT) ret = 0;  // never written: zeros
        if (ret < 0) return Error(ret, "read " + ObjectName(p.index));
        const uint64_t got = std::min<uint64_t>(uint64_t(ret), p.length);
        if (got > 0 && !s.bl.is_provided_buffer(reinterpret_cast<char*>(dst))) {
          s.bl.begin().copy(unsigned(std::min<uint64_t>(got, s.bl.length())),
                            reinterpret_cast<char*>(dst));
        }
        std::memset(dst + got, 0, p.length - got);  // past a short object's end
        return Status::Ok();
      }));
  WriteBack::Apply(held, offset, buf.first(readable));
  return Status::Ok();
}

Status RadosStorage::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  TD_RETURN_IF_ERROR(CheckWritable());
  if (buf.empty()) return Status::Ok();
  if (offset > RadosHeader::kMaxSize || buf.size() > RadosHeader::kMaxSize - offset) {
    return Status::OutOfRange(uri_ + ": write past 2^62 bytes");
  }
  TD_RETURN_IF_ERROR(ExtendTo(offset + buf.size()));
  if (write_back_ && buf.size() < kMaxHeldWrite && lock_ && lock_->Confirmed()) {
    TD_RETURN_IF_ERROR(write_back_->Add(offset, buf));
    bytes_written_ += buf.size();
    return Status::Ok();
  }
  ForgetHeld(offset, buf.size());  // nothing older may land over it
  const Pieces pieces(offset, buf.size(), object_order_);
  Status st = RunAio(
      pieces.count(), kMaxInFlight,
      [&](uint64_t i, AioSlot& s) {
        const Piece p = pieces[i];
        PointAt(s.bl, buf.data() + p.in_request, p.length);
        return io_.aio_write(ObjectName(p.index), s.completion, s.bl, p.length,
                             p.in_object);
      },
      [&](uint64_t i, AioSlot&, int ret) {
        return ret < 0 ? Error(ret, "write " + ObjectName(pieces[i].index))
                       : Status::Ok();
      });
  if (st.ok()) bytes_written_ += buf.size();
  return st;
}

Status RadosStorage::WriteHeld(const WriteBack::Extents& extents) {
  // Runs grouped by object (the map is in offset order, so each object's
  // runs come together); runs that touch become one write of the operation.
  struct Run {
    uint64_t in_object;
    librados::bufferlist bl;
  };
  struct ObjectRuns {
    uint64_t index;
    std::vector<Run> runs;
  };
  std::vector<ObjectRuns> objects;
  for (const auto& [offset, bytes] : extents) {
    const Pieces pieces(offset, bytes.size(), object_order_);
    for (uint64_t i = 0; i < pieces.count(); ++i) {
      const Piece p = pieces[i];
      if (objects.empty() || objects.back().index != p.index)
        objects.push_back({p.index, {}});
      std::vector<Run>& runs = objects.back().runs;
      if (runs.empty() ||
          runs.back().in_object + runs.back().bl.length() != p.in_object) {
        runs.push_back({p.in_object, {}});
      }
      PointAt(runs.back().bl, bytes.data() + p.in_request, p.length);
    }
  }
  return RunAio(
      objects.size(), kMaxInFlight,
      [&](uint64_t i, AioSlot& s) {
        s.op.emplace();
        for (const Run& run : objects[i].runs) s.op->write(run.in_object, run.bl);
        return io_.aio_operate(ObjectName(objects[i].index), s.completion, &*s.op);
      },
      [&](uint64_t i, AioSlot&, int ret) {
        return ret < 0 ? Error(ret, "write " + ObjectName(objects[i].index))
                       : Status::Ok();
      });
}

Status RadosStorage::Flush() {
  if (read_only_) return Status::Ok();
  // Data: the held writes go first; every write that returned before them
  // was committed by the OSDs (see the header). What remains is the size,
  // when a write or zero grew it.
  TD_RETURN_IF_ERROR(DrainHeld());
  std::lock_guard<std::mutex> lock(header_mu_);
  if (size_.load() == durable_size_) return Status::Ok();
  return WriteHeaderLocked(data_limit_.load());
}

Status RadosStorage::Resize(uint64_t size) {
  TD_RETURN_IF_ERROR(CheckWritable());
  if (size > RadosHeader::kMaxSize)
    return Status::OutOfRange(uri_ + ": size past 2^62 bytes");
  std::lock_guard<std::mutex> lock(header_mu_);
  const uint64_t old = size_.load();
  if (size < old) {
    ForgetHeld(size, RadosHeader::kMaxSize);
    // Shrink: clear past the new end first, then record it: a crash in
    // between leaves the old size over zeros, never a size over stale data.
    TD_RETURN_IF_ERROR(ClearFromLocked(size));
    size_.store(size);
    return WriteHeaderLocked(RoundUpToObject(size));
  }
  // Grow: everything past the old size is already zero (see the header).
  size_.store(size);
  Status st = WriteHeaderLocked(data_limit_.load());
  if (!st.ok()) size_.store(old);
  return st;
}

Status RadosStorage::ClearFromLocked(uint64_t from) {
  const uint64_t limit = data_limit_.load();
  if (from >= limit) return Status::Ok();
  TD_RETURN_IF_ERROR(ClearRange(from, limit - from));
  return Status::Ok();
}

Status RadosStorage::ClearRange(uint64_t offset, uint64_t length) {
  // No object exists at or past the data limit.
  const uint64_t limit = data_limit_.load();
  if (length == 0 || offset >= limit) return Status::Ok();
  length = std::min(length, limit - offset);
  const Pieces pieces(offset, length, object_order_);
  return RunAio(
      pieces.count(), kMaxInFlight,
      [&](uint64_t i, AioSlot& s) {
        const Piece p = pieces[i];
        const std::string oid = ObjectName(p.index);
        if (p.length == object_size_) return io_.aio_remove(oid, s.completion);
        // The OSD's zero never extends an object and cuts one whose end it
        // covers back to the zeroed offset (measured on pacific), so a
        // tail is freed and a short object stays short; truncate would
        // grow a short one. assert_exists: zeroing must never create an
        // object (ENOENT is the answer for one that is not there).
        s.op.emplace();
        s.op->assert_exists();
        s.op->zero(p.in_object, p.length);
        return io_.aio_operate(oid, s.completion, &*s.op);
      },
      [&](uint64_t i, AioSlot&, int ret) {
        if (ret >= 0 || ret == -ENOENT) return Status::Ok();
        return Error(ret, "zero " + ObjectName(pieces[i].index));
      });
}

Status RadosStorage::RemoveObjects(uint64_t first, uint64_t last) {
  if (last <= first) return Status::Ok();
  return RunAio(
      last - first, kMaxInFlight,
      [&](uint64_t i, AioSlot& s) {
        return io_.aio_remove(ObjectName(first + i), s.completion);
      },
      [&](uint64_t i, AioSlot&, int ret) {
        if (ret >= 0 || ret == -ENOENT) return Status::Ok();
        return Error(ret, "remove " + ObjectName(first + i));
      });
}

Status RadosStorage::StatObjects(uint64_t first, uint64_t count,
                                 std::vector<int64_t>& sizes) {
  sizes.assign(count, -1);
  return RunAio(
      count, kMaxInFlight,
      [&](uint64_t i, AioSlot& s) {
        return io_.aio_stat(ObjectName(first + i), s.completion, &s.stat_size,
                            &s.stat_mtime);
      },
      [&](uint64_t i, AioSlot& s, int ret) {
        if (ret == -ENOENT) return Status::Ok();
        if (ret < 0) return Error(ret, "stat " + ObjectName(first + i));
        sizes[i] = int64_t(s.stat_size);
        return Status::Ok();
      });
}

Status RadosStorage::Allocate(uint64_t, uint64_t) {
  TD_RETURN_IF_ERROR(CheckWritable());
  return Status::NotSupported(
      uri_ +
          ": RADOS cannot reserve space ahead (objects take space as they are written)",
      EOPNOTSUPP);
}

Status RadosStorage::PunchHole(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckWritable());
  if (offset > RadosHeader::kMaxSize || length > RadosHeader::kMaxSize - offset) {
    return Status::OutOfRange(uri_ + ": punch past 2^62 bytes");
  }
  ForgetHeld(offset, length);
  return ClearRange(offset, length);  // never changes the size
}

Status RadosStorage::ZeroRange(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckWritable());
  if (length == 0) return Status::Ok();
  if (offset > RadosHeader::kMaxSize || length > RadosHeader::kMaxSize - offset) {
    return Status::OutOfRange(uri_ + ": zero past 2^62 bytes");
  }
  // Like a write of zeros it extends the size; past the old size there is
  // nothing to clear, so the data limit need not move.
  uint64_t cur = size_.load();
  while (cur < offset + length && !size_.compare_exchange_weak(cur, offset + length)) {
  }
  ForgetHeld(offset, length);
  TD_RETURN_IF_ERROR(ClearRange(offset, length));
  bytes_written_ += length;
  return Status::Ok();
}

Result<uint64_t> RadosStorage::NextData(uint64_t offset) {
  TD_RETURN_IF_ERROR(DrainHeld());
  const uint64_t size = size_.load();
  const uint64_t limit = std::min(data_limit_.load(), RoundUpToObject(size));
  if (offset >= size || offset >= limit) return size;  // nothing exists past the limit
  const uint64_t first = offset >> object_order_, last = limit >> object_order_;
  const uint64_t count = std::min(last - first, kMaxStatObjects);
  std::vector<int64_t> sizes;
  TD_RETURN_IF_ERROR(StatObjects(first, count, sizes));
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t start = (first + i) << object_order_;
    // An object's bytes [0, its length) are data; past them, zeros.
    if (sizes[i] > 0 && start + uint64_t(sizes[i]) > offset)
      return std::max(offset, start);
  }
  if (first + count == last) return size;
  return std::min(size, (first + count) << object_order_);  // not looked at: data
}

Result<uint64_t> RadosStorage::NextHole(uint64_t offset) {
  TD_RETURN_IF_ERROR(DrainHeld());
  const uint64_t size = size_.load();
  const uint64_t limit = std::min(data_limit_.load(), RoundUpToObject(size));
  if (offset >= size) return size;
  if (offset >= limit) return offset;
  const uint64_t first = offset >> object_order_, last = limit >> object_order_;
  const uint64_t count = std::min(last - first, kMaxStatObjects);
  std::vector<int64_t> sizes;
  TD_RETURN_IF_ERROR(StatObjects(first, count, sizes));
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t start = (first + i) << object_order_;
    const uint64_t data_end = start + uint64_t(std::max<int64_t>(sizes[i], 0));
    if (data_end < start + object_size_)
      return std::min(size, std::max(offset, data_end));
  }
  if (first + count == last) return std::min(size, limit);
  return size;  // not looked at: data to the end
}

Result<uint64_t> RadosStorage::AllocatedBytes() {
  TD_RETURN_IF_ERROR(DrainHeld());
  const uint64_t objects = data_limit_.load() >> object_order_;
  if (objects > kMaxStatObjects) return uint64_t(0);  // unknown: too many to visit
  std::vector<int64_t> sizes;
  TD_RETURN_IF_ERROR(StatObjects(0, objects, sizes));
  uint64_t total = 0;
  for (int64_t s : sizes) total += uint64_t(std::max<int64_t>(s, 0));
  return total;
}

}  // namespace thindisk::io
