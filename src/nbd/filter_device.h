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

#include "block/forwarding_device.h"

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

class FilterDevice final : public block::ForwardingDevice {
 public:
  FilterDevice(std::shared_ptr<block::Device> inner, FilterOptions options)
      : ForwardingDevice(std::move(inner)), options_(options) {}

  Status Write(uint64_t offset, std::span<const uint8_t> buf,
               block::WriteFlags flags) override;
  Status WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) override;
  Status Discard(uint64_t offset, uint64_t length) override;
  // Reads pass through unchanged, so do their plans.
  Result<block::ReadPlan> PlanRead(uint64_t offset, uint64_t length) override {
    return inner().PlanRead(offset, length);
  }

 private:
  FilterOptions options_;
};

}  // namespace thindisk::nbd
