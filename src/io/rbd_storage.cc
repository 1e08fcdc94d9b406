#include "io/rbd_storage.h"

#include <rbd/features.h>

#include <algorithm>
#include <cerrno>

namespace thindisk::io {
namespace {

// A diff_iterate2 callback's way to stop early; never an error of librbd's.
constexpr int kStop = -ECANCELED;

struct Scan {
  bool want;         // looking for data (true) or a hole (false)
  uint64_t from;     // the caller's offset
  uint64_t found;    // where it starts, when stopped
  uint64_t covered;  // the end of the last extent seen
};

// diff_iterate2 reports the extents that exist ("data"); what lies between
// them is a hole.
int OnExtent(uint64_t offset, size_t length, int exists, void* arg) {
  auto* s = static_cast<Scan*>(arg);
  const uint64_t start = std::max<uint64_t>(offset, s->from);
  const uint64_t end = offset + length;
  if (s->want) {
    if (exists && end > start) {
      s->found = start;
      return kStop;
    }
  } else if (start > s->covered) {  // a gap before this extent: a hole
    s->found = s->covered;
    return kStop;
  } else if (!exists && end > start) {
    s->found = start;
    return kStop;
  }
  s->covered = std::max(s->covered, end);
  return 0;
}

int SumExtent(uint64_t, size_t length, int exists, void* arg) {
  if (exists) *static_cast<uint64_t*>(arg) += length;
  return 0;
}

}  // namespace

RbdStorage::RbdStorage(std::shared_ptr<RadosCluster> cluster, librados::IoCtx io,
                       std::string what, bool read_only)
    : cluster_(std::move(cluster)),
      io_(std::move(io)),
      what_(std::move(what)),
      read_only_(read_only) {}

RbdStorage::~RbdStorage() {
  // Errors cannot be reported here; a caller who needs to know flushes first.
  (void)image_.close();
}

Status RbdStorage::Error(int ret, const std::string& op) const {
  if (ret == -ESHUTDOWN) {
    return Status::FromErrno(ESHUTDOWN, what_ + ": " + op +
                                            ": this client was fenced (blocklisted) by "
                                            "another that took the image");
  }
  return Status::FromErrno(-ret, what_ + ": " + op);
}

Status RbdStorage::CheckWritable() const {
  if (read_only_) return Status::ReadOnly(what_ + ": opened read-only");
  return Status::Ok();
}

Status RbdStorage::GrowTo(uint64_t end) {
  if (end <= size_.load()) return Status::Ok();
  std::lock_guard<std::mutex> lock(resize_mu_);
  if (end <= size_.load()) return Status::Ok();
  const int ret = image_.resize(end);
  if (ret < 0) return Error(ret, "grow to " + std::to_string(end));
  size_.store(end);
  return Status::Ok();
}

Status RbdStorage::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  const uint64_t size = size_.load();
  const uint64_t inside =
      offset >= size ? 0 : std::min<uint64_t>(buf.size(), size - offset);
  if (inside > 0) {
    librados::bufferlist bl;
    const ssize_t n = image_.read(offset, inside, bl);
    if (n < 0) return Error(int(n), "read at " + std::to_string(offset));
    // librbd returns the whole range (zeros where nothing was written).
    const size_t got = std::min<size_t>(size_t(n), bl.length());
    if (got > 0) bl.begin().copy(unsigned(got), reinterpret_cast<char*>(buf.data()));
    std::fill(buf.begin() + got, buf.begin() + inside, 0);
  }
  std::fill(buf.begin() + inside, buf.end(), 0);
  return Status::Ok();
}

Status RbdStorage::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  TD_RETURN_IF_ERROR(CheckWritable());
  if (buf.empty()) return Status::Ok();
  TD_RETURN_IF_ERROR(GrowTo(offset + buf.size()));
  librados::bufferlist bl;
  bl.append(reinterpret_cast<const char*>(buf.data()), unsigned(buf.size()));
  const ssize_t n = image_.write(offset, buf.size(), bl);
  if (n < 0) return Error(int(n), "write at " + std::to_string(offset));
  bytes_written_ += buf.size();
  return Status::Ok();
}

Status RbdStorage::Flush() {
  if (read_only_) return Status::Ok();
  const int ret = image_.flush();
  return ret < 0 ? Error(ret, "flush") : Status::Ok();
}

Status RbdStorage::Resize(uint64_t size) {
  TD_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard<std::mutex> lock(resize_mu_);
  const int ret = image_.resize(size);
  if (ret < 0) return Error(ret, "resize to " + std::to_string(size));
  size_.store(size);
  return Status::Ok();
}

Status RbdStorage::Allocate(uint64_t, uint64_t) {
  return Status::NotSupported(what_ + ": RBD images reserve no space ahead");
}

Status RbdStorage::PunchHole(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckWritable());
  const uint64_t size = size_.load();
  if (offset >= size || length == 0) return Status::Ok();
  const int ret = image_.discard(offset, std::min(length, size - offset));
  return ret < 0 ? Error(ret, "discard at " + std::to_string(offset)) : Status::Ok();
}

