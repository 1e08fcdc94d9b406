// The order of the named write steps (docs/write-ordering.md), observed on
// a storage that records every announcement, write and sync.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "io/memory_storage.h"
#include "qcow2/image.h"

namespace thindisk::crash {
namespace {

// Forwards to a MemoryStorage and logs "event name", "write", "punch" and
// "sync" in order.
class RecordingStorage final : public io::Storage {
 public:
  explicit RecordingStorage(std::vector<std::string>* log)
      : base_(io::NewMemoryStorage("rec.qcow2")), log_(log) {}
  Status ReadAt(uint64_t o, std::span<uint8_t> b) override { return base_->ReadAt(o, b); }
  Status WriteAt(uint64_t o, std::span<const uint8_t> b) override {
    log_->push_back("write");
    return base_->WriteAt(o, b);
  }
  Status Flush() override {
    log_->push_back("sync");
    return base_->Flush();
  }
  Result<uint64_t> Size() override { return base_->Size(); }
  Status Resize(uint64_t s) override { return base_->Resize(s); }
  Status Allocate(uint64_t o, uint64_t n) override { return base_->Allocate(o, n); }
  Status PunchHole(uint64_t o, uint64_t n) override {
    log_->push_back("punch");
    return base_->PunchHole(o, n);
  }
  Status ZeroRange(uint64_t o, uint64_t n) override { return base_->ZeroRange(o, n); }
  Result<uint64_t> NextData(uint64_t o) override { return base_->NextData(o); }
  Result<uint64_t> NextHole(uint64_t o) override { return base_->NextHole(o); }
  Result<uint64_t> AllocatedBytes() override { return base_->AllocatedBytes(); }
  uint64_t bytes_written() const override { return base_->bytes_written(); }
  const std::string& name() const override { return base_->name(); }
  void Announce(io::Event e) override { log_->push_back(io::EventName(e)); }

 private:
  std::unique_ptr<io::MemoryStorage> base_;
  std::vector<std::string>* log_;
};

struct Recorded {
  std::vector<std::string> log;
  std::unique_ptr<qcow2::Image> image;
};

std::unique_ptr<Recorded> CreateRecorded(const qcow2::CreateOptions& co) {
  auto r = std::make_unique<Recorded>();
  auto storage = std::make_unique<RecordingStorage>(&r->log);
  EXPECT_TRUE(qcow2::Create(*storage, co).ok());
  auto img = qcow2::Image::Open(std::move(storage), {});
  EXPECT_TRUE(img.has_value());
  if (img) r->image = std::move(*img);
  r->log.clear();
  return r;
}

// Index of the first `what` at or after `from` (log.size() if none).
size_t Find(const std::vector<std::string>& log, const std::string& what, size_t from = 0) {
  auto it = std::find(log.begin() + std::min(from, log.size()), log.end(), what);
  return size_t(it - log.begin());
}

// A sync lies strictly between positions a and b.
bool SyncBetween(const std::vector<std::string>& log, size_t a, size_t b) {
  return Find(log, "sync", a + 1) < b;
}

std::string Joined(const std::vector<std::string>& log) {
  std::string s;
  for (const auto& e : log) s += e + " ";
  return s;
}

TEST(WriteOrdering, FirstWriteThenFlushFollowsTheStages) {
  qcow2::CreateOptions co;
  co.size = 64 << 20;
  co.cluster_size = 65536;
  co.extended_l2 = false;
  auto r = CreateRecorded(co);
  std::vector<uint8_t> data(4096, 0x42);
  ASSERT_TRUE(r->image->Write(1 << 20, data, {}).ok());
  ASSERT_TRUE(r->image->Flush().ok());
  const auto& log = r->log;
  SCOPED_TRACE(Joined(log));
  size_t data_write = Find(log, "data_write");
  size_t refblock = std::min(Find(log, "refblock_update"), Find(log, "refblock_alloc"));
  size_t l2 = Find(log, "l2_alloc");
  size_t l1 = Find(log, "l1_update");
  ASSERT_LT(data_write, log.size());
  ASSERT_LT(refblock, log.size());
  ASSERT_LT(l2, log.size());
  ASSERT_LT(l1, log.size());
  EXPECT_LT(data_write, refblock);
  EXPECT_TRUE(SyncBetween(log, data_write, l2)) << "data durable before its L2 entry";
  EXPECT_TRUE(SyncBetween(log, refblock, l2)) << "refcount raised before the L2 points";
  EXPECT_TRUE(SyncBetween(log, l2, l1)) << "L2 table durable before the L1 entry";
  EXPECT_EQ(log.back(), "sync");
}

TEST(WriteOrdering, EveryAnnouncedStepIsTheNextMutation) {
  qcow2::CreateOptions co;
  co.size = 8 << 20;
  co.cluster_size = 16384;
  co.extended_l2 = true;
  auto r = CreateRecorded(co);
  std::vector<uint8_t> data(100000, 0x17);
  ASSERT_TRUE(r->image->Write(12345, data, {}).ok());
  ASSERT_TRUE(r->image->Write(12345 + 7, std::span<const uint8_t>(data).first(300), {}).ok());
  ASSERT_TRUE(r->image->Discard(0, 1 << 20).ok());
  ASSERT_TRUE(r->image->Resize(4ull << 30, false).ok());  // the L1 table grows
  ASSERT_TRUE(r->image->Write(3ull << 30, data, {}).ok());
  ASSERT_TRUE(r->image->Close().ok());
  const auto& log = r->log;
  SCOPED_TRACE(Joined(log));
  for (size_t i = 0; i < log.size(); ++i) {
    const std::string& e = log[i];
    if (e == "write" || e == "punch" || e == "sync" || e == "cow_read") continue;
    ASSERT_LT(i + 1, log.size()) << e << " announced last";
    const std::string& next = e == "discard_punch" ? "punch" : "write";
    EXPECT_EQ(log[i + 1], next) << "step " << e << " at " << i;
  }
  for (const char* step : {"data_write", "cow_write", "l2_alloc", "l1_update", "l1_grow",
                           "header_update", "discard_punch"}) {
    EXPECT_LT(Find(log, step), log.size()) << step << " never announced";
  }
  // A grown L1 table is durable before the header points at it.
  size_t grow = Find(log, "l1_grow");
  EXPECT_TRUE(SyncBetween(log, grow, Find(log, "header_update", grow)));
}

}  // namespace
}  // namespace thindisk::crash
