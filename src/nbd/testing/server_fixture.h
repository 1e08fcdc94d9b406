// The fixture of the server's socket tests (server_test.cc,
// server_flow_test.cc): a TestServer with a 1 MiB scratch export "disk" (a
// ProbedDevice) and a 64 KiB read-only export "ro" (a MemoryDevice), and
// RawClients connected to it; and the events those tests wait for instead
// of sleeping (ProbedDevice, LogWatcher, WaitUntil). Header-only, for gtest
// test binaries.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "nbd/protocol.h"
#include "nbd/server.h"
#include "nbd/testing/memory_device.h"
#include "nbd/testing/raw_client.h"
#include "nbd/testing/test_server.h"

namespace thindisk::nbd::testing {

inline constexpr uint64_t kSize = 1 << 20;  // the "disk" export's size

// Deterministic request bytes: a different sequence for each seed.
inline std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 7);
  return v;
}

// How long a test waits for an event the server owes it before it fails.
// A bound against hangs, not a timing: the events come within milliseconds.
inline constexpr std::chrono::seconds kEventTimeout{30};

// Polls `done` every millisecond until it holds; false after kEventTimeout.
// For states that announce themselves no other way (a socket file gone).
inline bool WaitUntil(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + kEventTimeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// ProbedDevice: a MemoryDevice a test synchronises with instead of sleeping.
// It counts the reads that have returned, and between HoldWrites() and
// ReleaseWrites() every Write is counted as started and then waits inside
// the device, so a test knows a write is in flight and decides when it ends.
// A held write gives up waiting after kEventTimeout (and then runs), so a
// failing test cannot hang the server's threads for good.
//
// Thread safety: every method may be called concurrently.
class ProbedDevice : public MemoryDevice {
 public:
  using MemoryDevice::MemoryDevice;

  Status Read(uint64_t offset, std::span<uint8_t> buf) override {
    Status s = MemoryDevice::Read(offset, buf);
    std::lock_guard<std::mutex> lock(probe_mu_);
    ++reads_;
    probe_cv_.notify_all();
    return s;
  }
  Status Write(uint64_t offset, std::span<const uint8_t> buf,
               block::WriteFlags flags) override {
    {
      std::unique_lock<std::mutex> lock(probe_mu_);
      ++writes_started_;
      probe_cv_.notify_all();
      probe_cv_.wait_for(lock, kEventTimeout, [&] { return !hold_writes_; });
    }
    return MemoryDevice::Write(offset, buf, flags);
  }

  void HoldWrites() {
    std::lock_guard<std::mutex> lock(probe_mu_);
    hold_writes_ = true;
  }
  void ReleaseWrites() {
    std::lock_guard<std::mutex> lock(probe_mu_);
    hold_writes_ = false;
    probe_cv_.notify_all();
  }
  size_t reads() const {
    std::lock_guard<std::mutex> lock(probe_mu_);
    return reads_;
  }
  // Wait until at least n reads have returned / n writes have started;
  // false after kEventTimeout.
  bool WaitForReads(size_t n) {
    std::unique_lock<std::mutex> lock(probe_mu_);
    return probe_cv_.wait_for(lock, kEventTimeout, [&] { return reads_ >= n; });
  }
  bool WaitForWritesStarted(size_t n) {
    std::unique_lock<std::mutex> lock(probe_mu_);
    return probe_cv_.wait_for(lock, kEventTimeout, [&] { return writes_started_ >= n; });
  }

 private:
  mutable std::mutex probe_mu_;
  std::condition_variable probe_cv_;
  size_t reads_ = 0;           // guarded by probe_mu_
  size_t writes_started_ = 0;  // guarded by probe_mu_
  bool hold_writes_ = false;   // guarded by probe_mu_
};

// LogWatcher: collects the lines a server logs (ConnectionOptions::log)
// so a test can wait for the one that says an event happened (a reply that
// could not be sent, a connection that ended). Sink() may be called from
// any thread and shares the lines, so it may outlive the watcher.
class LogWatcher {
 public:
  std::function<void(const std::string&)> Sink() const {
    return [s = state_](const std::string& line) {
      std::lock_guard<std::mutex> lock(s->mu);
      s->lines.push_back(line);
      s->cv.notify_all();
    };
  }
  // Waits until a line containing `text` has been logged; false after
  // kEventTimeout.
  bool WaitFor(const std::string& text) const {
    std::unique_lock<std::mutex> lock(state_->mu);
    return state_->cv.wait_for(lock, kEventTimeout, [&] {
      for (const std::string& l : state_->lines)
        if (l.find(text) != std::string::npos) return true;
      return false;
    });
  }
  // Every line so far, one per line (for failure messages).
  std::string Lines() const {
    std::lock_guard<std::mutex> lock(state_->mu);
    std::string all;
    for (const std::string& l : state_->lines) all += l + "\n";
    return all;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> lines;  // guarded by mu
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

class ServerTest : public ::testing::Test {
 protected:
  // A held write must not outlive the test: the server's threads would wait
  // in it while the fixture stops the server.
  void TearDown() override {
    if (disk_) disk_->ReleaseWrites();
  }
  void Start(ServerOptions options = {}) {
    disk_ = std::make_shared<ProbedDevice>(kSize);
    ro_ = std::make_shared<MemoryDevice>(65536);
    std::vector<Export> exports = {{"disk", "scratch disk", disk_, false},
                                   {"ro", "read-only disk", ro_, true}};
    server_ = std::make_unique<TestServer>(std::move(exports), std::move(options));
  }
  std::unique_ptr<RawClient> Connect() {
    auto c = RawClient::ConnectUnix(server_->socket_path());
    EXPECT_TRUE(c.has_value()) << c.status().ToString();
    return std::move(*c);
  }
  // A client in transmission phase on `name`.
  std::unique_ptr<RawClient> Open(const std::string& name, bool structured,
                                  const std::vector<std::string>& contexts = {}) {
    auto c = Connect();
    auto n = c->Handshake(name, structured, contexts);
    EXPECT_TRUE(n.has_value()) << n.status().ToString();
    return c;
  }
  // Proves the server still serves: a fresh client reads what is there.
  void ExpectStillServing() {
    auto c = Open("disk", true);
    ASSERT_TRUE(c->SendRequest(0, kCmdRead, 99, 0, 4096).ok());
    std::vector<uint8_t> out(4096, 0xee);
    auto err = c->ReadStructuredRead(0, &out);
    ASSERT_TRUE(err.has_value()) << err.status().ToString();
    EXPECT_EQ(*err, 0u);
    std::vector<uint8_t> want = disk_->Contents();
    want.resize(4096);
    EXPECT_EQ(out, want);
  }

  std::shared_ptr<ProbedDevice> disk_;
  std::shared_ptr<MemoryDevice> ro_;
  std::unique_ptr<TestServer> server_;
};

}  // namespace thindisk::nbd::testing
