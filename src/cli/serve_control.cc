#include "cli/serve_control.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "nbd/listener.h"
#include "qcow2/bitmaps.h"

namespace thindisk::cli {
namespace {

using Json = nlohmann::json;

// A request line longer than this is not a control request.
constexpr size_t kMaxLine = 64 << 10;
// A client that sends nothing for this long is dropped (one at a time).
constexpr int kIdleMs = 30000;

Json Error(const std::string& klass, const std::string& desc) {
  return Json{{"error", {{"class", klass}, {"desc", desc}}}};
}

Json ErrorFor(const Status& s) {
  return Error(s.code() == Code::kBusy ? "BitmapChanged" : "GenericError", s.message());
}

Status WriteLine(int fd, const std::string& line) {
  std::string out = line + "\n";
  for (size_t done = 0; done < out.size();) {
    ssize_t n = ::send(fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "control socket");
    done += size_t(n);
  }
  return Status::Ok();
}

// Reads one line (without its newline) from `fd`, keeping what follows it
// in `pending`; kNotFound at end of input or once `stop_fd` (if >= 0) is
// readable: a server that stops does not wait for an idle client.
Status ReadLine(int fd, std::string& pending, std::string* line, int timeout_ms,
                int stop_fd = -1) {
  for (;;) {
    size_t nl = pending.find('\n');
    if (nl != std::string::npos) {
      *line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      return Status::Ok();
    }
    if (pending.size() > kMaxLine) return Status::InvalidArgument("control request too long");
    pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    int r = ::poll(p, stop_fd >= 0 ? 2 : 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(errno, "control socket");
    if (r == 0) return Status(Code::kIoError, "control socket: no answer in time");
    if (stop_fd >= 0 && (p[1].revents & POLLIN)) return Status::NotFound("the server stops");
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "control socket");
    if (n == 0) return Status::NotFound("control socket closed");
    pending.append(buf, size_t(n));
  }
}

Result<int> Listen(const std::string& path) {
  // Only the server's user may reset a backup chain: the mode is set
  // before anyone can connect.
  Result<int> fd = nbd::ListenUnix(path, {.mode = 0600, .backlog = 4});
  if (!fd.has_value()) return fd.error().WithContext("--control");
  return fd;
}

}  // namespace

Result<std::unique_ptr<ControlServer>> ControlServer::Start(const std::string& path,
                                                            std::vector<Target> targets) {
  TD_ASSIGN_OR_RETURN(int fd, Listen(path));
  int stop = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop < 0) {
    Status s = Status::FromErrno(errno, "--control: eventfd");
    ::close(fd);
    ::unlink(path.c_str());
    return s;
  }
  std::unique_ptr<ControlServer> server(new ControlServer(path, fd, stop, std::move(targets)));
  server->thread_ = std::thread([raw = server.get()] { raw->Loop(); });
  return server;
}

ControlServer::ControlServer(std::string path, int listen_fd, int stop_fd,
                             std::vector<Target> targets)
    : path_(std::move(path)), listen_fd_(listen_fd), stop_fd_(stop_fd), targets_(std::move(targets)) {}

ControlServer::~ControlServer() {
  uint64_t one = 1;
  (void)!::write(stop_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
  ::unlink(path_.c_str());
}

void ControlServer::Loop() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    int r = ::poll(p, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (p[1].revents & POLLIN)) return;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    ::close(fd);
  }
}

void ControlServer::Serve(int fd) const {
  std::string pending, line;
  while (ReadLine(fd, pending, &line, kIdleMs, stop_fd_).ok()) {
    Json answer;
    Json request = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    answer = request.is_discarded() ? Error("GenericError", "the request is not JSON")
                                    : Answer(request);
    if (!WriteLine(fd, answer.dump()).ok()) return;
    // A stop request while a client talks: finish with this answer.
    pollfd p{stop_fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) return;
  }
}

Json ControlServer::Answer(const Json& request) const {
  if (!request.is_object() || !request.contains("execute") || !request["execute"].is_string()) {
    return Error("GenericError", "a request is {\"execute\": COMMAND, \"arguments\": {...}}");
  }
  const std::string command = request["execute"];
  const Json args = request.value("arguments", Json::object());
  if (!args.is_object()) return Error("GenericError", "\"arguments\" must be an object");
  // The export the request means.
  const Target* target = nullptr;
  if (args.contains("export")) {
    if (!args["export"].is_string()) return Error("GenericError", "\"export\" must be a string");
    for (const Target& t : targets_) {
      if (t.export_name == args["export"]) target = &t;
    }
    if (!target) return Error("GenericError", "no export named '" + args["export"].get<std::string>() + "'");
  } else if (targets_.size() == 1) {
    target = &targets_.front();
  } else {
    return Error("GenericError", "this server has several exports: name one with \"export\"");
  }

  if (command == "query-bitmaps") {
    auto list = qcow2::ListBitmaps(*target->image);
    if (!list) return ErrorFor(list.error());
    Json out = Json::array();
    for (const qcow2::BitmapInfo& b : *list) {
      Json j{{"name", b.name}, {"granularity", b.granularity()}, {"enabled", b.enabled},
             {"consistent", b.consistent()}};
      auto live = qcow2::QueryBitmapLive(*target->image, b.name);
      j["tracked"] = live.has_value();
      if (live) {
        j["generation"] = live->generation;
        j["dirty-bytes"] = live->dirty_bytes;
      }
      out.push_back(j);
    }
    return Json{{"return", out}};
  }
  if (command == "clear-bitmap") {
    if (!args.contains("name") || !args["name"].is_string()) {
      return Error("GenericError", "clear-bitmap needs \"name\"");
    }
    std::optional<uint64_t> generation;
    if (args.contains("generation")) {
      if (!args["generation"].is_number_unsigned()) {
        return Error("GenericError", "\"generation\" must be a number");
      }
      generation = args["generation"].get<uint64_t>();
    }
    Status s = qcow2::ClearBitmapLive(*target->image, args["name"], generation);
    if (!s.ok()) return ErrorFor(s);
    return Json{{"return", Json::object()}};
  }
  return Error("CommandNotFound", "unknown command '" + command + "'");
}

Result<Json> ControlCall(const std::string& path, const Json& request) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return Status::InvalidArgument("control socket path too long: " + path);
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "control socket");
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    Status s = Status::FromErrno(errno, path);
    ::close(fd);
    return s;
  }
  std::string pending, line;
  Status s = WriteLine(fd, request.dump());
  if (s.ok()) s = ReadLine(fd, pending, &line, kIdleMs);
  ::close(fd);
  if (!s.ok()) return s.WithContext(path);
  Json answer = Json::parse(line, nullptr, false);
  if (answer.is_discarded() || !answer.is_object()) {
    return Status(Code::kIoError, path + ": the server's answer is not JSON");
  }
  if (answer.contains("error")) {
    const std::string klass = answer["error"].value("class", "");
    const std::string desc = answer["error"].value("desc", "unknown error");
    if (klass == "BitmapChanged") return Status::Busy(desc);
    return Status::InvalidArgument(path + ": " + desc);
  }
  if (!answer.contains("return")) return Status(Code::kIoError, path + ": answer without a result");
  return answer["return"];
}

}  // namespace thindisk::cli
