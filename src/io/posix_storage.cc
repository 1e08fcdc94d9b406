#include "io/posix_storage.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

namespace thindisk::io {
namespace {

// Largest bounce buffer / zero-fill chunk: bounds memory per request.
constexpr size_t kBounceBytes = 1 << 20;
// Block size assumed for O_DIRECT on regular files: a multiple of every
// logical block size in use (512, 4096), so it is always accepted.
constexpr uint32_t kDefaultDirectBlock = 4096;
constexpr uint64_t kMaxOffset = static_cast<uint64_t>(std::numeric_limits<off_t>::max());

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t[], FreeDeleter>;

AlignedBuffer AllocAligned(size_t alignment, size_t size) {
  void* p = nullptr;
  if (posix_memalign(&p, alignment, size) != 0) return nullptr;
  return AlignedBuffer(static_cast<uint8_t*>(p));
}

bool IsUnsupported(int e) { return e == EOPNOTSUPP || e == ENOSYS; }

Status CheckRange(const std::string& path, uint64_t offset, uint64_t length) {
  if (offset > kMaxOffset || length > kMaxOffset - offset) {
    return Status::OutOfRange(path + ": range beyond the largest file offset");
  }
  return Status::Ok();
}

int RetryFallocate(int fd, int mode, uint64_t offset, uint64_t length) {
  int r;
  do {
    r = fallocate(fd, mode, static_cast<off_t>(offset), static_cast<off_t>(length));
  } while (r < 0 && errno == EINTR);
  return r < 0 ? errno : 0;
}

// The alignment direct I/O on `fd` needs, of offsets, lengths and memory
// alike (statx STATX_DIOALIGN, Linux 6.1); 0 where the kernel does not say,
// or says something other than a power of two up to 4096.
uint32_t DirectIoAlign(int fd) {
  struct statx sx {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) != 0) return 0;
  if ((sx.stx_mask & STATX_DIOALIGN) == 0 || sx.stx_dio_offset_align == 0) return 0;
  const uint32_t align = std::max(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
  if ((align & (align - 1)) != 0 || align > kDefaultDirectBlock) return 0;
  return align;
}

// A second descriptor of the file open as `fd`, with O_DIRECT; -1 where
// the filesystem refuses O_DIRECT or /proc is not mounted.
int ReopenDirect(int fd, bool read_only) {
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  return open(self.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_DIRECT | O_CLOEXEC);
}

// cachestat(2) (Linux 6.5), declared here: Debian 12's kernel headers
// predate it. The system call has the same number on every architecture.
constexpr long kSysCachestat = 451;
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};

}  // namespace

PosixStorage::PosixStorage(int fd, std::string path, const OpenOptions& options,
                           bool direct, uint32_t block_size, bool is_block_device,
                           int direct_fd)
    : fd_(fd),
      path_(std::move(path)),
      read_only_(options.read_only),
      cache_(options.cache),
      direct_(direct),
      block_size_(block_size),
      is_block_device_(is_block_device),
      direct_fd_(direct_fd) {}

PosixStorage::~PosixStorage() {
  close(fd_);
  if (direct_fd_ >= 0) close(direct_fd_);
}

Status PosixStorage::Error(int e, const char* op) const {
  return Status::FromErrno(e, path_ + ": " + op);
}

Status PosixStorage::CheckWritable() const {
  if (read_only_) return Status::ReadOnly(path_ + ": opened read-only");
  return Status::Ok();
}

Status PosixStorage::PreadFull(uint64_t offset, std::span<uint8_t> buf) {
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = pread(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(errno, "pread");
    }
    if (n == 0) break;  // EOF: the rest reads as zeros
    done += static_cast<size_t>(n);
    // With O_DIRECT a count that is not a block multiple means EOF fell
    // inside the block; another pread at that unaligned offset would fail.
    if (direct_ && n % block_size_ != 0) break;
  }
  if (done < buf.size()) std::memset(buf.data() + done, 0, buf.size() - done);
  return Status::Ok();
}

