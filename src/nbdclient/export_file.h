// nbdclient::ExportFile: a fixed-size store (an NBD export) seen as a file
// that starts empty, so an image can be created on it.
//
// Image creation (qcow2::Create, raw::CreateRaw) is written for files: it
// wants empty storage, grows it with Resize and relies on grown space
// reading as zeros. An export has a fixed size and old bytes. This view
// gives creation what it expects: Size() starts at 0, Resize and writes
// grow it up to the export's size, and every grown range is zeroed on the
// export first (NBD write-zeroes), so no old byte shows through. Beyond the
// view's size reads are zeros. After creation the image is opened on the
// export itself (whose size is the export's): the qcow2 allocator finds
// free clusters from the refcounts, not the file's end, so the rest of the
// export is free space.
//
// Errors: growing past the export is kNoSpace ("the export is too small");
// the export's own errors pass through. Thread safety: as io::Storage (the
// view's size is atomic; creation is single-threaded anyway).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "io/storage.h"

namespace thindisk::nbdclient {

class ExportFile final : public io::Storage {
 public:
  // `store` must outlive the view.
  static Result<std::unique_ptr<ExportFile>> Make(io::Storage& store);

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override { return store_.Flush(); }
  Result<uint64_t> Size() override { return size_.load(); }
  Status Resize(uint64_t size) override;
  Status Allocate(uint64_t, uint64_t) override;
  Status PunchHole(uint64_t offset, uint64_t length) override;
  Status ZeroRange(uint64_t offset, uint64_t length) override;
  Result<uint64_t> NextData(uint64_t offset) override;
  Result<uint64_t> NextHole(uint64_t offset) override;
  Result<uint64_t> AllocatedBytes() override { return uint64_t{0}; }
  uint64_t bytes_written() const override { return store_.bytes_written(); }
  const std::string& name() const override { return store_.name(); }

 private:
  ExportFile(io::Storage& store, uint64_t capacity) : store_(store), capacity_(capacity) {}
  // Grows the view to `end` (zeroing the new range); kNoSpace past capacity.
  Status GrowTo(uint64_t end);

  io::Storage& store_;
  const uint64_t capacity_;
  std::atomic<uint64_t> size_{0};
};

}  // namespace thindisk::nbdclient
