// thindisk serve: export images over NBD, with qemu-nbd's command line.
//
// The NBD protocol and server live in src/nbd; this file turns the command
// line into exports and ServeOptions, opens the images (serve_open.h: cache
// and aio modes, -s overlays, -l snapshots, -o windows, the discard and
// detect-zeroes filter), prints where to connect, and on SIGINT/SIGTERM
// lets the server drain and flush before it closes every image (which marks
// qcow2 images clean). Option values are parsed in serve_options.h, --fork
// is serve_fork.h and -L is nbdclient/list_exports.h; docs/qemu-nbd.md maps every
// qemu-nbd option to what this command does.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_create.h"
#include "cli/image_summary.h"
#include "cli/serve_control.h"
#include "cli/serve_fork.h"
#include "cli/serve_open.h"
#include "cli/serve_options.h"
#include "cli/serve_tls.h"
#include "io/ceph_module.h"
#include "nbd/server.h"
#include "nbdclient/nbd_module.h"

#ifndef THINDISK_VERSION
#define THINDISK_VERSION "unknown"
#endif

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

void Log(const std::string& line) { std::fprintf(stderr, "thindisk: %s\n", line.c_str()); }

constexpr const char* kFooter =
    "Differences from qemu-nbd (docs/qemu-nbd.md): the server keeps serving after the "
    "last\n"
    "client leaves (qemu-nbd -t; --once gives qemu-nbd's default of exiting); -e "
    "defaults to\n"
    "64 clients (qemu-nbd: 1); TCP binds 127.0.0.1 by default (qemu-nbd: 0.0.0.0); "
    "--discard\n"
    "defaults to unmap (qemu-nbd: ignore); qemu:allocation-depth is always offered (-A "
    "is\n"
    "accepted); reads go through an io_uring ring unless --aio=threads "
    "(docs/performance.md);\n"
    "--stdio has no short -s (-s is qemu-nbd's --snapshot). Kernel devices (-c, -d) are\n"
    "refused with a message. TLS: docs/tls.md.";

class ServeCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub = app.add_subcommand(
        "serve", "Export images over NBD until SIGINT/SIGTERM (qemu-nbd's options)");
    sub->footer(kFooter);
    sub->add_option("image", image_,
                    "Image to export under the default (empty) name (with --image-opts: "
                    "block options)");
    sub->add_option("-x,--export-name", image_name_, "Export name for IMAGE (default: \"\")");
    sub->add_option("-D,--description", description_,
                    "Description of IMAGE's export shown to clients (default: none)");
    sub->add_option("--export", export_specs_, "Export NAME=IMAGE (repeatable)");
    sub->add_option("-f,--format", format_, "Image format of every export (default: probe)");
    sub->add_flag("--image-opts", image_opts_,
                  "IMAGE is block options: driver=,file.filename=,file.driver=file,...");
    sub->add_option("-k,--socket", socket_, "Listen on this Unix socket");
    sub->add_option("-b,--bind", bind_, "Listen on this TCP address (default 127.0.0.1)");
    sub->add_option("-p,--port", port_, "TCP port (default 10809; 0: any free port)");
    sub->add_flag("--stdio", stdio_, "Serve one client on stdin/stdout (long option only)");
    sub->add_option("--pid-file", pid_file_, "Write the server's pid here once listening");
    sub->add_flag("--fork", fork_,
                  "Serve in the background; return once listening (non-zero if it failed)");
    sub->add_flag("-r,--read-only", read_only_, "Export read-only");
    sub->add_flag("--takeover", takeover_,
                  "rados:// images: ask the server that writes the image to hand it over "
                  "(it drains, flushes and exits) instead of failing (docs/rados.md)");
    sub->add_option("-e,--shared,--max-connections", max_connections_,
                    "Clients served at once; others wait (default 64, which bounds memory; "
                    "qemu-nbd's default is 1; 0: no limit)");
    sub->add_option("--handshake-timeout", handshake_timeout_,
                    "Drop a client that has not finished the NBD handshake within SECONDS "
                    "(default 10; 0: never; at most a day)")
        ->check(CLI::Range(0.0, 86400.0));
    sub->add_flag("-t,--persistent", persistent_,
                  "Keep serving after the last client leaves (always so unless --once)");
    sub->add_flag("--once", once_, "Exit after the first client disconnects (qemu-nbd without -t)");
    sub->add_option("--threads", threads_, "Worker threads: requests in flight against the storage (default 8; each may hold 4 MiB)");
    sub->add_option(
           "--busy-poll", busy_poll_us_,
           "Microseconds a connection's reader spins for the next request of a client "
           "that sends one at a time, before it sleeps (default 50; 0: never; adaptive, "
           "at most one reader per CPU but one; docs/performance.md)")
        ->check(CLI::Range(0, 10000));
    sub->add_option(
           "--prefetch", prefetch_,
           "on: a client that reads in order, one request at a time, has its next "
           "range read while it takes a reply (READs of 256 KiB to 2 MiB; with "
           "--aio=io_uring); off: never (default on)")
        ->check(CLI::IsMember({"on", "off"}));
    sub->add_flag("-n,--nocache", nocache_, "Same as --cache=none");
    sub->add_option("--cache", cache_,
                    "Host cache: writeback, none (O_DIRECT), writethrough (writes durable before "
                    "the reply), directsync (both), unsafe (no flushes); none and directsync "
                    "also turn off a rados:// image's write-back (docs/rados.md)");
    sub->add_option(
        "--aio", aio_,
        "I/O engine: io_uring (default; native is the same): pipelined reads "
        "through an io_uring ring, the rest on worker threads; threads: worker "
        "threads only (docs/performance.md)");
    sub->add_option("--discard", discard_, "TRIM handling: ignore (off) or unmap (on; default)");
    sub->add_option("--detect-zeroes", detect_zeroes_,
                    "Turn all-zero writes into zero writes: off, on, unmap");
    sub->add_option("--cache-size", cache_size_text_,
                    "qcow2 metadata cache per image layer (e.g. 64M)");
    sub->add_flag("-s,--snapshot", snapshot_,
                  "Writes go to a temporary qcow2 overlay in $TMPDIR, deleted at exit; the "
                  "image is not written");
    sub->add_option("-l,--load-snapshot", load_snapshot_,
                    "Export an internal snapshot read-only: snapshot.id=ID,snapshot.name=NAME "
                    "or ID_OR_NAME");
    sub->add_option("-o,--offset", offset_text_, "The export starts at this byte of the image");
    sub->add_flag("-A,--allocation-depth", allocation_depth_,
                  "Offer qemu:allocation-depth (always offered)");
    sub->add_option("--control", control_,
                    "A Unix socket for backups of the served images (bitmap generations "
                    "and clears; docs/backup.md), mode 0600");
    sub->add_option("-B,--bitmap", bitmaps_,
                    "Offer the image's persistent bitmap NAME as qemu:dirty-bitmap:NAME "
                    "(repeatable)")
        ->allow_extra_args(false);
    sub->add_flag("-L,--list", list_,
                  "Client mode: list the exports of the server at -k or -b/-p, as qemu-nbd -L");
    sub->add_option("-T,--trace", trace_, "Accepted for qemu-nbd compatibility; ignored");
    sub->add_flag("-v,--verbose", verbose_, "Log each export as it is opened");
    sub->add_flag("-q,--quiet", quiet_, "Print nothing but errors");
    sub->add_flag("-V,--version", version_, "Print thindisk's version and exit");
    tls_options_.Register(sub);
    // qemu-nbd options thindisk refuses, each with its reason (Refusal()).
    sub->add_option("-c,--connect", connect_, "(refused: needs a kernel NBD device)");
    sub->add_flag("-d,--disconnect", disconnect_, "(refused: needs a kernel NBD device)");
    sub->add_option("--selinux-label", selinux_label_, "(refused: not supported)");
    return sub;
  }

  Result<Outcome> Run() override {
    if (version_) {
      std::printf("thindisk version %s\n", THINDISK_VERSION);
      return Outcome::kSuccess;
    }
    TD_RETURN_IF_ERROR(Refusal());
    if (list_) return List();

    // 1. Everything that can be checked without I/O, before any fork.
    TD_ASSIGN_OR_RETURN(ExportSettings base, Settings());
    std::vector<Spec> specs;
    if (!image_.empty()) specs.push_back({image_name_, image_, description_, base});
    for (const std::string& spec : export_specs_) {
      size_t eq = spec.find('=');
      if (eq == std::string::npos || eq + 1 == spec.size())
        return Status::InvalidArgument("--export wants NAME=IMAGE, got '" + spec + "'");
      specs.push_back({spec.substr(0, eq), spec.substr(eq + 1), "", base});
    }
    if (specs.empty()) return Status::InvalidArgument("nothing to serve: give IMAGE or --export");
    if (image_opts_) {
      for (Spec& s : specs) TD_RETURN_IF_ERROR(ApplyImageOpts(s.file, s.settings));
    }
    TD_RETURN_IF_ERROR(RefuseSharedImages(specs));
    TD_RETURN_IF_ERROR(CheckListenOptions());
    TD_ASSIGN_OR_RETURN(tls_, tls_options_.Build());

    // 2. --fork: the parent returns here, once the child serves or fails.
    std::optional<ForkReport> report;
    if (fork_) {
      TD_ASSIGN_OR_RETURN(report, ForkServer());
      if (!report) return Outcome::kSuccess;
    }

    // 3. Open the images and serve.
    std::vector<std::shared_ptr<block::Device>> devices;  // closed at the end
    std::vector<nbd::Export> exports;
    std::vector<ControlServer::Target> control_targets;
    auto close_all = [&devices]() {
      Status first;
      for (auto& d : devices) {
        Status s = d->Close();
        if (!s.ok() && first.ok()) first = s.WithContext(d->info().filename);
      }
      return first;
    };
    Result<Outcome> result = Outcome::kSuccess;
    for (const Spec& spec : specs) {
      auto dev = OpenExportDevice(spec.file, spec.settings);
      if (!dev.has_value()) {
        (void)close_all();
        result = dev.status();
        break;
      }
      devices.push_back(dev->device);
      if (verbose_) Log(Describe(spec.name, spec.file, *dev->device, spec.settings));
      nbd::Export e;
      // Host paths are not shown to clients unless asked (-D).
      e.name = spec.name;
      e.description = spec.description;
      e.read_only = spec.settings.open.read_only;
      e.device = dev->device;
      e.bitmaps = dev->bitmaps;
      exports.push_back(std::move(e));
      control_targets.push_back({spec.name, dev->image});
    }
    std::unique_ptr<ControlServer> control;
    if (result.has_value() && !control_.empty()) {
      auto started = ControlServer::Start(control_, std::move(control_targets));
      if (started) {
        control = std::move(*started);
      } else {
        (void)close_all();
        result = started.status();
      }
    }
    if (result.has_value()) {
      std::vector<std::string> names;
      for (const Spec& s : specs) names.push_back(s.name);
      result = Serve(std::move(exports), names, report ? &*report : nullptr,
                     base.open.cache != io::CacheMode::kNone);
      control.reset();  // no clear may land while the images close
      Status closed = close_all();
      if (result.has_value() && !closed.ok()) result = closed;
    }
    if (report && !report->reported()) {
      // Never got to serving: the waiting parent prints why and fails.
      report->Failed(result.has_value() ? Status::Internal("the server ended before serving")
                                        : result.status());
      std::fflush(stdout);
      ::_exit(1);
    }
    return result;
  }

 private:
  // The qemu-nbd options thindisk does not offer, each with why.
  Status Refusal() const {
    if (!connect_.empty() || disconnect_) {
      return Status::NotSupported(
          std::string(disconnect_ ? "-d/--disconnect" : "-c/--connect") +
          " needs a kernel NBD device; thindisk serves NBD to userspace clients only (qemu, "
          "libnbd, nbd-client): serve on -k SOCKET and attach /dev/nbdN with nbd-client");
    }
    if (!selinux_label_.empty())
      return Status::NotSupported("--selinux-label is not supported");
    return Status::Ok();
  }

  // -L: nothing that describes an export may come with it (as qemu-nbd).
  Result<Outcome> List() {
    if (!image_.empty() || !export_specs_.empty())
      return Status::InvalidArgument("-L/--list is incompatible with an image to serve");
    if (!image_name_.empty() || !description_.empty() || !format_.empty() || read_only_ ||
        snapshot_ || !load_snapshot_.empty() || !offset_text_.empty() || allocation_depth_ ||
        nocache_ || !cache_.empty() || !aio_.empty() || !discard_.empty() ||
        !detect_zeroes_.empty() || image_opts_)
      return Status::InvalidArgument("-L/--list is incompatible with per-export settings");
    if (fork_ || stdio_ || once_ || !pid_file_.empty())
      return Status::InvalidArgument("-L/--list is incompatible with server options");
    nbdclient::ListTarget target;
    target.unix_socket = socket_;
    if (!bind_.empty()) target.host = bind_;
    if (port_ > 65535) return Status::InvalidArgument("--port must be 0..65535");
    if (port_ >= 0) target.port = uint16_t(port_);
    TD_ASSIGN_OR_RETURN(target.tls, tls_options_.ListSettings());
    TD_RETURN_IF_ERROR(nbdclient::nbd_module::ListExports(target));
    return Outcome::kSuccess;
  }

  // The settings every export starts from.
  Result<ExportSettings> Settings() const {
    ExportSettings s;
    block::OpenOptions& open = s.open;
    open.format = format_;
    open.read_only = read_only_;
    open.takeover = takeover_;
    if (image_opts_ && !format_.empty())
      return Status::InvalidArgument("--image-opts and -f/--format are mutually exclusive");
    CacheChoice cache;
    if (!cache_.empty()) {
      TD_ASSIGN_OR_RETURN(cache, ParseCacheMode(cache_));
      if (nocache_ && cache_ != "none")
        return Status::InvalidArgument("-n/--nocache contradicts --cache=" + cache_);
    } else if (nocache_) {
      cache.mode = io::CacheMode::kNone;
    }
    open.cache = cache.mode;
    s.write_through = cache.write_through;
    if (!cache_size_text_.empty()) {
      TD_ASSIGN_OR_RETURN(open.cache_bytes, ParseSize(cache_size_text_));
    }
    // Reads through the ring unless --aio=threads; writes stay on threads
    // (a ring per worker lost to them: 0.70x; docs/performance.md).
    if (!aio_.empty()) TD_RETURN_IF_ERROR(ParseAioMode(aio_).status());
    if (!discard_.empty()) {
      TD_ASSIGN_OR_RETURN(s.filter.discard, ParseDiscardMode(discard_));
    }
    if (!detect_zeroes_.empty()) {
      TD_ASSIGN_OR_RETURN(s.filter.detect_zeroes, ParseDetectZeroesMode(detect_zeroes_));
    }
    TD_RETURN_IF_ERROR(CheckFilterOptions(s.filter));
    if (!offset_text_.empty()) {
      TD_ASSIGN_OR_RETURN(s.offset, ParseOffset(offset_text_));
    }
    s.temp_overlay = snapshot_;
    s.bitmaps = bitmaps_;
    if (!load_snapshot_.empty()) {
      if (snapshot_)
        return Status::InvalidArgument("-s/--snapshot and -l/--load-snapshot cannot be combined");
      TD_ASSIGN_OR_RETURN(open.snapshot, ParseLoadSnapshot(load_snapshot_));
      open.read_only = true;  // qemu-nbd -l exports read-only
    }
    return s;
  }

  // --image-opts: `file` becomes the file name; its keys override the flags.
  Status ApplyImageOpts(std::string& file, ExportSettings& s) const {
    TD_ASSIGN_OR_RETURN(ImageOpts o, ParseImageOpts(file));
    file = o.filename;
    s.open.format = o.format;
    if (o.read_only) s.open.read_only = *o.read_only || !s.open.snapshot.empty();
    if (o.cache_direct) {
      s.open.cache = *o.cache_direct ? io::CacheMode::kNone : io::CacheMode::kWriteback;
    }
    if (o.cache_no_flush && *o.cache_no_flush) {
      if (s.open.cache == io::CacheMode::kNone)
        return Status::NotSupported("--image-opts: cache.direct=on with cache.no-flush=on");
      s.open.cache = io::CacheMode::kUnsafe;
    }
    if (o.discard) s.filter.discard = *o.discard;
    if (o.detect_zeroes) s.filter.detect_zeroes = *o.detect_zeroes;
    TD_RETURN_IF_ERROR(CheckFilterOptions(s.filter));
    s.offset += o.offset;
    s.size = o.size;
    return Status::Ok();
  }

  // One export as the command line gives it.
  struct Spec {
    std::string name, file, description;
    ExportSettings settings;
  };

  // What the image locks cannot see between one process's own opens:
  // one image under two exports, one of them writing it, or an export
  // writing another's backing file (that guest's disk would change under
  // it). Each export's chain is read once, headers only.
  static Status RefuseSharedImages(const std::vector<Spec>& specs) {
    auto writes = [&](size_t i) {
      return !specs[i].settings.open.read_only && !specs[i].settings.temp_overlay;
    };
    for (size_t i = 0; i < specs.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if ((writes(i) || writes(j)) &&
            SameImage(specs[j].file, specs[i].file) != nullptr) {
          return Status::InvalidArgument(
              "exports '" + specs[j].name + "' and '" + specs[i].name +
              "' serve one image (" + specs[j].file + ", " + specs[i].file +
              "): an image written through one export cannot be served by another (serve "
              "them read-only with -r, or with -s)");
        }
      }
    }
    bool any_writes = false;
    for (size_t i = 0; i < specs.size(); ++i) any_writes = any_writes || writes(i);
    if (!any_writes || specs.size() < 2) return Status::Ok();
    std::vector<std::vector<std::string>> below;
    for (const Spec& s : specs)
      below.push_back(BackingNamesBelow(s.file, s.settings.open.format));
    for (size_t i = 0; i < specs.size(); ++i) {
      for (size_t j = 0; writes(i) && j < specs.size(); ++j) {
        if (j == i) continue;
        if (auto chain = ChainHolding(specs[j].file, below[j], specs[i].file)) {
          return Status::InvalidArgument(
              "export '" + specs[i].name + "' (" + specs[i].file +
              ") is a backing file of export '" + specs[j].name + "' (" + *chain +
              "): serve it read-only with -r, or with -s");
        }
      }
    }
    return Status::Ok();
  }

  Status CheckListenOptions() const {
    if (stdio_ && (!socket_.empty() || !bind_.empty() || port_ >= 0))
      return Status::InvalidArgument("--stdio cannot be combined with --socket/--bind/--port");
    if (stdio_ && fork_)
      return Status::InvalidArgument("--stdio cannot be combined with --fork");
    if (once_ && persistent_)
      return Status::InvalidArgument("--once contradicts -t/--persistent");
    if (port_ > 65535) return Status::InvalidArgument("--port must be 0..65535");
    if (!trace_.empty() && !quiet_) PrintWarning("-T/--trace is accepted but ignored");
    return Status::Ok();
  }

  // -v's line for one export.
  std::string Describe(const std::string& name, const std::string& file,
                       const block::Device& dev, const ExportSettings& s) {
    std::string line = "export '" + name + "': " + file + " (" + dev.info().format + ", " +
                       std::to_string(dev.size()) + " bytes";
    if (s.open.read_only || dev.info().read_only) line += ", read-only";
    if (!s.open.snapshot.empty()) line += ", snapshot " + s.open.snapshot.Describe();
    if (s.temp_overlay) line += ", writes to a temporary overlay";
    if (s.offset != 0) line += ", from offset " + std::to_string(s.offset);
    line += std::string(", cache=") +
            (s.open.cache == io::CacheMode::kNone     ? (s.write_through ? "directsync" : "none")
             : s.open.cache == io::CacheMode::kUnsafe ? "unsafe"
             : s.write_through                        ? "writethrough"
                                                      : "writeback");
    line += aio_ == "threads" ? ", aio=threads)" : ", aio=io_uring)";
    return line;
  }

  // Listens where asked, reports readiness (pid file, URIs, --fork's
  // parent) and serves until a signal, --once or --stdio ends it.
  Result<Outcome> Serve(std::vector<nbd::Export> exports, const std::vector<std::string>& names,
                        ForkReport* report, bool cached_writes) {
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
    so.inline_cached_writes = cached_writes;
    so.async_reads = aio_ != "threads";
    so.max_connections = max_connections_;
    so.handshake_timeout = std::chrono::milliseconds(int64_t(handshake_timeout_ * 1000));
    so.busy_poll = std::chrono::microseconds(busy_poll_us_);
    so.prefetch_reads = prefetch_ == "on";
    if (!quiet_) so.log = [](const std::string& line) { PrintWarning(line); };
    so.tls = tls_;
    if (tls_ && verbose_) Log(ServeTlsOptions::Describe(*tls_));
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
      if (!quiet_ && !stdio_) PrintUris(server, so, names);  // stdout is NBD with --stdio
      if (report) report->Ready();
      if (so.handle_signals) AcceptHandOvers(names.size());
    };
    Status served = nbd::RunServer(so, std::move(exports));
    io::ceph_module::SetRadosReleaseHandler(nullptr);
    if (wrote_pid) ::unlink(pid_file_.c_str());
    TD_RETURN_IF_ERROR(pid_status);
    TD_RETURN_IF_ERROR(served);
    return Outcome::kSuccess;
  }

  // Another `serve --takeover` asks for one of our rados:// images: with one
  // export, we let go as on SIGTERM (drain, flush, mark clean, release; the
  // clients' connections close); with more, the others would go too, so we
  // refuse. It runs on a librados thread, and may run while the server is
  // being torn down, so it only raises SIGTERM at ourselves, which the
  // server's own handler turns into a graceful stop.
  void AcceptHandOvers(size_t exports) const {
    const bool quiet = quiet_;
    io::ceph_module::SetRadosReleaseHandler([exports, quiet](const std::string& uri) {
      if (exports != 1) {
        if (!quiet) {
          PrintWarning(uri + ": refused to hand the image over: this server has other exports");
        }
        return false;
      }
      if (!quiet) {
        PrintWarning(uri + ": handing the image over to another server: draining and exiting");
      }
      ::kill(::getpid(), SIGTERM);
      return true;
    });
  }

  void PrintUris(nbd::Server& server, const nbd::ServeOptions& so,
                 const std::vector<std::string>& names) const {
    for (const std::string& n : names) {
      if (!socket_.empty())
        std::printf("nbd+unix:///%s?socket=%s\n", UriEscape(n).c_str(), socket_.c_str());
      if (so.tcp || (socket_.empty() && !so.socket_activation)) {
        std::string host =
            so.tcp_host.find(':') != std::string::npos ? "[" + so.tcp_host + "]" : so.tcp_host;
        std::printf("nbd://%s:%u/%s\n", host.c_str(), unsigned(server.tcp_port()),
                    UriEscape(n).c_str());
      }
      if (so.socket_activation) std::printf("serving export '%s' on activated sockets\n", n.c_str());
    }
    std::fflush(stdout);
  }

  std::string image_;
  std::string image_name_;
  std::string description_;
  std::vector<std::string> export_specs_;
  std::string format_;
  bool image_opts_ = false;
  std::string socket_;
  std::string bind_;
  int port_ = -1;  // not given
  bool stdio_ = false;
  std::string pid_file_;
  bool fork_ = false;
  bool read_only_ = false;
  bool takeover_ = false;
  size_t max_connections_ = 64;  // docs/serve-limits.md: the memory bound
  double handshake_timeout_ = 10;  // seconds (--handshake-timeout)
  int busy_poll_us_ = int(nbd::BusyPoll::kDefaultBudget.count());  // --busy-poll
  std::string prefetch_ = "on";                                    // --prefetch
  bool persistent_ = false;      // the default anyway
  bool once_ = false;
  size_t threads_ = 0;
  bool nocache_ = false;
  std::string cache_;  // "" = writeback
  std::string aio_;    // "" = threads
  std::string discard_;        // "" = unmap
  std::string detect_zeroes_;  // "" = off
  std::string cache_size_text_;
  bool snapshot_ = false;
  std::string load_snapshot_;
  std::string offset_text_;
  bool allocation_depth_ = false;  // always offered
  bool list_ = false;
  std::string trace_;
  bool verbose_ = false;
  bool quiet_ = false;
  bool version_ = false;
  std::string connect_;
  bool disconnect_ = false;
  std::vector<std::string> bitmaps_;
  std::string control_;
  ServeTlsOptions tls_options_;
  std::shared_ptr<nbd::TlsServer> tls_;  // null: no TLS
  std::string selinux_label_;
};

}  // namespace

std::unique_ptr<Subcommand> NewServeCommand() { return std::make_unique<ServeCommand>(); }

}  // namespace thindisk::cli
