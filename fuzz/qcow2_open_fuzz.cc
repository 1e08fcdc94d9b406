// libFuzzer target: hostile bytes as a qcow2 file. They are opened (no
// backing), read in a few places, written, discarded, flushed, closed and
// checked; any outcome but a crash, a sanitizer report or a hang is fine
// (DESIGN.md rule 4: bad input is an error, never a crash).
#include <cstdint>
#include <cstring>
#include <vector>

#include "io/memory_storage.h"
#include "qcow2/check.h"
#include "qcow2/image.h"

namespace {

using namespace thindisk;

// Inputs larger than this add nothing a head of this size does not.
constexpr size_t kMaxInput = 1 << 20;

void Exercise(qcow2::Image& img) {
  const uint64_t size = img.size();
  std::vector<uint8_t> buf(4096);
  for (uint64_t at : {uint64_t{0}, size / 2, size > 4096 ? size - 4096 : 0}) {
    uint64_t n = std::min<uint64_t>(buf.size(), size - std::min(at, size));
    (void)img.Read(at, std::span<uint8_t>(buf.data(), n));
    (void)img.GetStatus(at, 1 << 20);
  }
  if (size >= 1024) {
    std::memset(buf.data(), 0xa5, 1024);
    (void)img.Write(size / 3, std::span<const uint8_t>(buf.data(), 1024), {});
    (void)img.Discard(0, std::min<uint64_t>(size, 1 << 16));
    (void)img.Read(size / 3, std::span<uint8_t>(buf.data(), 1024));
  }
  (void)img.Flush();
  (void)img.Close();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  auto mem = io::NewMemoryStorage("fuzz.qcow2");
  if (!mem->WriteAt(0, std::span<const uint8_t>(data, size)).ok()) return 0;
  auto for_check = mem->Clone();
  qcow2::OpenOptions o;
  o.no_backing = true;
  o.cache_bytes = 4 << 20;
  auto img = qcow2::Image::Open(std::move(mem), o);
  if (img) Exercise(**img);
  (void)qcow2::Check(*for_check, qcow2::RepairMode::kNone);
  (void)qcow2::Check(*for_check, qcow2::RepairMode::kAll);
  return 0;
}
