// Prefetches (connection_prefetch.cc), over a real socket: a device whose
// contents lie in a real file, every read planned from the file so the
// reader's ring reads it, every change made to both. A client reading in
// order one request at a time is answered from ranges read ahead; a change
// from any client made before or while a range is read ahead is never
// answered around; a client that pipelines gets none; a prefetch never
// takes the room a READ needs.
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "io/posix_storage.h"
#include "nbd/async_reads.h"
#include "nbd/protocol.h"
#include "nbd/testing/raw_client.h"
#include "nbd/testing/server_fixture.h"
#include "nbd/testing/test_server.h"
#include "util/capability_test_util.h"
#include "util/temp_dir_test_util.h"

namespace thindisk::nbd {
namespace {

using testing::Pattern;
using testing::WaitUntil;

constexpr uint64_t kDiskSize = 16 << 20;
constexpr uint32_t kChunk = 1 << 20;  // every READ here: in the prefetched sizes

// A ProbedDevice (writes can be held) whose contents also lie in a file:
// reads are planned from the file, changes go to both.
class FileDevice : public testing::ProbedDevice {
 public:
  explicit FileDevice(std::unique_ptr<io::Storage> file)
      : ProbedDevice(kDiskSize), file_(std::move(file)) {
    const std::vector<uint8_t> contents = Pattern(kDiskSize, 3);
    EXPECT_TRUE(MemoryDevice::Write(0, contents, {}).ok());
    EXPECT_TRUE(file_->WriteAt(0, contents).ok());
  }
  Status Write(uint64_t offset, std::span<const uint8_t> buf,
               block::WriteFlags flags) override {
    TD_RETURN_IF_ERROR(ProbedDevice::Write(offset, buf, flags));  // may be held
    return file_->WriteAt(offset, buf);
  }
  Status WriteZeroes(uint64_t offset, uint64_t length, block::ZeroFlags flags) override {
    TD_RETURN_IF_ERROR(ProbedDevice::WriteZeroes(offset, length, flags));
    return file_->WriteAt(offset, std::vector<uint8_t>(length, 0));
  }
  Result<block::ReadPlan> PlanRead(uint64_t offset, uint64_t length) override {
    block::ReadPlan plan;
    plan.pieces.push_back({0, length, file_.get(), offset});
    return plan;
  }

 private:
  std::unique_ptr<io::Storage> file_;
};

class PrefetchTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (disk_) disk_->ReleaseWrites();
  }
  void Start(ServerOptions options = {}) {
    ASSERT_TRUE(dir_.ok());
    TD_REQUIRE_CAPABILITY(AsyncReads::Create(8) != nullptr,
                          "io_uring cannot be set up here");
    io::OpenOptions o;
    o.create = true;
    auto file = io::OpenFile(dir_.File("disk"), o);
    ASSERT_TRUE(file.has_value()) << file.status().ToString();
    disk_ = std::make_shared<FileDevice>(std::move(*file));
    options.connection.prefetch_counters = counters_;
    server_ = std::make_unique<testing::TestServer>(
        std::vector<Export>{{"disk", "file", disk_, false}}, std::move(options));
  }
  std::unique_ptr<testing::RawClient> Open(bool structured = true) {
    auto c = testing::RawClient::ConnectUnix(server_->socket_path());
    EXPECT_TRUE(c.has_value()) << c.status().ToString();
    auto n = (*c)->Handshake("disk", structured, {});
    EXPECT_TRUE(n.has_value()) << n.status().ToString();
    return std::move(*c);
  }
  // Reads chunk `i` alone and checks it against the device's contents.
  void ReadChunk(testing::RawClient& c, uint64_t i) {
    ASSERT_TRUE(c.SendRequest(0, kCmdRead, 100 + i, i * kChunk, kChunk).ok());
    std::vector<uint8_t> out(kChunk, 0xee);
    auto err = c.ReadStructuredRead(i * kChunk, &out);
    ASSERT_TRUE(err.has_value()) << err.status().ToString();
    ASSERT_EQ(*err, 0u);
    const std::vector<uint8_t> all = disk_->Contents();
    ASSERT_TRUE(std::equal(out.begin(), out.end(), all.begin() + i * kChunk))
        << "chunk " << i;
  }
  void ReadChunks(testing::RawClient& c, uint64_t first, uint64_t end) {
    for (uint64_t i = first; i < end; ++i) ASSERT_NO_FATAL_FAILURE(ReadChunk(c, i));
  }
  // Waits until every prefetch started has read its range.
  bool PrefetchesRead() {
    return WaitUntil([&] { return counters_->completed == counters_->started; });
  }
  void WriteAt(testing::RawClient& c, uint64_t offset, uint8_t seed) {
    ASSERT_TRUE(c.SendRequest(0, kCmdWrite, 7, offset, 4096, Pattern(4096, seed)).ok());
    auto r = c.ReadReply();
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    ASSERT_EQ(r->error, 0u);
  }

