// The control socket of `thindisk serve --control PATH`: what a backup of
// a served image needs from the server that no NBD command carries, over a
// Unix socket (mode 0600: whoever may open it may reset a backup chain).
//
// One JSON request a line, shaped as QMP's, one JSON answer a line:
//   {"execute": "query-bitmaps", "arguments": {"export": "vm1"}}
//     -> {"return": [{"name": "bm0", "granularity": 65536, "enabled": true,
//                     "tracked": true, "generation": 17, "dirty-bytes": 1048576}]}
//   {"execute": "clear-bitmap",
//    "arguments": {"export": "vm1", "name": "bm0", "generation": 17}}
//     -> {"return": {}}
//   anything wrong -> {"error": {"class": "GenericError", "desc": "..."}}
// "export" may be left out when the server has one export. A generation
// counts the changes a bitmap tracked (both when each starts and when it
// ends); clear-bitmap with "generation" clears only if it has not moved,
// so a backup never clears the marks of a change it may have missed.
//
// Thread safety: the server answers on a thread of its own, one client at
// a time; the bitmap calls it makes are safe beside the NBD requests
// (qcow2/bitmaps.h, "Live operations").
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "block/device.h"
#include "util/result.h"

namespace thindisk::cli {

class ControlServer {
 public:
  struct Target {
    std::string export_name;
    std::shared_ptr<block::Device> image;  // the image itself, under any view
  };

  // Listens on `path` (an existing socket file is replaced; any other file
  // is an error) and answers until destroyed.
  static Result<std::unique_ptr<ControlServer>> Start(const std::string& path,
                                                      std::vector<Target> targets);
  ~ControlServer();  // stops answering and removes the socket file

  // One request's answer (also used by the tests without a socket).
  nlohmann::json Answer(const nlohmann::json& request) const;

 private:
  ControlServer(std::string path, int listen_fd, int stop_fd, std::vector<Target> targets);
  void Loop();
  void Serve(int fd) const;

  const std::string path_;
  const int listen_fd_;
  const int stop_fd_;
  const std::vector<Target> targets_;
  std::thread thread_;
};

// Sends `request` to the control socket at `path` and returns the answer's
// "return" value; its "error" becomes a Status (kBusy for a generation that
// moved, so callers can tell it apart).
Result<nlohmann::json> ControlCall(const std::string& path, const nlohmann::json& request);

}  // namespace thindisk::cli
