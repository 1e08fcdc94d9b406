// block::ReadOnlyImage: the shared half of the import drivers (vmdk/, vhd/):
// image formats thindisk reads (info, map, compare, convert, backing files)
// but never writes.
//
// It owns the size and DeviceInfo, the range checks, and the refusals:
// every write-side call returns kReadOnly with "<format> images are
// read-only in thindisk (import with convert)". Subclasses implement Read
// and GetStatus, calling CheckRead / StatusEnd first.
//
// PlainStatus serves formats whose data sits in one run of a host file
// (raw files, fixed VHD, flat VMDK extents): host holes read as zeros, so
// they are reported as zero extents without data. CheckRange and
// StatusRangeEnd are the range checks every driver's requests share (raw
// uses them too).
//
// Thread safety: all methods may be called concurrently (block::Device).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "block/device.h"
#include "io/storage.h"
#include "util/result.h"
#include "util/status.h"

namespace thindisk::block {

// What a write to an import-only format gets, and what block::Open says
// when one is opened for writing.
inline std::string ReadOnlyFormatMessage(const std::string& format) {
  return format + " images are read-only in thindisk (import with convert)";
}

// kOutOfRange unless [offset, offset+length) lies inside a device of `size`
// bytes.
inline Status CheckRange(uint64_t size, uint64_t offset, uint64_t length) {
  if (offset > size || length > size - offset) {
    return Status::OutOfRange("request [" + std::to_string(offset) + ", +" +
                              std::to_string(length) + ") ends past the device size " +
                              std::to_string(size));
  }
  return Status::Ok();
}

// The end of a GetStatus answer on a device of `size` bytes: offset +
// max_length clipped to the size. Errors: offset at or past the end, an
// empty range.
inline Result<uint64_t> StatusRangeEnd(uint64_t size, uint64_t offset, uint64_t max_length) {
  if (offset >= size) {
    return Status::OutOfRange("block status at " + std::to_string(offset) +
                              " is past the device size " + std::to_string(size));
  }
  if (max_length == 0) return Status::InvalidArgument("block status of an empty range");
  return offset + std::min(max_length, size - offset);
}

class ReadOnlyImage : public Device {
 public:
  uint64_t size() const override { return size_; }
  const DeviceInfo& info() const override { return info_; }

  Status Write(uint64_t, std::span<const uint8_t>, WriteFlags = {}) override { return Refuse(); }
  Status WriteZeroes(uint64_t, uint64_t, ZeroFlags = {}) override { return Refuse(); }
  Status Discard(uint64_t, uint64_t) override { return Refuse(); }
  Status Resize(uint64_t, bool = false) override { return Refuse(); }
  Status Flush() override { return CheckOpen(); }  // nothing is ever dirty
  Status Close() override {
    closed_.store(true);
    return Status::Ok();
  }

 protected:
  ReadOnlyImage(DeviceInfo info, uint64_t size) : size_(size), info_(std::move(info)) {
    info_.read_only = true;
  }

  Status CheckOpen() const {
    if (closed_.load()) return Status::InvalidArgument(info_.filename + ": device is closed");
    return Status::Ok();
  }

  // kOutOfRange unless [offset, offset+length) lies inside the device.
  Status CheckRead(uint64_t offset, uint64_t length) const {
    TD_RETURN_IF_ERROR(CheckOpen());
    return CheckRange(size_, offset, length);
  }

  // The end of a GetStatus answer: offset + max_length clipped to the size.
  // Errors: closed, offset at or past the end, an empty range.
  Result<uint64_t> StatusEnd(uint64_t offset, uint64_t max_length) const {
    TD_RETURN_IF_ERROR(CheckOpen());
    return StatusRangeEnd(size_, offset, max_length);
  }

 private:
  Status Refuse() const {
    TD_RETURN_IF_ERROR(CheckOpen());
    return Status::ReadOnly(info_.filename + ": " + ReadOnlyFormatMessage(info_.format));
  }

  const uint64_t size_;
  DeviceInfo info_;
  std::atomic<bool> closed_{false};
};

// The extent at guest `offset` (at most `length` bytes, > 0) of data stored
// plainly at `host_offset` in `storage`: data up to the next host hole, or a
// zero extent (no data, present) up to the next host data.
inline Result<Extent> PlainStatus(io::Storage& storage, uint64_t offset, uint64_t host_offset,
                                  uint64_t length) {
  Extent e;
  e.offset = offset;
  e.present = true;
  e.has_host_offset = true;
  e.host_offset = host_offset;
  const uint64_t host_end = host_offset + length;
  TD_ASSIGN_OR_RETURN(uint64_t next_data, storage.NextData(host_offset));
  if (next_data <= host_offset) {
    TD_ASSIGN_OR_RETURN(uint64_t next_hole, storage.NextHole(host_offset));
    // A storage that can't tell reports data to the end; a hole at or
    // before host_offset would contradict NextData, so it is the end too.
    uint64_t stop = next_hole > host_offset ? std::min(next_hole, host_end) : host_end;
    e.length = stop - host_offset;
    e.data = true;
  } else {
    e.length = std::min(next_data, host_end) - host_offset;
    e.zero = true;
  }
  return e;
}

}  // namespace thindisk::block
