#include "io/write_back.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace thindisk::io {
namespace {

using std::chrono::milliseconds;

// What the batches reach: a byte array with its own lock, and a count of
// batches and of the runs they carried.
struct Store {
  explicit Store(size_t size) : bytes(size, 0) {}
  Status Write(const WriteBack::Extents& extents) {
    std::lock_guard<std::mutex> lock(mu);
    if (fail_next) {
      fail_next = false;
      return Status::FromErrno(EIO, "store: injected");
    }
    for (const auto& [offset, run] : extents) {
      std::memcpy(bytes.data() + offset, run.data(), run.size());
    }
    ++batches;
    runs += extents.size();
    return Status::Ok();
  }
  // A read as the storage does it: held bytes collected first, then the
  // store, then the held bytes over it.
  std::vector<uint8_t> Read(const WriteBack& wb, uint64_t offset, uint64_t length) {
    const WriteBack::Held held = wb.Collect(offset, length);
    std::vector<uint8_t> out(length);
    {
      std::lock_guard<std::mutex> lock(mu);
      std::memcpy(out.data(), bytes.data() + offset, length);
    }
    WriteBack::Apply(held, offset, out);
    return out;
  }
  std::vector<uint8_t> Snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return bytes;
  }

  std::mutex mu;
  std::vector<uint8_t> bytes;
  bool fail_next = false;
  int batches = 0;
  size_t runs = 0;
};

WriteBack::BatchWriter To(Store& store) {
  return [&store](const WriteBack::Extents& e) { return store.Write(e); };
}

// Large thresholds: nothing is written back unless drained.
WriteBack::Limits Manual() {
  return {uint64_t(1) << 40, uint64_t(1) << 41, milliseconds(3600 * 1000)};
}

std::vector<uint8_t> Filled(size_t n, uint8_t v) { return std::vector<uint8_t>(n, v); }

TEST(WriteBackTest, HeldWritesAreReadBackAndStoredOnlyByDrain) {
  Store store(64 * 1024);
  WriteBack wb(To(store), Manual());
  ASSERT_TRUE(wb.Add(4096, Filled(4096, 0xaa)).ok());
  ASSERT_TRUE(wb.Add(16384, Filled(512, 0xbb)).ok());
  EXPECT_EQ(wb.held_bytes(), 4608u);
  EXPECT_EQ(store.Snapshot(), std::vector<uint8_t>(64 * 1024, 0));  // nothing stored yet
  EXPECT_EQ(store.Read(wb, 4096, 4096), Filled(4096, 0xaa));
  std::vector<uint8_t> mixed = store.Read(wb, 16000, 1024);
  EXPECT_EQ(mixed[383], 0);
  EXPECT_EQ(mixed[384], 0xbb);
  EXPECT_EQ(mixed[895], 0xbb);
  EXPECT_EQ(mixed[896], 0);
  ASSERT_TRUE(wb.Drain().ok());
  EXPECT_EQ(wb.held_bytes(), 0u);
  EXPECT_EQ(store.batches, 1);
  EXPECT_EQ(store.runs, 2u);
  EXPECT_EQ(store.bytes[4096], 0xaa);
  EXPECT_EQ(store.bytes[16384 + 511], 0xbb);
  EXPECT_TRUE(wb.Drain().ok());  // nothing held: no batch
  EXPECT_EQ(store.batches, 1);
}

// A newer write replaces the bytes it covers, whichever way it overlaps:
// inside one run, over its head, its tail, and over several runs.
TEST(WriteBackTest, OverlappingWritesKeepTheNewestBytes) {
  Store store(8192);
  WriteBack wb(To(store), Manual());
  std::vector<uint8_t> model(8192, 0);
  auto add = [&](uint64_t off, size_t n, uint8_t v) {
    ASSERT_TRUE(wb.Add(off, Filled(n, v)).ok());
    std::memset(model.data() + off, v, n);
  };
  add(1000, 2000, 1);
  add(1500, 100, 2);   // inside: splits the run in three
  add(900, 200, 3);    // over the head
  add(2900, 300, 4);   // over the tail
  add(1400, 1000, 5);  // over several runs
  add(3000, 10, 6);
  add(0, 8192, 7);  // over everything
  add(4096, 1, 8);
  EXPECT_EQ(wb.held_bytes(), 8192u);  // bytes held once, however often written
  EXPECT_EQ(store.Read(wb, 0, 8192), model);
  ASSERT_TRUE(wb.Drain().ok());
  EXPECT_EQ(store.Snapshot(), model);
}

TEST(WriteBackTest, ForgetDropsHeldBytesInTheRange) {
  Store store(8192);
  WriteBack wb(To(store), Manual());
  ASSERT_TRUE(wb.Add(0, Filled(8192, 9)).ok());
  wb.Forget(1024, 2048);
  EXPECT_EQ(wb.held_bytes(), 8192u - 2048u);
  wb.Forget(6000, UINT64_MAX);  // to the end, without overflowing
  EXPECT_EQ(wb.held_bytes(), 6000u - 2048u);
  ASSERT_TRUE(wb.Drain().ok());
  std::vector<uint8_t> want(8192, 0);
  std::memset(want.data(), 9, 1024);
  std::memset(want.data() + 3072, 9, 6000 - 3072);
  EXPECT_EQ(store.Snapshot(), want);
}

