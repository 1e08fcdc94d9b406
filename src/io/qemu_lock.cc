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

const char* PermissionName(off_t p) {
  constexpr const char* kNames[kQemuLockPermissions] = {"consistent read", "write",
                                                        "write unchanged", "resize"};
  return p >= 0 && p < kQemuLockPermissions ? kNames[p] : "unknown";
}

// The one mapping of fcntl lock failures to a Status (see the header).
// `what` says which permission could not be had, when known.
Status LockError(int e, const std::string& path, const std::string& what = "") {
  if (e == EAGAIN || e == EACCES) {
    return Status::Busy(path + ": the image is in use by another process (" +
                            (what.empty() ? "qemu locks are held" : what) + ")",
                        e);
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

// Does another open file description hold a lock on byte `at`?
Result<bool> Held(int fd, off_t at, const std::string& path) {
  struct flock probe = Range(F_WRLCK, at, 1);
  if (::fcntl(fd, F_OFD_GETLK, &probe) != 0) return LockError(errno, path);
  return probe.l_type != F_UNLCK;
}

// Permission bits (1 << p) a mode uses and refuses to share (see the header).
struct Permissions {
  unsigned used;
  unsigned unshared;
};
constexpr unsigned kConsistentRead = 1u << 0, kWritePerm = 1u << 1, kResize = 1u << 3;

Permissions PermissionsOf(QemuLockMode mode) {
  switch (mode) {
    case QemuLockMode::kWrite:
      return {kConsistentRead | kWritePerm | kResize, kWritePerm | kResize};
    case QemuLockMode::kRead:
      return {kConsistentRead, kWritePerm | kResize};
    default:  // kForceShare
      return {kConsistentRead, 0};
  }
}

// qemu's per-permission protocol: lock first, then check, so that of two
// processes racing at most one goes on.
Status LockPermissions(int fd, const std::string& path, Permissions perms) {
  for (off_t p = 0; p < kQemuLockPermissions; ++p) {
    for (auto [bits, base] : {std::pair{perms.used, kQemuLockPermBase},
                              std::pair{perms.unshared, kQemuLockSharedBase}}) {
      if ((bits & (1u << p)) == 0) continue;
      struct flock fl = Range(F_RDLCK, base + p, 1);
      if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) return LockError(errno, path);
    }
  }
  for (off_t p = 0; p < kQemuLockPermissions; ++p) {
    const std::string name = PermissionName(p);
    if (perms.used & (1u << p)) {
      // Somebody refuses to share a permission we use.
      TD_ASSIGN_OR_RETURN(bool refused, Held(fd, kQemuLockSharedBase + p, path));
      if (refused) return LockError(EAGAIN, path, "failed to get the \"" + name + "\" lock");
    }
    if (perms.unshared & (1u << p)) {
      // Somebody uses a permission we refuse to share.
      TD_ASSIGN_OR_RETURN(bool used, Held(fd, kQemuLockPermBase + p, path));
      if (used) {
        return LockError(EAGAIN, path, "failed to get the shared \"" + name + "\" lock");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

const char* QemuLockModeName(QemuLockMode mode) {
  switch (mode) {
    case QemuLockMode::kNone: return "none";
    case QemuLockMode::kForceShare: return "force-share";
    case QemuLockMode::kRead: return "read";
    case QemuLockMode::kWrite: return "write";
    case QemuLockMode::kShared: return "shared";
    case QemuLockMode::kExclusive: return "exclusive";
  }
  return "unknown";
}

Status LockImageFd(int fd, const std::string& path, QemuLockMode mode) {
  Status s;
  switch (mode) {
    case QemuLockMode::kNone: return Status::Ok();
    case QemuLockMode::kShared: s = LockShared(fd, path); break;
    case QemuLockMode::kExclusive: s = LockExclusive(fd, path); break;
    default: s = LockPermissions(fd, path, PermissionsOf(mode)); break;
  }
  if (!s.ok()) {
    // Leave the description as we found it (it may live on in the caller).
    struct flock fl = Range(F_UNLCK, kQemuLockPermBase, kQemuLockSpan);
    (void)::fcntl(fd, F_OFD_SETLK, &fl);
  }
  return s;
}

Result<QemuImageLock> QemuImageLock::Acquire(const std::string& path, QemuLockMode mode) {
  // An exclusive lock needs a descriptor open for writing (fcntl: EBADF).
  const int flags = mode == QemuLockMode::kExclusive ? O_RDWR : O_RDONLY;
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, path);
  QemuImageLock lock(fd);  // closes the fd, and so drops any lock, on failure
  TD_RETURN_IF_ERROR(LockImageFd(fd, path, mode));
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
