// FilterDevice: a block::Device in front of another that applies the
// server's discard and zero-detection policies (qemu's discard= and
// detect-zeroes= options), so `thindisk serve` can offer them for any format.
//
//  - Discard::kIgnore: TRIM is acknowledged and does nothing (the data stays
//    readable, host space is not released), and WriteZeroes never unmaps.
//  - DetectZeroes::kOn: a Write whose payload is all zeros becomes
//    WriteZeroes without unmap (the driver may then record a zero cluster
//    instead of storing bytes); kUnmap also allows unmapping, but only when
//    discards are honoured (Discard::kUnmap), as in qemu.
//
// Everything else passes straight through. Thread safety: as the inner
// device (the filter keeps no state of its own).
#pragma once

#include <memory>

#include "block/device.h"

namespace thindisk::nbd {

struct FilterOptions {
  enum class Discard { kIgnore, kUnmap };
  enum class DetectZeroes { kOff, kOn, kUnmap };
  Discard discard = Discard::kUnmap;
  DetectZeroes detect_zeroes = DetectZeroes::kOff;

  // True when the options change nothing (no filter needed).
  bool passthrough() const {
    return discard == Discard::kUnmap && detect_zeroes == DetectZeroes::kOff;
  }
};

class FilterDevice final : public block::Device {
 public:
  FilterDevice(std::shared_ptr<block::Device> inner, FilterOptions options)
      : inner_(std::move(inner)), options_(options) {}

  uint64_t size() const override { return inner_->size(); }
  const block::DeviceInfo& info() const override { return inner_->info(); }
  Status Read(uint64_t offset, std::span<uint8_t> buf) override {
    return inner_->Read(offset, buf);
  }
  Status Write(uint64_t offset, std::span<const uint8_t> buf,
               block::WriteFlags flags) override;
  Status WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) override;
  Status Discard(uint64_t offset, uint64_t length) override;
  Status Flush() override { return inner_->Flush(); }
  Result<block::Extent> GetStatus(uint64_t offset, uint64_t max_length) override {
    return inner_->GetStatus(offset, max_length);
  }
  Status Resize(uint64_t new_size, bool shrink) override {
    return inner_->Resize(new_size, shrink);
  }
  Status Close() override { return inner_->Close(); }

  block::Device* inner() const { return inner_.get(); }

 private:
  std::shared_ptr<block::Device> inner_;
  FilterOptions options_;
};

}  // namespace thindisk::nbd
