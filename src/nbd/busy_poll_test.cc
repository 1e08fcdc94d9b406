// BusyPoll's policy (credits, probes, the server-wide slots), then a served
// connection whose reader catches a QD1 client's requests while it spins.
#include "nbd/busy_poll.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "nbd/protocol.h"
#include "nbd/testing/raw_client.h"
#include "nbd/testing/server_fixture.h"

namespace thindisk::nbd {
namespace {

using namespace std::chrono_literals;
using testing::Pattern;
using testing::ServerTest;

// Spins once with a `ready` that never comes; returns how often it was asked.
int MissOnce(BusyPoll& poll) {
  int calls = 0;
  EXPECT_FALSE(poll.Spin([&] { return ++calls, false; }));
  return calls;
}

// Options whose connections spin up to `budget`; the returned slots (one)
// count the spins.
std::shared_ptr<BusyPoll::Slots> Spinning(ServerOptions* options,
                                          std::chrono::microseconds budget) {
  options->connection.busy_poll = budget;
  options->connection.busy_poll_slots = std::make_shared<BusyPoll::Slots>(1);
  return options->connection.busy_poll_slots;
}

// Reads the first 4 KiB `n` times, each request sent after the last reply.
void ReadOneAtATime(testing::RawClient& c, int n) {
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(c.SendRequest(0, kCmdRead, 100 + i, 0, 4096).ok());
    auto r = c.ReadReply(4096);
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
  }
}

TEST(BusyPoll, ABudgetOfZeroNeverSpins) {
  BusyPoll::Slots slots(1);
  BusyPoll poll(0us, &slots);
  EXPECT_EQ(MissOnce(poll), 0);
  EXPECT_EQ(slots.hits + slots.misses, 0u);
}

TEST(BusyPoll, SpinsUntilReadyAndCountsAHit) {
  BusyPoll::Slots slots(1);
  BusyPoll poll(10s, &slots);  // far longer than the test: ready ends it
  int calls = 0;
  EXPECT_TRUE(poll.Spin([&] { return ++calls == 3; }));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(slots.hits, 1u);
  EXPECT_EQ(slots.misses, 0u);
  EXPECT_EQ(slots.spinning, 0);  // the slot is given back
}

TEST(BusyPoll, MissesSpendTheCreditsThenOnlyProbesSpin) {
  BusyPoll::Slots slots(1);
  BusyPoll poll(1us, &slots);
  for (int i = 0; i < BusyPoll::kMaxCredits; ++i) EXPECT_GE(MissOnce(poll), 1) << i;
  // No credit left: the next kProbeEvery - 1 waits do not spin, the one
  // after them does.
  for (int i = 1; i < BusyPoll::kProbeEvery; ++i) EXPECT_EQ(MissOnce(poll), 0) << i;
  EXPECT_GE(MissOnce(poll), 1);
  EXPECT_EQ(MissOnce(poll), 0);
  EXPECT_EQ(slots.misses, uint64_t(BusyPoll::kMaxCredits + 1));
}

TEST(BusyPoll, AProbeThatHitsTurnsSpinningBackOn) {
  BusyPoll::Slots slots(1);
  BusyPoll poll(1us, &slots);
  for (int i = 0; i < BusyPoll::kMaxCredits; ++i) MissOnce(poll);
  for (int i = 1; i < BusyPoll::kProbeEvery; ++i) ASSERT_EQ(MissOnce(poll), 0) << i;
  int calls = 0;
  EXPECT_TRUE(poll.Spin([&] { return ++calls, true; }));  // the probe hits
  EXPECT_EQ(calls, 1);
  // It earned kGain credits: that many waits spin again, then none.
  for (int i = 0; i < BusyPoll::kGain; ++i) EXPECT_GE(MissOnce(poll), 1) << i;
  EXPECT_EQ(MissOnce(poll), 0);
}

TEST(BusyPoll, NoMoreReadersSpinAtOnceThanTheSlots) {
  BusyPoll::Slots slots(1);
  BusyPoll a(10s, &slots);
  BusyPoll b(10s, &slots);
  std::atomic<bool> inside{false}, release{false};
  std::thread spinner([&] {
    EXPECT_TRUE(a.Spin([&] {
      inside = true;
      return release.load();
    }));
  });
  while (!inside) std::this_thread::yield();
  EXPECT_EQ(slots.spinning, 1);
  EXPECT_EQ(MissOnce(b), 0);  // the one slot is a's: b does not spin
  release = true;
  spinner.join();
  EXPECT_EQ(slots.spinning, 0);
  int calls = 0;
  EXPECT_TRUE(b.Spin([&] { return ++calls, true; }));  // free again
  EXPECT_EQ(calls, 1);
}

TEST(BusyPoll, TheDefaultLimitLeavesACpu) {
  const int cpus = int(std::thread::hardware_concurrency());
  EXPECT_EQ(BusyPoll::Slots::DefaultLimit(), cpus > 1 ? cpus - 1 : 1);
}

// A client at QD1 sends each request as soon as it has the last reply: the
// reader, spinning after each reply, finds most of them there. Budget 1 s,
// so a loaded machine cannot make the spins miss.
TEST_F(ServerTest, AQd1ClientsRequestsAreCaughtWhileTheReaderSpins) {
  ServerOptions options;
  auto slots = Spinning(&options, 1s);
  Start(options);
  auto c = Open("disk", false);  // simple replies: one per request
  constexpr int kRequests = 200;
  for (int i = 0; i < kRequests; ++i) {
    const uint16_t cmd = i % 2 ? kCmdRead : kCmdWrite;
    const uint64_t offset = uint64_t(i / 2) * 4096;
    ASSERT_TRUE((cmd == kCmdWrite
                     ? c->SendRequest(0, cmd, i, offset, 4096, Pattern(4096, uint8_t(i)))
                     : c->SendRequest(0, cmd, i, offset, 4096))
                    .ok());
    auto r = c->ReadReply(cmd == kCmdRead ? 4096 : 0);
    ASSERT_TRUE(r.has_value()) << r.status().ToString();
    ASSERT_EQ(r->error, 0u);
    if (cmd == kCmdRead) {
      EXPECT_EQ(r->payload, Pattern(4096, uint8_t(i - 1))) << i;
    }
  }
  // Every wait after a reply spins until the next request, once the first
  // few showed a client that sends one at a time; none runs out.
  EXPECT_GE(slots->hits, uint64_t(kRequests - 10));
  EXPECT_EQ(slots->misses, 0u);
}

// With a request out on the pool the client waits for its reply, not the
// other way round: the reader sleeps instead of spinning, and spins again
// once the reply is out.
TEST_F(ServerTest, TheReaderDoesNotSpinWhileARequestIsOnThePool) {
  ServerOptions options;
  auto slots = Spinning(&options, 100ms);
  Start(options);
  auto c = Open("disk", false);
  ReadOneAtATime(*c, 10);  // the reader spins for them
  const uint64_t hits = slots->hits;
  disk_->set_write_delay_ms(300);          // far past the budget
  constexpr uint32_t kLength = 512 << 10;  // too long to run on the reader
  ASSERT_TRUE(c->SendRequest(0, kCmdWrite, 1, 0, kLength, Pattern(kLength, 7)).ok());
  auto w = c->ReadReply();
  ASSERT_TRUE(w.has_value()) << w.status().ToString();
  ASSERT_EQ(w->error, 0u);
  ASSERT_TRUE(c->SendRequest(0, kCmdRead, 2, 0, 4096).ok());  // caught by a spin
  auto r = c->ReadReply(4096);
  ASSERT_TRUE(r.has_value()) << r.status().ToString();
  EXPECT_EQ(slots->misses, 0u);
  EXPECT_GT(slots->hits, hits);
}

// A client that pipelines (its requests arrive together) is not waited for.
TEST_F(ServerTest, TheReaderDoesNotSpinForAClientThatPipelines) {
  ServerOptions options;
  auto slots = Spinning(&options, 1s);
  Start(options);
  auto c = Open("disk", false);
  for (int round = 0; round < 20; ++round) {
    std::vector<uint8_t> batch;  // 4 requests in one send
    for (int i = 0; i < 4; ++i) {
      const std::vector<uint8_t> header = testing::RawClient::EncodeRequest(
          0, kCmdRead, uint64_t(round * 4 + i), uint64_t(i) * 4096, 4096);
      batch.insert(batch.end(), header.begin(), header.end());
    }
    ASSERT_TRUE(c->SendBytes(batch).ok());
    for (int i = 0; i < 4; ++i) {
      auto r = c->ReadReply(4096);
      ASSERT_TRUE(r.has_value()) << r.status().ToString();
    }
  }
  EXPECT_EQ(slots->hits + slots->misses, 0u);
}

TEST_F(ServerTest, WithoutBusyPollTheReaderNeverSpins) {
  ServerOptions options;
  auto slots = Spinning(&options, 0us);
  Start(options);
  auto c = Open("disk", false);
  ReadOneAtATime(*c, 20);
  EXPECT_EQ(slots->hits + slots->misses, 0u);
}

}  // namespace
}  // namespace thindisk::nbd
