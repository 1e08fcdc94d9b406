// The fixture of the server's socket tests (server_test.cc,
// server_flow_test.cc): a TestServer with a 1 MiB scratch export "disk" and
// a 64 KiB read-only export "ro", both MemoryDevices, and RawClients
// connected to it. Header-only, for gtest test binaries.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
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

class ServerTest : public ::testing::Test {
 protected:
  void Start(ServerOptions options = {}) {
    disk_ = std::make_shared<MemoryDevice>(kSize);
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

  std::shared_ptr<MemoryDevice> disk_;
  std::shared_ptr<MemoryDevice> ro_;
  std::unique_ptr<TestServer> server_;
};

}  // namespace thindisk::nbd::testing
