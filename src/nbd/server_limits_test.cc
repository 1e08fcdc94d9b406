// Admission limits of the server (server.h, "Admission"): connections still
// negotiating are capped apart from the sessions and evict the oldest of
// their kind, a handshake that takes too long is cut, and a client that
// finishes negotiating while every session slot is taken waits for one.
// Clients are socketpairs given to Server::AddConnection (the order of
// arrival is then exact) or real Unix-socket clients of a TestServer.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "nbd/protocol.h"
#include "nbd/server.h"
#include "nbd/testing/memory_device.h"
#include "nbd/testing/raw_client.h"
#include "nbd/testing/server_fixture.h"
#include "nbd/testing/test_server.h"

namespace thindisk::nbd {
namespace {

using testing::kSize;
using testing::LogWatcher;
using testing::MemoryDevice;
using testing::RawClient;
using testing::TestServer;

// A Server fed socketpair clients, run on its own thread from the first
// client on (without listeners, Run() returns when it has no connection).
class PairServer {
 public:
  explicit PairServer(ServerOptions options) {
    disk_ = std::make_shared<MemoryDevice>(kSize);
    auto s = Server::Create({{"disk", "", disk_, false}}, std::move(options));
    EXPECT_TRUE(s.has_value());
    server_ = std::move(*s);
  }
  ~PairServer() {
    server_->RequestShutdown();
    if (runner_.joinable()) runner_.join();
  }
  // A new client; the server gets the other end (AddConnection).
  std::unique_ptr<RawClient> Add() {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    server_->AddConnection(sv[0], sv[0], /*owns_fds=*/true);
    if (!runner_.joinable()) runner_ = std::thread([this] { (void)server_->Run(); });
    return std::make_unique<RawClient>(sv[1]);
  }
  Server& server() { return *server_; }

