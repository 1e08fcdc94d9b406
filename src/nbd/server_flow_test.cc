// The server over real sockets, under load: the in-flight byte cap,
// parallel requests with replies as they complete, cached writes run inline
// on the connection's reader, and clients that stop reading their replies.
// (The fixture: testing/server_fixture.h; the other commands and hostile
// clients: server_test.cc.)
#include "nbd/server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "nbd/protocol.h"
#include "nbd/testing/memory_device.h"
#include "nbd/testing/raw_client.h"
#include "nbd/testing/server_fixture.h"
#include "nbd/testing/test_server.h"

namespace thindisk::nbd {
namespace {

using testing::kSize;
using testing::LogWatcher;
using testing::MemoryDevice;
using testing::Pattern;
using testing::ProbedDevice;
using testing::RawClient;
using testing::ServerTest;
using testing::TestServer;

// On a structured-reply client, sends `count` pipelined 32K writes and a read, and checks
// every reply arrives and every write landed. Returns the device's peak write
// concurrency.
// *read_position gets the read's place in the order replies arrived.
size_t PipelineWrites(RawClient& c, MemoryDevice& disk, int count,
                      int* read_position = nullptr) {
  for (int i = 0; i < count; ++i) {
    EXPECT_TRUE(c.SendRequest(0, kCmdWrite, 100 + i, uint64_t(i) * 32768, 32768,
                              Pattern(32768, uint8_t(i)))
                    .ok());
  }
  EXPECT_TRUE(c.SendRequest(0, kCmdRead, 500, 0, 512).ok());
  std::set<uint64_t> handles;
  for (int i = 0; i < count + 1; ++i) {
    auto r = c.ReadReply();  // structured: the read's data is in its chunk
    EXPECT_TRUE(r.has_value()) << r.status().ToString();
    if (!r.has_value()) break;
    EXPECT_EQ(r->error, 0u);
    if (r->handle == 500 && read_position) *read_position = i;
    handles.insert(r->handle);
  }
  EXPECT_EQ(handles.size(), size_t(count + 1));
  auto contents = disk.Contents();
  for (int i = 0; i < count; ++i) {
    auto want = Pattern(32768, uint8_t(i));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), contents.begin() + i * 32768)) << i;
  }
  return disk.max_concurrent_writes();
}

TEST_F(ServerTest, InflightBytesCapLimitsConcurrency) {
  ServerOptions options;
  options.threads = 8;
  options.connection.max_inflight_bytes = 64 * 1024;  // two 32K writes at a time
  Start(options);
  disk_->set_write_delay_ms(50);
  auto c = Open("disk", true);
  EXPECT_LE(PipelineWrites(*c, *disk_, 12), 2u);  // the cap, not the 8 threads, limits
}

TEST_F(ServerTest, RequestsRunInParallelAndRepliesComeAsTheyComplete) {
  ServerOptions options;
  options.threads = 8;
  Start(options);
  disk_->set_write_delay_ms(50);
  auto c = Open("disk", true);
  int read_position = -1;
  EXPECT_GT(PipelineWrites(*c, *disk_, 12, &read_position), 2u);  // parallel
  // The read was sent last but does not wait for slow writes ahead of it.
  EXPECT_GE(read_position, 0);
  EXPECT_LT(read_position, 12);
}

TEST_F(ServerTest, PipelinedCachedWritesRunOnTheReader) {
  ServerOptions options;
  options.threads = 8;
  options.connection.inline_cached_writes = true;
  options.connection.slow_write = std::chrono::seconds(30);  // never slow here
  Start(options);
  auto c = Open("disk", true);
  constexpr int kWrites = 64;
  for (int i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(
        c->SendRequest(0, kCmdWrite, i, uint64_t(i) * 4096, 4096, Pattern(4096, uint8_t(i)))
            .ok());
  }
  for (int i = 0; i < kWrites; ++i) {
    auto r = c->ReadReply();
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    EXPECT_EQ(r->error, 0u);
  }
  auto contents = disk_->Contents();
  for (int i = 0; i < kWrites; ++i) {
    auto want = Pattern(4096, uint8_t(i));
    EXPECT_TRUE(std::equal(want.begin(), want.end(), contents.begin() + i * 4096)) << i;
  }
  // No write went to the 8 pool threads: all ran on the connection's reader.
  EXPECT_EQ(disk_->write_threads(), 1u);
  EXPECT_EQ(disk_->max_concurrent_writes(), 1u);
}

