// NbdStorage against a real server: `nbdkit memory` on a Unix socket in a
// temporary directory (nbdkit --exit-with-parent, so it never outlives us).
#include "nbdclient/nbd_storage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "nbdclient/nbdkit_test_util.h"
#include "util/temp_dir_test_util.h"

namespace thindisk::nbdclient {
namespace {

class NbdStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test_env::HaveTool("nbdkit")) TD_SKIP_OR_FAIL("nbdkit not installed");
    ASSERT_TRUE(dir_.ok());
  }
  std::unique_ptr<test_env::Nbdkit> Serve(std::vector<std::string> args) {
    auto server = std::make_unique<test_env::Nbdkit>(dir_.path(), std::move(args));
    EXPECT_TRUE(server->ready()) << "nbdkit did not start";
    return server;
  }
  test_env::TempDir dir_{"/tmp", "td_nbdclient"};
};

TEST_F(NbdStorageTest, ReadsWritesAndReportsHoles) {
  auto server = Serve({"memory", "8M"});
  auto s = OpenNbd(server->uri(), false);
  ASSERT_TRUE(s.has_value()) << s.error().message();
  io::Storage& st = **s;
  EXPECT_EQ(st.Size().value(), 8u << 20);
  EXPECT_EQ(st.NextData(0).value(), 8u << 20);  // all hole at first

  std::vector<uint8_t> data(1 << 20);
  std::iota(data.begin(), data.end(), uint8_t{1});
  ASSERT_TRUE(st.WriteAt(2 << 20, data).ok());
  ASSERT_TRUE(st.Flush().ok());
  std::vector<uint8_t> back(data.size());
  ASSERT_TRUE(st.ReadAt(2 << 20, back).ok());
  EXPECT_EQ(back, data);
  EXPECT_EQ(st.NextData(0).value(), 2u << 20);
  EXPECT_EQ(st.NextHole(2 << 20).value(), 3u << 20);

  // Punched: reads zeros, a hole again.
  ASSERT_TRUE(st.PunchHole(2 << 20, 1 << 20).ok());
  ASSERT_TRUE(st.ReadAt(2 << 20, back).ok());
  EXPECT_EQ(std::count(back.begin(), back.end(), 0), ptrdiff_t(back.size()));
  EXPECT_EQ(st.NextData(0).value(), 8u << 20);

  // Past the end: reads zeros, writes refused as "too small".
  std::vector<uint8_t> tail(4096, 0xff);
  ASSERT_TRUE(st.ReadAt((8 << 20) - 2048, tail).ok());
  EXPECT_EQ(std::count(tail.begin(), tail.end(), 0), 4096);
  Status w = st.WriteAt((8 << 20) - 2048, tail);
  EXPECT_EQ(w.code(), Code::kNoSpace);
  EXPECT_NE(w.message().find("too small"), std::string::npos) << w.message();
  EXPECT_EQ(st.Resize(16 << 20).code(), Code::kNotSupported);
  EXPECT_TRUE(st.Resize(8 << 20).ok());
}

