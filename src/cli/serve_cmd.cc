// thindisk serve: export images over NBD (like qemu-nbd, in the foreground).
//
// The NBD protocol and server live in src/nbd; this file turns the command
// line into exports and ServeOptions, opens the images (with the chosen
// cache/aio modes and the discard/detect-zeroes filter), prints where to
// connect, and on SIGINT/SIGTERM lets the server drain and flush before it
// closes every image (which marks qcow2 images clean).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "block/open.h"
#include "cli/common.h"
#include "io/uring_storage.h"
#include "nbd/filter_device.h"
#include "nbd/server.h"

namespace thindisk::cli {
namespace {

// Percent-encodes an export name for the path part of an NBD URI.
std::string UriEscape(const std::string& name) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += char(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// True when systemd (or systemd-socket-activate) passed us listening sockets.
bool SocketActivated() {
  const char* pid = std::getenv("LISTEN_PID");
  const char* fds = std::getenv("LISTEN_FDS");
  return pid != nullptr && fds != nullptr && std::strtol(pid, nullptr, 10) == long(getpid());
}

class ServeCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "serve", "Export images over NBD until SIGINT/SIGTERM (like qemu-nbd)");
    sub->add_option("image", image_, "Image to export under the default (empty) name");
    sub->add_option("-x,--export-name", image_name_, "Export name for IMAGE (default: \"\")");
    sub->add_option("-D,--description", description_,
                    "Description of IMAGE's export shown to clients (default: none)");
    sub->add_option("--export", export_specs_, "Export NAME=IMAGE (repeatable)");
    sub->add_option("-f,--format", format_, "Image format of every export (default: probe)");
    sub->add_option("-k,--socket", socket_, "Listen on this Unix socket");
    sub->add_option("-b,--bind", bind_, "Listen on this TCP address (default 127.0.0.1)");
    sub->add_option("-p,--port", port_, "TCP port (default 10809; 0: any free port)");
    sub->add_flag("-s,--stdio", stdio_, "Serve one client on stdin/stdout");
    sub->add_option("--pid-file", pid_file_, "Write the server's pid here once listening");
    sub->add_flag("-r,--read-only", read_only_, "Export read-only");
    sub->add_option("-e,--max-connections", max_connections_,
                    "Clients served at once; others wait (default 64, which bounds memory; "
                    "0: no limit)");
    sub->add_flag("--once", once_, "Exit after the first client disconnects");
    sub->add_option("--threads", threads_, "Worker threads (0: one per CPU)");
    sub->add_option("--cache", cache_, "Host cache mode: writeback, none (O_DIRECT), unsafe")
        ->check(CLI::IsMember({"writeback", "none", "unsafe"}));
    sub->add_option("--aio", aio_, "I/O engine: threads or io_uring")
        ->check(CLI::IsMember({"threads", "io_uring"}));
    sub->add_option("--discard", discard_, "TRIM handling: ignore or unmap")
        ->check(CLI::IsMember({"ignore", "unmap"}));
    sub->add_option("--detect-zeroes", detect_zeroes_,
                    "Turn all-zero writes into zero writes: off, on, unmap")
        ->check(CLI::IsMember({"off", "on", "unmap"}));
    sub->add_option("--cache-size", cache_size_text_,
                    "qcow2 metadata cache per image layer (e.g. 64M)");
    sub->add_flag("-q,--quiet", quiet_, "Print nothing but errors");
    return sub;
  }

