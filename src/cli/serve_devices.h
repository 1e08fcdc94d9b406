// Views `thindisk serve` puts between an image and its NBD export for
// qemu-nbd's options that change what clients see without touching the
// image format:
//
//  - WindowDevice: bytes [offset, offset + length) of the image as a whole
//    device (qemu-nbd -o OFFSET, and --image-opts driver=raw's offset= and
//    size=). Requests are shifted by offset and refused past the window's
//    end; block status is clipped to the window. The window's size is fixed
//    when it is made, so Resize is refused.
//  - WriteThroughDevice: every write and write-zeroes is made durable
//    before it completes (FUA on each), as qemu's cache=writethrough and
//    cache=directsync (O_DIRECT underneath) promise.
//
// Everything else passes through. Thread safety: as the inner device (the
// views keep no mutable state). Lifetime: they share ownership of the inner
// device; Close closes it.
#pragma once

#include <memory>

#include "block/forwarding_device.h"

namespace thindisk::cli {

class WindowDevice final : public block::ForwardingDevice {
 public:
  // REQUIRES: offset + length <= inner->size() (checked by the caller, which
  // names the option in its error: OpenExportDevice in serve_open.h).
  WindowDevice(std::shared_ptr<block::Device> inner, uint64_t offset, uint64_t length)
      : ForwardingDevice(std::move(inner)), offset_(offset), length_(length) {}

  uint64_t size() const override { return length_; }
  Status Read(uint64_t offset, std::span<uint8_t> buf) override;
  Status Write(uint64_t offset, std::span<const uint8_t> buf,
               block::WriteFlags flags) override;
  Status WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) override;
  Status Discard(uint64_t offset, uint64_t length) override;
  Result<block::Extent> GetStatus(uint64_t offset, uint64_t max_length) override;
  Status Resize(uint64_t new_size, bool shrink) override;
  Result<block::ReadPlan> PlanRead(uint64_t offset, uint64_t length) override;

 private:
  Status Check(uint64_t offset, uint64_t length) const;

  const uint64_t offset_;
  const uint64_t length_;
};

class WriteThroughDevice final : public block::ForwardingDevice {
 public:
  explicit WriteThroughDevice(std::shared_ptr<block::Device> inner)
      : ForwardingDevice(std::move(inner)) {}

  Status Write(uint64_t offset, std::span<const uint8_t> buf,
               block::WriteFlags flags) override {
    flags.fua = true;
    return inner().Write(offset, buf, flags);
  }
  Status WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) override {
    flags.fua = true;
    return inner().WriteZeroes(offset, length, flags);
  }
  Result<block::ReadPlan> PlanRead(uint64_t offset, uint64_t length) override {
    return inner().PlanRead(offset, length);
  }
};

}  // namespace thindisk::cli