Status PosixStorage::PwriteFull(uint64_t offset, std::span<const uint8_t> buf) {
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = pwrite(fd_, buf.data() + done, buf.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(errno, "pwrite");
    }
    if (n == 0) return Error(EIO, "pwrite made no progress");
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status PosixStorage::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  TD_RETURN_IF_ERROR(CheckRange(path_, offset, buf.size()));
  if (buf.empty()) return Status::Ok();
  if (direct_) return DirectRead(offset, buf);
  if (direct_fd_ >= 0 && ReadFdFor(offset, buf) == direct_fd_)
    return ColdRead(offset, buf);
  return PreadFull(offset, buf);
}

int PosixStorage::ReadFdFor(uint64_t offset, std::span<const uint8_t> dst) const {
  if (direct_) return -1;
  const uint64_t align = block_size_;
  if (direct_fd_ < 0 || dst.size() < kColdDirectMin || !cold_reads_ok_.load() ||
      offset % align != 0 || dst.size() % align != 0 ||
      reinterpret_cast<uintptr_t>(dst.data()) % align != 0) {
    return fd_;
  }
  CachestatRange range{offset, dst.size()};
  Cachestat stat{};
  if (syscall(kSysCachestat, fd_, &range, &stat, 0) != 0) {
    // A kernel before 6.5, a filter that refuses the call, a file the
    // kernel cannot count: read through the page cache from now on.
    if (errno == ENOSYS || errno == EPERM || errno == EOPNOTSUPP) cold_reads_ok_ = false;
    return fd_;
  }
  if (stat.nr_cache != 0) return fd_;
  ++cold_direct_reads_;
  return direct_fd_;
}

Status PosixStorage::ColdRead(uint64_t offset, std::span<uint8_t> buf) {
  ssize_t n;
  do {
    n = pread(direct_fd_, buf.data(), buf.size(), static_cast<off_t>(offset));
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno != EINVAL) return Error(errno, "pread (O_DIRECT)");
  if (n < 0) {
    cold_reads_ok_ = false;  // refused as misaligned: nothing was read
    n = 0;
  }
  // The file's end inside the range (a short count), or the refusal: the
  // rest as ReadAt reads it, zeros past the end.
  const size_t done = static_cast<size_t>(n);
  if (done < buf.size()) return PreadFull(offset + done, buf.subspan(done));
  return Status::Ok();
}

Status PosixStorage::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  TD_RETURN_IF_ERROR(CheckWritable());
  TD_RETURN_IF_ERROR(CheckRange(path_, offset, buf.size()));
  if (buf.empty()) return Status::Ok();
  TD_RETURN_IF_ERROR(direct_ ? DirectWrite(offset, buf) : PwriteFull(offset, buf));
  bytes_written_ += buf.size();
  return Status::Ok();
}

Status PosixStorage::RewriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  const uint64_t align = block_size_;
  if (!rewrites_direct() || buf.empty() || buf.size() > kBounceBytes ||
      offset % align != 0 || buf.size() % align != 0) {
    return WriteAt(offset, buf);
  }
  TD_RETURN_IF_ERROR(CheckWritable());
  TD_RETURN_IF_ERROR(CheckRange(path_, offset, buf.size()));
  AlignedBuffer bounce = AllocAligned(kDefaultDirectBlock, buf.size());
  if (!bounce) return WriteAt(offset, buf);
  std::memcpy(bounce.get(), buf.data(), buf.size());
  ssize_t n;
  do {
    n = pwrite(direct_fd_, bounce.get(), buf.size(), static_cast<off_t>(offset));
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EINVAL) {
    // Refused as misaligned after all: nothing was written.
    rewrite_ok_ = false;
    return WriteAt(offset, buf);
  }
  if (n < 0) return Error(errno, "pwrite (O_DIRECT)");
  // A short direct write: the rest through the page cache.
  const size_t done = static_cast<size_t>(n);
  if (done < buf.size()) TD_RETURN_IF_ERROR(PwriteFull(offset + done, buf.subspan(done)));
  bytes_written_ += buf.size();
  return Status::Ok();
}

