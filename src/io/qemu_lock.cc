#include "io/qemu_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace thindisk::io {
namespace {

struct flock Range(short type, off_t start, off_t length) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = start;
  fl.l_len = length;
  return fl;
}

// The one mapping of fcntl lock failures to a Status (see the header).
Status LockError(int e, const std::string& path) {
  if (e == EAGAIN || e == EACCES) {
    return Status::Busy(
        path + ": the image is in use by another process (qemu locks are held)", e);
  }
  if (e == EINVAL || e == ENOLCK) {
    return Status::NotSupported(
        path + ": the filesystem has no open file description locks", e);
  }
  return Status::FromErrno(e, path + ": locking");
}

// qemu's way: shared locks on the bytes of the permissions we hold and of
// those we refuse to share, after checking that nobody holds any. The probe
// asks with an exclusive lock because that conflicts with every lock
// another open file description holds, shared or not.
Status LockShared(int fd, const std::string& path) {
  struct flock probe = Range(F_WRLCK, kQemuLockPermBase, kQemuLockSpan);
  if (::fcntl(fd, F_OFD_GETLK, &probe) != 0) return LockError(errno, path);
  if (probe.l_type != F_UNLCK) return LockError(EAGAIN, path);
  for (off_t base : {kQemuLockPermBase, kQemuLockSharedBase}) {
    struct flock fl = Range(F_RDLCK, base, kQemuLockPermissions);
    if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) return LockError(errno, path);
  }
  return Status::Ok();
}

Status LockExclusive(int fd, const std::string& path) {
  struct flock fl = Range(F_WRLCK, kQemuLockPermBase, kQemuLockSpan);
  if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) return LockError(errno, path);
  return Status::Ok();
}

}  // namespace

Result<QemuImageLock> QemuImageLock::Acquire(const std::string& path, QemuLockMode mode) {
  // An exclusive lock needs a descriptor open for writing (fcntl: EBADF).
  const int flags = mode == QemuLockMode::kExclusive ? O_RDWR : O_RDONLY;
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, path);
  QemuImageLock lock(fd);  // closes the fd, and so drops any lock, on failure
  TD_RETURN_IF_ERROR(mode == QemuLockMode::kExclusive ? LockExclusive(fd, path)
                                                      : LockShared(fd, path));
  return lock;
}

QemuImageLock::QemuImageLock(QemuImageLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)) {}

QemuImageLock& QemuImageLock::operator=(QemuImageLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

QemuImageLock::~QemuImageLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace thindisk::io
