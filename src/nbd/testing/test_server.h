// TestServer: a Server with memory-backed exports on a Unix socket in a
// fresh temporary directory, run on its own thread; shut down gracefully
// and cleaned up when destroyed.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "nbd/server.h"
#include "nbd/testing/memory_device.h"

namespace thindisk::nbd::testing {

class TestServer {
 public:
  // Starts serving `exports` on <tmpdir>/nbd.sock.
  explicit TestServer(std::vector<Export> exports, ServerOptions options = {});
  ~TestServer();

  Server& server() { return *server_; }
  const std::string& socket_path() const { return socket_; }
  const std::string& dir() const { return dir_; }
  std::string Uri(
      const std::string& export_name = "") const;  // nbd+unix:///name?socket=...
  // Stops the server and returns what Run() returned.
  Status Stop();

 private:
  std::string dir_;
  std::string socket_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  Status run_status_;
  bool stopped_ = false;
};

}  // namespace thindisk::nbd::testing
