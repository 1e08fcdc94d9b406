// io::Storage: the host file (or stand-in) under an image.
//
// Every format driver reaches bytes only through this interface, so tests can
// put the in-memory or the fault-injecting storage under the real driver.
//
// Contract for all implementations:
//  - Thread safety: all methods may be called concurrently from any thread.
//    Concurrent writes to overlapping ranges land in some order; callers
//    (the format drivers) serialize those they care about.
//  - ReadAt: bytes at or past Size() read as zeros (a sparse file's tail).
//    A short read inside the file is retried; only real errors are returned.
//  - WriteAt: extends the file when writing past its end. RewriteAt is
//    WriteAt, for a caller that rewrites a few sectors in place.
//  - Flush: every write that completed before Flush was called is durable
//    when it returns OK (fdatasync).
//  - Allocate: reserves host space for the range (fallocate mode 0) without
//    changing what it reads as; kNotSupported where the host can't (NFS v3,
//    some FUSE): callers fall back (see the preallocation modes).
//  - PunchHole: after OK the range reads as zeros and, where the host
//    allows, frees its space; never changes Size(). kNotSupported if the
//    host can neither punch nor zero the range in place.
//  - ZeroRange: after OK the range reads as zeros, space stays allocated
//    where possible; falls back to writing zeros, so it is always supported.
//  - Errors: Status::FromErrno codes (kIoError, kNoSpace, kNotSupported, ...).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "io/qemu_lock.h"
#include "util/result.h"
#include "util/status.h"

namespace thindisk::io {

// A named step of a format driver's write path, announced to the storage
// just before the write (or read) it names, like QEMU's blkdebug events.
// Fault-injecting storage uses them to fail "the write after step X";
// the order in which they occur is docs/write-ordering.md.
enum class Event : uint8_t {
  kRefblockUpdate,   // an existing refcount block is rewritten
  kRefblockAlloc,    // a newly created refcount block is written
  kReftableUpdate,   // refcount table entries are written in place
  kReftableGrow,     // a grown refcount table is written at its new place
  kL2Alloc,          // a newly allocated (or copied) L2 table is written
  kL2Update,         // an existing L2 table is rewritten
  kL1Update,         // L1 entries are written in place
  kL1Grow,           // a grown L1 table is written at its new place
  kHeaderUpdate,     // the image header is rewritten
  kCowRead,          // old content is read to fill around a partial write
  kCowWrite,         // a cluster (or subcluster run) is written with copied content
  kDataWrite,        // guest data is written as given
  kCompressedWrite,  // a compressed cluster is written
  kDiscardPunch,     // host space of discarded data is punched
  kSnapshotTable,    // the snapshot table is written
  kBitmapMark,       // bitmap data sectors are set ahead of a change (qcow2/bitmap_tracker.h)
  kBitmapUpdate,     // bitmap data is written in place (close, clear, merge, new clusters)
  kBitmapTable,      // a bitmap table (whole, or entries in place) or the directory is written
};
inline constexpr int kEventCount = int(Event::kBitmapTable) + 1;

// The event's stable name ("l2_update"), for messages and test names.
constexpr const char* EventName(Event e) {
  constexpr const char* kNames[kEventCount] = {
      "refblock_update", "refblock_alloc", "reftable_update", "reftable_grow",
      "l2_alloc",        "l2_update",      "l1_update",       "l1_grow",
      "header_update",   "cow_read",       "cow_write",       "data_write",
      "compressed_write", "discard_punch", "snapshot_table", "bitmap_mark",
      "bitmap_update",   "bitmap_table"};
  return size_t(e) < size_t(kEventCount) ? kNames[size_t(e)] : "unknown";
}

class Storage {
 public:
  virtual ~Storage() = default;

