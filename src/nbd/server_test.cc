// The server over real sockets, driven byte by byte (testing/raw_client.h):
// every command, the structured and simple reply paths, and hostile
// clients, checking exact error codes and that the server keeps serving.
// (The fixture: testing/server_fixture.h; flow control, concurrency and
// clients that stop reading: server_flow_test.cc.)
#include "nbd/server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "nbd/fd_io.h"
#include "nbd/protocol.h"
#include "nbd/testing/memory_device.h"
#include "nbd/testing/raw_client.h"
#include "nbd/testing/server_fixture.h"
#include "util/endian.h"

namespace thindisk::nbd {
namespace {

using testing::kSize;
using testing::LogWatcher;
using testing::MemoryDevice;
using testing::Pattern;
using testing::ProbedDevice;
using testing::RawClient;
using testing::ServerTest;

TEST_F(ServerTest, WriteThenReadWithSimpleReplies) {
  Start();
  auto c = Open("disk", /*structured=*/false);
  auto data = Pattern(8192, 3);
  ASSERT_TRUE(c->SendRequest(kCmdFlagFua, kCmdWrite, 1, 4096, 8192, data).ok());
  auto w = c->ReadReply();
  ASSERT_TRUE(w.has_value());
  EXPECT_FALSE(w->structured);
  EXPECT_EQ(w->handle, 1u);
  EXPECT_EQ(w->error, 0u);
  EXPECT_EQ(disk_->fua_writes(), 1u);
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 2, 4096, 8192).ok());
  auto r = c->ReadReply(8192);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->handle, 2u);
  EXPECT_EQ(r->payload, data);
  ASSERT_TRUE(c->SendRequest(0, kCmdFlush, 3, 0, 0).ok());
  EXPECT_EQ(c->ReadReply()->error, 0u);
  EXPECT_GE(disk_->flushes(), 1u);
}

TEST_F(ServerTest, StructuredReadSendsHolesAndData) {
  Start();
  auto c = Open("disk", /*structured=*/true);
  auto data = Pattern(4096, 9);
  ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 1, 8192, 4096, data).ok());
  ASSERT_EQ(c->ReadReply()->error, 0u);
  // [0, 8K) hole, [8K, 12K) data, [12K, 16K) hole.
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 2, 0, 16384).ok());
  std::vector<uint8_t> out(16384, 0xee);
  int holes = 0, chunks = 0;
  auto err = c->ReadStructuredRead(0, &out, &holes, &chunks);
  ASSERT_TRUE(err.has_value()) << err.status().ToString();
  EXPECT_EQ(*err, 0u);
  EXPECT_EQ(holes, 2);
  EXPECT_EQ(chunks, 3);
  std::vector<uint8_t> want(16384, 0);
  std::copy(data.begin(), data.end(), want.begin() + 8192);
  EXPECT_EQ(out, want);
  // DF: one data chunk with the zeros spelled out.
  ASSERT_TRUE(c->SendRequest(kCmdFlagDf, kCmdRead, 3, 0, 16384).ok());
  std::fill(out.begin(), out.end(), 0xee);
  holes = chunks = 0;
  EXPECT_EQ(*c->ReadStructuredRead(0, &out, &holes, &chunks), 0u);
  EXPECT_EQ(holes, 0);
  EXPECT_EQ(chunks, 1);
  EXPECT_EQ(out, want);
}

