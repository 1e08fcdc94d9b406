#include "io/uring_storage.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace thindisk::io {
namespace {

// Entries per thread ring: each thread has one request in flight (plus
// headroom), so a tiny ring keeps locked memory per thread small.
constexpr unsigned kRingEntries = 4;
// O_DIRECT alignment assumed for regular files (as PosixStorage does).
constexpr uint64_t kDirectAlign = 4096;

// One ring per thread, set up on first use and torn down at thread exit.
struct ThreadRing {
  io_uring ring{};
  bool tried = false;
  bool ok = false;
  ~ThreadRing() {
    if (ok) io_uring_queue_exit(&ring);
  }
  io_uring* Get() {
    if (!tried) {
      tried = true;
      ok = io_uring_queue_init(kRingEntries, &ring, 0) == 0;
    }
    return ok ? &ring : nullptr;
  }
};

thread_local ThreadRing t_ring;

// Submits one prepared request and waits for it; returns cqe->res
// (bytes or -errno). Retries submission on EINTR.
int SubmitAndWait(io_uring* ring) {
  int r;
  do {
    r = io_uring_submit_and_wait(ring, 1);
  } while (r == -EINTR);
  if (r < 0) return r;
  io_uring_cqe* cqe = nullptr;
  do {
    r = io_uring_wait_cqe(ring, &cqe);
  } while (r == -EINTR);
  if (r < 0) return r;
  int res = cqe->res;
  io_uring_cqe_seen(ring, cqe);
  return res;
}

}  // namespace

Status UringAvailable() {
  io_uring ring;
  int r = io_uring_queue_init(kRingEntries, &ring, 0);
  if (r < 0) return Status::NotSupported(std::string("io_uring_setup: ") + std::strerror(-r), -r);
  io_uring_queue_exit(&ring);
  return Status::Ok();
}

Result<std::unique_ptr<Storage>> OpenUringFile(const std::string& path,
                                               const OpenOptions& options) {
  TD_RETURN_IF_ERROR(UringAvailable());
  TD_ASSIGN_OR_RETURN(std::unique_ptr<Storage> fallback, OpenFile(path, options));
  // The file exists now (OpenFile created it if asked); open it again for
  // the ring with the same access mode and caching.
  int flags = (options.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
  const bool direct = options.cache == CacheMode::kNone;
  if (direct) flags |= O_DIRECT;
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) return Status::FromErrno(errno, path);
  return std::unique_ptr<Storage>(
      new UringStorage(fd, std::move(fallback), options.cache, direct));
}

UringStorage::UringStorage(int fd, std::unique_ptr<Storage> fallback, CacheMode cache,
                           bool direct)
    : fd_(fd),
      fallback_(std::move(fallback)),
      posix_(dynamic_cast<PosixStorage*>(fallback_.get())),
      cache_(cache),
      direct_(direct) {}

UringStorage::~UringStorage() { ::close(fd_); }

bool UringStorage::Aligned(uint64_t offset, const void* addr, size_t length) const {
  if (!direct_) return true;
  return offset % kDirectAlign == 0 && length % kDirectAlign == 0 &&
         reinterpret_cast<uintptr_t>(addr) % kDirectAlign == 0;
}

Status UringStorage::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  io_uring* ring = t_ring.Get();
  if (ring == nullptr || !Aligned(offset, buf.data(), buf.size()))
    return fallback_->ReadAt(offset, buf);
  size_t done = 0;
  while (done < buf.size()) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) return fallback_->ReadAt(offset + done, buf.subspan(done));
    io_uring_prep_read(sqe, fd_, buf.data() + done, unsigned(buf.size() - done),
                       offset + done);
    int res = SubmitAndWait(ring);
    ring_ops_.fetch_add(1, std::memory_order_relaxed);
    if (res == -EINTR || res == -EAGAIN) continue;
    if (res < 0) return Status::FromErrno(-res, name() + ": io_uring read");
    if (res == 0) {
      // End of file: the rest reads as zeros (storage.h).
      std::memset(buf.data() + done, 0, buf.size() - done);
      return Status::Ok();
    }
    done += size_t(res);
    // A short O_DIRECT read leaves an unaligned remainder: let the
    // bounce-buffer path finish it.
    if (direct_ && done < buf.size()) return fallback_->ReadAt(offset + done, buf.subspan(done));
  }
  return Status::Ok();
}

Status UringStorage::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  io_uring* ring = t_ring.Get();
  if (ring == nullptr || !Aligned(offset, buf.data(), buf.size()))
    return fallback_->WriteAt(offset, buf);
  // An O_DIRECT write may extend the file: not while the fallback trims a
  // block-rounded tail (PosixStorage::LockAgainstTrim). Released before any
  // call into the fallback.
  std::shared_lock<std::shared_mutex> grow_lock;
  if (direct_ && posix_ != nullptr) grow_lock = posix_->LockAgainstTrim();
  size_t done = 0;
  while (done < buf.size()) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) {
      if (grow_lock.owns_lock()) grow_lock.unlock();
      TD_RETURN_IF_ERROR(fallback_->WriteAt(offset + done, buf.subspan(done)));
      break;
    }
    io_uring_prep_write(sqe, fd_, buf.data() + done, unsigned(buf.size() - done),
                        offset + done);
    int res = SubmitAndWait(ring);
    ring_ops_.fetch_add(1, std::memory_order_relaxed);
    if (res == -EINTR || res == -EAGAIN) continue;
    if (res < 0) return Status::FromErrno(-res, name() + ": io_uring write");
    if (res == 0) return Status::FromErrno(EIO, name() + ": io_uring write made no progress");
    done += size_t(res);
    bytes_written_.fetch_add(uint64_t(res), std::memory_order_relaxed);
    if (direct_ && done < buf.size()) {
      if (grow_lock.owns_lock()) grow_lock.unlock();
      TD_RETURN_IF_ERROR(fallback_->WriteAt(offset + done, buf.subspan(done)));
      break;
    }
  }
  return Status::Ok();
}

Status UringStorage::Flush() {
  if (cache_ == CacheMode::kUnsafe) return Status::Ok();
  io_uring* ring = t_ring.Get();
  if (ring == nullptr) return fallback_->Flush();
  io_uring_sqe* sqe = io_uring_get_sqe(ring);
  if (sqe == nullptr) return fallback_->Flush();
  // fdatasync covers the inode, so writes made through the fallback's
  // descriptor are made durable too.
  io_uring_prep_fsync(sqe, fd_, IORING_FSYNC_DATASYNC);
  int res = SubmitAndWait(ring);
  if (res < 0) return Status::FromErrno(-res, name() + ": io_uring fsync");
  return Status::Ok();
}

}  // namespace thindisk::io
