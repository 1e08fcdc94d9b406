// MemoryDevice: a block::Device held in a vector, for NBD server tests.
//
// Allocation is tracked per kBlock bytes so block status and structured
// reads see real holes: never-written and discarded blocks are holes that
// read as zeros; WriteZeroes without may_unmap allocates. Counters and a
// fault switch let tests check what reached the device.
//
// Thread safety: every method may be called concurrently (one mutex).
#pragma once

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "block/device.h"

namespace thindisk::nbd::testing {

class MemoryDevice : public block::Device {
 public:
  static constexpr uint64_t kBlock = 4096;

  explicit MemoryDevice(uint64_t size, bool read_only = false);

  uint64_t size() const override { return size_; }
  const block::DeviceInfo& info() const override { return info_; }
  Status Read(uint64_t offset, std::span<uint8_t> buf) override;
  Status Write(uint64_t offset, std::span<const uint8_t> buf,
               block::WriteFlags flags) override;
  Status WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) override;
  Status Discard(uint64_t offset, uint64_t length) override;
  Status Flush() override;
  Result<block::Extent> GetStatus(uint64_t offset, uint64_t max_length) override;
  Status Resize(uint64_t new_size, bool shrink) override;
  Status Close() override { return Flush(); }

  // Test hooks.
  std::vector<uint8_t> Contents() const;
  size_t flushes() const { return flushes_.load(); }
  size_t fua_writes() const { return fua_writes_.load(); }
  // The most Write calls that were ever running at the same time.
  size_t max_concurrent_writes() const { return max_concurrent_writes_.load(); }
  // How many different threads have called Write.
  size_t write_threads() const;
  // The threads that made the last Write and the last Flush.
  std::thread::id last_write_thread() const;
  std::thread::id last_flush_thread() const;
  void set_fail_reads(bool fail) { fail_reads_ = fail; }
  // WriteZeroes with fast_only fails with kNotSupported (a device that
  // cannot zero quickly).
  void set_slow_zeroes(bool slow) { slow_zeroes_ = slow; }
  // Every Write sleeps this long first (to hold requests in flight).
  void set_write_delay_ms(int ms) { write_delay_ms_ = ms; }

 private:
  Status Check(uint64_t offset, uint64_t length) const;
  void ZeroRange(uint64_t offset, uint64_t length, bool unmap);  // REQUIRES: mu_ held

  uint64_t size_;
  block::DeviceInfo info_;
  mutable std::mutex mu_;
  std::vector<uint8_t> data_;    // guarded by mu_
  std::vector<bool> allocated_;  // per kBlock, guarded by mu_
  std::set<std::thread::id> write_threads_;  // guarded by mu_
  std::thread::id last_write_thread_;        // guarded by mu_
  std::thread::id last_flush_thread_;        // guarded by mu_
  std::atomic<size_t> flushes_{0};
  std::atomic<size_t> fua_writes_{0};
  std::atomic<bool> fail_reads_{false};
  std::atomic<int> write_delay_ms_{0};
  std::atomic<bool> slow_zeroes_{false};
  std::atomic<size_t> concurrent_writes_{0};
  std::atomic<size_t> max_concurrent_writes_{0};
};

}  // namespace thindisk::nbd::testing
