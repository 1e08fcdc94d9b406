// block::ForwardingDevice: a Device that passes every call to an inner one.
//
// The base of views that change a few calls and leave the rest alone (the
// server's discard/detect-zeroes filter, qemu-nbd's -o window, the
// write-through view of cache=writethrough): each overrides what it changes
// and reaches the image through inner().
//
// Thread safety: as the inner device (it keeps no state of its own).
// Lifetime: it shares ownership of the inner device; Close closes it.
#pragma once

#include <memory>
#include <utility>

#include "block/device.h"

namespace thindisk::block {

class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(std::shared_ptr<Device> inner) : inner_(std::move(inner)) {}

  uint64_t size() const override { return inner_->size(); }
  const DeviceInfo& info() const override { return inner_->info(); }
  Status Read(uint64_t offset, std::span<uint8_t> buf) override { return inner_->Read(offset, buf); }
  Status Write(uint64_t offset, std::span<const uint8_t> buf, WriteFlags flags) override {
    return inner_->Write(offset, buf, flags);
  }
  Status WriteZeroes(uint64_t offset, uint64_t length, ZeroFlags flags) override {
    return inner_->WriteZeroes(offset, length, flags);
  }
  Status Discard(uint64_t offset, uint64_t length) override {
    return inner_->Discard(offset, length);
  }
  Status Flush() override { return inner_->Flush(); }
  Result<Extent> GetStatus(uint64_t offset, uint64_t max_length) override {
    return inner_->GetStatus(offset, max_length);
  }
  Status Resize(uint64_t new_size, bool shrink) override {
    return inner_->Resize(new_size, shrink);
  }
  Status Close() override { return inner_->Close(); }

 protected:
  Device& inner() const { return *inner_; }

 private:
  std::shared_ptr<Device> inner_;
};

}  // namespace thindisk::block
