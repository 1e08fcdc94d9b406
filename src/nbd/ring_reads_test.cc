// READs the server hands to its ring (Connection::ReadAsync), over a real
// socket: a device whose plans name a real file and holes, so the reader
// thread reads the file itself. A structured READ gets a hole chunk per
// zero run and a data chunk per data run, as the pool's path sends them;
// a READ of holes only is answered without the ring; DF and simple
// replies spell the zeros out. The device's own Read is never called.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "io/posix_storage.h"
#include "nbd/async_reads.h"
#include "nbd/protocol.h"
#include "nbd/testing/memory_device.h"
#include "nbd/testing/raw_client.h"
#include "nbd/testing/test_server.h"
#include "util/capability_test_util.h"
#include "util/endian.h"
#include "util/temp_dir_test_util.h"

namespace thindisk::nbd {
namespace {

constexpr uint64_t kSize = 1 << 20;
constexpr uint64_t kHole = 65536;  // every odd 64 KiB of the device is a hole

bool IsHole(uint64_t pos) { return (pos / kHole) % 2 == 1; }

// A MemoryDevice whose contents also lie in a file, holes zeroed; it plans
// every read from the file and counts the reads that went through Read.
class PlannedDevice : public testing::MemoryDevice {
 public:
  PlannedDevice(std::unique_ptr<io::Storage> file, const std::vector<uint8_t>& contents)
      : MemoryDevice(kSize), file_(std::move(file)) {
    EXPECT_TRUE(MemoryDevice::Write(0, contents, {}).ok());
    EXPECT_TRUE(file_->WriteAt(0, contents).ok());
  }
  Status Read(uint64_t offset, std::span<uint8_t> buf) override {
    ++reads_;
    return MemoryDevice::Read(offset, buf);
  }
  Result<block::ReadPlan> PlanRead(uint64_t offset, uint64_t length) override {
    block::ReadPlan plan;
    for (uint64_t done = 0; done < length;) {
      const uint64_t pos = offset + done;
      const uint64_t n = std::min(length - done, kHole - pos % kHole);
      plan.pieces.push_back({done, n, IsHole(pos) ? nullptr : file_.get(), pos});
      done += n;
    }
    return plan;
  }
  int reads() const { return reads_.load(); }

 private:
  std::unique_ptr<io::Storage> file_;
  std::atomic<int> reads_{0};
};

class RingReadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    contents_.resize(kSize);
    for (uint64_t i = 0; i < kSize; ++i)
      contents_[i] = IsHole(i) ? 0 : uint8_t(i * 13 + 1);
    io::OpenOptions o;
    o.create = true;
    auto file = io::OpenFile(dir_.File("disk"), o);
    ASSERT_TRUE(file.has_value()) << file.status().ToString();
    TD_REQUIRE_CAPABILITY(AsyncReads::Create(8) != nullptr,
                          "io_uring cannot be set up here");
    disk_ = std::make_shared<PlannedDevice>(std::move(*file), contents_);
    ServerOptions options;
    options.connection.reply_counters = counters_;
    server_ = std::make_unique<testing::TestServer>(
        std::vector<Export>{{"disk", "planned", disk_, false}}, options);
  }
  std::unique_ptr<testing::RawClient> Open(bool structured) {
    auto c = testing::RawClient::ConnectUnix(server_->socket_path());
    EXPECT_TRUE(c.has_value()) << c.status().ToString();
    auto n = (*c)->Handshake("disk", structured, {});
    EXPECT_TRUE(n.has_value()) << n.status().ToString();
    return std::move(*c);
  }
  std::vector<uint8_t> Want(uint64_t offset, uint64_t length) const {
    return {contents_.begin() + offset, contents_.begin() + offset + length};
  }

  test_env::TempDir dir_;
  std::vector<uint8_t> contents_;
  std::shared_ptr<PlannedDevice> disk_;
  std::shared_ptr<ReplyCounters> counters_ = std::make_shared<ReplyCounters>();
  std::unique_ptr<testing::TestServer> server_;
};