// Seeded random writes, forgets, reads and drains against a byte model,
// with batches also started by the thread (small thresholds).
TEST(WriteBackTest, RandomOperationsMatchAModel) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    constexpr size_t kSize = 1 << 16;
    Store store(kSize);
    WriteBack wb(To(store), {2048, 8192, milliseconds(1)});
    std::vector<uint8_t> model(kSize, 0);
    std::mt19937 rng(seed);
    for (int op = 0; op < 400; ++op) {
      const uint64_t off = rng() % kSize;
      const size_t n = 1 + rng() % std::min<size_t>(3000, kSize - off);
      switch (rng() % 8) {
        case 0: {  // a direct write: forget, then store
          wb.Forget(off, n);
          const uint8_t v = uint8_t(rng());
          WriteBack::Extents direct;
          direct.emplace(off, Filled(n, v));
          ASSERT_TRUE(store.Write(direct).ok());
          std::memset(model.data() + off, v, n);
          break;
        }
        case 1:
          ASSERT_TRUE(wb.Drain().ok());
          ASSERT_EQ(store.Snapshot(), model);
          break;
        case 2:
        case 3:
          ASSERT_EQ(store.Read(wb, off, n),
                    std::vector<uint8_t>(model.begin() + off, model.begin() + off + n));
          break;
        default: {
          const uint8_t v = uint8_t(rng());
          ASSERT_TRUE(wb.Add(off, Filled(n, v)).ok());
          std::memset(model.data() + off, v, n);
        }
      }
    }
    ASSERT_TRUE(wb.Drain().ok());
    EXPECT_EQ(store.Snapshot(), model);
  }
}

TEST(WriteBackTest, OldBytesAreWrittenBackWithoutADrain) {
  Store store(4096);
  WriteBack wb(To(store), {uint64_t(1) << 30, uint64_t(1) << 31, milliseconds(20)});
  ASSERT_TRUE(wb.Add(0, Filled(100, 5)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (wb.held_bytes() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(wb.held_bytes(), 0u);
  EXPECT_EQ(store.Snapshot()[99], 5);
}

// A writer waits while `limit` bytes are held; the buffer never holds much
// more than dirty + writing.
TEST(WriteBackTest, WritersWaitAtTheLimit) {
  std::mutex gate;
  std::unique_lock<std::mutex> closed(gate);
  Store store(1 << 20);
  std::atomic<int> batches{0};
  WriteBack wb(
      [&](const WriteBack::Extents& e) {
        ++batches;
        std::lock_guard<std::mutex> wait(gate);  // held shut by the test
        return store.Write(e);
      },
      {4096, 8192, milliseconds(3600 * 1000)});
  // 8 KiB: the thread starts a batch and blocks in it; 8 KiB more fill dirty.
  ASSERT_TRUE(wb.Add(0, Filled(8192, 1)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (batches.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_EQ(batches.load(), 1);
  ASSERT_TRUE(wb.Add(8192, Filled(8192, 2)).ok());
  std::atomic<bool> added{false};
  std::thread late([&] {
    EXPECT_TRUE(wb.Add(16384, Filled(4096, 3)).ok());
    added = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(added.load());  // waiting: 16 KiB held, the limit is 8
  EXPECT_EQ(wb.held_bytes(), 16384u);
  closed.unlock();
  late.join();
  EXPECT_TRUE(added.load());
  ASSERT_TRUE(wb.Drain().ok());
  EXPECT_EQ(store.bytes[0], 1);
  EXPECT_EQ(store.bytes[8192], 2);
  EXPECT_EQ(store.bytes[16384], 3);
}

TEST(WriteBackTest, AFailedBatchIsStickyForAddAndDrain) {
  Store store(4096);
  WriteBack wb(To(store), Manual());
  ASSERT_TRUE(wb.Add(0, Filled(10, 1)).ok());
  store.fail_next = true;
  Status st = wb.Drain();
  EXPECT_EQ(st.error_number(), EIO);
  EXPECT_NE(st.message().find("injected"), std::string::npos);
  EXPECT_EQ(wb.held_bytes(), 0u);
  // The lost write is never reported as stored, however often asked.
  EXPECT_EQ(wb.Drain().error_number(), EIO);
  EXPECT_EQ(wb.Add(100, Filled(10, 2)).error_number(), EIO);
  EXPECT_EQ(store.Snapshot()[100], 0);
}

// Writers on their own ranges, readers checking them, and drains, at once
// (for TSan): every read sees the range's last write, and the store ends
// equal to the model.
TEST(WriteBackTest, ConcurrentWritersReadersAndDrains) {
  constexpr int kThreads = 4;
  constexpr size_t kRange = 16384;
  Store store(kThreads * kRange);
  WriteBack wb(To(store), {4096, 16384, milliseconds(2)});
  std::vector<std::vector<uint8_t>> models(kThreads, std::vector<uint8_t>(kRange, 0));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(uint32_t(t) + 100);
      std::vector<uint8_t>& model = models[t];
      const uint64_t base = uint64_t(t) * kRange;
      for (int op = 0; op < 300; ++op) {
        const uint64_t off = rng() % kRange;
        const size_t n = 1 + rng() % std::min<size_t>(2048, kRange - off);
        if (rng() % 10 == 0) {
          EXPECT_TRUE(wb.Drain().ok());
        } else if (rng() % 3 == 0) {
          EXPECT_EQ(store.Read(wb, base + off, n),
                    std::vector<uint8_t>(model.begin() + off, model.begin() + off + n));
        } else {
          const uint8_t v = uint8_t(rng());
          EXPECT_TRUE(wb.Add(base + off, Filled(n, v)).ok());
          std::memset(model.data() + off, v, n);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(wb.Drain().ok());
  const std::vector<uint8_t> all = store.Snapshot();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(
        std::vector<uint8_t>(all.begin() + t * kRange, all.begin() + (t + 1) * kRange),
        models[t]);
  }
}

}  // namespace
}  // namespace thindisk::io
