// RbdStorage: io::Storage over an existing RBD image (librbd), so the block
// images operators already have can be served, converted, and used as the
// backing file of a thindisk clone. block::Open opens an rbd: name as raw
// unless a format is given (block/open.h).
//
// Mapping (librbd C++ API):
//  - ReadAt/WriteAt: Image::read/write; reads past the image's end are
//    zeros, writes past it grow the image first (a qcow2 file on RBD).
//  - Flush: Image::flush (librbd's cache, if enabled, written back; every
//    acknowledged write is on the OSDs).
//  - PunchHole: Image::discard. ZeroRange: Image::write_zeroes.
//  - Resize: Image::resize. Allocate: kNotSupported (RBD is thin).
//  - NextData/NextHole: Image::diff_iterate2 over whole objects, from the
//    object map when the image has fast-diff (one call, no object reads);
//    without it librbd stats objects, so a call looks at most
//    kMaxScanBytes ahead and then answers "data" (safe: a hole reported as
//    data only costs a read of zeros).
//  - AllocatedBytes: the objects' bytes by the same diff, with fast-diff
//    only (else 0: unknown).
//
// A snapshot (rbd:POOL/IMAGE@SNAP) opens read-only; a writable open of one
// is refused.
//
// One writer: a read-write open of an image with the exclusive-lock feature
// takes the lock for good (Image::lock_acquire, as rbd-nbd --exclusive
// does), so librbd never hands it to another client behind our back; a
// second writer gets kBusy. Images without the feature have no lock (RBD's
// own rule); a read-only open never locks.
//
// Thread safety: librbd images take concurrent I/O; all methods may be
// called concurrently (storage.h).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <rbd/librbd.hpp>
#include <string>

#include "io/rados_cluster.h"
#include "io/rbd_name.h"
#include "io/storage.h"

namespace thindisk::io {

// Opens rbd:POOL/IMAGE[@SNAP][:conf=..][:id=..]. kNotFound for a missing
// pool, image or snapshot; kBusy when another client holds the image's
// exclusive lock and this open would write.
Result<std::unique_ptr<Storage>> OpenRbd(const std::string& name,
                                         const OpenOptions& options);

class RbdStorage final : public Storage {
 public:
  static constexpr uint64_t kMaxScanBytes = uint64_t(64) << 30;  // without fast-diff

  ~RbdStorage() override;
  RbdStorage(const RbdStorage&) = delete;
  RbdStorage& operator=(const RbdStorage&) = delete;

  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override;
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override;
  Status Flush() override;
  Result<uint64_t> Size() override { return size_.load(); }
  Status Resize(uint64_t size) override;
  Status Allocate(uint64_t offset, uint64_t length) override;
  Status PunchHole(uint64_t offset, uint64_t length) override;
  Status ZeroRange(uint64_t offset, uint64_t length) override;
  Result<uint64_t> NextData(uint64_t offset) override;
  Result<uint64_t> NextHole(uint64_t offset) override;
  Result<uint64_t> AllocatedBytes() override;
  uint64_t bytes_written() const override { return bytes_written_.load(); }
  const std::string& name() const override { return what_; }

 private:
  friend Result<std::unique_ptr<Storage>> OpenRbd(const std::string&, const OpenOptions&);

  RbdStorage(std::shared_ptr<RadosCluster> cluster, librados::IoCtx io, std::string what,
             bool read_only);
  Status Error(int ret, const std::string& op) const;
  Status CheckWritable() const;
  // Grows the image to `end` bytes if it is smaller (writes past the end).
  Status GrowTo(uint64_t end);
  // The first extent at or after `offset` whose "exists" is `want`, by the
  // whole-object diff; `size_` when there is none in reach.
  Result<uint64_t> Next(uint64_t offset, bool want);

  // Declaration order = destruction order reversed: the image closes before
  // the I/O context and the connection it uses.
  const std::shared_ptr<RadosCluster> cluster_;
  librados::IoCtx io_;
  librbd::Image image_;
  const std::string what_;
  const bool read_only_;
  bool fast_diff_ = false;  // the object map answers diffs (set at open)
  std::atomic<uint64_t> size_{0};
  std::atomic<uint64_t> bytes_written_{0};
  std::mutex resize_mu_;  // serializes growth (writes past the end) and Resize
};

}  // namespace thindisk::io