TEST_F(ServerTest, BlockStatusForBothContexts) {
  Start();
  auto c = Open("disk", true, {kContextBaseAllocation, kContextAllocationDepth});
  ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 1, 4096, 4096, Pattern(4096, 1)).ok());
  ASSERT_EQ(c->ReadReply()->error, 0u);
  ASSERT_TRUE(c->SendRequest(0, kCmdBlockStatus, 2, 0, 16384).ok());
  auto a = c->ReadReply();
  auto b = c->ReadReply();
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->type, kReplyTypeBlockStatus);
  EXPECT_EQ(a->flags & kReplyFlagDone, 0);
  EXPECT_EQ(b->flags & kReplyFlagDone, kReplyFlagDone);
  // base:allocation: hole+zero, data, hole+zero.
  ASSERT_EQ(a->payload.size(), 4u + 3 * 8);
  EXPECT_EQ(LoadBe32(a->payload.data()), kBaseAllocationContextId);
  EXPECT_EQ(LoadBe32(a->payload.data() + 4), 4096u);
  EXPECT_EQ(LoadBe32(a->payload.data() + 8), kStateHole | kStateZero);
  EXPECT_EQ(LoadBe32(a->payload.data() + 12), 4096u);
  EXPECT_EQ(LoadBe32(a->payload.data() + 16), 0u);
  EXPECT_EQ(LoadBe32(a->payload.data() + 20), 8192u);
  EXPECT_EQ(LoadBe32(a->payload.data() + 24), kStateHole | kStateZero);
  // qemu:allocation-depth: 0 unallocated, 1 this image.
  EXPECT_EQ(LoadBe32(b->payload.data()), kAllocationDepthContextId);
  EXPECT_EQ(LoadBe32(b->payload.data() + 8), 0u);
  EXPECT_EQ(LoadBe32(b->payload.data() + 16), 1u);
  // REQ_ONE: one descriptor per context.
  ASSERT_TRUE(c->SendRequest(kCmdFlagReqOne, kCmdBlockStatus, 3, 0, 16384).ok());
  EXPECT_EQ(c->ReadReply()->payload.size(), 12u);
  EXPECT_EQ(c->ReadReply()->payload.size(), 12u);
}

TEST_F(ServerTest, TrimWriteZeroesAndCache) {
  Start();
  auto c = Open("disk", true, {kContextBaseAllocation});
  ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 1, 0, 16384, Pattern(16384, 5)).ok());
  ASSERT_EQ(c->ReadReply()->error, 0u);
  ASSERT_TRUE(c->SendRequest(0, kCmdTrim, 2, 0, 4096).ok());
  ASSERT_EQ(c->ReadReply()->error, 0u);
  ASSERT_TRUE(c->SendRequest(kCmdFlagNoHole, kCmdWriteZeroes, 3, 4096, 4096).ok());
  ASSERT_EQ(c->ReadReply()->error, 0u);
  ASSERT_TRUE(c->SendRequest(kCmdFlagFastZero, kCmdWriteZeroes, 4, 8192, 4096).ok());
  ASSERT_EQ(c->ReadReply()->error, 0u);
  ASSERT_TRUE(c->SendRequest(0, kCmdCache, 5, 0, 16384).ok());
  ASSERT_EQ(c->ReadReply()->error, 0u);
  auto contents = disk_->Contents();
  EXPECT_TRUE(std::all_of(contents.begin(), contents.begin() + 12288,
                          [](uint8_t b) { return b == 0; }));
  ASSERT_TRUE(c->SendRequest(0, kCmdBlockStatus, 6, 0, 16384).ok());
  auto bs = c->ReadReply();
  ASSERT_TRUE(bs.has_value());
  // Trimmed: hole; NO_HOLE zeroes: allocated; unmapping zeroes: hole; data.
  ASSERT_EQ(bs->payload.size(), 4u + 4 * 8);
  EXPECT_EQ(LoadBe32(bs->payload.data() + 8), kStateHole | kStateZero);
  EXPECT_EQ(LoadBe32(bs->payload.data() + 16), 0u);
  EXPECT_EQ(LoadBe32(bs->payload.data() + 24), kStateHole | kStateZero);
  EXPECT_EQ(LoadBe32(bs->payload.data() + 32), 0u);
}

