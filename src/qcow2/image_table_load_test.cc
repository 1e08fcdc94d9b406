// A request's L2 table load (a read's, a write's, zeroes', a discard's)
// happens without the metadata lock: lookups of other tables, writes and a
// flush go on meanwhile; requests for the same table wait for the one
// load; a load overtaken by a copy of the table loaded under the lock is
// thrown away. And a read plan never loads a table.
#include <chrono>
#include <functional>
#include <future>

#include "io/forwarding_storage.h"
#include "qcow2/check.h"
#include "qcow2/image_test_util.h"
#include "util/endian.h"
#include "util/status.h"

namespace thindisk::qcow2 {
namespace {

using testing::Pattern;

// Holds the first read that covers `offset` once armed, until released,
// and counts the reads that cover it.
class HeldReadStorage : public io::ForwardingStorage {
 public:
  explicit HeldReadStorage(std::unique_ptr<io::Storage> inner)
      : ForwardingStorage(std::move(inner)) {}
  Status ReadAt(uint64_t o, std::span<uint8_t> b) override {
    // The bytes are read first: a held read returns what was there when it
    // began, as a slow disk may.
    Status s = inner().ReadAt(o, b);
    bool covers;
    {
      std::lock_guard l(mu_);
      covers = o <= offset_ && offset_ < o + b.size();
      if (covers) ++reads_;
    }
    if (covers) gate_.Pass();
    return s;
  }
  void Arm(uint64_t offset) {
    {
      std::lock_guard l(mu_);
      offset_ = offset;
      reads_ = 0;
    }
    gate_.Arm();
  }
  bool WaitHeld() { return gate_.WaitHeld(); }
  void Release() { gate_.Release(); }
  int reads() {
    std::lock_guard l(mu_);
    return reads_;
  }

