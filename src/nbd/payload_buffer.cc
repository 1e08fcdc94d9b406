#include "nbd/payload_buffer.h"

#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace thindisk::nbd {
namespace {

uint8_t* Allocate(size_t capacity) {
  return static_cast<uint8_t*>(::operator new[](capacity, std::align_val_t(kPayloadAlign)));
}

void Free(uint8_t* p) { ::operator delete[](p, std::align_val_t(kPayloadAlign)); }

class PayloadCache {
 public:
  // Never destroyed: buffers may come back from threads still running at
  // exit. What it holds stays reachable (no leak report).
  static PayloadCache& Get() {
    static auto* cache = new PayloadCache;
    return *cache;
  }

  uint8_t* Take(size_t capacity) {
    {
      util::MutexLock lock(mu_);
      auto it = free_.find(capacity);
      if (it != free_.end()) {
        uint8_t* p = it->second.back();
        it->second.pop_back();
        if (it->second.empty()) free_.erase(it);
        cached_bytes_ -= capacity;
        --cached_buffers_;
        ++reuses_;
        return p;
      }
    }
    return Allocate(capacity);
  }

  void Give(uint8_t* p, size_t capacity) {
    std::vector<uint8_t*> evicted;
    bool kept = false;
    {
      util::MutexLock lock(mu_);
      // Full: make room by dropping buffers of other sizes.
      for (auto it = free_.begin(); cached_bytes_ + capacity > kPayloadCacheBytes &&
                                    it != free_.end();) {
        if (it->first == capacity) {
          ++it;
          continue;
        }
        while (!it->second.empty() && cached_bytes_ + capacity > kPayloadCacheBytes) {
          evicted.push_back(it->second.back());
          it->second.pop_back();
          cached_bytes_ -= it->first;
          --cached_buffers_;
        }
        it = it->second.empty() ? free_.erase(it) : std::next(it);
      }
      if (cached_bytes_ + capacity <= kPayloadCacheBytes) {
        free_[capacity].push_back(p);
        cached_bytes_ += capacity;
        ++cached_buffers_;
        kept = true;
      }
    }
    for (uint8_t* e : evicted) Free(e);  // outside the lock
    if (!kept) Free(p);
  }

  PayloadCacheStats Stats() {
    util::MutexLock lock(mu_);
    return {cached_bytes_, cached_buffers_, reuses_};
  }

 private:
  util::Mutex mu_;
  std::unordered_map<size_t, std::vector<uint8_t*>> free_
      TD_GUARDED_BY(mu_);  // capacity -> buffers
  size_t cached_bytes_ TD_GUARDED_BY(mu_) = 0;
  size_t cached_buffers_ TD_GUARDED_BY(mu_) = 0;
  uint64_t reuses_ TD_GUARDED_BY(mu_) = 0;
};

size_t RoundUp(size_t size) { return (size + kPayloadAlign - 1) & ~(kPayloadAlign - 1); }

}  // namespace

PayloadBuffer::PayloadBuffer(size_t size) : size_(size), capacity_(RoundUp(size)) {
  if (size == 0) return;
  data_ = capacity_ >= kCachedPayloadMin ? PayloadCache::Get().Take(capacity_)
                                         : Allocate(capacity_);
}

PayloadBuffer::~PayloadBuffer() { Release(); }

PayloadBuffer::PayloadBuffer(PayloadBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)) {}

PayloadBuffer& PayloadBuffer::operator=(PayloadBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void PayloadBuffer::Release() {
  if (data_ == nullptr) return;
  if (capacity_ >= kCachedPayloadMin) {
    PayloadCache::Get().Give(data_, capacity_);
  } else {
    Free(data_);
  }
  data_ = nullptr;
  size_ = capacity_ = 0;
}

PayloadCacheStats GetPayloadCacheStats() { return PayloadCache::Get().Stats(); }

}  // namespace thindisk::nbd
