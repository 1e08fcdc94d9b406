// PosixStorage: io::Storage over a host file or block device (io::OpenFile).
//
// I/O is synchronous pread/pwrite (retried on EINTR and short transfers).
// Space operations map to fallocate(2), with honest fallbacks:
//  - Allocate:  fallocate(0); kNotSupported where the filesystem can't.
//  - PunchHole: PUNCH_HOLE|KEEP_SIZE, else ZERO_RANGE|KEEP_SIZE, else
//               kNotSupported.
//  - ZeroRange: ZERO_RANGE, else PUNCH_HOLE (+ extend), else writing zeros
//               in bounded chunks; extends Size() like a write of zeros.
//  - NextData/NextHole: lseek SEEK_DATA/SEEK_HOLE; filesystems without them
//               report everything as data.
//
// CacheMode::kNone opens with O_DIRECT. Requests whose offset, length or
// buffer address are not multiples of the device's logical block size
// (BLKSSZGET on block devices; on files the direct I/O alignment statx
// STATX_DIOALIGN reports, else 4096) are bounced through an aligned
// buffer; partial blocks of a write are read-modify-written under a striped
// lock so two concurrent RMWs of one block can't lose each other's bytes.
// A filesystem that refuses O_DIRECT (e.g. tmpfs) fails OpenFile with
// kNotSupported saying so; callers may retry with kWriteback.
//
// CacheMode::kWriteback on a writable file also opens the file a second
// time with O_DIRECT (through /proc/self/fd, so the very same file), for
// RewriteAt: a changed 512-byte sector of an L2 table reaches the disk as
// one sector, where through the page cache the flush would write its whole
// 4 KiB page. Only runs aligned to the file's direct I/O alignment (statx
// STATX_DIOALIGN) go that way; everything else, and every file where the
// second open fails or the kernel cannot say the alignment, is WriteAt.
// Flush's fdatasync covers both descriptors: it syncs the file, not a
// descriptor. The kernel writes back and drops any cached page a direct
// write covers, so reads through the page cache see the new bytes.
//
// The same descriptor (opened read-only for a read-only file) serves cold
// reads: a read of at least kColdDirectMin bytes, aligned like a direct
// write, none of whose pages the page cache holds (cachestat(2), Linux
// 6.5), goes around the page cache (ReadAt, and ReadFdFor for a ring). On a
// virtual machine whose free memory the host takes back (free page
// reporting), each page-cache page a cold read fills costs the host a fault
// on first touch: buffered 1 MiB reads ran at 0.3-0.9 GB/s there with the
// disk idle most of the time, direct ones at 1.1-2.4 GB/s
// (docs/performance.md, "What W7's cold reads cost"). A range with any page
// cached (dirty ones included) is read through the page cache as before;
// the kernel writes back dirty pages a direct read overlaps anyway, so a
// write racing the check is still read.
//
// Thread safety: all methods may be called concurrently (see storage.h).
// Errors carry the path: "disk.qcow2: pwrite: No space left on device".
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>

#include "io/storage.h"

namespace thindisk::io {

class PosixStorage final : public Storage {
 public:
  // The smallest read that may go around the page cache when cold: above
  // every qcow2 metadata read and 4 KiB random read, below a sequential
  // reader's 1 MiB.
  static constexpr size_t kColdDirectMin = 256u << 10;