Status PosixStorage::DirectRead(uint64_t offset, std::span<uint8_t> buf) {
  const uint64_t bs = block_size_;
  const bool aligned = offset % bs == 0 && buf.size() % bs == 0 &&
                       reinterpret_cast<uintptr_t>(buf.data()) % bs == 0;
  if (aligned) return PreadFull(offset, buf);

  // Bounce: read the block-aligned cover of the request piecewise.
  const uint64_t end = offset + buf.size();
  const uint64_t cover_start = offset / bs * bs;
  const uint64_t cover_end = (end + bs - 1) / bs * bs;
  const size_t bounce_size = std::min<uint64_t>(kBounceBytes, cover_end - cover_start);
  AlignedBuffer bounce = AllocAligned(bs, bounce_size);
  if (!bounce) return Status(Code::kIoError, path_ + ": out of memory for O_DIRECT bounce buffer", ENOMEM);
  for (uint64_t pos = cover_start; pos < cover_end; pos += bounce_size) {
    const size_t n = std::min<uint64_t>(bounce_size, cover_end - pos);
    TD_RETURN_IF_ERROR(PreadFull(pos, {bounce.get(), n}));
    const uint64_t from = std::max(pos, offset);
    const uint64_t to = std::min(pos + n, end);
    std::memcpy(buf.data() + (from - offset), bounce.get() + (from - pos), to - from);
  }
  return Status::Ok();
}

Status PosixStorage::RmwBlock(uint64_t block_offset, size_t in_block,
                              std::span<const uint8_t> data) {
  AlignedBuffer block = AllocAligned(block_size_, block_size_);
  if (!block) return Status(Code::kIoError, path_ + ": out of memory for O_DIRECT bounce buffer", ENOMEM);
  std::lock_guard lock(stripes_[(block_offset / block_size_) % kStripes]);
  TD_RETURN_IF_ERROR(PreadFull(block_offset, {block.get(), block_size_}));
  std::memcpy(block.get() + in_block, data.data(), data.size());
  return PwriteFull(block_offset, {block.get(), block_size_});
}

Status PosixStorage::DirectWrite(uint64_t offset, std::span<const uint8_t> buf) {
  const uint64_t bs = block_size_;
  const uint64_t end = offset + buf.size();
  const bool aligned_range = offset % bs == 0 && buf.size() % bs == 0;

  // 1. A partial tail block past EOF is written whole and must be trimmed
  //    back afterwards: hold extend_mu_ exclusively until then, so no other
  //    write (which may extend the file) runs between the size check and
  //    the trim. Any other write holds it shared.
  std::unique_lock<std::shared_mutex> trim_lock(extend_mu_, std::defer_lock);
  std::shared_lock<std::shared_mutex> grow_lock(extend_mu_, std::defer_lock);
  uint64_t size_before = 0;
  bool may_trim = false;
  if (end % bs != 0 && !is_block_device_) {
    trim_lock.lock();
    TD_ASSIGN_OR_RETURN(size_before, Size());
    may_trim = (end + bs - 1) / bs * bs > size_before;
    if (!may_trim) trim_lock.unlock();
  }
  if (!may_trim) grow_lock.lock();
  if (aligned_range && reinterpret_cast<uintptr_t>(buf.data()) % bs == 0) {
    return PwriteFull(offset, buf);
  }

  // 2. Walk the request: partial blocks by RMW, aligned runs via a bounce
  //    buffer (the caller's memory may not be aligned).
  AlignedBuffer bounce;
  uint64_t pos = offset;
  while (pos < end) {
    const uint64_t block_start = pos / bs * bs;
    if (pos != block_start || end - pos < bs) {
      const uint64_t to = std::min(end, block_start + bs);
      TD_RETURN_IF_ERROR(RmwBlock(block_start, pos - block_start,
                                  buf.subspan(pos - offset, to - pos)));
      pos = to;
      continue;
    }
    const uint64_t aligned_end = end / bs * bs;
    const size_t n = std::min<uint64_t>(kBounceBytes, aligned_end - pos);
    if (!bounce) {
      bounce = AllocAligned(bs, std::min<uint64_t>(kBounceBytes, aligned_end - pos));
      if (!bounce) return Status(Code::kIoError, path_ + ": out of memory for O_DIRECT bounce buffer", ENOMEM);
    }
    std::memcpy(bounce.get(), buf.data() + (pos - offset), n);
    TD_RETURN_IF_ERROR(PwriteFull(pos, {bounce.get(), n}));
    pos += n;
  }

  // 3. Trim the block rounding back off, unless someone else has since
  //    extended the file further than our rounded end.
  if (may_trim) {
    TD_ASSIGN_OR_RETURN(uint64_t size_after, Size());
    const uint64_t want = std::max(size_before, end);
    if (size_after > want && size_after <= (end + bs - 1) / bs * bs) {
      if (ftruncate(fd_, static_cast<off_t>(want)) < 0) return Error(errno, "ftruncate");
    }
  }
  return Status::Ok();
}