  Result<Outcome> Run() override {
    // 1. Exports from the command line.
    struct Spec {
      std::string name, file, description;
    };
    std::vector<Spec> specs;
    if (!image_.empty()) specs.push_back({image_name_, image_, description_});
    for (const std::string& spec : export_specs_) {
      size_t eq = spec.find('=');
      if (eq == std::string::npos || eq + 1 == spec.size())
        return Status::InvalidArgument("--export wants NAME=IMAGE, got '" + spec + "'");
      specs.push_back({spec.substr(0, eq), spec.substr(eq + 1), ""});
    }
    if (specs.empty()) return Status::InvalidArgument("nothing to serve: give IMAGE or --export");
    if (stdio_ && (!socket_.empty() || !bind_.empty() || port_ >= 0))
      return Status::InvalidArgument("--stdio cannot be combined with --socket/--bind/--port");

    if (port_ > 65535) return Status::InvalidArgument("--port must be 0..65535");

    // 2. Open the images.
    block::OpenOptions open;
    open.format = format_;
    open.read_only = read_only_;
    open.cache = cache_ == "none"     ? io::CacheMode::kNone
                 : cache_ == "unsafe" ? io::CacheMode::kUnsafe
                                      : io::CacheMode::kWriteback;
    if (!cache_size_text_.empty()) {
      TD_ASSIGN_OR_RETURN(open.cache_bytes, ParseSize(cache_size_text_));
    }
    if (aio_ == "io_uring") {
      Status avail = io::UringAvailable();
      if (avail.ok()) {
        open.open_file = io::OpenUringFile;
      } else {
        PrintWarning("--aio=io_uring unavailable (" + avail.message() +
                     "); falling back to --aio=threads");
      }
    }
    nbd::FilterOptions filter;
    filter.discard = discard_ == "ignore" ? nbd::FilterOptions::Discard::kIgnore
                                          : nbd::FilterOptions::Discard::kUnmap;
    filter.detect_zeroes = detect_zeroes_ == "on"      ? nbd::FilterOptions::DetectZeroes::kOn
                           : detect_zeroes_ == "unmap" ? nbd::FilterOptions::DetectZeroes::kUnmap
                                                       : nbd::FilterOptions::DetectZeroes::kOff;

    std::vector<std::shared_ptr<block::Device>> devices;  // closed at the end
    std::vector<nbd::Export> exports;
    auto close_all = [&devices]() {
      Status first;
      for (auto& d : devices) {
        Status s = d->Close();
        if (!s.ok() && first.ok()) first = s.WithContext(d->info().filename);
      }
      return first;
    };
    for (const Spec& spec : specs) {
      Result<std::unique_ptr<block::Device>> dev = block::Open(spec.file, open);
      if (!dev.has_value()) {
        (void)close_all();
        return dev.status();
      }
      std::shared_ptr<block::Device> base(std::move(*dev));
      devices.push_back(base);
      nbd::Export e;
      // Host paths are not shown to clients unless asked (-D).
      e.name = spec.name;
      e.description = spec.description;
      e.read_only = read_only_;
      e.device = filter.passthrough()
                     ? base
                     : std::shared_ptr<block::Device>(
                           std::make_shared<nbd::FilterDevice>(base, filter));
      exports.push_back(std::move(e));
    }

    // 3. Where to listen.
    nbd::ServeOptions so;
    so.unix_socket = socket_;
    so.stdio = stdio_;
    so.tcp = !bind_.empty() || port_ >= 0;
    if (!bind_.empty()) so.tcp_host = bind_;
    if (port_ >= 0) so.tcp_port = uint16_t(port_);
    so.socket_activation = !stdio_ && socket_.empty() && !so.tcp && SocketActivated();
    so.once = once_;
    so.threads = threads_;
    // Writes into the page cache gain nothing from running in parallel (the
    // kernel serializes writers of one file) and do without a hand-off.
    so.inline_cached_writes = open.cache != io::CacheMode::kNone;
    so.max_connections = max_connections_;
    if (!quiet_) so.log = [](const std::string& line) { PrintWarning(line); };
    std::vector<std::string> names;
    for (const Spec& s : specs) names.push_back(s.name);
    bool wrote_pid = false;
    Status pid_status;
    so.on_ready = [&](nbd::Server& server) {
      if (!pid_file_.empty()) {
        std::ofstream out(pid_file_, std::ios::trunc);
        out << getpid() << "\n";
        out.close();
        if (!out) {
          pid_status = Status::FromErrno(errno, "write pid file " + pid_file_);
          server.RequestShutdown();
          return;
        }
        wrote_pid = true;
      }
      if (quiet_ || stdio_) return;  // stdout is the NBD channel with --stdio
      for (const std::string& n : names) {
        if (!socket_.empty())
          std::printf("nbd+unix:///%s?socket=%s\n", UriEscape(n).c_str(), socket_.c_str());
        if (so.tcp || (socket_.empty() && !so.socket_activation)) {
          std::string host = so.tcp_host.find(':') != std::string::npos
                                 ? "[" + so.tcp_host + "]"
                                 : so.tcp_host;
          std::printf("nbd://%s:%u/%s\n", host.c_str(), unsigned(server.tcp_port()),
                      UriEscape(n).c_str());
        }
        if (so.socket_activation) std::printf("serving export '%s' on activated sockets\n", n.c_str());
      }
      std::fflush(stdout);
    };

    // 4. Serve until a signal (or --once / --stdio ends), then close.
    Status served = nbd::RunServer(so, std::move(exports));
    Status closed = close_all();
    if (wrote_pid) ::unlink(pid_file_.c_str());
    if (!pid_status.ok()) return pid_status;
    if (!served.ok()) return served;
    TD_RETURN_IF_ERROR(closed);
    return Outcome::kSuccess;
  }

 private:
  std::string image_;
  std::string image_name_;
  std::string description_;
  std::vector<std::string> export_specs_;
  std::string format_;
  std::string socket_;
  std::string bind_;
  int port_ = -1;  // not given
  bool stdio_ = false;
  std::string pid_file_;
  bool read_only_ = false;
  size_t max_connections_ = 64;  // docs/serve-limits.md: the memory bound
  bool once_ = false;
  size_t threads_ = 0;
  std::string cache_ = "writeback";
  std::string aio_ = "threads";
  std::string discard_ = "unmap";
  std::string detect_zeroes_ = "off";
  std::string cache_size_text_;
  bool quiet_ = false;
};

}  // namespace

std::unique_ptr<Subcommand> NewServeCommand() { return std::make_unique<ServeCommand>(); }

}  // namespace thindisk::cli
