// UringStorage: io::Storage whose reads, writes and flushes go through
// io_uring (`thindisk serve --aio=io_uring`).
//
// Each thread that does I/O gets its own small ring on first use (a few
// entries: every call is synchronous for its caller, so one request per
// thread is in flight and no completion thread or locking is needed; the
// parallelism comes from the server's worker threads). The ring is released
// when the thread exits.
//
// Everything else (size, resize, fallocate-based space operations, seeks,
// accounting) is delegated to a PosixStorage over the same file, and so are
// transfers the ring cannot take: with CacheMode::kNone (O_DIRECT), requests
// that are not 4096-aligned in offset, length and buffer address use the
// PosixStorage's bounce-buffer path, and so does the rest of a short read.
// A thread whose ring cannot be set up (e.g. RLIMIT_MEMLOCK) falls back to
// the PosixStorage for its requests.
//
// Thread safety: all methods may be called concurrently (see storage.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "io/posix_storage.h"
#include "io/storage.h"

namespace thindisk::io {

// Whether this process can set up an io_uring ring. Errors: kNotSupported
// with the reason ("io_uring_setup: Operation not permitted"), e.g. in
// containers whose seccomp profile forbids it or on old kernels.
Status UringAvailable();

// Opens `path` like OpenFile and returns a UringStorage over it. Errors: as
// OpenFile, and UringAvailable()'s when io_uring cannot be used (callers
// fall back to OpenFile with a warning).
Result<std::unique_ptr<Storage>> OpenUringFile(const std::string& path,
                                               const OpenOptions& options);

class UringStorage final : public Storage {
 public:
  // `fd` (owned) is a second descriptor of the file under `fallback`, with
  // the same access mode and O_DIRECT setting.
  UringStorage(int fd, std::unique_ptr<Storage> fallback, CacheMode cache, bool direct);
  ~UringStorage() override;
  UringStorage(const UringStorage&) = delete;
  UringStorage& operator=(const UringStorage&) = delete;

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override;
  Result<uint64_t> Size() override { return fallback_->Size(); }
  Status Resize(uint64_t size) override { return fallback_->Resize(size); }
  Status Allocate(uint64_t offset, uint64_t length) override {
    return fallback_->Allocate(offset, length);
  }
  Status PunchHole(uint64_t offset, uint64_t length) override {
    return fallback_->PunchHole(offset, length);
  }
  Status ZeroRange(uint64_t offset, uint64_t length) override {
    return fallback_->ZeroRange(offset, length);
  }
  Result<uint64_t> NextData(uint64_t offset) override { return fallback_->NextData(offset); }
  Result<uint64_t> NextHole(uint64_t offset) override { return fallback_->NextHole(offset); }
  Result<uint64_t> AllocatedBytes() override { return fallback_->AllocatedBytes(); }
  uint64_t bytes_written() const override {
    return bytes_written_.load() + fallback_->bytes_written();
  }
  const std::string& name() const override { return fallback_->name(); }

  // Transfers that went through a ring (for tests).
  uint64_t ring_ops() const { return ring_ops_.load(); }

 private:
  bool Aligned(uint64_t offset, const void* addr, size_t length) const;

  const int fd_;
  const std::unique_ptr<Storage> fallback_;
  PosixStorage* const posix_;  // fallback_ as a PosixStorage (nullptr if not)
  const CacheMode cache_;
  const bool direct_;
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> ring_ops_{0};
};

}  // namespace thindisk::io
