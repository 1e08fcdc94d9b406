#include "nbd/testing/memory_device.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace thindisk::nbd::testing {

MemoryDevice::MemoryDevice(uint64_t size, bool read_only)
    : size_(size), data_(size), allocated_((size + kBlock - 1) / kBlock) {
  info_.format = "memory";
  info_.filename = "memory";
  info_.preferred_block = uint32_t(kBlock);
  info_.read_only = read_only;
}

Status MemoryDevice::Check(uint64_t offset, uint64_t length) const {
  if (offset > size_ || length > size_ - offset) return Status::OutOfRange("beyond end");
  return Status::Ok();
}

Status MemoryDevice::Read(uint64_t offset, std::span<uint8_t> buf) {
  TD_RETURN_IF_ERROR(Check(offset, buf.size()));
  if (fail_reads_) return Status(Code::kIoError, "injected read failure", 5);
  std::lock_guard<std::mutex> lock(mu_);
  std::copy_n(data_.begin() + offset, buf.size(), buf.begin());
  return Status::Ok();
}

Status MemoryDevice::Write(uint64_t offset, std::span<const uint8_t> buf,
                           block::WriteFlags flags) {
  TD_RETURN_IF_ERROR(Check(offset, buf.size()));
  if (info_.read_only) return Status::ReadOnly("read-only device");
  const size_t now = ++concurrent_writes_;
  size_t seen = max_concurrent_writes_.load();
  while (now > seen && !max_concurrent_writes_.compare_exchange_weak(seen, now)) {
  }
  if (int ms = write_delay_ms_.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  --concurrent_writes_;
  if (flags.fua) ++fua_writes_;
  std::lock_guard<std::mutex> lock(mu_);
  write_threads_.insert(std::this_thread::get_id());
  last_write_thread_ = std::this_thread::get_id();
  std::copy(buf.begin(), buf.end(), data_.begin() + offset);
  for (uint64_t b = offset / kBlock; b * kBlock < offset + buf.size(); ++b)
    allocated_[b] = true;
  return Status::Ok();
}

size_t MemoryDevice::write_threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return write_threads_.size();
}

void MemoryDevice::ZeroRange(uint64_t offset, uint64_t length, bool unmap) {
  std::fill_n(data_.begin() + offset, length, 0);
  for (uint64_t b = offset / kBlock; b * kBlock < offset + length; ++b) {
    const bool whole =
        b * kBlock >= offset && std::min((b + 1) * kBlock, size_) <= offset + length;
    if (unmap && whole) {
      allocated_[b] = false;
    } else if (!unmap) {
      allocated_[b] = true;
    }
  }
}

Status MemoryDevice::WriteZeroes(uint64_t offset, uint64_t length,
                                 block::ZeroFlags flags) {
  TD_RETURN_IF_ERROR(Check(offset, length));
  if (info_.read_only) return Status::ReadOnly("read-only device");
  if (flags.fast_only && slow_zeroes_)
    return Status::NotSupported("zeroing is slow here");
  std::lock_guard<std::mutex> lock(mu_);
  ZeroRange(offset, length, flags.may_unmap);
  return Status::Ok();
}

Status MemoryDevice::Discard(uint64_t offset, uint64_t length) {
  TD_RETURN_IF_ERROR(Check(offset, length));
  if (info_.read_only) return Status::ReadOnly("read-only device");
  std::lock_guard<std::mutex> lock(mu_);
  ZeroRange(offset, length, /*unmap=*/true);
  return Status::Ok();
}

Status MemoryDevice::Flush() {
  ++flushes_;
  std::lock_guard<std::mutex> lock(mu_);
  last_flush_thread_ = std::this_thread::get_id();
  return Status::Ok();
}

std::thread::id MemoryDevice::last_write_thread() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_write_thread_;
}

std::thread::id MemoryDevice::last_flush_thread() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_flush_thread_;
}

Result<block::Extent> MemoryDevice::GetStatus(uint64_t offset, uint64_t max_length) {
  if (offset >= size_ || max_length == 0) return Status::OutOfRange("beyond end");
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t end = offset + std::min(max_length, size_ - offset);
  const bool state = allocated_[offset / kBlock];
  uint64_t pos = (offset / kBlock + 1) * kBlock;
  while (pos < end && allocated_[pos / kBlock] == state) pos += kBlock;
  block::Extent e;
  e.offset = offset;
  e.length = std::min(pos, end) - offset;
  e.data = state;
  e.zero = !state;
  e.present = state;
  e.depth = state ? 0 : 1;
  return e;
}

Status MemoryDevice::Resize(uint64_t, bool) { return Status::NotSupported("resize"); }

std::vector<uint8_t> MemoryDevice::Contents() const {
  std::lock_guard<std::mutex> lock(mu_);
  return data_;
}

}  // namespace thindisk::nbd::testing
