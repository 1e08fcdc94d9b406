// block::Device: a virtual disk as guests and servers see it.
//
// Implemented by the format drivers (qcow2/, raw/); opened by name with
// format probing and backing chains in block/open.h. This header is the only
// part of block/ the drivers depend on (a qcow2 image reads through its
// backing Device), so it is its own header-only library.
//
// Contract:
//  - Thread safety: every method may be called concurrently. Requests on
//    different clusters run in parallel; a read never sees a half-updated
//    mapping; overlapping writes land in some order.
//  - Offsets and lengths are in bytes, any alignment; a request that ends
//    past size() fails with kOutOfRange and does nothing.
//  - No stale bytes: anything never written reads as zeros or as backing data.
//  - Flush: every write completed before Flush is durable when it returns.
//  - Close: flushes, marks the image clean, releases it. Destroying a Device
//    without Close flushes best-effort.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "util/result.h"
#include "util/status.h"

namespace thindisk::io {
class Storage;
}  // namespace thindisk::io

namespace thindisk::block {

struct WriteFlags {
  bool fua = false;  // durable when the write returns (NBD FUA)
};

struct ZeroFlags {
  bool may_unmap = false;  // may free host space (NBD: !NO_HOLE)
  bool fast_only = false;  // fail with kNotSupported rather than write zeros slowly (NBD FAST_ZERO)
  bool fua = false;
};

// One run of guest bytes with the same allocation state, as qemu-img map
// reports it and NBD base:allocation / qemu:allocation-depth need it.
struct Extent {
  uint64_t offset = 0;  // guest offset
  uint64_t length = 0;
  bool data = false;  // some layer stores bytes for it (false: hole)
  bool zero = false;  // reads as zeros (true for holes at the bottom of the chain)
  // Layer that provides the content: 0 = this image, 1 = its backing file, ...
  // For a range no layer allocates, present = false and depth is that of the
  // bottom layer (the number of backing files), as qemu-img map reports it.
  uint32_t depth = 0;
  bool present = false;
  // Where the data lives in that layer's host file, when it is stored plainly
  // (not compressed, not a hole); has_host_offset false otherwise.
  bool has_host_offset = false;
  uint64_t host_offset = 0;
};

struct DeviceInfo {
  std::string format;           // "qcow2", "raw"
  std::string filename;         // as opened
  uint32_t cluster_size = 0;    // 0 for raw
  uint32_t preferred_block = 4096;  // subcluster (or cluster) size: NBD preferred block size
  bool read_only = false;
};

// One piece of a planned read (Device::PlanRead): `length` bytes for the
// caller's buffer at `buf_offset`, read from `storage` at `host_offset`
// through storage->ReadFd() (which reads as ReadAt does; where it is -1
// the caller uses Read instead), or zeros when `storage` is null.
struct ReadPiece {
  uint64_t buf_offset = 0;
  uint64_t length = 0;
  io::Storage* storage = nullptr;
  uint64_t host_offset = 0;
};

// Where the bytes of a guest range are, for a caller that reads the host
// files itself (the NBD server submits many reads at once). The pieces
// cover the range in order. While the plan lives, each host range it
// names holds the bytes the guest range had when it was planned, or what
// later writes put there: the pins hold off the engine's freeing (and so
// reuse) of its host clusters, as a Read in progress does. Destroying the
// plan releases them.
struct ReadPlan {
  std::vector<ReadPiece> pieces;
  std::vector<std::shared_ptr<const void>> pins;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual uint64_t size() const = 0;
  virtual const DeviceInfo& info() const = 0;

  virtual Status Read(uint64_t offset, std::span<uint8_t> buf) = 0;
  virtual Status Write(uint64_t offset, std::span<const uint8_t> buf, WriteFlags flags = {}) = 0;
  virtual Status WriteZeroes(uint64_t offset, uint64_t length, ZeroFlags flags = {}) = 0;
  // After OK the range reads as zeros (never old bytes; for a clone, zeros,
  // not backing data) and its host space is released where possible.
  virtual Status Discard(uint64_t offset, uint64_t length) = 0;
  virtual Status Flush() = 0;
  // The extent that starts at `offset`, at most `max_length` long, following
  // the backing chain.
  virtual Result<Extent> GetStatus(uint64_t offset, uint64_t max_length) = 0;
  // Grows (new space reads as zeros) or, with shrink=true, cuts the device.
  virtual Status Resize(uint64_t new_size, bool shrink = false) = 0;
  virtual Status Close() = 0;

  // What Read(offset, buf of `length`) would read, as a ReadPlan, without
  // reading: not even metadata, so a plan never waits for the disk.
  // kNotSupported where some piece only Read can produce (compressed
  // clusters, a view that changes what it reads) or where a table that
  // says where the bytes are is not in memory: the caller then uses Read.
  // Errors as Read's.
  virtual Result<ReadPlan> PlanRead(uint64_t /*offset*/, uint64_t /*length*/) {
    return Status::NotSupported("this device reads only through Read");
  }
};

}  // namespace thindisk::block