  virtual Status ReadAt(uint64_t offset, std::span<uint8_t> buf) = 0;
  virtual Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) = 0;
  // WriteAt for a few changed sectors of bytes already stored (metadata
  // rewritten in place), with the same contract. A file in the page cache
  // may send them around it (O_DIRECT, io/posix_storage.h), so the next
  // Flush writes these sectors rather than the whole pages they would
  // dirty. The default, and every wrapper that does not override it, is
  // WriteAt: a rewrite is a write to whatever watches writes.
  virtual Status RewriteAt(uint64_t offset, std::span<const uint8_t> buf) {
    return WriteAt(offset, buf);
  }
  virtual Status Flush() = 0;
  virtual Result<uint64_t> Size() = 0;
  // Truncates or extends; extended space reads as zeros.
  virtual Status Resize(uint64_t size) = 0;
  virtual Status Allocate(uint64_t offset, uint64_t length) = 0;
  virtual Status PunchHole(uint64_t offset, uint64_t length) = 0;
  virtual Status ZeroRange(uint64_t offset, uint64_t length) = 0;

  // Where data lives, for sparse-aware readers (raw driver, convert):
  // the first offset >= `offset` that holds data (SEEK_DATA) or a hole
  // (SEEK_HOLE). Returns Size() when there is none. Implementations that
  // cannot tell report everything as data.
  virtual Result<uint64_t> NextData(uint64_t offset) = 0;
  virtual Result<uint64_t> NextHole(uint64_t offset) = 0;

  // Bytes the host has allocated for this storage (st_blocks * 512), for
  // space accounting; 0 where unknown.
  virtual Result<uint64_t> AllocatedBytes() = 0;

  // Bytes handed to WriteAt/ZeroRange since creation (host write
  // amplification figures). Punches and allocations do not count.
  virtual uint64_t bytes_written() const = 0;

  // A short human name for messages ("disk.qcow2", "memory").
  virtual const std::string& name() const = 0;

  // A descriptor whose pread gives ReadAt's bytes (EOF reads as zeros), for
  // a caller that reads many ranges at once (block::ReadPlan); -1 where
  // ReadAt does more than pread (O_DIRECT bounce buffers, RADOS, the test
  // and bench wrappers). Valid while the storage lives.
  virtual int ReadFd() const { return -1; }
  // The descriptor for one read of `dst.size()` bytes at `offset` into
  // `dst`: ReadFd(), or (PosixStorage, a large read none of whose bytes
  // are cached) one open O_DIRECT whose pread reads the same bytes around
  // the page cache. A pread there may fail with EINVAL or stop short: the
  // caller reads what is left with ReadAt.
  virtual int ReadFdFor(uint64_t /*offset*/, std::span<const uint8_t> /*dst*/) const {
    return ReadFd();
  }

  // The caller is about to perform step `e` (see Event). Purely a hint for
  // fault injection and tracing: the default does nothing, and no
  // implementation may change what is stored because of it.
  virtual void Announce(Event /*e*/) {}
};

enum class CacheMode {
  kWriteback,  // page cache; Flush = fdatasync
  kNone,       // O_DIRECT; Flush = fdatasync
  kUnsafe,     // page cache; Flush does nothing (qemu's cache=unsafe)
};

struct OpenOptions {
  bool read_only = false;
  bool create = false;     // O_CREAT
  bool exclusive = false;  // with create: O_EXCL
  CacheMode cache = CacheMode::kWriteback;
  // qemu's image lock to take on the file's own open file description (see
  // io/qemu_lock.h), held for the life of the Storage; kNone for scratch
  // files and callers that lock the image themselves. A filesystem without
  // OFD locks opens unlocked, as qemu's locking=auto does.
  QemuLockMode lock = QemuLockMode::kNone;
  // rados:// images opened for writing: ask a live writer to hand the image
  // over instead of failing (serve --takeover; io/rados_lock.h). Files
  // ignore it.
  bool takeover = false;
};

// Opens a host file. Errors name the path ("disk.qcow2: No such file ...").
Result<std::unique_ptr<Storage>> OpenFile(const std::string& path, const OpenOptions& options);

}  // namespace thindisk::io
