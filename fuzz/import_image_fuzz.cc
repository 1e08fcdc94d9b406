// libFuzzer target: hostile bytes as an image to import, VMDK or VHD (the
// formats `convert` and `info` read from files someone else made). The bytes
// are probed as both formats and opened as both, whatever the probe says;
// an open image is read in a few places, its block status walked and its
// size asked, as `convert` and `map` do. Any outcome but a crash, a
// sanitizer report or a hang is fine (DESIGN.md rule 4: bad input is an
// error, never a crash).
//
// A VMDK text descriptor names an extent file; here every name opens a copy
// of the same bytes, so one input can be a descriptor, its extent, or both.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "io/memory_storage.h"
#include "vhd/vhd_image.h"
#include "vmdk/vmdk_image.h"

namespace {

using namespace thindisk;

// Inputs larger than this add nothing a head of this size does not.
constexpr size_t kMaxInput = 1 << 20;
// Block-status steps walked from the start: enough to cross a few grain
// tables or BAT blocks without making one input slow.
constexpr int kStatusSteps = 64;

void Exercise(block::Device& image) {
  const uint64_t size = image.size();
  std::vector<uint8_t> buf(64 << 10);
  for (uint64_t at : {uint64_t{0}, size / 3, size / 2, size > 4096 ? size - 4096 : 0}) {
    const uint64_t n = std::min<uint64_t>(buf.size(), size - std::min(at, size));
    (void)image.Read(at, std::span<uint8_t>(buf.data(), n));
  }
  // An unaligned read that crosses a grain or block boundary.
  if (size > 70000) (void)image.Read(65000, std::span<uint8_t>(buf.data(), 5000));
  uint64_t at = 0;
  for (int i = 0; i < kStatusSteps && at < size; ++i) {
    auto extent = image.GetStatus(at, size - at);
    if (!extent || extent->length == 0) break;
    at = extent->offset + extent->length;
  }
}

std::unique_ptr<io::Storage> Copy(const uint8_t* data, size_t size,
                                  const std::string& name) {
  auto mem = io::NewMemoryStorage(name);
  if (!mem->WriteAt(0, std::span<const uint8_t>(data, size)).ok()) return nullptr;
  return mem;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;

  if (auto probe = Copy(data, size, "fuzz.vmdk")) (void)vmdk::Probe(*probe);
  if (auto storage = Copy(data, size, "fuzz.vmdk")) {
    auto open_extent = [data,
                        size](const std::string& name) -> Result<vmdk::OpenedExtent> {
      vmdk::OpenedExtent extent;
      extent.path = name;
      extent.storage = Copy(data, size, name);
      if (!extent.storage) return Status::Internal("could not copy the input");
      return extent;
    };
    auto image = vmdk::VmdkImage::Open(std::move(storage), "fuzz.vmdk", open_extent);
    if (image) {
      Exercise(**image);
      (void)(*image)->AllocatedBytes();
    }
  }

  if (auto probe = Copy(data, size, "fuzz.vhd")) (void)vhd::Probe(*probe);
  if (auto storage = Copy(data, size, "fuzz.vhd")) {
    auto image = vhd::VhdImage::Open(std::move(storage), "fuzz.vhd");
    if (image) Exercise(**image);
  }
  return 0;
}