  test_env::TempDir dir_;
  std::shared_ptr<PrefetchCounters> counters_ = std::make_shared<PrefetchCounters>();
  std::shared_ptr<FileDevice> disk_;
  std::unique_ptr<testing::TestServer> server_;
};

TEST_F(PrefetchTest, AClientReadingInOrderIsAnsweredFromRangesReadAhead) {
  Start();
  auto c = Open();
  // Lone from its 8th READ on, in order from its 3rd: each READ after the
  // 8th (8 to 11) is answered from the range read after the one before.
  ReadChunks(*c, 0, 12);
  EXPECT_EQ(counters_->used, 4u);
  EXPECT_EQ(counters_->dropped, 0u);
  EXPECT_EQ(counters_->started, 5u);  // the 5th, chunk 12, is held
  ASSERT_TRUE(PrefetchesRead());
  // Leaving with it held gives its room back: the server still serves and
  // stops (the fixture) without waiting for it.
  c.reset();
  auto d = Open();
  ReadChunk(*d, 15);
}

TEST_F(PrefetchTest, SimpleRepliesAreAnsweredFromThePrefetchToo) {
  Start();
  auto c = Open(/*structured=*/false);
  for (uint64_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(c->SendRequest(0, kCmdRead, i, i * kChunk, kChunk).ok());
    auto r = c->ReadReply(kChunk);
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    ASSERT_EQ(r->error, 0u);
    const std::vector<uint8_t> all = disk_->Contents();
    ASSERT_TRUE(
        std::equal(r->payload.begin(), r->payload.end(), all.begin() + i * kChunk))
        << i;
  }
  EXPECT_EQ(counters_->used, 2u);
}

TEST_F(PrefetchTest, AChangeFromAnotherClientAfterTheRangeWasReadIsNotAnsweredAround) {
  Start();
  auto reader = Open();
  auto writer = Open();
  ReadChunks(*reader, 0, 9);  // chunk 9 is read ahead
  ASSERT_TRUE(PrefetchesRead());
  ASSERT_EQ(counters_->started, 2u);
  WriteAt(*writer, 9 * kChunk + 8192, 77);
  ReadChunk(*reader, 9);  // the written bytes, not the range read before
  EXPECT_EQ(counters_->dropped, 1u);
  // Zeroes and trims count as changes too.
  ReadChunk(*reader, 10);
  ReadChunk(*reader, 11);
  ASSERT_TRUE(PrefetchesRead());
  ASSERT_TRUE(writer->SendRequest(0, kCmdWriteZeroes, 8, 12 * kChunk, 65536).ok());
  auto r = writer->ReadReply();
  ASSERT_TRUE(r.has_value() && r->error == 0u);
  ReadChunk(*reader, 12);
  EXPECT_EQ(counters_->dropped, 2u);
}

TEST_F(PrefetchTest, NoRangeIsReadAheadWhileAChangeRuns) {
  Start();
  auto reader = Open();
  auto writer = Open();
  disk_->HoldWrites();
  ASSERT_TRUE(
      writer->SendRequest(0, kCmdWrite, 7, 10 * kChunk, 4096, Pattern(4096, 55)).ok());
  ASSERT_TRUE(disk_->WaitForWritesStarted(1));
  // The write has begun, not ended: a range read now might hold half of it.
  ReadChunks(*reader, 0, 10);
  EXPECT_EQ(counters_->started, 0u);
  disk_->ReleaseWrites();
  auto r = writer->ReadReply();
  ASSERT_TRUE(r.has_value() && r->error == 0u);
  ReadChunk(*reader, 10);  // the write's bytes
  ReadChunk(*reader, 11);
  EXPECT_EQ(counters_->used, 1u);  // chunk 11, read ahead after the write ended
}