TEST_F(ServerTest, DeviceStatusesBecomeNbdErrors) {
  Start();
  auto c = Open("disk", /*structured=*/false);
  // FAST_ZERO on a device that cannot zero fast: kNotSupported -> ENOTSUP,
  // and nothing was written.
  ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 1, 0, 4096, Pattern(4096, 1)).ok());
  ASSERT_EQ(c->ReadReply()->error, 0u);
  disk_->set_slow_zeroes(true);
  ASSERT_TRUE(c->SendRequest(kCmdFlagFastZero, kCmdWriteZeroes, 2, 0, 4096).ok());
  EXPECT_EQ(c->ReadReply()->error, kEnotsup);
  EXPECT_EQ(disk_->Contents()[0], Pattern(1, 1)[0]);
  // Without FAST_ZERO the same device zeroes.
  ASSERT_TRUE(c->SendRequest(0, kCmdWriteZeroes, 3, 0, 4096).ok());
  EXPECT_EQ(c->ReadReply()->error, 0u);
  EXPECT_EQ(disk_->Contents()[0], 0);
  // A failing read: kIoError -> EIO, simple reply without data.
  disk_->set_fail_reads(true);
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 4, 0, 4096).ok());
  EXPECT_EQ(c->ReadReply(4096)->error, kEio);
  disk_->set_fail_reads(false);
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 5, 0, 512).ok());
  auto ok = c->ReadReply(512);
  EXPECT_EQ(ok->handle, 5u);  // still in sync after the error
  EXPECT_EQ(ok->error, 0u);
}

TEST_F(ServerTest, OptionListAndExportNameOverSocket) {
  Start();
  auto c = Connect();
  ASSERT_EQ(*c->ReadGreeting(), kFlagFixedNewstyle | kFlagNoZeroes);
  ASSERT_TRUE(c->SendClientFlags(kFlagCFixedNewstyle).ok());
  ASSERT_TRUE(c->SendOption(kOptList).ok());
  std::vector<std::string> names;
  for (;;) {
    auto r = c->ReadOptionReply();
    ASSERT_TRUE(r.has_value());
    if (r->type == kRepAck) break;
    ASSERT_EQ(r->type, kRepServer);
    names.emplace_back(r->data.begin() + 4,
                       r->data.begin() + 4 + LoadBe32(r->data.data()));
  }
  EXPECT_EQ(names, (std::vector<std::string>{"disk", "ro"}));
  std::vector<uint8_t> name = {'d', 'i', 's', 'k'};
  ASSERT_TRUE(c->SendOption(kOptExportName, name).ok());
  uint8_t reply[10 + 124];  // no NO_ZEROES: the 124 zero bytes come
  ASSERT_TRUE(ReadExact(c->fd(), reply).ok());
  EXPECT_EQ(LoadBe64(reply), kSize);
  ASSERT_TRUE(c->SendRequest(0, kCmdDisc, 1, 0, 0).ok());
  EXPECT_TRUE(c->ServerClosed());
}

// ---- Hostile clients ----

TEST_F(ServerTest, BadOptionMagicEndsOnlyThatSession) {
  Start();
  auto c = Connect();
  ASSERT_TRUE(c->ReadGreeting().has_value());
  ASSERT_TRUE(c->SendClientFlags(kFlagCFixedNewstyle).ok());
  std::vector<uint8_t> junk(16, 0x41);
  ASSERT_TRUE(c->SendBytes(junk).ok());
  EXPECT_TRUE(c->ServerClosed());
  ExpectStillServing();
}

TEST_F(ServerTest, UnknownClientFlagsEndTheSession) {
  Start();
  auto c = Connect();
  ASSERT_TRUE(c->ReadGreeting().has_value());
  ASSERT_TRUE(c->SendClientFlags(0x80).ok());
  EXPECT_TRUE(c->ServerClosed());
  ExpectStillServing();
}

