// RunServer, the entry point `thindisk serve` calls: its listeners (Unix,
// TCP, stdio, socket activation) and its signal handling. The stdio and
// socket activation cases run the server in a forked child, as the CLI
// would run in its own process; every wait is bounded.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "nbd/listener.h"
#include "nbd/protocol.h"
#include "nbd/server.h"
#include "nbd/testing/memory_device.h"
#include "nbd/testing/raw_client.h"
#include "util/temp_dir_test_util.h"

namespace thindisk::nbd {
namespace {

using testing::MemoryDevice;
using testing::RawClient;

using test_env::TempDir;

std::vector<Export> OneExport(std::shared_ptr<MemoryDevice> d) {
  return {{"disk", "", std::move(d), false}};
}

// Waits for a child with a time limit; kills it if it overstays.
int WaitChild(pid_t pid, std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// A round trip through an open client: write, read back.
void WriteRead(RawClient& c) {
  std::vector<uint8_t> data(4096, 0x3c);
  ASSERT_TRUE(c.SendRequest(0, kCmdWrite, 1, 8192, 4096, data).ok());
  auto w = c.ReadReply();
  ASSERT_TRUE(w.has_value()) << w.status().ToString();
  EXPECT_EQ(w->error, 0u);
  ASSERT_TRUE(c.SendRequest(0, kCmdRead, 2, 8192, 4096).ok());
  auto r = c.ReadReply(4096);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->payload, data);
}

TEST(RunServer, UnixSocketAndSigtermShutsDownGracefully) {
  TempDir dir("/tmp", "td-nbd-run");
  auto disk = std::make_shared<MemoryDevice>(1 << 20);
  ServeOptions o;
  o.unix_socket = dir.path() + "/s.sock";
  std::thread client;
  o.on_ready = [&](Server&) {
    client = std::thread([&] {
      auto c = RawClient::ConnectUnix(o.unix_socket);
      ASSERT_TRUE(c.has_value());
      ASSERT_TRUE((*c)->Handshake("disk", false).has_value());
      WriteRead(**c);
      kill(getpid(), SIGTERM);  // handled: graceful shutdown, not death
      EXPECT_TRUE((*c)->ServerClosed());
    });
  };
  const size_t flushes_before = disk->flushes();
  Status s = RunServer(o, OneExport(disk));
  client.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(disk->flushes(), flushes_before);
  EXPECT_FALSE(std::filesystem::exists(o.unix_socket));  // socket removed
}

TEST(RunServer, TcpOnAnEphemeralPortWithOnce) {
  auto disk = std::make_shared<MemoryDevice>(1 << 20);
  ServeOptions o;
  o.tcp = true;
  o.tcp_port = 0;
  o.once = true;
  o.handle_signals = false;
  std::thread client;
  o.on_ready = [&](Server& server) {
    const uint16_t port = server.tcp_port();
    client = std::thread([port] {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
      RawClient c(fd);
      ASSERT_TRUE(c.Handshake("disk", true).has_value());
      ASSERT_TRUE(c.SendRequest(0, kCmdDisc, 9, 0, 0).ok());
      EXPECT_TRUE(c.ServerClosed());
    });
  };
  Status s = RunServer(o, OneExport(disk));  // returns after the one client: `once`
  client.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(RunServer, StdioModeInAChildProcess) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(sv[0], STDIN_FILENO);
    dup2(sv[0], STDOUT_FILENO);
    ServeOptions o;
    o.stdio = true;
    Status s = RunServer(o, OneExport(std::make_shared<MemoryDevice>(1 << 20)));
    _exit(s.ok() ? 0 : 1);
  }
  close(sv[0]);
  {
    RawClient c(sv[1]);
    auto n = c.Handshake("disk", false);
    ASSERT_TRUE(n.has_value()) << n.status().ToString();
    EXPECT_EQ(n->size, 1u << 20);
    WriteRead(c);
    ASSERT_TRUE(c.SendRequest(0, kCmdDisc, 3, 0, 0).ok());
  }
  EXPECT_EQ(WaitChild(pid), 0);  // the server ends with its only client
}

TEST(RunServer, SocketActivationInAChildProcess) {
  TempDir dir("/tmp", "td-nbd-run");
  const std::string path = dir.path() + "/activated.sock";
  auto listener = ListenUnix(path);
  ASSERT_TRUE(listener.has_value());
  fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // What systemd does: the listening socket at fd 3, LISTEN_PID/FDS set.
    if (*listener != 3) {
      dup2(*listener, 3);
      close(*listener);
    }
    setenv("LISTEN_PID", std::to_string(getpid()).c_str(), 1);
    setenv("LISTEN_FDS", "1", 1);
    ServeOptions o;
    o.socket_activation = true;
    o.once = true;
    Status s = RunServer(o, OneExport(std::make_shared<MemoryDevice>(1 << 20)));
    _exit(s.ok() ? 0 : 1);
  }
  close(*listener);
  {
    auto c = RawClient::ConnectUnix(path);
    ASSERT_TRUE(c.has_value()) << c.status().ToString();
    ASSERT_TRUE((*c)->Handshake("disk", true).has_value());
    ASSERT_TRUE((*c)->SendRequest(0, kCmdDisc, 3, 0, 0).ok());
  }
  EXPECT_EQ(WaitChild(pid), 0);
}

TEST(RunServer, BadOptionsAreErrors) {
  auto disk = std::make_shared<MemoryDevice>(4096);
  ServeOptions o;
  o.handle_signals = false;
  o.unix_socket = std::string(200, 'x');  // longer than sun_path
  EXPECT_EQ(RunServer(o, OneExport(disk)).code(), Code::kInvalidArgument);
  ServeOptions activation;
  activation.socket_activation = true;
  unsetenv("LISTEN_PID");
  EXPECT_EQ(RunServer(activation, OneExport(disk)).code(), Code::kInvalidArgument);
  EXPECT_EQ(RunServer(ServeOptions{}, {}).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace thindisk::nbd
