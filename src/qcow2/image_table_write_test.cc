// The refcount block and L2 writes of a flush's last stages, made without
// the metadata lock (image_flush.cc): requests go on while they reach the
// disk, and no other write of the same table overtakes them.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <future>
#include <mutex>
#include <string>

#include "io/forwarding_storage.h"
#include "qcow2/check.h"
#include "qcow2/format.h"
#include "qcow2/image_test_util.h"

namespace thindisk::qcow2 {
namespace {

using testing::FirstL2Table;
using testing::Pattern;

// Holds the first write into [off, off + len) after Arm() until Release():
// a write on its way to a slow disk. After FailNext() the next write there
// fails instead (EIO).
class HeldWriteStorage : public io::ForwardingStorage {
 public:
  explicit HeldWriteStorage(std::unique_ptr<io::Storage> inner)
      : ForwardingStorage(std::move(inner)) {}
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override {
    bool hits, fail = false;
    {
      std::lock_guard l(mu_);
      hits = o < off_ + len_ && off_ < o + b.size();
      if (hits) std::swap(fail, fail_next_);
    }
    if (fail) return Status::FromErrno(EIO, "held write");
    if (hits) gate_.Pass();
    return inner().WriteAt(o, b);
  }
  void Arm(uint64_t off, uint64_t len) {
    SetRange(off, len, false);
    gate_.Arm();
  }
  void FailNext(uint64_t off, uint64_t len) { SetRange(off, len, true); }
  bool WaitHeld() { return gate_.WaitHeld(); }
  void Release() { gate_.Release(); }

