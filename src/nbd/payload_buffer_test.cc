// The payload cache: large buffers are reused instead of mapped afresh,
// within the cap; small ones bypass it.
#include "nbd/payload_buffer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

namespace thindisk::nbd {
namespace {

TEST(PayloadBufferTest, AlignedWritableAndMovable) {
  PayloadBuffer a(1 << 20);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % kPayloadAlign, 0u);
  std::memset(a.data(), 0xab, a.size());
  uint8_t* p = a.data();
  PayloadBuffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 1u << 20);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT: moved-from is empty by contract
  EXPECT_EQ(a.size(), 0u);
  PayloadBuffer c(100);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.span()[(1 << 20) - 1], 0xab);
  EXPECT_EQ(PayloadBuffer(0).data(), nullptr);
}

TEST(PayloadBufferTest, LargeBufferIsReusedForTheSameSize) {
  uint8_t* first = nullptr;
  {
    PayloadBuffer a((1 << 20) + 5);  // rounded up to the alignment
    first = a.data();
  }
  const PayloadCacheStats before = GetPayloadCacheStats();
  EXPECT_GE(before.cached_bytes, (1u << 20) + kPayloadAlign);
  PayloadBuffer again((1 << 20) + 100);  // same rounded size
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(GetPayloadCacheStats().reuses, before.reuses + 1);
}

TEST(PayloadBufferTest, SmallBuffersBypassTheCache) {
  const PayloadCacheStats before = GetPayloadCacheStats();
  { PayloadBuffer small(kCachedPayloadMin - kPayloadAlign); }
  EXPECT_EQ(GetPayloadCacheStats().cached_bytes, before.cached_bytes);
}

TEST(PayloadBufferTest, CacheStaysUnderItsCapAndMakesRoomForANewSize) {
  constexpr size_t kBig = 8u << 20;
  {
    std::vector<PayloadBuffer> many;
    for (size_t i = 0; i < kPayloadCacheBytes / kBig + 4; ++i) many.emplace_back(kBig);
  }  // all returned: only what fits is kept
  EXPECT_LE(GetPayloadCacheStats().cached_bytes, kPayloadCacheBytes);
  EXPECT_GE(GetPayloadCacheStats().cached_bytes, kPayloadCacheBytes - kBig);
  // A buffer of another size, returned to a full cache, evicts to fit.
  uint8_t* p = nullptr;
  {
    PayloadBuffer other(3u << 20);
    p = other.data();
  }
  EXPECT_LE(GetPayloadCacheStats().cached_bytes, kPayloadCacheBytes);
  PayloadBuffer again(3u << 20);
  EXPECT_EQ(again.data(), p);
}

}  // namespace
}  // namespace thindisk::nbd