TEST_F(PrefetchTest, AClientsOwnWriteDropsThePrefetch) {
  Start();
  auto c = Open();
  ReadChunks(*c, 0, 9);
  ASSERT_TRUE(PrefetchesRead());
  WriteAt(*c, 9 * kChunk, 91);
  EXPECT_EQ(counters_->dropped, 1u);
  ReadChunk(*c, 9);
}

TEST_F(PrefetchTest, FlushesAndBlockStatusBetweenReadsKeepIt) {
  Start();
  auto c = testing::RawClient::ConnectUnix(server_->socket_path());
  ASSERT_TRUE(c.has_value()) << c.status().ToString();
  auto n = (*c)->Handshake("disk", true, {"base:allocation"});
  ASSERT_TRUE(n.has_value()) << n.status().ToString();
  for (uint64_t i = 0; i < 12; ++i) {
    ASSERT_NO_FATAL_FAILURE(ReadChunk(**c, i));
    ASSERT_TRUE((*c)->SendRequest(0, kCmdFlush, 500 + i, 0, 0).ok());
    auto f = (*c)->ReadReply();
    ASSERT_TRUE(f.has_value() && f->error == 0u);
    ASSERT_TRUE(
        (*c)->SendRequest(0, kCmdBlockStatus, 600 + i, (i + 1) * kChunk, kChunk).ok());
    for (;;) {  // its chunks, up to the one with DONE
      auto b = (*c)->ReadReply();
      ASSERT_TRUE(b.has_value()) << b.status().ToString();
      ASSERT_EQ(b->error, 0u);
      if (b->flags & kReplyFlagDone) break;
    }
  }
  // Lone from its 8th request (the 3rd READ's flush): READs 4 to 11 are
  // answered from ranges read ahead.
  EXPECT_EQ(counters_->used, 8u);
  EXPECT_EQ(counters_->dropped, 0u);
}

TEST_F(PrefetchTest, AClientThatPipelinesGetsNoPrefetch) {
  Start();
  auto c = Open();
  for (uint64_t i = 0; i < 16; i += 2) {
    // Both in one send, so the server finds the second behind the first
    // (sent one by one, a slow client's first READ may be answered before
    // its second arrives, which is a lone client).
    std::vector<uint8_t> batch =
        testing::RawClient::EncodeRequest(0, kCmdRead, i, i * kChunk, kChunk);
    const std::vector<uint8_t> second =
        testing::RawClient::EncodeRequest(0, kCmdRead, i + 1, (i + 1) * kChunk, kChunk);
    batch.insert(batch.end(), second.begin(), second.end());
    ASSERT_TRUE(c->SendBytes(batch).ok());
    for (int k = 0; k < 2; ++k) {
      // Replies may come in either order: read them by their chunks.
      auto rep = c->ReadReply();
      ASSERT_TRUE(rep.has_value()) << rep.status().ToString();
      while (!(rep->flags & kReplyFlagDone)) {
        rep = c->ReadReply();
        ASSERT_TRUE(rep.has_value()) << rep.status().ToString();
      }
    }
  }
  EXPECT_EQ(counters_->started, 0u);
}

TEST_F(PrefetchTest, APrefetchNeverTakesTheRoomAReadNeeds) {
  // READs of 256 KiB run on the reader, done before the next is planned:
  // room for one such READ and a half, so a prefetch beside one would
  // leave the READ it is for waiting for good.
  constexpr uint32_t kRead = 256 << 10;
  ServerOptions options;
  options.connection.max_inflight_bytes = kRead + kRead / 2;
  Start(std::move(options));
  auto c = Open();
  const std::vector<uint8_t> all = disk_->Contents();
  for (uint64_t i = 0; i < 12; ++i) {
    ASSERT_TRUE(c->SendRequest(0, kCmdRead, i, i * kRead, kRead).ok());
    std::vector<uint8_t> out(kRead, 0xee);
    auto err = c->ReadStructuredRead(i * kRead, &out);
    ASSERT_TRUE(err.has_value()) << i << ": " << err.status().ToString();
    ASSERT_EQ(*err, 0u);
    ASSERT_TRUE(std::equal(out.begin(), out.end(), all.begin() + i * kRead)) << i;
  }
  EXPECT_EQ(counters_->started, 0u);
}

TEST_F(PrefetchTest, OffMeansOff) {
  ServerOptions options;
  options.connection.prefetch_reads = false;
  Start(std::move(options));
  auto c = Open();
  ReadChunks(*c, 0, 12);
  EXPECT_EQ(counters_->started, 0u);
}

}  // namespace
}  // namespace thindisk::nbd
