// thindisk rm: removes images. A rados:// image is a header object and its
// data objects (io::ceph_module::RemoveRados: the cost grows with what was
// written, never with the virtual size); a local file is unlinked, but only
// while no other process has it open as an image (qemu's image lock, as
// every writer takes), so a running VM's disk is refused rather than pulled
// away. A rados:// image that other images of its pool name as their
// backing file is refused too (as rbd rm refuses an image with clones):
// those would lose their data's base.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "block/open.h"
#include "cli/common.h"
#include "cli/image_summary.h"
#include "io/ceph_module.h"
#include "io/rados_name.h"
#include "io/rbd_name.h"

namespace thindisk::cli {
namespace {

constexpr const char* kRmHelp =
    "Each IMAGE is a local image file or rados://POOL/IMAGE[?conf=PATH&id=CLIENT].\n"
    "A local file in use by another process (a VM, thindisk serve, qemu-nbd) is\n"
    "refused and left alone. A rados:// image that images of its pool use as\n"
    "their backing file is refused, naming them: remove them or rebase them\n"
    "first (--force removes it anyway, and they can no longer be read). Only the\n"
    "named image is removed: its backing file stays, and so does any local file\n"
    "that names it as backing. Removal of the next image goes on after an error;\n"
    "the exit status is 1 if any removal failed.";

class RmCommand final : public Subcommand {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* sub =
        app.add_subcommand("rm", "Remove images (local files or rados:// images)");
    sub->footer(kRmHelp);
    sub->add_flag("-q,--quiet", quiet_, "Print nothing on success");
    sub->add_flag("-p,--progress", progress_, "Show progress (rados:// images)");
    sub->add_flag(
        "--force", force_,
        "Remove a rados:// image even when images of its pool use it as backing file");
    sub->add_option("images", images_, "Images to remove")->required();
    return sub;
  }

  Result<Outcome> Run() override {
    bool failed = false;
    for (const std::string& image : images_) {
      Status s = Remove(image, progress_ && !quiet_, force_);
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
  static Status Remove(const std::string& image, bool show_progress, bool force) {
    if (io::IsRadosName(image)) {
      if (!force) TD_RETURN_IF_ERROR(RefuseRadosBase(image));
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

  // Refuses removing `image` while images of its pool name it as their
  // backing file (their headers read with any lock shared).
  static Status RefuseRadosBase(const std::string& image) {
    TD_ASSIGN_OR_RETURN(io::RadosName name, io::ParseRadosName(image));
    // "rados://POOL" with the image's query (where to connect).
    const std::string pool_uri =
        name.PoolUri() + name.Uri().substr(name.ToString().size());
    // One connection for the listing and every probe below.
    TD_ASSIGN_OR_RETURN(std::shared_ptr<void> connection,
                        io::ceph_module::HoldCluster(pool_uri));
    TD_ASSIGN_OR_RETURN(std::vector<io::RadosImageEntry> entries,
                        io::ceph_module::ListRados(pool_uri));
    std::vector<std::string> users;
    for (const io::RadosImageEntry& e : entries) {
      if (e.name == name.image) continue;
      io::RadosName other = name;  // the same cluster and client
      other.image = e.name;
      auto summary = ReadImageSummary(other.Uri(), "", /*force_share=*/true);
      if (!summary || summary->full_backing_filename.empty()) continue;
      auto backing = io::ParseRadosName(summary->full_backing_filename);
      if (backing && backing->pool == name.pool && backing->image == name.image)
        users.push_back(other.ToString());
    }
    if (users.empty()) return Status::Ok();
    std::string list = users.front();
    for (size_t i = 1; i < users.size() && i < 5; ++i) list += ", " + users[i];
    if (users.size() > 5) list += " and " + std::to_string(users.size() - 5) + " more";
    return Status::Busy(name.ToString() + " is the backing file of " + list +
                        ": remove or rebase " + (users.size() == 1 ? "it" : "them") +
                        " first (--force removes it anyway)");
  }

  bool quiet_ = false;
  bool progress_ = false;
  bool force_ = false;
  std::vector<std::string> images_;
};

}  // namespace

std::unique_ptr<Subcommand> NewRmCommand() { return std::make_unique<RmCommand>(); }

}  // namespace thindisk::cli