Status RbdStorage::ZeroRange(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckWritable());
  if (length == 0) return Status::Ok();
  TD_RETURN_IF_ERROR(
      GrowTo(offset + length));  // as a file: zeroing past the end extends it
  const ssize_t n = image_.write_zeroes(offset, length, 0, 0);
  if (n < 0) return Error(int(n), "write zeroes at " + std::to_string(offset));
  bytes_written_ += length;
  return Status::Ok();
}

Result<uint64_t> RbdStorage::Next(uint64_t offset, bool want) {
  const uint64_t size = size_.load();
  if (offset >= size) return size;
  const uint64_t reach =
      fast_diff_ ? size - offset : std::min(size - offset, kMaxScanBytes);
  Scan scan{want, offset, 0, offset};
  const int ret = image_.diff_iterate2(nullptr, offset, reach, /*include_parent=*/true,
                                       /*whole_object=*/true, OnExtent, &scan);
  if (ret == kStop) return scan.found;
  if (ret < 0) return Error(ret, "map extents at " + std::to_string(offset));
  if (!want) return std::max(scan.covered, offset);  // a hole after the last extent
  // No data in reach: past it, say "data" unless the scan reached the end.
  return offset + reach >= size ? size : offset + reach;
}

Result<uint64_t> RbdStorage::NextData(uint64_t offset) { return Next(offset, true); }

Result<uint64_t> RbdStorage::NextHole(uint64_t offset) {
  TD_ASSIGN_OR_RETURN(uint64_t hole, Next(offset, false));
  return std::min(hole, size_.load());
}

Result<uint64_t> RbdStorage::AllocatedBytes() {
  if (!fast_diff_) return uint64_t(0);
  uint64_t bytes = 0;
  const int ret =
      image_.diff_iterate2(nullptr, 0, size_.load(), true, true, SumExtent, &bytes);
  if (ret < 0) return Error(ret, "sum allocated extents");
  return bytes;
}

Result<std::unique_ptr<Storage>> OpenRbd(const std::string& name,
                                         const OpenOptions& options) {
  TD_ASSIGN_OR_RETURN(RbdName n, ParseRbdName(name));
  const std::string what = n.ToString();
  const bool read_only = options.read_only || !n.snap.empty();
  if (!options.read_only && !n.snap.empty()) {
    return Status::ReadOnly(what + ": a snapshot is read-only");
  }
  if (options.create) {
    return Status::NotSupported(what +
                                ": thindisk does not create RBD images (use rbd create, "
                                "or a rados:// image)");
  }
  TD_ASSIGN_OR_RETURN(std::shared_ptr<RadosCluster> cluster,
                      RadosCluster::Get(n.conf, n.id, what));
  TD_ASSIGN_OR_RETURN(librados::IoCtx io, cluster->OpenPool(n.pool, what));
  io.set_namespace(n.ns);
  std::unique_ptr<RbdStorage> s(new RbdStorage(cluster, std::move(io), what, read_only));
  librbd::RBD rbd;
  const char* snap = n.snap.empty() ? nullptr : n.snap.c_str();
  int ret = read_only ? rbd.open_read_only(s->io_, s->image_, n.image.c_str(), snap)
                      : rbd.open(s->io_, s->image_, n.image.c_str());
  if (ret == -ENOENT) {
    return Status::NotFound(what + ": no such RBD image" + (snap ? " or snapshot" : "") +
                                " in pool '" + n.pool + "'",
                            ENOENT);
  }
  if (ret < 0) return Status::FromErrno(-ret, what + ": open");
  uint64_t size = 0, features = 0, flags = 0;
  if ((ret = s->image_.size(&size)) < 0) return Status::FromErrno(-ret, what + ": size");
  s->size_.store(size);
  if ((ret = s->image_.features(&features)) < 0) {
    return Status::FromErrno(-ret, what + ": features");
  }
  if ((ret = s->image_.get_flags(&flags)) < 0)
    return Status::FromErrno(-ret, what + ": flags");
  s->fast_diff_ =
      (features & RBD_FEATURE_FAST_DIFF) && !(flags & RBD_FLAG_FAST_DIFF_INVALID);
  if (!read_only && (features & RBD_FEATURE_EXCLUSIVE_LOCK)) {
    ret = s->image_.lock_acquire(RBD_LOCK_MODE_EXCLUSIVE);
    if (ret == -EROFS || ret == -EBUSY || ret == -EAGAIN) {
      return Status(Code::kBusy,
                    what +
                        ": in use by another RBD client (its exclusive lock is held; "
                        "rbd status " +
                        n.pool + "/" + n.image + " shows who)",
                    EBUSY);
    }
    if (ret < 0) return Status::FromErrno(-ret, what + ": take the exclusive lock");
  }
  return std::unique_ptr<Storage>(std::move(s));
}

}  // namespace thindisk::io
