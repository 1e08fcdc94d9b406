#include "io/latency_storage.h"

#include <thread>

namespace thindisk::io {

void LatencyStorage::Wait() const {
  // No lock is held here: concurrent requests sleep side by side.
  if (latency_.count() > 0) std::this_thread::sleep_for(latency_);
}

Status LatencyStorage::ReadAt(uint64_t offset, std::span<uint8_t> buf) {
  Wait();
  return inner().ReadAt(offset, buf);
}

Status LatencyStorage::WriteAt(uint64_t offset, std::span<const uint8_t> buf) {
  Wait();
  return inner().WriteAt(offset, buf);
}

Status LatencyStorage::Flush() {
  Wait();
  return inner().Flush();
}

Status LatencyStorage::Resize(uint64_t size) {
  Wait();
  return inner().Resize(size);
}

Status LatencyStorage::Allocate(uint64_t offset, uint64_t length) {
  Wait();
  return inner().Allocate(offset, length);
}

Status LatencyStorage::PunchHole(uint64_t offset, uint64_t length) {
  Wait();
  return inner().PunchHole(offset, length);
}

Status LatencyStorage::ZeroRange(uint64_t offset, uint64_t length) {
  Wait();
  return inner().ZeroRange(offset, length);
}

Result<uint64_t> LatencyStorage::NextData(uint64_t offset) {
  Wait();
  return inner().NextData(offset);
}

Result<uint64_t> LatencyStorage::NextHole(uint64_t offset) {
  Wait();
  return inner().NextHole(offset);
}

}  // namespace thindisk::io
