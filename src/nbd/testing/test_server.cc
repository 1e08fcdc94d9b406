#include "nbd/testing/test_server.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

namespace thindisk::nbd::testing {

TestServer::TestServer(std::vector<Export> exports, ServerOptions options) {
  char tmpl[] = "/tmp/td-nbd-test-XXXXXX";
  if (!mkdtemp(tmpl)) std::abort();
  dir_ = tmpl;
  socket_ = dir_ + "/nbd.sock";
  auto server = Server::Create(std::move(exports), std::move(options));
  if (!server.has_value()) {
    std::fprintf(stderr, "TestServer: %s\n", server.error().ToString().c_str());
    std::abort();
  }
  server_ = std::move(*server);
  Status s = server_->ListenUnix(socket_);
  if (!s.ok()) {
    std::fprintf(stderr, "TestServer: %s\n", s.ToString().c_str());
    std::abort();
  }
  thread_ = std::thread([this] { run_status_ = server_->Run(); });
}

std::string TestServer::Uri(const std::string& export_name) const {
  return "nbd+unix:///" + export_name + "?socket=" + socket_;
}

Status TestServer::Stop() {
  if (!stopped_) {
    server_->RequestShutdown();
    thread_.join();
    stopped_ = true;
  }
  return run_status_;
}

TestServer::~TestServer() {
  (void)Stop();
  server_.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace thindisk::nbd::testing