// A client that waits for each reply gets its flushes run by the
// connection's reader, as its writes are, once it has sent requests one at a
// time for a while; before that they go to the pool.
TEST_F(ServerTest, AClientsFlushesRunOnTheReaderOnceItSendsOneRequestAtATime) {
  ServerOptions options;
  options.threads = 8;
  Start(options);
  auto c = Open("disk", false);
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 2 * i, uint64_t(i) * 4096, 4096,
                               Pattern(4096, uint8_t(i)))
                    .ok());
    auto w = c->ReadReply();
    ASSERT_TRUE(w.has_value()) << w.status().ToString();
    ASSERT_TRUE(c->SendRequest(0, kCmdFlush, 2 * i + 1, 0, 0).ok());
    auto f = c->ReadReply();
    ASSERT_TRUE(f.has_value()) << f.status().ToString();
    ASSERT_EQ(w->error | f->error, 0u);
    // The first flush follows one lone request: a worker makes it.
    if (i == 0) {
      EXPECT_NE(disk_->last_flush_thread(), disk_->last_write_thread());
    }
  }
  EXPECT_EQ(disk_->flushes(), 40u);
  EXPECT_EQ(disk_->last_flush_thread(), disk_->last_write_thread());  // the reader
  EXPECT_EQ(disk_->write_threads(), 1u);
}

TEST_F(ServerTest, SlowCachedWritesGoBackToThePool) {
  ServerOptions options;
  options.threads = 8;
  options.connection.inline_cached_writes = true;  // slow_write: the default
  Start(options);
  disk_->set_write_delay_ms(50);  // every write waits, as if for a disk
  auto c = Open("disk", true);
  // The first slow write sends the rest to the pool, where they overlap.
  EXPECT_GT(PipelineWrites(*c, *disk_, 12), 2u);
  EXPECT_GT(disk_->write_threads(), 2u);
}

TEST_F(ServerTest, ClientThatNeverReadsRepliesStallsOnlyItself) {
  ServerOptions options;
  options.threads = 2;
  options.drain_timeout = std::chrono::milliseconds(300);
  Start(options);
  ASSERT_TRUE(disk_->Write(0, Pattern(kSize, 3), {}).ok());
  auto greedy = Open("disk", false);
  // 64 x 1 MiB of reads and never a reply read: socket buffers fill up and
  // its writer blocks; the shared worker threads must not.
  for (int i = 0; i < 64; ++i)
    ASSERT_TRUE(greedy->SendRequest(0, kCmdRead, i, 0, 1 << 20).ok());
  // The in-flight cap (64 MiB) admits all 64, and the pool runs every one
  // although the socket takes only the first few hundred KiB of replies:
  // the rest wait on the connection's writer, not on the pool's threads.
  ASSERT_TRUE(disk_->WaitForReads(64)) << disk_->reads() << " of 64 reads ran";
  ExpectStillServing();
  ExpectStillServing();
  // Shutdown is bounded by drain_timeout even with the greedy client.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(server_->Stop().ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A client that pipelines many reads, never reads a reply and vanishes:
// once its replies cannot be sent, the server must stop taking its queued
// requests instead of running every one (up to 4 GiB of reads for nobody).
TEST(ServerVanishedReader, RequestsOfAClientWhoseRepliesFailAreNotRun) {
  auto disk = std::make_shared<ProbedDevice>(kSize);  // counts the reads run
  ASSERT_TRUE(disk->Write(0, Pattern(kSize, 5), {}).ok());
  LogWatcher log;
  ServerOptions options;
  options.connection.max_inflight_bytes = 2 << 20;
  options.connection.log = log.Sink();
  TestServer server({{"disk", "", disk, false}}, options);
  auto c = RawClient::ConnectUnix(server.socket_path());
  ASSERT_TRUE(c.has_value());
  ASSERT_TRUE((*c)->Handshake("disk", /*structured=*/false).has_value());
  constexpr int kReads = 96;
  for (int i = 0; i < kReads; ++i)
    ASSERT_TRUE((*c)->SendRequest(0, kCmdRead, i, 0, 1 << 20).ok());
  // The in-flight cap admits two 1 MiB reads; their replies fill the
  // socket, so nothing more is admitted while the client takes none.
  ASSERT_TRUE(disk->WaitForReads(2)) << disk->reads() << " reads ran";
  const size_t before = disk->reads();
  EXPECT_LT(before, size_t(kReads / 2));
  c->reset();  // gone, with its requests still queued
  // The connection logs why it ended once its last request was answered:
  // from then on nothing more runs for it, so the count is final.
  ASSERT_TRUE(log.WaitFor("nbd: connection ended")) << log.Lines();
  EXPECT_LE(disk->reads(), before + 3) << "requests kept running after the client left";
  EXPECT_TRUE(server.Stop().ok());
}

}  // namespace
}  // namespace thindisk::nbd
