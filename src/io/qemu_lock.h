// QemuImageLock: the image lock qemu takes on image files, so that thindisk
// and qemu processes (a VM, qemu-nbd, qemu-img, qemu-io) do not change an
// image under each other.
//
// qemu's protocol (block/file-posix.c, "lock bytes"): a process using an
// image holds open file description (OFD) locks, fcntl(F_OFD_SETLK), on the
// image file itself: a shared lock on byte kQemuLockPermBase + p for each
// permission p it holds and on kQemuLockSharedBase + p for each permission
// it refuses to share with others (p: 0 consistent read, 1 write, 2 write
// unchanged, 3 resize). Before opening, qemu tests (F_OFD_GETLK) that
// nobody refuses a permission it needs and nobody holds one it refuses, and
// fails with "Failed to get ... lock" otherwise. -U (force-share) only
// makes qemu share everything; it still needs the permissions it uses, so
// only opens that use none (qemu-img info -U) get past either mode below.
//
// Modes for an open that uses the image, the permissions qemu 7.2 itself
// takes (seen in /proc/locks while qemu-io, qemu-nbd and qemu-img hold
// images). A mode holds a shared lock on kQemuLockPermBase + p for each
// permission p it uses and on kQemuLockSharedBase + p for each it refuses
// to share; then, like qemu, it checks (F_OFD_GETLK) that no other holder
// refuses a permission it uses or uses one it refuses, and fails otherwise.
// Locking before checking means two processes racing for the same image
// both see each other and at most one proceeds (usually neither: retry).
//  - kWrite: a read-write open. Uses consistent read, write and resize
//    (bytes 100, 101, 103), refuses to share write and resize (201, 203).
//    So one writer at a time, no reader (qemu-img info, qemu-io -r) beside
//    a writer, and no writer beside a reader; -U readers may join.
//  - kRead: a read-only open, and every backing file. Uses consistent read
//    (100), refuses write and resize (201, 203): readers share, writers are
//    refused; two clones over one base open at the same time.
//  - kForceShare: -U (--force-share), read-only only. Uses consistent read
//    (100) and shares everything: only a holder that refuses to share
//    consistent read keeps it out (kShared below).
//  - kNone: takes no lock (scratch files, callers that hold a lock on the
//    image themselves).
// Two older, stricter modes for commands that rewrite an image's metadata
// while nobody may use it (snapshot, compact):
//  - kShared: we join the protocol as a user that holds all four
//    permissions and shares none: shared locks on bytes 100..103 and
//    200..203. Taken only when nobody else holds any lock on 100..299
//    (otherwise kBusy: someone uses the image right now). qemu processes
//    that start while we hold it refuse to open the image, even read-only
//    (qemu-img info, qemu-io -r: they need consistent read, which we do not
//    share). Needs only a read-only open, so it works on images we may not
//    write; it relies on the other side checking the bytes, as qemu does.
//  - kExclusive: one exclusive (write) lock over all of 100..299. Fails with
//    kBusy when anybody holds any lock there; while held, nobody can take
//    any lock in the range, so qemu fails even to take its own ("Failed to
//    lock byte 100"), checking or not. Needs the file to be writable (the fd
//    is opened read-write).
// Any two holders conflict when one of them is kShared or kExclusive: the
// second gets kBusy.
// Each Acquire opens its own file description, so two QemuImageLock objects
// in one process conflict exactly like two processes do.
//
// Lifetime: the lock lives as long as the object (move-only); destroying it
// closes the fd and the kernel drops the locks. They also go when the
// process exits or is killed, so a crash never leaves a stale lock.
//
// Errors from Acquire:
//  - kBusy: another open file description holds a conflicting lock.
//  - kNotSupported: the filesystem has no OFD locks (fcntl fails with
//    EINVAL or ENOLCK, e.g. some NFS or FUSE mounts). qemu then runs
//    unlocked, so there is nobody to coordinate with; the caller decides
//    whether to proceed unlocked or to refuse.
//  - opening the file: Status::FromErrno (kNotFound, kReadOnly, ...).
//  - any other fcntl failure: Status::FromErrno ("PATH: locking: ...").
//
// Thread safety: a QemuImageLock is a value owned by one thread at a time;
// the locks are per open file description, not per thread.
#pragma once

#include <sys/types.h>

#include <string>

#include "util/result.h"

namespace thindisk::io {

// qemu's RAW_LOCK_PERM_BASE and RAW_LOCK_SHARED_BASE.
inline constexpr off_t kQemuLockPermBase = 100;
inline constexpr off_t kQemuLockSharedBase = 200;
// The permissions qemu 7.2 locks: consistent read, write, write unchanged,
// resize.
inline constexpr off_t kQemuLockPermissions = 4;
// The whole lock range, bytes 100..299 (room for qemu's future permissions).
inline constexpr off_t kQemuLockSpan = 200;

enum class QemuLockMode { kNone, kForceShare, kRead, kWrite, kShared, kExclusive };

// "read", "write", "force-share", ... for messages and tests.
const char* QemuLockModeName(QemuLockMode mode);

// Takes `mode` on `fd`, an open file description of `path` (read-write for
// kExclusive). The locks belong to that description: they last until every
// descriptor sharing it is closed, or the process exits. On failure the fd
// holds no new lock. kNotSupported (no OFD locks here) is returned as is;
// the caller decides whether to run unlocked.
Status LockImageFd(int fd, const std::string& path, QemuLockMode mode);

class QemuImageLock {
 public:
  // Opens `path` (read-write for kExclusive, read-only otherwise) and takes
  // the lock. Errors: see above.
  static Result<QemuImageLock> Acquire(const std::string& path, QemuLockMode mode);

  QemuImageLock(QemuImageLock&& other) noexcept;
  QemuImageLock& operator=(QemuImageLock&& other) noexcept;
  QemuImageLock(const QemuImageLock&) = delete;
  QemuImageLock& operator=(const QemuImageLock&) = delete;
  ~QemuImageLock();

  // The descriptor that holds the lock (e.g. for fstat); owned by this
  // object, valid while it lives. Closing it any other way drops the lock.
  int fd() const { return fd_; }

 private:
  explicit QemuImageLock(int fd) : fd_(fd) {}

  int fd_ = -1;
};

}  // namespace thindisk::io