TEST_F(NbdStorageTest, ConcurrentWritersLandTheirOwnBytes) {
  auto server = Serve({"memory", "16M"});
  auto s = OpenNbd(server->uri(), false);
  ASSERT_TRUE(s.has_value()) << s.error().message();
  io::Storage& st = **s;
  constexpr int kThreads = 8, kBlocks = 64;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> buf(4096, uint8_t(t + 1)), back(4096);
      for (int b = 0; b < kBlocks; ++b) {
        uint64_t off = (uint64_t(b) * kThreads + t) * 4096;
        if (!st.WriteAt(off, buf).ok() || !st.ReadAt(off, back).ok() || back != buf) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// A server that refuses requests smaller than 4 KiB (nbdkit's
// blocksize-policy filter with the error policy): byte-sized reads, writes
// and zeroes, as the qcow2 engine issues for its metadata, still work, and
// concurrent small writes into one block all land.
TEST_F(NbdStorageTest, ServerMinimumBlockSizeIsMetWithReadModifyWrite) {
  auto server = Serve({"--filter=blocksize-policy", "memory", "1M", "blocksize-minimum=4096",
                       "blocksize-preferred=4096", "blocksize-error-policy=error"});
  auto s = OpenNbd(server->uri(), false);
  ASSERT_TRUE(s.has_value()) << s.error().message();
  io::Storage& st = **s;
  std::vector<uint8_t> magic(4);
  ASSERT_TRUE(st.ReadAt(0, magic).ok());
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> entry(8, uint8_t(t + 1));
      for (int i = 0; i < 16; ++i) {
        // Thread t owns bytes [8 * (t + 8 * i), +8) of the first blocks.
        if (!st.WriteAt(8 * uint64_t(t + kThreads * i) + 100, entry).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  std::vector<uint8_t> back(8 * kThreads * 16);
  ASSERT_TRUE(st.ReadAt(100, back).ok());
  for (size_t i = 0; i < back.size(); ++i) {
    ASSERT_EQ(back[i], uint8_t((i / 8) % kThreads + 1)) << "byte " << i;
  }
  ASSERT_TRUE(st.ZeroRange(104, 5000).ok());
  ASSERT_TRUE(st.ReadAt(100, back).ok());
  EXPECT_EQ(back[3], 1);
  EXPECT_EQ(std::count(back.begin() + 4, back.end(), 0), ptrdiff_t(back.size() - 4));
  // Block status from an unaligned offset: queried from its block's start.
  std::vector<uint8_t> mark(8, 0x77);
  ASSERT_TRUE(st.WriteAt((256 << 10) + 8, mark).ok());
  EXPECT_EQ(st.NextData((256 << 10) + 1).value(), (256u << 10) + 1);
  const uint64_t hole = st.NextHole((256 << 10) + 1).value();  // nbdkit's page grain
  EXPECT_GT(hole, (256u << 10) + 16);
  EXPECT_EQ(hole % 4096, 0u);
  EXPECT_EQ(st.NextData((512 << 10) + 1).value(), 1u << 20);
}

// Commands per connection, by name ("Read", "Write", ...), from the log of
// nbdkit's log filter: "connection=N Read id=...".
std::map<int, std::map<std::string, int>> CommandsPerConnection(const std::string& log_file) {
  std::ifstream in(log_file);
  std::map<int, std::map<std::string, int>> out;
  constexpr std::string_view kKey = "connection=";
  for (std::string l; std::getline(in, l);) {
    const size_t at = l.find(kKey);
    if (at == std::string::npos) continue;
    const size_t id_end = l.find(' ', at);
    const size_t cmd_end = id_end == std::string::npos ? id_end : l.find(' ', id_end + 1);
    if (cmd_end == std::string::npos || l.compare(cmd_end, 4, " id=") != 0) continue;
    const int id = std::stoi(l.substr(at + kKey.size(), id_end - at - kKey.size()));
    ++out[id][l.substr(id_end + 1, cmd_end - id_end - 1)];
  }
  return out;
}

// nbdkit's memory plugin offers multi-conn: requests from many threads
// travel on several connections (at most four), every byte written on one
// reads back on the others, and a flush is sent once, not per connection.
TEST_F(NbdStorageTest, MultiConnExportCarriesRequestsOnSeveralConnections) {
  const std::string log = dir_.File("nbdkit.log");
  auto server = Serve({"--filter=log", "memory", "16M", "logfile=" + log});
  {
    auto s = OpenNbd(server->uri(), false);
    ASSERT_TRUE(s.has_value()) << s.error().message();
    io::Storage& st = **s;
    constexpr int kThreads = 8, kBlocks = 16;
    std::atomic<int> failures{0};
    auto each_block = [&](auto&& fn) {
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          for (int b = 0; b < kBlocks; ++b) {
            if (!fn(uint64_t(b) * kThreads + t)) ++failures;
          }
        });
      }
      for (auto& th : threads) th.join();
    };
    each_block([&](uint64_t block) {
      std::vector<uint8_t> buf(64 << 10, uint8_t(block + 1));
      return st.WriteAt(block * buf.size(), buf).ok();
    });
    ASSERT_TRUE(st.Flush().ok());
    // The overlapping writes opened the extra connections, which join in
    // the background (a millisecond or so on a Unix socket).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    each_block([&](uint64_t block) {
      std::vector<uint8_t> back(64 << 10);
      return st.ReadAt(block * back.size(), back).ok() &&
             std::count(back.begin(), back.end(), uint8_t(block + 1)) == ptrdiff_t(back.size());
    });
    EXPECT_EQ(failures.load(), 0);
  }
  const auto per_connection = CommandsPerConnection(log);
  int carrying = 0, writes = 0, reads = 0, flushes = 0;
  for (const auto& [id, commands] : per_connection) {
    auto count = [&](const char* name) {
      auto it = commands.find(name);
      return it == commands.end() ? 0 : it->second;
    };
    if (count("Read") + count("Write") > 0) ++carrying;
    writes += count("Write");
    reads += count("Read");
    flushes += count("Flush");
  }
  EXPECT_GE(carrying, 2) << "requests all went over one connection";
  EXPECT_LE(per_connection.size(), 4u);
  EXPECT_EQ(writes, 8 * 16);
  EXPECT_GE(reads, 8 * 16);
  EXPECT_EQ(flushes, 1);
}