 private:
  std::shared_ptr<MemoryDevice> disk_;
  std::unique_ptr<Server> server_;
  std::thread runner_;
};

// The server has neither sent more nor hung up: nothing is readable now.
bool Quiet(int fd) {
  pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

// A client that got the greeting, is still connected and has nothing more
// to read: the server is still waiting for it.
void ExpectWaitedFor(RawClient& c, const std::string& what) {
  EXPECT_TRUE(c.ReadGreeting().has_value()) << what;
  EXPECT_TRUE(Quiet(c.fd())) << what << ": the server hung up or sent more";
}

void ExpectServes(RawClient& c) {
  ASSERT_TRUE(c.SendRequest(0, kCmdRead, 7, 0, 4096).ok());
  auto r = c.ReadReply(4096);
  ASSERT_TRUE(r.has_value()) << r.status().ToString();
  EXPECT_EQ(r->error, 0u);
  EXPECT_EQ(r->payload.size(), 4096u);
}

TEST(ServerLimits, NegotiatingCapDefaults) {
  auto d = std::make_shared<MemoryDevice>(4096);
  auto cap = [&](size_t max_connections, size_t max_negotiating) {
    ServerOptions o;
    o.max_connections = max_connections;
    o.max_negotiating = max_negotiating;
    return (*Server::Create({{"", "", d, false}}, o))->NegotiatingCap();
  };
  EXPECT_EQ(cap(64, 0), 64u);
  EXPECT_EQ(cap(2, 0), kMinNegotiating);
  EXPECT_EQ(cap(0, 0), 0u);  // no limit of either kind
  EXPECT_EQ(cap(64, 3), 3u);
}

TEST(ServerLimits, ANewcomerAtTheCapEvictsTheOldestNegotiator) {
  LogWatcher log;
  ServerOptions o;
  o.max_negotiating = 2;
  o.handshake_timeout = std::chrono::milliseconds(0);
  o.connection.log = log.Sink();
  PairServer s(o);
  auto first = s.Add();
  auto second = s.Add();
  auto third = s.Add();  // the cap is 2: the first goes
  EXPECT_TRUE(first->ServerClosed());
  EXPECT_TRUE(
      log.WaitFor("connection 1 from unix socket (pid " + std::to_string(getpid())))
      << log.Lines();
  EXPECT_TRUE(log.WaitFor("dropped: still negotiating when a new client arrived"));
  ExpectWaitedFor(*second, "second");
  ExpectWaitedFor(*third, "third");
  // A real client evicts the oldest silent one (the second) and is served;
  // once it is a session it no longer counts against the cap.
  auto real = s.Add();
  ASSERT_TRUE(real->Handshake("disk", false).has_value());
  EXPECT_TRUE(second->ServerClosed());
  EXPECT_TRUE(Quiet(third->fd()));
  ExpectServes(*real);
  auto real2 = s.Add();  // the cap holds the third and real2: no eviction
  ASSERT_TRUE(real2->Handshake("disk", false).has_value());
  EXPECT_TRUE(Quiet(third->fd()));
  ExpectServes(*real);
  ExpectServes(*real2);
}

TEST(ServerLimits, AFloodOfSilentClientsDoesNotKeepARealOneOut) {
  // Over a real listener with the default caps of a 2-session server: 100
  // silent clients, far past the negotiating cap (kMinNegotiating) and the
  // session limit, then a real client.
  ServerOptions o;
  o.max_connections = 2;
  auto disk = std::make_shared<MemoryDevice>(kSize);
  TestServer server({{"disk", "", disk, false}}, o);
  const size_t cap = server.server().NegotiatingCap();
  ASSERT_EQ(cap, kMinNegotiating);
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < 100; ++i) {
    auto c = RawClient::ConnectUnix(server.socket_path());
    ASSERT_TRUE(c.has_value()) << c.status().ToString();
    silent.push_back(std::move(*c));
  }
  auto real = RawClient::ConnectUnix(server.socket_path());
  ASSERT_TRUE(real.has_value());
  auto n = (*real)->Handshake("disk", false);
  ASSERT_TRUE(n.has_value()) << n.status().ToString();
  ExpectServes(**real);
  // Accepted in order, the oldest evicted first: the real client's arrival
  // pushed out one more, so the newest cap - 1 silent ones still wait.
  const size_t kept = cap - 1;
  for (size_t i = 0; i < silent.size() - kept; ++i)
    EXPECT_TRUE(silent[i]->ServerClosed()) << "silent client " << i;
  for (size_t i = silent.size() - kept; i < silent.size(); ++i)
    ExpectWaitedFor(*silent[i], "silent client " + std::to_string(i));
}

TEST(ServerLimits, HandshakeTimeoutCutsAStalledClientButNotASession) {
  LogWatcher log;
  ServerOptions o;
  o.handshake_timeout = std::chrono::milliseconds(300);
  o.connection.log = log.Sink();
  PairServer s(o);
  auto session = s.Add();
  ASSERT_TRUE(session->Handshake("disk", false).has_value());
  const auto start = std::chrono::steady_clock::now();
  auto stalled = s.Add();
  ASSERT_TRUE(stalled->ReadGreeting().has_value());
  ASSERT_TRUE(stalled->SendClientFlags(kFlagCFixedNewstyle | kFlagCNoZeroes).ok());
  // Nothing more: the server hangs up after the timeout, not before, and
  // within the client's read timeout (5 s).
  EXPECT_TRUE(stalled->ServerClosed());
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(300));
  EXPECT_TRUE(log.WaitFor("connection 2 from unix socket"));
  EXPECT_TRUE(log.WaitFor("dropped: no NBD handshake within 0.3 s")) << log.Lines();
  // The established session, idle all that time, is still served.
  ExpectServes(*session);
}

TEST(ServerLimits, AClientPastTheHandshakeWaitsForASessionSlot) {
  ServerOptions o;
  o.max_connections = 1;
  o.handshake_timeout = std::chrono::milliseconds(0);
  PairServer s(o);
  auto first = s.Add();
  ASSERT_TRUE(first->Handshake("disk", false).has_value());
  auto second = s.Add();
  auto handshake = std::async(
      std::launch::async, [&] { return second->Handshake("disk", false).has_value(); });
  // Its GO is not answered while the only slot is taken...
  EXPECT_EQ(handshake.wait_for(std::chrono::milliseconds(200)),
            std::future_status::timeout);
  ExpectServes(*first);
  // ...and is once the first session ends.
  ASSERT_TRUE(first->SendRequest(0, kCmdDisc, 1, 0, 0).ok());
  EXPECT_TRUE(first->ServerClosed());
  EXPECT_TRUE(handshake.get());
  ExpectServes(*second);
}

TEST(ServerLimits, ShutdownReleasesAClientWaitingForASlot) {
  ServerOptions o;
  o.max_connections = 1;
  auto s = std::make_unique<PairServer>(o);
  auto first = s->Add();
  ASSERT_TRUE(first->Handshake("disk", false).has_value());
  auto second = s->Add();
  auto handshake = std::async(
      std::launch::async, [&] { return second->Handshake("disk", false).has_value(); });
  EXPECT_EQ(handshake.wait_for(std::chrono::milliseconds(100)),
            std::future_status::timeout);
  s.reset();                      // shuts down and joins every connection: must not hang
  EXPECT_FALSE(handshake.get());  // closed without the reply to GO
  EXPECT_TRUE(first->ServerClosed());
}

}  // namespace
}  // namespace thindisk::nbd