Status PosixStorage::Flush() {
  if (cache_ == CacheMode::kUnsafe) return Status::Ok();
  if (fdatasync(fd_) < 0) return Error(errno, "fdatasync");
  return Status::Ok();
}

Result<uint64_t> PosixStorage::Size() {
  if (is_block_device_) {
    uint64_t bytes = 0;
    if (ioctl(fd_, BLKGETSIZE64, &bytes) < 0) return Error(errno, "BLKGETSIZE64");
    return bytes;
  }
  struct stat st;
  if (fstat(fd_, &st) < 0) return Error(errno, "fstat");
  return static_cast<uint64_t>(st.st_size);
}

Status PosixStorage::Resize(uint64_t size) {
  TD_RETURN_IF_ERROR(CheckWritable());
  TD_RETURN_IF_ERROR(CheckRange(path_, size, 0));
  if (is_block_device_) return Status::NotSupported(path_ + ": a block device cannot be resized");
  std::shared_lock grow_lock(extend_mu_);  // not inside a direct write's trim
  int r;
  do {
    r = ftruncate(fd_, static_cast<off_t>(size));
  } while (r < 0 && errno == EINTR);
  if (r < 0) return Error(errno, "ftruncate");
  return Status::Ok();
}

Status PosixStorage::Allocate(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckWritable());
  TD_RETURN_IF_ERROR(CheckRange(path_, offset, length));
  if (length == 0) return Status::Ok();
  std::shared_lock grow_lock(extend_mu_);  // may extend: not during a direct trim
  const int e = RetryFallocate(fd_, 0, offset, length);
  if (e == 0) return Status::Ok();
  if (IsUnsupported(e)) {
    return Status::NotSupported(path_ + ": the filesystem does not support preallocation (fallocate)", e);
  }
  return Error(e, "fallocate");
}

Status PosixStorage::PunchHole(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckWritable());
  TD_RETURN_IF_ERROR(CheckRange(path_, offset, length));
  if (is_block_device_) TD_RETURN_IF_ERROR(ZeroDeviceEdges(&offset, &length));
  if (length == 0) return Status::Ok();
  int e = RetryFallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length);
  if (e == 0) return Status::Ok();
  if (!IsUnsupported(e)) return Error(e, "fallocate(PUNCH_HOLE)");
  e = RetryFallocate(fd_, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, offset, length);
  if (e == 0) return Status::Ok();
  if (!IsUnsupported(e)) return Error(e, "fallocate(ZERO_RANGE)");
  return Status::NotSupported(path_ + ": the filesystem can neither punch holes nor zero ranges", e);
}

