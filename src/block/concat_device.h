// block::ConcatDevice: several devices one after another, read-only, as
// qemu-img convert reads several source images into one target.
//
// As in qemu-img, each part counts its size rounded up to whole 512-byte
// sectors: a 1000-byte raw part takes 1024 bytes and the next part starts
// there; the padding reads as zeros and its block status is a zero hole.
// Requests that cross parts are split; block status never crosses a part
// (an extent ends where its part does). Block status of a part is reported
// as the part reports it, shifted, without host offsets (they name
// different files).
//
// Thread safety: as the parts (block::Device contract). Lifetime: it owns
// the parts; Close closes each and returns the first error.
#pragma once

#include <memory>
#include <vector>

#include "block/read_only_image.h"

namespace thindisk::block {

class ConcatDevice final : public ReadOnlyImage {
 public:
  // REQUIRES: parts is not empty. info() is the first part's, named after
  // every part ("a.raw + b.raw").
  explicit ConcatDevice(std::vector<std::unique_ptr<Device>> parts);

  Status Read(uint64_t offset, std::span<uint8_t> buf) override;
  Result<Extent> GetStatus(uint64_t offset, uint64_t max_length) override;
  Status Close() override;

 private:
  // `starts` is Starts(parts), computed once (rvalue references: nothing
  // is moved before the delegating constructor has read `parts`).
  ConcatDevice(std::vector<uint64_t>&& starts,
               std::vector<std::unique_ptr<Device>>&& parts);

  // Index of the part that holds `offset` (< size()).
  size_t PartAt(uint64_t offset) const;

  std::vector<std::unique_ptr<Device>> parts_;
  std::vector<uint64_t> starts_;  // starts_[i]: where part i begins; starts_.back(): size
};

}  // namespace thindisk::block