// `handles` READs of `length` bytes each, data only (even 64 KiB blocks),
// encoded into one write: the reader finds them all buffered.
std::vector<uint8_t> DataReads(uint64_t handles, uint32_t length) {
  std::vector<uint8_t> batch;
  for (uint64_t h = 0; h < handles; ++h) {
    const std::vector<uint8_t> one =
        testing::RawClient::EncodeRequest(0, kCmdRead, h + 1, 2 * kHole * h, length);
    batch.insert(batch.end(), one.begin(), one.end());
  }
  return batch;
}

// One structured READ's chunks, whichever READ comes next (ring reads
// finish in any order, and each reply's chunks are sent together).
struct ChunkedRead {
  uint64_t handle = 0;
  uint32_t error = 0;
  int holes = 0;
  int chunks = 0;
  std::vector<uint8_t> bytes;
};

// `requests`: handle -> {offset, length}.
Result<ChunkedRead> ReadNext(
    testing::RawClient& c,
    const std::map<uint64_t, std::pair<uint64_t, uint64_t>>& requests) {
  ChunkedRead out;
  for (;;) {
    TD_ASSIGN_OR_RETURN(testing::RawClient::Reply r, c.ReadReply());
    if (!r.structured) return Status::Corrupt("simple reply to a structured read");
    auto it = requests.find(r.handle);
    if (it == requests.end() || (out.chunks > 0 && r.handle != out.handle)) {
      return Status::Corrupt("a chunk of another READ inside a reply");
    }
    const auto [offset, length] = it->second;
    if (out.chunks++ == 0) {
      out.handle = r.handle;
      out.bytes.assign(length, 0xee);
    }
    if (r.type == kReplyTypeOffsetData) {
      const uint64_t at = LoadBe64(r.payload.data()) - offset;
      if (at + r.payload.size() - 8 > length)
        return Status::Corrupt("data outside the request");
      std::copy(r.payload.begin() + 8, r.payload.end(), out.bytes.begin() + at);
    } else if (r.type == kReplyTypeOffsetHole) {
      const uint64_t at = LoadBe64(r.payload.data()) - offset;
      const uint32_t len = LoadBe32(r.payload.data() + 8);
      if (at + len > length) return Status::Corrupt("hole outside the request");
      std::fill_n(out.bytes.begin() + at, len, 0);
      ++out.holes;
    } else {
      out.error = r.error;
    }
    if (r.flags & kReplyFlagDone) return out;
  }
}

TEST_F(RingReadsTest, StructuredReadsSendHoleChunksForPlannedZeros) {
  auto c = Open(/*structured=*/true);
  // Pipelined, so the reader hands them to the ring rather than run one
  // itself. Per handle: offset, length, holes and chunks expected, DF.
  struct Case {
    uint64_t offset, length;
    int holes, chunks;
    bool df;
  };
  const std::map<uint64_t, Case> cases = {
      {1, {0, 4 * kHole, 2, 4, false}},     // data, hole, data, hole
      {2, {kHole, kHole, 1, 1, false}},     // a hole alone: no ring read
      {3, {4096, 2 * kHole, 1, 3, false}},  // starts and ends inside data
      {4, {0, 4 * kHole, 0, 1, true}},      // DF: one chunk, zeros spelled out
      {5, {kHole, kHole, 0, 1, true}}};
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> requests;
  std::vector<uint8_t> batch;  // one write: the reader finds them all buffered
  for (const auto& [handle, k] : cases) {
    requests[handle] = {k.offset, k.length};
    const std::vector<uint8_t> one = testing::RawClient::EncodeRequest(
        k.df ? kCmdFlagDf : 0, kCmdRead, handle, k.offset, uint32_t(k.length));
    batch.insert(batch.end(), one.begin(), one.end());
  }
  ASSERT_TRUE(c->SendBytes(batch).ok());
  std::set<uint64_t> answered;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto got = ReadNext(*c, requests);
    ASSERT_TRUE(got.has_value()) << got.status().ToString();
    const Case& k = cases.at(got->handle);
    EXPECT_TRUE(answered.insert(got->handle).second)
        << "handle " << got->handle << " twice";
    EXPECT_EQ(got->error, 0u);
    EXPECT_EQ(got->holes, k.holes) << "handle " << got->handle;
    EXPECT_EQ(got->chunks, k.chunks) << "handle " << got->handle;
    EXPECT_EQ(got->bytes, Want(k.offset, k.length)) << "handle " << got->handle;
  }
  EXPECT_EQ(disk_->reads(), 0) << "a READ went through the device's Read";
}