TEST_F(ServerTest, UnknownOptionIsUnsupportedAndNegotiationGoesOn) {
  Start();
  auto c = Connect();
  ASSERT_TRUE(c->ReadGreeting().has_value());
  ASSERT_TRUE(c->SendClientFlags(kFlagCFixedNewstyle).ok());
  std::vector<uint8_t> data = {1, 2, 3};
  ASSERT_TRUE(c->SendOption(0x7777, data).ok());
  auto r = c->ReadOptionReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->option, 0x7777u);
  EXPECT_EQ(r->type, kRepErrUnsup);
  ASSERT_TRUE(c->SendOption(kOptGo, testing::GoData("disk")).ok());
  for (;;) {
    auto g = c->ReadOptionReply();
    ASSERT_TRUE(g.has_value());
    if (g->type == kRepAck) break;
    ASSERT_EQ(g->type, kRepInfo);
  }
}

TEST_F(ServerTest, OversizeOptionLengthIsRefusedWithoutReadingIt) {
  Start();
  auto c = Connect();
  ASSERT_TRUE(c->ReadGreeting().has_value());
  ASSERT_TRUE(c->SendClientFlags(kFlagCFixedNewstyle).ok());
  ASSERT_TRUE(c->SendOptionHeader(kOptGo, 0xfffffff0u).ok());
  auto r = c->ReadOptionReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->option, kOptGo);
  EXPECT_EQ(r->type, kRepErrTooBig);
  EXPECT_TRUE(c->ServerClosed());
  ExpectStillServing();
}

TEST_F(ServerTest, RequestsPastTheEndGetExactErrors) {
  Start();
  auto c = Open("disk", /*structured=*/false);
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 1, kSize - 512, 1024).ok());
  auto r = c->ReadReply(1024);
  EXPECT_EQ(r->error, kEinval);
  EXPECT_TRUE(r->payload.empty());
  // A write past the end: ENOSPC, and its payload is skipped, not parsed.
  ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 2, kSize, 4096, Pattern(4096, 0)).ok());
  EXPECT_EQ(c->ReadReply()->error, kEnospc);
  ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 3, ~0ULL - 100, 4096, Pattern(4096, 0)).ok());
  EXPECT_EQ(c->ReadReply()->error, kEnospc);
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 4, 0, kMaxPayloadLength + 1).ok());
  EXPECT_EQ(c->ReadReply()->error, kEinval);
  ASSERT_TRUE(c->SendRequest(0, 42, 5, 0, 512).ok());
  EXPECT_EQ(c->ReadReply()->error, kEinval);
  ASSERT_TRUE(c->SendRequest(kCmdFlagReqOne, kCmdRead, 6, 0, 512).ok());
  EXPECT_EQ(c->ReadReply()->error, kEinval);
  // BLOCK_STATUS without a context.
  ASSERT_TRUE(c->SendRequest(0, kCmdBlockStatus, 7, 0, 512).ok());
  EXPECT_EQ(c->ReadReply()->error, kEinval);
  // The session is still in sync.
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 8, 0, 512).ok());
  auto ok = c->ReadReply(512);
  EXPECT_EQ(ok->handle, 8u);
  EXPECT_EQ(ok->error, 0u);
}

TEST_F(ServerTest, StructuredErrorsCarryAMessage) {
  Start();
  auto c = Open("disk", /*structured=*/true);
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 1, kSize, 512).ok());
  auto r = c->ReadReply();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->type, kReplyTypeError);
  EXPECT_EQ(r->flags, kReplyFlagDone);
  EXPECT_EQ(r->error, kEinval);
  EXPECT_GT(LoadBe16(r->payload.data() + 4), 0);
  // A device error maps through NbdErrorFromStatus: kIoError -> EIO. (The
  // range must hold data: holes are answered without reading.)
  ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 9, 0, 512, Pattern(512, 2)).ok());
  ASSERT_EQ(c->ReadReply()->error, 0u);
  disk_->set_fail_reads(true);
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 2, 0, 512).ok());
  EXPECT_EQ(c->ReadReply()->error, kEio);
}