Status PosixStorage::ZeroRange(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(CheckWritable());
  TD_RETURN_IF_ERROR(CheckRange(path_, offset, length));
  if (is_block_device_) {
    const uint64_t asked = length;
    TD_RETURN_IF_ERROR(ZeroDeviceEdges(&offset, &length));
    bytes_written_ += asked - length;
  }
  if (length == 0) return Status::Ok();
  // Block devices take ZERO_RANGE only with KEEP_SIZE (their size is fixed).
  const int zero_mode = FALLOC_FL_ZERO_RANGE | (is_block_device_ ? FALLOC_FL_KEEP_SIZE : 0);
  std::shared_lock grow_lock(extend_mu_);  // may extend: not during a direct trim
  int e = RetryFallocate(fd_, zero_mode, offset, length);
  grow_lock.unlock();  // the fallbacks below write through DirectWrite
  if (e == 0) {
    bytes_written_ += length;
    return Status::Ok();
  }
  if (!IsUnsupported(e)) return Error(e, "fallocate(ZERO_RANGE)");

  // Fallback 1: punch, then make sure the file reaches the end of the range
  // (punching never extends). A one-byte zero write grows the file without
  // the shrink race an ftruncate would have against concurrent writers.
  e = RetryFallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length);
  if (e == 0) {
    TD_ASSIGN_OR_RETURN(uint64_t size, Size());
    if (size < offset + length) {
      const uint8_t zero = 0;
      TD_RETURN_IF_ERROR(direct_ ? DirectWrite(offset + length - 1, {&zero, 1})
                                 : PwriteFull(offset + length - 1, {&zero, 1}));
    }
    bytes_written_ += length;
    return Status::Ok();
  }
  if (!IsUnsupported(e)) return Error(e, "fallocate(PUNCH_HOLE)");

  // Fallback 2: write zeros.
  TD_RETURN_IF_ERROR(WriteZeros(offset, length));
  bytes_written_ += length;
  return Status::Ok();
}

Status PosixStorage::ZeroDeviceEdges(uint64_t* offset, uint64_t* length) {
  int logical = 0;
  if (ioctl(fd_, BLKSSZGET, &logical) < 0 || logical < 512) logical = 512;
  const uint64_t b = uint64_t(logical);
  const uint64_t end = *offset + *length;
  const uint64_t first = (*offset + b - 1) / b * b;
  const uint64_t last = end / b * b;
  if (first >= last) {
    TD_RETURN_IF_ERROR(WriteZeros(*offset, *length));
    *length = 0;
    return Status::Ok();
  }
  if (*offset < first) TD_RETURN_IF_ERROR(WriteZeros(*offset, first - *offset));
  if (last < end) TD_RETURN_IF_ERROR(WriteZeros(last, end - last));
  *offset = first;
  *length = last - first;
  return Status::Ok();
}

Status PosixStorage::WriteZeros(uint64_t offset, uint64_t length) {
  const size_t chunk = std::min<uint64_t>(kBounceBytes, length);
  // Aligned and zeroed, so direct_ writes of aligned runs go straight out.
  AlignedBuffer zeros = AllocAligned(kDefaultDirectBlock, std::max<size_t>(chunk, block_size_));
  if (!zeros) return Status(Code::kIoError, path_ + ": out of memory for zero buffer", ENOMEM);
  std::memset(zeros.get(), 0, chunk);
  for (uint64_t pos = offset; pos < offset + length; pos += chunk) {
    const size_t n = std::min<uint64_t>(chunk, offset + length - pos);
    TD_RETURN_IF_ERROR(direct_ ? DirectWrite(pos, {zeros.get(), n}) : PwriteFull(pos, {zeros.get(), n}));
  }
  return Status::Ok();
}

// The size is only fetched where lseek does not answer: the block status of
// a clone's read seeks its backing file, and an fstat per seek was a few
// per cent of the server's CPU in the boot storm (bench/compare W11).
Result<uint64_t> PosixStorage::Seek(uint64_t offset, int whence) {
  if (offset > uint64_t(std::numeric_limits<off_t>::max())) return Size();
  // Both answers lie before the end or at it (SEEK_HOLE finds the end's
  // implicit hole; block devices answer offset and their size).
  const off_t r = lseek(fd_, static_cast<off_t>(offset), whence);
  if (r >= 0) return static_cast<uint64_t>(r);
  const int e = errno;
  TD_ASSIGN_OR_RETURN(uint64_t size, Size());
  if (offset >= size || e == ENXIO) return size;  // no data (or hole) before EOF
  if (e == EINVAL || IsUnsupported(e)) {
    // Filesystem can't tell: everything is data.
    return whence == SEEK_DATA ? offset : size;
  }
  return Error(e, whence == SEEK_DATA ? "lseek(SEEK_DATA)" : "lseek(SEEK_HOLE)");
}

