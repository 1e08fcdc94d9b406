// Many threads on one image: overlapping clusters, disjoint bytes, checked
// against per-thread models; and flush ordering seen by a recording storage.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "io/forwarding_storage.h"
#include "qcow2/image_test_util.h"
#include "util/endian.h"

namespace thindisk::qcow2 {
namespace {

using testing::CreateMem;
using testing::FirstL2Table;
using testing::MemImage;
using testing::Pattern;
using testing::Reopen;

class ConcurrencyTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {};

TEST_P(ConcurrencyTest, OverlappingClustersAgainstModel) {
  auto [cluster, ext] = GetParam();
  CreateOptions o;
  o.size = 8 << 20;
  o.cluster_size = cluster;
  o.extended_l2 = ext;
  auto m = CreateMem(o);
  ASSERT_TRUE(m.image);
  constexpr uint64_t kBlock = 4096;
  constexpr int kThreads = 6;
  const uint64_t blocks = o.size / kBlock;
  // Block b belongs to thread b % kThreads: every cluster is shared by all
  // threads, no byte is.
  std::vector<std::vector<uint8_t>> model(kThreads, std::vector<uint8_t>(o.size, 0));
  std::atomic<int> failures{0};
  auto worker = [&](int t) {
    std::mt19937_64 rng(100 + t);
    std::vector<uint8_t>& mine = model[t];
    for (int i = 0; i < 400 && failures == 0; ++i) {
      uint64_t b = (rng() % (blocks / kThreads)) * kThreads + t;
      uint64_t off = b * kBlock;
      uint64_t in = rng() % kBlock;
      uint64_t len = 1 + rng() % (kBlock - in);
      Status s;
      switch (rng() % 8) {
        case 0: case 1: case 2: {
          auto data = Pattern(t * 100000 + i, len);
          s = m.image->Write(off + in, data);
          std::copy(data.begin(), data.end(), mine.begin() + off + in);
          break;
        }
        case 3:
          s = m.image->Discard(off, kBlock);
          std::fill(mine.begin() + off, mine.begin() + off + kBlock, 0);
          break;
        case 4: {
          block::ZeroFlags f;
          f.may_unmap = rng() % 2;
          s = m.image->WriteZeroes(off + in, len, f);
          std::fill(mine.begin() + off + in, mine.begin() + off + in + len, 0);
          break;
        }
        case 5:
          if (rng() % 4 == 0) s = m.image->Flush();
          break;
        default: {
          std::vector<uint8_t> got(kBlock);
          s = m.image->Read(off, got);
          if (s.ok() && !std::equal(got.begin(), got.end(), mine.begin() + off)) {
            ADD_FAILURE() << "thread " << t << " block " << b << " differs from model";
            ++failures;
          }
          break;
        }
      }
      if (!s.ok()) {
        ADD_FAILURE() << s.ToString();
        ++failures;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  // Merge the models: each block from its owner.
  std::vector<uint8_t> want(o.size);
  for (uint64_t b = 0; b < blocks; ++b) {
    const auto& src = model[b % kThreads];
    std::copy(src.begin() + b * kBlock, src.begin() + (b + 1) * kBlock, want.begin() + b * kBlock);
  }
  std::vector<uint8_t> got(o.size);
  ASSERT_TRUE(m.image->Read(0, got).ok());
  EXPECT_TRUE(got == want);
  auto r = Reopen(m);
  ASSERT_TRUE(r.image);
  ASSERT_TRUE(r.image->Read(0, got).ok());
  EXPECT_TRUE(got == want);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ConcurrencyTest,
                         ::testing::Values(std::make_tuple(65536u, false),
                                           std::make_tuple(131072u, true),
                                           std::make_tuple(4096u, false)));

// Records every write and flush, in order.
class RecordingStorage : public io::ForwardingStorage {
 public:
  struct Op {
    bool flush;
    uint64_t offset;
    uint64_t length;
  };
  explicit RecordingStorage(std::unique_ptr<io::Storage> inner)
      : ForwardingStorage(std::move(inner)) {}
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override {
    Record({false, o, b.size()});
    return inner().WriteAt(o, b);
  }
  Status Flush() override {
    Record({true, 0, 0});
    return inner().Flush();
  }
  Status ZeroRange(uint64_t o, uint64_t l) override {
    Record({false, o, l});
    return inner().ZeroRange(o, l);
  }

  std::vector<Op> ops() {
    std::lock_guard l(mu_);
    return ops_;
  }

 private:
  void Record(Op op) {
    std::lock_guard l(mu_);
    ops_.push_back(op);
  }
  std::mutex mu_;
  std::vector<Op> ops_;
};

// Index of the first write overlapping [off, off + len) at or after `from`.
int FirstWrite(const std::vector<RecordingStorage::Op>& ops, uint64_t off, uint64_t len,
               size_t from = 0) {
  for (size_t i = from; i < ops.size(); ++i) {
    if (!ops[i].flush && ops[i].offset < off + len && off < ops[i].offset + ops[i].length) {
      return int(i);
    }
  }
  return -1;
}

bool FlushBetween(const std::vector<RecordingStorage::Op>& ops, int a, int b) {
  for (int i = a + 1; i < b; ++i) {
    if (ops[i].flush) return true;
  }
  return false;
}

// A new image of `size` bytes with 64 KiB clusters, in memory.
std::unique_ptr<io::MemoryStorage> NewImage(uint64_t size, bool ext) {
  auto mem = io::NewMemoryStorage("test.qcow2");
  CreateOptions o;
  o.size = size;
  o.cluster_size = 65536;
  o.extended_l2 = ext;
  EXPECT_TRUE(Create(*mem, o).ok());
  return mem;
}

// Reads `len` bytes at `off` and checks them against `data` there.
Status ReadsAsWritten(Image& image, const std::vector<uint8_t>& data, uint64_t off,
                      uint64_t len) {
  std::vector<uint8_t> got(len);
  Status s = image.Read(off, got);
  const auto want = std::span<const uint8_t>(data).subspan(off, len);
  if (s.ok() && !std::equal(want.begin(), want.end(), got.begin())) {
    s = Status::Internal("read other bytes than were written");
  }
  return s;
}

TEST(FlushOrderingTest, DataThenRefcountsThenL2ThenL1) {
  for (bool ext : {false, true}) {
    auto rec_owned = std::make_unique<RecordingStorage>(NewImage(64 << 20, ext));
    RecordingStorage* rec = rec_owned.get();
    auto img = Image::Open(std::move(rec_owned), {});
    ASSERT_TRUE(img.has_value());
    Image& image = **img;
    // Allocations far apart: enough to need a new refcount-independent L2.
    ASSERT_TRUE(image.Write(0, Pattern(1, 70000)).ok());
    ASSERT_TRUE(image.Write(40 << 20, Pattern(2, 5000)).ok());
    auto st = image.GetStatus(40 << 20, 4096);
    ASSERT_TRUE(st.has_value() && st->has_host_offset);
    uint64_t data_host = st->host_offset;
    ASSERT_TRUE(image.Flush().ok());
    auto ops = rec->ops();

    const Header& h = image.header();
    uint8_t raw[8];
    ASSERT_TRUE(image.storage().ReadAt(h.l1_table_offset, raw).ok());
    uint64_t l2 = L1Offset(LoadBe64(raw));
    ASSERT_NE(l2, 0u);
    ASSERT_TRUE(image.storage().ReadAt(h.refcount_table_offset, raw).ok());
    uint64_t rc_block = LoadBe64(raw);

    int data_w = FirstWrite(ops, data_host, 4096);
    int rc_w = FirstWrite(ops, rc_block, 65536);
    int l2_w = FirstWrite(ops, l2, 65536);
    int l1_w = FirstWrite(ops, h.l1_table_offset, 8);
    ASSERT_GE(data_w, 0);
    ASSERT_GE(rc_w, 0);
    ASSERT_GE(l2_w, 0);
    ASSERT_GE(l1_w, 0);
    // Rule: a refcount is raised before anything points at the cluster;
    // data is durable before the L2 entry that points at it.
    EXPECT_LT(data_w, l2_w);
    EXPECT_TRUE(FlushBetween(ops, data_w, l2_w)) << "ext=" << ext;
    EXPECT_TRUE(FlushBetween(ops, rc_w, l2_w)) << "ext=" << ext;
    EXPECT_TRUE(FlushBetween(ops, l2_w, l1_w)) << "ext=" << ext;
    EXPECT_TRUE(ops.back().flush);
  }
}

// A storage whose syncs wait, once armed, until the test lets them go;
// armed after a write, only the syncs that follow a write of that range.
class HeldSyncStorage : public io::ForwardingStorage {
 public:
  explicit HeldSyncStorage(std::unique_ptr<io::Storage> inner)
      : ForwardingStorage(std::move(inner)) {}
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override {
    {
      std::lock_guard l(mu_);
      if (o < after_off_ + after_len_ && after_off_ < o + b.size()) written_ = true;
    }
    return inner().WriteAt(o, b);
  }
  Status Flush() override {
    bool hold;
    {
      std::lock_guard l(mu_);
      hold = after_len_ == 0 || written_;
    }
    if (hold) gate_.Pass();
    return inner().Flush();
  }
  // Every sync is held.
  void Arm() { ArmAfterWrite(0, 0); }
  // Every sync after a write into [off, off + len) is held.
  void ArmAfterWrite(uint64_t off, uint64_t len) {
    {
      std::lock_guard l(mu_);
      after_off_ = off;
      after_len_ = len;
      written_ = false;
    }
    gate_.Arm(/*all=*/true);
  }
  bool WaitHeld() { return gate_.WaitHeld(); }
  void Release() { gate_.Release(); }

 private:
  testing::Gate gate_;
  std::mutex mu_;
  uint64_t after_off_ = 0;
  uint64_t after_len_ = 0;
  bool written_ = false;
};

// A 16 MiB image whose syncs can be held, every write and sync recorded.
struct HeldRecorded {
  std::unique_ptr<Image> image;
  HeldSyncStorage* held = nullptr;
  RecordingStorage* rec = nullptr;
};
HeldRecorded OpenHeldRecorded(bool ext) {
  HeldRecorded h;
  auto held = std::make_unique<HeldSyncStorage>(NewImage(16 << 20, ext));
  h.held = held.get();
  auto rec = std::make_unique<RecordingStorage>(std::move(held));
  h.rec = rec.get();
  auto img = Image::Open(std::move(rec), {});
  EXPECT_TRUE(img.has_value());
  if (img) h.image = std::move(*img);
  return h;
}

// A flush with no metadata to write is one sync of the data, and reads and
// writes of allocated clusters go on while it waits for the disk (a
// database's reads beside its log's fsync). A flush that must write
// metadata holds them back, as its ordering needs (the test above).
TEST(FlushConcurrencyTest, CleanFlushSyncsWithoutBlockingRequests) {
  for (bool ext : {false, true}) {
    auto held_owned = std::make_unique<HeldSyncStorage>(NewImage(16 << 20, ext));
    HeldSyncStorage* held = held_owned.get();
    auto img = Image::Open(std::move(held_owned), {});
    ASSERT_TRUE(img.has_value());
    Image& image = **img;
    const std::vector<uint8_t> data = Pattern(1, 4 << 20);
    ASSERT_TRUE(image.Write(0, data).ok());
    ASSERT_TRUE(image.Flush().ok());  // every mapping durable: nothing dirty

    held->Arm();
    auto flush = std::async(std::launch::async, [&] { return image.Flush(); });
    ASSERT_TRUE(held->WaitHeld()) << "the flush never synced";
    // Requests on other threads, bounded: a flush holding the metadata lock
    // across its sync would keep them waiting until Release.
    auto requests = std::async(std::launch::async, [&] {
      Status s = ReadsAsWritten(image, data, 1 << 20, 8192);
      if (s.ok()) s = image.Write(2 << 20, Pattern(2, 4096));
      return s;
    });
    const bool ran =
        requests.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    held->Release();
    EXPECT_TRUE(ran) << "ext=" << ext << ": requests waited for the flush's sync";
    EXPECT_TRUE(requests.get().ok());
    EXPECT_TRUE(flush.get().ok());

    std::vector<uint8_t> got(4096);
    ASSERT_TRUE(image.Read(2 << 20, got).ok());
    EXPECT_EQ(got, Pattern(2, 4096));
  }
}

// A flush that has mappings to write syncs the data first without the lock,
// so another write can complete (and change a mapping) before the flush
// takes the lock again. Its data was not covered by that sync: the flush
// must sync once more before it writes the L2 table naming it.
TEST(FlushConcurrencyTest, WriteDuringTheDataSyncIsSyncedBeforeItsMapping) {
  for (bool ext : {false, true}) {
    HeldRecorded h = OpenHeldRecorded(ext);
    ASSERT_TRUE(h.image);
    Image& image = *h.image;
    HeldSyncStorage* held = h.held;
    RecordingStorage* rec = h.rec;
    ASSERT_TRUE(image.Write(0, Pattern(1, 4096)).ok());
    ASSERT_TRUE(image.Flush().ok());  // the L2 table exists and is durable
    ASSERT_TRUE(image.Write(1 << 20, Pattern(2, 4096)).ok());  // a mapping to write

    held->Arm();
    auto flush = std::async(std::launch::async, [&] { return image.Flush(); });
    ASSERT_TRUE(held->WaitHeld()) << "the flush never synced";
    auto write = std::async(std::launch::async,
                            [&] { return image.Write(2 << 20, Pattern(3, 4096)); });
    const bool ran =
        write.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    held->Release();
    EXPECT_TRUE(ran) << "ext=" << ext << ": a write waited for the flush's data sync";
    ASSERT_TRUE(write.get().ok());
    ASSERT_TRUE(flush.get().ok());
    ASSERT_TRUE(image.Flush().ok());

    auto st = image.GetStatus(2 << 20, 4096);
    ASSERT_TRUE(st.has_value() && st->has_host_offset);
    const uint64_t l2 = FirstL2Table(image);
    const auto ops = rec->ops();
    const int data_w = FirstWrite(ops, st->host_offset, 4096);
    ASSERT_GE(data_w, 0);
    const int l2_w = FirstWrite(ops, l2, 65536, size_t(data_w) + 1);
    ASSERT_GT(l2_w, data_w);
    // Rule: data is durable before the L2 entry that points at it.
    EXPECT_TRUE(FlushBetween(ops, data_w, l2_w)) << "ext=" << ext;

    std::vector<uint8_t> got(4096);
    ASSERT_TRUE(image.Read(2 << 20, got).ok());
    EXPECT_EQ(got, Pattern(3, 4096));
  }
}

// A flush that writes a new mapping into an L2 table already on disk ends
// with the sync that makes that table durable. Nothing is ordered after it
// but the flush's return, so it runs without the metadata lock: reads,
// writes in place and first writes (which change the table again) go on
// while it waits for the disk, and the flush returns only after it.
TEST(FlushConcurrencyTest, MappingSyncWithoutBlockingRequests) {
  for (bool ext : {false, true}) {
    std::unique_ptr<io::MemoryStorage> mem_owned = NewImage(16 << 20, ext);
    io::MemoryStorage* mem = mem_owned.get();
    auto held_owned = std::make_unique<HeldSyncStorage>(std::move(mem_owned));
    HeldSyncStorage* held = held_owned.get();
    auto img = Image::Open(std::move(held_owned), {});
    ASSERT_TRUE(img.has_value());
    Image& image = **img;
    const std::vector<uint8_t> data = Pattern(1, 4 << 20);
    ASSERT_TRUE(image.Write(0, data).ok());
    ASSERT_TRUE(image.Flush().ok());                           // the L2 table is on disk
    ASSERT_TRUE(image.Write(8 << 20, Pattern(2, 4096)).ok());  // a mapping to write
    const uint64_t l2 = FirstL2Table(image);
    ASSERT_NE(l2, 0u);

    held->ArmAfterWrite(l2, 65536);
    auto flush = std::async(std::launch::async, [&] { return image.Flush(); });
    ASSERT_TRUE(held->WaitHeld()) << "the flush never synced its L2 table";
    auto requests = std::async(std::launch::async, [&] {
      Status s = ReadsAsWritten(image, data, 1 << 20, 8192);
      if (s.ok()) s = image.Write(2 << 20, Pattern(3, 4096));
      if (s.ok()) s = image.Write(12 << 20, Pattern(4, 4096));
      return s;
    });
    const bool ran =
        requests.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    const bool returned_early =
        flush.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    held->Release();
    EXPECT_TRUE(ran) << "ext=" << ext << ": requests waited for the L2 table's sync";
    EXPECT_FALSE(returned_early)
        << "ext=" << ext << ": the flush returned before its sync";
    EXPECT_TRUE(requests.get().ok());
    EXPECT_TRUE(flush.get().ok());
    ASSERT_TRUE(image.Flush().ok());
    ASSERT_TRUE(image.Close().ok());

    auto again = Image::Open(mem->Clone(), {});
    ASSERT_TRUE(again.has_value());
    for (auto [off, seed] :
         {std::pair<uint64_t, uint64_t>{2 << 20, 3}, {8 << 20, 2}, {12 << 20, 4}}) {
      std::vector<uint8_t> got(4096);
      ASSERT_TRUE((*again)->Read(off, got).ok());
      EXPECT_EQ(got, Pattern(seed, 4096)) << "ext=" << ext << " at " << off;
    }
  }
}

// A discard that runs while a clean flush syncs the data without the lock
// queues a free whose L2 change is only in memory. The flush may apply that
// free only after writing the change: a refcount block saying "free" must
// never reach the disk while the L2 table there still names the cluster
// (a kill -9 left exactly that: serve.kill, 2026-12-06).
TEST(FlushConcurrencyTest, ADiscardDuringACleanFlushIsFreedOnlyAfterItsMapping) {
  for (bool ext : {false, true}) {
    HeldRecorded h = OpenHeldRecorded(ext);
    ASSERT_TRUE(h.image);
    Image& image = *h.image;
    HeldSyncStorage* held = h.held;
    RecordingStorage* rec = h.rec;
    ASSERT_TRUE(image.Write(0, Pattern(1, 4 << 20)).ok());
    ASSERT_TRUE(image.Flush().ok());  // nothing dirty: the next flush is clean
    const uint64_t l2 = FirstL2Table(image);
    uint8_t raw[8];
    ASSERT_TRUE(image.storage().ReadAt(image.header().refcount_table_offset, raw).ok());
    const uint64_t block = LoadBe64(raw);
    ASSERT_NE(l2, 0u);
    ASSERT_NE(block, 0u);
    const size_t mark = rec->ops().size();

    held->Arm();
    auto flush = std::async(std::launch::async, [&] { return image.Flush(); });
    ASSERT_TRUE(held->WaitHeld()) << "the flush never synced";
    auto discard =
        std::async(std::launch::async, [&] { return image.Discard(1 << 20, 65536); });
    const bool ran =
        discard.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    held->Release();
    ASSERT_TRUE(ran) << "ext=" << ext << ": the discard waited for the flush's data sync";
    ASSERT_TRUE(discard.get().ok());
    ASSERT_TRUE(flush.get().ok());
    ASSERT_TRUE(image.Flush().ok());

    const auto ops = rec->ops();
    const int l2_w = FirstWrite(ops, l2, 65536, mark);
    const int rc_w = FirstWrite(ops, block, 65536, mark);
    ASSERT_GE(l2_w, 0) << "ext=" << ext << ": the discard's mapping was never written";
    ASSERT_GE(rc_w, 0) << "ext=" << ext << ": the free was never written";
    // Rule: a refcount is lowered only after nothing on disk points at the
    // cluster.
    EXPECT_LT(l2_w, rc_w) << "ext=" << ext
                          << ": the free reached the disk before the mapping";
    EXPECT_TRUE(l2_w < rc_w && FlushBetween(ops, l2_w, rc_w)) << "ext=" << ext;
    std::vector<uint8_t> got(65536);
    ASSERT_TRUE(image.Read(1 << 20, got).ok());
    EXPECT_EQ(got, std::vector<uint8_t>(65536, 0));
  }
}

}  // namespace
}  // namespace thindisk::qcow2