TEST_F(ServerTest, WriteToReadOnlyExportIsEperm) {
  Start();
  auto c = Open("ro", /*structured=*/false);
  ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 1, 0, 512, Pattern(512, 1)).ok());
  EXPECT_EQ(c->ReadReply()->error, kEperm);
  ASSERT_TRUE(c->SendRequest(0, kCmdTrim, 2, 0, 512).ok());
  EXPECT_EQ(c->ReadReply()->error, kEperm);
  ASSERT_TRUE(c->SendRequest(0, kCmdWriteZeroes, 3, 0, 512).ok());
  EXPECT_EQ(c->ReadReply()->error, kEperm);
  auto contents = ro_->Contents();
  EXPECT_TRUE(
      std::all_of(contents.begin(), contents.end(), [](uint8_t b) { return b == 0; }));
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 4, 0, 512).ok());
  EXPECT_EQ(c->ReadReply(512)->error, 0u);
}

TEST_F(ServerTest, BadRequestMagicEndsTheSession) {
  Start();
  auto c = Open("disk", false);
  std::vector<uint8_t> junk(28, 0x5a);
  ASSERT_TRUE(c->SendBytes(junk).ok());
  EXPECT_TRUE(c->ServerClosed());
  ExpectStillServing();
}

TEST_F(ServerTest, ClientVanishingMidRequest) {
  Start();
  {
    auto c = Open("disk", false);
    // A WRITE header promising 64K, then half of it, then gone.
    std::vector<uint8_t> half = Pattern(32768, 1);
    ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 1, 0, 65536).ok());
    ASSERT_TRUE(c->SendBytes(half).ok());
  }
  {
    auto c = Open("disk", true);  // mid-header this time
    std::vector<uint8_t> partial = {0x25, 0x60, 0x95};
    ASSERT_TRUE(c->SendBytes(partial).ok());
  }
  {
    auto c = Connect();  // mid-handshake
    ASSERT_TRUE(c->ReadGreeting().has_value());
  }
  ExpectStillServing();
  auto contents = disk_->Contents();
  EXPECT_TRUE(
      std::all_of(contents.begin(), contents.end(), [](uint8_t b) { return b == 0; }));
}

TEST_F(ServerTest, ClientVanishingBeforeItsReply) {
  LogWatcher log;
  ServerOptions options;
  options.connection.log = log.Sink();
  Start(options);
  disk_->HoldWrites();
  {
    auto c = Open("disk", false);
    ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 1, 0, 4096, Pattern(4096, 4)).ok());
    ASSERT_TRUE(disk_->WaitForWritesStarted(1));
  }  // closed while the write is in the device: its reply has nowhere to go
  disk_->ReleaseWrites();
  ASSERT_TRUE(log.WaitFor("nbd: cannot send reply")) << log.Lines();
  ExpectStillServing();
}

TEST_F(ServerTest, RandomSessionsNeverHurtTheServer) {
  Start();
  std::mt19937 rng(1129);
  for (int i = 0; i < 150; ++i) {
    auto c = Connect();
    ASSERT_TRUE(c->ReadGreeting().has_value());
    ASSERT_TRUE(c->SendClientFlags(kFlagCFixedNewstyle).ok());
    std::vector<uint8_t> junk(1 + rng() % 120);
    for (auto& b : junk) b = uint8_t(rng());
    if (i % 2) {
      // Get to transmission first, then garble requests (right magic, random rest).
      ASSERT_TRUE(c->SendOption(kOptGo, testing::GoData("disk")).ok());
      for (;;) {
        auto r = c->ReadOptionReply();
        ASSERT_TRUE(r.has_value());
        if (r->type == kRepAck) break;
      }
      if (junk.size() >= 4) StoreBe32(junk.data(), kRequestMagic);
    } else if (junk.size() >= 8) {
      StoreBe64(junk.data(), kIHaveOpt);  // random option code and length
    }
    (void)c->SendBytes(junk);  // the server may hang up at any point
  }
  ExpectStillServing();
}