Result<uint64_t> PosixStorage::NextData(uint64_t offset) { return Seek(offset, SEEK_DATA); }
Result<uint64_t> PosixStorage::NextHole(uint64_t offset) { return Seek(offset, SEEK_HOLE); }

Result<uint64_t> PosixStorage::AllocatedBytes() {
  struct stat st;
  if (fstat(fd_, &st) < 0) return Error(errno, "fstat");
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

namespace {

// open(2) that knows whether it created the file, so a failed O_DIRECT
// switch can remove what it made. EINTR is retried.
int OpenTracked(const std::string& path, int flags, bool create, bool exclusive, bool* created) {
  *created = false;
  for (int attempt = 0; attempt < 8; ++attempt) {
    int fd;
    if (create) {
      do {
        fd = open(path.c_str(), flags | O_CREAT | O_EXCL, 0644);
      } while (fd < 0 && errno == EINTR);
      if (fd >= 0) {
        *created = true;
        return fd;
      }
      if (errno != EEXIST || exclusive) return -1;
    }
    do {
      fd = open(path.c_str(), flags);
    } while (fd < 0 && errno == EINTR);
    // Removed between our two opens: try creating again.
    if (fd >= 0 || errno != ENOENT || !create) return fd;
  }
  errno = EBUSY;
  return -1;
}

}  // namespace

Result<std::unique_ptr<Storage>> OpenFile(const std::string& path, const OpenOptions& options) {
  if (options.read_only && options.create) {
    return Status::InvalidArgument(path + ": cannot create a file opened read-only");
  }
  const int flags = (options.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
  bool created = false;
  const int fd = OpenTracked(path, flags, options.create, options.exclusive, &created);
  if (fd < 0) return Status::FromErrno(errno, path);

  auto fail = [&](Status s) -> Status {
    close(fd);
    if (created) unlink(path.c_str());
    return s;
  };

  struct stat st;
  if (fstat(fd, &st) < 0) return fail(Status::FromErrno(errno, path + ": fstat"));
  if (S_ISDIR(st.st_mode)) return fail(Status::InvalidArgument(path + ": is a directory"));
  // Before anything reads or changes the image: refuse one in use.
  if (Status locked = LockImageFd(fd, path, options.lock);
      !locked.ok() && locked.code() != Code::kNotSupported) {
    return fail(locked);
  }
  const bool is_block_device = S_ISBLK(st.st_mode);

  bool direct = false;
  uint32_t block_size = kDefaultDirectBlock;
  if (options.cache == CacheMode::kNone) {
    // Switching on an open descriptor (rather than open(O_DIRECT)) lets us
    // tell "no O_DIRECT here" (EINVAL) apart from open errors.
    const int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_DIRECT) < 0) {
      const int e = errno;
      if (e == EINVAL) {
        return fail(Status::NotSupported(
            path + ": the filesystem does not support O_DIRECT (cache=none); use cache=writeback", e));
      }
      return fail(Status::FromErrno(e, path + ": fcntl(O_DIRECT)"));
    }
    direct = true;
    if (is_block_device) {
      int logical = 0;
      if (ioctl(fd, BLKSSZGET, &logical) == 0 && logical >= 512 && (logical & (logical - 1)) == 0) {
        block_size = static_cast<uint32_t>(logical);
      }
    } else if (const uint32_t align = DirectIoAlign(fd); align != 0) {
      // The file's own alignment (512 bytes on most disks): a changed
      // 512-byte sector is then written as it is, not read-modify-written
      // as a 4 KiB block.
      block_size = align;
    }
  }
  int direct_fd = -1;
  if (options.cache == CacheMode::kWriteback &&
      (S_ISREG(st.st_mode) || is_block_device)) {
    // RewriteAt's and cold reads' descriptor, where the kernel says the
    // alignment it needs.
    if (const uint32_t align = DirectIoAlign(fd); align != 0) {
      direct_fd = ReopenDirect(fd, options.read_only);
      if (direct_fd >= 0) block_size = align;
    }
  }
  return std::unique_ptr<Storage>(std::make_unique<PosixStorage>(
      fd, path, options, direct, block_size, is_block_device, direct_fd));
}

}  // namespace thindisk::io