 private:
  testing::Gate gate_;
  std::mutex mu_;
  uint64_t offset_ = ~uint64_t{0};
  int reads_ = 0;
};

// 4 KiB clusters: an L2 table maps 2 MiB, so the image has 16 of them,
// and a cache of 8 tables holds 7 L2 tables.
constexpr uint64_t kSize = 32 << 20;
constexpr uint64_t kTableSpan = 2 << 20;

struct Held {
  std::unique_ptr<Image> image;
  HeldReadStorage* storage = nullptr;
};

// An image with data in every table's span but the last, reopened: no L2
// table in memory.
Held WrittenAndReopened() {
  CreateOptions o;
  o.size = kSize + kTableSpan;  // the last span has no L2 table
  o.cluster_size = 4096;
  o.extended_l2 = false;
  testing::MemImage m = testing::CreateMem(o);
  Held h;
  if (!m.image) return h;
  for (uint64_t t = 0; t < kSize / kTableSpan; ++t) {
    EXPECT_TRUE(m.image->Write(t * kTableSpan, Pattern(t + 1, 8192)).ok());
  }
  EXPECT_TRUE(m.image->Close().ok());
  auto held = std::make_unique<HeldReadStorage>(m.storage->Clone());
  h.storage = held.get();
  OpenOptions oo;
  oo.cache_bytes = 8 * 4096;
  auto img = Image::Open(std::move(held), oo);
  EXPECT_TRUE(img.has_value());
  if (img) h.image = std::move(*img);
  return h;
}

// The second half of Pattern(seed, 8192).
std::vector<uint8_t> SecondHalf(uint64_t seed) {
  const std::vector<uint8_t> p = Pattern(seed, 8192);
  return {p.begin() + 4096, p.end()};
}

uint64_t L2TableOf(Image& image, uint64_t guest) {
  uint8_t raw[8];
  EXPECT_TRUE(image.storage()
                  .ReadAt(image.header().l1_table_offset + guest / kTableSpan * 8, raw)
                  .ok());
  return L1Offset(LoadBe64(raw));
}

bool Reads(Image& image, uint64_t off, const std::vector<uint8_t>& want) {
  std::vector<uint8_t> got(want.size());
  return image.Read(off, got).ok() && got == want;
}

// Block status also loads a table without the lock.
bool DataAt(Image& image, uint64_t off) {
  auto e = image.GetStatus(off, 4 * kTableSpan);
  return e.has_value() && e->data && e->offset == off && e->length >= 4096;
}

TEST(TableLoadConcurrencyTest, OthersGoOnWhileAReaderLoadsATable) {
  Held h = WrittenAndReopened();
  ASSERT_TRUE(h.image);
  Image& image = *h.image;
  ASSERT_TRUE(Reads(image, 0, Pattern(1, 8192)));  // table 0 in memory
  const uint64_t far = 5 * kTableSpan;
  h.storage->Arm(L2TableOf(image, far));
  auto first =
      std::async(std::launch::async, [&] { return Reads(image, far, Pattern(6, 8192)); });
  ASSERT_TRUE(h.storage->WaitHeld()) << "the reader never loaded table 5";
  // A second reader of the same table waits for the first one's load.
  auto second = std::async(std::launch::async,
                           [&] { return Reads(image, far + 4096, SecondHalf(6)); });
  // Meanwhile, bounded: a read of a table in memory, a write beside it, a
  // flush, a read and a block status that load other tables.
  auto others = std::async(std::launch::async, [&] {
    return Reads(image, 4096, SecondHalf(1)) && image.Write(0, Pattern(20, 4096)).ok() &&
           image.Flush().ok() && Reads(image, 9 * kTableSpan, Pattern(10, 8192)) &&
           DataAt(image, 11 * kTableSpan);
  });
  const bool ran = others.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  h.storage->Release();
  EXPECT_TRUE(ran) << "lookups waited for another table's load";
  EXPECT_TRUE(others.get());
  EXPECT_TRUE(first.get());
  EXPECT_TRUE(second.get());
  EXPECT_EQ(h.storage->reads(), 1) << "table 5 was read more than once";
  EXPECT_TRUE(Reads(image, 0, Pattern(20, 4096)));
}

// Block status loads a missing table the same way: reads of tables in
// memory do not wait for it.
TEST(TableLoadConcurrencyTest, BlockStatusLoadsWithoutTheLock) {
  Held h = WrittenAndReopened();
  ASSERT_TRUE(h.image);
  Image& image = *h.image;
  ASSERT_TRUE(Reads(image, 0, Pattern(1, 8192)));
  h.storage->Arm(L2TableOf(image, 7 * kTableSpan));
  auto status =
      std::async(std::launch::async, [&] { return DataAt(image, 7 * kTableSpan); });
  ASSERT_TRUE(h.storage->WaitHeld()) << "block status never loaded table 7";
  auto read =
      std::async(std::launch::async, [&] { return Reads(image, 0, Pattern(1, 8192)); });
  const bool ran = read.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  h.storage->Release();
  EXPECT_TRUE(ran) << "a read waited for block status's load";
  EXPECT_TRUE(read.get());
  EXPECT_TRUE(status.get());
}

// A writer's load is a load like a reader's: while it waits for the disk,
// requests on tables in memory and on other tables go on, and a reader of
// the same table waits for it rather than read it again. For each kind of
// writer.
TEST(TableLoadConcurrencyTest, WritersLoadWithoutTheLock) {
  const uint64_t far = 5 * kTableSpan;
  struct Writer {
    const char* name;
    std::function<Status(Image&)> run;
    std::vector<uint8_t> after;  // what `far` reads as then
  };
  const std::vector<Writer> writers = {
      {"write", [&](Image& i) { return i.Write(far, Pattern(40, 4096)); },
       Pattern(40, 4096)},
      {"zeroes", [&](Image& i) { return i.WriteZeroes(far, 4096); },
       std::vector<uint8_t>(4096, 0)},
      {"discard", [&](Image& i) { return i.Discard(far, 4096); },
       std::vector<uint8_t>(4096, 0)},
  };
  for (const Writer& w : writers) {
    Held h = WrittenAndReopened();
    ASSERT_TRUE(h.image);
    Image& image = *h.image;
    ASSERT_TRUE(Reads(image, 0, Pattern(1, 8192)));  // table 0 in memory
    h.storage->Arm(L2TableOf(image, far));
    auto writer = std::async(std::launch::async, [&] { return w.run(image); });
    ASSERT_TRUE(h.storage->WaitHeld()) << w.name << " never loaded table 5";
    auto reader = std::async(std::launch::async,
                             [&] { return Reads(image, far + 4096, SecondHalf(6)); });
    auto others = std::async(std::launch::async, [&] {
      return Reads(image, 4096, SecondHalf(1)) &&
             image.Write(0, Pattern(20, 4096)).ok() && image.Flush().ok() &&
             Reads(image, 9 * kTableSpan, Pattern(10, 8192)) &&
             image.Write(11 * kTableSpan, Pattern(21, 4096)).ok();
    });
    const bool ran =
        others.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    h.storage->Release();
    EXPECT_TRUE(ran) << w.name << ": lookups waited for its load of another table";
    EXPECT_TRUE(others.get()) << w.name;
    EXPECT_TRUE(writer.get().ok()) << w.name;
    EXPECT_TRUE(reader.get()) << w.name;
    EXPECT_EQ(h.storage->reads(), 1) << w.name << ": table 5 was read more than once";
    EXPECT_TRUE(Reads(image, far, w.after)) << w.name;
    EXPECT_TRUE(Reads(image, 11 * kTableSpan, Pattern(21, 4096))) << w.name;
    ASSERT_TRUE(image.Close().ok());
  }
}

// A request's load races a copy of the same table loaded under the lock
// (here a compressed write's, which loads that way: convert -c runs it
// alone), changed, flushed and evicted: the request's copy is older than
// the disk's and must not be cached over it.
TEST(TableLoadConcurrencyTest, ALoadOvertakenByALockedLoadIsThrownAway) {
  Held h = WrittenAndReopened();
  ASSERT_TRUE(h.image);
  Image& image = *h.image;
  const uint64_t far = 5 * kTableSpan;
  h.storage->Arm(L2TableOf(image, far));
  auto reader =
      std::async(std::launch::async, [&] { return Reads(image, far, Pattern(6, 8192)); });
  ASSERT_TRUE(h.storage->WaitHeld());
  // A first write into table 5's span, flushed; then 7 other tables are
  // loaded, so table 5 (clean now) leaves the cache.
  const uint64_t fresh = far + 64 * 4096;
  const std::vector<uint8_t> data(4096, 0x5a);  // compressible
  auto overtake = std::async(std::launch::async, [&] {
    bool ok = image.WriteCompressed(fresh, data).ok() && image.Flush().ok();
    for (uint64_t t = 6; t < 14; ++t)
      ok = ok && Reads(image, t * kTableSpan, Pattern(t + 1, 8192));
    return ok;
  });
  const bool ran =
      overtake.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  h.storage->Release();
  EXPECT_TRUE(ran) << "the locked load waited for the held one";
  EXPECT_TRUE(overtake.get());
  EXPECT_TRUE(reader.get());
  EXPECT_TRUE(Reads(image, fresh, data)) << "a stale table 5 was cached";
  auto st = image.GetStatus(fresh, 4096);
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->data && !st->has_host_offset) << "the write was not stored compressed";
  ASSERT_TRUE(image.Close().ok());
}

// A plan is made on a thread that must not wait for the disk: where the
// table is not in memory the caller is told to Read, and once a Read has
// loaded it, the plan is made.
TEST(TableLoadConcurrencyTest, PlansDoNotLoadTables) {
  Held h = WrittenAndReopened();
  ASSERT_TRUE(h.image);
  Image& image = *h.image;
  auto cold = image.PlanRead(3 * kTableSpan, 8192);
  ASSERT_FALSE(cold.has_value());
  EXPECT_EQ(cold.status().code(), Code::kNotSupported) << cold.status().ToString();
  EXPECT_TRUE(Reads(image, 3 * kTableSpan, Pattern(4, 8192)));
  auto warm = image.PlanRead(3 * kTableSpan, 8192);
  ASSERT_TRUE(warm.has_value()) << warm.status().ToString();
  std::vector<uint8_t> got(8192);
  for (const block::ReadPiece& p : warm->pieces) {
    ASSERT_NE(p.storage, nullptr);
    ASSERT_TRUE(
        p.storage->ReadAt(p.host_offset, std::span(got).subspan(p.buf_offset, p.length))
            .ok());
  }
  EXPECT_EQ(got, Pattern(4, 8192));
  // Where there is no L2 table there is nothing to load.
  auto none = image.PlanRead(kSize, 4096);
  ASSERT_TRUE(none.has_value()) << none.status().ToString();
  ASSERT_EQ(none->pieces.size(), 1u);
  EXPECT_EQ(none->pieces[0].storage, nullptr);
}

// A flush applying a discard's free changes a refcount block that no
// request has read since the image was opened: it is loaded without the
// lock, and reads and writes go on meanwhile.
TEST(TableLoadConcurrencyTest, FreesLoadRefcountBlocksWithoutTheLock) {
  CreateOptions o;
  o.size = 64 << 20;
  o.cluster_size = 4096;  // a 16-bit refcount block covers 8 MiB of the file
  o.extended_l2 = false;
  testing::MemImage m = testing::CreateMem(o);
  ASSERT_TRUE(m.image);
  ASSERT_TRUE(m.image->Write(0, Pattern(1, 24 << 20)).ok());
  ASSERT_TRUE(m.image->Close().ok());
  auto held_owned = std::make_unique<HeldReadStorage>(m.storage->Clone());
  HeldReadStorage* held = held_owned.get();
  auto img = Image::Open(std::move(held_owned), {});
  ASSERT_TRUE(img.has_value());
  Image& image = **img;
  const uint64_t block0 = testing::RefcountBlock(image, 0);  // the file's first 8 MiB
  ASSERT_NE(block0, 0u);
  const std::vector<uint8_t> data = Pattern(1, 24 << 20);
  ASSERT_TRUE(Reads(image, 20 << 20,
                    {data.begin() + (20 << 20), data.begin() + (20 << 20) + 8192}));

  held->Arm(block0);
  auto discard = std::async(std::launch::async, [&] {
    return image.Discard(0, 4096).ok() && image.Flush().ok();
  });
  ASSERT_TRUE(held->WaitHeld()) << "the flush never loaded the first refcount block";
  auto others = std::async(std::launch::async, [&] {
    return Reads(image, (20 << 20) + 8192,
                 {data.begin() + (20 << 20) + 8192, data.begin() + (20 << 20) + 16384}) &&
           image.Write(20 << 20, Pattern(2, 4096)).ok();
  });
  const bool ran = others.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  held->Release();
  EXPECT_TRUE(ran) << "requests waited for the refcount block's load";
  EXPECT_TRUE(others.get());
  EXPECT_TRUE(discard.get());
  EXPECT_EQ(held->reads(), 1) << "the refcount block was read more than once";
  EXPECT_TRUE(Reads(image, 0, std::vector<uint8_t>(4096, 0)));
  EXPECT_TRUE(Reads(image, 20 << 20, Pattern(2, 4096)));
  ASSERT_TRUE(image.Close().ok());
  // The freed cluster is counted free: no leak, no corruption.
  testing::ExpectWhole(image.storage());
}

// A first write's search for free clusters (a reserve refill's, through
// every refcount block of a full image just opened) loads the cold blocks
// without the lock: reads and writes in place go on meanwhile.
TEST(TableLoadConcurrencyTest, AnAllocationLoadsColdRefcountBlocksWithoutTheLock) {
  // 512-byte clusters: a refcount block counts 256 of them (128 KiB), so
  // 2 MiB of data take 17 blocks.
  CreateOptions o;
  o.size = 8 << 20;
  o.cluster_size = 512;
  o.extended_l2 = false;
  testing::MemImage m = testing::CreateMem(o);
  ASSERT_TRUE(m.image);
  const std::vector<uint8_t> data = Pattern(1, 2 << 20);
  ASSERT_TRUE(m.image->Write(0, data).ok());
  ASSERT_TRUE(m.image->Close().ok());
  auto held_owned = std::make_unique<HeldReadStorage>(m.storage->Clone());
  HeldReadStorage* held = held_owned.get();
  OpenOptions oo;
  oo.cache_bytes = 0;  // the smallest caches: two refcount blocks
  auto img = Image::Open(std::move(held_owned), oo);
  ASSERT_TRUE(img.has_value());
  Image& image = **img;
  const uint64_t block8 = testing::RefcountBlock(image, 8);
  ASSERT_NE(block8, 0u) << "the data takes fewer than 9 refcount blocks";

  held->Arm(block8);
  auto first = std::async(std::launch::async,
                          [&] { return image.Write(4 << 20, Pattern(2, 512)).ok(); });
  ASSERT_TRUE(held->WaitHeld()) << "the allocation never read refcount block 8";
  auto others = std::async(std::launch::async, [&] {
    return Reads(image, 4096, {data.begin() + 4096, data.begin() + 8192}) &&
           image.Write(1 << 20, Pattern(3, 512)).ok() &&
           Reads(image, 1 << 20, Pattern(3, 512));
  });
  const bool ran = others.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  held->Release();
  EXPECT_TRUE(ran) << "requests waited for the allocation's refcount block";
  EXPECT_TRUE(others.get());
  EXPECT_TRUE(first.get());
  EXPECT_TRUE(Reads(image, 4 << 20, Pattern(2, 512)));
  ASSERT_TRUE(image.Close().ok());
  testing::ExpectWhole(image.storage());
}

}  // namespace
}  // namespace thindisk::qcow2
