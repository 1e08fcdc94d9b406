// thindisk rm: removes images. A rados:// image is a header object and its
// data objects (io::ceph_module::RemoveRados: the cost grows with what was
// written, never with the virtual size); a local file is unlinked, but only
// while no other process has it open as an image (qemu's image lock, as
// every writer takes), so a running VM's disk is refused rather than pulled
// away.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "block/open.h"
#include "cli/common.h"
#include "io/ceph_module.h"
#include "io/rados_name.h"
#include "io/rbd_name.h"

namespace thindisk::cli {
namespace {

constexpr const char* kRmHelp =
    "Each IMAGE is a local image file or rados://POOL/IMAGE[?conf=PATH&id=CLIENT].\n"
    "A local file in use by another process (a VM, thindisk serve, qemu-nbd) is\n"
    "refused and left alone. Only the named image is removed: its backing file\n"
    "and any overlay that names it as backing stay. Removal of the next image\n"
    "goes on after an error; the exit status is 1 if any removal failed.";

class RmCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub =
        app.add_subcommand("rm", "Remove images (local files or rados:// images)");
    sub->footer(kRmHelp);
    sub->add_flag("-q,--quiet", quiet_, "Print nothing on success");
    sub->add_flag("-p,--progress", progress_, "Show progress (rados:// images)");
    sub->add_option("images", images_, "Images to remove")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    bool failed = false;
    for (const std::string& image : images_) {
      Status s = Remove(image, progress_ && !quiet_);
      if (!s.ok()) {
        PrintError(s);  // in order, and on to the next image
        failed = true;
      } else if (!quiet_) {
        std::printf("Removed %s\n", image.c_str());
      }
    }
    return failed ? Outcome::kCommandFailed : Outcome::kSuccess;
  }

 private:
  static Status Remove(const std::string& image, bool show_progress) {
    if (io::IsRadosName(image)) {
      Progress progress(show_progress);
      Status s = io::ceph_module::RemoveRados(
          image, [&](uint64_t done, uint64_t total) { progress.Update(done, total); });
      progress.Finish();
      return s;
    }
    if (io::IsRbdName(image)) {
      return Status::InvalidArgument(image + ": an RBD image is removed with rbd rm");
    }
    if (block::IsUriName(image)) {
      return Status::InvalidArgument(image + ": an NBD export is the server's to remove");
    }
    struct stat st {};
    if (::stat(image.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return Status::InvalidArgument(
          image + " is " + NodeKind(st.st_mode) +
          ": thindisk rm removes image files and rados:// images");
    }
    // Held until the unlink: no one can open the image as a writer between
    // the check and the removal.
    TD_ASSIGN_OR_RETURN(auto lock, block::LockImage(image, io::QemuLockMode::kWrite));
    if (::unlink(image.c_str()) != 0) return Status::FromErrno(errno, image);
    return Status::Ok();
  }

  bool quiet_ = false;
  bool progress_ = false;
  std::vector<std::string> images_;
};

}  // namespace

std::unique_ptr<Subcommand> NewRmCommand() { return std::make_unique<RmCommand>(); }

}  // namespace thindisk::cli