  // Takes ownership of `fd` and `direct_fd`. `direct` means fd has
  // O_DIRECT; `direct_fd`, if not -1, is a second descriptor of the same
  // file opened O_DIRECT, for RewriteAt and cold reads. Direct transfers,
  // on either, must be aligned to `block_size` (a power of two).
  PosixStorage(int fd, std::string path, const OpenOptions& options, bool direct,
               uint32_t block_size, bool is_block_device, int direct_fd = -1);
  ~PosixStorage() override;
  PosixStorage(const PosixStorage&) = delete;
  PosixStorage& operator=(const PosixStorage&) = delete;

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status RewriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override;
  Result<uint64_t> Size() override;
  Status Resize(uint64_t size) override;
  Status Allocate(uint64_t offset, uint64_t length) override;
  Status PunchHole(uint64_t offset, uint64_t length) override;
  Status ZeroRange(uint64_t offset, uint64_t length) override;
  Result<uint64_t> NextData(uint64_t offset) override;
  Result<uint64_t> NextHole(uint64_t offset) override;
  Result<uint64_t> AllocatedBytes() override;
  uint64_t bytes_written() const override { return bytes_written_.load(); }
  int ReadFd() const override { return direct_ ? -1 : fd_; }
  int ReadFdFor(uint64_t offset, std::span<const uint8_t> dst) const override;
  const std::string& name() const override { return path_; }

  bool direct() const { return direct_; }
  // The alignment of direct transfers (when direct() or rewrites_direct()).
  uint32_t block_size() const { return block_size_; }
  // Whether RewriteAt can send aligned runs around the page cache.
  bool rewrites_direct() const {
    return direct_fd_ >= 0 && !read_only_ && rewrite_ok_.load();
  }
  // Reads sent around the page cache as cold (ReadAt's, and descriptors
  // ReadFdFor handed out).
  uint64_t cold_direct_reads() const { return cold_direct_reads_.load(); }

 private:
  static constexpr size_t kStripes = 64;

  Status Error(int e, const char* op) const;
  Status CheckWritable() const;
  // Plain loops: the caller guarantees alignment when direct_.
  Status PreadFull(uint64_t offset, std::span<uint8_t> buf);
  Status PwriteFull(uint64_t offset, std::span<const uint8_t> buf);
  // ReadAt of a cold range through direct_fd_; the bytes a direct read
  // could not give (the file's end, a refusal) through the page cache.
  Status ColdRead(uint64_t offset, std::span<uint8_t> buf);
  // O_DIRECT paths for requests that are not fully aligned.
  Status DirectRead(uint64_t offset, std::span<uint8_t> buf);
  Status DirectWrite(uint64_t offset, std::span<const uint8_t> buf);
  // Read-modify-write of the single block at `block_offset`, replacing
  // `data` at `in_block`. Takes the block's stripe lock.
  Status RmwBlock(uint64_t block_offset, size_t in_block, std::span<const uint8_t> data);
  Status WriteZeros(uint64_t offset, uint64_t length);
  // A block device takes fallocate on whole logical blocks only (EINVAL
  // otherwise): writes the partial blocks at the ends of the range as
  // zeros and narrows it to the whole blocks between (length 0: none).
  Status ZeroDeviceEdges(uint64_t* offset, uint64_t* length);
  Result<uint64_t> Seek(uint64_t offset, int whence);

  const int fd_;
  const std::string path_;
  const bool read_only_;
  const CacheMode cache_;
  const bool direct_;
  const uint32_t block_size_;
  const bool is_block_device_;
  // The O_DIRECT descriptor for RewriteAt and cold reads, -1 for none;
  // rewrite_ok_ turns false for good if the kernel refuses a direct write
  // as misaligned, cold_reads_ok_ if it refuses a direct read or cannot
  // say what the page cache holds.
  const int direct_fd_;
  std::atomic<bool> rewrite_ok_{true};
  mutable std::atomic<bool> cold_reads_ok_{true};
  mutable std::atomic<uint64_t> cold_direct_reads_{0};
  std::atomic<uint64_t> bytes_written_{0};
  // Serializes RMWs that touch the same block (block index % kStripes).
  std::array<std::mutex, kStripes> stripes_;
  // Direct writes whose block-rounded end passes EOF write a whole block and
  // then trim the file back to the requested end: they hold this exclusively
  // from their size check to the trim. Everything else that may grow a
  // direct_ file (writes, fallocate, ftruncate) holds it shared, so the trim
  // never cuts off a concurrent extension.
  std::shared_mutex extend_mu_;
};

}  // namespace thindisk::io
