// PayloadBuffer: the memory of one READ or WRITE payload, and the cache
// that lets large payloads reuse memory that is already mapped.
//
// A buffer is 4 KiB-aligned (so an O_DIRECT device needs no bounce copy) and
// not zero-filled on creation (the socket or the device overwrites every
// byte before use).
//
// Why a cache: a 1 MiB buffer is above the C library's mmap threshold, so
// without one each large request maps fresh memory, faults in its 256 pages
// while the data is copied into it and unmaps it afterwards. On a
// virtualized host a page fault costs more than copying the page: 1 MiB
// reads of cached data were served at ~300 MB/s, nearly all of it kernel
// time in page faults and unmapping. Buffers of kCachedPayloadMin bytes or
// more are therefore returned to a process-wide cache on destruction, up to
// kPayloadCacheBytes in all, and handed out again for a request of the same
// rounded size. When the cache is full, a returned buffer evicts cached
// buffers of other sizes (the workload changed) and is kept, or is freed.
//
// Thread safety: PayloadBuffer objects are used by one thread at a time
// (moved between the reader, the pool and the writer); the cache is shared
// and locked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace thindisk::nbd {

inline constexpr size_t kPayloadAlign = 4096;
// Buffers this large and larger go through the cache; smaller ones come
// from the C library's bins, which reuse them anyway.
inline constexpr size_t kCachedPayloadMin = 64u << 10;
// Bytes the cache may hold for the whole process (part of the memory bound
// of docs/serve-limits.md).
inline constexpr size_t kPayloadCacheBytes = 64u << 20;

class PayloadBuffer {
 public:
  PayloadBuffer() = default;
  explicit PayloadBuffer(size_t size);
  ~PayloadBuffer();
  PayloadBuffer(PayloadBuffer&& other) noexcept;
  PayloadBuffer& operator=(PayloadBuffer&& other) noexcept;
  PayloadBuffer(const PayloadBuffer&) = delete;
  PayloadBuffer& operator=(const PayloadBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<uint8_t> span() { return {data_, size_}; }

 private:
  void Release();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;  // size rounded up to kPayloadAlign
};

// What the cache holds now, for tests and diagnostics.
struct PayloadCacheStats {
  size_t cached_bytes = 0;
  size_t cached_buffers = 0;
  uint64_t reuses = 0;  // buffers handed out from the cache so far
};
PayloadCacheStats GetPayloadCacheStats();

}  // namespace thindisk::nbd
