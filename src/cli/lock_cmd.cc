// thindisk lock ls|break: the one-writer lock of a rados:// image, for
// operators (io/rados_lock.h). `ls` shows who holds it and whether that
// client is still alive (watches the image); `break` fences the holder
// (OSD blocklist) before it breaks the lock, so a holder that comes back
// cannot write. A live holder is broken only with --force.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/common.h"
#include "io/ceph_module.h"
#include "io/rados_name.h"

namespace thindisk::cli {
namespace {

constexpr const char* kLockHelp =
    "IMAGE is rados://POOL/IMAGE[?conf=PATH&id=CLIENT]. Every read-write open of\n"
    "an image in RADOS (serve, io, convert into it, commit, resize, ...) holds its\n"
    "lock; a second writer anywhere is refused, naming the holder. A holder\n"
    "whose process or host is gone loses its watch after the cluster's\n"
    "osd_client_watch_timeout (30 s by default); the next writer then fences it\n"
    "and takes the lock by itself, so `lock break` is for a holder you know is\n"
    "dead before that, or (--force) one you want stopped.";

void PrintLockers(const std::vector<io::RadosLocker>& lockers, bool json) {
  if (json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::array();
    for (const io::RadosLocker& l : lockers) {
      j.push_back({{"client", l.client},
                   {"cookie", l.cookie},
                   {"address", l.address},
                   {"alive", l.watching}});
    }
    std::cout << j.dump(4) << "\n";
    return;
  }
  for (const io::RadosLocker& l : lockers) {
    std::printf("%s  %s  %s  %s\n", l.client.c_str(), l.address.c_str(),
                l.watching ? "alive" : "gone", l.cookie.c_str());
  }
}

class LockCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub =
        app.add_subcommand("lock", "Show or break the writer lock of a rados:// image");
    sub->footer(kLockHelp);
    sub->require_subcommand(1);
    ls_ = sub->add_subcommand("ls", "Show who holds the lock (nothing: free)");
    ls_->add_option("--output", output_, "Output format: human or json")
        ->check(CLI::IsMember({"human", "json"}));
    ls_->add_option("image", image_, "rados://POOL/IMAGE")->required();
    break_ = sub->add_subcommand("break", "Fence the holder, then break its lock");
    break_->add_flag("--force", force_,
                     "Also fence a holder that is alive (its writes then fail)");
    break_->add_flag("-q,--quiet", quiet_, "Print nothing on success");
    break_->add_option("image", image_, "rados://POOL/IMAGE")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    if (!io::IsRadosName(image_)) {
      return Status::InvalidArgument(
          image_ +
          ": not a rados:// image (local images use qemu's file "
          "locks: see `thindisk info` and lslocks)");
    }
    if (ls_->parsed()) {
      TD_ASSIGN_OR_RETURN(std::vector<io::RadosLocker> lockers,
                          io::ceph_module::ListRadosLockers(image_));
      PrintLockers(lockers, output_ == "json");
      return Outcome::kSuccess;
    }
    TD_ASSIGN_OR_RETURN(std::vector<io::RadosLocker> broken,
                        io::ceph_module::BreakRadosLock(image_, force_));
    if (!quiet_) {
      if (broken.empty()) std::printf("%s: the lock is free\n", image_.c_str());
      for (const io::RadosLocker& l : broken) {
        std::printf("Fenced %s and broke its lock\n", l.ToString().c_str());
      }
    }
    return Outcome::kSuccess;
  }

 private:
  CLI::App* ls_ = nullptr;
  CLI::App* break_ = nullptr;
  std::string output_ = "human";
  std::string image_;
  bool force_ = false;
  bool quiet_ = false;
};

}  // namespace

std::unique_ptr<Subcommand> NewLockCommand() { return std::make_unique<LockCommand>(); }

}  // namespace thindisk::cli