TEST_F(RingReadsTest, SimpleRepliesCarryTheZeros) {
  auto c = Open(/*structured=*/false);
  // Equal lengths: the replies may come in either order. One write, as above.
  std::vector<uint8_t> batch;
  for (uint64_t handle : {1, 2}) {
    const std::vector<uint8_t> one = testing::RawClient::EncodeRequest(
        0, kCmdRead, handle, handle == 1 ? 0 : kHole + 512, 2 * kHole);
    batch.insert(batch.end(), one.begin(), one.end());
  }
  ASSERT_TRUE(c->SendBytes(batch).ok());
  std::set<uint64_t> answered;
  for (int i = 0; i < 2; ++i) {
    auto r = c->ReadReply(2 * kHole);
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    EXPECT_EQ(r->error, 0u);
    ASSERT_TRUE(r->handle == 1 || r->handle == 2) << r->handle;
    EXPECT_TRUE(answered.insert(r->handle).second);
    EXPECT_EQ(r->payload, Want(r->handle == 1 ? 0 : kHole + 512, 2 * kHole));
  }
  EXPECT_EQ(disk_->reads(), 0) << "a READ went through the device's Read";
}

TEST_F(RingReadsTest, RepliesReapedTogetherGoOutInOneWrite) {
  auto c = Open(/*structured=*/false);
  // The file's pages are cached (just written), so the ring finishes all
  // eight reads while they are submitted, and one reap finds them done.
  constexpr uint64_t kReads = 8;
  ASSERT_TRUE(c->SendBytes(DataReads(kReads, 4096)).ok());
  std::set<uint64_t> answered;
  for (uint64_t i = 0; i < kReads; ++i) {
    auto r = c->ReadReply(4096);
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    EXPECT_EQ(r->error, 0u);
    ASSERT_TRUE(r->handle >= 1 && r->handle <= kReads) << r->handle;
    EXPECT_TRUE(answered.insert(r->handle).second);
    EXPECT_EQ(r->payload, Want(2 * kHole * (r->handle - 1), 4096));
  }
  EXPECT_EQ(counters_->replies.load(), kReads);
  // One write; a read the kernel finished late could make it two.
  EXPECT_LE(counters_->writes.load(), 2u);
  EXPECT_EQ(disk_->reads(), 0) << "a READ went through the device's Read";
}

TEST_F(RingReadsTest, RepliesTheSocketTakesInPartFollowInOrder) {
  auto c = Open(/*structured=*/false);
  // 8 x 64 KiB replies reaped together are more than the socket takes
  // while the client reads nothing: the write that sends them stops inside
  // one, and the writer sends the rest of it and the replies after it.
  constexpr uint64_t kReads = 8;
  ASSERT_TRUE(c->SendBytes(DataReads(kReads, kHole)).ok());
  // Bounded: the server's sends fill the socket long before this.
  for (int i = 0; i < 200 && counters_->replies.load() < kReads; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::set<uint64_t> answered;
  for (uint64_t i = 0; i < kReads; ++i) {
    auto r = c->ReadReply(kHole);
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    EXPECT_EQ(r->error, 0u);
    ASSERT_TRUE(r->handle >= 1 && r->handle <= kReads) << r->handle;
    EXPECT_TRUE(answered.insert(r->handle).second);
    EXPECT_EQ(r->payload, Want(2 * kHole * (r->handle - 1), kHole))
        << "handle " << r->handle;
  }
  EXPECT_EQ(counters_->replies.load(), kReads);
  EXPECT_GE(counters_->writes.load(), 2u) << "the socket took every reply at once";
}

}  // namespace
}  // namespace thindisk::nbd