// One request at a time (as info and map ask) needs no second connection.
TEST_F(NbdStorageTest, MultiConnExportUsedOneRequestAtATimeMakesOneConnection) {
  const std::string log = dir_.File("nbdkit.log");
  auto server = Serve({"--filter=log", "memory", "4M", "logfile=" + log});
  {
    auto s = OpenNbd(server->uri(), false);
    ASSERT_TRUE(s.has_value()) << s.error().message();
    std::vector<uint8_t> buf(4096, 9);
    for (int i = 0; i < 32; ++i) {
      ASSERT_TRUE((*s)->WriteAt(uint64_t(i) * 8192, buf).ok());
      ASSERT_TRUE((*s)->ReadAt(uint64_t(i) * 8192, buf).ok());
      ASSERT_TRUE((*s)->NextHole(uint64_t(i) * 8192).has_value());
    }
  }
  EXPECT_EQ(CommandsPerConnection(log).size(), 1u);
}

// A server that takes one client at a time (nbdkit's limit filter closes
// the others at once) but offers multi-conn: the extra connections fail in
// the background, and everything runs on the first.
TEST_F(NbdStorageTest, MultiConnExportThatTakesOneConnectionStillServes) {
  auto server = Serve({"--filter=limit", "memory", "1M", "limit=1"});
  auto s = OpenNbd(server->uri(), false);
  ASSERT_TRUE(s.has_value()) << s.error().message();
  io::Storage& st = **s;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::vector<uint8_t> buf(4096);
  for (int i = 0; i < 16; ++i) {
    std::fill(buf.begin(), buf.end(), uint8_t(i + 1));
    ASSERT_TRUE(st.WriteAt(uint64_t(i) * 4096, buf).ok()) << i;
  }
  ASSERT_TRUE(st.Flush().ok());
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(st.ReadAt(uint64_t(i) * 4096, buf).ok()) << i;
    EXPECT_EQ(std::count(buf.begin(), buf.end(), uint8_t(i + 1)), 4096) << i;
  }
}

TEST_F(NbdStorageTest, ReadOnlyOpenRefusesWritesNamingTheUri) {
  auto server = Serve({"memory", "1M"});
  auto s = OpenNbd(server->uri(), true);
  ASSERT_TRUE(s.has_value()) << s.error().message();
  std::vector<uint8_t> buf(512, 1);
  Status w = (*s)->WriteAt(0, buf);
  EXPECT_EQ(w.code(), Code::kReadOnly);
  EXPECT_NE(w.message().find(server->uri()), std::string::npos) << w.message();
}

TEST_F(NbdStorageTest, ServerThatVanishesFailsRequestsWithOneLine) {
  auto server = Serve({"memory", "1M"});
  auto s = OpenNbd(server->uri(), false);
  ASSERT_TRUE(s.has_value()) << s.error().message();
  server->Kill();
  std::vector<uint8_t> buf(4096);
  Status r = (*s)->ReadAt(0, buf);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.message().rfind(server->uri() + ": ", 0), 0u) << r.message();
  EXPECT_EQ(r.message().find('\n'), std::string::npos);
  EXPECT_FALSE((*s)->ReadAt(0, buf).ok());  // and stays failed
}

TEST_F(NbdStorageTest, MissingSocketIsNotFound) {
  auto s = OpenNbd("nbd+unix:///?socket=" + dir_.File("absent.sock"), true);
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message().find("absent.sock"), std::string::npos) << s.error().message();
}

}  // namespace
}  // namespace thindisk::nbdclient