// ---- Connections as fd pairs, shutdown ----

TEST(ServerFdPair, SocketpairConnectionAndGracefulShutdown) {
  auto disk = std::make_shared<ProbedDevice>(kSize);
  disk->HoldWrites();
  auto server = Server::Create({{"", "", disk, false}}, {});
  ASSERT_TRUE(server.has_value());
  // A listener too, only as a signal: the server unlinks its socket when
  // it begins to shut down, before it waits for requests in flight.
  char dir[] = "/tmp/td-nbd-fdpair-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string listen_path = std::string(dir) + "/nbd.sock";
  ASSERT_TRUE((*server)->ListenUnix(listen_path).ok());
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  (*server)->AddConnection(sv[0], sv[0], /*owns_fds=*/true);
  Status run_status;
  std::thread runner([&] { run_status = (*server)->Run(); });
  RawClient c(sv[1]);
  ASSERT_TRUE(c.Handshake("", false).has_value());
  ASSERT_TRUE(c.SendRequest(0, kCmdWrite, 1, 0, 4096, Pattern(4096, 8)).ok());
  ASSERT_TRUE(disk->WaitForWritesStarted(1));  // the write is in flight, held in the device
  const size_t flushes_before = disk->flushes();
  (*server)->RequestShutdown();
  // Shutdown is under way while the write is still held; then it ends.
  EXPECT_TRUE(testing::WaitUntil([&] { return access(listen_path.c_str(), F_OK) != 0; }))
      << "the server did not begin to shut down";
  disk->ReleaseWrites();
  (void)rmdir(dir);
  // The in-flight write is still answered, then the connection ends.
  auto r = c.ReadReply();
  ASSERT_TRUE(r.has_value()) << r.status().ToString();
  EXPECT_EQ(r->handle, 1u);
  EXPECT_EQ(r->error, 0u);
  EXPECT_TRUE(c.ServerClosed());
  runner.join();
  EXPECT_TRUE(run_status.ok()) << run_status.ToString();
  EXPECT_GT(disk->flushes(), flushes_before);  // every export flushed on the way out
  auto contents = disk->Contents();
  EXPECT_TRUE(
      std::equal(contents.begin(), contents.begin() + 4096, Pattern(4096, 8).begin()));
}

TEST(ServerFdPair, RunReturnsWhenTheOnlyFdPairClientLeaves) {
  // Stdio mode's path: no listeners, one connection on a pipe-like fd pair.
  auto disk = std::make_shared<MemoryDevice>(kSize);
  auto server = Server::Create({{"d", "", disk, false}}, {});
  ASSERT_TRUE(server.has_value());
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  (*server)->AddConnection(sv[0], sv[0], /*owns_fds=*/true);
  std::thread runner([&] { (void)(*server)->Run(); });
  {
    RawClient c(sv[1]);
    ASSERT_TRUE(c.Handshake("d", true).has_value());
    ASSERT_TRUE(c.SendRequest(0, kCmdDisc, 1, 0, 0).ok());
    EXPECT_TRUE(c.ServerClosed());
  }
  runner.join();  // returns by itself: bounded by the client's disconnect
  EXPECT_GE(disk->flushes(), 1u);
}

TEST(ServerCreate, RejectsBadExports) {
  EXPECT_EQ(Server::Create({}, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Server::Create({{"a", "", nullptr, false}}, {}).status().code(),
            Code::kInvalidArgument);
  auto d = std::make_shared<MemoryDevice>(4096);
  EXPECT_EQ(
      Server::Create({{"a", "", d, false}, {"a", "", d, false}}, {}).status().code(),
      Code::kInvalidArgument);
}

}  // namespace
}  // namespace thindisk::nbd