 private:
  void SetRange(uint64_t off, uint64_t len, bool fail) {
    std::lock_guard l(mu_);
    off_ = off;
    len_ = len;
    fail_next_ = fail;
  }
  testing::Gate gate_;
  std::mutex mu_;
  uint64_t off_ = 0;
  uint64_t len_ = 0;
  bool fail_next_ = false;
};

struct Held {
  io::MemoryStorage* mem = nullptr;
  HeldWriteStorage* held = nullptr;
  std::unique_ptr<Image> image;
};

// A new image of `size` bytes, 64 KiB clusters, with the smallest caches.
Held OpenHeld(uint64_t size, bool ext) {
  auto mem = io::NewMemoryStorage("test.qcow2");
  CreateOptions co;
  co.size = size;
  co.cluster_size = 65536;
  co.extended_l2 = ext;
  EXPECT_TRUE(Create(*mem, co).ok());
  Held h;
  h.mem = mem.get();
  auto held = std::make_unique<HeldWriteStorage>(std::move(mem));
  h.held = held.get();
  OpenOptions oo;
  oo.cache_bytes = 0;
  auto img = Image::Open(std::move(held), oo);
  EXPECT_TRUE(img.has_value());
  if (img) h.image = std::move(*img);
  return h;
}

// Starts a flush whose first write into `len` bytes of the first L2 table
// is held; the future is invalid when no such write came.
std::future<Status> HeldFlush(Held& h, uint64_t len) {
  const uint64_t l2 = FirstL2Table(*h.image);
  if (l2 == 0) return {};
  h.held->Arm(l2, len);
  auto flush = std::async(std::launch::async, [&h] { return h.image->Flush(); });
  if (!h.held->WaitHeld()) {
    h.held->Release();
    flush.wait();
    return {};
  }
  return flush;
}

// Reads 4 KiB at each offset of a reopened copy of `mem` and checks it
// holds the pattern of its seed.
void ExpectOnDisk(io::MemoryStorage& mem, std::vector<std::pair<uint64_t, uint64_t>> want,
                  const char* what) {
  auto again = Image::Open(mem.Clone(), {});
  ASSERT_TRUE(again.has_value());
  for (auto [off, seed] : want) {
    std::vector<uint8_t> got(4096);
    ASSERT_TRUE((*again)->Read(off, got).ok());
    EXPECT_TRUE(got == Pattern(seed, 4096)) << what << ": other bytes at " << off;
  }
}

// Requests beside a held flush write: a read of what `data` wrote at 1 MiB,
// a write in place at 2 MiB, a first write at `first_write`.
std::future<Status> RequestsBeside(Image& image, const std::vector<uint8_t>& data,
                                   uint64_t first_write) {
  return std::async(std::launch::async, [&image, &data, first_write] {
    std::vector<uint8_t> got(8192);
    Status s = image.Read(1 << 20, got);
    if (s.ok() && !std::equal(got.begin(), got.end(), data.begin() + (1 << 20))) {
      s = Status::Internal("read other bytes than were written");
    }
    if (s.ok()) s = image.Write(2 << 20, Pattern(3, 4096));
    if (s.ok()) s = image.Write(first_write, Pattern(4, 4096));
    return s;
  });
}

// The requests end while the held write waits (10 s at most), the flush
// only after it is let go; both succeed. `what` names the held write.
void ExpectRequestsWentOn(Held& h, std::future<Status>& requests,
                          std::future<Status>& flush, bool ext, const char* what) {
  const bool ran =
      requests.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  const bool returned_early =
      flush.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  h.held->Release();
  EXPECT_TRUE(ran) << "ext=" << ext << ": requests waited for the " << what;
  EXPECT_FALSE(returned_early) << "ext=" << ext
                               << ": the flush returned before its write";
  EXPECT_TRUE(requests.get().ok());
  EXPECT_TRUE(flush.get().ok());
}

// A flush whose last stage writes a changed sector of an L2 table makes that
// write without the metadata lock: reads, writes in place and first writes
// (which change the same sector again) go on while it is on its way to the
// disk, and the flush returns only after it (and its sync).
TEST(TableWriteTest, RequestsGoOnWhileAFlushWritesItsL2Sector) {
  for (bool ext : {false, true}) {
    Held h = OpenHeld(64 << 20, ext);
    ASSERT_TRUE(h.image);
    Image& image = *h.image;
    const std::vector<uint8_t> data = Pattern(1, 4 << 20);
    ASSERT_TRUE(image.Write(0, data).ok());
    ASSERT_TRUE(image.Flush().ok());  // the L2 table is on disk
    ASSERT_TRUE(image.Write(8 << 20, Pattern(2, 4096)).ok());
    auto flush = HeldFlush(h, 65536);
    ASSERT_TRUE(flush.valid()) << "the flush wrote no L2 sector";
    auto requests = RequestsBeside(image, data, 9 << 20);
    ExpectRequestsWentOn(h, requests, flush, ext, "L2 write");
    // What the held flush owed is on disk, before any later flush.
    ExpectOnDisk(*h.mem, {{8 << 20, 2}}, "after the held flush");
    ASSERT_TRUE(image.Flush().ok());
    ASSERT_TRUE(image.Close().ok());
    ExpectOnDisk(*h.mem, {{2 << 20, 3}, {8 << 20, 2}, {9 << 20, 4}},
                 "after the last flush");
  }
}

// While a flush's L2 sector is on its way without the lock, a cache
// eviction's own ordered flush (under the lock, not the flush lock) writes
// a newer copy of the same sector. It must wait for the older write: landing
// after it, the older copy would undo the newer mapping on disk while the
// cache calls the table clean, and no later flush would write it again.
TEST(TableWriteTest, AnEvictionFlushWritesTheSameSectorOnlyAfterTheOlderCopy) {
  for (bool ext : {false, true}) {
    // A slice maps 32 MiB (16 MiB with extended entries); the smallest cache
    // holds about 105 slices, so first writes 32 MiB apart across 8 GiB
    // fill it with dirty new tables and make it evict.
    Held h = OpenHeld(8ull << 30, ext);
    ASSERT_TRUE(h.image);
    Image& image = *h.image;
    ASSERT_TRUE(image.Write(0, Pattern(1, 4096)).ok());
    ASSERT_TRUE(image.Flush().ok());  // the L2 table is on disk
    ASSERT_TRUE(image.Write(1 << 20, Pattern(2, 4096)).ok());
    // The sector that maps the first 4 MiB (2 MiB extended).
    auto flush = HeldFlush(h, 512);
    ASSERT_TRUE(flush.valid()) << "the flush wrote no L2 sector";
    auto requests = std::async(std::launch::async, [&] {
      // The same sector, changed again; then enough new slices to evict.
      Status s = image.Write(1536 << 10, Pattern(3, 4096));
      for (uint64_t off = 32 << 20; s.ok() && off < (8ull << 30); off += 32 << 20) {
        s = image.Write(off, Pattern(off, 4096));
      }
      return s;
    });
    // Long enough for the requests to reach an eviction (a fraction of a
    // second); the check below holds whatever they reached.
    requests.wait_for(std::chrono::seconds(1));
    h.held->Release();
    EXPECT_TRUE(flush.get().ok());
    EXPECT_TRUE(requests.get().ok());
    // No further flush: whatever the eviction wrote must be what is on disk.
    ExpectOnDisk(*h.mem, {{0, 1}, {1 << 20, 2}, {1536 << 10, 3}}, "after the eviction");
    ASSERT_TRUE(image.Flush().ok());
    ASSERT_TRUE(image.Close().ok());
    ExpectOnDisk(*h.mem, {{0, 1}, {1 << 20, 2}, {1536 << 10, 3}, {64 << 20, 64 << 20}},
                 "after the last flush");
  }
}

// The tables a flush writes without the lock are clean in the cache while
// their copies are on the way. They must stay in the cache till then: one
// evicted and read back from the disk meanwhile would come back without
// the mappings the write carries, and reads would find zeros.
TEST(TableWriteTest, TablesOnTheirWayStayInTheCache) {
  for (bool ext : {false, true}) {
    // A slice maps 32 MiB (16 MiB extended); the smallest cache holds about
    // 105 slices, fewer than the image has.
    const uint64_t size = 8ull << 30, step = ext ? 16 << 20 : 32 << 20;
    Held h = OpenHeld(size, ext);
    ASSERT_TRUE(h.image);
    Image& image = *h.image;
    for (uint64_t off = 0; off < size; off += step) {
      ASSERT_TRUE(image.Write(off, Pattern(off, 4096)).ok());
    }
    ASSERT_TRUE(image.Flush().ok());  // every slice on disk, all clean
    ASSERT_TRUE(image.Write(1 << 20, Pattern(2, 4096)).ok());
    auto flush = HeldFlush(h, 65536);
    ASSERT_TRUE(flush.valid()) << "the flush wrote no L2 sector";
    // Reads of every other slice cycle the cache (every victim is clean:
    // no flush is needed to make room), then the mapping on its way.
    auto requests = std::async(std::launch::async, [&] {
      Status s;
      std::vector<uint8_t> got(4096);
      for (uint64_t off = step; s.ok() && off < size; off += step) {
        s = image.Read(off, got);
        if (s.ok() && got != Pattern(off, 4096)) s = Status::Internal("other bytes");
      }
      if (s.ok()) s = image.Read(1 << 20, got);
      if (s.ok() && got != Pattern(2, 4096)) {
        s = Status::Internal("the mapping on its way to the disk was lost");
      }
      return s;
    });
    const bool ran =
        requests.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    h.held->Release();
    EXPECT_TRUE(ran) << "ext=" << ext << ": reads waited for the L2 write";
    EXPECT_TRUE(flush.get().ok());
    Status s = requests.get();
    EXPECT_TRUE(s.ok()) << "ext=" << ext << ": " << s.ToString();
    ASSERT_TRUE(image.Close().ok());
    ExpectOnDisk(*h.mem, {{0, 0}, {1 << 20, 2}, {step, step}}, "after closing");
  }
}

// When the write of a taken table fails, the flush fails, and the table is
// dirty again: the next flush writes it, and only then frees the cluster
// its old mapping named.
TEST(TableWriteTest, AFailedTableWriteIsMadeByTheNextFlush) {
  for (bool ext : {false, true}) {
    Held h = OpenHeld(64 << 20, ext);
    ASSERT_TRUE(h.image);
    Image& image = *h.image;
    ASSERT_TRUE(image.Write(0, Pattern(1, 65536)).ok());
    ASSERT_TRUE(image.Flush().ok());  // the L2 table is on disk
    ASSERT_TRUE(image.Write(1 << 20, Pattern(2, 4096)).ok());
    ASSERT_TRUE(image.Discard(0, 65536).ok());  // a free owed after the mapping
    const uint64_t l2 = FirstL2Table(image);
    ASSERT_NE(l2, 0u);

    h.held->FailNext(l2, 65536);
    EXPECT_FALSE(image.Flush().ok()) << "ext=" << ext;
    ASSERT_TRUE(image.Flush().ok());
    ExpectOnDisk(*h.mem, {{1 << 20, 2}}, "after the second flush");
    auto again = Image::Open(h.mem->Clone(), {});
    ASSERT_TRUE(again.has_value());
    std::vector<uint8_t> got(65536);
    ASSERT_TRUE((*again)->Read(0, got).ok());
    EXPECT_TRUE(got == std::vector<uint8_t>(65536, 0))
        << "ext=" << ext << ": discard lost";
    again->reset();
    ASSERT_TRUE(image.Close().ok());
    // The free was not dropped with the failed flush: nothing leaks.
    testing::ExpectWhole(*h.mem, "ext=" + std::to_string(ext));
  }
}

// 128 first writes of one 64 KiB cluster each from 8 MiB (the pattern of
// its offset): more clusters than the reserve (64) holds, so the allocator
// refills it and a refcount block changes.
Status WritePastTheReserve(Image& image) {
  Status s;
  for (uint64_t off = 8 << 20; s.ok() && off < (16 << 20); off += 65536) {
    s = image.Write(off, Pattern(off, 65536));
  }
  return s;
}

// First writes past the clusters allocated ahead make the allocator raise
// the refcounts of a new run of them: the next flush writes a refcount
// block (stage 1), syncs, and writes the L2 sectors. With nothing ordered
// after them, those writes are made without the metadata lock too:
// requests go on while the block is on its way to the disk, and the flush
// returns only after it, its sync and the tables.
TEST(TableWriteTest, RequestsGoOnWhileAFlushWritesItsRefcountBlock) {
  for (bool ext : {false, true}) {
    Held h = OpenHeld(64 << 20, ext);
    ASSERT_TRUE(h.image);
    Image& image = *h.image;
    const std::vector<uint8_t> data = Pattern(1, 4 << 20);
    ASSERT_TRUE(image.Write(0, data).ok());
    ASSERT_TRUE(image.Flush().ok());  // the L2 table and the block on disk
    ASSERT_TRUE(WritePastTheReserve(image).ok());
    const uint64_t block = testing::RefcountBlock(image, 0);
    ASSERT_NE(block, 0u);
    h.held->Arm(block, 65536);
    auto flush = std::async(std::launch::async, [&] { return image.Flush(); });
    ASSERT_TRUE(h.held->WaitHeld())
        << "ext=" << ext << ": the flush wrote no refcount block";
    auto requests = RequestsBeside(image, data, 20 << 20);
    ExpectRequestsWentOn(h, requests, flush, ext, "refcount block");
    ExpectOnDisk(*h.mem, {{8 << 20, 8 << 20}, {(16 << 20) - 65536, (16 << 20) - 65536}},
                 "after the held flush");
    ASSERT_TRUE(image.Close().ok());
    ExpectOnDisk(*h.mem, {{2 << 20, 3}, {20 << 20, 4}}, "after closing");
    testing::ExpectWhole(*h.mem, "ext=" + std::to_string(ext));
  }
}

// When the refcount block's write fails, the flush fails before any L2
// sector is written, and the block and the tables are dirty again: the next
// flush writes them, and the image is whole.
TEST(TableWriteTest, AFailedRefcountBlockWriteIsMadeByTheNextFlush) {
  for (bool ext : {false, true}) {
    Held h = OpenHeld(64 << 20, ext);
    ASSERT_TRUE(h.image);
    Image& image = *h.image;
    ASSERT_TRUE(image.Write(0, Pattern(1, 4 << 20)).ok());
    ASSERT_TRUE(image.Flush().ok());
    ASSERT_TRUE(WritePastTheReserve(image).ok());
    const uint64_t block = testing::RefcountBlock(image, 0);
    ASSERT_NE(block, 0u);
    h.held->FailNext(block, 65536);
    EXPECT_FALSE(image.Flush().ok()) << "ext=" << ext;
    // Nothing of the failed flush's tables reached the disk.
    auto before = Image::Open(h.mem->Clone(), {});
    ASSERT_TRUE(before.has_value());
    std::vector<uint8_t> got(4096);
    ASSERT_TRUE((*before)->Read(8 << 20, got).ok());
    EXPECT_TRUE(got == std::vector<uint8_t>(4096, 0))
        << "ext=" << ext << ": an L2 entry was written after the failed block";
    before->reset();
    ASSERT_TRUE(image.Flush().ok());
    ExpectOnDisk(*h.mem, {{8 << 20, 8 << 20}, {(16 << 20) - 65536, (16 << 20) - 65536}},
                 "after the second flush");
    // Every cluster the tables name is counted on disk (the unused reserve
    // leaks until the image is closed).
    auto copy = h.mem->Clone();
    auto flushed = Check(*copy, RepairMode::kNone);
    ASSERT_TRUE(flushed.has_value());
    EXPECT_EQ(flushed->corruptions, 0u) << "ext=" << ext << ": after the second flush";
    ASSERT_TRUE(image.Close().ok());
    testing::ExpectWhole(*h.mem, "ext=" + std::to_string(ext));
  }
}

}  // namespace
}  // namespace thindisk::qcow2
